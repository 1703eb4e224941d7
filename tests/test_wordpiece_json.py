"""A released BERT's tokenizer.json (WordPiece) is a --vocab_file wherever a vocab.txt is: the oracle is transformers,
which saves the repository's vocab excerpt as the tokenizer.json of a BERT folder. Shards made with it equal those
made with the vocab.txt array by array and attribute by attribute (both shard kinds, create_pretraining_data.py and
bertPrep.py), its identity is the vocab.txt's, a casing that --do_lower_case contradicts and a tokenizer.json of
another model or of none are one line before any write, and fine-tuning and inference tokenize as transformers'
tokenizer of the file does."""
import hashlib
import json
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer, models

from bertrecipe.common.errors import DataError
from bertrecipe.dataprep import layout
from bertrecipe.finetuning import glue as glue_data
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.model.weights import huggingface_export_names
from bertrecipe.pretraining.run_tokenizer import run_tokenizer
from bertrecipe.pretraining.shard_schema import inspect_shard
from bertrecipe.tokenization.vocab_files import WORDPIECE, identity_of, load_vocab_file
from bertrecipe.tokenization.wordpiece import SPECIAL_TOKENS, Vocab, load_vocab
from helpers import REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, run_command, write_formatted

SEQ, PREDS = 64, 10
HOLMES = TEST_DATA / "books" / "pg1661.txt"
# Capitals, accents, Greek, CJK characters, punctuation, words the excerpt splits into pieces.
MIXED = ["Sherlock Holmes took his bottle from the corner of the MANTEL-PIECE.",
         "Naïve CAFÉ owners in Zürich said «ΑΘΗΝΑ» and 東京 were unbelievably interchangeable!",
         "Hyperparameterisation, O'Neill's co-operation; 3.14159 — done."]
KINDS = {"sentence pairs": [], "document chunks": ["--document_chunks"]}


def released_folder(folder: Path, lower_case: bool) -> Path:
    """A BERT folder as transformers saves one (tokenizer.json, tokenizer_config.json) from the vocab excerpt. (Its
    tokenizer class takes the vocab.txt through from_pretrained: transformers 5 ignores a `vocab_file=` argument and
    would save BERT's five special tokens alone.)"""
    source = folder / "source"
    source.mkdir(parents=True)
    shutil.copyfile(VOCAB_EXCERPT, source / "vocab.txt")
    transformers.BertTokenizerFast.from_pretrained(source, do_lower_case=lower_case).save_pretrained(folder)
    shutil.rmtree(source)
    saved = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["model"]["type"] == "WordPiece" and saved["normalizer"]["lowercase"] is lower_case
    assert len(saved["model"]["vocab"]) == len(load_vocab(VOCAB_EXCERPT))  # the whole excerpt, not a default
    return folder


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> dict[str, Path]:
    """The uncased and the cased tokenizer.json of the excerpt, and a text of a book's opening with a document of
    mixed text."""
    root = tmp_path_factory.mktemp("released")
    lines = HOLMES.read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "text.txt").write_text("".join(lines[:150]) + "\n" + "\n".join(MIXED) + "\n", encoding="utf-8")
    return {"uncased": released_folder(root / "uncased", True) / "tokenizer.json",
            "cased": released_folder(root / "cased", False) / "tokenizer.json", "text": root / "text.txt"}


def make_shard(text: Path, vocab: Path, out: Path, *flags: str):
    return run_command([sys.executable, str(REPO_ROOT / "data" / "create_pretraining_data.py"), "--input_file", text,
                        "--output_file", out, "--vocab_file", vocab, "--max_seq_length", SEQ,
                        "--max_predictions_per_seq", PREDS, "--dupe_factor", "2", *flags])


def shard_contents(path: Path) -> tuple[dict, dict]:
    """Every array (values, dtype, shape) and every attribute of a shard."""
    with h5py.File(path, "r") as f:
        arrays = {key: f[key][()] for key in f}
        attributes = {key: f.attrs[key] for key in f.attrs}
    return arrays, attributes


def assert_same_shards(a: Path, b: Path) -> None:
    (arrays_a, attrs_a), (arrays_b, attrs_b) = shard_contents(a), shard_contents(b)
    assert sorted(arrays_a) == sorted(arrays_b) and sorted(attrs_a) == sorted(attrs_b)
    for key, array in arrays_a.items():
        assert array.dtype == arrays_b[key].dtype and np.array_equal(array, arrays_b[key]), key
    for key, value in attrs_a.items():
        assert type(value) is type(attrs_b[key]) and np.array_equal(value, attrs_b[key]), key


def one_line_refusal(done, path: Path, *fragments: str) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), done.stderr
    assert all(fragment in lines[0] for fragment in fragments), lines[0]
    return lines[0]


# ---------------------------------------------------------------- (a) the same shards
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_shards_of_the_tokenizer_json_equal_those_of_the_vocab_txt(released, tmp_path, kind, casing):
    # The excerpt's tokens say it is uncased: the vocab.txt keeps the case only with the override (the cased
    # tokenizer.json says it keeps the case in its normalizer).
    flags = KINDS[kind] + ([] if casing == "uncased" else ["--no-do_lower_case", "--allow_vocab_mismatch"])
    made = {}
    for name, vocab in (("txt", VOCAB_EXCERPT), ("json", released[casing])):
        made[name] = tmp_path / f"{name}.hdf5"
        done = make_shard(released["text"], vocab, made[name], *flags)
        assert done.returncode == 0, done.stderr[-3000:]
    assert_same_shards(made["txt"], made["json"])
    arrays, attributes = shard_contents(made["json"])
    assert len(arrays["input_ids"]) > 10  # rows to compare
    assert attributes["vocab_sha256"] == hashlib.sha256(VOCAB_EXCERPT.read_bytes()).hexdigest()
    assert int(attributes["do_lower_case"]) == (casing == "uncased")


def bert_prep(workdir: Path, *flags: str):
    return run_command([sys.executable, str(REPO_ROOT / "data" / "bertPrep.py"), *map(str, flags)],
                       env={"BERT_PREP_WORKING_DIR": str(workdir)})


@pytest.mark.parametrize("kind, folder", [("sentence pairs", "hdf5_lower_case_1_"),
                                          ("document chunks", "hdf5_document_chunks_lower_case_1_")])
def test_bert_prep_makes_the_vocab_txts_shards_with_the_tokenizer_json(released, tmp_path, kind, folder):
    paragraphs = [" ".join(p.split()) for p in HOLMES.read_text(encoding="utf-8").split("\n\n")[:120]]
    write_formatted([" ".join(paragraphs[i:i + 6]) for i in range(0, len(paragraphs), 6)],
                    layout.formatted_text(tmp_path, "bookscorpus"))
    common = ["--dataset", "bookscorpus", "--n_training_shards", "1", "--n_test_shards", "1"]
    assert bert_prep(tmp_path, "--action", "sharding", *common).returncode == 0
    shards = [*common, "--action", "create_hdf5_files", "--max_seq_length", SEQ, "--max_predictions_per_seq", PREDS,
              "--dupe_factor", "1", "--n_processes", "1", *KINDS[kind], "--vocab_file"]
    refused = bert_prep(tmp_path, *shards, released["cased"])  # --do_lower_case 1 is bertPrep's default
    one_line_refusal(refused, released["cased"], "--do_lower_case 0")
    assert not list(tmp_path.glob("hdf5_*"))
    for vocab in (released["uncased"], VOCAB_EXCERPT):
        done = bert_prep(tmp_path, *shards, vocab)
        assert done.returncode == 0, done.stderr[-3000:]
        [made] = tmp_path.glob("hdf5_*")
        assert made.name.startswith(folder)  # WordPiece's folder, not a BPE one
        made.rename(tmp_path / f"made_with_{vocab.suffix[1:]}")
    made = sorted(p.relative_to(tmp_path / "made_with_json") for p in (tmp_path / "made_with_json").rglob("*.hdf5"))
    assert len(made) == 2
    for shard in made:
        assert_same_shards(tmp_path / "made_with_json" / shard, tmp_path / "made_with_txt" / shard)
        assert len(shard_contents(tmp_path / "made_with_json" / shard)[0]["input_ids"]) > 0


# ---------------------------------------------------------------- (b) one identity
def test_its_identity_is_the_vocab_txts_and_runs_compare_them_equal(released, tmp_path):
    ours, theirs = load_vocab_file(released["uncased"]), load_vocab_file(VOCAB_EXCERPT)
    assert isinstance(ours, Vocab) and ours.tokens == theirs.tokens and ours.ids == theirs.ids
    assert identity_of(ours).record() == identity_of(theirs).record()
    assert identity_of(ours).kind == WORDPIECE and ours.sha256 == hashlib.sha256(VOCAB_EXCERPT.read_bytes()).hexdigest()
    assert identity_of(load_vocab_file(released["cased"])).record() == identity_of(theirs).record()  # same tokens
    shard = tmp_path / "txt.hdf5"
    assert make_shard(released["text"], VOCAB_EXCERPT, shard).returncode == 0
    info = inspect_shard(shard, len(theirs), SEQ)
    assert run_tokenizer([info], ours, len(theirs), False).sha256 == theirs.sha256  # no refusal: one tokenizer
    names = huggingface_export_names(released["uncased"])
    assert "tokenizer.json" in names and "vocab.txt" not in names  # exported as itself, never as a vocab.txt
    # Two tokens swapped: other ids for the same tokens, another tokenizer.
    data = json.loads(released["uncased"].read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    vocab["the"], vocab["of"] = vocab["of"], vocab["the"]
    swapped = tmp_path / "swapped.json"
    swapped.write_text(json.dumps(data), encoding="utf-8")
    assert load_vocab_file(swapped).sha256 != theirs.sha256
    with pytest.raises(DataError, match="the same ids stand for other tokens"):
        run_tokenizer([info], load_vocab_file(swapped), len(theirs), False)


# ---------------------------------------------------------------- (c) casing
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("casing, flags, fix", [("cased", [], "--no-do_lower_case"),
                                                ("uncased", ["--no-do_lower_case"], "pass --do_lower_case")])
def test_a_casing_the_flag_contradicts_is_one_line_before_any_write(released, tmp_path, kind, casing, flags, fix):
    done = make_shard(released["text"], released[casing], tmp_path / "out.hdf5", *KINDS[kind], *flags)
    one_line_refusal(done, released[casing], "tokenizer.json", fix)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- (d) no WordPiece, no BPE
def other_files(folder: Path, uncased: Path) -> dict[str, tuple[Path, str]]:
    """Files that are no tokenizer the recipe has, each with what its one line must say."""
    unigram = folder / "unigram.json"
    Tokenizer(models.Unigram([(token, -1.0) for token in (*SPECIAL_TOKENS, "the", "cat")], 1)).save(str(unigram))
    broken = folder / "broken.json"
    broken.write_text(uncased.read_text(encoding="utf-8")[:500], encoding="utf-8")
    plain = folder / "config.json"
    plain.write_text(json.dumps({"vocab_size": 30522, "hidden_size": 768}), encoding="utf-8")
    data = json.loads(uncased.read_text(encoding="utf-8"))
    data["model"]["vocab"]["[MASK]"] = 1_000_000
    gap = folder / "gap.json"
    gap.write_text(json.dumps(data), encoding="utf-8")
    return {"unigram": (unigram, "Unigram"), "broken": (broken, "not JSON"), "plain": (plain, "names no model type"),
            "gap": (gap, "id 103 is missing")}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["unigram", "broken", "plain", "gap"])
def test_a_tokenizer_json_of_another_model_or_of_none_is_one_line(released, tmp_path, kind, case):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    path, fragment = other_files(inputs, released["uncased"])[case]
    done = make_shard(released["text"], path, tmp_path / "out.hdf5", *KINDS[kind])
    one_line_refusal(done, path, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs"]
    with pytest.raises(DataError, match=fragment) as refused:
        load_tokenizer(path, True)
    assert "\n" not in str(refused.value)


def renamed(vocab: dict, old: str, new: str) -> None:
    vocab[new] = vocab.pop(old)


# What the recipe's WordPiece cannot reproduce, each with what its one line must say.
UNREPRODUCIBLE = {
    "accents kept while lower-casing": (lambda d: d["normalizer"].update(strip_accents=False), "strip_accents false"),
    "no BERT normalizer": (lambda d: d.update(normalizer={"type": "NFC"}), "is not BERT's"),
    "another pre-tokenizer": (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "is not BertPreTokenizer"),
    "another unknown token": (lambda d: d["model"].update(unk_token="<unk>"), 'unk_token is "<unk>"'),
    "a token with blank space": (lambda d: renamed(d["model"]["vocab"], "the", " the"), "cannot be a line of a vocab"),
    "an added token outside the vocab": (lambda d: d["added_tokens"].append({"id": 9000, "content": "<extra>"}),
                                         "added token '<extra>' (id 9000)"),
    "an id given twice": (lambda d: d["model"]["vocab"].update(the=0), "id 0 is given twice"),
}


@pytest.mark.parametrize("case", UNREPRODUCIBLE)
def test_a_wordpiece_file_the_recipe_cannot_reproduce_is_one_line(released, tmp_path, case):
    change, fragment = UNREPRODUCIBLE[case]
    data = json.loads(released["uncased"].read_text(encoding="utf-8"))
    change(data)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DataError) as refused:
        load_vocab_file(path)
    assert str(refused.value).startswith(f"{path}: ") and fragment in str(refused.value)
    assert "\n" not in str(refused.value)


# ---------------------------------------------------------------- (e) fine-tuning and inference
@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_fine_tuning_tokenizes_as_transformers_tokenizer_of_the_file(released, casing):
    path = released[casing]
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), pad_token="[PAD]")
    ours = load_tokenizer(path, casing == "uncased")
    sentences = MIXED + HOLMES.read_text(encoding="utf-8").splitlines()[40:80]
    assert [ours.encode(s) for s in sentences] == theirs(sentences, add_special_tokens=False)["input_ids"]
    if casing == "uncased":  # Google's lower-casing, as with the vocab.txt: a final sigma is "ς", theirs "σ"
        sigma = "ΟΔΥΣΣΕΥΣ"
        assert ours.tokenize(sigma) == load_tokenizer(VOCAB_EXCERPT, True).tokenize(sigma) == ["ο", "##δ", "##υ",
                                                                                               "##σ", "##σ", "##ε",
                                                                                               "##υ", "##ς"]
        assert theirs.tokenize(sigma)[:-1] == ours.tokenize(sigma)[:-1] and theirs.tokenize(sigma)[-1] == "##σ"
    spec = glue_data.get_task("mrpc")
    examples = glue_data.read_examples(spec, TEST_DATA / "glue" / "MRPC", "dev")[:40]
    features = glue_data.glue_features(examples, spec, ours, 128)
    expected = theirs([e.text_a for e in examples], [e.text_b for e in examples], padding="max_length",
                      max_length=128, return_token_type_ids=True)
    whole = [i for i, row in enumerate(expected["input_ids"]) if len(row) <= 128]  # the rows without truncation
    assert len(whole) > 30
    assert np.array_equal(features.input_ids[whole], np.array([expected["input_ids"][i] for i in whole]))
    assert np.array_equal(features.segment_ids[whole], np.array([expected["token_type_ids"][i] for i in whole]))


def test_the_cased_file_with_do_lower_case_is_refused_unless_allowed(released, capsys):
    with pytest.raises(DataError, match="keeps case") as refused:
        load_tokenizer(released["cased"], True)
    assert str(released["cased"]) in str(refused.value) and "\n" not in str(refused.value)
    assert load_tokenizer(released["cased"], True, allow_vocab_mismatch=True).do_lower_case
    assert "warning:" in capsys.readouterr().err


def test_inference_answers_with_the_tokenizer_json_as_with_the_vocab_txt(released, tiny_bert):
    def answer(vocab: Path):
        done = run_command([sys.executable, str(REPO_ROOT / "inference.py"), "--init_checkpoint", str(tiny_bert),
                            "--vocab_file", str(vocab), "--do_lower_case", "--question", "Who took the bottle?",
                            "--context", " ".join(MIXED), "--max_seq_length", "128", "--n_best_size", "5"])
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    assert answer(released["uncased"]) == answer(tiny_bert / "vocab.txt")
