"""A signal to a command that has no handler of its own (data preparation, fine-tuning, conversion) ends it with
one line and the shell's status for it (143 for SIGTERM, 130 for Ctrl-C), and what it was writing is not left
behind: SIGTERM's default action used to kill it silently mid-write, leaving a temporary file (issue 41)."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ENV, GLUE_EXCERPTS, REPO_ROOT, TEST_DATA, VOCAB_EXCERPT


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
    # the shard's temporary: the write has begun
    stderr = signal_once(process, lambda: list(out.glob(".shard.hdf5.*.tmp")), sent, deadline=240, poll=0.01)
    assert (process.returncode, stderr.splitlines()) == (status, [stop_line(said)])
    assert list(out.iterdir()) == []


def stop_line(said: str) -> str:
    return f"{said}: stopped before the end; nothing half-written was kept, run the command again to finish"


def signal_once(process: subprocess.Popen, ready, sent: int, deadline: float, poll: float) -> str:
    """Sends `sent` to the process once ready() is true (it must still run by then), and returns its stderr."""
    try:
        end = time.monotonic() + deadline
        while not ready():
            assert process.poll() is None and time.monotonic() < end, process.communicate()
            time.sleep(poll)
        process.send_signal(sent)
        return process.communicate(timeout=60)[1]
    finally:
        process.kill()


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
    stderr = signal_once(process, lambda: torch_is_loading(process.pid), sent, deadline=60, poll=0.002)
    assert (process.returncode, stderr.splitlines()) == (status, [stop_line(said)])


SIGNAL_AS_THE_ENTRY_POINT_IMPORTS = """
import os, signal, sys

def signal_on_import(event, args):  # the signal as the entry point starts importing the commands' front
    if event == "import" and args[0] == "bertrecipe.cli.command_line":
        os.kill(os.getpid(), int(sys.argv[1]))

sys.addaudithook(signal_on_import)
from bertrecipe.cli.entry import bert_prep
bert_prep()
"""


@pytest.mark.parametrize("sent, status, said", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                                (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_as_the_entry_point_itself_imports_is_one_line(sent, status, said):
    """A Ctrl-C 57 ms into bertPrep, as its entry point imported the parser's module, was Python's traceback and
    a death by SIGINT (the CI run of stop 57): the entry point's first line now answers signals."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_AS_THE_ENTRY_POINT_IMPORTS, str(int(sent)), "--help"],
                          env=ENV, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (status, "", [stop_line(said)])


def test_a_signal_the_command_was_started_ignoring_stays_ignored():
    """`python run_squad.py ... &` in a script starts with SIGINT ignored: the entry point keeps it so."""
    code = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nfrom bertrecipe.cli.entry import bert_prep\n"
            "from bertrecipe.common.stop_signals import handle_stop_signals\n"
            "before = signal.getsignal(signal.SIGINT)\nhandle_stop_signals()\n"
            "print(before is signal.SIG_IGN, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_the_entry_point_hands_its_start_up_handler_to_the_command_s_own():
    """After start-up a signal is raised where the command is (its outputs are discarded on the way out), no longer
    an immediate exit."""
    code = ("import signal\nfrom bertrecipe.cli.entry import bert_prep\n"
            "from bertrecipe.common.stop_signals import handle_stop_signals, raise_on_signal\n"
            "before = signal.getsignal(signal.SIGTERM).__name__\nhandle_stop_signals()\n"
            "print(before, signal.getsignal(signal.SIGTERM) is raise_on_signal, "
            "signal.getsignal(signal.SIGINT) is raise_on_signal)")
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["_end_while_starting", "True", "True"], done.stderr


def processes_naming(text: str) -> list[int]:
    """The live processes whose command line holds `text` (a test's own folder: the command and its children)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(int(entry.name))
        except OSError:  # ended meanwhile
            continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sent, to_group, delay, status, said", [
    (signal.SIGINT, True, 1.5, 130, "interrupted (Ctrl-C)"),  # the runs still import
    (signal.SIGTERM, False, 5, 143, "SIGTERM")])  # the runs train
def test_a_signal_while_run_downstream_runs_its_children_ends_them_all_in_one_line(tiny_bert, tmp_path, sent,
                                                                                   to_group, delay, status, said):
    """Ctrl-C reaches the terminal's whole process group, the command and its runs; Slurm's or a user's SIGTERM may
    reach the command alone: either way one line, the shell's status and no run left behind."""
    data = tmp_path / "data"
    shutil.copytree(GLUE_EXCERPTS / "RTE", data / "RTE")
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "run_downstream.py"), "--init_checkpoint", str(tiny_bert), "--data_dir",
         str(data), "--output_dir", str(out), "--do_lower_case", "--preset", "cpu_tiny", "--workers", "2"],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while " started " not in process.stdout.readline():  # a run's process is up
            assert process.poll() is None, process.communicate()
        time.sleep(delay)
        os.killpg(process.pid, sent) if to_group else process.send_signal(sent)
        start = time.monotonic()
        _, stderr = process.communicate(timeout=60)
        seconds = time.monotonic() - start
    finally:
        process.kill()
    assert (process.returncode, stderr.splitlines()) == (status, [stop_line(said)])
    assert seconds < 10 and processes_naming(str(out)) == []


SIGNAL_IN_A_CALLBACK = """
import os, signal, sys, time, weakref
from bertrecipe.cli.command_line import run_cli

def main():
    class Registered:
        pass

    def callback(ref):  # as h5py's registry's: Python swallows what is raised here
        os.kill(os.getpid(), int(sys.argv[1]))
        time.sleep(0.5)  # the handler runs inside the callback

    dropped = Registered()
    keep = weakref.ref(dropped, callback)
    del dropped
    time.sleep(5)  # the signal was delivered again: raised here
    print("the command went on")

run_cli(main)
"""


@pytest.mark.parametrize("sent, status, said", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                                (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_python_swallows_in_a_weakref_callback_still_stops_the_command(sent, status, said):
    """Python prints "Exception ignored in ..." and drops a KeyboardInterrupt raised in a weakref callback; a
    shard's write (h5py runs many) then went on to commit it and exit 0 (issue 48)."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_CALLBACK, str(int(sent))], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (status, "", [stop_line(said)])


SIGNAL_TURNED_INTO_AN_ERROR = """
import os, signal, sys, time
from bertrecipe.cli.command_line import run_cli

def main():
    try:  # as h5py's type conversion does with a Ctrl-C that lands in it
        os.kill(os.getpid(), int(sys.argv[1]))
        time.sleep(5)
    except BaseException:
        raise TypeError("Operation not defined for data type class") from None
    print("the command went on")

run_cli(main)
"""


@pytest.mark.parametrize("sent, status, said", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                                (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_that_a_library_turns_into_an_error_of_its_own_still_ends_in_one_line(sent, status, said):
    """Ctrl-C while a shard's attributes were written came out of h5py as a TypeError: a 40-line traceback and
    exit 1 instead of the signal's line and status (the CI run of stop 56)."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_TURNED_INTO_AN_ERROR, str(int(sent))], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (status, "", [stop_line(said)])


SIGNAL_TURNED_INTO_AN_ERROR_IN_A_RUN = """
import argparse, os, sys, time
from bertrecipe.cli.command_line import run_cli
from bertrecipe.cli.run_pretraining import run_in_process_group

def run_with(args, ctx):
    try:  # as h5py does with a Ctrl-C that lands in its type conversion while a run reads or writes
        os.kill(os.getpid(), int(sys.argv[1]))
        time.sleep(5)
    except BaseException:
        raise TypeError("Operation not defined for data type class") from None

run_cli(lambda: run_in_process_group(argparse.Namespace(no_cuda=True, output_dir=sys.argv[2]), run_with))
"""


@pytest.mark.parametrize("sent, status, said", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                                (signal.SIGTERM, 143, "stopped by SIGTERM outside the steps")])
def test_a_signal_a_library_turns_into_an_error_in_a_run_still_names_the_checkpoint(tmp_path, sent, status, said):
    """run_pretraining.py and general_distill.py end a stopped run naming the checkpoint to resume from; a signal
    that came out of a library as another error ended in run_cli's general line instead."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_TURNED_INTO_AN_ERROR_IN_A_RUN, str(int(sent)), str(tmp_path)],
                          env=ENV, capture_output=True, text=True, timeout=60)
    expected = f"{said}: no checkpoint in {tmp_path} yet"
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (status, "", [expected])


NO_SIGNAL_BUT_AN_ERROR = SIGNAL_TURNED_INTO_AN_ERROR.replace("os.kill(os.getpid(), int(sys.argv[1]))",
                                                             "raise RuntimeError('no signal')")


def test_an_error_with_no_signal_received_is_still_the_error():
    done = subprocess.run([sys.executable, "-c", NO_SIGNAL_BUT_AN_ERROR, "2"], env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "TypeError: Operation not defined for data type class"


WAIT_FOR_OWN_SIGNAL = """
import os, signal, sys, threading
from bertrecipe.common.stop_signals import handle_stop_signals, stop_signal_within
handle_stop_signals()
print(type(stop_signal_within(0.05)).__name__)  # nothing sent: None after the wait
threading.Timer(0.2, os.kill, (os.getpid(), getattr(signal, sys.argv[1]))).start()
print(type(stop_signal_within(30)).__name__)  # arrives during the wait: returned, not raised
print(type(stop_signal_within(30)).__name__)  # already received: returned at once
"""


@pytest.mark.parametrize("sent, exception", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
def test_a_process_whose_peers_have_gone_waits_a_moment_for_its_own_stop_signal(sent, exception):
    """run_pretraining.py's processes: one that sees its peers gone (they stopped on a Ctrl-C or SIGTERM sent to
    the whole job) takes the signal that reaches it a moment later as its own end, not as an error."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WAIT_FOR_OWN_SIGNAL, sent], capture_output=True, text=True,
                          env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NoneType", exception, exception]
    assert time.monotonic() - started < 20  # the signal ended the wait, not the 30 s
