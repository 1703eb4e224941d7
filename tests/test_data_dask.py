"""text_formatting, sharding and create_hdf5_files on Dask (data/engine.py): a real scheduler and two workers on
127.0.0.1 make the same files, byte for byte or array for array, as local processes; engine errors are one line,
exit 2, before anything is written."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import h5py
import numpy as np
import pytest

from bertrecipe.common.stop_signals import stop_line
from bertrecipe.dataprep import engine, layout
from bertrecipe.dataprep.sharding import split_sentences
from bertrecipe.dataprep.text_formatting import book_text
from helpers import REPO_ROOT, TEST_DATA, held_ports, write_formatted

pytest.importorskip("distributed")
PYTHON = sys.executable
FLAGS = ["--dataset", "bookscorpus", "--n_training_shards", "4", "--n_test_shards", "1", "--max_seq_length", "64",
         "--max_predictions_per_seq", "10", "--dupe_factor", "2"]
PARAMS = layout.InstanceParams(True, 64, 10, 0.15, 12345, 2)
# Without a dashboard Dask still serves /health on all interfaces: keep it on the loopback too.
LOOPBACK_HTTP = ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]


@dataclass
class Cluster:
    scheduler_file: Path
    address: str
    workers: set[str]


def _wait_for(check: Callable[[], object], what: str, procs: list[subprocess.Popen], logs: list[Path],
              timeout: float = 60) -> object:
    """check()'s first truthy value; fails with the logs when a process died or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    pytest.fail(f"{what} did not happen: " + " | ".join(log.read_text()[-2000:] for log in logs if log.exists()))


def _read_address(path: Path) -> str | None:
    try:
        return json.loads(path.read_text())["address"]
    except (OSError, ValueError, KeyError):
        return None


def _worker_address(log: Path) -> str | None:
    text = log.read_text() if log.exists() else ""
    match = re.search(r"Start worker at:\s+(tcp://\S+)", text)
    return match.group(1) if match and "Registered to:" in text else None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("dask")
    scheduler_file = folder / "scheduler.json"
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []

    def start(name: str, args: list[str]) -> Path:
        log = folder / f"{name}.log"
        logs.append(log)
        with open(log, "w") as out:  # -P: as data/prep.sub starts them, nothing in the cwd shadows a package
            procs.append(subprocess.Popen([PYTHON, "-P", "-m", *args], cwd=folder, stdout=out,
                                          stderr=subprocess.STDOUT))
        return log

    try:
        start("scheduler", ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                            *LOOPBACK_HTTP, "--scheduler-file", str(scheduler_file)])
        address = _wait_for(lambda: _read_address(scheduler_file), "scheduler start", procs, logs)
        worker_logs = [start(f"worker{i}", ["distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file),
                                            "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
                                            *LOOPBACK_HTTP, "--memory-limit", "0"]) for i in range(2)]
        workers = {_wait_for(lambda log=log: _worker_address(log), "worker registration", procs, logs)
                   for log in worker_logs}
        yield Cluster(scheduler_file, str(address), workers)
    finally:
        for proc in reversed(procs):  # workers first: a worker whose scheduler is gone waits to reconnect
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A working dir with a small formatted and sharded corpus (5 text shards) of the two book excerpts."""
    root = tmp_path_factory.mktemp("corpus")
    sentences = [s for name in ("pg11.txt", "pg1661.txt")
                 for s in split_sentences(book_text(TEST_DATA / "books" / name))]
    # 8 sentences an article: about 30 articles for the 5 shards.
    write_formatted((" ".join(sentences[i:i + 8]) for i in range(0, len(sentences), 8)),
                   layout.formatted_text(root, "bookscorpus"))
    assert _prep(root, "--action", "sharding", *FLAGS).returncode == 0
    return root


@pytest.fixture()
def workdir(corpus, tmp_path) -> Path:
    shutil.copytree(corpus, tmp_path / "work")
    return tmp_path / "work"


def _prep(root: Path, *args: str, vocab: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "BERT_PREP_WORKING_DIR": str(root)}
    vocab_args = ["--vocab_file", str(vocab)] if vocab else []
    return subprocess.run([PYTHON, str(REPO_ROOT / "data" / "bertPrep.py"), *args, *vocab_args], env=env,
                          capture_output=True, text=True, timeout=300)


def _shards(folder: Path) -> dict[str, tuple[dict[str, np.ndarray], dict[str, object]]]:
    out = {}
    for path in sorted(folder.rglob("*.hdf5")):
        with h5py.File(path, "r") as f:
            out[str(path.relative_to(folder))] = ({k: f[k][:] for k in f}, dict(f.attrs))
    return out


def _assert_same_shards(a: Path, b: Path) -> None:
    first, second = _shards(a), _shards(b)
    assert len(first) == 5 and first.keys() == second.keys()
    for name, (arrays, attrs) in first.items():
        other_arrays, other_attrs = second[name]
        assert arrays.keys() == other_arrays.keys() and len(arrays) == 6, name
        for key, array in arrays.items():
            assert array.dtype == other_arrays[key].dtype and np.array_equal(array, other_arrays[key]), (name, key)
        assert attrs.keys() == other_attrs.keys() and all(np.all(attrs[k] == other_attrs[k]) for k in attrs), name


@pytest.mark.slow
def test_dask_workers_make_the_shards_of_local_processes(cluster, workdir, vocab_file):
    local = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--n_processes", "1", vocab=vocab_file)
    assert local.returncode == 0, local.stderr
    hdf5 = layout.hdf5_dir(workdir, PARAMS)
    hdf5.rename(workdir / "local")
    dask = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--scheduler_file", str(cluster.scheduler_file),
                 vocab=vocab_file)
    assert dask.returncode == 0, dask.stderr
    used = set(re.search(r"5 shards made by \d Dask workers: (.*)", dask.stdout).group(1).split())
    assert used and used <= cluster.workers  # the tasks ran on the test's workers, not in bertPrep's process
    _assert_same_shards(workdir / "local", hdf5)

    # By address this time, and only the missing shard is made again.
    missing = hdf5 / "bookscorpus" / "training" / "bookscorpus_training_2.hdf5"
    missing.unlink()
    again = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--scheduler", cluster.address, vocab=vocab_file)
    assert again.returncode == 0, again.stderr
    assert "4 of 5 shards already complete" in again.stdout and "1 shards made by 1 Dask workers" in again.stdout
    _assert_same_shards(workdir / "local", hdf5)


# bertPrep with small tasks (many per corpus), so that the work really spreads over the workers. The tasks carry
# their byte ranges and book groups, so the workers need no such setting.
SMALL_TASKS = """
import sys
from bertrecipe.cli import bert_prep as bertPrep
from bertrecipe.dataprep import sharding
from bertrecipe.dataprep import text_formatting
from bertrecipe.dataprep import corpus_sources
from bertrecipe.cli.command_line import run_cli
sharding.SEGMENT_BYTES = 20_000
text_formatting.BOOKS_PER_TASK = 4
corpus_sources.TASK_BYTES = 3_000
run_cli(bertPrep.main)
"""


def _books(root: Path) -> None:
    """30 books made of the embedded corpus's articles, five of them in a sub-folder."""
    from bertrecipe.dataprep.default_corpus import articles
    texts = list(articles())[:90]
    for i in range(30):
        path = layout.download_dir(root) / "bookscorpus" / ("more" if i > 24 else "") / f"book{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(texts[i::30]), encoding="utf-8")


def _text_outputs(root: Path) -> dict[str, bytes]:
    """Every file that text_formatting and sharding wrote, hidden ones (scratch folders) included."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "download" not in p.parts}


@pytest.mark.slow
def test_dask_workers_format_and_shard_the_bytes_of_this_process(cluster, tmp_path):
    local, remote = tmp_path / "local", tmp_path / "dask"
    for root in (local, remote):
        _books(root)
    for action in ("text_formatting", "sharding"):
        run = _prep(local, "--action", action, *FLAGS, "--n_processes", "1")
        assert run.returncode == 0, run.stderr
        run = subprocess.run([PYTHON, "-P", "-c", SMALL_TASKS.format(repo=str(REPO_ROOT)), "--action", action,
                              *FLAGS, "--scheduler_file", str(cluster.scheduler_file)],
                             env={**os.environ, "BERT_PREP_WORKING_DIR": str(remote)}, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        used = set(re.search(r"tasks ran on \d Dask workers: (.*)", run.stdout).group(1).split())
        assert used and used <= cluster.workers, run.stdout  # not in bertPrep's own process
    expected = _text_outputs(local)
    assert len(expected) == 6 and _text_outputs(remote) == expected


@pytest.mark.slow
def test_dask_workers_format_a_parquet_file_by_row_groups_into_the_bytes_of_this_process(cluster, tmp_path):
    """--dataset custom: one Parquet file of 15 row groups is many tasks (corpus_sources.TASK_BYTES made small), run
    on the workers; exact duplicates spread over the row groups are dropped across the tasks alike."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertrecipe.dataprep.default_corpus import articles

    texts = list(articles())[:120]
    rows = [{"text": text, "score": i % 3} for i, text in enumerate(texts + texts[10:30])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "web.parquet", row_group_size=10)
    flags = ["--action", "text_formatting", "--dataset", "custom", "--source", f"web={tmp_path / 'web.parquet'}",
             "--filter", "score>=1", "--dedup"]
    local, remote = tmp_path / "local", tmp_path / "dask"
    run = _prep(local, *flags, "--n_processes", "1")
    assert run.returncode == 0, run.stderr
    run = subprocess.run([PYTHON, "-P", "-c", SMALL_TASKS, *flags, "--scheduler_file", str(cluster.scheduler_file)],
                         env={**os.environ, "BERT_PREP_WORKING_DIR": str(remote)}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    used = set(re.search(r"tasks ran on \d Dask workers: (.*)", run.stdout).group(1).split())
    assert used and used <= cluster.workers, run.stdout
    name = "formatted_one_article_per_line/custom_web_one_article_per_line.txt"
    formatted = (local / name).read_bytes()
    assert (remote / name).read_bytes() == formatted
    kept = [" ".join(r["text"].split()) for r in rows if r["score"] >= 1]
    first_copies = list(dict.fromkeys(kept))
    assert len(first_copies) < len(kept) and formatted.decode("utf-8") == "".join(f"{t}\n\n" for t in first_copies)


def _one_line_refusal(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(w in lines[0] for w in words), run.stderr


@pytest.mark.slow
def test_unreachable_scheduler_is_one_line_and_leaves_no_shard_folder(workdir, vocab_file):
    with held_ports() as [port]:  # bound and never listening: nothing can answer there
        address = f"tcp://127.0.0.1:{port}"
        run = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--scheduler", address, "--scheduler_timeout",
                    "2", vocab=vocab_file)
    _one_line_refusal(run, "--scheduler", address, "no Dask scheduler answered", "within 2 s")
    assert not layout.hdf5_dir(workdir, PARAMS).exists()

    missing = workdir / "nowhere" / "scheduler.json"
    run = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--scheduler_file", str(missing),
                "--scheduler_timeout", "1", vocab=vocab_file)
    _one_line_refusal(run, str(missing), "dask scheduler --scheduler-file")
    assert not layout.hdf5_dir(workdir, PARAMS).exists()


@pytest.mark.parametrize("flags, words", [
    (["--action", "create_vocab", "--scheduler", "tcp://127.0.0.1:1"], ["--engine", "not create_vocab"]),
    (["--action", "create_hdf5_files", "--engine", "dask"], ["--engine dask", "--scheduler"]),
    (["--action", "create_hdf5_files", "--engine", "slurm", "--scheduler", "tcp://127.0.0.1:1"], ["--scheduler"]),
    (["--action", "create_hdf5_files", "--engine", "slurm", "--slurm_jobs", "0"], ["--slurm_jobs"]),
])
def test_inconsistent_engine_flags_are_one_line(tmp_path, flags, words):
    run = _prep(tmp_path, *flags, *FLAGS[:2])
    _one_line_refusal(run, *words)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_to_a_dask_client_is_one_line_keeps_the_workers_and_leaves_nothing_half_written(cluster, workdir,
                                                                                              vocab_file):
    """The tasks run on the user's Dask workers, which bertPrep neither started nor ends; a task already running
    when the signal came ends on its worker (Dask cannot interrupt it), its shard renamed into place whole."""
    local = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--n_processes", "1", vocab=vocab_file)
    assert local.returncode == 0, local.stderr
    layout.hdf5_dir(workdir, PARAMS).rename(workdir / "local")
    stderr = workdir.parent / "stderr.txt"
    with open(stderr, "wb") as err:
        process = subprocess.Popen([PYTHON, str(REPO_ROOT / "data" / "bertPrep.py"), "--action", "create_hdf5_files",
                                    *FLAGS, "--vocab_file", str(vocab_file), "--scheduler_file",
                                    str(cluster.scheduler_file)], env={**os.environ, "BERT_PREP_WORKING_DIR":
                                    str(workdir)}, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not layout.hdf5_dir(workdir, PARAMS).exists():  # made once the scheduler answered
            assert process.poll() is None and time.monotonic() < deadline, stderr.read_text()
            time.sleep(0.005)
        os.killpg(process.pid, signal.SIGINT)
        signalled = time.monotonic()
        assert process.wait(timeout=5) == 130
        assert time.monotonic() - signalled < 5
    finally:
        process.kill()
        process.wait()
    assert stderr.read_text().splitlines() == [stop_line("interrupted (Ctrl-C)")]
    deadline = time.monotonic() + 30  # the tasks that were running end on their workers
    while list(workdir.rglob(".*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(workdir.rglob(".*.tmp")) == []
    again = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--scheduler_file", str(cluster.scheduler_file),
                  vocab=vocab_file)
    assert again.returncode == 0 and again.stderr == "", again.stderr  # the same workers, still there
    _assert_same_shards(workdir / "local", layout.hdf5_dir(workdir, PARAMS))


@pytest.mark.slow
def test_closing_in_order_early_on_dask_stops_waiting_for_the_running_tasks(cluster):
    config = engine.EngineConfig("dask", scheduler_file=cluster.scheduler_file)
    with engine.open_runner(config) as run:
        results = engine.in_order(run, time.sleep, [(0.0,), (6.0,), (6.0,)])
        assert next(results) is None
        began = time.monotonic()
        results.close()
        assert time.monotonic() - began < 3  # not the 6 s of the tasks that run on


# ---------------------------------------------------------------- data/prep.sub
PREP_SUB = REPO_ROOT / "data" / "prep.sub"


def _prep_sub(env: dict[str, str], *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    environment.update(env)
    return subprocess.run(["bash", str(PREP_SUB), *args], env=environment, capture_output=True, text=True,
                          timeout=timeout)


def test_prep_sub_dry_run_starts_scheduler_workers_and_the_client_on_one_scheduler_file(tmp_path):
    from bertrecipe.cli import bert_prep as bertPrep
    run = _prep_sub({"DRYRUN": "1", "BERT_PREP_WORKING_DIR": str(tmp_path), "SLURM_JOB_NUM_NODES": "4",
                     "SLURM_JOB_ID": "77", "WORKERS_PER_NODE": "16", "INTERFACE": "ib0"},
                    "--dataset", "wikicorpus_en", "--max_seq_length", "128")
    assert run.returncode == 0, run.stderr
    lines = [shlex.split(line.removesuffix("&")) for line in run.stdout.splitlines() if line.strip()]
    [scheduler] = [w for w in lines if "distributed.cli.dask_scheduler" in w]
    [workers] = [w for w in lines if "distributed.cli.dask_worker" in w]
    clients = [w for w in lines if any(x.endswith("bertPrep.py") for x in w)]
    script = next(i for i, w in enumerate(clients[0]) if w.endswith("bertPrep.py"))
    actions = [bertPrep.parse_args(c[script + 1:]).action for c in clients]
    assert actions == ["text_formatting", "sharding", "create_hdf5_files"]  # the whole chain, in order
    client = clients[-1]
    scheduler_file = str(tmp_path / ".dask-scheduler-77.json")
    assert f"--scheduler-file={scheduler_file}" in scheduler and f"--scheduler-file={scheduler_file}" in workers
    assert scheduler[:3] == ["srun", "--nodes=1", "--ntasks=1"] and "-P" in scheduler
    assert {"--nodes=4", "--ntasks-per-node=1", "--nworkers=16", "--nthreads=1", "--interface=ib0"} <= set(workers)
    script = next(i for i, w in enumerate(client) if w.endswith("bertPrep.py"))
    cfg = bertPrep.parse_args(client[script + 1:])
    assert (cfg.action, cfg.dataset, cfg.max_seq_length) == ("create_hdf5_files", "wikicorpus_en", 128)
    assert (cfg.engine.engine, str(cfg.engine.scheduler_file)) == ("dask", scheduler_file)
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


@pytest.mark.parametrize("env, words", [({"WORKERS_PER_NODE": "x"}, "WORKERS_PER_NODE"),
                                        ({"BERT_PREP_WORKING_DIR": ""}, "BERT_PREP_WORKING_DIR"),
                                        ({"ACTIONS": "sharding download"}, "'download'"),
                                        ({"ACTIONS": " "}, "ACTIONS is empty")])
def test_prep_sub_refuses_bad_settings_in_one_line(tmp_path, env, words):
    run = _prep_sub({"DRYRUN": "1", "BERT_PREP_WORKING_DIR": str(tmp_path), **env}, "--dataset", "wikicorpus_en")
    assert run.returncode != 0 and words in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert run.stdout == ""


@pytest.mark.slow
def test_prep_sub_makes_the_shards_of_a_local_run(workdir, tmp_path, vocab_file):
    """The script itself, with an srun that runs its command here: scheduler and workers on the loopback; the
    text shards are made again on the workers, then the HDF5 shards."""
    local = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--n_processes", "1", vocab=vocab_file)
    assert local.returncode == 0, local.stderr
    layout.hdf5_dir(workdir, PARAMS).rename(workdir / "local")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ "${1:-}" == --* ]]; do shift; done\nexec "$@"\n')
    (fake / "srun").chmod(0o755)
    run = _prep_sub({"PATH": f"{fake}:{os.environ['PATH']}", "BERT_PREP_WORKING_DIR": str(workdir),
                     "PYTHON": PYTHON, "SCHEDULER_PORT": "0", "INTERFACE": "lo", "HTTP_HOST": "127.0.0.1",
                     "WORKERS_PER_NODE": "2",
                     "SCHEDULER_TIMEOUT": "60", "SLURM_JOB_ID": "5", "ACTIONS": "sharding create_hdf5_files"},
                    *FLAGS, "--vocab_file", str(vocab_file), timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tasks ran on" in run.stdout and "5 shards made by" in run.stdout
    _assert_same_shards(workdir / "local", layout.hdf5_dir(workdir, PARAMS))
    assert not (workdir / ".dask-scheduler-5.json").exists()  # removed with the scheduler


# ---------------------------------------------------------------- --engine slurm (dask-jobqueue)
FAKE_SBATCH = """#!/bin/bash
# Slurm's sbatch, for the test: runs (a copy of) the job script here, in a session of its own, and records it.
cp "$1" "{jobs}/job-$$.sh"
setsid bash "{jobs}/job-$$.sh" > "{jobs}/job-$$.log" 2>&1 < /dev/null &
echo "$!" >> "{jobs}/pgids"
echo "Submitted batch job $!"
"""
FAKE_SCANCEL = '#!/bin/bash\nfor id in "$@"; do kill -- "-$id" 2>/dev/null || true; done\n'


@pytest.mark.slow
def test_slurm_engine_submits_worker_jobs_that_make_the_shards(workdir, tmp_path, vocab_file):
    local = _prep(workdir, "--action", "create_hdf5_files", *FLAGS, "--n_processes", "1", vocab=vocab_file)
    assert local.returncode == 0, local.stderr
    layout.hdf5_dir(workdir, PARAMS).rename(workdir / "local")
    fake, jobs = tmp_path / "bin", tmp_path / "jobs"
    fake.mkdir()
    jobs.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH.format(jobs=jobs)), ("scancel", FAKE_SCANCEL)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    # The workers' own listening addresses, through dask-jobqueue's configuration (loopback for the test).
    extra = '["--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"]'
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "DASK_JOBQUEUE__SLURM__WORKER_EXTRA_ARGS": extra}
    try:
        run = subprocess.run([PYTHON, str(REPO_ROOT / "data" / "bertPrep.py"), "--action", "create_hdf5_files",
                              *FLAGS, "--vocab_file", str(vocab_file), "--engine", "slurm", "--slurm_jobs", "2",
                              "--slurm_cores", "1", "--slurm_memory", "2GB", "--slurm_account", "bert",
                              "--scheduler_host", "127.0.0.1"],
                             env={**os.environ, **env, "BERT_PREP_WORKING_DIR": str(workdir)},
                             capture_output=True, text=True, timeout=120)
    finally:  # whatever happened, no job outlives the test
        for pgid in (jobs / "pgids").read_text().split() if (jobs / "pgids").exists() else []:
            subprocess.run(["kill", "--", f"-{pgid}"], capture_output=True)
    assert run.returncode == 0, run.stdout + run.stderr
    scripts = [p.read_text() for p in sorted(jobs.glob("job-*.sh"))]
    assert len(scripts) == 2 and all("#SBATCH -A bert" in s and " -P -m distributed.cli.dask_worker" in s
                                      for s in scripts)
    assert re.search(r"5 shards made by [12] Dask workers", run.stdout)
    _assert_same_shards(workdir / "local", layout.hdf5_dir(workdir, PARAMS))
