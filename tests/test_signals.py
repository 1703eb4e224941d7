"""A signal to a command that has no handler of its own (data preparation, fine-tuning, conversion) ends it with
one line and the shell's status for it (143 for SIGTERM, 130 for Ctrl-C), and what it was writing is not left
behind: SIGTERM's default action used to kill it silently mid-write, leaving a temporary file (issue 41)."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ENV, REPO_ROOT, TEST_DATA, VOCAB_EXCERPT


@pytest.fixture(scope="module")
def long_text(tmp_path_factory):
    """About 9 MB of a book, documents of its paragraphs: a shard that takes seconds to write."""
    book = (TEST_DATA / "books" / "pg1661.txt").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("text") / "long.txt"
    path.write_text(book * 16, encoding="utf-8")
    return path


@pytest.mark.parametrize("sent, status, said", [(signal.SIGTERM, 143, "SIGTERM"),
                                                (signal.SIGINT, 130, "interrupted (Ctrl-C)")])
def test_a_signal_while_a_shard_is_written_is_one_line_and_leaves_nothing(long_text, tmp_path, sent, status, said):
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "data" / "create_pretraining_data.py"), "--input_file", str(long_text),
         "--output_file", str(out / "shard.hdf5"), "--vocab_file", str(VOCAB_EXCERPT), "--dupe_factor", "2",
         "--compression", "gzip"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob(".shard.hdf5.*.tmp")):  # the shard's temporary: the write has begun
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.01)
        process.send_signal(sent)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == status, stderr
    assert stderr.strip().splitlines() == [f"{said}: stopped before the end; nothing half-written was kept, run the "
                                           "command again to finish"], stderr
    assert list(out.iterdir()) == []


def torch_is_loading(pid: int) -> bool:
    """True once the process has mapped torch's library: it is inside its imports, a second or more from main()."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run_downstream.py", "run_retrieval.py", "run_pretraining.py",
                                     "inference.py", ".venv/bin/run_retrieval"])
@pytest.mark.parametrize("sent, status, said", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                                (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_while_the_command_still_imports_is_one_line(command, sent, status, said):
    """Ctrl-C in a command's first second, while torch imports, was Python's 39-line traceback (issue 48)."""
    script = REPO_ROOT / command
    if not script.exists():
        pytest.skip(f"{command} is made by `pip install -e .` (scripts/test.sh)")
    launch = [str(script)] if command.startswith(".venv") else [sys.executable, str(script)]
    process = subprocess.Popen([*launch, "--help"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + 60
        while not torch_is_loading(process.pid):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.002)
        process.send_signal(sent)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert (process.returncode, stderr.splitlines()) == (status, [
        f"{said}: stopped before the end; nothing half-written was kept, run the command again to finish"])
