"""The official SQuAD v1.1 / v2.0 evaluation as a drop-in command line (the scoring is
bertrecipe/finetuning/squad_metrics.py):

    python evaluate_squad.py DATA_FILE PRED_FILE [--na-prob-file F] [--na-prob-thresh T] [--out-file F] [--strict]

v1.1 prints {"exact_match", "f1"} on one line; v2.0 prints its summary indented (not at all with --out-file), as
the official scripts do. Questions without a prediction are handled as the official scripts handle them (see
squad_metrics); a v2.0 file with no prediction at all is an error (exit 2).
A prediction that is not a string, or a --na-prob-file value that is not a finite number (checked whenever the file
is given), is one line naming that file and the question (exit 2). `--strict` refuses predictions that miss any
question (exit 2); `--allow-missing`, once needed to get the
v1.1 behaviour, is accepted and changes nothing. `--out-file` must name a file in an existing, writable folder,
none of the input files (checked before anything is read); it is written whole or not at all. Standard output
sent into an input file (`> pred.json`) is refused too.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable, refuse_input_as_output
from bertrecipe.finetuning.squad_metrics import evaluate_files


def check_out_file(path: str | Path, inputs: Sequence[tuple[str, Optional[str]]] = ()) -> Path:
    """The --out-file path, checked before any work: not a directory, in a writable folder that exists, none of
    the (flag, path) inputs. The folder is not created: a mistyped path should fail here, not leave new folders
    behind."""
    out = Path(path)
    try:
        refuse_input_as_output(out, "--out-file", inputs)
        if out.is_dir():
            raise InputError(f"{out}: --out-file is a directory; give a file name such as {out / 'eval.json'}")
        folder = out.parent
        if not folder.is_dir():
            problem = "is not a folder" if folder.exists() else "does not exist (create it first)"
            raise InputError(f"{out}: the --out-file folder {folder} {problem}, or choose another path")
        check_writable(out, "--out-file")
    except OSError as error:  # e.g. a name too long for the file system
        raise InputError(f"{out}: cannot be used as --out-file ({error.strerror})") from None
    return out


def write_scores(path: Path, result: dict[str, Any]) -> None:
    """The scores as one JSON line (as evaluate-v2.0.py writes them), written atomically: a failed write leaves
    no partial file."""
    text = json.dumps(result)
    try:
        write_atomic(path, lambda f: f.write(text.encode("utf-8")))
    except OSError as error:
        raise InputError(f"{path}: cannot write the scores ({error.strerror})") from None


def _parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(description="Official SQuAD v1.1 / v2.0 evaluation (version from the data file).")
    parser.add_argument("data_file", metavar="data.json", help="SQuAD data file (v1.1 or v2.0)")
    parser.add_argument("pred_file", metavar="pred.json", help="predictions: question id -> answer text")
    parser.add_argument("--out-file", "-o", metavar="eval.json", help="write the scores here (v2.0: instead of stdout)")
    parser.add_argument("--na-prob-file", "-n", metavar="na_prob.json", help="v2.0: question id -> no-answer score")
    parser.add_argument(
        "--na-prob-thresh", "-t", type=float, default=1.0,
        help="v2.0: predict no answer when the na-prob is above this (default 1.0)",
    )
    parser.add_argument(
        "--strict", action="store_true",
        help="refuse predictions that miss a question (exit 2) instead of the official scripts' handling",
    )
    parser.add_argument(
        "--allow-missing", action="store_true",
        help="accepted for compatibility; missing predictions are handled as the official scripts do by default",
    )
    args = parser.parse_args(argv)
    if args.strict and args.allow_missing:
        raise InputError("--strict and --allow-missing contradict each other: pass one of them")
    return args


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = _parse_args(argv)
    inputs = [("data.json", args.data_file), ("pred.json", args.pred_file), ("--na-prob-file", args.na_prob_file)]
    out_file = check_out_file(args.out_file, inputs) if args.out_file else None
    # `> pred.json` has emptied the predictions before this runs: say so rather than "malformed JSON".
    refuse_input_as_output("/dev/stdout", "the standard output", inputs, fix="send the output (>) to another file")
    result = evaluate_files(args.data_file, args.pred_file, args.na_prob_file, args.na_prob_thresh, args.strict)
    is_v2 = "exact" in result
    if out_file is not None:
        write_scores(out_file, result)
    # The official scripts print v1.1 on one line and v2.0 indented by 2 (v2.0 not at all with --out-file).
    if not (is_v2 and out_file is not None):
        print(json.dumps(result, indent=2) if is_v2 else json.dumps(result))
    return result


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
