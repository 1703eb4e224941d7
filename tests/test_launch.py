"""bertrecipe.cli.launch (torchrun in one process, issue 32): the launch ends with the workers' own exit status and
their own lines, no torchrun traceback or summary; signals reach the workers, which get time to finish; the log
copy never truncates an earlier log and is not created for refused arguments. Workers are tiny scripts."""
import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bertrecipe.cli import launch
from bertrecipe.common.errors import InputError
from helpers import permissions_are_ignored

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
NOISE = ("Traceback", "ChildFailedError", "SignalException", "failed (exitcode", "FAILED")

# A worker that does what its first argument says; the others are that mode's settings.
WORKER = textwrap.dedent("""\
    import os, signal, sys, time
    mode, rank = sys.argv[1], int(os.environ["RANK"])
    if mode == "refuse":  # an entry point's argument error: its one line, exit 2 (run_cli)
        print("warming up")
        print("error: --vocab_file x.txt: vocab file not found", file=sys.stderr)
        sys.exit(2)
    if mode == "fail":  # rank r waits argv[3 + 2r] seconds, then exits with status argv[2 + 2r] ("kill": SIGKILL)
        time.sleep(float(sys.argv[3 + 2 * rank]))
        if sys.argv[2 + 2 * rank] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(int(sys.argv[2 + 2 * rank]))
    if mode == "write":  # writes the run's JSON (argv[2]) after its checks, then prints and exits argv[3]
        print("checking the arguments")
        with open(sys.argv[2], "a") as f:
            f.write("DLLL {}\\n")
        print("training", flush=True)
        print("a warning", file=sys.stderr)
        sys.exit(int(sys.argv[3]))
    stop = []
    if mode == "term":  # as run_pretraining.py: a SIGTERM finishes the step, then exit argv[2]
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:  # from before "started": a Ctrl-C right after it must not fall outside the handler
        print(f"started {rank}", flush=True)
        while not stop:
            time.sleep(0.05)
    except KeyboardInterrupt:  # as run_cli: Ctrl-C is one line and exit 130
        print(f"interrupted (Ctrl-C) {rank}", file=sys.stderr)
        sys.exit(130)
    time.sleep(0.5)  # the step and checkpoint
    print(f"stopped by SIGTERM {rank}", file=sys.stderr)
    sys.exit(int(sys.argv[2]))
""")


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def command(*args, log=()):
    return [sys.executable, "-m", "bertrecipe.cli.launch", *map(str, log), "--standalone", *map(str, args)]


def launch_run(*args, log=(), cwd=None):
    return subprocess.run(command(*args, log=log), env=ENV, capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_quiet(stderr):
    for noise in NOISE:
        assert noise not in stderr, stderr


def start(tmp_path, *args, log=(), lines=1):
    """The launch in a session of its own (as a terminal's job), once its workers printed `lines` lines."""
    out = (tmp_path / "stdout").open("w")
    process = subprocess.Popen(command(*args, log=log), env=ENV, stdout=out, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    deadline = time.time() + 60
    while (tmp_path / "stdout").read_text().count("started") < lines:
        assert process.poll() is None and time.time() < deadline, process.communicate()
        time.sleep(0.1)
    return process


@pytest.mark.slow
def test_a_refused_argument_is_the_workers_line_alone_and_its_exit_status(worker):
    result = launch_run("--nproc_per_node=1", worker, "refuse")
    assert result.returncode == 2
    assert result.stderr == "error: --vocab_file x.txt: vocab file not found\n"
    assert result.stdout == "warming up\n"


@pytest.mark.slow
def test_the_first_failure_gives_the_exit_status_and_a_signal_death_is_128_plus_n(worker):
    # Rank 1 fails first (status 3, at once), rank 0 later (status 5): the launch says 3.
    result = launch_run("--nproc_per_node=2", worker, "fail", 5, 1.5, 3, 0)
    assert result.returncode == 3
    assert_quiet(result.stderr)
    result = launch_run("--nproc_per_node=1", worker, "fail", "kill", 0)
    assert result.returncode == 128 + signal.SIGKILL
    assert_quiet(result.stderr)


def test_exit_status_of_a_worker_killed_by_a_signal():
    assert launch.exit_status(-signal.SIGKILL) == 137 and launch.exit_status(2) == 2 and launch.exit_status(0) == 0


@pytest.mark.slow
@pytest.mark.parametrize("value, problem", [("abc", "Unsupported nproc_per_node value"), ("0", "at least 1")])
def test_a_bad_process_count_is_one_line(worker, value, problem):
    result = launch_run(f"--nproc_per_node={value}", worker, "refuse")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: --nproc_per_node {value}: ") and problem in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.slow
def test_ctrl_c_reaches_every_worker_once_and_the_launch_exits_130(worker, tmp_path):
    """The terminal signals the launcher's process group; torchrun put each worker in a session of its own, so
    only the launcher can hand the signal on. No torchrun traceback, no SignalException."""
    process = start(tmp_path, "--nproc_per_node=2", worker, "int", lines=2)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    # Found in the text, not line by line: the two workers' writes to the shared stderr may interleave.
    interrupted = sorted(re.findall(r"interrupted \(Ctrl-C\) \d", stderr))
    assert interrupted == ["interrupted (Ctrl-C) 0", "interrupted (Ctrl-C) 1"]
    assert_quiet(stderr)


@pytest.mark.slow
@pytest.mark.parametrize("status", [143, 0])
def test_sigterm_lets_the_workers_finish_and_their_status_passes_through(worker, tmp_path, status):
    """143: stopped early, checkpoint written; 0: the SIGTERM came during the last step, the run is complete."""
    process = start(tmp_path, "--nproc_per_node=2", worker, "term", status, lines=2)
    process.send_signal(signal.SIGTERM)  # to the launcher alone (docker stop, kill)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == status
    assert stderr.count("stopped by SIGTERM") == 2
    assert_quiet(stderr)


@pytest.mark.slow
def test_workers_still_running_after_the_shutdown_timeout_are_killed(worker, tmp_path):
    process = start(tmp_path, "--nproc_per_node=1", "--shutdown_timeout=1", worker, "stubborn")
    process.send_signal(signal.SIGTERM)
    # The worker ignores SIGTERM for good: only the launch's kill after --shutdown_timeout ends it (the
    # communicate timeout only keeps a broken launch from hanging the suite).
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGKILL
    assert "workers still running 1 s after SIGTERM: killed" in stderr
    assert_quiet(stderr)


@pytest.mark.slow
def test_a_refused_run_creates_no_log_and_no_folder(worker, tmp_path):
    out = tmp_path / "results" / "squad"
    log = ("--log_file", out / "logfile.txt", "--log_after", out / "dllogger.json")
    result = launch_run("--nproc_per_node=1", worker, "refuse", log=log)
    assert result.returncode == 2 and result.stderr == "error: --vocab_file x.txt: vocab file not found\n"
    assert result.stdout == "warming up\n"  # the console still gets everything
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_the_log_is_appended_after_a_line_naming_the_run_never_truncated(worker, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "logfile.txt").write_text("exact_match: 81.2 F1: 88.6\nlast line cut off")  # an earlier run's log
    log = ("--log_file", out / "logfile.txt", "--log_after", out / "dllogger.json")
    refused = launch_run("--nproc_per_node=1", worker, "refuse", log=log)  # a typo: the old log stays as it was
    assert refused.returncode == 2
    assert (out / "logfile.txt").read_text() == "exact_match: 81.2 F1: 88.6\nlast line cut off"
    result = launch_run("--nproc_per_node=1", worker, "write", out / "dllogger.json", 0, log=log)
    assert result.returncode == 0, result.stderr
    lines = (out / "logfile.txt").read_text().splitlines()
    assert lines[:2] == ["exact_match: 81.2 F1: 88.6", "last line cut off"]
    assert lines[2].startswith("===== run started ")
    assert lines[2].endswith(f"worker.py write {out}/dllogger.json 0 =====")
    # Held until the JSON was written, then all of it, stdout and stderr, whole lines.
    assert sorted(lines[3:]) == ["a warning", "checking the arguments", "training"]


@pytest.mark.slow
def test_a_failed_run_past_its_checks_is_logged_and_a_run_without_log_after_logs_at_once(worker, tmp_path):
    log = tmp_path / "log.txt"
    result = launch_run("--nproc_per_node=1", worker, "write", tmp_path / "j.json", 1,
                        log=("--log_file", log, "--log_after", tmp_path / "j.json"))
    assert result.returncode == 1 and "training" in log.read_text()
    result = launch_run("--nproc_per_node=1", worker, "refuse", log=("--log_file", tmp_path / "plain.txt"))
    assert result.returncode == 2 and "vocab file not found" in (tmp_path / "plain.txt").read_text()


@pytest.mark.slow
def test_a_log_that_cannot_be_written_is_one_warning_and_the_run_goes_on(worker, tmp_path):
    result = launch_run("--nproc_per_node=1", worker, "write", tmp_path / "j.json", 0, log=("--log_file", "/dev/full"))
    assert result.returncode == 0
    assert "warning: /dev/full: cannot write the log (No space left on device)" in result.stderr
    assert "training" in result.stdout and "a warning" in result.stderr
    assert_quiet(result.stderr)


@pytest.mark.parametrize("case", ["folder", "under a file", "read-only folder"])
def test_an_unusable_log_file_is_refused_before_anything_runs(tmp_path, case, capsys):
    if case == "read-only folder" and permissions_are_ignored():
        pytest.skip("root writes into read-only folders")
    (tmp_path / "file").write_text("")
    (tmp_path / "locked").mkdir()
    path = {"folder": tmp_path, "under a file": tmp_path / "file" / "log.txt",
            "read-only folder": tmp_path / "locked" / "log.txt"}[case]
    (tmp_path / "locked").chmod(0o555)
    try:
        with pytest.raises(SystemExit) as stop:
            launch.run_launch(["--log_file", str(path), "--standalone", "--nproc_per_node=1", "never_run.py"])
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {path}: --log_file ") and error.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "locked"]
    assert not list((tmp_path / "locked").iterdir())


def test_own_options_come_first_in_either_spelling():
    options, rest = launch.split_options(["--log_file=a.txt", "--log_after", "b.json", "--standalone", "x.py"])
    assert (options.log_file, options.log_after, rest) == (Path("a.txt"), Path("b.json"), ["--standalone", "x.py"])
    options, rest = launch.split_options(["--nproc_per_node=2", "x.py", "--log_file", "y"])
    assert options.log_file is None and rest == ["--nproc_per_node=2", "x.py", "--log_file", "y"]  # the script's


def test_log_after_without_log_file_is_refused(capsys):
    with pytest.raises(SystemExit):
        launch.split_options(["--log_after", "b.json", "x.py"])
    assert capsys.readouterr().err == "error: --log_after: needs --log_file\n"


def test_the_log_keeps_each_streams_lines_whole_and_holds_output_until_the_json_is_written(tmp_path):
    log = launch.LogCopy(launch.LogOptions(tmp_path / "log.txt", tmp_path / "j.json"), "== header ==\n")
    log.feed(1, b"loading the mo")
    log.feed(2, b"warning: one\n")
    log.feed(1, b"del\n")
    assert not (tmp_path / "log.txt").exists()  # held: the run has not shown it got past its checks
    (tmp_path / "j.json").write_text("DLLL {}\n")
    log.feed(2, b"step 1\nstep 2 (no newline yet)")
    assert (tmp_path / "log.txt").read_text() == "== header ==\nwarning: one\nloading the model\nstep 1\n"
    log.finish(2)  # a failure after the run started is logged, its last partial line too
    assert (tmp_path / "log.txt").read_text().endswith("step 1\nstep 2 (no newline yet)\n")


def test_a_refusal_before_the_json_is_written_leaves_no_log_but_a_large_output_opens_it(tmp_path):
    log = launch.LogCopy(launch.LogOptions(tmp_path / "log.txt", tmp_path / "j.json"), "== header ==\n")
    log.feed(2, b"error: --x: bad\n")
    log.finish(2)
    assert not (tmp_path / "log.txt").exists()
    log = launch.LogCopy(launch.LogOptions(tmp_path / "log.txt", tmp_path / "j.json"), "== header ==\n")
    log.feed(1, b"x" * 100 + b"\n")
    log.finish(130)  # Ctrl-C before the JSON: the attempt is logged
    assert (tmp_path / "log.txt").read_text() == "== header ==\n" + "x" * 100 + "\n"
    big = launch.LogCopy(launch.LogOptions(tmp_path / "big.txt", tmp_path / "j2.json"), "")
    big.feed(1, (b"y" * 999 + b"\n") * (launch.HOLD_LIMIT // 1000 + 1))
    assert (tmp_path / "big.txt").stat().st_size > launch.HOLD_LIMIT  # no unbounded memory


def test_a_log_write_failure_gives_up_the_log_with_one_warning(tmp_path, monkeypatch):
    log = launch.LogCopy(launch.LogOptions(tmp_path / "log.txt"), "")
    warnings = tmp_path / "console"
    log.console = os.open(warnings, os.O_WRONLY | os.O_CREAT)
    real_write = os.write

    def full(fd, data):
        if fd == log.console:
            return real_write(fd, data)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    log.feed(1, b"one\n")
    log.feed(1, b"two\n")
    log.finish(0)
    monkeypatch.undo()
    os.close(log.console)
    assert warnings.read_text() == (f"warning: {tmp_path / 'log.txt'}: cannot write the log (No space left on "
                                    "device); the output goes on to the console only\n")
    with pytest.raises(InputError):  # the checks the launch makes first are metric_logger's
        launch.check_log_file(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--standalone", "--nproc_per_node=2"]])
def test_no_training_script_is_one_line_naming_it_and_exit_2(args):
    """torchrun printed its 19-line usage here; now it is one line like every other refused argument."""
    result = subprocess.run([sys.executable, "-m", "bertrecipe.cli.launch", *args], env=ENV, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: python -m bertrecipe.cli.launch: no training script given")
    assert result.stderr.count("\n") == 1


# Each torchrun refused with its usage, a traceback or (for a signal name) a warning with a traceback.
REFUSED = [
    (["--no_such_option"], "unrecognized arguments: --no_such_option"),
    (["--monitor_interval", "often"], "invalid float value: 'often'"),
    (["--nnodes", "2:1"], "min_nodes must be > 0 and <= max_nodes"),
    (["--max_restarts", "-1"], "max_restarts must be >= 0"),
    (["--local_ranks_filter", "first"], "--local_ranks_filter must be a comma-separated list of integers"),
    (["--redirects", "9"], "9 does not match"),
    (["--rdzv_conf", "timeout"], "option 'timeout' must have a value"),
    (["--no_python", "-m"], "--no-python' flag and the '--module' flag"),
    (["--master_port", "99999999"], "port number of the rendezvous endpoint '127.0.0.1:99999999'"),
    (["--rdzv_backend", "c10d", "--rdzv_endpoint", "host:port"], "port number of the rendezvous endpoint 'host:port'"),
    (["--shutdown_timeout", "-5"], "--shutdown_timeout -5: must be 0 or more seconds"),
    (["--signals_to_handle", "SIGTERM,SIGFOO"], "SIGFOO is not a signal"),
    (["--log_dir", "{file}"], "--log_dir exists and is a file"),
]


@pytest.mark.parametrize("args, problem", REFUSED, ids=[" ".join(args) for args, _ in REFUSED])
def test_torchrun_argument_errors_are_one_line_and_nothing_runs(tmp_path, capsys, args, problem):
    script = tmp_path / "script.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (tmp_path / "a_file").write_text("")
    args = [arg.replace("{file}", str(tmp_path / "a_file")) for arg in args]
    with pytest.raises(SystemExit) as stop:
        launch.run_launch([*args, str(script)])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert problem in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "ran").exists()


def test_an_unusable_shutdown_timeout_variable_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5min")
    with pytest.raises(SystemExit) as stop:
        launch.run_launch(["--standalone", str(tmp_path / "never_run.py")])
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("error: TORCH_ELASTIC_SHUTDOWN_TIMEOUT=5min: not a whole number of seconds; "
                                       "set it to one, or unset it\n")
