"""GLUE tasks for BERT: TSV readers, label lists, features and metrics.

Files are the ones the standard GLUE download script writes (`<task dir>/{train,dev,test}.tsv`, MNLI with
`dev_matched`/`dev_mismatched`). They are read as plain tab-separated lines: no quoting (sentences hold bare
`"`), an optional UTF-8 byte-order mark, every line with the header's number of columns (CoLA has no header
and four columns). Metrics use numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import kind_of_head
from bertrecipe.tokenization.bpe import FineTuningTokenizer


@dataclass(frozen=True)
class GlueTask:
    """Where a task's columns are. Column indexes may be negative (MNLI's label is the last of 12 or 16)."""

    name: str
    labels: Optional[tuple[str, ...]]  # None for regression (STS-B)
    text_a: int
    text_b: Optional[int]
    label: int
    test_text_a: int
    test_text_b: Optional[int]
    has_header: bool = True
    columns: Optional[int] = None  # fixed column count for files without a header
    dev_file: str = "dev.tsv"
    test_file: str = "test.tsv"
    metric: str = "acc"  # "mcc", "acc", "acc_and_f1" or "corr"

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


_BINARY = ("0", "1")
_NLI = ("entailment", "not_entailment")
TASKS: dict[str, GlueTask] = {
    # CoLA: source, label, original judgement, sentence; the test file has a header "index sentence".
    "cola": GlueTask("cola", _BINARY, 3, None, 1, 1, None, has_header=False, columns=4, metric="mcc"),
    "sst-2": GlueTask("sst-2", _BINARY, 0, None, 1, 1, None),
    "mrpc": GlueTask("mrpc", _BINARY, 3, 4, 0, 3, 4, metric="acc_and_f1"),
    "sts-b": GlueTask("sts-b", None, 7, 8, -1, 7, 8, metric="corr"),
    "qqp": GlueTask("qqp", _BINARY, 3, 4, 5, 1, 2, metric="acc_and_f1"),
    "mnli": GlueTask(
        "mnli", ("contradiction", "entailment", "neutral"), 8, 9, -1, 8, 9,
        dev_file="dev_matched.tsv", test_file="test_matched.tsv",
    ),
    "mnli-mm": GlueTask(
        "mnli-mm", ("contradiction", "entailment", "neutral"), 8, 9, -1, 8, 9,
        dev_file="dev_mismatched.tsv", test_file="test_mismatched.tsv",
    ),
    "qnli": GlueTask("qnli", _NLI, 1, 2, -1, 1, 2),
    "rte": GlueTask("rte", _NLI, 1, 2, -1, 1, 2),
    "wnli": GlueTask("wnli", _BINARY, 1, 2, -1, 1, 2),
}
SPLITS = ("train", "dev", "test", "train_aug")  # train_aug: task distillation's augmented training set


def get_task(name: str) -> GlueTask:
    """The task of a (case-insensitive) GLUE task name such as "mrpc", "sst-2", "mnli-mm"; InputError if unknown."""
    task = TASKS.get(name.lower())
    if task is None:
        raise InputError(f"unknown GLUE task {name!r} (known: {', '.join(TASKS)})")
    return task


@dataclass
class GlueExample:
    """One sentence or sentence pair; `label` is the label string, a float for STS-B, None for test files."""

    guid: str
    text_a: str
    text_b: Optional[str]
    label: Optional[str | float]


def read_tsv(path: str | Path, columns: Optional[int] = None, has_header: bool = True) -> list[list[str]]:
    """Rows of a TSV file (header removed), split on tabs only. Every row must have `columns` fields, or the
    header's count when `columns` is None. Raises InputError naming the file and line otherwise."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        found = kind_of_head(raw[:64])
        if found is not None:
            raise InputError(f"{path}: {found}, not a TSV file")
        text = raw.decode("utf-8-sig")  # -sig: MRPC starts with a byte-order mark
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a TSV file") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 (byte {error.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = [line.removesuffix("\r").split("\t") for line in lines]
    first = 0
    if has_header:
        if not rows:
            raise InputError(f"{path}: empty file (expected a header line)")
        columns = len(rows[0]) if columns is None else columns
        first = 1
    for number, row in enumerate(rows[first:], start=first + 1):
        if columns is not None and len(row) != columns:
            raise InputError(f"{path}: line {number} has {len(row)} tab-separated columns, expected {columns}")
    return rows[first:]


def split_file(task: GlueTask, data_dir: str | Path, split: str) -> Path:
    """The TSV of `split` ("train", "dev", "test" or "train_aug", data_augmentation.py's) in the task's folder."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    name = {"train": "train.tsv", "dev": task.dev_file, "test": task.test_file, "train_aug": "train_aug.tsv"}[split]
    return Path(data_dir) / name


def read_examples(task: GlueTask, data_dir: str | Path, split: str) -> list[GlueExample]:
    """Examples of one split of a task folder. Labels are checked against the task's label list (or parsed as
    floats for STS-B); test files carry no labels (None). Raises InputError naming file and line."""
    path = split_file(task, data_dir, split)
    is_test = split == "test"
    # CoLA's test file has a header "index sentence", unlike its train and dev files.
    has_header = task.has_header or is_test
    rows = read_tsv(path, columns=None if has_header else task.columns, has_header=has_header)
    a_col, b_col = (task.test_text_a, task.test_text_b) if is_test else (task.text_a, task.text_b)
    used = [c for c in (a_col, b_col, None if is_test else task.label) if c is not None]
    needed = max(c + 1 if c >= 0 else -c for c in used)
    examples = []
    line_offset = 2 if has_header else 1
    for i, row in enumerate(rows):
        if len(row) < needed:
            raise InputError(f"{path}: line {i + line_offset} has {len(row)} columns, task {task.name} needs {needed}")
        label = None if is_test else _checked_label(task, row[task.label], path, i + line_offset)
        text_b = row[b_col] if b_col is not None else None
        examples.append(GlueExample(f"{split}-{i}", row[a_col], text_b, label))
    return examples


def _checked_label(task: GlueTask, value: str, path: Path, line: int) -> str | float:
    """The label of a train or dev row: one of the task's label strings, or a finite score for STS-B. Raises
    InputError naming file and line otherwise."""
    if task.is_regression:
        try:
            score = float(value)
        except ValueError:
            raise InputError(f"{path}: line {line}: score {value!r} is not a number") from None
        if not np.isfinite(score):  # nan would read as "no label" (test files), inf as an inf loss
            raise InputError(f"{path}: line {line}: score {score!r} is not a number")
        return score
    if value not in task.labels:
        raise InputError(f"{path}: line {line}: label {value!r} is not one of {', '.join(task.labels)}")
    return value


@dataclass
class GlueFeatures:
    """N encoded examples of length L: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, zero-padded."""

    input_ids: np.ndarray  # int32 [N, L]
    input_mask: np.ndarray  # int8 [N, L]
    segment_ids: np.ndarray  # int8 [N, L], 1 on b and its [SEP]
    labels: np.ndarray  # int64 [N] class index (-1 without label), or float32 [N] for regression (nan)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def truncate_pair_lengths(len_a: int, len_b: int, max_total: int) -> tuple[int, int]:
    """Lengths after removing pieces one at a time from the end of the longer side (b on ties) until
    len_a + len_b <= max_total."""
    excess = len_a + len_b - max_total
    if excess <= 0:
        return len_a, len_b
    # First cut the longer side down to the shorter one, then alternate (b first when equal).
    cut = min(excess, abs(len_a - len_b))
    if len_a > len_b:
        len_a -= cut
    else:
        len_b -= cut
    excess -= cut
    len_a -= excess // 2
    len_b -= excess - excess // 2
    return len_a, len_b


def min_seq_length(task: GlueTask) -> int:
    """The shortest max_seq_length that keeps a token of every sentence: [CLS] a [SEP] (b [SEP])."""
    return 3 if task.text_b is None else 5


def glue_features(
    examples: Sequence[GlueExample], task: GlueTask, tokenizer: FineTuningTokenizer, max_seq_length: int = 128
) -> GlueFeatures:
    """Tokenizes (in bulk) and lays out the examples; pairs are truncated longest-first to max_seq_length - 3,
    single sentences to max_seq_length - 2."""
    if max_seq_length < min_seq_length(task):
        raise InputError(f"max_seq_length {max_seq_length} is too short for {task.name}: it needs at least "
                         f"{min_seq_length(task)} ([CLS], [SEP] and one token of each sentence)")
    n = len(examples)
    cls_id, sep_id = tokenizer.vocab.id("[CLS]"), tokenizer.vocab.id("[SEP]")
    # "\n" separates lines for the tokenizer and is only whitespace to BERT.
    a_ids, a_off = tokenizer.encode_lines([e.text_a.replace("\n", " ") for e in examples])
    b_ids, b_off = tokenizer.encode_lines([(e.text_b or "").replace("\n", " ") for e in examples])
    input_ids = np.zeros((n, max_seq_length), np.int32)
    input_mask = np.zeros((n, max_seq_length), np.int8)
    segment_ids = np.zeros((n, max_seq_length), np.int8)
    for i, example in enumerate(examples):
        a = a_ids[a_off[i] : a_off[i + 1]]
        b = None if example.text_b is None else b_ids[b_off[i] : b_off[i + 1]]
        _lay_out_row(input_ids[i], segment_ids[i], input_mask[i], a, b, cls_id, sep_id)
    return GlueFeatures(input_ids, input_mask, segment_ids, _label_array(task, examples))


def _lay_out_row(ids: np.ndarray, segments: np.ndarray, mask: np.ndarray, a: np.ndarray, b: Optional[np.ndarray],
                 cls_id: int, sep_id: int) -> None:
    """Fills one zeroed row of each array with `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, truncated to the
    row's length (pairs longest-first)."""
    if b is None:
        la, lb = min(len(a), len(ids) - 2), 0
    else:
        la, lb = truncate_pair_lengths(len(a), len(b), len(ids) - 3)
    ids[0] = cls_id
    ids[1 : 1 + la] = a[:la]
    ids[1 + la] = sep_id
    end = 2 + la
    if b is not None:
        ids[end : end + lb] = b[:lb]
        ids[end + lb] = sep_id
        segments[end : end + lb + 1] = 1
        end += lb + 1
    mask[:end] = 1


def _label_array(task: GlueTask, examples: Sequence[GlueExample]) -> np.ndarray:
    """GlueFeatures.labels: class indexes (int64, -1 without label), or float32 scores (nan without label)."""
    if task.is_regression:
        return np.array([np.nan if e.label is None else e.label for e in examples], np.float32)
    index = {label: k for k, label in enumerate(task.labels)}
    return np.array([-1 if e.label is None else index[e.label] for e in examples], np.int64)


# ---------------------------------------------------------------------------------------------------------
# Metrics (numpy only)
# ---------------------------------------------------------------------------------------------------------
def accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of equal entries."""
    return float(np.mean(np.asarray(preds) == np.asarray(labels)))


def f1_binary(preds: np.ndarray, labels: np.ndarray) -> float:
    """F1 of the positive class 1 (0.0 when there is no true positive)."""
    preds, labels = np.asarray(preds), np.asarray(labels)
    tp = float(np.sum((preds == 1) & (labels == 1)))
    fp = float(np.sum((preds == 1) & (labels != 1)))
    fn = float(np.sum((preds != 1) & (labels == 1)))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def matthews_corrcoef(preds: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation (the multi-class form, equal to the binary one for two classes); 0.0 when
    either side is constant."""
    preds, labels = np.asarray(preds), np.asarray(labels)
    classes, inverse = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    k = len(classes)
    confusion = np.zeros((k, k), np.float64)
    np.add.at(confusion, (inverse[: len(labels)], inverse[len(labels) :]), 1)
    true_sum, pred_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, total = np.trace(confusion), confusion.sum()
    cov_tp = correct * total - true_sum @ pred_sum
    cov_pp = total * total - pred_sum @ pred_sum
    cov_tt = total * total - true_sum @ true_sum
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation coefficient."""
    x = np.asarray(x, np.float64) - np.mean(x)
    y = np.asarray(y, np.float64) - np.mean(y)
    return float((x @ y) / np.sqrt((x @ x) * (y @ y)))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Runs of equal values: each gets the mean of the positions it spans.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (Pearson of average ranks)."""
    return pearson(average_ranks(x), average_ranks(y))


def compute_metrics(task: GlueTask | str, preds: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's metrics: cola {"mcc"}; mrpc, qqp {"acc", "f1", "acc_and_f1"}; sts-b {"pearson",
    "spearmanr", "corr"}; the others {"acc"}. preds are class indexes (or scores for STS-B), like labels."""
    task = get_task(task) if isinstance(task, str) else task
    if task.metric == "mcc":
        return {"mcc": matthews_corrcoef(preds, labels)}
    if task.metric == "acc_and_f1":
        acc, f1 = accuracy(preds, labels), f1_binary(preds, labels)
        return {"acc": acc, "f1": f1, "acc_and_f1": (acc + f1) / 2}
    if task.metric == "corr":
        p, s = pearson(preds, labels), spearman(preds, labels)
        return {"pearson": p, "spearmanr": s, "corr": (p + s) / 2}
    return {"acc": accuracy(preds, labels)}
