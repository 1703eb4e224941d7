"""Outputs of the data tools: never onto an input, temporaries of killed runs cleaned (only ours), nothing
written by a refused run, one-line argument errors. Tiny corpora and vocabs built here; no shared data."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest

from bertrecipe.cli import bert_prep as bertPrep
from bertrecipe.cli import build_default_corpus
from bertrecipe.cli import create_pretraining_data as cpd
from bertrecipe.cli.command_line import run_cli
from bertrecipe.common.errors import DataError, InputError
from bertrecipe.dataprep import download, layout
from bertrecipe.dataprep.sharding import ShardingConfig, shard_corpus
from bertrecipe.dataprep.text_formatting import book_groups, format_corpus, format_tasks
from bertrecipe.dataprep.vocab_training import train_vocab
from helpers import write_formatted

DEAD_PID = 999_999_999  # above every kernel's pid_max: the run that left such a temporary is surely gone
WORDS = "the cat sat on a mat and dog ran in park it was big small red blue day night".split()


def _vocab(folder: Path) -> Path:
    path = folder / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]) + "\n", encoding="utf-8")
    return path


def _text(path: Path, seed: int = 0, docs: int = 4) -> Path:
    """One sentence a line, documents separated by a blank line."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(docs):
        lines += [" ".join(rng.choice(WORDS, 6)) + " ." for _ in range(5)] + [""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _cli(main: Callable[[list[str]], None], argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr + stdout of an entry point run as its __main__ runs it."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(argv))
    captured = capsys.readouterr()
    return exit_.value.code, captured.err + captured.out


def _snapshot(folder: Path) -> dict[str, object]:
    """Every entry under folder (symlinks not followed) with its bytes, link target or 'dir'; a FIFO or device
    node (never read: a FIFO would block) by its inode, type and device number."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            key = str(path.relative_to(folder))
            info = os.lstat(path)
            out[key] = (os.readlink(path) if path.is_symlink() else "dir" if path.is_dir()
                        else path.read_bytes() if path.is_file() else (info.st_ino, info.st_mode, info.st_rdev))
    return out


def _cpd_args(input_file: str | Path, output_file: str | Path, vocab: Path, *extra: str) -> list[str]:
    return ["--input_file", str(input_file), "--output_file", str(output_file), "--vocab_file", str(vocab),
            "--max_seq_length", "16", "--max_predictions_per_seq", "3", "--dupe_factor", "1", *extra]


# ---------------------------------------------------------------- an output that is an input is refused
def _collisions(tmp: Path, vocab: Path) -> dict[str, tuple[str, str, str]]:
    """form -> (--input_file, --output_file, the input the line must name)."""
    corpus = tmp / "corpus"
    a, b = _text(corpus / "a.txt", 1), _text(corpus / "b.txt", 2)
    (tmp / "link").symlink_to(tmp, target_is_directory=True)
    (tmp / "alias.txt").symlink_to(a)
    return {
        "same path": (str(a), str(a), str(a)),
        "relative input, absolute output": ("corpus/a.txt", str(a), "corpus/a.txt"),
        "output spelled through a folder not yet made": (str(a), f"{tmp}/new/../corpus/a.txt", str(a)),
        "output through a symlinked folder": (str(a), str(tmp / "link" / "corpus" / "a.txt"), str(a)),
        "input is a symlink to the output": (str(tmp / "alias.txt"), str(a), "alias.txt"),
        "one of a comma-separated list": (f"{a},{b}", str(b), str(b)),
        "one match of a glob": (str(corpus / "*.txt"), str(b), str(b)),
        "a file of an input folder": (str(corpus), str(b), str(b)),
        "a new .txt in an input folder": (str(corpus), str(corpus / "c.txt"), str(corpus)),
        "the input folder itself": (str(corpus), str(corpus), str(corpus)),
        "the vocab": (str(a), str(vocab), str(vocab)),
    }


@pytest.mark.parametrize("form", ["same path", "relative input, absolute output",
                                  "output spelled through a folder not yet made", "output through a symlinked folder",
                                  "input is a symlink to the output", "one of a comma-separated list",
                                  "one match of a glob", "a file of an input folder", "a new .txt in an input folder",
                                  "the input folder itself", "the vocab"])
def test_output_that_resolves_to_an_input_is_refused_before_any_write(form, tmp_path, capsys, monkeypatch):
    vocab = _vocab(tmp_path)
    input_file, output_file, named = _collisions(tmp_path, vocab)[form]
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    code, err = _cli(cpd.main, _cpd_args(input_file, output_file, vocab), capsys)
    lines = err.strip().split("\n")
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {output_file}: --output_file ") and named in lines[0], lines[0]
    assert "choose another --output_file" in lines[0], lines[0]
    assert _snapshot(tmp_path) == before, "the refused run changed the folder"


def test_comma_lists_and_globs_read_the_same_text_as_a_folder(tmp_path, capsys):
    vocab = _vocab(tmp_path)
    corpus = tmp_path / "corpus"
    a, b = _text(corpus / "a.txt", 1), _text(corpus / "b.txt", 2)
    shards = {}
    for name, spec in {"folder": corpus, "comma": f"{a}, {b}", "glob": corpus / "*.txt"}.items():
        out = tmp_path / f"{name}.hdf5"
        code, err = _cli(cpd.main, _cpd_args(spec, out, vocab), capsys)
        assert code == 0, err
        with h5py.File(out, "r") as f:
            shards[name] = {k: f[k][:] for k in f}
    assert all(np.array_equal(shards["folder"][k], shards[n][k]) for n in ("comma", "glob") for k in shards["folder"])


@pytest.mark.parametrize("spec,message", [
    ("{a},{tmp}/missing.txt", "missing.txt: input file not found; check --input_file"),
    ("{tmp}/corpus/*.md", "*.md: no file matches this --input_file pattern; check the pattern"),
])
def test_a_list_item_that_names_nothing_is_refused(spec, message, tmp_path, capsys):
    vocab, a = _vocab(tmp_path), _text(tmp_path / "corpus" / "a.txt")
    code, err = _cli(cpd.main, _cpd_args(spec.format(a=a, tmp=tmp_path), tmp_path / "out.hdf5", vocab), capsys)
    assert code == 2 and message in err and len(err.strip().split("\n")) == 1, err
    assert not (tmp_path / "out.hdf5").exists()


def test_sharding_refuses_a_shard_name_that_is_an_input(tmp_path):
    out = tmp_path / "out"
    formatted = out / "c_training_0.txt"
    formatted.parent.mkdir()
    formatted.write_text("".join(f"Article {i} says a thing. And another.\n\n" for i in range(6)), encoding="utf-8")
    before = _snapshot(tmp_path)
    with pytest.raises(DataError, match="c_training_0.txt: the text shard is the same file as formatted text .*"
                                        "c_training_0.txt; writing it would destroy the input"):
        shard_corpus(ShardingConfig((formatted,), out, "c", 2, 0, 0.0))
    assert _snapshot(tmp_path) == before


def test_create_vocab_refuses_the_formatted_text_and_an_existing_vocab(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    formatted = layout.formatted_text(tmp_path, "bookscorpus")
    write_formatted((["The cat sat on the mat. " * 50, "A dog ran in the park. " * 50]), formatted)
    existing = _vocab(tmp_path)
    spelled = tmp_path / "vocab" / ".." / formatted.relative_to(tmp_path)
    before = _snapshot(tmp_path)
    for vocab_file, problem in ((spelled, "--vocab_file is the same file as formatted text"),
                                (existing, "--vocab_file already exists and create_vocab does not replace a vocab")):
        code, err = _cli(bertPrep.main, ["--action", "create_vocab", "--dataset", "bookscorpus", "--vocab_size", "200",
                                         "--vocab_file", str(vocab_file)], capsys)
        assert code == 2 and len(err.strip().split("\n")) == 1 and problem in err, err
        assert _snapshot(tmp_path) == before


def test_formatted_text_inside_the_book_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    books = layout.download_dir(tmp_path) / "bookscorpus"
    books.mkdir(parents=True)
    (books / "book1.txt").write_text("Once upon a time.", encoding="utf-8")
    # A folder link would make the formatted text a book of the next run (and that run would replace it).
    layout.formatted_text(tmp_path, "bookscorpus").parent.symlink_to(books, target_is_directory=True)
    before = _snapshot(tmp_path)
    code, err = _cli(bertPrep.main, ["--action", "text_formatting", "--dataset", "bookscorpus"], capsys)
    assert code == 2 and len(err.strip().split("\n")) == 1, err
    assert "would be written inside the book folder" in err and str(books) in err, err
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------- outputs through symlinks, special files refused
def _shard_arrays(path: Path) -> dict[str, object]:
    with h5py.File(path, "r") as f:
        return {**{k: f[k][:].tolist() for k in f}, **{f"attr {k}": np.asarray(v).tolist() for k, v in f.attrs.items()}}


@pytest.mark.parametrize("form", ["a link", "a chain of links", "a dangling link"])
def test_output_file_that_is_a_symlink_writes_its_target_and_keeps_the_link(form, tmp_path, capsys):
    vocab, text = _vocab(tmp_path), _text(tmp_path / "in" / "text.txt")
    plain = tmp_path / "plain.hdf5"  # the oracle: the same shard written to a plain file
    assert _cli(cpd.main, _cpd_args(text, plain, vocab), capsys)[0] == 0
    shared = tmp_path / "shared"  # shared storage the run folder links to
    shared.mkdir()
    target = shared / "books_0.hdf5"
    out = tmp_path / "run" / "shard.hdf5"
    out.parent.mkdir()
    if form != "a dangling link":
        target.write_bytes(b"an earlier shard")
    if form == "a chain of links":
        (shared / "latest.hdf5").symlink_to(target)
        out.symlink_to(shared / "latest.hdf5")
    else:
        out.symlink_to(target)
    links = {p: os.readlink(p) for p in (out, shared / "latest.hdf5") if p.is_symlink()}
    code, err = _cli(cpd.main, _cpd_args(text, out, vocab), capsys)
    assert code == 0, err
    assert {p: os.readlink(p) for p in links} == links, "a link was replaced"
    assert not target.is_symlink() and _shard_arrays(target) == _shard_arrays(plain)
    assert sorted(p.name for p in out.parent.iterdir()) == ["shard.hdf5"]
    chain = ["latest.hdf5"] if form == "a chain of links" else []
    assert sorted(p.name for p in shared.iterdir()) == ["books_0.hdf5", *chain]  # no temporary left


def _special_file(path: Path, kind: str) -> None:
    if kind == "FIFO":
        os.mkfifo(path)
        return
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("this container may not make device nodes")


@pytest.mark.parametrize("through_link", [False, True], ids=["named", "through a link"])
@pytest.mark.parametrize("kind,what", [("FIFO", "a FIFO (named pipe)"), ("device", "a character device")])
def test_output_file_that_is_a_device_or_fifo_is_refused_untouched(kind, what, through_link, tmp_path, capsys):
    vocab, text = _vocab(tmp_path), _text(tmp_path / "in" / "text.txt")
    special = tmp_path / "out" / "null"
    special.parent.mkdir()
    _special_file(special, kind)
    output = special
    if through_link:
        output = tmp_path / "out" / "shard.hdf5"
        output.symlink_to(special)
    before = _snapshot(tmp_path)
    code, err = _cli(cpd.main, _cpd_args(text, output, vocab), capsys)
    lines = err.strip().split("\n")
    assert code == 2 and len(lines) == 1, err
    link = f"a symlink to {special}, " if through_link else ""
    assert lines[0] == (f"error: {output}: --output_file is {link}{what}: writing the output there would replace "
                        "it; move it away, or choose another place for --output_file"), lines[0]
    assert _snapshot(tmp_path) == before, "the refused run changed the folder"


def test_sharding_writes_a_symlinked_shard_through_the_link_and_refuses_a_fifo_first(tmp_path):
    formatted = tmp_path / "formatted.txt"
    formatted.write_text("".join(f"Article {i} says a thing. And another.\n\n" for i in range(6)), encoding="utf-8")
    plain = shard_corpus(ShardingConfig((formatted,), tmp_path / "plain", "c", 2, 0, 0.0)).paths["training"]
    shared, out = tmp_path / "shared", tmp_path / "out"
    shared.mkdir()
    out.mkdir()
    (out / "c_training_1.txt").symlink_to(shared / "books_1.txt")  # dangling: the shard will be its target
    os.mkfifo(out / "c_training_0.txt")
    before = _snapshot(tmp_path)
    with pytest.raises(DataError, match=r"c_training_0.txt: the text shard is a FIFO \(named pipe\): writing the "
                                        "output there would replace it; move it away, or choose another place for the "
                                        "text shard"):
        shard_corpus(ShardingConfig((formatted,), out, "c", 2, 0, 0.0))
    assert _snapshot(tmp_path) == before
    (out / "c_training_0.txt").unlink()
    shard_corpus(ShardingConfig((formatted,), out, "c", 2, 0, 0.0))
    assert os.readlink(out / "c_training_1.txt") == str(shared / "books_1.txt")
    assert (shared / "books_1.txt").read_bytes() == plain[1].read_bytes()
    assert (out / "c_training_0.txt").read_bytes() == plain[0].read_bytes()
    assert sorted(p.name for p in shared.iterdir()) == ["books_1.txt"]


def test_a_download_is_written_through_a_symlink_and_refused_onto_a_fifo(tmp_path):
    source = tmp_path / "served" / "dev-v1.1.json"  # a file: URL stands for the server; nothing is downloaded
    source.parent.mkdir()
    source.write_bytes(b'{"data": []}')
    shared, squad = tmp_path / "shared", tmp_path / "squad"
    shared.mkdir()
    squad.mkdir()
    (squad / "dev-v1.1.json").symlink_to(shared / "dev-v1.1.json")  # dangling until the download
    assert download.fetch(source.as_uri(), squad / "dev-v1.1.json")
    assert os.readlink(squad / "dev-v1.1.json") == str(shared / "dev-v1.1.json")
    assert (shared / "dev-v1.1.json").read_bytes() == source.read_bytes()
    os.mkfifo(squad / "train-v1.1.json")
    before = _snapshot(tmp_path)
    with pytest.raises(InputError, match=r"train-v1.1.json: is a FIFO \(named pipe\): writing the output there "):
        download.fetch(source.as_uri(), squad / "train-v1.1.json")
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------- temporaries of killed runs
def _temporaries(folder: Path, name: str) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "stale": folder / f".{name}.tmp-{DEAD_PID}",  # ours, from a killed run: removed
        "live": folder / f".{name}.tmp-{os.getppid()}",  # ours, from a run still going: kept
        "other output": folder / f".other_{name}.tmp-{DEAD_PID}",  # not an output of this command: kept
        "user's": folder / "notes.tmp",
        "near miss": folder / f".{name}.tmp-{DEAD_PID}.bak",
    }
    for path in paths.values():
        path.write_bytes(b"half written")
    return paths


def _only_stale_removed(paths: dict[str, Path]) -> None:
    assert not paths["stale"].exists()
    assert all(p.read_bytes() == b"half written" for k, p in paths.items() if k != "stale")


def test_shard_write_removes_its_stale_temporary_only(tmp_path, capsys):
    vocab, text = _vocab(tmp_path), _text(tmp_path / "in" / "text.txt")
    paths = _temporaries(tmp_path / "out", "shard.hdf5")
    code, err = _cli(cpd.main, _cpd_args(text, tmp_path / "out" / "shard.hdf5", vocab), capsys)
    assert code == 0, err
    _only_stale_removed(paths)


def test_sharding_removes_its_stale_temporaries_only(tmp_path):
    formatted = tmp_path / "formatted.txt"
    formatted.write_text("".join(f"Article {i} says a thing. And another.\n\n" for i in range(6)), encoding="utf-8")
    paths = _temporaries(tmp_path / "out", "c_training_1.txt")
    shard_corpus(ShardingConfig((formatted,), tmp_path / "out", "c", 2, 0, 0.0))
    _only_stale_removed(paths)


def test_formatting_and_vocab_remove_their_stale_temporaries_only(tmp_path):
    formatted = tmp_path / "f" / "text.txt"
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("The cat sat on the mat. " * 50, encoding="utf-8")
    (books / "b.txt").write_text("A dog ran in the park. " * 50, encoding="utf-8")
    paths = _temporaries(formatted.parent, formatted.name)
    format_corpus(format_tasks("bookscorpus", book_groups(books)), formatted)
    _only_stale_removed(paths)
    vocab = tmp_path / "v" / "vocab.txt"
    paths = _temporaries(vocab.parent, vocab.name)
    train_vocab([formatted], vocab, 150, True)
    _only_stale_removed(paths)


def test_create_hdf5_files_removes_stale_temporaries_beside_complete_shards(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    write_formatted((f"The cat sat on the mat {i}. A dog ran in the park. It was a big day." for i in range(8)),
                   layout.formatted_text(tmp_path, "bookscorpus"))
    flags = ["--dataset", "bookscorpus", "--n_training_shards", "2", "--n_test_shards", "1", "--fraction_test_set",
             "0.2", "--max_seq_length", "16", "--max_predictions_per_seq", "3", "--dupe_factor", "1"]
    vocab = ["--vocab_file", str(_vocab(tmp_path)), "--n_processes", "1"]
    assert _cli(bertPrep.main, ["--action", "sharding", *flags], capsys)[0] == 0
    assert _cli(bertPrep.main, ["--action", "create_hdf5_files", *flags, *vocab], capsys)[0] == 0
    shard = layout.hdf5_shard(tmp_path, layout.InstanceParams(True, 16, 3, 0.15, 12345, 1), "bookscorpus", "test", 0)
    paths = _temporaries(shard.parent, shard.name)
    code, err = _cli(bertPrep.main, ["--action", "create_hdf5_files", *flags, *vocab], capsys)
    assert code == 0 and "3 of 3 shards already complete" in err, err
    _only_stale_removed(paths)


# ---------------------------------------------------------------- a refused run leaves the location as it was
@pytest.mark.parametrize("case", ["non-UTF-8 input", "input without text", "missing vocab", "bad flag value"])
def test_refused_shard_run_creates_no_folder_and_touches_no_file(case, tmp_path, capsys):
    vocab, text = _vocab(tmp_path), _text(tmp_path / "text.txt")
    extra: list[str] = []
    if case == "non-UTF-8 input":
        text.write_bytes("Caf\xe9 au lait.\n".encode("latin-1"))
    elif case == "input without text":
        text.write_text("\n \n\n", encoding="utf-8")
    elif case == "missing vocab":
        vocab = tmp_path / "nope.txt"
    else:
        extra = ["--masked_lm_prob", "0"]
    existing = tmp_path / "out"
    _temporaries(existing, "shard.hdf5")
    before = _snapshot(tmp_path)
    for output in (existing / "shard.hdf5", tmp_path / "new" / "sub" / "shard.hdf5"):
        code, err = _cli(cpd.main, _cpd_args(text, output, vocab, *extra), capsys)
        assert code == 2 and len(err.strip().split("\n")) == 1, err
        assert _snapshot(tmp_path) == before, (case, output)


def test_failed_text_formatting_creates_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    books = layout.download_dir(tmp_path) / "bookscorpus"
    books.mkdir(parents=True)
    (books / "a.txt").write_text("A good book.", encoding="utf-8")
    (books / "b.txt").write_bytes("Caf\xe9.".encode("latin-1"))
    before = _snapshot(tmp_path)
    code, err = _cli(bertPrep.main, ["--action", "text_formatting", "--dataset", "bookscorpus"], capsys)
    assert code == 2 and "b.txt: not UTF-8 text (invalid byte at offset 3); convert the book to UTF-8" in err, err
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------- argument errors: one line, exit 2
@pytest.mark.parametrize("main,prog,argv,problem", [
    (bertPrep.main, "bertPrep.py", ["--action", "sharding", "--dataset", "bookscorpus", "--n_shards", "4"],
     "unrecognized arguments: --n_shards 4"),
    (bertPrep.main, "bertPrep.py", ["--action", "shard", "--dataset", "bookscorpus"],
     "argument --action: invalid choice: 'shard' (choose from"),
    (bertPrep.main, "bertPrep.py", ["--dataset", "bookscorpus"], "the following arguments are required: --action"),
    (cpd.main, "create_pretraining_data.py", ["--input_file", "x", "--output_file", "y", "--vocab_file", "v",
                                              "--max_seq_length", "many"],
     "argument --max_seq_length: invalid int value: 'many'"),
    (build_default_corpus.main, "build_default_corpus.py", ["--bogus", "8000"], "unrecognized arguments: --bogus"),
])
def test_argument_errors_are_one_line_naming_the_program(main, prog, argv, problem, capsys):
    code, err = _cli(main, argv, capsys)
    lines = err.strip().split("\n")
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {prog}: ") and problem in lines[0] and lines[0].endswith("; see --help")


@pytest.mark.parametrize("flags,message", [
    (["--n_test_shards", "-1"], "error: --n_test_shards: must be at least 0, got -1"),
    (["--fraction_test_set", "1.5"], "error: --fraction_test_set: must be in [0, 1), got 1.5"),
    (["--n_training_shards", "40"], "are fewer than the 40 training and 1 test shards asked for; ask for fewer"),
])
def test_sharding_flag_errors_name_the_flag_and_the_fix(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    write_formatted((f"Article {i} is here." for i in range(10)), layout.formatted_text(tmp_path, "bookscorpus"))
    before = _snapshot(tmp_path)
    code, err = _cli(bertPrep.main, ["--action", "sharding", "--dataset", "bookscorpus", "--n_training_shards", "2",
                                     "--n_test_shards", "1", *flags], capsys)
    assert code == 2 and message in err and len(err.strip().split("\n")) == 1, err
    assert _snapshot(tmp_path) == before
