"""SQuAD evaluation exactly as the official evaluate-v1.1.py and evaluate-v2.0.py compute it, importable (the
command line is bertrecipe/cli/evaluate_squad.py).

The version comes from the data file (SQuAD 2.0 files say "version": "v2.0" or carry `is_impossible`).
v1.1 gives {"exact_match", "f1"}; v2.0 gives exact, f1, total, the HasAns_/NoAns_ breakdown and, with
na-probs, best_exact/best_f1 and their thresholds (in percent, like the official scripts).

Questions without a prediction are treated as the official scripts treat them, so that numbers compare:
- v1.1 scores such a question 0, still counts it in the total, and prints
  `Unanswered question <id> will receive score 0.` to stderr for each one;
- v2.0 leaves it out and prints `Missing prediction for <id>` to stdout (before the scores) for each one;
  exact, f1 and total are over the predicted questions. The official v2.0 script itself then stops with a
  KeyError in its HasAns_/NoAns_ breakdown, so it prints no scores at all; here the breakdown and best_* are
  over the predicted questions too (a group with no predicted question is left out, as the official script
  leaves out an empty group), consistent with the main scores. A v2.0 file with no prediction at all, where
  the official script divides by zero, is an error.
`strict` refuses predictions that miss any question instead. A prediction that is not a string, and a na-prob that is
not a finite number (a string, null, list, true, NaN), are refused naming their file and question, where the
official scripts fail on them. prediction_scores gives a run's exact_match and F1,
by this metric or by an official-style evaluation script.
"""
from __future__ import annotations

import json
import math
import numbers
import re
import string
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import read_json_file
from bertrecipe.finetuning.squad import SquadFile, as_squad_file, is_squad_v2

_PUNCTUATION = frozenset(string.punctuation)  # ASCII only, as the official scripts
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


# ---------------------------------------------------------------------------------------------------------
# Per-answer scores
# ---------------------------------------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """Lower-case, remove ASCII punctuation, remove the articles a/an/the, collapse whitespace."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match_score(prediction: str, gold: str) -> float:
    """1.0 when the normalized texts are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score_v1(prediction: str, gold: str) -> float:
    """Token F1 of the normalized texts, as evaluate-v1.1.py (two empty answers score 0)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score_v2(prediction: str, gold: str) -> float:
    """Token F1 as evaluate-v2.0.py: when either side normalizes to nothing, 1 if both do, else 0."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    return f1_score_v1(prediction, gold)


# ---------------------------------------------------------------------------------------------------------
# Data set scores
# ---------------------------------------------------------------------------------------------------------
def _questions(dataset: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [qa for article in dataset for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


def _missing_predictions(
    questions: list[dict[str, Any]], predictions: dict[str, Any], pred_file: str, strict: bool
) -> list[str]:
    """Ids of the questions without a prediction, in data order; InputError for predictions that are not
    strings, for a data set without questions, and (strict) for any missing prediction."""
    if not isinstance(predictions, dict):
        raise InputError(f"{pred_file}: predictions must be a JSON object mapping question ids to answers")
    if not questions:
        raise InputError("the data set holds no questions to score")
    missing = [qa["id"] for qa in questions if qa["id"] not in predictions]
    if missing and strict:
        raise InputError(
            f"{pred_file}: no prediction for {len(missing)} of {len(questions)} questions (first: {missing[0]});"
            " without --strict they are scored as the official scripts do"
        )
    for qa in questions:
        if qa["id"] in predictions and not isinstance(predictions[qa["id"]], str):
            raise InputError(f"{pred_file}: the prediction for {qa['id']} is {_described(predictions[qa['id']])}, "
                             "not a string; give each question its answer text (\"\" for no answer)")
    return missing


def _described(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."  # a pasted blob must not flood the one-line error


def checked_na_probs(na_probs: Any, source: str = "na-prob file") -> dict[str, float]:
    """The na-probs (question id -> no-answer score: a probability, or run_squad's null odds) as floats; InputError
    "<source>: ..." naming the first question whose value is not a finite number (bool is none), since the
    thresholds compare and sort them all, those of questions outside the data file included."""
    if not isinstance(na_probs, dict):
        raise InputError(f"{source}: must hold a JSON object mapping question ids to no-answer probabilities")
    for qid, value in na_probs.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise InputError(f"{source}: the no-answer probability of question {qid} is {_described(value)}, "
                             "expected a finite number; write one for every question")
    return {qid: float(value) for qid, value in na_probs.items()}


def evaluate_v1(
    dataset: list[dict[str, Any]],
    predictions: dict[str, str],
    pred_file: str = "predictions",
    strict: bool = False,
) -> dict[str, float]:
    """{"exact_match", "f1"} in percent over every question of `dataset` (the file's "data" list), each the
    maximum over its gold answers. As evaluate-v1.1.py, a question without a prediction scores 0 and is
    reported on stderr; with `strict` it raises InputError instead."""
    questions = _questions(dataset)
    _missing_predictions(questions, predictions, pred_file, strict)
    exact = f1 = 0.0
    for qa in questions:
        if qa["id"] not in predictions:
            print(f"Unanswered question {qa['id']} will receive score 0.", file=sys.stderr)
            continue
        golds = [answer["text"] for answer in qa["answers"]]
        prediction = predictions[qa["id"]]
        exact += max(exact_match_score(prediction, gold) for gold in golds)
        f1 += max(f1_score_v1(prediction, gold) for gold in golds)
    total = len(questions)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def raw_scores_v2(
    dataset: list[dict[str, Any]], predictions: dict[str, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-question exact and F1 (0/1 and [0, 1]) of the questions that have a prediction; a question whose
    gold answers all normalize to nothing has the single gold answer ""."""
    exact: dict[str, float] = {}
    f1: dict[str, float] = {}
    for qa in _questions(dataset):
        if qa["id"] not in predictions:
            continue
        golds = [answer["text"] for answer in qa["answers"] if normalize_answer(answer["text"])] or [""]
        prediction = predictions[qa["id"]]
        exact[qa["id"]] = max(exact_match_score(prediction, gold) for gold in golds)
        f1[qa["id"]] = max(f1_score_v2(prediction, gold) for gold in golds)
    return exact, f1


def _apply_threshold(
    scores: dict[str, float], na_probs: dict[str, float], has_answer: dict[str, bool], threshold: float
) -> dict[str, float]:
    # A question predicted unanswerable scores 1 exactly when it has no answer.
    return {
        qid: float(not has_answer[qid]) if na_probs[qid] > threshold else score for qid, score in scores.items()
    }


def _summary(exact: dict[str, float], f1: dict[str, float], qids: Optional[list[str]] = None) -> dict[str, Any]:
    qids = list(exact) if qids is None else [q for q in qids if q in exact]
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / total,
        "f1": 100.0 * sum(f1[q] for q in qids) / total,
        "total": total,
    }


def _best_threshold(
    predictions: dict[str, str], scores: dict[str, float], na_probs: dict[str, float], has_answer: dict[str, bool]
) -> tuple[float, float]:
    """Best score (percent) over thresholds on the na-prob, and that threshold: start from "answer nothing
    anywhere", then answer questions in increasing na-prob order. Over the scored (predicted) questions only,
    the same questions as the denominator (the official script counts every no-answer question of the data
    set at the start; the two agree whenever every question has a prediction)."""
    current = best = sum(1 for qid in scores if not has_answer[qid])
    best_threshold = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best = current
            best_threshold = na_probs[qid]
    return 100.0 * best / len(scores), best_threshold


def evaluate_v2(
    dataset: list[dict[str, Any]],
    predictions: dict[str, str],
    na_probs: Optional[dict[str, float]] = None,
    na_prob_thresh: float = 1.0,
    pred_file: str = "predictions",
    strict: bool = False,
) -> dict[str, Any]:
    """The evaluate-v2.0.py summary: exact, f1, total, HasAns_*/NoAns_* (when such questions exist) and, given
    na_probs (qid -> probability of no answer), best_exact, best_exact_thresh, best_f1, best_f1_thresh.
    A question counts as answerable when its `answers` list is not empty. A question without a prediction is
    left out of every number and reported on stdout, as evaluate-v2.0.py does (InputError with `strict`, or
    when no question has one); every predicted question needs a probability in na_probs."""
    questions = _questions(dataset)
    missing = _missing_predictions(questions, predictions, pred_file, strict)
    if na_probs is not None:
        na_probs = checked_na_probs(na_probs)
    if len(missing) == len(questions):
        raise InputError(f"{pred_file}: no prediction for any of the {len(questions)} questions")
    has_answer = {qa["id"]: bool(qa["answers"]) for qa in questions}
    exact_raw, f1_raw = raw_scores_v2(dataset, predictions)
    probs = na_probs if na_probs is not None else {qid: 0.0 for qid in predictions}
    missing_probs = [qid for qid in exact_raw if qid not in probs]
    if missing_probs:
        raise InputError(f"na-prob file: no probability for question {missing_probs[0]}")  # named by the caller
    for qid in missing:  # after the errors: a refused file prints only the error line
        print(f"Missing prediction for {qid}")
    exact = _apply_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1 = _apply_threshold(f1_raw, probs, has_answer, na_prob_thresh)
    result = _summary(exact, f1)
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has == wanted and qid in exact]
        if qids:  # a group without predicted questions is left out, like an empty group
            for key, value in _summary(exact, f1, qids).items():
                result[f"{prefix}_{key}"] = value
    if na_probs is not None:
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(predictions, exact_raw, probs, has_answer)
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(predictions, f1_raw, probs, has_answer)
    return result


# ---------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------
def _load_json_object(path: str | Path, what: str) -> dict[str, Any]:
    value = read_json_file(path, f"{what} file")
    if not isinstance(value, dict):
        raise InputError(f"{path}: the {what} file must hold a JSON object")
    return value


def evaluate_predictions(
    data_file: SquadFile | str | Path,
    predictions: dict[str, str],
    na_probs: Optional[dict[str, float]] = None,
    na_prob_thresh: float = 1.0,
    strict: bool = False,
    pred_file: str = "predictions",
) -> dict[str, Any]:
    """The official summary of `predictions` (qid -> text) against a SQuAD data file of either version, for
    training scripts (in process) and the command line. For v2.0, na_probs (e.g. the null odds) adds best_*.
    Missing predictions are handled as the official scripts do, or refused with `strict`. `pred_file` names the
    predictions in error messages."""
    squad_file = as_squad_file(data_file)
    data = squad_file.data
    try:
        if not _questions(data["data"]):
            raise InputError(f"{squad_file.path}: the data file holds no questions to score")
        if is_squad_v2(data):
            return evaluate_v2(data["data"], predictions, na_probs, na_prob_thresh, pred_file, strict)
        return evaluate_v1(data["data"], predictions, pred_file, strict)
    except (KeyError, TypeError, AttributeError) as error:
        raise InputError(f"{squad_file.path}: not a SQuAD file ({type(error).__name__}: {error})") from None


def evaluate_files(
    data_file: SquadFile | str | Path,
    pred_file: str | Path,
    na_prob_file: Optional[str | Path] = None,
    na_prob_thresh: float = 1.0,
    strict: bool = False,
) -> dict[str, Any]:
    """evaluate_predictions with the predictions (and na-probs) read from JSON files."""
    squad_file = as_squad_file(data_file)  # a bad data file is reported first
    predictions = _load_json_object(pred_file, "predictions")
    # Checked here for either version: a v1.1 evaluation does not use it, but a file given must be a good one.
    na_probs = checked_na_probs(_load_json_object(na_prob_file, "na-prob"), str(na_prob_file)) if na_prob_file \
        else None
    try:
        return evaluate_predictions(squad_file, predictions, na_probs, na_prob_thresh, strict, str(pred_file))
    except InputError as error:
        if str(error).startswith("na-prob file:"):
            raise InputError(f"{na_prob_file}:{str(error).removeprefix('na-prob file:')}") from None
        raise


def prediction_scores(data_file: SquadFile | str | Path, pred_file: str | Path,
                      na_prob_file: Optional[str | Path] = None, eval_script: Optional[str] = None) -> dict[str, float]:
    """exact_match and F1 (and the summary's other numbers) of a predictions file against a SQuAD data file, by the
    official metric in process (evaluate_files) or by an official-style evaluation script; v2.0: "exact" read as
    exact_match."""
    if eval_script:  # the script reads the file itself
        path = data_file.path if isinstance(data_file, SquadFile) else data_file
        scores = _run_eval_script(eval_script, path, pred_file, na_prob_file)
    else:
        scores = evaluate_files(data_file, pred_file, na_prob_file)
    result = {"exact_match": float(scores.get("exact_match", scores.get("exact", float("nan")))),
              "F1": float(scores["f1"])}
    result.update({k: v for k, v in scores.items() if k not in ("exact_match", "exact", "f1")
                   and isinstance(v, (int, float))})
    return result


def _run_eval_script(script: str, data_file: str | Path, pred_file: str | Path,
                     na_file: Optional[str | Path]) -> dict[str, Any]:
    """The JSON scores an official-style evaluation script prints."""
    cmd = [sys.executable, script, str(data_file), str(pred_file)]
    if na_file is not None:
        cmd += ["--na-prob-file", str(na_file)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise InputError(f"{script}: exited with {done.returncode}: {done.stderr.strip()[-300:]}")
    try:
        return json.loads(done.stdout[done.stdout.index("{"):])
    except ValueError:
        raise InputError(f"{script}: printed no JSON scores ({done.stdout.strip()[:200]!r})") from None
