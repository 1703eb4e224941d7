"""Sharding at scale: thousands of shards under an ordinary open-file limit, the same bytes as writing every
shard at once, memory that does not grow with the corpus, and nothing left behind by a failure."""
from __future__ import annotations

import errno
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bertrecipe.data import sharding
from bertrecipe.data.errors import DataError
from bertrecipe.data.sharding import ShardingConfig, shard_corpus

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
    code = ("import sys; from pathlib import Path; from data.sharding import ShardingConfig, shard_corpus; "
            "shard_corpus(ShardingConfig((Path(sys.argv[1]),), Path(sys.argv[2]), 'c', int(sys.argv[3]), "
            "int(sys.argv[4]), float(sys.argv[5])))")
    run = subprocess.run([sys.executable, "-c", code, str(source), str(out), str(n_training), str(n_test),
                          str(fraction)], cwd=REPO, capture_output=True, text=True, timeout=300,
                         preexec_fn=_limited(soft_limit))
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.parametrize("soft_limit", [1024, 160])
def test_4096_shards_are_written_under_an_open_file_limit(tmp_path, soft_limit):
    """Every shard used to be open at once: 4,096 shards failed with 'Too many open files' under the common
    1,024 limit. Now about 2*sqrt(n) files are open at a time (the run under 160 proves fewer than 160)."""
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
    assert written.keys() == expected.keys()  # every shard, and no temporary or spill left beside them
    assert all(written[name] == "".join(texts) for name, texts in expected.items())


def _varied_articles(count: int) -> list[str]:
    words = ["alpha", "Beta", "gamma", "δέλτα", "mr.", "U.S.", "3.5", "—", "“quoted”", "end"]
    return [" ".join(f"{words[(i * 7 + j) % len(words)]} {i} {words[(i + j) % len(words)]} sentence {j}."
                     for j in range(1 + (i * 13) % 9)) for i in range(count)]


def _shard_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("fan_out", [2, 3, 7])
def test_spilled_shards_are_the_bytes_of_writing_every_shard_at_once(tmp_path, monkeypatch, fan_out):
    source = _formatted(tmp_path / "formatted.txt", _varied_articles(700))
    cfg = dict(inputs=(source,), corpus="c", n_training_shards=37, n_test_shards=5, fraction_test_set=0.1)
    monkeypatch.setattr(sharding, "FAN_OUT", 10_000)  # every shard open at once: the old way
    direct = shard_corpus(ShardingConfig(output_dir=tmp_path / "direct", **cfg))
    spills: list[object] = []
    real = tempfile.TemporaryFile

    def counted(*args, **kwargs):
        spills.append(kwargs.get("dir"))
        return real(*args, **kwargs)
    monkeypatch.setattr(tempfile, "TemporaryFile", counted)
    monkeypatch.setattr(sharding, "FAN_OUT", fan_out)
    spilled = shard_corpus(ShardingConfig(output_dir=tmp_path / "spilled", **cfg))
    assert spills and set(spills) == {tmp_path / "spilled"}, "spills go beside the shards, not to /tmp"
    assert (spilled.sentences, spilled.articles) == (direct.sentences, direct.articles)
    assert _shard_bytes(tmp_path / "spilled") == _shard_bytes(tmp_path / "direct")
    assert len(_shard_bytes(tmp_path / "direct")) == 42


def _peak_bytes(fn) -> int:
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_spilling_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "FAN_OUT", 2)  # 6 shards: two levels of spills, the last of a third each
    inputs = {n: _formatted(tmp_path / f"in{n}.txt", [f"Article {i} says one thing. Then another." for i in range(n)])
              for n in (2_000, 20_000)}

    def run(n: int) -> None:
        shard_corpus(ShardingConfig((inputs[n],), tmp_path / f"out{n}", "c", 5, 1, 0.1))
    peak_small, peak_large = _peak_bytes(lambda: run(2_000)), _peak_bytes(lambda: run(20_000))
    assert peak_large < 1.5 * peak_small + 200_000, (peak_small, peak_large)


def test_a_failure_while_writing_out_the_spills_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "FAN_OUT", 4)
    source = _formatted(tmp_path / "formatted.txt", _varied_articles(100))
    calls = []

    def full_disk(spill):
        calls.append(spill)
        if len(calls) == 2:  # the first spill's shards are already written out
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(spill)
    real = sharding._read_spill
    monkeypatch.setattr(sharding, "_read_spill", full_disk)
    with pytest.raises(DataError, match=r"out: cannot write shards \(No space left on device\); check free space"):
        shard_corpus(ShardingConfig((source,), tmp_path / "out", "c", 10, 2, 0.1))
    assert len(calls) == 2
    assert not (tmp_path / "out").exists(), list((tmp_path / "out").iterdir())


# ---------------------------------------------------------------- formatting and sharding in tasks
def _reference_articles(path: Path) -> list[str]:
    """What sharding must hold, read as a text-mode reader does (\\r\\n and a lone \\r end lines too)."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    return ["\n".join(sharding.split_sentences(line)) for line in lines]


def test_sharding_in_many_tasks_on_processes_is_the_bytes_of_one_task(tmp_path, monkeypatch):
    from bertrecipe.data import engine
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
    with engine.session(engine.EngineConfig("local", n_processes=2)) as run:
        many = shard_corpus(ShardingConfig(output_dir=tmp_path / "many", **cfg), run=run)
    assert (many.articles, many.sentences) == (one.articles, one.sentences)
    assert _shard_bytes(tmp_path / "many") == _shard_bytes(tmp_path / "one")  # no scratch folder left either
    written = [a for shard in _shard_bytes(tmp_path / "one").values()
               for a in shard.decode("utf-8").split("\n\n") if a]
    assert sorted(written) == sorted(_reference_articles(source)) and len(written) == 62


def test_formatting_in_many_tasks_on_processes_is_the_bytes_of_one_task(tmp_path, monkeypatch):
    from bertrecipe.data import engine, text_formatting
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
    with engine.session(engine.EngineConfig("local", n_processes=2)) as run:
        assert text_formatting.format_corpus(tasks, many, run) == 6
    assert many.read_text(encoding="utf-8") == one.read_text(encoding="utf-8") == reference
    assert sorted(p.name for p in many.parent.iterdir()) == ["many.txt"]  # no part or scratch folder left


def test_a_failing_formatting_task_leaves_no_output_and_no_scratch(tmp_path, monkeypatch):
    from bertrecipe.data import engine, text_formatting
    books = tmp_path / "books"
    books.mkdir()
    for i in range(4):
        (books / f"b{i}.txt").write_text(f"Book {i}.", encoding="utf-8")
    (books / "b2.txt").write_bytes(b"bad \xff byte")
    monkeypatch.setattr(text_formatting, "BOOKS_PER_TASK", 1)
    out = tmp_path / "new" / "formatted.txt"
    with engine.session(engine.EngineConfig("local", n_processes=2)) as run, \
            pytest.raises(DataError, match=r"b2\.txt.*not UTF-8"):
        text_formatting.format_corpus(text_formatting.format_tasks("bookscorpus", text_formatting.book_groups(books)),
                                      out, run)
    assert not (tmp_path / "new").exists()


def test_a_failing_segmentation_task_on_processes_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    from bertrecipe.data import engine
    source = tmp_path / "formatted.txt"
    good = "".join(f"Article {i} is here. It has two sentences.\n\n" for i in range(40)).encode("utf-8")
    source.write_bytes(good + b"bad \xff byte.\n\n" + good)  # a task in the middle fails, others run on
    monkeypatch.setattr(sharding, "SEGMENT_BYTES", 64)
    cfg = ShardingConfig((source,), tmp_path / "out", "c", 4, 1, 0.1)
    with engine.session(engine.EngineConfig("local", n_processes=2)) as run, \
            pytest.raises(DataError, match="formatted.txt.*not UTF-8"):
        shard_corpus(cfg, run=run)
    assert not (tmp_path / "out").exists()  # no shard, temporary, part or scratch folder
