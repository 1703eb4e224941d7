"""Sharding at scale: thousands of shards under an ordinary open-file limit, the bytes of a plain-Python
reference whatever the task sizes, memory that does not grow with the corpus, and nothing left behind by a
failure."""
from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertrecipe.common.errors import DataError
from bertrecipe.dataprep import sharding
from bertrecipe.dataprep.sharding import ShardingConfig, shard_corpus

REPO = Path(__file__).resolve().parents[1]


def _formatted(path: Path, articles: list[str]) -> Path:
    path.write_text("".join(a + "\n\n" for a in articles), encoding="utf-8")
    return path


def _limited(soft: int):
    """preexec_fn: the child may hold at most `soft` files open (the kernel refuses one more)."""
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return set_limit


def _shard_in_child(source: Path, out: Path, n_training: int, n_test: int, fraction: float, soft_limit: int) -> None:
    code = ("import sys; from pathlib import Path; "
            "from bertrecipe.dataprep.sharding import ShardingConfig, shard_corpus; "
            "shard_corpus(ShardingConfig((Path(sys.argv[1]),), Path(sys.argv[2]), 'c', int(sys.argv[3]), "
            "int(sys.argv[4]), float(sys.argv[5])))")
    run = subprocess.run([sys.executable, "-c", code, str(source), str(out), str(n_training), str(n_test),
                          str(fraction)], cwd=REPO, capture_output=True, text=True, timeout=300,
                         preexec_fn=_limited(soft_limit))
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("soft_limit", [1024, 160])
def test_4096_shards_are_written_under_an_open_file_limit(tmp_path, soft_limit):
    """Every shard used to be open at once: 4,096 shards failed with 'Too many open files' under the common
    1,024 limit. Now a write-out task holds at most FAN_OUT (128) shards and one part open (the run under 160
    proves fewer than 160)."""
    n_training, n_test, n_articles = 4096, 32, 12_000
    # One sentence per article: the greedy balance deals them round robin; fraction 1/4 makes every 4th a test one.
    source = _formatted(tmp_path / "formatted.txt", [f"Article {i} is here." for i in range(n_articles)])
    out = tmp_path / "out"
    _shard_in_child(source, out, n_training, n_test, 0.25, soft_limit)
    expected: dict[str, list[str]] = {f"c_training_{k}.txt": [] for k in range(n_training)}
    expected.update({f"c_test_{k}.txt": [] for k in range(n_test)})
    test_ids = [i for i in range(n_articles) if i % 4 == 3]
    training_ids = [i for i in range(n_articles) if i % 4 != 3]
    for split, ids, n in (("training", training_ids, n_training), ("test", test_ids, n_test)):
        for position, i in enumerate(ids):
            expected[f"c_{split}_{position % n}.txt"].append(f"Article {i} is here.\n\n")
    written = {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()}
    assert written.keys() == expected.keys()  # every shard, and no temporary or scratch left beside them
    assert all(written[name] == "".join(texts) for name, texts in expected.items())


def _varied_articles(count: int) -> list[str]:
    words = ["alpha", "Beta", "gamma", "δέλτα", "mr.", "U.S.", "3.5", "—", "“quoted”", "end"]
    return [" ".join(f"{words[(i * 7 + j) % len(words)]} {i} {words[(i + j) % len(words)]} sentence {j}."
                     for j in range(1 + (i * 13) % 9)) for i in range(count)]


def _shard_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _reference_shards(articles: list[str], n_training: int, n_test: int, fraction: float) -> dict[str, str]:
    """Plain-Python sharding: each article in turn goes to the shard of its split with the fewest sentences so far
    (the lowest number on a tie); every floor(n * fraction) step of the article count is a test article."""
    shards = {"training": [[] for _ in range(n_training)], "test": [[] for _ in range(n_test)]}
    counts = {"training": [0] * n_training, "test": [0] * n_test}
    for index, article in enumerate(articles):
        test = n_test > 0 and int((index + 1) * fraction) > int(index * fraction)
        split = "test" if test else "training"
        shard = min(range(len(counts[split])), key=lambda k: (counts[split][k], k))
        sentences = sharding.split_sentences(article)
        counts[split][shard] += len(sentences)
        shards[split][shard].append("\n".join(sentences) + "\n\n")
    return {f"c_{split}_{k}.txt": "".join(texts) for split in shards for k, texts in enumerate(shards[split])}


@pytest.mark.slow
@pytest.mark.parametrize("fan_out, write_tasks, segment_bytes", [(1, 64, 300), (3, 4, 1_000), (10_000, 1, 1 << 20)])
def test_shards_are_a_plain_reference_whatever_the_task_sizes(tmp_path, monkeypatch, fan_out, write_tasks,
                                                               segment_bytes):
    articles = _varied_articles(700)
    source = _formatted(tmp_path / "formatted.txt", articles)
    monkeypatch.setattr(sharding, "FAN_OUT", fan_out)  # shards per write-out task: 1, 3 or all 42
    monkeypatch.setattr(sharding, "WRITE_TASKS", write_tasks)
    monkeypatch.setattr(sharding, "SEGMENT_BYTES", segment_bytes)  # parts of a few articles, or one part
    result = shard_corpus(ShardingConfig((source,), tmp_path / "out", "c", 37, 5, 0.1))
    expected = _reference_shards(articles, 37, 5, 0.1)
    assert {name: data.decode("utf-8") for name, data in _shard_bytes(tmp_path / "out").items()} == expected
    assert result.articles == 700
    assert sum(result.sentences["training"]) + sum(result.sentences["test"]) == \
        sum(len(sharding.split_sentences(a)) for a in articles)


def _peak_bytes(fn) -> int:
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_sharding_memory_is_bounded_by_a_part_not_by_the_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "FAN_OUT", 2)  # 6 shards: three write-out tasks
    monkeypatch.setattr(sharding, "SEGMENT_BYTES", 40_000)  # a part's index is what grows with its articles
    inputs = {n: _formatted(tmp_path / f"in{n}.txt", [f"Article {i} says one thing. Then another." for i in range(n)])
              for n in (2_000, 20_000)}

    def run(n: int) -> None:
        shard_corpus(ShardingConfig((inputs[n],), tmp_path / f"out{n}", "c", 5, 1, 0.1))
    peak_small, peak_large = _peak_bytes(lambda: run(2_000)), _peak_bytes(lambda: run(20_000))
    assert peak_large < 1.5 * peak_small + 200_000, (peak_small, peak_large)


def test_a_failure_while_writing_out_the_shards_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "FAN_OUT", 4)
    monkeypatch.setattr(sharding, "WRITE_TASKS", 1)  # as few tasks as FAN_OUT allows: 4 + 4 + 4 shards
    source = _formatted(tmp_path / "formatted.txt", _varied_articles(100))
    calls = []

    def full_disk(parts, first, shards):
        calls.append(first)
        if len(calls) == 2:  # the first task's shards are already written
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(parts, first, shards)
    real = sharding.write_shards
    monkeypatch.setattr(sharding, "write_shards", full_disk)
    with pytest.raises(DataError, match=r"out: cannot write shards \(No space left on device\); check free space"):
        shard_corpus(ShardingConfig((source,), tmp_path / "out", "c", 10, 2, 0.1))
    assert calls == [0, 4]
    assert not (tmp_path / "out").exists(), list((tmp_path / "out").iterdir())


def test_existing_shards_stay_when_sharding_fails(tmp_path, monkeypatch):
    source = _formatted(tmp_path / "formatted.txt", _varied_articles(100))
    shard_corpus(ShardingConfig((source,), tmp_path / "out", "c", 3, 1, 0.1))
    before = _shard_bytes(tmp_path / "out")
    (tmp_path / "out" / "notes.txt").write_text("the user's", encoding="utf-8")
    def failing_disk(*_):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(sharding, "write_shards", failing_disk)
    source.write_text("Other text. Quite different.\n\n" * 50, encoding="utf-8")
    with pytest.raises(DataError, match=r"cannot write shards \(I/O error\)"):
        shard_corpus(ShardingConfig((source,), tmp_path / "out", "c", 3, 1, 0.1))
    assert _shard_bytes(tmp_path / "out") == {**before, "notes.txt": b"the user's"}  # no scratch folder either


def test_a_part_cut_short_under_a_write_out_task_is_one_clear_error(tmp_path):
    part = tmp_path / "part-000000"
    part.write_bytes(b"One.\n\nTwo.\n\n")
    # two articles of 6 bytes (at 0 and 6) for shard 0
    sharding._save_assignment(str(part), np.array([0, 0]), np.array([0, 6]), np.array([6, 6]))
    part.write_bytes(b"One.\n\nTw")  # shorter than its index says
    with pytest.raises(DataError, match=r"part-000000: ends at byte 8, before the article its index puts at 6\.\.12"):
        sharding.write_shards((str(part),), 0, (str(tmp_path / "c_training_0.txt"),))


# ---------------------------------------------------------------- formatting and sharding in tasks
def _reference_articles(path: Path) -> list[str]:
    """What sharding must hold, read as a text-mode reader does (\\r\\n and a lone \\r end lines too)."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    return ["\n".join(sharding.split_sentences(line)) for line in lines]


@pytest.mark.slow
def test_sharding_in_many_tasks_on_processes_is_the_bytes_of_one_task(tmp_path, monkeypatch):
    from bertrecipe.dataprep import engine
    articles = [f"Article {i} says hello. It is number {i} of many, caf\u00e9 and na\u00efve. Dr. Who came."
                for i in range(60)]
    text = "".join(a + "\n\n" for a in articles)
    # A lone \r and a \r\n inside the text end lines for a text-mode reader: so they must for the tasks too.
    text = text.replace("Article 7 says", "Article 7\rsays").replace("Article 9 says", "Article 9\r\nsays")
    source = tmp_path / "formatted.txt"
    source.write_bytes(text.encode("utf-8"))
    cfg = dict(inputs=(source,), corpus="c", n_training_shards=5, n_test_shards=2, fraction_test_set=0.1)
    one = shard_corpus(ShardingConfig(output_dir=tmp_path / "one", **cfg))
    monkeypatch.setattr(sharding, "SEGMENT_BYTES", 37)  # ranges that cut lines and multi-byte characters
    assert len(sharding.segment_tasks([source])) > 50
    with engine.open_runner(engine.EngineConfig("local", n_processes=2)) as run:
        many = shard_corpus(ShardingConfig(output_dir=tmp_path / "many", **cfg), run=run)
    assert (many.articles, many.sentences) == (one.articles, one.sentences)
    assert _shard_bytes(tmp_path / "many") == _shard_bytes(tmp_path / "one")  # no scratch folder left either
    written = [a for shard in _shard_bytes(tmp_path / "one").values()
               for a in shard.decode("utf-8").split("\n\n") if a]
    assert sorted(written) == sorted(_reference_articles(source)) and len(written) == 62


def test_formatting_in_many_tasks_on_processes_is_the_bytes_of_one_task(tmp_path, monkeypatch):
    from bertrecipe.dataprep import engine, text_formatting
    books = tmp_path / "books"
    # Sorted as paths are sorted (by parts), not as strings: a/z.txt, a b/x.txt, a-1.txt, a.txt, ...
    names = ["a.txt", "a-1.txt", "a b/x.txt", "a/z.txt", "b/c/d.txt", "b/c.txt", "notes.md", "e.txt"]
    for i, name in enumerate(names):
        (books / name).parent.mkdir(parents=True, exist_ok=True)
        (books / name).write_text(f"\ufeffBook {i}\r\nline two of {name}.\n", encoding="utf-8")
    (books / "e.txt").write_text("", encoding="utf-8")  # an empty book is no article
    expected = sorted(p for p in books.rglob("*.txt") if p.is_file())
    groups = text_formatting.book_groups(books, 3)
    assert [p for g in groups for p in text_formatting.group_paths(g)] == [str(p) for p in expected]
    reference = "".join(text_formatting.book_text(p) + "\n\n" for p in expected if text_formatting.book_text(p))

    one = tmp_path / "one.txt"
    text_formatting.format_corpus(text_formatting.format_tasks("bookscorpus", text_formatting.book_groups(books)), one)
    monkeypatch.setattr(text_formatting, "BOOKS_PER_TASK", 2)
    tasks = text_formatting.format_tasks("bookscorpus", text_formatting.book_groups(books))
    assert len(tasks) == 4
    many = tmp_path / "out" / "many.txt"
    with engine.open_runner(engine.EngineConfig("local", n_processes=2)) as run:
        assert text_formatting.format_corpus(tasks, many, run) == 6
    assert many.read_text(encoding="utf-8") == one.read_text(encoding="utf-8") == reference
    assert sorted(p.name for p in many.parent.iterdir()) == ["many.txt"]  # no part or scratch folder left


@pytest.mark.parametrize("failure", [errno.EXDEV, errno.EIO])
def test_joining_the_parts_falls_back_to_copying_where_the_kernel_cannot(tmp_path, monkeypatch, failure):
    """The parts are joined by copy_file_range; where it stops (another file system: EXDEV) the rest is copied
    through this process from where it stopped; a real I/O error is one line and leaves no output."""
    from bertrecipe.dataprep import text_formatting
    books = tmp_path / "books"
    books.mkdir()
    for i in range(3):
        (books / f"b{i}.txt").write_text(f"Book {i} has some words in it.", encoding="utf-8")
    monkeypatch.setattr(text_formatting, "BOOKS_PER_TASK", 1)
    tasks = text_formatting.format_tasks("bookscorpus", text_formatting.book_groups(books))
    real, calls = os.copy_file_range, []

    def stops_after_five_bytes(src: int, dst: int, count: int) -> int:
        calls.append(count)
        if len(calls) == 1:
            return real(src, dst, 5)
        raise OSError(failure, os.strerror(failure))
    monkeypatch.setattr(os, "copy_file_range", stops_after_five_bytes)
    out = tmp_path / "out" / "formatted.txt"
    if failure == errno.EIO:
        with pytest.raises(DataError, match=r"formatted.txt: cannot write \(Input/output error\)"):
            text_formatting.format_corpus(tasks, out)
        assert not (tmp_path / "out").exists()
        return
    assert text_formatting.format_corpus(tasks, out) == 3
    assert out.read_text(encoding="utf-8") == "".join(f"Book {i} has some words in it.\n\n" for i in range(3))
    assert len(calls) == 4  # the first part's two calls, one for each other part


def test_a_failing_formatting_task_leaves_no_output_and_no_scratch(tmp_path, monkeypatch):
    from bertrecipe.dataprep import engine, text_formatting
    books = tmp_path / "books"
    books.mkdir()
    for i in range(4):
        (books / f"b{i}.txt").write_text(f"Book {i}.", encoding="utf-8")
    (books / "b2.txt").write_bytes(b"bad \xff byte")
    monkeypatch.setattr(text_formatting, "BOOKS_PER_TASK", 1)
    out = tmp_path / "new" / "formatted.txt"
    with engine.open_runner(engine.EngineConfig("local", n_processes=2)) as run, \
            pytest.raises(DataError, match=r"b2\.txt.*not UTF-8"):
        text_formatting.format_corpus(text_formatting.format_tasks("bookscorpus", text_formatting.book_groups(books)),
                                      out, run)
    assert not (tmp_path / "new").exists()


def test_a_failing_segmentation_task_on_processes_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    from bertrecipe.dataprep import engine
    source = tmp_path / "formatted.txt"
    good = "".join(f"Article {i} is here. It has two sentences.\n\n" for i in range(40)).encode("utf-8")
    source.write_bytes(good + b"bad \xff byte.\n\n" + good)  # a task in the middle fails, others run on
    monkeypatch.setattr(sharding, "SEGMENT_BYTES", 64)
    cfg = ShardingConfig((source,), tmp_path / "out", "c", 4, 1, 0.1)
    with engine.open_runner(engine.EngineConfig("local", n_processes=2)) as run, \
            pytest.raises(DataError, match="formatted.txt.*not UTF-8"):
        shard_corpus(cfg, run=run)
    assert not (tmp_path / "out").exists()  # no shard, temporary, part or scratch folder
