"""Issue "your corpus", item 1: Parquet, JSON Lines (plain, .gz, .zst) and datasets' Arrow folders as
create_pretraining_data.py inputs. The same documents in the same order give the same shards (every array and
attribute) whichever format holds them, and the same as text laid out the way the Wikipedia path lays it out
(blingfire's sentences, one a line); the selection (--filter, length bounds, --dedup) against a plain-Python
reference; bad records in one line naming the file and the row, exit status 2, no output."""
import gzip
import json
import re
import sys
from pathlib import Path

import blingfire
import datasets
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer

from bertrecipe.dataprep import records
from bertrecipe.dataprep.vocab_training import train_bpe
from helpers import REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, run_command

BOOKS = sorted((TEST_DATA / "books").glob("*.txt"))
CREATE = REPO_ROOT / "data" / "create_pretraining_data.py"


def book_rows(count: int = 60) -> list[dict]:
    """Paragraphs of the book excerpts as records, with the metadata a web corpus carries beside its text."""
    paragraphs = [" ".join(p.split()) for book in BOOKS for p in book.read_text(encoding="utf-8").split("\n\n")
                  if len(p.split()) > 8]
    rows = [{"id": f"doc-{i}", "text": text, "score": round((i * 37 % 100) / 20, 2),
             "language": "en" if i % 4 else "fr"} for i, text in enumerate(paragraphs[:count])]
    assert len(rows) == count
    return rows


def write_formats(rows: list[dict], folder: Path) -> dict[str, Path]:
    """The rows in every record format: Parquet of several row groups, JSON Lines plain, gzip and zstd, an Arrow
    folder written by datasets (the oracle of that layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
    paths = {"parquet": folder / "docs.parquet", "jsonl": folder / "docs.jsonl", "gz": folder / "docs.jsonl.gz",
             "zst": folder / "docs.json.zst", "arrow": folder / "saved"}
    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"], row_group_size=17)
    paths["jsonl"].write_bytes(lines)
    paths["gz"].write_bytes(gzip.compress(lines))
    paths["zst"].write_bytes(zstandard.ZstdCompressor().compress(lines))
    datasets.Dataset.from_list(rows).save_to_disk(str(paths["arrow"]))
    return paths


def wikipedia_layout(texts: list[str], path: Path) -> Path:
    """Plain-Python reference of the Wikipedia path: one article a line, blingfire's sentences, a blank line."""
    blocks = []
    for text in texts:
        sentences = [s.strip() for s in blingfire.text_to_sentences(" ".join(text.split())).split("\n") if s.strip()]
        blocks.append("\n".join(sentences) + "\n\n")
    path.write_text("".join(blocks), encoding="utf-8")
    return path


def shard_contents(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {"arrays": {name: f[name][()] for name in f}, "attributes": dict(f.attrs)}


def assert_same_shard(a: dict, b: dict) -> None:
    assert sorted(a["arrays"]) == sorted(b["arrays"]) and a["attributes"].keys() == b["attributes"].keys()
    for name, array in a["arrays"].items():
        assert array.dtype == b["arrays"][name].dtype and np.array_equal(array, b["arrays"][name]), name
    for key, value in a["attributes"].items():
        assert np.array_equal(value, b["attributes"][key]), key


def create(input_file: Path | str, output: Path, *extra: str, vocab: Path = VOCAB_EXCERPT):
    return run_command([sys.executable, str(CREATE), "--input_file", str(input_file), "--output_file", str(output),
                        "--vocab_file", str(vocab), "--max_seq_length", "64", "--max_predictions_per_seq", "10",
                        "--dupe_factor", "2", *extra])


@pytest.mark.parametrize("kind", ["pairs", "chunks-bpe"])
def test_every_format_gives_the_shard_of_the_same_documents_as_text(tmp_path, kind):
    rows = book_rows()
    paths = write_formats(rows, tmp_path / "in")
    extra, vocab = [], VOCAB_EXCERPT
    if kind == "chunks-bpe":
        extra, vocab = ["--document_chunks"], train_bpe(BOOKS, tmp_path / "tokenizer.json", 600)
    text = wikipedia_layout([row["text"] for row in rows], tmp_path / "docs.txt")
    done = create(text, tmp_path / "text.hdf5", *extra, vocab=vocab)
    assert done.returncode == 0, done.stderr
    reference = shard_contents(tmp_path / "text.hdf5")
    assert len(reference["arrays"]["input_ids"]) > 100
    for name, path in paths.items():
        done = create(path, tmp_path / f"{name}.hdf5", *extra, vocab=vocab)
        assert done.returncode == 0, done.stderr
        assert f"{len(rows)} of {len(rows)} records kept as documents (none dropped)" in done.stdout
        assert_same_shard(shard_contents(tmp_path / f"{name}.hdf5"), reference)


def test_bpe_chunks_take_a_record_whole_where_its_sentences_meet_without_a_space(tmp_path):
    """Byte-level BPE tokenizes a document whole: a record is not cut into sentence lines that would be joined
    again by a space (blingfire cuts after a full stop of Japanese with no space there)."""
    text = "日本語の文です。次の文です。  Then  English. 3 words"
    assert len(blingfire.text_to_sentences(text).split("\n")) > 1
    pq.write_table(pa.Table.from_pylist([{"text": text}, {"text": "  "}, {"text": "a second one"}]),
                   tmp_path / "docs.parquet")
    tokenizer = train_bpe(BOOKS, tmp_path / "tokenizer.json", 600)
    done = create(tmp_path / "docs.parquet", tmp_path / "out.hdf5", "--document_chunks", "--max_seq_length", "512",
                  vocab=tokenizer)
    assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        rows = sorted((f["document_ids"][i], f["input_ids"][i][1:f["input_mask"][i].sum() - 1].tolist())
                      for i in range(len(f["input_ids"])))
    encode = Tokenizer.from_file(str(tokenizer)).encode
    assert [ids for _, ids in rows] == [encode(" ".join(text.split()), add_special_tokens=False).ids,
                                        encode("a second one", add_special_tokens=False).ids]


def test_a_folder_a_glob_and_a_list_read_their_files_in_name_order(tmp_path):
    rows = book_rows(60)
    folder = tmp_path / "parts"
    folder.mkdir()
    for i, part in enumerate((rows[:25], rows[25:40], rows[40:])):
        kind = ("parquet", "jsonl", "jsonl.gz")[i]
        write = {"parquet": lambda p, r: pq.write_table(pa.Table.from_pylist(r), p),
                 "jsonl": lambda p, r: p.write_text("".join(json.dumps(x) + "\n" for x in r), encoding="utf-8"),
                 "jsonl.gz": lambda p, r: p.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in r)
                                                                      .encode("utf-8")))}[kind]
        write(folder / f"part-{i}.{kind}", part)
    (folder / "_SUCCESS").write_text("")  # what Spark leaves beside its files: not an input
    assert create(wikipedia_layout([r["text"] for r in rows], tmp_path / "all.txt"), tmp_path / "text.hdf5"
                  ).returncode == 0
    reference = shard_contents(tmp_path / "text.hdf5")
    listed = ",".join(str(folder / f"part-{i}.{k}") for i, k in enumerate(("parquet", "jsonl", "jsonl.gz")))
    for spec, name in ((folder, "folder"), (str(folder / "part-*"), "glob"), (listed, "list")):
        done = create(spec, tmp_path / f"{name}.hdf5")
        assert done.returncode == 0, done.stderr
        assert_same_shard(shard_contents(tmp_path / f"{name}.hdf5"), reference)


def reference_selection(rows: list[dict], min_score: float, language: str, min_chars: int, max_chars: int
                        ) -> tuple[list[str], dict]:
    kept, seen, counts = [], set(), {"filtered": 0, "too_short": 0, "too_long": 0, "duplicates": 0}
    for row in rows:
        if not (row["score"] >= min_score and row["language"] == language):
            counts["filtered"] += 1
        elif len(row["text"]) < min_chars:
            counts["too_short"] += 1
        elif len(row["text"]) > max_chars:
            counts["too_long"] += 1
        elif " ".join(row["text"].split()) in seen:
            counts["duplicates"] += 1
        else:
            seen.add(" ".join(row["text"].split()))
            kept.append(row["text"])
    return kept, counts


def test_filters_length_bounds_and_dedup_keep_what_a_plain_reading_keeps(tmp_path):
    rows = book_rows()
    rows += [{**rows[5], "id": "copy", "text": "  " + rows[5]["text"].replace(" ", "\n ", 3) + " "},
             {**rows[9], "id": "copy-2"}]  # exact duplicates up to whitespace
    paths = write_formats(rows, tmp_path / "in")
    kept, counts = reference_selection(rows, 1.5, "en", 80, 900)
    assert all(counts.values()) and len(kept) > 10
    selection = records.Selection("text", (records.parse_filter("score>=1.5"), records.parse_filter("language==en")),
                                  80, 900, dedup=True)
    for path in paths.values():
        found = records.Counts()
        assert list(records.documents(path, selection, found)) == kept
        assert {key: found.as_dict()[key] for key in counts} == counts
        assert found.records == len(rows) and found.kept == len(kept)
    flags = ["--filter", "score>=1.5", "--filter", "language==en", "--min_chars", "80", "--max_chars", "900", "--dedup"]
    assert create(paths["zst"], tmp_path / "selected.hdf5", *flags).returncode == 0
    assert create(wikipedia_layout(kept, tmp_path / "kept.txt"), tmp_path / "kept.hdf5").returncode == 0
    assert_same_shard(shard_contents(tmp_path / "selected.hdf5"), shard_contents(tmp_path / "kept.hdf5"))


def test_filters_parse_numbers_as_numbers_and_refuse_what_is_no_comparison():
    assert records.parse_filter("score >= 3.5") == records.RowFilter("score", ">=", 3.5)
    assert records.parse_filter("language==en") == records.RowFilter("language", "==", "en")
    assert records.parse_filter("source!='web'") == records.RowFilter("source", "!=", "web")
    assert not records.parse_filter("score>2").keeps(None) and not records.parse_filter("score>2").keeps("9")
    assert records.parse_filter("score>2").keeps(3) and not records.parse_filter("score>2").keeps(float("nan"))
    for bad in ("score", "score=>3", ">=3", "score>="):
        with pytest.raises(records.DataError, match=r"^--filter: .* is not COLUMN OP VALUE"):
            records.parse_filter(bad)


def test_a_parquet_file_is_read_a_batch_at_a_time(tmp_path):
    """Memory holds a batch of rows, not the file: pyarrow's own allocations stay far below the file's text."""
    text = "A sentence of the corpus that is long enough to count. " * 20  # ~1.1 KB a row
    table = pa.table({"text": [f"{i} {text}" for i in range(20_000)], "blob": [b"x" * 512] * 20_000})
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=2_000)
    del table
    base, peak = pa.total_allocated_bytes(), 0
    for i, _ in enumerate(records.documents(tmp_path / "big.parquet", records.Selection())):
        if i % 500 == 0:
            peak = max(peak, pa.total_allocated_bytes() - base)
    assert i == 19_999 and 0 < peak < 8_000_000  # the text alone is 22 MB, the skipped column 10 MB


def bad_inputs(folder: Path) -> dict[str, tuple[Path, list[str], str]]:
    rows = book_rows(30)
    paths = write_formats(rows, folder)
    lines = paths["jsonl"].read_text(encoding="utf-8").splitlines(keepends=True)
    cases = {}
    cases["missing column"] = (paths["parquet"], ["--text_field", "body"],
                               r"docs\.parquet: no column 'body' \(columns: id, text, score, language\); check "
                               r"--text_field$")
    cases["non-string column"] = (paths["arrow"], ["--text_field", "score"], r"holds double, not strings")
    numbers = folder / "number.jsonl"
    numbers.write_text("".join(lines[:6]) + json.dumps({"text": 42}) + "\n", encoding="utf-8")
    cases["non-string value"] = (numbers, [], r"number\.jsonl: line 7: 'text' is a int, not a string")
    broken = folder / "broken.jsonl"
    broken.write_text("".join(lines[:11]) + '{"text": "cut\n' + "".join(lines[11:]), encoding="utf-8")
    cases["invalid JSON"] = (broken, [], r"broken\.jsonl: line 12: invalid JSON \(")
    cut = folder / "cut.parquet"
    cut.write_bytes(paths["parquet"].read_bytes()[:-200])
    cases["truncated Parquet"] = (cut, [], r"cut\.parquet: not a readable Parquet file \(.*\); is it whole\?$")
    cut_zst = folder / "cut.jsonl.zst"
    cut_zst.write_bytes(paths["zst"].read_bytes()[:-100])
    cases["truncated zstd"] = (cut_zst, [], r"cut\.jsonl\.zst: compressed stream cut or damaged after line \d+")
    cases["empty after filtering"] = (paths["gz"], ["--filter", "score>100"],
                                      r"docs\.jsonl\.gz: no document left of 30 records \(30 filtered out\)")
    cases["filter column missing"] = (paths["jsonl"], ["--filter", "quality>=2"],
                                      r"docs\.jsonl: line 1: no field 'quality' \(fields: id, text, score, "
                                      r"language\); check --filter$")
    latin = folder / "latin.jsonl"
    latin.write_bytes(lines[0].encode("utf-8") + '{"text": "caf\xe9"}\n'.encode("latin-1"))
    cases["not UTF-8"] = (latin, [], r"latin\.jsonl: line 2: not UTF-8")
    array = folder / "array.json"
    array.write_text(json.dumps(rows[:3]), encoding="utf-8")
    cases["a JSON array"] = (array, [], r"array\.json: line 1: a JSON array, not an object with 'text' \(JSON Lines "
                                        r"holds one object a line\)$")
    pretty = folder / "pretty.json"
    pretty.write_text(json.dumps(rows[:3], indent=2), encoding="utf-8")
    cases["an indented JSON array"] = (pretty, [], r"pretty\.json: line 1: invalid JSON .*\(the file is one JSON "
                                                   r"array, not JSON Lines\)$")
    text = folder / "plain.txt"
    text.write_text("One sentence.\nAnother.\n", encoding="utf-8")
    cases["selection on text"] = (text, ["--filter", "score>1"], r"^error: --filter: applies to Parquet")
    return cases


def test_bad_records_are_one_line_naming_the_file_and_row_with_nothing_written(tmp_path):
    for name, (path, extra, message) in bad_inputs(tmp_path / "in").items():
        output = tmp_path / "out" / "shard.hdf5"
        done = create(path, output, *extra)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (name, done.stderr)
        assert lines[0].startswith("error: ") and re.search(message, lines[0]), (name, lines[0])
        assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == [], name
