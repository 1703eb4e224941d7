"""Text formatting, sharding, create_hdf5_files, vocab training, the default corpus and the bad-input contract."""
from __future__ import annotations

import bz2
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertrecipe.cli import bert_prep as bertPrep
from bertrecipe.common.errors import DataError
from bertrecipe.dataprep import layout
from bertrecipe.dataprep.sharding import ShardingConfig, shard_corpus, split_sentences
from bertrecipe.dataprep.text_formatting import book_groups, book_text, format_corpus, format_tasks, wiki_articles
from bertrecipe.dataprep.vocab_training import train_vocab
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from helpers import write_formatted

REPO = Path(__file__).resolve().parents[1]
BOOKS = REPO / "tests" / "data" / "books"
MARKUP = re.compile(r"\{\{|\}\}|\[\[|\]\]|<ref|</ref|\{\||\|\}|^\s*[|!]|==|''|&amp;|&nbsp;|<!--|\[http")


def _count_articles_in_dump(path: Path) -> int:
    """Independent count: main-namespace pages, not redirects, with a paragraph of prose (a wikitext line that
    starts with a letter or bold/italic text; list-only pages such as "List of ..." have none)."""
    count = 0
    with bz2.open(path) as f:
        for page in ET.parse(f).getroot():
            if not page.tag.endswith("page"):
                continue
            fields = {child.tag.rsplit("}", 1)[-1]: child for child in page}
            text = next(iter(fields["revision"].iter("{http://www.mediawiki.org/xml/export-0.10/}text"))).text
            prose = any(line[:1].isalpha() or line.startswith("''") for line in (text or "").split("\n"))
            if fields["ns"].text == "0" and "redirect" not in fields and prose:
                count += 1
    return count


# ---------------------------------------------------------------- text formatting
WIKI_EXCERPT = REPO / "tests" / "data" / "wiki" / "enwiki-excerpt.xml.bz2"


def _check_wiki_articles(dump: Path, count: int, min_chars: int, first: str) -> list[str]:
    """One clean article a line: as many as the independent count, none with markup left."""
    articles = list(wiki_articles(dump))
    assert len(articles) == _count_articles_in_dump(dump) == count
    assert all("\n" not in a and a == a.strip() for a in articles)
    marked = [a[max(0, m.start() - 30):m.end() + 30] for a in articles for m in [MARKUP.search(a)] if m]
    assert not marked, marked
    assert "CO2 + H2O H2CO3 H+ + HCO3−" in " ".join(articles)  # {{eqm}} inside <chem> removed, the rest kept
    assert sum(map(len, articles)) > min_chars
    assert articles[0].startswith(first)
    return articles


def test_wiki_dump_excerpt_becomes_one_clean_article_per_line():
    """The excerpt's 9 pages: 3 redirects (one outside the main namespace) are skipped, 6 articles kept."""
    articles = _check_wiki_articles(WIKI_EXCERPT, 6, 45_000, "An American in Paris is a jazz-influenced")
    assert articles[-1].startswith("Brahui () is a Dravidian language")


def test_wiki_dump_becomes_one_clean_article_per_line(shared_data):
    """The whole 206-page sample dump: more pages and markup than the excerpt holds."""
    _check_wiki_articles(shared_data / "wiki" / "enwiki-sample-pages-articles.xml.bz2", 105, 2_000_000,
                         "Anarchism is a political philosophy")


def test_wiki_tables_are_removed():
    with bz2.open(WIKI_EXCERPT, "rt", encoding="utf-8") as f:
        assert f.read().count("{|") >= 2  # Acid's and Brahui language's tables are in the dump
    articles = list(wiki_articles(WIKI_EXCERPT))
    joined = " ".join(articles)
    assert "{|" not in joined and "|-" not in joined and "||" not in joined and "rowspan" not in joined
    brahui = next(a for a in articles if a.startswith("Brahui"))
    assert "Dravidian" in brahui and "wikitable" not in brahui


def test_books_crlf_and_bom_become_one_line_per_book(tmp_path):
    book = tmp_path / "b.txt"
    book.write_bytes(b"\xef\xbb\xbfCHAPTER I.\r\n\r\nIt was a dark night.\r\nThe end.\r\n")
    assert book_text(book) == "CHAPTER I. It was a dark night. The end."
    (tmp_path / "c.txt").write_text("second   book\n", encoding="utf-8")
    out = tmp_path / "out" / "formatted.txt"
    assert format_corpus(format_tasks("bookscorpus", book_groups(tmp_path)), out) == 2
    assert out.read_text(encoding="utf-8") == "CHAPTER I. It was a dark night. The end.\n\nsecond book\n\n"


def test_real_books_are_formatted_whole():
    text = book_text(BOOKS / "pg11.txt")  # CRLF line ends, as Project Gutenberg distributes it
    assert "\r" not in text and "\n" not in text and "  " not in text
    assert text.startswith("Alice was beginning to get very tired")


# ---------------------------------------------------------------- sharding
def _formatted(tmp_path: Path, articles: list[str]) -> Path:
    path = tmp_path / "formatted.txt"
    path.write_text("".join(a + "\n\n" for a in articles), encoding="utf-8")
    return path


def test_shards_are_balanced_and_hold_every_article_once(tmp_path):
    rng = np.random.default_rng(0)
    articles = [" ".join(f"Article {i} sentence {j} is here." for j in range(int(rng.integers(1, 40))))
                for i in range(200)]
    cfg = ShardingConfig((_formatted(tmp_path, articles),), tmp_path / "out", "c", 5, 2, 0.1)
    result = shard_corpus(cfg)
    assert result.articles == 200
    seen: list[int] = []
    for paths in result.paths.values():
        for path in paths:
            for doc in (d for d in path.read_text(encoding="utf-8").split("\n\n") if d.strip()):
                ids = {int(m) for m in re.findall(r"Article (\d+) ", doc)}
                assert len(ids) == 1, "a document is exactly one article"
                seen.append(ids.pop())
    assert sorted(seen) == list(range(200)), "every article in exactly one shard"
    train = result.sentences["training"]
    assert sum(train) + sum(result.sentences["test"]) == sum(len(split_sentences(a)) for a in articles)
    assert max(train) - min(train) <= 40
    assert len(result.paths["test"]) == 2 and min(result.sentences["test"]) > 0
    assert not list((tmp_path / "out").glob(".*tmp*"))


def test_fewer_articles_than_shards_is_refused(tmp_path):
    cfg = ShardingConfig((_formatted(tmp_path, ["One. Two.", "Three."]),), tmp_path / "out", "c", 3, 0, 0.0)
    with pytest.raises(DataError, match="2 articles .* fewer than the 3 training"):
        shard_corpus(cfg)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_sharding_terminates_on_awkward_articles(tmp_path):
    articles = ["no punctuation at all " * 500, "x", "...", "a" * 20000, "Mr. A. B. C. D. e.g. i.e. U.S.A."]
    cfg = ShardingConfig((_formatted(tmp_path, articles),), tmp_path / "out", "c", 2, 0, 0.0)
    assert shard_corpus(cfg).articles == 5


# ---------------------------------------------------------------- create_hdf5_files
@pytest.fixture()
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    sentences = [s for name in ("pg11.txt", "pg1661.txt") for s in split_sentences(book_text(BOOKS / name))]
    # 12 sentences an article: enough articles (20) for 3 training shards and a test shard.
    articles = [" ".join(sentences[i:i + 12]) for i in range(0, len(sentences), 12)]
    write_formatted((articles), layout.formatted_text(tmp_path, "bookscorpus"))
    return tmp_path


SHARD_FLAGS = ["--dataset", "bookscorpus", "--n_training_shards", "3", "--n_test_shards", "1",
               "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--dupe_factor", "2"]


def _hdf5_arrays(root: Path) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(root.rglob("*.hdf5")):
        with h5py.File(path, "r") as f:
            out[str(path.relative_to(root))] = np.concatenate([f[k][:].reshape(len(f[k]), -1) for k in sorted(f)], 1)
    return out


@pytest.mark.slow
def test_output_does_not_depend_on_process_count(workdir, vocab_file):
    vocab = ["--vocab_file", str(vocab_file)]
    bertPrep.main(["--action", "sharding", *SHARD_FLAGS])
    bertPrep.main(["--action", "create_hdf5_files", *SHARD_FLAGS, *vocab, "--n_processes", "1"])
    params = layout.InstanceParams(True, 64, 10, 0.15, 12345, 2)
    hdf5 = layout.hdf5_dir(workdir, params)
    one = _hdf5_arrays(hdf5)
    assert sorted(one) == ["bookscorpus/test/bookscorpus_test_0.hdf5"] + [
        f"bookscorpus/training/bookscorpus_training_{i}.hdf5" for i in range(3)]
    os.rename(hdf5, workdir / "first")
    bertPrep.main(["--action", "create_hdf5_files", *SHARD_FLAGS, *vocab, "--n_processes", "2"])
    two = _hdf5_arrays(hdf5)
    assert one.keys() == two.keys() and all(np.array_equal(one[k], two[k]) for k in one)


def test_complete_shards_are_skipped(workdir, vocab_file, capsys):
    vocab = ["--vocab_file", str(vocab_file)]
    bertPrep.main(["--action", "sharding", *SHARD_FLAGS])
    bertPrep.main(["--action", "create_hdf5_files", *SHARD_FLAGS, *vocab, "--n_processes", "1"])
    shards = sorted(workdir.rglob("*.hdf5"))
    shards[0].unlink()  # as if the run had been killed before this shard
    stamps = {p: p.stat().st_mtime_ns for p in shards[1:]}
    bertPrep.main(["--action", "create_hdf5_files", *SHARD_FLAGS, *vocab, "--n_processes", "1"])
    assert "3 of 4 shards already complete" in capsys.readouterr().out
    assert shards[0].is_file() and all(p.stat().st_mtime_ns == t for p, t in stamps.items())


def test_create_vocab_trains_a_usable_vocab(workdir):
    out = workdir / "vocab.txt"
    train_vocab([layout.formatted_text(workdir, "bookscorpus")], out, 2000, True)
    vocab = load_vocab(out)
    assert 1000 < len(vocab) <= 2000 and vocab.tokens[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    tokens = BertTokenizer(vocab, True).tokenize("Alice was beginning to get very tired of sitting by her sister.")
    assert "[UNK]" not in tokens and tokens[0] == "alice"


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _tied_words(seed: int = 7, count: int = 3000) -> list[str]:
    """Distinct lower-case words that will all occur equally often: every merge starts out tied."""
    rng = np.random.default_rng(seed)
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(chr(97 + int(c)) for c in rng.integers(0, 26, int(rng.integers(3, 10)))))
    return sorted(words)


def _train_in_child(corpus: Path, out: Path, vocab_size: int, threads: str | None) -> bytes:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "RAYON_RS_NUM_CPUS")}
    if threads is not None:
        env["RAYON_NUM_THREADS"] = threads
    code = ("import sys; from pathlib import Path; from bertrecipe.dataprep.vocab_training import train_vocab; "
            "train_vocab([Path(sys.argv[1])], Path(sys.argv[2]), int(sys.argv[3]), True)")
    run = subprocess.run([sys.executable, "-c", code, str(corpus), str(out), str(vocab_size)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return out.read_bytes()


@pytest.mark.slow
def test_create_vocab_is_the_same_bytes_across_runs_and_thread_counts(tmp_path):
    """tokenizers' trainer gave the `##` pieces ids in hash order and broke ties between equal merges by those
    ids: on this corpus, where every merge starts tied, each run wrote another vocab (other tokens, not only
    another order), with one thread as with many."""
    words = _tied_words()
    corpus = tmp_path / "tied.txt"
    corpus.write_text("".join(" ".join(words[i:i + 20]) + "\n" for i in range(0, len(words), 20)) * 2,
                      encoding="utf-8")
    runs = [_train_in_child(corpus, tmp_path / f"vocab_{n}.txt", 400, threads)
            for n, threads in enumerate([None, "1", "2", None])]
    assert all(run == runs[0] for run in runs[1:])
    tokens = runs[0].decode("utf-8").split("\n")[:-1]
    letters = sorted({c for w in words for c in w})
    continuing = sorted({c for w in words for c in w[1:]})
    base = SPECIALS + letters + [f"##{c}" for c in continuing]
    assert tokens[:len(base)] == base  # special tokens, alphabet and `##` pieces, in code-point order
    merged = tokens[len(base):]
    assert len(tokens) == 400 and len(set(tokens)) == 400 and all(len(t.removeprefix("##")) > 1 for t in merged)


def test_create_vocab_keeps_the_most_frequent_characters_and_breaks_ties_by_code_point(tmp_path):
    """More distinct characters than the alphabet holds (1,000): the most frequent are kept, and among equal
    counts at the cut the lower code points (the trainer dropped a hash-ordered subset)."""
    thrice = [chr(0x4E00 + i) for i in range(600)]  # CJK: each is a word of its own
    twice = [chr(0x4E00 + 600 + i) for i in range(600)]
    lines = ["the cat sat on the mat " * 50] + [" ".join(thrice)] * 3 + [" ".join(reversed(twice))] * 2
    corpus = tmp_path / "chars.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "vocab.txt"
    train_vocab([corpus], out, 1200, True)
    tokens = out.read_text(encoding="utf-8").split("\n")[:-1]
    ascii_letters = sorted(set("the cat sat on the mat".replace(" ", "")))
    alphabet = sorted(ascii_letters + thrice + twice[:1000 - len(ascii_letters) - len(thrice)])
    assert [t for t in tokens if len(t) == 1] == alphabet
    assert tokens[len(SPECIALS):len(SPECIALS) + len(alphabet)] == alphabet


def test_create_vocab_plans_the_pieces_that_nfd_reordering_makes(tmp_path):
    """Uncased normalization (NFD) reorders a run of two combining marks that survive accent stripping (here
    musical symbols of canonical classes 226 and 216), so the scan of raw characters expects the wrong one to
    continue the word; the trainer's own pass shows it, and training again puts it among the planned pieces."""
    stem, dot = "\U0001D165", "\U0001D16D"  # classes 216 and 226: NFD puts the stem first
    corpus = tmp_path / "marks.txt"
    # A piece above both in code-point order, so that one the trainer added would come after it.
    corpus.write_text(f"stem {dot}{stem} word wordy wor\U0001F600ds\n" * 5, encoding="utf-8")
    out = tmp_path / "vocab.txt"
    train_vocab([corpus], out, 200, True)
    tokens = out.read_text(encoding="utf-8").split("\n")[:-1]
    pieces = [t for t in tokens if t.startswith("##") and len(t) == 3]
    assert f"##{dot}" in pieces  # the piece the trainer needs: `stem` starts the normalized word
    single = [i for i, t in enumerate(tokens) if len(t.removeprefix("##")) == 1]
    assert single == list(range(len(SPECIALS), len(SPECIALS) + len(single)))  # all in the planned block
    assert pieces == sorted(pieces)


def test_create_vocab_refuses_text_that_is_not_utf8_in_one_line(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("Caf\xe9 au lait. The cat sat.\n".encode("latin-1") * 20)
    out = tmp_path / "vocab.txt"
    with pytest.raises(DataError, match=r"latin1.txt: not UTF-8 text \(invalid continuation byte\); run "
                                        r"--action text_formatting again"):
        train_vocab([corpus], out, 200, True)
    assert not out.exists() and not list(tmp_path.glob(".vocab.txt*"))


@pytest.mark.slow
def test_default_corpus_builds_from_nothing(tmp_path):
    env = {**os.environ, "BERT_PREP_WORKING_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, str(REPO / "data" / "build_default_corpus.py"), "--n_processes", "1",
                          "--dupe_factor", "1", "--vocab_size", "4000"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    for phase, seq, preds in (("phase1", 128, 20), ("phase2", 512, 80)):
        line = next(x for x in run.stdout.splitlines() if x.strip().startswith(f"{phase} --input_dir"))
        shards = sorted(Path(line.split("--input_dir ")[1]).glob("*training*.hdf5"))
        assert len(shards) == 2
        with h5py.File(shards[0], "r") as f:
            assert f["input_ids"].shape[1] == seq and f["masked_lm_positions"].shape[1] == preds
            assert len(f["input_ids"]) > 100 and f["input_ids"][:].max() < 4000
    text = layout.formatted_text(tmp_path, "python_docs").read_text(encoding="utf-8")
    assert text.count("\n\n") > 100 and ">>>" not in text


# ---------------------------------------------------------------- bad input: exit 2, one line, nothing written
def _run_cpd(tmp_path: Path, input_file: Path, vocab: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out" / "shard.hdf5"
    run = subprocess.run([sys.executable, str(REPO / "data" / "create_pretraining_data.py"), "--input_file",
                          str(input_file), "--output_file", str(out), "--vocab_file", str(vocab), *extra],
                         capture_output=True, text=True, timeout=120)
    return run, out


def _bad_cases(tmp_path: Path, good_vocab: Path) -> dict[str, tuple[Path, Path, list[str], str]]:
    text = tmp_path / "text.txt"
    text.write_text("A sentence here.\nAnother one.\n\nA second document.\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\n", encoding="utf-8")
    no_text_dir = tmp_path / "no_text"
    no_text_dir.mkdir()
    (no_text_dir / "readme.md").write_text("not a .txt", encoding="utf-8")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Caf\xe9 au lait.\n".encode("latin-1"))
    bad_vocab = tmp_path / "bad_vocab.txt"
    bad_vocab.write_text("[PAD]\n[UNK]\nthe\n", encoding="utf-8")
    no_unk_vocab = tmp_path / "no_unk_vocab.txt"
    no_unk_vocab.write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")
    return {
        "empty input": (empty, good_vocab, [], "empty.txt: input holds no text"),
        "directory with no text": (no_text_dir, good_vocab, [], "no_text: directory holds no .txt, Parquet"),
        "non-UTF-8": (latin1, good_vocab, [], "latin1.txt: not UTF-8 text (invalid byte at offset 3)"),
        "missing vocab": (text, tmp_path / "nope.txt", [], "nope.txt: vocab file not found"),
        "vocab without specials": (text, bad_vocab, [],
                                   "bad_vocab.txt: vocab lacks the special token(s) [CLS] [SEP] [MASK]"),
        "vocab without [UNK]": (text, no_unk_vocab, [], "no_unk_vocab.txt: vocab lacks the special token(s) [UNK]"),
        "max_seq_length below 8": (text, good_vocab, ["--max_seq_length", "7"], "--max_seq_length: must be at least 8"),
    }


@pytest.mark.slow
def test_bad_inputs_exit_2_with_one_line_and_no_output(tmp_path, vocab_file):
    for name, (input_file, vocab, extra, message) in _bad_cases(tmp_path, vocab_file).items():
        run, out = _run_cpd(tmp_path, input_file, vocab, *extra)
        assert run.returncode == 2, (name, run.stderr)
        lines = run.stderr.strip().split("\n")
        assert len(lines) == 1 and message in lines[0], (name, run.stderr)
        leftovers = list(out.parent.iterdir()) if out.parent.exists() else []
        assert leftovers == [], (name, leftovers)


def test_unwritable_output_directory_is_refused(tmp_path, vocab_file):
    text = tmp_path / "text.txt"
    text.write_text("One sentence.\nTwo sentences.\n", encoding="utf-8")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be", encoding="utf-8")
    run = subprocess.run([sys.executable, str(REPO / "data" / "create_pretraining_data.py"), "--input_file", str(text),
                          "--output_file", str(blocker / "sub" / "shard.hdf5"), "--vocab_file",
                          str(vocab_file)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and len(run.stderr.strip().split("\n")) == 1
    assert "output directory is not writable" in run.stderr and str(blocker) in run.stderr


def test_truncated_bz2_dump_is_refused_without_output(tmp_path):
    dump = WIKI_EXCERPT.read_bytes()
    folder = tmp_path / "download" / "wikicorpus_en"
    folder.mkdir(parents=True)
    (folder / "wikicorpus_en.xml.bz2").write_bytes(dump[: len(dump) // 2])
    run = subprocess.run([sys.executable, str(REPO / "data" / "bertPrep.py"), "--action", "text_formatting",
                          "--dataset", "wikicorpus_en"], env={**os.environ, "BERT_PREP_WORKING_DIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().split("\n")) == 1
    assert "wikicorpus_en.xml.bz2: truncated or corrupt compressed dump" in run.stderr
    formatted = layout.formatted_text(tmp_path, "wikicorpus_en").parent
    assert not formatted.exists() or not list(formatted.iterdir())


# ---------------------------------------------------------------- streaming: memory does not grow with the corpus
def _peak_bytes(fn) -> int:
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _dump(path: Path, pages: int) -> Path:
    body = "".join(f"<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>Page {i} is about "
                   f"'''things'''. It has [[two]] sentences.</text></revision></page>\n" for i in range(pages))
    path.write_text(f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{body}</mediawiki>',
                    encoding="utf-8")
    return path


def test_wiki_reading_memory_does_not_grow_with_the_dump(tmp_path):
    from bertrecipe.dataprep.text_formatting import iter_wiki_pages
    small, large = _dump(tmp_path / "s.xml", 2_000), _dump(tmp_path / "l.xml", 20_000)
    assert sum(1 for _ in iter_wiki_pages(large)) == 20_000
    peak_small = _peak_bytes(lambda: sum(1 for _ in iter_wiki_pages(small)))
    peak_large = _peak_bytes(lambda: sum(1 for _ in iter_wiki_pages(large)))
    assert peak_large < 1.5 * peak_small + 200_000, (peak_small, peak_large)
