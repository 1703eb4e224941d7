"""Answers one question about a context with a BERT QA model served by Triton (HTTP or gRPC).

    python triton/client.py --vocab_file vocab.txt --do_lower_case --question "Who ...?" --context "..." \
        --url 127.0.0.1:8000 --protocol http --model_name bert

The context is cut into the same sliding windows as inference.py and run_squad.py (squad.py), the windows are
sent to the server's input__0..2 (int64 ids, segments, mask) and its output__0/1 (start/end logits) become an
answer with the same n-best extraction as inference.py (question_answering.py). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
from typing import NoReturn, Optional, Sequence

from bertrecipe.cli import squad_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.cli.finetuning_flags import add_allow_vocab_mismatch
from bertrecipe.cli.triton_flags import add_server_arguments, client_from_args
from bertrecipe.common.files import read_text_file
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.finetuning.question_answering import answer_about_context, check_question


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(p)
    p.add_argument("--vocab_file", required=True)
    p.add_argument("--do_lower_case", action="store_true")
    add_allow_vocab_mismatch(p)
    p.add_argument("--question", required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--context")
    source.add_argument("--context_file")
    squad_flags.add_window_arguments(p)
    squad_flags.add_answer_arguments(p)
    args = p.parse_args(argv)
    check_question(args.question)
    context = args.context if args.context is not None else read_text_file(args.context_file, "--context_file")
    tokenizer = load_tokenizer(args.vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    qa = client_from_args(args)
    try:
        qa.check_ready()
        [result] = answer_about_context(lambda features: qa.logits(features, args.batch_size), tokenizer,
                                        [args.question], context, squad_flags.window_settings(args),
                                        squad_flags.answer_settings(args))
    finally:
        qa.close()
    print(json.dumps(result, indent=2, ensure_ascii=False))


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
