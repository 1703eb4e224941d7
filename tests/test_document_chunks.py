"""Document-chunk shards for masked-LM-only training (create_pretraining_data.py --document_chunks): written from
tests/data's books with the WordPiece excerpt and with a byte-level BPE tokenizer trained here, compared with a
plain-Python reference; read back as static-shaped rows; trained on by run_pretraining.py with dynamic masking,
resumed exactly; malformed shards and wrong flags refused in one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from bertrecipe.cli import bert_prep as bertPrep
from bertrecipe.common.errors import DataError, InputError
from bertrecipe.dataprep import layout
from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard
from bertrecipe.dataprep.sharding import split_sentences
from bertrecipe.dataprep.text_formatting import book_text
from bertrecipe.dataprep.vocab_training import train_bpe
from bertrecipe.pretraining import masking
from bertrecipe.pretraining.data import PretrainingData, StepShape, make_batch, read_rows
from bertrecipe.pretraining.shard_schema import (
    DOCUMENT_CHUNKS,
    SHARD_KEYS,
    SpecialTokenIds,
    check_run_kinds,
    inspect_shard,
)
from bertrecipe.tokenization.bpe import load_bpe
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from bertrecipe.training.metric_logger import read_log
from helpers import REPO_ROOT, TEST_DATA, TINY, VOCAB_EXCERPT, run_command, write_formatted

BOOKS = [TEST_DATA / "books" / "pg11.txt", TEST_DATA / "books" / "pg1661.txt"]
SEQ = 64
MLM_ONLY = ["--dynamic_masking", "--no_nsp", "--masked_lm_prob", "0.3", "--max_predictions_per_seq", "19"]


# ---------------------------------------------------------------- a plain-Python reference
def reference_documents(texts: list[str], encode_line) -> list[list[int]]:
    """Google's reader, line by line: a line that strips to nothing ends a document, lines without tokens are
    dropped, empty documents too, every file ends one; a document's tokens are its lines' tokens in order."""
    documents = []
    for text in texts:
        current: list[int] = []
        for line in text.split("\n"):
            if not line.strip():
                if current:
                    documents.append(current)
                current = []
                continue
            current.extend(encode_line(line))
        if current:
            documents.append(current)
    return documents


def reference_document_texts(texts: list[str]) -> list[str]:
    """For BPE a document is its stripped lines joined by one space (tokenized whole)."""
    documents = []
    for text in texts:
        for block in "\n".join(line.strip() for line in text.split("\n")).split("\n\n"):
            lines = [line for line in block.split("\n") if line]
            if lines:
                documents.append(" ".join(lines))
    return documents


def reference_rows(tokens: list[int], cls: int, sep: int, pad: int) -> list[list[int]]:
    """[CLS] + the next SEQ - 2 tokens + [SEP], padded with [PAD]."""
    rows = []
    for start in range(0, len(tokens), SEQ - 2):
        row = [cls] + tokens[start:start + SEQ - 2] + [sep]
        rows.append(row + [pad] * (SEQ - len(row)))
    return rows


def read_shard(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {**{key: f[key][()] for key in f}, "attrs": dict(f.attrs)}


def assert_chunks_match(shard: dict, documents: list[list[int]], cls: int, sep: int, pad: int) -> None:
    """Every document's rows, in the shard's order, are the reference's; nothing else is in the shard."""
    ids, mask, document_ids = shard["input_ids"], shard["input_mask"], shard["document_ids"]
    assert sorted(set(document_ids.tolist())) == list(range(len(documents)))
    for d, tokens in enumerate(documents):
        rows = np.flatnonzero(document_ids == d)
        assert ids[rows].tolist() == reference_rows(tokens, cls, sep, pad), d
        lengths = [min(SEQ - 2, len(tokens) - start) + 2 for start in range(0, len(tokens), SEQ - 2)]
        assert mask[rows].sum(axis=1).tolist() == lengths
    assert mask.dtype == np.int8 and ids.dtype == np.int32 and np.all(np.diff(mask, axis=1) <= 0)
    assert np.any(np.diff(document_ids) < 0), "the rows are in document order: not shuffled"


def text_of(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # line ends as they are (CRLF), as the writer reads them


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer.json trained on the two book excerpts (1,000 tokens asked for)."""
    return train_bpe(BOOKS, tmp_path_factory.mktemp("bpe") / "tokenizer.json", 1000)


@pytest.fixture(scope="module")
def chunk_corpus(tmp_path_factory, bpe_file) -> Path:
    """Document-chunk training shards (one per book) and a held-out shard, with the WordPiece excerpt and with
    the BPE tokenizer, and the tiny configs for both vocabs."""
    root = tmp_path_factory.mktemp("chunks")
    for folder, vocab in (("wordpiece", VOCAB_EXCERPT), ("bpe", bpe_file)):
        (root / folder / "eval").mkdir(parents=True)
        for i, book in enumerate(BOOKS):
            create_shard(ShardConfig(book, root / folder / f"books_training_{i}.hdf5", vocab, max_seq_length=SEQ,
                                     document_chunks=True), progress=False)
        create_shard(ShardConfig(BOOKS[0], root / folder / "eval" / "books_test_0.hdf5", vocab, max_seq_length=SEQ,
                                 random_seed=7, document_chunks=True), progress=False)
    (root / "bert_config.json").write_text(json.dumps(TINY))
    (root / "bpe_config.json").write_text(json.dumps({**TINY, "vocab_size": load_bpe(bpe_file).size}))
    return root


# ---------------------------------------------------------------- the writer
def test_wordpiece_chunks_hold_each_documents_tokens_in_order(chunk_corpus):
    vocab = load_vocab(VOCAB_EXCERPT)
    tokenizer = BertTokenizer(vocab, do_lower_case=True)
    cls, sep, pad = vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.id("[PAD]")
    for i, book in enumerate(BOOKS):
        shard = read_shard(chunk_corpus / "wordpiece" / f"books_training_{i}.hdf5")
        documents = reference_documents([text_of(book)], tokenizer.encode)
        assert len(documents) > 20 and max(map(len, documents)) > 3 * SEQ  # short and long documents
        assert_chunks_match(shard, documents, cls, sep, pad)
        attrs = shard["attrs"]
        assert attrs["shard_kind"] == DOCUMENT_CHUNKS and attrs["tokenizer"] == "wordpiece"
        assert (attrs["cls_id"], attrs["sep_id"], attrs["pad_id"], attrs["mask_id"]) == (cls, sep, pad,
                                                                                         vocab.id("[MASK]"))
        assert attrs["vocab_size"] == len(vocab) and attrs["vocab_sha256"] == vocab.sha256
        assert attrs["max_seq_length"] == SEQ and attrs["format_version"] == 1
        assert set(shard) - {"attrs"} == {"input_ids", "input_mask", "document_ids"}


def test_bpe_chunks_hold_each_documents_text_in_order(chunk_corpus, bpe_file):
    bpe = load_bpe(bpe_file)
    cls, sep, pad = bpe.id("[CLS]"), bpe.id("[SEP]"), bpe.id("[PAD]")
    for i, book in enumerate(BOOKS):
        shard = read_shard(chunk_corpus / "bpe" / f"books_training_{i}.hdf5")
        texts = reference_document_texts([text_of(book)])
        documents = [bpe.tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
        assert_chunks_match(shard, documents, cls, sep, pad)
        assert shard["attrs"]["tokenizer"] == "bpe" and shard["attrs"]["vocab_size"] == bpe.size
        # The rows of a document, [CLS]/[SEP]/[PAD] taken out, decode to its text: nothing lost, nothing added.
        for d, text in enumerate(texts):
            rows = shard["input_ids"][shard["document_ids"] == d]
            tokens = [t for row in rows.tolist() for t in row if t not in (cls, sep, pad)]
            assert bpe.tokenizer.decode(tokens) == text


def test_same_seed_same_shard_other_seed_other_order(tmp_path):
    shards = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        create_shard(ShardConfig(BOOKS[0], tmp_path / f"{name}.hdf5", VOCAB_EXCERPT, max_seq_length=SEQ,
                                 random_seed=seed, document_chunks=True), progress=False)
        shards.append(read_shard(tmp_path / f"{name}.hdf5"))
    a, b, c = shards
    assert all(np.array_equal(a[k], b[k]) for k in ("input_ids", "input_mask", "document_ids"))
    assert not np.array_equal(a["document_ids"], c["document_ids"])
    assert sorted(map(tuple, a["input_ids"].tolist())) == sorted(map(tuple, c["input_ids"].tolist()))


@pytest.mark.parametrize("flags, fragment", [
    (["--whole_word_masking"], "pass --whole_word_masking to run_pretraining.py"),
    (["--max_seq_length", "4"], "--max_seq_length"),
])
def test_bad_writer_flags_are_one_line(tmp_path, flags, fragment):
    from bertrecipe.cli import create_pretraining_data as command

    with pytest.raises(DataError, match=fragment):
        command.main(["--input_file", str(BOOKS[0]), "--output_file", str(tmp_path / "x.hdf5"), "--vocab_file",
                      str(VOCAB_EXCERPT), "--document_chunks", *flags])
    assert not list(tmp_path.iterdir())


def test_a_bpe_tokenizer_needs_document_chunks(tmp_path, bpe_file):
    with pytest.raises(DataError, match="add --document_chunks"):
        create_shard(ShardConfig(BOOKS[0], tmp_path / "x.hdf5", bpe_file))
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": 1}')
    with pytest.raises(DataError, match="not a tokenizers tokenizer.json"):
        create_shard(ShardConfig(BOOKS[0], tmp_path / "x.hdf5", broken, document_chunks=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json"]


# ---------------------------------------------------------------- the BPE vocab
def test_bpe_vocab_is_a_multiple_of_64_round_trips_text_and_is_reproducible(bpe_file, tmp_path):
    bpe = load_bpe(bpe_file)
    assert bpe.size == 1024 and bpe.size % 64 == 0
    assert [bpe.id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    vocab = bpe.tokenizer.get_vocab()
    assert max(vocab.values()) == bpe.size - 1 and "[unused0]" in vocab and len(vocab) == bpe.size
    for text in [text_of(BOOKS[1]), "naïve café — 東京 🙂\r\n\ttabs, [MASK] and  double  spaces\x00"]:
        ids = bpe.tokenizer.encode(text, add_special_tokens=False).ids
        assert bpe.tokenizer.decode(ids, skip_special_tokens=False) == text
        assert bpe.id("[MASK]") not in ids  # "[MASK]" in text is text (as WordPiece splits it)
    assert bpe.tokenizer.encode("Alice").tokens[0] == "[CLS]"  # BERT's template for users of the file
    again = train_bpe(BOOKS, tmp_path / "again.json", 1000)
    assert again.read_bytes() == bpe_file.read_bytes()  # the same file from the same text
    assert load_bpe(train_bpe(BOOKS, tmp_path / "exact.json", 640)).size == 640


def test_bpe_training_refuses_small_sizes_and_existing_files(bpe_file, tmp_path):
    with pytest.raises(DataError, match="--vocab_size"):
        train_bpe(BOOKS, tmp_path / "small.json", 200)
    with pytest.raises(DataError, match="already exists"):
        train_bpe(BOOKS, bpe_file, 1000)
    assert not (tmp_path / "small.json").exists()


@pytest.fixture()
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    sentences = [s for book in BOOKS for s in split_sentences(book_text(book))]
    articles = [" ".join(sentences[i:i + 12]) for i in range(0, len(sentences), 12)]
    write_formatted(articles, layout.formatted_text(tmp_path, "bookscorpus"))
    return tmp_path


def test_bert_prep_trains_bpe_and_writes_document_chunks_with_it(workdir, capsys):
    flags = ["--dataset", "bookscorpus", "--n_training_shards", "2", "--n_test_shards", "1", "--max_seq_length",
             str(SEQ)]
    bertPrep.main(["--action", "create_vocab", "--dataset", "bookscorpus", "--vocab_type", "bpe", "--vocab_size",
                   "700"])
    tokenizer = workdir / "vocab" / "bookscorpus_bpe_700.json"
    assert load_bpe(tokenizer).size == 704
    bertPrep.main(["--action", "sharding", *flags])
    chunks = ["--action", "create_hdf5_files", *flags, "--document_chunks", "--vocab_file", str(tokenizer),
              "--n_processes", "1"]
    bertPrep.main(chunks)
    folder = workdir / f"hdf5_document_chunks_bpe_seq_len_{SEQ}_random_seed_12345" / "bookscorpus"
    shards = sorted(folder.rglob("*.hdf5"))
    assert [p.relative_to(folder).as_posix() for p in shards] == [
        "test/bookscorpus_test_0.hdf5", "training/bookscorpus_training_0.hdf5",
        "training/bookscorpus_training_1.hdf5"]
    assert all(inspect_shard(p, 704, SEQ).kind == DOCUMENT_CHUNKS for p in shards)
    capsys.readouterr()
    bertPrep.main(chunks)
    assert "3 of 3 shards already complete" in capsys.readouterr().out
    with pytest.raises(DataError, match="must end in .json"):
        bertPrep.main(["--action", "create_vocab", "--dataset", "bookscorpus", "--vocab_type", "bpe", "--vocab_file",
                       str(workdir / "bpe.txt")])


# ---------------------------------------------------------------- the reader
def test_reader_gives_static_batch_keys_with_a_fixed_evaluation_mask(chunk_corpus):
    path = chunk_corpus / "wordpiece" / "books_training_0.hdf5"
    info = inspect_shard(path, TINY["vocab_size"], 128)
    vocab = load_vocab(VOCAB_EXCERPT)
    assert info.kind == DOCUMENT_CHUNKS and info.max_predictions == round(SEQ * 0.15)
    assert info.special == SpecialTokenIds(vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.id("[PAD]"),
                                           vocab.id("[MASK]"), len(vocab))
    stored = read_shard(path)
    with h5py.File(path, "r") as f:
        rows = read_rows(info, f, 0, info.num_samples, TINY["vocab_size"])
        halves = [read_rows(info, f, lo, hi, TINY["vocab_size"])
                  for lo, hi in ((0, 10), (10, info.num_samples))]
    assert set(rows) == set(SHARD_KEYS)
    assert not rows["segment_ids"].any() and not rows["next_sentence_labels"].any()
    assert rows["next_sentence_labels"].shape == (info.num_samples,)
    assert np.array_equal(rows["input_mask"], stored["input_mask"])
    original = masking.recover_original_tokens(rows["input_ids"], rows["masked_lm_positions"], rows["masked_lm_ids"])
    assert np.array_equal(original, stored["input_ids"])
    # Google's count at 15 %, never [CLS], [SEP] or padding; the same mask however the rows are read.
    valid, row_index, columns = masking.masked_positions(rows["masked_lm_positions"])
    lengths = stored["input_mask"].sum(axis=1)
    assert valid.sum(axis=1).tolist() == np.maximum(1, np.rint(lengths * 0.15)).astype(int).tolist()
    assert np.all((columns >= 1) & (columns < lengths[row_index] - 1))
    assert all(np.array_equal(np.concatenate([h[k] for h in halves]), rows[k]) for k in SHARD_KEYS)
    batch = make_batch(rows, np.arange(4))
    assert (batch["masked_lm_labels"] != masking.IGNORE_INDEX).sum() == valid[:4].sum()


def test_dynamic_masking_stream_masks_document_chunks_at_the_flag_rate(chunk_corpus):
    infos = [inspect_shard(chunk_corpus / "bpe" / f"books_training_{i}.hdf5", 1024, 128) for i in range(2)]
    special = infos[0].special
    spec = masking.spec_from_special_ids(special.cls, special.sep, special.pad, special.mask, special.vocab_size,
                                         0.3, 19)
    data = PretrainingData(infos, 42, StepShape(4, 2, 1, 0), 8, 1024, max_steps=3, masking_spec=spec)
    batches = list(data.batches(iter(data.reader())))
    assert len(batches) == 6
    for batch in batches:
        assert set(batch) == {"input_ids", "segment_ids", "input_mask", "masked_lm_labels", "next_sentence_labels"}
        lengths = batch["input_mask"].sum(1)
        predicted = (batch["masked_lm_labels"] != masking.IGNORE_INDEX).sum(1)
        assert predicted.tolist() == torch.clamp(torch.round(lengths * 0.3), 1, 19).long().tolist()
        assert not batch["segment_ids"].any() and not batch["next_sentence_labels"].any()


def write_chunk_shard(path: Path, drop: str = "", short: str = "", rows: int = 16, **attrs) -> None:
    """A small document-chunk shard written by hand: `drop` leaves a key out, `short` writes a key one row short,
    attrs override attributes (None: left out)."""
    ids = np.full((rows, SEQ), 0, np.int32)
    ids[:, 0], ids[:, 1:11], ids[:, 11] = 101, 2000, 102
    arrays = {"input_ids": ids, "input_mask": (ids != 0).astype(np.int8),
              "document_ids": np.arange(rows, dtype=np.int64)}
    wanted = {"shard_kind": DOCUMENT_CHUNKS, "vocab_size": 8960, "cls_id": 101, "sep_id": 102, "pad_id": 0,
              "mask_id": 103, **attrs}
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            if key != drop:
                f.create_dataset(key, data=value[:-1] if key == short else value)
        for key, value in wanted.items():
            if value is not None:
                f.attrs[key] = value


@pytest.mark.parametrize("case, fragments", [
    ("no_document_ids", ["document_ids", "document-chunk shard"]),
    ("short_document_ids", ["document_ids has shape"]),
    ("no_mask_id", ["mask_id", "--document_chunks"]),
    ("mask_is_cls", ["distinct"]),
    ("unknown_kind", ["shard_kind", "'pairs'"]),
])
def test_malformed_chunk_shards_are_one_line_naming_the_file(tmp_path, case, fragments):
    path = tmp_path / "books_training_0.hdf5"
    options = {"no_document_ids": {"drop": "document_ids"}, "short_document_ids": {"short": "document_ids"},
               "no_mask_id": {"mask_id": None}, "mask_is_cls": {"mask_id": 101},
               "unknown_kind": {"shard_kind": "pairs"}}[case]
    write_chunk_shard(path, **options)
    with pytest.raises(InputError) as error:
        inspect_shard(path, TINY["vocab_size"], 128)
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(path)) and all(f in message for f in fragments), message


def test_one_kind_per_run_and_no_next_sentence_task(chunk_corpus, tmp_path):
    chunks = inspect_shard(chunk_corpus / "wordpiece" / "books_training_0.hdf5", TINY["vocab_size"], 128)
    create_shard(ShardConfig(BOOKS[0], tmp_path / "pairs.hdf5", VOCAB_EXCERPT, max_seq_length=SEQ,
                             max_predictions_per_seq=10, dupe_factor=1), progress=False)
    pairs = inspect_shard(tmp_path / "pairs.hdf5", TINY["vocab_size"], 128)
    check_run_kinds([pairs], no_nsp=False)
    check_run_kinds([chunks], no_nsp=True)
    with pytest.raises(InputError, match="one kind of shard per run"):
        check_run_kinds([chunks, pairs], no_nsp=True)
    with pytest.raises(InputError, match="add --no_nsp"):
        check_run_kinds([chunks], no_nsp=False)
    bpe = inspect_shard(chunk_corpus / "bpe" / "books_training_0.hdf5", TINY["vocab_size"], 128)
    with pytest.raises(InputError, match="one tokenizer"):
        check_run_kinds([chunks, bpe], no_nsp=True)


# ---------------------------------------------------------------- run_pretraining on document chunks
def pretrain(input_dir: Path, config: Path, out: Path, *extra, check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO_ROOT / "run_pretraining.py"), "--input_dir", str(input_dir),
               "--config_file", str(config), "--output_dir", str(out), "--max_seq_length", str(SEQ),
               "--train_batch_size", "8", "--learning_rate", "2e-2", "--warmup_proportion", "0.1", "--do_train",
               "--disable_progress_bar", "--json-summary", str(out / "log.json"), *map(str, extra)]
    result = run_command(command)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def step_losses(log: Path) -> dict[int, float]:
    return {r["step"][1]: r["data"]["step_loss"] for r in read_log(log)
            if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"] and "step_loss" in r["data"]}


@pytest.mark.slow
def test_run_pretraining_trains_on_wordpiece_chunks_and_resumes_bit_for_bit(chunk_corpus, tmp_path):
    shards, config = chunk_corpus / "wordpiece", chunk_corpus / "bert_config.json"
    common = [*MLM_ONLY, "--max_steps", 6, "--num_steps_per_checkpoint", 3, "--log_freq", 1]
    straight, split = tmp_path / "straight", tmp_path / "split"
    pretrain(shards, config, straight, *common)
    pretrain(shards, config, split, *common, "--steps_this_run", 3)
    pretrain(shards, config, split, *common, "--resume_from_checkpoint")
    a, b = step_losses(straight / "log.json"), step_losses(split / "log.json")
    assert sorted(a) == sorted(b) == list(range(1, 7)) and all(np.isfinite(list(a.values())))
    assert all(a[step] == b[step] for step in range(4, 7))
    weights_a = torch.load(straight / "ckpt_6.pt", weights_only=True)["model"]
    weights_b = torch.load(split / "ckpt_6.pt", weights_only=True)["model"]
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.slow
def test_run_pretraining_trains_and_evaluates_on_bpe_chunks(chunk_corpus, tmp_path):
    pretrain(chunk_corpus / "bpe", chunk_corpus / "bpe_config.json", tmp_path, *MLM_ONLY, "--max_steps", 4,
             "--do_eval", "--eval_dir", chunk_corpus / "bpe" / "eval")
    final = next(r["data"] for r in read_log(tmp_path / "log.json") if r["type"] == "LOG" and r["step"] == [])
    assert np.isfinite(final["eval_loss"]) and final["eval_loss"] > 0 and 0 <= final["eval_mlm_accuracy"] <= 1
    assert (tmp_path / "ckpt_4.pt").exists()


@pytest.mark.parametrize("case, fragments", [
    ("static_masking", ["books_training_0.hdf5", "add --dynamic_masking"]),
    ("malformed", ["books_training_0.hdf5", "mask_id"]),
])
@pytest.mark.slow
def test_run_pretraining_refuses_in_one_line(chunk_corpus, tmp_path, case, fragments):
    data = tmp_path / "data"
    data.mkdir()
    flags = ["--no_nsp", "--max_steps", 2]
    if case == "static_masking":
        (data / "books_training_0.hdf5").symlink_to(chunk_corpus / "wordpiece" / "books_training_0.hdf5")
    else:
        write_chunk_shard(data / "books_training_0.hdf5", mask_id=None)
        flags += MLM_ONLY[:1]
    result = pretrain(data, chunk_corpus / "bert_config.json", tmp_path / "out", *flags, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert all(fragment in lines[0] for fragment in fragments), lines[0]
    assert not list((tmp_path / "out").glob("ckpt_*.pt"))
