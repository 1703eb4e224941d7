"""Fine-tuning with a byte-level BPE tokenizer.json, as a released ModernBERT folder holds one: GLUE and SQuAD
features equal transformers' tokenizer (PreTrainedTokenizerFast over the same file: [CLS] a [SEP] b [SEP],
longest-first truncation); run_glue.py, run_squad.py and inference.py take --vocab_file tokenizer.json; a
tokenizer that cannot be the model's is one line."""
import json
import sys

import numpy as np
import pytest
import torch
import transformers

from bertrecipe.dataprep.vocab_training import train_bpe
from bertrecipe.finetuning import glue as glue_data
from bertrecipe.finetuning import squad as squad_data
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.tokenization.bpe import BpeTokenizer
from helpers import EXCERPT, REPO_ROOT, TEST_DATA, TINY_MODERN, glue, run_command, squad, squad_subset, subset

BOOKS = [TEST_DATA / "books" / "pg11.txt", TEST_DATA / "books" / "pg1661.txt"]


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    """A seeded 3-layer ModernBERT that transformers saved, with a byte-level BPE tokenizer.json trained on two
    books (1,024 tokens with BERT's special tokens and [CLS] A [SEP] template)."""
    folder = tmp_path_factory.mktemp("bpe_modern") / "encoder"
    folder.mkdir()
    tokenizer = train_bpe(BOOKS, folder / "tokenizer.json", 1000)
    size = len(json.loads(tokenizer.read_text(encoding="utf-8"))["model"]["vocab"])
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=size, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3, **TINY_MODERN)
    transformers.ModernBertForMaskedLM(config).save_pretrained(folder)
    return folder


def their_tokenizer(folder):
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), cls_token="[CLS]",
                                                sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
                                                mask_token="[MASK]")


def google_truncated_row(a, b, max_length):
    """[CLS] a [SEP] (b [SEP]), padded: Google's truncate_seq_pair (pop from the longer, from b on a tie), which
    the recipe keeps for both tokenizers (transformers' fast tokenizer hands a tie's odd token to the longer)."""
    a, b = list(a), None if b is None else list(b)
    while len(a) + (len(b) + 1 if b is not None else 0) > max_length - 2:
        if b is None or len(a) > len(b):
            a.pop()
        else:
            b.pop()
    row = [2, *a, 3] + ([*b, 3] if b is not None else [])
    return row + [0] * (max_length - len(row))


@pytest.mark.parametrize("task, folder, length", [("mrpc", "MRPC", 96), ("sst-2", "SST-2", 48), ("rte", "RTE", 128)])
def test_glue_features_equal_transformers_tokenizer(bpe_folder, task, folder, length):
    spec = glue_data.get_task(task)
    examples = glue_data.read_examples(spec, TEST_DATA / "glue" / folder, "dev")[:40]
    ours = glue_data.glue_features(examples, spec, load_tokenizer(bpe_folder / "tokenizer.json",
                                                                                 False), length)
    theirs = their_tokenizer(bpe_folder)
    pairs = spec.text_b is not None
    a = theirs([e.text_a for e in examples], add_special_tokens=False)["input_ids"]
    b = theirs([e.text_b for e in examples], add_special_tokens=False)["input_ids"] if pairs else [None] * len(a)
    expected = np.array([google_truncated_row(x, y, length) for x, y in zip(a, b, strict=True)])
    assert np.array_equal(ours.input_ids, expected)
    assert np.array_equal(ours.input_mask, (expected != 0).astype(np.int8))
    assert (ours.input_mask.sum(1) == length).any() and (ours.input_mask.sum(1) < length).any()  # truncated and padded
    whole = theirs([e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                   padding="max_length", max_length=length)["input_ids"]  # the rows that need no truncation: as theirs
    short = [i for i, row in enumerate(whole) if len(row) <= length]
    assert short and np.array_equal(ours.input_ids[short], np.array([whole[i] for i in short]))


def test_squad_windows_equal_transformers_tokenizer_and_answers_are_context_words(bpe_folder):
    """Each question's first window against transformers' `tokenizer(question, context, truncation="only_second")`
    over the context's words; the gold span of a window that holds it covers the answer's words."""
    examples = squad_data.read_squad_examples(EXCERPT / "dev-v1.1.json", is_training=True)[:30]
    tokenizer = load_tokenizer(bpe_folder / "tokenizer.json", False)
    settings = squad_data.WindowSettings(max_seq_length=256, doc_stride=128, max_query_length=64)
    features = squad_data.convert_examples_to_features(examples, tokenizer, settings, is_training=True)
    theirs = their_tokenizer(bpe_folder)
    first_rows = np.searchsorted(features.example_index, np.arange(len(examples)))
    for index, example in enumerate(examples):
        row = first_rows[index]
        expected = theirs(example.question_text, " ".join(example.doc_tokens), truncation="only_second",
                          max_length=256)["input_ids"]
        assert features.input_ids[row][: features.input_mask[row].sum()].tolist() == expected, example.qas_id
    answered = np.flatnonzero(features.start_positions > 0)
    assert len(answered) >= 20
    for row in answered:
        answer = examples[features.example_index[row]].answers[0]
        words = features.token_to_orig[row, [features.start_positions[row], features.end_positions[row]]]
        assert tuple(words) == (answer.start_word, answer.end_word)


@pytest.mark.parametrize("embeddings, fragment, passes", [
    (4096, "(more than 128 past them): it is not the model's tokenizer", True),
    (512, "but the model embeds only 512", False)])
def test_a_tokenizer_that_cannot_be_the_model_s_is_one_line(bpe_folder, tmp_path, embeddings, fragment, passes):
    config = json.loads((bpe_folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": embeddings}))
    data = subset(TEST_DATA / "glue" / "SST-2", tmp_path / "SST-2", 8, 8)
    result = glue(bpe_folder / "tokenizer.json", data, tmp_path / "out", "--task_name", "sst-2", "--config_file",
                  str(tmp_path / "config.json"), "--do_train", "--max_seq_length", "32", check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert result.returncode == 2 and len(errors) == 1 and fragment in errors[0], result.stderr[-2000:]
    assert str(bpe_folder / "tokenizer.json") in errors[0]
    assert ("--allow_vocab_mismatch" in errors[0]) == passes
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_run_glue_fine_tunes_a_folder_with_its_tokenizer_json(bpe_folder, tmp_path):
    data = subset(TEST_DATA / "glue" / "SST-2", tmp_path / "SST-2", 48, 32)
    out = tmp_path / "out"
    result = glue(bpe_folder / "tokenizer.json", data, out, "--task_name", "sst-2", "--init_checkpoint",
                  str(bpe_folder), "--do_train", "--do_eval", "--max_seq_length", "64", "--train_batch_size", "16",
                  "--num_train_epochs", "1", "--eval_batch_size", "32")
    assert "--do_lower_case does not apply to a tokenizer.json" in result.stderr  # the scripts always pass it
    predictions = (out / "eval_predictions.tsv").read_text().splitlines()
    assert len(predictions) == 33


@pytest.mark.slow
def test_run_squad_and_inference_take_a_tokenizer_json(bpe_folder, tmp_path):
    dev = EXCERPT / "dev-v1.1.json"
    train = squad_subset(dev, tmp_path / "train.json", ["Jacksonville,_Florida"], 3)
    predict = squad_subset(dev, tmp_path / "predict.json", ["1973_oil_crisis"], 2)
    out = tmp_path / "out"
    squad(bpe_folder / "tokenizer.json", out, "--init_checkpoint", str(bpe_folder), "--train_file", str(train),
          "--predict_file", str(predict), "--do_train", "--do_predict", "--train_batch_size", "8", "--max_steps", "3")
    predictions = json.loads((out / "predictions.json").read_text())
    contexts = [p["context"] for a in json.loads(predict.read_text())["data"] for p in a["paragraphs"]]
    assert predictions and all(answer and any(answer in " ".join(c.split()) for c in contexts)
                               for answer in predictions.values())
    model = transformers.ModernBertForQuestionAnswering.from_pretrained(bpe_folder)
    model.save_pretrained(tmp_path / "qa")
    text = "The quick brown fox jumped over the lazy dog in the garden behind the house."
    result = run_command([sys.executable, str(REPO_ROOT / "inference.py"), "--init_checkpoint",
                             str(tmp_path / "qa"), "--vocab_file", str(bpe_folder / "tokenizer.json"), "--question",
                             "Where did the fox jump?", "--context", text, "--max_seq_length", "64"])
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)["answer"]
    assert answer and answer in text


def test_bpe_tokenizer_reads_text_as_transformers_does(bpe_folder):
    tokenizer = load_tokenizer(bpe_folder / "tokenizer.json", False)
    assert isinstance(tokenizer, BpeTokenizer)
    lines = ["Alice was beginning to get very tired.", "Ünïcödé and  two spaces", ""]
    ids, offsets = tokenizer.encode_lines(lines)
    theirs = their_tokenizer(bpe_folder)
    for i, line in enumerate(lines):
        assert ids[offsets[i]: offsets[i + 1]].tolist() == theirs(line, add_special_tokens=False)["input_ids"]
