"""atomic_files: the one temporary-name scheme, and which leftovers the next write of an output removes."""
import os
import re
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from bertrecipe.common.atomic_files import (
    atomic_output,
    move_onto,
    remove_stale_temporaries,
    write_atomic,
    write_temporary,
)
from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable, check_writable_folder
from bertrecipe.finetuning.staged_outputs import StagedOutputs

DEAD_PID = 999_999_999  # above every kernel's pid_max


def test_each_write_gets_its_own_hidden_temporary_with_our_pid(tmp_path):
    first = write_temporary(tmp_path / "results.json", lambda f: f.write(b"1"))
    second = write_temporary(tmp_path / "results.json", lambda f: f.write(b"2"))
    assert first != second and first.read_bytes() == b"1" and second.read_bytes() == b"2"
    for tmp in (first, second):
        assert tmp.name.startswith(f".results.json.{os.getpid()}.") and tmp.name.endswith(".tmp")


def test_a_temporary_with_our_pid_that_we_did_not_make_is_stale(tmp_path):
    # An earlier run with the same pid (a restarted container's pid 1) left it; ours in progress stays.
    left = tmp_path / f".ckpt_4.pt.{os.getpid()}.abcd1234.tmp"
    left.write_bytes(b"half")
    staged = write_temporary(tmp_path / "ckpt_4.pt", lambda f: f.write(b"staged"))
    assert remove_stale_temporaries(tmp_path, ["ckpt_4.pt"]) == [left]
    assert staged.read_bytes() == b"staged"


def test_the_next_write_removes_only_the_stale_temporaries_of_its_output(tmp_path):
    stale = [f".vocab.txt.{DEAD_PID}.a1b2c3d4.tmp", f".vocab.txt.tmp-{DEAD_PID}", ".vocab.txt.zz_9yx8w.tmp"]
    kept = [f".vocab.txt.{os.getppid()}.a1b2c3d4.tmp",  # a live writer's
            f".other.txt.{DEAD_PID}.a1b2c3d4.tmp", f".vocab.txt.tmp-{DEAD_PID}.bak", "vocab.txt.a1b2c3d4.tmp",
            ".vocab.txt.A1B2C3D4.tmp", "notes.tmp"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / f".vocab.txt.{DEAD_PID}.linklink.tmp").symlink_to(tmp_path / "notes.tmp")
    write_atomic(tmp_path / "vocab.txt", lambda f: f.write(b"[PAD]\n"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        kept + ["vocab.txt", f".vocab.txt.{DEAD_PID}.linklink.tmp"])


def test_a_failed_write_leaves_the_location_as_it_was(tmp_path):
    target = tmp_path / "new" / "deeper" / "shard.hdf5"
    with pytest.raises(RuntimeError), atomic_output(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- outputs through symlinks, special files refused
def _write_file(writer: str, path, content: bytes) -> None:
    """Writes content to path the way each kind of caller does."""
    if writer == "write_atomic":
        write_atomic(path, lambda f: f.write(content))
    elif writer == "atomic_output":
        with atomic_output(path) as tmp:
            tmp.write_bytes(content)
    else:  # StagedOutputs' way: a temporary now, renamed into place later
        move_onto(write_temporary(path, lambda f: f.write(content)), path)


def _links(tmp_path, form: str):
    """(the output name the command is given, the file the content must reach, {link: what it reads})."""
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "shard.hdf5"
    out = tmp_path / "out" / "shard.hdf5"
    out.parent.mkdir()
    if form == "a link":
        target.write_bytes(b"old")
        out.symlink_to(target)
    elif form == "a relative link":
        target.write_bytes(b"old")
        out.symlink_to(os.path.join("..", "shared", "shard.hdf5"))
    elif form == "a chain of links":
        target.write_bytes(b"old")
        (shared / "middle.hdf5").symlink_to(target)
        out.symlink_to(shared / "middle.hdf5")
    else:  # a dangling link whose target folder exists: the target is created
        out.symlink_to(target)
    links = {path: os.readlink(path) for path in (out, shared / "middle.hdf5") if path.is_symlink()}
    return out, target, links


LINK_FORMS = ["a link", "a relative link", "a chain of links", "a dangling link"]
WRITERS = ["write_atomic", "atomic_output", "write_temporary + move_onto"]


@pytest.mark.parametrize("form", LINK_FORMS)
@pytest.mark.parametrize("writer", WRITERS)
def test_a_symlinked_output_is_written_through_and_the_link_stays(writer, form, tmp_path):
    out, target, links = _links(tmp_path, form)
    _write_file(writer, out, b"new content")
    assert {path: os.readlink(path) for path in links} == links  # every link as it was
    assert not target.is_symlink() and target.read_bytes() == b"new content"
    assert out.read_bytes() == b"new content"
    left = sorted(p.name for folder in (out.parent, target.parent) for p in folder.iterdir() if p.name.endswith(".tmp"))
    assert left == []


def test_stale_temporaries_beside_the_link_and_its_target_are_removed_and_nothing_else(tmp_path):
    out, target, _ = _links(tmp_path, "a link")
    stale = [out.parent / f".{out.name}.{DEAD_PID}.a1b2c3d4.tmp",
             target.parent / f".{target.name}.{DEAD_PID}.a1b2c3d4.tmp"]
    kept = [target.parent / f".other.hdf5.{DEAD_PID}.a1b2c3d4.tmp", target.parent / "notes.tmp"]
    for path in stale + kept:
        path.write_bytes(b"half")
    write_atomic(out, lambda f: f.write(b"new"))
    assert [p.exists() for p in stale] == [False, False] and all(p.read_bytes() == b"half" for p in kept)


def test_a_folder_output_that_links_to_a_folder_is_written_through(tmp_path):
    shared = tmp_path / "shared" / "glue"
    shared.mkdir(parents=True)  # empty: a folder output replaces only an empty folder, as before
    out = tmp_path / "glue"
    out.symlink_to(shared, target_is_directory=True)
    with atomic_output(out) as tmp:
        tmp.mkdir()
        (tmp / "dev.tsv").write_text("a\tb\n", encoding="utf-8")
    assert out.is_symlink() and os.readlink(out) == str(shared)
    assert (shared / "dev.tsv").read_text(encoding="utf-8") == "a\tb\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["glue", "shared"]
    assert sorted(p.name for p in shared.parent.iterdir()) == ["glue"]


def test_a_moved_file_reaches_a_linked_target_on_another_file_system(tmp_path):
    # A scratch folder here, the link's target on another file system: rename cannot cross, so it is copied.
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    with tempfile.TemporaryDirectory(dir=other) as shared:
        target = Path(shared) / "c_training_0.txt"
        target.write_bytes(b"old")
        out = tmp_path / "c_training_0.txt"
        out.symlink_to(target)
        source = tmp_path / "part.txt"
        source.write_bytes(b"sentences\n")
        assert move_onto(source, out) == target
        assert os.readlink(out) == str(target) and target.read_bytes() == b"sentences\n"
        assert not source.exists() and os.listdir(shared) == ["c_training_0.txt"]


def _special(tmp_path, kind: str) -> Path:
    """A real special file of the given kind in tmp_path."""
    path = tmp_path / f"special-{kind}"
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()  # the socket file stays
    else:  # a character device like /dev/null (1, 3): only root may make one
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("this container may not make device nodes")
    return path


def _identity(path: Path) -> tuple:
    info = os.lstat(path)
    return info.st_ino, info.st_mode, info.st_rdev


SPECIAL_KINDS = {"FIFO": "a FIFO (named pipe)", "socket": "a socket", "character device": "a character device"}


@pytest.mark.parametrize("through_link", [False, True], ids=["named", "through a link"])
@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize("writer", WRITERS)
def test_a_special_file_is_refused_untouched(writer, kind, through_link, tmp_path):
    special = _special(tmp_path, kind)
    out = tmp_path / "out.bin"
    if through_link:
        out.symlink_to(special)
    else:
        out = special
    before = {p.name: _identity(p) for p in tmp_path.iterdir()}
    with pytest.raises(InputError) as refused:
        _write_file(writer, out, b"would replace it")
    link = f"is a symlink to {special}, " if through_link else "is "
    assert str(refused.value) == (f"{out}: {link}{SPECIAL_KINDS[kind]}: writing the output there would replace it; "
                                  "choose another name for this output")
    assert {p.name: _identity(p) for p in tmp_path.iterdir()} == before  # nothing replaced, nothing left behind


def test_a_symlink_loop_and_a_link_into_a_missing_folder_are_refused(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "nowhere").symlink_to(tmp_path / "missing" / "shard.hdf5")
    before = {p.name: os.readlink(p) for p in tmp_path.iterdir()}
    with pytest.raises(InputError, match="a: is a symlink loop; choose another name"):
        write_atomic(tmp_path / "a", lambda f: f.write(b"x"))
    with pytest.raises(InputError, match=f"nowhere: is a symlink to {tmp_path}/missing/shard.hdf5, whose folder "
                                         f"{tmp_path}/missing does not exist"):
        write_atomic(tmp_path / "nowhere", lambda f: f.write(b"x"))
    assert {p.name: os.readlink(p) for p in tmp_path.iterdir()} == before


# ---------------------------------------------------------------- the checks before any work
@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_the_output_checks_refuse_a_special_file_before_any_work(kind, tmp_path):
    special = _special(tmp_path, kind)
    link = tmp_path / "out.json"
    link.symlink_to(special)
    before = {p.name: _identity(p) for p in tmp_path.iterdir()}
    with pytest.raises(InputError, match=rf"^{special}: --out-file is {re.escape(SPECIAL_KINDS[kind])}: writing "
                                         "the output there would replace it; move it away, or choose another place for "
                                         "--out-file$"):
        check_writable(special, "--out-file")
    with pytest.raises(InputError, match=rf"^{link}: --out-file is a symlink to {special}, "):
        check_writable(link, "--out-file")
    with pytest.raises(InputError, match=rf"^{special}: --output_dir is {re.escape(SPECIAL_KINDS[kind])}: "):
        check_writable_folder(special, "--output_dir")
    assert {p.name: _identity(p) for p in tmp_path.iterdir()} == before


def test_the_output_checks_accept_links_to_places_they_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "out.json").symlink_to(shared / "eval.json")  # dangling: the write creates the target
    (tmp_path / "run").symlink_to(shared, target_is_directory=True)
    check_writable(tmp_path / "out.json", "--out-file")
    check_writable_folder(tmp_path / "run", "--output_dir")
    (tmp_path / "gone").symlink_to(tmp_path / "missing", target_is_directory=True)
    with pytest.raises(InputError, match=f"gone: --output_dir is a symlink to {tmp_path}/missing, which does not "
                                         "exist; create that folder"):
        check_writable_folder(tmp_path / "gone", "--output_dir")


# ---------------------------------------------------------------- a fine-tuning run's outputs
def test_staged_outputs_through_links_replace_the_targets_and_keep_the_links(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    out = tmp_path / "squad"
    out.mkdir()
    for name, content in (("pytorch_model.bin", b"old model"), ("predictions.json", b"old predictions")):
        (shared / name).write_bytes(content)
        (out / name).symlink_to(shared / name)
    with StagedOutputs(out, ["pytorch_model.bin", "bert_config.json", "predictions.json"]) as stage:
        stage.write("pytorch_model.bin", lambda f: f.write(b"new model"))
        stage.write_text("bert_config.json", "{}\n")
        stage.write_text("predictions.json", "{}\n")
        stage.commit()
    assert {p.name: os.readlink(p) for p in out.iterdir() if p.is_symlink()} == {
        "pytorch_model.bin": str(shared / "pytorch_model.bin"), "predictions.json": str(shared / "predictions.json")}
    assert (shared / "pytorch_model.bin").read_bytes() == b"new model"
    assert (shared / "predictions.json").read_text(encoding="utf-8") == "{}\n"
    assert sorted(p.name for p in shared.iterdir()) == ["predictions.json", "pytorch_model.bin"]
    assert sorted(p.name for p in out.iterdir()) == ["bert_config.json", "predictions.json", "pytorch_model.bin"]


def test_a_signal_that_python_swallowed_during_the_write_still_stops_the_commit(tmp_path):
    """A Ctrl-C landing in a weakref callback (h5py runs many while a shard is written) is printed as "Exception
    ignored" and dropped by Python: the shard was committed and the command exited 0 (issue 48)."""
    import signal
    import weakref

    from bertrecipe.common.stop_signals import forget_signals, raise_on_signal

    class Registered:
        pass

    def write_and_be_interrupted_in_a_callback(f):
        f.write(b"half of it")
        dropped = Registered()
        callback = weakref.ref(dropped, lambda ref: raise_on_signal(signal.SIGINT, None))  # noqa: F841
        del dropped  # the callback runs now, its KeyboardInterrupt swallowed
        f.write(b" and the rest")

    forget_signals()
    try:
        with pytest.raises(KeyboardInterrupt):
            write_atomic(tmp_path / "shard.hdf5", write_and_be_interrupted_in_a_callback)
    finally:
        forget_signals()
    assert list(tmp_path.iterdir()) == []
