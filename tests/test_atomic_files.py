"""atomic_files: the one temporary-name scheme, and which leftovers the next write of an output removes."""
import os

import pytest

from bertrecipe.common.atomic_files import atomic_output, remove_stale_temporaries, write_atomic, write_temporary

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
