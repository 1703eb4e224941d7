"""Property-based fuzzing of every reader of user files (hypothesis).

Each reader gets valid files, files with one or more mutations (wrong types and dtypes, missing keys, wrong
shapes, out-of-range values, truncation, garbage bytes, other encodings), and the property is the same for all:
the read ends either in a complete, usable result or in our one-line error (errors.InputError or a subclass),
never in another exception. Every fuzz test runs twice: FAST_EXAMPLES in the normal run and
INTEGRATION_EXAMPLES under the `integration` marker (CI), with fixed seeds (derandomize) so failures reproduce.
The explicit regression tests at the end pin each bug the fuzzing found and each config check of issue 13.
"""
from __future__ import annotations

import atexit
import io
import json
import math
import pickle
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file as save_safetensors

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import glue, squad
from bertrecipe.model.bert import ACTIVATIONS, BERT_REQUIRED_KEYS, BertConfig, BertModel, ConfigError
from bertrecipe.model.families import recorded_config
from bertrecipe.model.modern_config import MODERN_REQUIRED_KEYS
from bertrecipe.model.torch_files import WeightsError
from bertrecipe.model.weights import LoadedWeights, read_config, read_weights
from bertrecipe.pretraining.data import make_batch, read_rows
from bertrecipe.pretraining.shard_schema import SHARD_KEYS, inspect_shard
from bertrecipe.tokenization.wordpiece import SPECIAL_TOKENS, BertTokenizer, load_vocab
from bertrecipe.training.checkpointing import load_checkpoint
from helpers import REPO_ROOT

FAST_EXAMPLES = 50
INTEGRATION_EXAMPLES = 1000


def fuzz(*strategies: st.SearchStrategy) -> Callable[[Callable[..., None]], Callable[[int], None]]:
    """Turns `check(*drawn)` into a test run with FAST_EXAMPLES examples, and once more with INTEGRATION_EXAMPLES
    under the integration marker: one body, two budgets."""

    def decorate(check: Callable[..., None]) -> Callable[[int], None]:
        @pytest.mark.parametrize("examples", [
            pytest.param(FAST_EXAMPLES, id="fast"),
            pytest.param(INTEGRATION_EXAMPLES, id="integration", marks=pytest.mark.integration),
        ])
        def test(examples: int) -> None:
            budget = settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
            budget(given(*strategies)(check))()

        test.__doc__ = check.__doc__
        return test

    return decorate


class Case:
    """Bytes of a generated file with a readable account of how they were made (what hypothesis prints)."""

    def __init__(self, description: list[str], content: bytes) -> None:
        self.description = description
        self.content = content

    def __repr__(self) -> str:
        return f"Case({'; '.join(self.description)}; {len(self.content)} bytes)"


def outcome(read: Callable[[], Any], path: Path) -> Any:
    """The result of `read()`, or None when it raised our error; any other exception fails the test. The error
    must be one line that names the file."""
    try:
        return read()
    except InputError as error:
        message = str(error)
        assert str(path) in message and "\n" not in message, repr(message)
        return None


# ---------------------------------------------------------------------------------------------------------
# Byte-level damage shared by every file format
# ---------------------------------------------------------------------------------------------------------
def damage(draw: st.DrawFn, content: bytes, description: list[str]) -> bytes:
    """`content` unchanged, truncated, with bytes overwritten or inserted, or replaced by other bytes; what was
    done is appended to `description`."""
    kind = draw(st.sampled_from(["intact"] * 5 + ["truncate", "overwrite", "insert", "replace"]))
    if kind == "truncate":
        keep = draw(st.integers(0, max(len(content) - 1, 0)))
        description.append(f"truncated to {keep} of {len(content)} bytes")
        return content[:keep]
    if kind in ("overwrite", "insert") and content:
        at = draw(st.integers(0, len(content) - 1))
        junk = draw(st.binary(min_size=1, max_size=16))
        description.append(f"{kind} {junk!r} at byte {at}")
        tail = content[at + len(junk):] if kind == "overwrite" else content[at:]
        return content[:at] + junk + tail
    if kind == "replace":
        other = draw(st.one_of(st.binary(max_size=64), st.sampled_from(
            [b"", b"\x00" * 64, b"PK\x03\x04" + b"\x00" * 40, b"\x80\x02}q\x00.", b"\x89HDF\r\n\x1a\n" + b"\xff" * 40,
             "plain text, not the file you wanted\n".encode()])))
        description.append(f"replaced by {other[:40]!r}")
        return other
    return content


@st.composite
def damaged(draw: st.DrawFn, content: bytes) -> bytes:
    return damage(draw, content, [])


def encoded(draw: st.DrawFn, text: str) -> bytes:
    """`text` as UTF-8 (with or without BOM) mostly, else as UTF-16 or Latin-1 (what Windows tools write)."""
    encoding = draw(st.sampled_from(["utf-8"] * 6 + ["utf-8-sig", "utf-16", "latin-1"]))
    return text.encode(encoding, errors="replace")


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.integers(-3, 40),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)
# Hand-picked JSON that the parsers themselves trip over: deep nesting, integers of over 4300 digits.
HOSTILE_JSON = [b"[" * 3000, b'{"a": ' + b"9" * 5000 + b"}", b"NaN", b"null", b"[]", b'"text"', b"{}",
                b'{"data": 5}', b'{"data": [' + b"{}," * 3 + b"{}]}"]


@st.composite
def mutated_json(draw: st.DrawFn, document: Any) -> Any:
    """`document` with up to three nodes replaced by arbitrary JSON or (in objects) deleted."""
    for _ in range(draw(st.integers(0, 3))):
        document = _mutate_node(draw, document, depth=0)
    return document


def _mutate_node(draw: st.DrawFn, node: Any, depth: int) -> Any:
    children = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
    if not children or draw(st.integers(0, 3 if depth else 20)) == 0:  # the root itself only now and then
        return draw(JSON_VALUES)
    key = draw(st.sampled_from(children))
    node = dict(node) if isinstance(node, dict) else list(node)
    if isinstance(node, dict) and draw(st.integers(0, 4)) == 0:
        del node[key]
    else:
        node[key] = _mutate_node(draw, node[key], depth + 1)
    return node


@st.composite
def json_file_bytes(draw: st.DrawFn, valid: st.SearchStrategy) -> bytes:
    """A valid document, mutated, serialized, encoded and possibly damaged; or a hostile hand-written one."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(HOSTILE_JSON))
    document = draw(mutated_json(draw(valid)))
    text = json.dumps(document, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])))
    return draw(damaged(encoded(draw, text)))


# ---------------------------------------------------------------------------------------------------------
# Pre-training shards (pretraining_data.inspect_shard + read_rows)
# ---------------------------------------------------------------------------------------------------------
VOCAB, MAX_POSITIONS = 60, 16
SHARD_MUTATIONS = ("none", "missing", "dtype", "shape", "rows", "group", "empty_space", "values", "attribute")
ODD_DTYPES = ("float32", "float64", "bool", "S4", "compound", "uint8", "int64", "uint64", "int16")


def valid_shard(rng: np.random.Generator, n: int, seq: int, preds: int) -> dict[str, np.ndarray]:
    positions = np.zeros((n, preds), np.int32)
    for row in range(n):
        count = int(rng.integers(0, min(preds, seq - 1) + 1))
        positions[row, :count] = np.sort(rng.choice(np.arange(1, seq), count, replace=False))
    return {
        "input_ids": rng.integers(0, VOCAB, (n, seq)).astype(np.int32),
        "input_mask": rng.integers(0, 2, (n, seq)).astype(np.int8),
        "segment_ids": rng.integers(0, 2, (n, seq)).astype(np.int8),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(0, VOCAB, (n, preds)).astype(np.int32),
        "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8),
    }


def _odd_dtype(values: np.ndarray, name: str) -> np.ndarray:
    if name == "compound":
        out = np.zeros(values.shape, [("a", "i4"), ("b", "f4")])
        out["a"] = values
        return out
    if name == "S4":
        return values.astype("S4")
    return values.astype(name)


@st.composite
def shard_case(draw: st.DrawFn) -> Case:
    """An HDF5 shard in NVIDIA's format with up to two mutations, written by h5py, possibly damaged after."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, seq, preds = draw(st.integers(0, 4)), draw(st.integers(2, 10)), draw(st.integers(1, 4))
    arrays: dict[str, Any] = valid_shard(rng, n, seq, preds)
    attrs: dict[str, Any] = {"vocab_size": VOCAB, "max_seq_length": seq, "format_version": 1}
    description = [f"{n} rows of {seq} tokens, {preds} predictions"]
    for _ in range(draw(st.integers(0, 2))):
        description.append(_mutate_shard(draw, rng, arrays, attrs))
    # gzip-chunked as NVIDIA's shards (read through data.RowSource), with or without HDF5's byte shuffle, or contiguous
    storage = draw(st.sampled_from([{}, {"compression": "gzip"}, {"compression": "gzip", "shuffle": True}]))
    description.append(str(storage or "contiguous"))
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        for key, value in arrays.items():
            if isinstance(value, str):  # "group": a group where a dataset belongs
                f.create_group(key).create_dataset("inner", data=np.zeros(2, np.int32))
            elif isinstance(value, np.ndarray) and value.ndim and value.size:
                f.create_dataset(key, data=value, **storage)
            else:  # a scalar, an empty array or h5py.Empty (a dataset without a dataspace): never chunked
                f.create_dataset(key, data=value)
        for key, value in attrs.items():
            f.attrs[key] = value
    return Case(description, damage(draw, buffer.getvalue(), description))


def _mutate_shard(draw: st.DrawFn, rng: np.random.Generator, arrays: dict[str, Any], attrs: dict[str, Any]) -> str:
    """Applies one mutation and says which."""
    kind = draw(st.sampled_from(SHARD_MUTATIONS))
    key = draw(st.sampled_from(SHARD_KEYS))
    current = arrays.get(key)
    usable = isinstance(current, np.ndarray) and current.dtype.kind in "iu"
    if kind == "missing":
        arrays.pop(key, None)
    elif kind == "dtype" and usable:
        dtype = draw(st.sampled_from(ODD_DTYPES))
        arrays[key] = _odd_dtype(current, dtype)
        return f"{key} as {dtype}"
    elif kind == "shape":
        shape = tuple(draw(st.lists(st.integers(0, 6), max_size=3)))
        arrays[key] = rng.integers(0, 3, shape).astype(np.int32)
        return f"{key} of shape {shape}"
    elif kind == "rows" and usable and current.ndim >= 1 and current.shape[0]:
        arrays[key] = current[: draw(st.integers(0, current.shape[0] - 1))]  # fewer rows than the other keys
        return f"{key} with {arrays[key].shape[0]} rows"
    elif kind == "group":
        arrays[key] = "group"
    elif kind == "empty_space":
        arrays[key] = h5py.Empty("i4")
    elif kind == "values" and usable and current.size:
        flat = current.astype(np.int64).reshape(-1)
        at = draw(st.integers(0, flat.size - 1))
        flat[at] = draw(st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from([-1, 2, 3, VOCAB, 10**6])))
        arrays[key] = flat.reshape(current.shape).astype(np.int32 if key in ("input_ids", "masked_lm_ids",
                                                                           "masked_lm_positions") else np.int64)
        return f"{key}[{at}] = {flat[at]}"
    elif kind == "attribute":
        name = draw(st.sampled_from(["vocab_size", "max_seq_length", "max_predictions_per_seq", "format_version"]))
        attrs[name] = draw(st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=6), st.floats(),
                                     st.just(np.arange(3)), st.just(h5py.Empty("i4"))))
        return f"attribute {name} = {attrs[name]!r}"
    else:
        return "no mutation"
    return f"{key} {kind}"


def read_shard(path: Path) -> Any:
    info = inspect_shard(path, vocab_size=VOCAB, max_positions=MAX_POSITIONS)
    with h5py.File(path, "r") as f:  # inspect_shard opened it: so does this
        return info, read_rows(info, f, 0, info.num_samples, VOCAB)


def assert_usable_shard(info: Any, arrays: dict[str, np.ndarray]) -> None:
    """A shard that loads must be whole and make batches the model can take."""
    n, seq = info.num_samples, info.seq_length
    assert set(arrays) == set(SHARD_KEYS)
    assert arrays["input_ids"].shape == arrays["input_mask"].shape == arrays["segment_ids"].shape == (n, seq)
    assert arrays["masked_lm_positions"].shape == arrays["masked_lm_ids"].shape == (n, info.max_predictions)
    assert arrays["next_sentence_labels"].shape == (n,)
    if n:
        batch = make_batch(arrays, np.arange(n))
        assert batch["input_ids"].min() >= 0 and batch["input_ids"].max() < VOCAB
        assert batch["masked_lm_labels"].max() < VOCAB
        assert set(np.unique(batch["segment_ids"])) <= {0, 1}
        assert set(np.unique(batch["next_sentence_labels"])) <= {0, 1}


@fuzz(shard_case())
@pytest.mark.slow
def test_fuzz_shard_reader(case: Case) -> None:
    """inspect_shard + read_rows: a complete, in-range shard or one InputError line."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "shard_training_0.hdf5"
        path.write_bytes(case.content)
        result = outcome(lambda: read_shard(path), path)
        if result is not None:
            assert_usable_shard(*result)


# ---------------------------------------------------------------------------------------------------------
# SQuAD JSON (squad.read_squad_examples, which run_squad uses, and squad.read_squad_file beneath it)
# ---------------------------------------------------------------------------------------------------------
CONTEXT_TEXT = st.text(alphabet=st.sampled_from("ab cd\tE\n\u00e9\u4e2d\u3000\u200b\u202f"), max_size=30)


@st.composite
def squad_document(draw: st.DrawFn) -> dict[str, Any]:
    """A valid SQuAD 1.1/2.0 document; answers are real spans of their context, or flagged impossible."""
    articles = []
    for _ in range(draw(st.integers(1, 2))):
        paragraphs = []
        for _ in range(draw(st.integers(1, 2))):
            context = draw(CONTEXT_TEXT.filter(lambda text: text.strip()))
            qas = []
            for q in range(draw(st.integers(0, 2))):
                answers = []
                for _ in range(draw(st.integers(0, 2))):
                    start = draw(st.integers(0, len(context) - 1))
                    end = draw(st.integers(start + 1, len(context)))
                    answers.append({"text": context[start:end], "answer_start": start})
                qa = {"id": f"q{len(articles)}{len(paragraphs)}{q}", "question": draw(CONTEXT_TEXT) + "?",
                      "answers": answers}
                if draw(st.booleans()):
                    qa["is_impossible"] = not answers
                qas.append(qa)
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": "t", "paragraphs": paragraphs})
    return {"version": draw(st.sampled_from(["1.1", "v2.0"])), "data": articles}


def assert_usable_examples(examples: list) -> None:
    for example in examples:
        assert isinstance(example, squad.SquadExample)
        assert isinstance(example.qas_id, str) and isinstance(example.question_text, str)
        separators = squad._CONTEXT_WHITESPACE  # the reference's word separators (not all of str.isspace)
        assert all(isinstance(w, str) and w and not set(w) & separators for w in example.doc_tokens)
        for answer in example.answers:
            assert isinstance(answer.text, str) and answer.text
            assert 0 <= answer.start_word <= answer.end_word < len(example.doc_tokens), answer


def assert_well_typed(document: dict[str, Any], version_2: bool) -> None:
    """A file that reads had the types SQuAD specifies wherever the reader used a value (no str() of a list)."""
    for article in document["data"]:
        for paragraph in article["paragraphs"]:
            assert isinstance(paragraph["context"], str), paragraph["context"]
            for qa in paragraph["qas"]:
                assert isinstance(qa["id"], (str, int)) and not isinstance(qa["id"], bool), qa["id"]
                assert isinstance(qa["question"], str), qa["question"]
                if version_2 and (qa.get("is_impossible") or not qa["answers"]):
                    continue  # the answers of an impossible question are not read
                for answer in qa["answers"]:
                    assert isinstance(answer["text"], str), answer
                    assert type(answer["answer_start"]) is int, answer


@fuzz(json_file_bytes(squad_document()), st.booleans(), st.booleans())
@pytest.mark.slow
def test_fuzz_squad_reader(content: bytes, is_training: bool, version_2: bool) -> None:
    """read_squad_examples: well-typed examples whose answers lie inside their context, or one InputError line."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train-v1.1.json"
        path.write_bytes(content)
        examples = outcome(lambda: squad.read_squad_examples(path, is_training, version_2), path)
        if examples is not None:
            assert_usable_examples(examples)
            assert_well_typed(json.loads(content.decode("utf-8")), version_2)


# ---------------------------------------------------------------------------------------------------------
# GLUE TSV (glue.read_examples)
# ---------------------------------------------------------------------------------------------------------
GLUE_TASKS = ("cola", "sst-2", "mrpc", "sts-b", "mnli")
CELL_TEXT = st.text(alphabet=st.sampled_from('ab "q\'\r\u00e9\u4e2d\ufeff\u2028'), max_size=8)
# Columns of each task's train/dev files (CoLA has no header; the test files keep their own layouts).
GLUE_COLUMNS = {"cola": 4, "sst-2": 2, "mrpc": 5, "sts-b": 10, "mnli": 12}


@st.composite
def glue_file(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(task, split, bytes of its TSV): right or wrong column counts, valid or invalid labels, BOM, CRLF."""
    name, split = draw(st.sampled_from(GLUE_TASKS)), draw(st.sampled_from(glue.SPLITS))
    task = glue.TASKS[name]
    columns = GLUE_COLUMNS[name] if split != "test" else max(task.test_text_a, task.test_text_b or 0) + 1
    label_values = list(task.labels) if task.labels else ["0.0", "3.8", "5", "-1e3", "nan", "inf", "1e400"]
    rows = [] if task.has_header is False and split != "test" else [[f"h{i}" for i in range(columns)]]
    for _ in range(draw(st.integers(0, 4))):
        width = columns if draw(st.integers(0, 5)) else draw(st.integers(0, 14))
        row = [draw(CELL_TEXT) for _ in range(width)]
        if split != "test" and -len(row) <= task.label < len(row):
            row[task.label] = draw(st.one_of(st.sampled_from(label_values), CELL_TEXT))
        rows.append(row)
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join("\t".join(row) for row in rows) + (newline if draw(st.booleans()) else "")
    return name, split, draw(damaged(encoded(draw, text)))


def assert_usable_glue(task: glue.GlueTask, split: str, examples: list, content: bytes) -> None:
    lines = content.decode("utf-8-sig").split("\n")
    data_lines = len(lines) - (lines[-1] == "") - (task.has_header or split == "test")
    assert len(examples) == data_lines and len({e.guid for e in examples}) == len(examples)
    for example in examples:
        assert isinstance(example.text_a, str) and (example.text_b is None) == (task.text_b is None)
        if split == "test":
            assert example.label is None
        elif task.is_regression:
            assert isinstance(example.label, float) and math.isfinite(example.label), example.label
        else:
            assert example.label in task.labels


@fuzz(glue_file())
@pytest.mark.slow
def test_fuzz_glue_reader(case: tuple[str, str, bytes]) -> None:
    """glue.read_examples: labelled (or test) examples, one per data line, or one InputError line."""
    name, split, content = case
    task = glue.TASKS[name]
    with tempfile.TemporaryDirectory() as folder:
        path = glue.split_file(task, folder, split)
        path.write_bytes(content)
        examples = outcome(lambda: glue.read_examples(task, folder, split), path)
        if examples is not None:
            assert_usable_glue(task, split, examples, content)


# ---------------------------------------------------------------------------------------------------------
# BERT config JSON (model_weights.read_config)
# ---------------------------------------------------------------------------------------------------------
@st.composite
def bert_config_dict(draw: st.DrawFn) -> dict[str, Any]:
    heads = draw(st.integers(1, 4))
    values: dict[str, Any] = {
        "vocab_size": draw(st.integers(1, 120)), "hidden_size": heads * draw(st.integers(1, 8)),
        "num_hidden_layers": draw(st.integers(1, 2)), "num_attention_heads": heads,
        "intermediate_size": draw(st.integers(1, 40)), "hidden_act": draw(st.sampled_from(sorted(ACTIVATIONS))),
        "hidden_dropout_prob": draw(st.floats(0, 0.9)), "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": draw(st.integers(1, 64)), "type_vocab_size": draw(st.integers(1, 3)),
        "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    }
    optional = sorted(set(values) - set(BERT_REQUIRED_KEYS))
    for key in draw(st.lists(st.sampled_from(optional), max_size=3)):
        values.pop(key, None)  # optional keys take the defaults (a missing required one: the mutations)
    if draw(st.booleans()):
        values.update(model_type="bert", architectures=["BertForMaskedLM"], pad_token_id=0)  # Hugging Face's
    return values


def assert_usable_config(config: BertConfig) -> None:
    """Every value is in range; a config small enough to build here builds a model."""
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size"):
        value = getattr(config, key)
        assert type(value) is int and value >= 1, (key, value)
    assert config.hidden_size % config.num_attention_heads == 0 and config.hidden_act in ACTIVATIONS
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        assert 0 <= getattr(config, key) < 1
    assert math.isfinite(config.layer_norm_eps) and math.isfinite(config.initializer_range)
    json.dumps(config.to_dict())  # and it writes back
    size = (config.padded_vocab_size + config.max_position_embeddings + config.type_vocab_size
            + config.num_hidden_layers * config.intermediate_size) * config.hidden_size
    if size < 200_000 and config.num_hidden_layers <= 4:
        BertModel(config)


@fuzz(json_file_bytes(bert_config_dict()))
@pytest.mark.slow
def test_fuzz_config_reader(content: bytes) -> None:
    """read_config: a config every value of which can build a model, or one WeightsError line."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bert_config.json"
        path.write_bytes(content)
        try:
            config = read_config(path)
        except WeightsError as error:
            assert "\n" not in str(error) and str(error).startswith(str(path)), str(error)
            return
        assert_usable_config(config)


# ---------------------------------------------------------------------------------------------------------
# vocab.txt (tokenization.wordpiece.load_vocab)
# ---------------------------------------------------------------------------------------------------------
TOKEN_TEXT = st.text(alphabet=st.sampled_from("ab#\u00e9 \t\r\u4e2d\x00\ufeff"), max_size=5)


@st.composite
def vocab_bytes(draw: st.DrawFn) -> bytes:
    tokens = [token for token in SPECIAL_TOKENS if draw(st.integers(0, 30))]  # usually all five
    tokens += draw(st.lists(st.one_of(TOKEN_TEXT, st.sampled_from(["the", "##s", "[PAD]", "a"])), max_size=12))
    order = draw(st.permutations(range(len(tokens))))
    newline = draw(st.sampled_from(["\n"] * 4 + ["\r\n", "\r"]))
    text = newline.join(tokens[i] for i in order) + (newline if draw(st.booleans()) else "")
    return draw(damaged(encoded(draw, text)))


@fuzz(vocab_bytes(), st.booleans())
@pytest.mark.slow
def test_fuzz_vocab_reader(content: bytes, lower_case: bool) -> None:
    """load_vocab: a vocab whose ids and tokens agree and that tokenizes, or one DataError line."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "vocab.txt"
        path.write_bytes(content)
        vocab = outcome(lambda: load_vocab(path), path)
        if vocab is None:
            return
        assert all(token in vocab.ids for token in SPECIAL_TOKENS)
        assert all(vocab.tokens[i] == token for token, i in vocab.ids.items())
        ids = BertTokenizer(vocab, lower_case).encode("Hello, [MASK] world \u00e9t\u00e9 \u4e2d")
        assert all(0 <= i < len(vocab) for i in ids)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints (model_weights.read_weights, checkpointing.load_checkpoint)
# ---------------------------------------------------------------------------------------------------------
class WritesMarker:
    """Pickles to `open(marker, "w")`: unpickling it (which must never happen) would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.marker), "w")


# Our, Hugging Face's (no "bert." prefix) and NVIDIA's (gamma, dense_act, "module.") names.
WEIGHT_NAMES = ("bert.embeddings.word_embeddings.weight", "embeddings.LayerNorm.gamma",
                "module.cls.predictions.bias", "bert.encoder.layer.0.intermediate.dense_act.weight",
                "cls.predictions.decoder.bias", "qa_outputs.weight")
SMALL_TENSORS = st.builds(lambda shape, dtype: torch.zeros(shape, dtype=dtype),
                          st.lists(st.integers(0, 3), max_size=2).map(tuple),
                          st.sampled_from([torch.float32, torch.float16, torch.int64, torch.bool]))


def checkpoint_values(marker: Path) -> st.SearchStrategy:
    leaves = st.one_of(SMALL_TENSORS, JSON_SCALARS, st.just(WritesMarker(marker)))
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.sampled_from(WEIGHT_NAMES), st.text(max_size=6),
                                                               st.integers(0, 3)), inner, max_size=4)), max_leaves=10)


@st.composite
def checkpoint_object(draw: st.DrawFn, marker: Path) -> Any:
    """What a .pt file may hold: a state dict, {"model": ..., "config": ...}, or anything else."""
    state = draw(st.dictionaries(st.sampled_from(WEIGHT_NAMES), SMALL_TENSORS, max_size=4))
    shape = draw(st.sampled_from(["state", "ours", "ours", "loader", "anything"]))
    if shape == "state":
        return state
    if shape == "loader":  # NVIDIA's checkpoints may hold their data loader, a pickled Python object
        where = draw(st.sampled_from(["top", "model", "nested"]))
        hostile = WritesMarker(marker)
        return {"model": {**state, "x": hostile} if where == "model" else state,
                "data": {"loader": [hostile]} if where == "nested" else hostile}
    if shape == "ours":
        payload = {"model": draw(st.one_of(st.just(state), checkpoint_values(marker))), "global_step": 3}
        if draw(st.booleans()):
            payload["config"] = draw(mutated_json(draw(bert_config_dict())))
        if draw(st.booleans()):
            payload["optimizer"] = draw(checkpoint_values(marker))
        return payload
    return draw(checkpoint_values(marker))


@st.composite
def checkpoint_file(draw: st.DrawFn, marker: Path) -> tuple[str, Case]:
    """(file name, Case): torch.save (zip or legacy), a raw pickle, or safetensors, possibly damaged."""
    writer = draw(st.sampled_from(["zip", "zip", "legacy", "pickle", "safetensors"]))
    buffer = io.BytesIO()
    if writer == "safetensors":
        tensors = draw(st.dictionaries(st.sampled_from(WEIGHT_NAMES), SMALL_TENSORS, max_size=4))
        with tempfile.TemporaryDirectory() as folder:  # safetensors writes files, not buffers
            save_safetensors(tensors, str(Path(folder) / "m.safetensors"))
            content = (Path(folder) / "m.safetensors").read_bytes()
        description = [f"safetensors of {sorted(tensors)}"]
        return "model.safetensors", Case(description, damage(draw, content, description))
    payload = draw(checkpoint_object(marker))
    if writer == "pickle":
        pickle.dump(payload, buffer, protocol=2)
    else:
        torch.save(payload, buffer, _use_new_zipfile_serialization=writer == "zip")
    description = [f"{writer} of {repr(payload)[:300]}"]
    name = draw(st.sampled_from(["ckpt_7.pt", "pytorch_model.bin"]))
    return name, Case(description, damage(draw, buffer.getvalue(), description))


# One marker path for every example of this process (a folder of its own, so that sessions side by side never share
# it); each example checks that it was never created.
MARKER_FOLDER = Path(tempfile.mkdtemp(prefix="bert_fuzz_"))
atexit.register(shutil.rmtree, MARKER_FOLDER, True)
MARKER = MARKER_FOLDER / "unpickled_marker"


def assert_usable_weights(weights: LoadedWeights) -> None:
    assert weights.state_dict and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                      for k, v in weights.state_dict.items())
    assert weights.config is None or isinstance(weights.config, BertConfig)
    assert weights.source_format in ("ours", "nvidia", "huggingface")


@fuzz(checkpoint_file(MARKER))
@pytest.mark.slow
def test_fuzz_checkpoint_readers(named: tuple[str, Case]) -> None:
    """read_weights and load_checkpoint: a state dict of tensors (a checkpoint with a model dict), or one
    InputError line; no pickled object is ever built, so the marker file never appears."""
    name, case = named
    MARKER.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(case.content)
        weights = outcome(lambda: read_weights(path), path)
        if weights is not None:
            assert_usable_weights(weights)
        if path.suffix != ".safetensors":
            payload = outcome(lambda: load_checkpoint(path), path)
            if payload is not None:
                assert isinstance(payload, dict) and isinstance(payload["model"], dict), payload
    assert not MARKER.exists(), "a pickled object was executed"


# ---------------------------------------------------------------------------------------------------------
# Regression tests: each config check of issue 13, and each bug the fuzzing found
# ---------------------------------------------------------------------------------------------------------
TINY_CONFIG = {"vocab_size": 101, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
               "intermediate_size": 64, "max_position_embeddings": 64, "hidden_act": "gelu"}


@pytest.mark.parametrize("change,key", [
    ({"num_hidden_layers": -1}, "num_hidden_layers"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers"),
    ({"num_hidden_layers": "12"}, "num_hidden_layers"),
    ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"num_hidden_layers": 2**40}, "num_hidden_layers"),
    ({"hidden_size": 30}, "num_attention_heads"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"vocab_size": -5}, "vocab_size"),
    ({"vocab_size": None}, "vocab_size"),
    ({"type_vocab_size": 0}, "type_vocab_size"),
    ({"intermediate_size": [64]}, "intermediate_size"),
    ({"max_position_embeddings": -512}, "max_position_embeddings"),
    ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob"),
    ({"hidden_dropout_prob": -0.1}, "hidden_dropout_prob"),
    ({"attention_probs_dropout_prob": 1.5}, "attention_probs_dropout_prob"),
    ({"attention_probs_dropout_prob": "0.1"}, "attention_probs_dropout_prob"),
    ({"layer_norm_eps": -1e-12}, "layer_norm_eps"),
    ({"initializer_range": float("inf")}, "initializer_range"),
    ({"hidden_act": "gelu_fancy"}, "hidden_act"),
    ({"hidden_act": ["gelu"]}, "hidden_act"),
    ({"extra": "notes"}, "extra"),
    # keys our BERT does not use, with values that ask for another model
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"is_decoder": True}, "is_decoder"),
    ({"add_cross_attention": True}, "add_cross_attention"),
    ({"model_type": "roberta"}, "model_type"),
])
def test_config_value_that_cannot_build_a_model_is_one_line_naming_file_and_key(tmp_path, change, key):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **change}))
    with pytest.raises(WeightsError) as caught:
        read_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and key in message and "\n" not in message, message


@pytest.mark.parametrize("content,problem", [
    (b"[1, 2]", "holds a JSON list"),
    (b'"base"', "holds a JSON str"),
    (b"", "malformed JSON"),
    (b'{"vocab_size": 101,', "malformed JSON"),
    (b"\xff\xfe{}", "UTF-16 text, not a BERT config file"),  # named as what it is
    (b"[" * 3000, "unusable JSON"),  # json's recursion limit
    (b'{"vocab_size": ' + b"9" * 5000 + b"}", "unusable JSON"),  # Python's 4300-digit limit
], ids=["list", "string", "empty", "truncated", "utf-16", "deep nesting", "5000-digit integer"])
def test_config_file_that_is_not_a_config_object_is_one_line(tmp_path, content, problem):
    path = tmp_path / "bert_config.json"
    path.write_bytes(content)
    with pytest.raises(WeightsError, match=f"^{re.escape(str(path))}: {problem}"):
        read_config(path)


def test_config_file_missing_or_a_directory_is_one_line(tmp_path):
    with pytest.raises(WeightsError, match="config file not found"):
        read_config(tmp_path / "absent.json")
    with pytest.raises(WeightsError, match="is a directory"):
        read_config(tmp_path)


def test_config_with_byte_order_mark_and_hugging_face_keys_reads(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(json.dumps({**TINY_CONFIG, "model_type": "bert", "hidden_dropout_prob": 0}).encode("utf-8-sig"))
    config = read_config(path)
    assert config.num_hidden_layers == 2 and config.extra == {"model_type": "bert"}
    assert config.hidden_dropout_prob == 0.0 and type(config.hidden_dropout_prob) is float


def test_config_built_in_code_is_checked_too():
    with pytest.raises(ConfigError, match="^num_hidden_layers is 0, expected"):
        BertConfig(num_hidden_layers=0)
    assert BertConfig(vocab_size=np.int64(30522)).to_dict()["vocab_size"] == 30522  # numpy ints become ints
    assert isinstance(ConfigError("x"), InputError) and isinstance(ConfigError("x"), ValueError)


def test_checkpoint_config_entry_names_the_file_and_key(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"model": {"bert.pooler.dense.weight": torch.zeros(2, 2)},
                "config": {**TINY_CONFIG, "num_hidden_layers": 0}}, path)
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))} \(its 'config' entry\): num_hidden_layers is 0"):
        read_weights(path)


# Issue "Nothing lost, round three", case 2: a config is checked by its content.
MODERN_CONFIG = {"model_type": "modernbert", "vocab_size": 101, "hidden_size": 32, "num_hidden_layers": 3,
                 "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 64,
                 "local_attention": 8, "pad_token_id": 0}


def config_error(path: Path, values: dict[str, Any]) -> str:
    """read_config's one-line error for a file of `values` (it must refuse it)."""
    path.write_text(json.dumps(values))
    with pytest.raises(WeightsError) as caught:
        read_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


@pytest.mark.parametrize("values,named", [
    ({**{k: v for k, v in TINY_CONFIG.items() if k != "num_hidden_layers"}, "num_hidden_layer": 2},
     "unknown BERT config key num_hidden_layer (did you mean num_hidden_layers?)"),
    ({**MODERN_CONFIG, "local_atention": 64}, "unknown ModernBERT config key local_atention (did you mean "
                                              "local_attention?)"),
    ({**TINY_CONFIG, "local_atention": 64}, "local_atention (did you mean local_attention, a ModernBERT key?)"),
    ({**TINY_CONFIG, "model_type": "bert", "local_attention": 64}, "local_attention (a ModernBERT key)"),
    ({**MODERN_CONFIG, "hidden_act": "gelu"}, "hidden_act (a BERT key)"),
    ({**TINY_CONFIG, "notes": "my run", "hidden_dropout": 0.1},
     "unknown BERT config keys notes, hidden_dropout (did you mean hidden_dropout_prob?); correct the spelling or "
     "remove them"),
], ids=["misspelt", "misspelt-modern", "modern-key-in-bert", "modern-key-beside-model-type-bert",
        "bert-key-in-modern", "two-unknown"])
def test_an_unknown_or_misspelt_config_key_is_one_line_naming_it_and_the_close_known_key(tmp_path, values, named):
    assert named in config_error(tmp_path / "config.json", values)


@pytest.mark.parametrize("family,values,required", [
    *[("bert", TINY_CONFIG, key) for key in BERT_REQUIRED_KEYS],
    *[("modern", MODERN_CONFIG, key) for key in MODERN_REQUIRED_KEYS]])
def test_a_config_without_a_key_that_shapes_the_model_names_it(tmp_path, family, values, required):
    message = config_error(tmp_path / "config.json", {k: v for k, v in values.items() if k != required})
    assert f": {required} is missing;" in message
    with_it = tmp_path / "complete.json"
    with_it.write_text(json.dumps(values))
    assert read_config(with_it).to_dict()[required] == values[required]


@pytest.mark.parametrize("path", sorted([*(REPO_ROOT / "bert_configs").glob("*.json"),
                                         *(REPO_ROOT / "tests" / "data").rglob("*config.json")]),
                         ids=lambda path: path.name)
def test_every_config_file_of_the_repository_loads_and_is_refused_without_a_required_key(tmp_path, path):
    values = json.loads(path.read_text(encoding="utf-8"))
    config = read_config(path)
    required = MODERN_REQUIRED_KEYS if values.get("model_type") == "modernbert" else BERT_REQUIRED_KEYS
    assert {key: getattr(config, key) for key in required} == {key: values[key] for key in required}
    for key in required:
        less = {k: v for k, v in values.items() if k != key}
        assert f": {key} is missing;" in config_error(tmp_path / "config.json", less)


def test_a_checkpoint_record_drops_the_keys_older_versions_kept_unused(tmp_path):
    """Our checkpoints store config.to_dict(): one written before unknown keys were refused may hold one, and
    must still load (and resume: recorded_config is what a resume compares)."""
    path = tmp_path / "ckpt_2.pt"
    record = {**BertConfig.from_dict(TINY_CONFIG).to_dict(), "notes": "my run", "architectures": ["BertModel"]}
    torch.save({"model": {"bert.pooler.dense.weight": torch.zeros(2, 2)}, "config": record}, path)
    config = read_weights(path).config
    assert config.num_hidden_layers == TINY_CONFIG["num_hidden_layers"]
    assert config.extra == {"architectures": ["BertModel"]}  # a transformers key stays, the unknown one is gone
    assert recorded_config(record) == {k: v for k, v in record.items() if k != "notes"}
    assert "notes" in config_error(tmp_path / "config.json", record)  # a config file with it is refused


def _shard_with(tmp_path: Path, change: Callable[[h5py.File], Any]) -> Path:
    """A valid 3-row shard whose input_ids `change` writes."""
    path = tmp_path / "shard.hdf5"
    arrays = valid_shard(np.random.default_rng(0), 3, 8, 2)
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            if key != "input_ids":
                f.create_dataset(key, data=value)
        f.attrs["vocab_size"] = VOCAB
        change(f)
    return path


@pytest.mark.parametrize("name,change,problem", [
    ("group", lambda f: f.create_group("input_ids"), "not an array: input_ids"),
    ("empty dataspace", lambda f: f.create_dataset("input_ids", data=h5py.Empty("i4")), "not an array: input_ids"),
    ("scalar", lambda f: f.create_dataset("input_ids", data=np.int32(5)), r"input_ids has shape \(\)"),
    ("vocab_size text", lambda f: (f.create_dataset("input_ids", data=np.zeros((3, 8), np.int32)),
                                   f.attrs.__setitem__("vocab_size", "")), "attribute vocab_size"),
    ("vocab_size array", lambda f: (f.create_dataset("input_ids", data=np.zeros((3, 8), np.int32)),
                                    f.attrs.__setitem__("vocab_size", np.arange(3))), "attribute vocab_size"),
    ("vocab_size nan", lambda f: (f.create_dataset("input_ids", data=np.zeros((3, 8), np.int32)),
                                  f.attrs.__setitem__("vocab_size", np.nan)), "attribute vocab_size"),
])
def test_shard_oddities_found_by_fuzzing_are_one_line(tmp_path, name, change, problem):
    """Before: AttributeError ('Group' has no shape), TypeError (None shape), IndexError (shape ()), ValueError
    and TypeError from int() of the vocab_size attribute."""
    path = _shard_with(tmp_path, change)
    with pytest.raises(InputError, match=problem):
        inspect_shard(path, vocab_size=VOCAB, max_positions=MAX_POSITIONS)


@pytest.mark.parametrize("at,junk", [(1393, b"\x00" * 8), (693, b"\x00" * 4)], ids=["KeyError", "RuntimeError"])
def test_shard_with_damaged_metadata_is_one_line(tmp_path, at, junk):
    """Damaged HDF5 object headers made h5py raise KeyError and RuntimeError, which are not OSError."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        for key, value in valid_shard(np.random.default_rng(0), 0, 2, 1).items():
            f.create_dataset(key, data=value)
        f.attrs.update({"vocab_size": VOCAB, "max_seq_length": 2, "format_version": 1})
    content = buffer.getvalue()
    path = tmp_path / "shard.hdf5"
    path.write_bytes(content[:at] + junk + content[at + len(junk):])
    result = outcome(lambda: read_shard(path), path)
    if result is not None:  # another h5py may lay the file out differently: then it must still be whole
        assert_usable_shard(*result)


def _squad_file(tmp_path: Path, context: Any = "Paris is in France.", qid: Any = "q1",
                answer: Any = None) -> Path:
    answer = {"text": "Paris", "answer_start": 0} if answer is None else answer
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": [{"id": qid, "question": "Where?", "answers": [answer]}]}]}]}))
    return path


@pytest.mark.parametrize("fields,problem", [
    ({"context": ["Paris is", "in France."]}, "the context is a JSON list"),
    ({"context": " E", "answer": {"text": " ", "answer_start": 0}}, "covers no word of the context"),
    ({"qid": ["q1"]}, "the question id is"),
    ({"qid": None}, "the question id is"),
    ({"answer": {"text": 5, "answer_start": 0}}, "expected a text string"),
    ({"answer": {"text": "aris", "answer_start": True}}, "expected a text string and a character index"),
])
def test_squad_entries_of_wrong_type_are_refused(tmp_path, fields, problem):
    """Before: read as str() of the value (a list's repr as the question id, True as character 1), a context
    list's items taken as words, and an answer ending at word -1."""
    path = _squad_file(tmp_path, **fields)
    for is_training in (False, True):
        with pytest.raises(InputError, match=problem):
            squad.read_squad_examples(path, is_training)


@pytest.mark.parametrize("content", [b"[" * 3000, b'{"data": [], "n": ' + b"9" * 5000 + b"}"],
                         ids=["deep nesting", "5000-digit integer"])
def test_squad_json_the_parser_trips_over_is_one_line(tmp_path, content):
    """Before: RecursionError and ValueError (the 4300-digit limit) escaped the SQuAD file reader."""
    path = tmp_path / "train.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match="unusable JSON"):
        squad.read_squad_file(path)


@pytest.mark.parametrize("score", ["nan", "NaN", "inf", "-inf", "1e400"])
def test_glue_regression_score_must_be_finite(tmp_path, score):
    """Before: STS-B read nan (which features take for "no label") and inf as scores."""
    header = "\t".join(f"h{i}" for i in range(10))
    (tmp_path / "train.tsv").write_text(f"{header}\n" + "\t" * 7 + "a\tb\t" + score + "\n")
    with pytest.raises(InputError, match="is not a number"):
        glue.read_examples(glue.TASKS["sts-b"], tmp_path, "train")


def test_vocab_with_byte_order_mark_keeps_pad_at_id_0(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\n".join([*SPECIAL_TOKENS, "the"]).encode("utf-8-sig"))
    vocab = load_vocab(path)
    assert vocab.id("[PAD]") == 0 and vocab.tokens[0] == "[PAD]"


@pytest.mark.parametrize("payload,problem", [
    ({"model": []}, "is a list, not a state dict"),
    ({"model": "weights.bin"}, "is a str, not a state dict"),
])
def test_checkpoint_model_entry_must_be_a_state_dict(tmp_path, payload, problem):
    """Before: load_checkpoint returned it and resuming died in load_state_dict with a traceback."""
    path = tmp_path / "ckpt_7.pt"
    torch.save(payload, path)
    with pytest.raises(InputError, match=problem):
        load_checkpoint(path)


@pytest.mark.parametrize("state", [{0: torch.zeros(2)}, {"bert.embeddings.position_ids": torch.zeros(2)},
                                   {"model": {1: torch.zeros(1), "n": 3}}])
def test_weights_with_no_named_tensor_are_refused(tmp_path, state):
    """Before: int keys raised AttributeError (no removeprefix); index buffers alone gave an empty state dict."""
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)
    with pytest.raises(WeightsError, match="holds no weights|holds no state dict"):
        read_weights(path)


@pytest.mark.parametrize("legacy", [False, True])
def test_pickled_object_is_never_executed(tmp_path, legacy):
    marker = tmp_path / "executed"
    hostile = {"model": {"bert.pooler.dense.weight": torch.zeros(1)}, "loader": WritesMarker(marker)}
    path = tmp_path / "ckpt_7.pt"
    torch.save(hostile, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(WeightsError, match="holds Python objects"):
        read_weights(path)
    with pytest.raises(InputError, match="holds Python objects"):
        load_checkpoint(path)
    assert not marker.exists()
    # The marker works: plain pickle, which this recipe never uses on files, would have written it.
    pickle.loads(pickle.dumps(WritesMarker(marker))).close()
    assert marker.exists()
