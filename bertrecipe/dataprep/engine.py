"""Where data-preparation tasks run: local processes (the default), a running Dask cluster, or Dask workers in
Slurm jobs (dask-jobqueue). A task is a module-level function and its arguments; its result depends on those
only, so the engine and the worker count cannot change the output.

  --engine local                        --n_processes worker processes (local_processes.py: a signal ends them all)
  --scheduler tcp://host:8786           a Dask scheduler (`dask scheduler`) and its workers
  --scheduler_file scheduler.json       the same, by the file `dask scheduler --scheduler-file` writes
  --engine slurm --slurm_jobs 8 ...     a Dask scheduler here and workers in Slurm jobs (SLURMCluster)

Dask workers must see the checkout and $BERT_PREP_WORKING_DIR at the same paths as this process (a shared file
system) and run the same Python environment.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bertrecipe.common.errors import DataError
from bertrecipe.dataprep.local_processes import WorkerProcesses

ENGINES = ("local", "dask", "slurm")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the bertrecipe folder


@dataclass(frozen=True)
class EngineConfig:
    engine: str = "local"
    n_processes: int = 1                  # local engine
    scheduler: str | None = None          # dask engine: address ...
    scheduler_file: Path | None = None    # ... or the scheduler's JSON file
    scheduler_timeout: float = 60.0       # seconds to reach the scheduler and see a first worker
    scheduler_host: str | None = None     # slurm engine: where this process's scheduler listens
    slurm_jobs: int = 1
    slurm_cores: int = 8                  # single-threaded worker processes per job
    slurm_memory: str = "32GB"
    slurm_walltime: str = "04:00:00"
    slurm_queue: str | None = None
    slurm_account: str | None = None


def validate_engine(cfg: EngineConfig) -> None:
    """Refuse inconsistent engine flags before anything is read or written."""
    if cfg.engine not in ENGINES:
        raise DataError("--engine", f"must be one of {', '.join(ENGINES)}, got {cfg.engine}")
    if cfg.engine == "dask" and (cfg.scheduler is None) == (cfg.scheduler_file is None):
        raise DataError("--engine dask", "needs exactly one of --scheduler tcp://host:port and --scheduler_file")
    if cfg.engine != "dask" and (cfg.scheduler or cfg.scheduler_file):
        raise DataError("--scheduler", f"a scheduler is for --engine dask, not --engine {cfg.engine}; drop one")
    if cfg.scheduler_timeout <= 0:
        raise DataError("--scheduler_timeout", f"must be positive, got {cfg.scheduler_timeout}")
    if cfg.engine == "slurm" and (cfg.slurm_jobs < 1 or cfg.slurm_cores < 1):
        raise DataError("--slurm_jobs", f"--slurm_jobs and --slurm_cores must be at least 1, got "
                                        f"{cfg.slurm_jobs} and {cfg.slurm_cores}")
    if cfg.engine != "local":
        _dask_distributed()  # installed? (a missing package is one line, not a traceback after the checks)


def runs_here(cfg: EngineConfig, n_tasks: int) -> bool:
    """True when the local engine would run the tasks in this process, one after the other."""
    return cfg.engine == "local" and (cfg.n_processes <= 1 or n_tasks <= 1)


def _dask_distributed() -> Any:
    """Dask's `distributed` package, or one line saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise DataError("--engine", "Dask is not installed; pip install -r requirements.txt (dask, distributed, "
                                    "dask-jobqueue)") from None
    return distributed


def _on_worker(function: Callable, task: tuple) -> tuple[Any, str, str]:
    """Runs on a Dask worker, which imports this module (and `function`'s) from its own environment like any
    other: the result, the worker's address and where its `bertrecipe` package lies."""
    from distributed import get_worker
    return function(*task), get_worker().address, str(PACKAGE_ROOT)


# The stop event of the tasks a thread runs: set by in_order for its background thread (a runner reached through
# wrappers of any signature still sees it), None elsewhere.
_THIS_THREAD = threading.local()


def _stop_event() -> threading.Event | None:
    return getattr(_THIS_THREAD, "stop", None)


def _run_local(cfg: EngineConfig, function: Callable, tasks: Sequence[tuple], on_done: Callable[[Any], None]
               ) -> set[str]:
    stop = _stop_event()
    if runs_here(cfg, len(tasks)):
        for task in tasks:
            if stop is not None and stop.is_set():
                break
            on_done(function(*task))
        return set()
    # Each task depends only on its arguments, so the process count cannot change the output.
    with WorkerProcesses(min(cfg.n_processes, len(tasks))) as workers:
        workers.run(function, tasks, on_done, stop)
    return set()


def _scheduler_address(cfg: EngineConfig) -> str:
    """--scheduler, or the address in --scheduler_file, waiting (bounded) for a scheduler still starting."""
    if cfg.scheduler is not None:
        return cfg.scheduler
    path = Path(cfg.scheduler_file)
    deadline = time.monotonic() + cfg.scheduler_timeout
    while True:
        try:
            return str(json.loads(path.read_text(encoding="utf-8"))["address"])
        except (FileNotFoundError, ValueError, KeyError):  # not written yet, or half written
            if time.monotonic() > deadline:
                raise DataError(path, f"no Dask scheduler wrote this --scheduler_file within {cfg.scheduler_timeout:g}"
                                      f" s; start one (dask scheduler --scheduler-file {path}) or fix the path"
                                ) from None
            time.sleep(0.2)
        except OSError as err:
            raise DataError(path, f"cannot read the --scheduler_file ({err.strerror})") from None


def _slurm_cluster(cfg: EngineConfig) -> Any:
    """A scheduler in this process and --slurm_jobs Slurm jobs of --slurm_cores single-threaded workers."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise DataError("--engine slurm", "dask-jobqueue is not installed; pip install -r requirements.txt") from None
    scheduler: dict[str, Any] = {"dashboard": False}
    if cfg.scheduler_host:  # its HTTP endpoints (/health) too, which otherwise listen everywhere
        scheduler.update(host=cfg.scheduler_host, dashboard_address=f"{cfg.scheduler_host}:0")
    # `python -P`: the workers start in the submission folder, often the checkout, whose files must not shadow
    # installed packages (the workers import the checkout as the installed `bertrecipe`).
    cluster = SLURMCluster(cores=cfg.slurm_cores, processes=cfg.slurm_cores, memory=cfg.slurm_memory,
                           walltime=cfg.slurm_walltime, queue=cfg.slurm_queue, account=cfg.slurm_account,
                           python=f"{sys.executable} -P", scheduler_options=scheduler)
    cluster.scale(jobs=cfg.slurm_jobs)
    return cluster


def _connect(cfg: EngineConfig, distributed: Any, cluster: Any) -> Any:
    """A Client of the scheduler; one DataError line when none answers (nothing has been written yet)."""
    target = cluster if cluster is not None else _scheduler_address(cfg)
    flag = "--scheduler_file" if cfg.scheduler_file is not None else "--scheduler"
    try:
        client = distributed.Client(target, timeout=cfg.scheduler_timeout, set_as_default=False)
    except (OSError, ValueError, TypeError):
        raise DataError(flag, f"no Dask scheduler answered at {target} within {cfg.scheduler_timeout:g} s; "
                              "start one (dask scheduler) or fix the address") from None
    if cluster is None:  # Slurm jobs may queue for long: only a running cluster must already have workers
        try:
            client.wait_for_workers(1, timeout=cfg.scheduler_timeout)
        except (TimeoutError, OSError):
            client.close()
            raise DataError(flag, f"the Dask scheduler at {target} has no worker after {cfg.scheduler_timeout:g} s;"
                                  f" start some (dask worker {target})") from None
    return client


def _run_dask(client: Any, function: Callable, tasks: Sequence[tuple], on_done: Callable[[Any], None]
              ) -> set[str]:
    distributed = _dask_distributed()
    futures = [client.submit(_on_worker, function, task, pure=False) for task in tasks]
    workers: set[str] = set()
    try:
        for future in _completed(distributed.as_completed(futures, loop=client.loop), _stop_event()):
            try:
                result, worker, package = future.result()  # a task's DataError is raised here, intact
            except ModuleNotFoundError as error:
                if not (error.name or "").startswith("bertrecipe"):
                    raise
                package = f"no {error.name}"
            if package != str(PACKAGE_ROOT):
                raise DataError(str(PACKAGE_ROOT.parent), f"the Dask workers do not run this checkout ({package}): "
                                "start them where the checkout and $BERT_PREP_WORKING_DIR have the same paths (a "
                                "shared file system), in an environment where it is installed (pip install -e "
                                "<checkout>)")
            workers.add(worker)
            on_done(result)
    finally:
        client.cancel(futures)  # those not started never will; a task already running ends on its worker
    return workers


def _completed(futures: Any, stop: threading.Event | None) -> Iterator[Any]:
    """The futures of a Dask as_completed as they complete, and none once stop is set (looked at every tenth of
    a second; Dask cannot interrupt a task that runs, so this is how a closed in_order stops waiting for them)."""
    while not futures.is_empty():
        if stop is not None and stop.is_set():
            return
        batch = futures.next_batch(block=False)
        if not batch:
            time.sleep(0.1)
        yield from batch


# run(function, tasks, on_done) -> the Dask workers used (none locally): function(*task) for each task, on_done(result)
# in this process as each ends, in any order. Run by in_order, it returns once in_order is closed, without waiting for
# the tasks still running: they are stopped (local processes) or dropped (Dask: one that already runs ends on its
# worker).
Runner = Callable[[Callable, Sequence[tuple], Callable[[Any], None]], set]


class _Numbered:
    """function(*args) as (index, result), for results that come back out of order."""

    def __init__(self, function: Callable) -> None:
        self.function = function

    def __call__(self, index: int, *args: Any) -> tuple[int, Any]:
        return index, self.function(*args)


def in_order(run: Runner | None, function: Callable, tasks: Sequence[tuple]) -> Iterator[Any]:
    """function(*task)'s results in task order, each as soon as it and those before it are done, so that the
    caller can consume the first while the rest run. With a runner the tasks run in a background thread (its
    failure, e.g. a task's DataError, is raised here intact); run=None runs them here, one after the other.
    Closing the iterator early waits for the tasks already running."""
    if run is None:
        for task in tasks:
            yield function(*task)
        return
    results: dict[int, Any] = {}
    failure: list[BaseException] = []
    over = threading.Event()
    stop = threading.Event()
    ready = threading.Condition()

    def done(numbered: tuple[int, Any]) -> None:
        with ready:
            results[numbered[0]] = numbered[1]
            ready.notify_all()

    def run_all() -> None:
        _THIS_THREAD.stop = stop
        try:
            run(_Numbered(function), [(i, *task) for i, task in enumerate(tasks)], done)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consuming thread
            failure.append(err)
        finally:
            with ready:
                over.set()
                ready.notify_all()

    worker = threading.Thread(target=run_all, name="engine", daemon=True)
    worker.start()
    try:
        for index in range(len(tasks)):
            with ready:
                ready.wait_for(lambda index=index: index in results or failure or over.is_set())
                if index not in results:
                    raise failure[0] if failure else RuntimeError(f"the engine ended without task {index}")
                result = results.pop(index)
            yield result
    finally:
        stop.set()  # at the end, nothing is left to stop
        worker.join()


@contextmanager
def open_runner(cfg: EngineConfig) -> Iterator[Runner]:
    """Yields run(function, tasks, on_done) -> the Dask worker addresses used (none locally). Connecting happens
    here, so that callers can check the engine before their first write; everything is released on exit."""
    validate_engine(cfg)
    if cfg.engine == "local":
        yield lambda function, tasks, on_done: _run_local(cfg, function, tasks, on_done)
        return
    distributed = _dask_distributed()
    cluster = _slurm_cluster(cfg) if cfg.engine == "slurm" else None
    try:
        client = _connect(cfg, distributed, cluster)
        try:
            yield lambda function, tasks, on_done: _run_dask(client, function, tasks, on_done)
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()  # cancels the worker jobs
