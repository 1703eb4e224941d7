"""Issue "your corpus", items 2 and 4: bertPrep.py --dataset custom from named sources of Parquet and JSON Lines
files, mixed by epochs. Formatting by file and row group keeps what a plain reading keeps (exact duplicates
dropped across tasks), in any process count; sharding repeats a source's training articles by its epochs and never
puts a test article among them; the manifest's counts and checksums are the shards' own; a stopped run redoes
only the shards it did not finish; bad sources are one line."""
import gzip
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertrecipe.dataprep import corpus_sources, layout
from bertrecipe.dataprep.records import Selection
from helpers import REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, run_command

BERT_PREP = REPO_ROOT / "data" / "bertPrep.py"
SHARDS = ["--n_training_shards", "2", "--n_test_shards", "1", "--fraction_test_set", "0.2"]


def paragraphs() -> list[str]:
    return [" ".join(p.split()) for book in sorted((TEST_DATA / "books").glob("*.txt"))
            for p in book.read_text(encoding="utf-8").split("\n\n") if len(p.split()) > 8]


@pytest.fixture
def sources(tmp_path) -> dict:
    """web: one Parquet file of row groups of 6 rows, holding 5 repeats of earlier paragraphs (one with other
    spacing) across row groups; wiki: gzipped JSON Lines of other paragraphs."""
    texts = paragraphs()
    web = [{"text": t, "score": i % 4} for i, t in enumerate(texts[:36])]
    web += [{"text": "  " + web[3]["text"].replace(" ", "\n", 2), "score": 3}] + [dict(web[i]) for i in (5, 9, 22, 30)]
    wiki = [{"text": t, "score": 2} for t in texts[36:60]]
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(web), folder / "web.parquet", row_group_size=6)
    (folder / "wiki.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in wiki).encode("utf-8")))
    return {"web": web, "wiki": wiki, "folder": folder}


def prep(root: Path, *flags: str):
    return run_command([sys.executable, str(BERT_PREP), *flags], env={"BERT_PREP_WORKING_DIR": str(root)})


def kept_reference(rows: list[dict], min_score: int) -> list[str]:
    """A plain reading: rows at or above the score, whitespace runs as one space, first copy of each text."""
    kept, seen = [], set()
    for row in rows:
        line = " ".join(row["text"].split())
        if row["score"] >= min_score and line not in seen:
            seen.add(line)
            kept.append(line)
    return kept


def formatted_articles(root: Path, name: str) -> list[str]:
    text = layout.formatted_text(root, f"custom_{name}").read_text(encoding="utf-8")
    return [line for line in text.split("\n") if line]


def format_flags(sources: dict) -> list[str]:
    folder = sources["folder"]
    return ["--action", "text_formatting", "--dataset", "custom", "--source", f"web={folder / 'web.parquet'}",
            "--source", f"wiki:3={folder / 'wiki.jsonl.gz'}", "--filter", "score>=1", "--dedup"]


def test_formatting_by_row_group_keeps_what_a_plain_reading_keeps_in_any_process_count(tmp_path, sources,
                                                                                      monkeypatch):
    monkeypatch.setattr(corpus_sources, "TASK_BYTES", 1500)  # a task or two per row group: many tasks for one file
    web = corpus_sources.Source("web", str(sources["folder"] / "web.parquet"))
    assert len(corpus_sources.plan_source(web, Selection()).tasks) > 4
    outputs = {}
    for processes in ("1", "2"):
        root = tmp_path / f"work{processes}"
        done = prep(root, *format_flags(sources), "--n_processes", processes)
        assert done.returncode == 0, done.stderr
        outputs[processes] = {name: formatted_articles(root, name) for name in ("web", "wiki")}
        recorded = json.loads(corpus_sources.sources_file(root).read_text())
        web_counts = recorded["sources"][0]["counts"]
        assert web_counts["records"] == 41 and web_counts["duplicates"] == 5 and web_counts["filtered"] == 9
        assert all(source["selection"] == {"text_field": "text", "filters": ["score>=1.0"], "min_chars": 0,
                                           "max_chars": None, "dedup": True} for source in recorded["sources"])
    assert outputs["1"] == outputs["2"]
    assert outputs["1"]["web"] == kept_reference(sources["web"], 1)
    assert outputs["1"]["wiki"] == kept_reference(sources["wiki"], 1)


def text_shard_articles(root: Path, split: str) -> Counter:
    folder = layout.sharded_dir(root, 2, 1, 0.2) / "custom"
    return Counter(" ".join(block.split()) for path in sorted(folder.glob(f"custom_{split}_*.txt"))
                   for block in path.read_text(encoding="utf-8").split("\n\n") if block.strip())


def reference_source_tokens(root: Path, split: str, scratch: Path) -> list[int]:
    """Tokens of each source's (web, wiki) articles in the split's text shards, by transformers' BERT tokenizer:
    an article's source is the formatted text that holds it."""
    import transformers

    (scratch / "vocab").mkdir(exist_ok=True)
    (scratch / "vocab" / "vocab.txt").write_bytes(VOCAB_EXCERPT.read_bytes())
    tokenizer = transformers.BertTokenizerFast.from_pretrained(scratch / "vocab", do_lower_case=True)
    web = set(formatted_articles(root, "web"))
    tokens = [0, 0]
    for article, copies in text_shard_articles(root, split).items():
        tokens[article not in web] += copies * len(tokenizer(article, add_special_tokens=False)["input_ids"])
    return tokens


def test_the_mixture_repeats_training_articles_by_epochs_and_the_manifest_counts_the_shards(tmp_path, sources):
    root = tmp_path / "work"
    assert prep(root, *format_flags(sources), "--n_processes", "1").returncode == 0
    done = prep(root, "--action", "sharding", "--dataset", "custom", *SHARDS)
    assert done.returncode == 0, done.stderr
    mixture = json.loads(corpus_sources.mixture_file(layout.sharded_dir(root, 2, 1, 0.2) / "custom").read_text())
    web, wiki = (source["articles"] for source in mixture["sources"])
    assert wiki["training_copies"] == 3 * wiki["training"] and web["training_copies"] == web["training"]
    assert web["training"] + web["test"] == len(formatted_articles(root, "web"))
    training, test = text_shard_articles(root, "training"), text_shard_articles(root, "test")
    assert sum(test.values()) == web["test"] + wiki["test"] and set(test.values()) == {1}
    assert not set(training) & set(test)  # no test article is trained on, however often its source repeats
    assert sum(training.values()) == web["training_copies"] + wiki["training_copies"]

    flags = ["--action", "create_hdf5_files", "--dataset", "custom", *SHARDS, "--vocab_file", str(VOCAB_EXCERPT),
             "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--dupe_factor", "1", "--n_processes", "1"]
    done = prep(root, *flags)
    assert done.returncode == 0, done.stderr
    params = layout.InstanceParams(True, 64, 10, 0.15, 12345, 1)
    manifest = json.loads((layout.hdf5_dir(root, params) / "custom" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["sources"]] == ["web", "wiki"] and manifest["sources"][1]["epochs"] == 3.0
    for split in ("training", "test"):  # each source's tokens: its articles' in the split's shards, copies counted
        assert [s["articles"][f"{split}_tokens"] for s in manifest["sources"]] == \
            reference_source_tokens(root, split, tmp_path)
    for split in ("training", "test"):  # the bytes counted per source are the text shards' bytes
        shard_bytes = sum(path.stat().st_size for path in
                          (layout.sharded_dir(root, 2, 1, 0.2) / "custom").glob(f"custom_{split}_*.txt"))
        assert sum(s["articles"][f"{split}_bytes"] for s in manifest["sources"]) == shard_bytes
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(VOCAB_EXCERPT.read_bytes()).hexdigest()
    for split, rows in manifest["shards"].items():
        for row in rows:
            path = layout.hdf5_split_dir(root, params, "custom", split) / row["file"]
            with h5py.File(path, "r") as shard:
                assert row["rows"] == len(shard["input_ids"]) and row["tokens"] == int(np.sum(shard["input_mask"]))
            assert row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert manifest["totals"][split]["rows"] == sum(r["rows"] for r in rows)

    made_whole = tmp_path / "whole.hdf5"  # the same text shard tokenized whole, without the sources' runs
    text_shard = layout.text_shard(root, 2, 1, 0.2, "custom", "training", 1)
    assert run_command([sys.executable, str(REPO_ROOT / "data" / "create_pretraining_data.py"), "--input_file",
                        str(text_shard), "--output_file", str(made_whole), "--vocab_file", str(VOCAB_EXCERPT),
                        "--do_lower_case", "--max_seq_length", "64", "--max_predictions_per_seq", "10",
                        "--dupe_factor", "1", "--random_seed", "12345"]).returncode == 0
    with h5py.File(made_whole, "r") as whole, \
            h5py.File(layout.hdf5_shard(root, params, "custom", "training", 1), "r") as by_source:
        assert sorted(whole) == sorted(by_source) and all(np.array_equal(whole[k], by_source[k]) for k in whole)
        assert json.loads(by_source.attrs["source_bytes"]) == [
            [name, size] for name, size in mixture["text_shards"][text_shard.name]]

    assert manifest["shards"]["training"][1]["text_sha256"] == hashlib.sha256(text_shard.read_bytes()).hexdigest()
    stopped = layout.hdf5_shard(root, params, "custom", "training", 1)
    before = stopped.read_bytes()
    stopped.unlink()  # as a run killed before this shard was renamed into place leaves it
    again = prep(root, *flags)
    assert again.returncode == 0 and "2 of 3 shards already complete" in again.stdout, again.stdout + again.stderr
    assert stopped.read_bytes() == before


def test_fractional_epochs_draw_the_same_articles_for_the_same_seed(tmp_path, sources):
    given = []
    for attempt in ("a", "b"):
        root = tmp_path / attempt
        flags = ["--action", "text_formatting", "--dataset", "custom", "--source",
                 f"web:0.5={sources['folder'] / 'web.parquet'}", "--n_processes", "1"]
        assert prep(root, *flags).returncode == 0
        assert prep(root, "--action", "sharding", "--dataset", "custom", *SHARDS).returncode == 0
        given.append(text_shard_articles(root, "training"))
        counts = json.loads(corpus_sources.mixture_file(layout.sharded_dir(root, 2, 1, 0.2) / "custom")
                            .read_text())["sources"][0]["articles"]
        assert 0.25 * counts["training"] < counts["training_copies"] < 0.75 * counts["training"]
    assert given[0] == given[1] and set(given[0].values()) == {1}


def test_bad_sources_are_one_line_before_anything_is_written(tmp_path, sources):
    text = tmp_path / "plain.txt"
    text.write_text("A sentence.\n", encoding="utf-8")
    cases = {
        "no source": (["--dataset", "custom"], "error: --source: --dataset custom needs at least one --source"),
        "bad syntax": (["--dataset", "custom", "--source", "web:x=/data"], "error: --source: 'web:x=/data' is not "
                                                                            "NAME[:EPOCHS]=FILES"),
        "zero epochs": (["--dataset", "custom", "--source", f"web:0={text}"], "with EPOCHS > 0"),
        "text source": (["--dataset", "custom", "--source", f"web={text}"],
                        "plain.txt: --source web: text, not Parquet"),
        "same names": (["--dataset", "custom", "--source", f"a={sources['folder'] / 'web.parquet'}", "--source",
                        f"a={sources['folder'] / 'wiki.jsonl.gz'}"], "error: --source: names must differ: a, a"),
        "source of another dataset": (["--dataset", "wikicorpus_en", "--source", f"a={text}"],
                                      "error: --source: names the files of --dataset custom, not of wikicorpus_en"),
    }
    for name, (flags, message) in cases.items():
        root = tmp_path / name.replace(" ", "_")
        done = prep(root, "--action", "text_formatting", *flags)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], (name, done.stderr)
        assert not root.exists(), name
    root = tmp_path / "unformatted"
    done = prep(root, "--action", "sharding", "--dataset", "custom")
    assert done.returncode == 2 and "custom_sources.json: not found: run --action text_formatting --dataset custom" \
        in done.stderr, done.stderr


def test_formatting_again_reuses_a_source_only_while_its_files_and_selection_are_the_same(tmp_path, sources):
    root = tmp_path / "work"
    flags = format_flags(sources) + ["--n_processes", "1"]
    assert prep(root, *flags).returncode == 0
    web = layout.formatted_text(root, "custom_web")
    first = web.read_bytes()
    again = prep(root, *flags)
    assert again.returncode == 0 and again.stdout.count("reused") == 2, again.stdout
    wiki = sources["folder"] / "wiki.jsonl.gz"
    wiki.write_bytes(wiki.read_bytes())  # the same bytes, a new modification time: formatted again
    touched = prep(root, *flags)
    reused = [line for line in touched.stdout.splitlines() if "reused" in line]
    assert touched.returncode == 0 and len(reused) == 1 and reused[0].startswith("web: "), touched.stdout
    changed = prep(root, *[f if f != "score>=1" else "score>=2" for f in flags])  # another selection
    assert changed.returncode == 0 and "reused" not in changed.stdout and web.read_bytes() != first


def test_the_seen_hashes_answer_as_a_set_across_parts_and_merges(monkeypatch):
    """The join's record of kept documents (8 bytes each) against a Python set, over parts with repeats inside
    and across them, empty parts, and merges of its sorted runs."""
    import random

    monkeypatch.setattr(corpus_sources.SeenHashes, "MAX_RUNS", 3)
    rng, seen, reference = random.Random(0), corpus_sources.SeenHashes(), set()
    for _ in range(60):
        hashes = [rng.randrange(400) for _ in range(rng.randrange(0, 30))]
        expected = []
        for value in hashes:
            expected.append(value not in reference)
            reference.add(value)
        assert seen.first_copies(np.array(hashes, dtype=np.uint64)).tolist() == expected
    assert len(seen.runs) <= 4 and sum(len(run) for run in seen.runs) == len(reference)


@pytest.mark.slow
def test_shards_of_an_earlier_text_are_made_again_not_skipped(tmp_path, sources):
    """Formatting and sharding again with another selection changes the text shards: create_hdf5_files sees it in
    the shards' text_sha256 and makes them again instead of keeping the earlier corpus's as complete."""
    root = tmp_path / "work"
    hdf5 = ["--action", "create_hdf5_files", "--dataset", "custom", *SHARDS, "--vocab_file", str(VOCAB_EXCERPT),
            "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--dupe_factor", "1", "--n_processes", "1"]
    for min_score, skipped in (("1", "0 of 3"), ("1", "3 of 3"), ("2", "0 of 3")):
        flags = [f if f != "score>=1" else f"score>={min_score}" for f in format_flags(sources)]
        assert prep(root, *flags, "--n_processes", "1").returncode == 0
        assert prep(root, "--action", "sharding", "--dataset", "custom", *SHARDS).returncode == 0
        done = prep(root, *hdf5)
        assert done.returncode == 0 and f"{skipped} shards already complete" in done.stdout, done.stdout


def test_a_source_with_its_own_column_and_filters_joins_the_mixture_in_a_call_of_its_own(tmp_path, sources):
    """Sources whose text sits in another column, or that need other filters, are formatted by calls of their
    own; the mixture keeps every call's sources (each with its selection) until --drop_source leaves one out."""
    root = tmp_path / "work"
    books = [{"content": row["text"], "year": 1865 + i} for i, row in enumerate(sources["web"][:12])]
    pq.write_table(pa.Table.from_pylist(books), sources["folder"] / "books.parquet")
    assert prep(root, *format_flags(sources), "--n_processes", "1").returncode == 0
    done = prep(root, "--action", "text_formatting", "--dataset", "custom", "--source",
                f"books:2={sources['folder'] / 'books.parquet'}", "--text_field", "content", "--filter", "year<1870")
    assert done.returncode == 0, done.stderr
    assert "web: from an earlier call" in done.stdout and "the mixture: web x1, wiki x3, books x2" in done.stdout
    recorded = json.loads(corpus_sources.sources_file(root).read_text())["sources"]
    assert [s["name"] for s in recorded] == ["web", "wiki", "books"]
    assert recorded[2]["selection"]["text_field"] == "content" and recorded[2]["counts"]["kept"] == 5
    assert recorded[0]["selection"]["filters"] == ["score>=1.0"] and "this_call" not in recorded[0]
    assert formatted_articles(root, "books") == [" ".join(b["content"].split()) for b in books[:5]]
    assert prep(root, "--action", "sharding", "--dataset", "custom", *SHARDS).returncode == 0

    dropped = prep(root, "--action", "text_formatting", "--dataset", "custom", "--drop_source", "wiki")
    assert dropped.returncode == 0 and "the mixture: web x1, books x2" in dropped.stdout, dropped.stdout
    unknown = prep(root, "--action", "text_formatting", "--dataset", "custom", "--drop_source", "news")
    assert unknown.returncode == 2 and "--drop_source: news: no such source" in unknown.stderr


@pytest.mark.slow
def test_a_formatting_killed_midway_resumes_to_the_bytes_of_an_uninterrupted_one(tmp_path, sources):
    """SIGKILL once the first source is formatted and the second is under way; started again, the first is reused,
    the second formatted anew, and every file equals an uninterrupted run's (no temporary left)."""
    import os
    import signal
    import subprocess
    import time

    big = [{"text": f"{i}: {row['text']}", "score": 2} for i in range(400) for row in sources["web"][:30]]
    pq.write_table(pa.Table.from_pylist(big), sources["folder"] / "big.parquet", row_group_size=500)
    folder = sources["folder"]
    flags = ["--action", "text_formatting", "--dataset", "custom", "--source", f"web={folder / 'web.parquet'}",
             "--source", f"big={folder / 'big.parquet'}", "--dedup", "--n_processes", "1"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert prep(whole, *flags).returncode == 0
    env = {**os.environ, "BERT_PREP_WORKING_DIR": str(killed)}
    process = subprocess.Popen([sys.executable, str(BERT_PREP), *flags], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    first_done = layout.formatted_text(killed, "custom_web").with_name("custom_web_one_article_per_line.txt.done.json")
    while not first_done.exists() and process.poll() is None:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not layout.formatted_text(killed, "custom_big").exists()  # killed while the second was under way
    again = prep(killed, *flags)
    assert again.returncode == 0 and again.stdout.count("reused") == 1, again.stdout

    def files(root):  # every file's bytes, this folder's name in them replaced (the sources file names its files)
        return {str(p.relative_to(root)): p.read_bytes().replace(str(root).encode(), b"ROOT")
                for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(killed) == files(whole)
