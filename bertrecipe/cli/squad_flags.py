"""SQuAD from the command line: the flags that run_squad.py, inference.py, deployer.py and the Triton clients share
(defined here once, so every entry point has the same names, defaults and help), the settings they make, and the
steps that read parsed flags (features of a SQuAD file through the feature cache, scoring of predictions.json) which
run_squad.py and triton/run_squad_client.py both run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from bertrecipe.finetuning import squad_metrics as evaluate_squad
from bertrecipe.finetuning import squad
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning.squad_answers import AnswerSettings


def add_window_arguments(p: argparse.ArgumentParser) -> None:
    """How a context is cut into windows (squad.WindowSettings)."""
    p.add_argument("--max_seq_length", type=int, default=384, help="tokens per window: question, document, "
                   "[CLS] and two [SEP]")
    p.add_argument("--doc_stride", type=int, default=128, help="document tokens between window starts")
    p.add_argument("--max_query_length", type=int, default=64, help="question tokens kept (the rest are cut)")


def add_answer_arguments(p: argparse.ArgumentParser) -> None:
    """How answers are taken from the logits (squad_answers.AnswerSettings, with --do_lower_case)."""
    p.add_argument("--n_best_size", type=int, default=20)
    p.add_argument("--max_answer_length", type=int, default=30)
    p.add_argument("--version_2_with_negative", action="store_true", help="SQuAD 2.0: questions may have no answer")
    p.add_argument("--null_score_diff_threshold", type=float, default=0.0,
                   help="SQuAD 2.0: answer nothing when null score - best span score exceeds this")


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    """Where features_for keeps the features of a SQuAD file."""
    p.add_argument("--skip_cache", action="store_true", help="neither read nor write the feature cache")
    p.add_argument("--cache_dir", help="feature cache folder (default: the data file's, else --output_dir)")


def add_eval_script_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval_script", help="an external evaluation script (e.g. the official evaluate-v1.1.py; "
                   "default: the official metric in process)")


def window_settings(args: argparse.Namespace) -> squad.WindowSettings:
    return squad.WindowSettings(args.max_seq_length, args.doc_stride, args.max_query_length)


def answer_settings(args: argparse.Namespace) -> AnswerSettings:
    return AnswerSettings(args.n_best_size, args.max_answer_length, args.do_lower_case, args.version_2_with_negative,
                          args.null_score_diff_threshold)


def cache_dir_for(args: argparse.Namespace, data_file: str) -> Optional[Path]:
    if args.skip_cache:
        return None
    if args.cache_dir:
        return Path(args.cache_dir)
    beside = Path(data_file).resolve().parent  # NVIDIA caches beside the data; not possible on read-only data
    return beside if os.access(beside, os.W_OK) else Path(args.output_dir)


def features_for(args: argparse.Namespace, tokenizer: Any, data_file: str, is_training: bool,
                 cache_writes: Optional[list[Callable[[], None]]] = None,
                 ) -> tuple[list[squad.SquadExample], squad.SquadFeatures]:
    """The examples and windowed features of a SQuAD file, through the feature cache. With `cache_writes`, a
    missing cache entry is not written but its write appended there, to run once every input is checked."""
    examples = squad.read_squad_examples(data_file, is_training, args.version_2_with_negative)
    if not examples:
        raise InputError(f"{data_file}: no {'usable training ' if is_training else ''}questions "
                         f"(--{'train' if is_training else 'predict'}_file needs at least one)")
    settings = window_settings(args)
    features = squad.cached_features(examples, tokenizer, settings, is_training, data_file,
                                     args.version_2_with_negative, cache_dir_for(args, data_file), cache_writes)
    if len(features) == 0:
        raise InputError(f"{data_file}: no features (no questions with a usable context)")
    return examples, features


def evaluate(args: argparse.Namespace, files: Optional[dict[str, Path]] = None) -> dict[str, float]:
    """exact_match and F1 of output_dir/predictions.json, or of this run's staged `files` (by name); v2.0:
    "exact" read as exact_match."""
    if files is None:
        files = {name: Path(args.output_dir) / name for name in ("predictions.json", "null_odds.json")}
    pred_file = files["predictions.json"]
    null_odds = files.get("null_odds.json") if args.version_2_with_negative else None
    na_file = null_odds if null_odds is not None and null_odds.is_file() else None
    if args.eval_script:
        scores = _run_eval_script(args.eval_script, args.predict_file, pred_file, na_file)
    else:
        scores = evaluate_squad.evaluate_files(args.predict_file, pred_file, na_file)
    result = {"exact_match": float(scores.get("exact_match", scores.get("exact", float("nan")))),
              "F1": float(scores["f1"])}
    result.update({k: v for k, v in scores.items() if k not in ("exact_match", "exact", "f1")
                   and isinstance(v, (int, float))})
    return result


def _run_eval_script(script: str, predict_file: str, pred_file: Path, na_file: Optional[Path]) -> dict[str, Any]:
    """The JSON scores an official-style evaluation script prints."""
    cmd = [sys.executable, script, predict_file, str(pred_file)]
    if na_file is not None:
        cmd += ["--na-prob-file", str(na_file)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise InputError(f"{script}: exited with {done.returncode}: {done.stderr.strip()[-300:]}")
    try:
        return json.loads(done.stdout[done.stdout.index("{"):])
    except ValueError:
        raise InputError(f"{script}: printed no JSON scores ({done.stdout.strip()[:200]!r})") from None
