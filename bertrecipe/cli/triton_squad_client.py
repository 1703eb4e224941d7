"""SQuAD prediction through a Triton server: a SQuAD JSON file -> predictions.json -> exact match and F1.

    python triton/run_squad_client.py --predict_file dev-v1.1.json --vocab_file vocab.txt --do_lower_case \
        --output_dir results/triton --url 127.0.0.1:8001 --protocol grpc --model_name bert

Windows, answer extraction, prediction files and scoring are run_squad.py's own (same flags and defaults, from
squad_flags.py), so for the same model the predictions equal `run_squad.py --do_predict --do_eval`'s. Prints the
scores as JSON.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from bertrecipe.cli import squad_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.cli.finetuning_flags import add_allow_vocab_mismatch
from bertrecipe.cli.triton_flags import add_server_arguments, check_server, client_from_args
from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable_folder, refuse_input_as_output
from bertrecipe.finetuning import squad, squad_answers, squad_task
from bertrecipe.finetuning.model_loading import load_tokenizer


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(p)
    p.add_argument("--predict_file", required=True, help="SQuAD JSON, e.g. dev-v1.1.json")
    p.add_argument("--vocab_file", required=True)
    p.add_argument("--do_lower_case", action="store_true")
    add_allow_vocab_mismatch(p)
    p.add_argument("--output_dir", required=True, help="where predictions.json and nbest_predictions.json go")
    squad_flags.add_window_arguments(p)
    squad_flags.add_answer_arguments(p)
    squad_flags.add_eval_script_argument(p)
    squad_flags.add_cache_arguments(p)
    args = p.parse_args(argv)
    if args.batch_size < 1:
        raise InputError("--batch_size must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    return predict_and_score(parse_args(argv))


def predict_and_score(args: argparse.Namespace) -> dict[str, Any]:
    """Writes the predictions of --predict_file's windows as the server answers them, scores them, prints and
    returns the scores."""
    check_writable_folder(args.output_dir, "--output_dir")  # the folder itself is made by the first write
    names = ["predictions.json", "nbest_predictions.json"] + ["null_odds.json"] * args.version_2_with_negative
    inputs = [("--predict_file", args.predict_file), ("--vocab_file", args.vocab_file),
              ("--eval_script", args.eval_script)]
    for name in names:  # written by squad_answers.write_predictions
        refuse_input_as_output(Path(args.output_dir) / name, f"{name} (in --output_dir)", inputs,
                               fix="choose another --output_dir")
    tokenizer = load_tokenizer(args.vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    check_server(args)  # a dead server is reported before the features, which take a minute on a full dev set
    predict_file = squad.read_squad_file(args.predict_file)  # read once: examples, feature-cache key and scoring
    examples, features = squad_flags.features_for(args, tokenizer, predict_file, is_training=False)
    qa = client_from_args(args)
    began = time.perf_counter()
    try:
        start, end = qa.logits(features, args.batch_size)
    finally:
        qa.close()
    seconds = time.perf_counter() - began
    predictions = squad_answers.extract_answers(examples, features, start, end, tokenizer.vocab,
                                                squad_flags.answer_settings(args))
    written = squad_answers.write_predictions(args.output_dir, predictions, args.version_2_with_negative)
    scores = squad_task.score_prediction_files(predict_file, {path.name: path for path in written},
                                               args.version_2_with_negative, args.eval_script)
    scores.update(e2e_inference_time=seconds, inference_sequences_per_second=len(features) / seconds)
    print(json.dumps(scores, indent=2))
    return scores


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
