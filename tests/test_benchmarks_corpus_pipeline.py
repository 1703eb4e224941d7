"""benchmarks/corpus_pipeline.py on a tiny corpus: its Parquet input is web-shaped, its group_texts is run_mlm's, and
both pipelines run, are measured and tokenize the same text alike. What the two make differs by their chunking
rules, exactly: ours cuts each document into rows of seq - 2 tokens between [CLS] and [SEP] (the last row of a
document shorter, padded); run_mlm's group_texts concatenates the documents of a map batch (1,000 records, within
each num_proc shard) with their [CLS] and [SEP] and drops what is left under one row of seq. Speed and memory goals
are the benchmark's to report, never asserted here."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.corpus_pipeline import benchmark, group_texts, peer_tokenizer, report, write_corpus

SEQ = 64  # short rows: many of them from a tiny corpus, and documents of several rows
MAP_BATCH = 1000  # datasets' default batch_size, which run_mlm keeps


def texts_of(folder: Path) -> list[str]:
    return [text for path in sorted(folder.glob("*.parquet"))
            for text in pq.read_table(path, columns=["text"]).column("text").to_pylist()]


def document_lengths(texts: list[str], tokenizer: Path) -> list[int]:
    """Each document's tokens without special tokens, by the peer's tokenizer."""
    return [len(ids) for ids in peer_tokenizer(tokenizer)(texts, add_special_tokens=False)["input_ids"]]


def our_rows(lengths: list[int], seq: int) -> int:
    return sum(-(-n // (seq - 2)) for n in lengths)


def run_mlm_rows(lengths: list[int], seq: int, processes: int) -> int:
    """group_texts' rows: datasets cuts the records into `processes` contiguous shards (the first len % processes
    one longer), each mapped in batches of MAP_BATCH; every batch keeps floor(its tokens with [CLS] [SEP] / seq)."""
    size, extra = divmod(len(lengths), processes)
    rows, start = 0, 0
    for shard in range(processes):
        end = start + size + (shard < extra)
        for lo in range(start, end, MAP_BATCH):
            rows += sum(n + 2 for n in lengths[lo:min(lo + MAP_BATCH, end)]) // seq
        start = end
    return rows


def test_the_corpus_is_parquet_of_a_web_corpus_shape_and_the_size_asked(tmp_path):
    paths = write_corpus(tmp_path, 0.3, 3)
    assert [p.name for p in paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    tables = [pq.read_table(p) for p in paths]
    assert all(t.column_names == ["text", "id", "url", "score"] for t in tables)
    texts = [text for t in tables for text in t.column("text").to_pylist()]
    sizes = [sum(len(x.encode()) for x in t.column("text").to_pylist()) for t in tables]
    longest = max(len(text.encode()) for text in texts)
    assert all(1e5 <= size < 1e5 + longest for size in sizes)  # each file's share, passed by under one document
    assert len(set(texts)) == len(texts)  # the counter makes every document differ
    assert all(" ".join(text.split()) == text for text in texts)  # single spaces: both pipelines see one string
    ids = [i for t in tables for i in t.column("id").to_pylist()]
    assert len(set(ids)) == len(ids)


def test_group_texts_concatenates_the_batch_and_drops_the_remainder():
    batch = {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "special_tokens_mask": [[1, 0, 1], [1, 1], [1, 0, 0, 1]]}
    assert group_texts(batch, seq=4) == {"input_ids": [[1, 2, 3, 4], [5, 6, 7, 8]],
                                         "special_tokens_mask": [[1, 0, 1, 1], [1, 1, 0, 0]]}
    assert group_texts({"input_ids": [[1, 2]]}, seq=4) == {"input_ids": []}


def test_the_row_counts_follow_each_rule():
    assert our_rows([62, 63, 1], 64) == 1 + 2 + 1
    assert run_mlm_rows([62, 63, 1], 64, 1) == (64 + 65 + 3) // 64
    assert run_mlm_rows([62, 63, 1], 64, 2) == (64 + 65) // 64 + 3 // 64  # shards [0, 1] and [2]


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus_pipeline")
    return root, benchmark(0.2, [1, 2], scale=2, seq=SEQ, kind="bpe", root=root, interval=0.05)


@pytest.mark.slow
def test_the_table_has_both_pipelines_at_each_process_count_with_positive_figures(bpe_run):
    _, result = bpe_run
    rows = result["rows"] + [result["scaled"]]
    assert [(r["pipeline"], r["processes"]) for r in rows] == [("ours", 1), ("peer", 1), ("ours", 2), ("peer", 2),
                                                              ("ours-x2", 2)]
    for row in rows:
        for key in ("documents", "tokens", "rows", "work_s", "wall_s", "cpu_s", "tokens_per_s_per_process",
                    "tokens_per_cpu_s", "tree_rss", "tree_pss", "process_peak", "output_bytes"):
            assert row[key] > 0, (row["pipeline"], row["processes"], key)
    for row in rows:
        if row["pipeline"] == "peer":  # datasets' Arrow copy of the corpus and the tokenized files stay behind
            assert row["corpus_copy_bytes"] > 0 and row["other_bytes"] > row["corpus_copy_bytes"]
        else:
            assert row["other_bytes"] == 0 and row["corpus_copy_bytes"] == 0
    text = report(result)
    assert "| ours | 1 |" in text and "| peer | 2 |" in text and "| ours-x2 | 2 |" in text


@pytest.mark.slow
def test_both_pipelines_tokenize_the_same_documents_alike_and_chunk_by_their_rules(bpe_run):
    root, result = bpe_run
    lengths = document_lengths(texts_of(root / "corpus"), root / "tokenizer.json")
    for row in result["rows"]:
        assert row["documents"] == len(lengths)
        assert row["tokens"] == sum(lengths)
        expected = our_rows(lengths, SEQ) if row["pipeline"] == "ours" else run_mlm_rows(lengths, SEQ, row["processes"])
        assert row["rows"] == expected, (row["pipeline"], row["processes"])
    assert result["scaled"]["documents"] > 1.8 * len(lengths)  # twice the text in documents of the same sizes


@pytest.mark.slow
def test_a_wordpiece_vocab_gives_both_pipelines_the_same_tokens_too(tmp_path):
    result = benchmark(0.1, [1], scale=1, seq=SEQ, kind="wordpiece", root=tmp_path, interval=0.05)
    lengths = document_lengths(texts_of(tmp_path / "corpus"), tmp_path / "wordpiece" / "vocab.txt")
    ours, peer = result["rows"]
    assert ours["tokens"] == peer["tokens"] == sum(lengths)
    assert ours["rows"] == our_rows(lengths, SEQ) and peer["rows"] == run_mlm_rows(lengths, SEQ, 1)
