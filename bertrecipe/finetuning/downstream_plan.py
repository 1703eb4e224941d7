"""What run_downstream.py runs: the tasks found in a data folder (GLUE task folders, SQuAD v1.1/v2.0 files, a
BEIR-layout retrieval folder), each task's metrics as papers report them, the protocol presets (the learning-rate
grid, epochs, batch sizes and seeds of the BERT and ModernBERT papers, and a small CPU one), and the plan: one run
per task x configuration x seed, each with its own folder name. Pure functions of the folder's listing and the
flags; nothing here starts a run (downstream_runs.py does)."""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.finetuning import glue, squad, squad_task

GLUE, SQUAD, RETRIEVAL = "glue", "squad", "retrieval"
# GLUE's own folder names (as its download script writes them), in GLUE's order.
GLUE_FOLDERS = {"cola": "CoLA", "sst-2": "SST-2", "mrpc": "MRPC", "sts-b": "STS-B", "qqp": "QQP", "mnli": "MNLI",
                "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
# The GLUE average leaves WNLI out, as the BERT paper does (its dev set is adversarial to the train set).
GLUE_AVERAGE_EXCLUDES = ("wnli",)
SQUAD_VERSIONS = {"squad-v1.1": "1.1", "squad-v2.0": "2.0"}
# Where SQuAD's files may lie under --data_dir: the folder itself, squad/, and NVIDIA's squad/v1.1/.
SQUAD_PLACES = ("", "squad", "squad/v{version}")
BEIR_FILES = ("corpus.jsonl", "queries.jsonl", "qrels")
BEIR_SPLITS = ("train", "test")  # fine-tuned on train, scored on test


@dataclass(frozen=True)
class Metric:
    """One number a run reports: its name in the tables, its key in the run's results, and the factor that makes it
    a percentage (GLUE's metrics are fractions; SQuAD's are percentages already)."""

    name: str
    key: str
    scale: float = 100.0


# The first metric of each task is its score (the one papers put in their GLUE table and the one the best
# configuration is chosen by): the BERT paper's footnote to its Table 1 reports F1 for QQP and MRPC, Spearman for
# STS-B, accuracy for the others and Matthews correlation for CoLA; the rest are reported beside it.
GLUE_METRICS: dict[str, tuple[Metric, ...]] = {
    "cola": (Metric("MCC", "eval_mcc"),),
    "sst-2": (Metric("acc", "eval_acc"),),
    "mrpc": (Metric("F1", "eval_f1"), Metric("acc", "eval_acc")),
    "sts-b": (Metric("Spearman", "eval_spearmanr"), Metric("Pearson", "eval_pearson")),
    "qqp": (Metric("F1", "eval_f1"), Metric("acc", "eval_acc")),
    "mnli": (Metric("m acc", "eval_acc"), Metric("mm acc", "eval_mm_acc")),
    "qnli": (Metric("acc", "eval_acc"),),
    "rte": (Metric("acc", "eval_acc"),),
    "wnli": (Metric("acc", "eval_acc"),),
}
SQUAD_METRICS = (Metric("F1", "F1", 1.0), Metric("EM", "exact_match", 1.0))
# SQuAD 2.0 as the BERT paper scores it (section 4.3): a null answer unless the best span beats it by a threshold
# "selected on the dev set to maximize F1", the official script's best_f1 (and best_exact); at threshold 0 beside.
SQUAD_V2_METRICS = (Metric("F1", "best_f1", 1.0), Metric("EM", "best_exact", 1.0), Metric("F1 at 0", "F1", 1.0),
                    Metric("EM at 0", "exact_match", 1.0))
RETRIEVAL_METRICS = (Metric("nDCG@10", "ndcg@10"), Metric("MRR@10", "mrr@10"), Metric("R@100", "recall@100"))


@dataclass(frozen=True)
class Task:
    """A task found under --data_dir: its name (`cola`, `squad-v2.0`, `beir-scifact`), kind and files."""

    name: str
    kind: str
    folder: Path  # the GLUE task's folder, the BEIR folder, or the folder of the SQuAD files
    train_file: Optional[Path] = None  # SQuAD's
    dev_file: Optional[Path] = None
    data_sha256: Optional[str] = None  # of its train and dev files, once read (checked_task_data)

    @property
    def metrics(self) -> tuple[Metric, ...]:
        if self.kind == GLUE:
            return GLUE_METRICS[self.name]
        if self.kind == SQUAD:
            return SQUAD_V2_METRICS if self.name == "squad-v2.0" else SQUAD_METRICS
        return RETRIEVAL_METRICS


@dataclass(frozen=True)
class Grid:
    """One task kind's protocol: every combination of learning rate, epochs and batch size is a configuration, run
    once per seed."""

    learning_rates: tuple[float, ...]
    epochs: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    seeds: tuple[int, ...]
    max_seq_length: int
    warmup_proportion: float = 0.1


@dataclass(frozen=True)
class Preset:
    name: str
    source: str  # where its numbers come from
    grids: dict[str, Grid]  # by task kind
    cpu_threads_per_run: int  # how a CPU's cores are split between concurrent runs by default


_BERT_SEEDS = (1, 2, 3, 4, 5)
PRESETS: dict[str, Preset] = {
    "bert": Preset(
        "bert", "Devlin et al. 2019 (BERT), sections 4.1-4.3: GLUE batch 32, 3 epochs, the best of "
        "{5e-5, 4e-5, 3e-5, 2e-5} on dev; SQuAD v1.1 3 epochs at 5e-5 batch 32, v2.0 2 epochs at 5e-5 batch 48 "
        "(3e-5 added: NVIDIA's run_squad.sh default); the seed counts and the retrieval grid are ours",
        {GLUE: Grid((5e-5, 4e-5, 3e-5, 2e-5), (3.0,), (32,), _BERT_SEEDS, 128),
         "squad-v1.1": Grid((5e-5, 3e-5), (3.0,), (32,), (1, 2, 3), 384),
         "squad-v2.0": Grid((5e-5, 3e-5), (2.0,), (48,), (1, 2, 3), 384),
         RETRIEVAL: Grid((5e-5, 3e-5, 2e-5), (1.0,), (32,), (1, 2, 3), 256)}, 4),
    "modernbert": Preset(
        "modernbert", "Warner et al. 2024 (ModernBERT), as issue 40 states its GLUE sweep: learning rates "
        "{1e-5, 2e-5, 3e-5, 5e-5, 8e-5, 1e-4} x epochs {1, 2, 3} x batch {16, 32}, three seeds; the paper reports no "
        "SQuAD, whose grid here is the BERT paper's; the retrieval grid is ours",
        {GLUE: Grid((1e-5, 2e-5, 3e-5, 5e-5, 8e-5, 1e-4), (1.0, 2.0, 3.0), (16, 32), (1, 2, 3), 128),
         "squad-v1.1": Grid((5e-5, 3e-5), (3.0,), (32,), (1, 2, 3), 384),
         "squad-v2.0": Grid((5e-5, 3e-5), (2.0,), (48,), (1, 2, 3), 384),
         RETRIEVAL: Grid((1e-4, 5e-5, 2e-5), (1.0,), (32,), (1, 2, 3), 256)}, 4),
    "cpu_tiny": Preset(
        "cpu_tiny", "ours: a 2 x 2 grid (learning rates {1e-4, 5e-5}, seeds {1, 2}), one epoch at batch 8, short "
        "sequences, one thread a run: for small models and excerpts on a CPU, not a paper's protocol",
        {GLUE: Grid((1e-4, 5e-5), (1.0,), (8,), (1, 2), 64),
         "squad-v1.1": Grid((1e-4, 5e-5), (1.0,), (8,), (1, 2), 128),
         "squad-v2.0": Grid((1e-4, 5e-5), (1.0,), (8,), (1, 2), 128),
         RETRIEVAL: Grid((1e-4, 5e-5), (1.0,), (8,), (1, 2), 64)}, 1),
}


def grid_key(task: Task) -> str:
    return task.name if task.kind == SQUAD else task.kind


@dataclass(frozen=True)
class GridOverrides:
    """The flags that replace a preset's values for every task (None: the preset's)."""

    learning_rates: Optional[tuple[float, ...]] = None
    epochs: Optional[tuple[float, ...]] = None
    batch_sizes: Optional[tuple[int, ...]] = None
    seeds: Optional[tuple[int, ...]] = None
    max_seq_length: Optional[int] = None

    def given(self) -> dict[str, Any]:
        """The grid fields these flags replace (field -> value)."""
        return {name: value for name, value in vars(self).items() if value is not None}

    def apply(self, grid: Grid) -> Grid:
        return replace(grid, **self.given())


def task_grids(preset: Preset, tasks: Sequence[Task], overrides: GridOverrides) -> dict[str, Grid]:
    """The grid each task runs: its kind's in the preset, with the overrides."""
    return {task.name: overrides.apply(preset.grids[grid_key(task)]) for task in tasks}


@dataclass(frozen=True)
class PlannedRun:
    task: Task
    learning_rate: float
    epochs: float
    batch_size: int
    seed: int
    max_seq_length: int
    warmup_proportion: float

    @property
    def config(self) -> tuple[float, float, int]:
        """The configuration this run is a seed of."""
        return (self.learning_rate, self.epochs, self.batch_size)

    @property
    def folder_name(self) -> str:
        return f"lr{self.learning_rate:g}_ep{self.epochs:g}_bs{self.batch_size}_seed{self.seed}"

    @property
    def label(self) -> str:
        return f"{self.task.name}/{self.folder_name}"

    def settings(self) -> dict[str, object]:
        """What the run's scores depend on besides the model and the data (recorded with them)."""
        return {"task": self.task.name, "learning_rate": self.learning_rate, "epochs": self.epochs,
                "batch_size": self.batch_size, "seed": self.seed, "max_seq_length": self.max_seq_length,
                "warmup_proportion": self.warmup_proportion, "data_sha256": self.task.data_sha256}


def plan_runs(tasks: Sequence[Task], grids: dict[str, Grid]) -> list[PlannedRun]:
    """Every run: task x learning rate x epochs x batch size x seed, in that order (a task's runs together, so that
    its table fills first)."""
    runs = []
    for task in tasks:
        grid = grids[task.name]
        for lr, epochs, batch, seed in itertools.product(grid.learning_rates, grid.epochs, grid.batch_sizes,
                                                         grid.seeds):
            runs.append(PlannedRun(task, lr, epochs, batch, seed, grid.max_seq_length, grid.warmup_proportion))
    return runs


@dataclass
class Found:
    """The tasks a data folder holds, and why the named ones it lacks are missing."""

    tasks: list[Task] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # task name -> the problem


def glue_task_files(data_dir: Path, name: str) -> tuple[Optional[Task], str]:
    """(the task, "") when its folder holds a train and a dev file, else (None, what is missing)."""
    folder = data_dir / GLUE_FOLDERS[name]
    if not folder.is_dir():
        return None, f"{folder} is not a folder"
    task = glue.get_task(name)
    for split in ("train", "dev"):
        path = glue.split_file(task, folder, split)
        if not path.is_file():
            return None, f"{folder} has no {path.name}"
    return Task(name, GLUE, folder), ""


def squad_task_files(data_dir: Path, name: str) -> tuple[Optional[Task], str]:
    """SQuAD of a version: train-vX.json and dev-vX.json together in --data_dir, its squad/ or squad/vX/."""
    version = SQUAD_VERSIONS[name]
    train, dev = f"train-v{version}.json", f"dev-v{version}.json"
    places = [data_dir / place.format(version=version) for place in SQUAD_PLACES]
    for folder in places:
        if (folder / train).is_file() and (folder / dev).is_file():
            return Task(name, SQUAD, folder, folder / train, folder / dev), ""
    return None, f"no folder of {', '.join(str(p) for p in dict.fromkeys(places))} holds both {train} and {dev}"


def beir_folders(data_dir: Path) -> list[Path]:
    """The subfolders of --data_dir in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/)."""
    if not data_dir.is_dir():
        return []
    return [folder for folder in sorted(data_dir.iterdir()) if folder.is_dir()
            and all((folder / name).exists() for name in BEIR_FILES) and (folder / "qrels").is_dir()]


def beir_task_files(folder: Path, name: str) -> tuple[Optional[Task], str]:
    """A BEIR folder is a task when it can be fine-tuned on (qrels/train.tsv) and scored (qrels/test.tsv, BEIR's
    reported split)."""
    for split in BEIR_SPLITS:
        if not (folder / "qrels" / f"{split}.tsv").is_file():
            return None, f"{folder} has no qrels/{split}.tsv"
    return Task(name, RETRIEVAL, folder, folder / "qrels" / "train.tsv", folder / "qrels" / "test.tsv"), ""


def known_task_names(data_dir: Path, retrieval: bool) -> list[str]:
    names = [*GLUE_FOLDERS, *SQUAD_VERSIONS]
    if retrieval:
        names += [f"beir-{folder.name.lower()}" for folder in beir_folders(data_dir)]
    return names


def find_tasks(data_dir: Path, wanted: Optional[Sequence[str]], retrieval: bool) -> Found:
    """The tasks under data_dir: all of them (wanted None), or the named ones (a name that is no task, or whose
    files are missing, listed in `missing`). `retrieval`: BEIR folders count (run_retrieval.py is there)."""
    found = Found()
    beir = {f"beir-{folder.name.lower()}": folder for folder in beir_folders(data_dir)} if retrieval else {}
    names = [name.lower() for name in wanted] if wanted else [*GLUE_FOLDERS, *SQUAD_VERSIONS, *beir]
    for name in dict.fromkeys(names):
        if name in GLUE_FOLDERS:
            task, problem = glue_task_files(data_dir, name)
        elif name in SQUAD_VERSIONS:
            task, problem = squad_task_files(data_dir, name)
        elif name in beir:
            task, problem = beir_task_files(beir[name], name)
        else:
            task, problem = None, unknown_task_problem(name, retrieval)
        if task is not None:
            found.tasks.append(task)
        elif wanted:
            found.missing[name] = problem
    return found


def unknown_task_problem(name: str, retrieval: bool) -> str:
    if name.startswith("beir-") and not retrieval:
        return "retrieval needs run_retrieval.py, which this checkout does not have"
    if name.startswith("beir-"):
        return f"no subfolder {name[5:]} of --data_dir holds {', '.join(BEIR_FILES)}"
    return f"no such task (known: {', '.join([*GLUE_FOLDERS, *SQUAD_VERSIONS, 'beir-<folder>'])})"


def check_found(found: Found, data_dir: Path) -> None:
    """One line for the first named task that cannot run, or when the folder holds none."""
    for name, problem in found.missing.items():
        raise InputError(f"--tasks {name}: {problem}")
    if not found.tasks:
        raise InputError(f"--data_dir {data_dir}: holds no task (GLUE folders such as {GLUE_FOLDERS['rte']}/ with "
                         "train.tsv and dev.tsv, train-v1.1.json with dev-v1.1.json, a BEIR folder); see "
                         "docs/downstream.md")


def checked_task_data(task: Task) -> Task:
    """The task with the sha256 of its train and dev files, read as its command will read them, so that a bad row
    or file is one line before any run (InputError naming file and line). A BEIR folder's files are hashed, not
    read: run_retrieval.py reads them before it writes anything."""
    digest = hashlib.sha256()
    if task.kind == GLUE:
        splits = [(glue.get_task(task.name), "train"), (glue.get_task(task.name), "dev")]
        mismatched = glue.get_task("mnli-mm")  # MNLI's second dev set, scored where it is there
        if task.name == "mnli" and glue.split_file(mismatched, task.folder, "dev").is_file():
            splits.append((mismatched, "dev"))
        for each, split in splits:
            glue.read_examples(each, task.folder, split)
            digest.update(file_sha256(glue.split_file(each, task.folder, split)).encode())
    elif task.kind == SQUAD:
        train, dev = squad.read_squad_file(task.train_file), squad.read_squad_file(task.dev_file)
        squad_task.check_scorable(dev)
        digest.update(f"{train.sha256} {dev.sha256}".encode())
    else:
        for path in (task.folder / "corpus.jsonl", task.folder / "queries.jsonl", task.train_file, task.dev_file):
            digest.update(file_sha256(path).encode())
    return replace(task, data_sha256=digest.hexdigest())
