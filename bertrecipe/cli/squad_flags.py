"""SQuAD from the command line: the flags that run_squad.py, inference.py, deployer.py and the Triton clients share
(defined here once, so every entry point has the same names, defaults and help), the settings they make, and the
features of a SQuAD file in the flags' cache folder (squad.examples_and_features), which run_squad.py and
triton/run_squad_client.py both read.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, Optional

from bertrecipe.finetuning import squad
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


def cache_dir_for(args: argparse.Namespace, data_file: Path) -> Optional[Path]:
    if args.skip_cache:
        return None
    if args.cache_dir:
        return Path(args.cache_dir)
    beside = data_file.resolve().parent  # NVIDIA caches beside the data; not possible on read-only data
    return beside if os.access(beside, os.W_OK) else Path(args.output_dir)


def features_for(args: argparse.Namespace, tokenizer: Any, squad_file: squad.SquadFile, is_training: bool,
                 cache_writes: Optional[list[Callable[[], None]]] = None,
                 ) -> tuple[list[squad.SquadExample], squad.SquadFeatures]:
    """squad.examples_and_features of a SQuAD file with the flags' window settings and cache folder. With
    `cache_writes`, a missing cache entry is not written but its write appended there, to run once every input is
    checked."""
    return squad.examples_and_features(squad_file, tokenizer, window_settings(args), is_training,
                                       args.version_2_with_negative, cache_dir_for(args, squad_file.path),
                                       cache_writes)
