"""Per-token activations of chosen layers of a BERT, as Google's and NVIDIA's extract_features.py write them (same
flags, same JSON lines): one line per input line, {"linex_index": i, "features": [{"token": t, "layers": [{"index":
l, "values": [...]}]}]}, values rounded to 6 decimals.

An input line is one text, or two joined by " ||| ". --layers takes Google's indexes: -1 the last layer's output,
-2 the one before, 0 the first layer's (the embeddings are not among them). --init_checkpoint is a checkpoint of
ours or NVIDIA's, or a Hugging Face folder, of either family; its config comes from --bert_config_file or the
checkpoint. The output is written whole or not at all.

Example:
  python extract_features.py --input_file input.txt --output_file output.jsonl --vocab_file vocab.txt \\
      --bert_config_file bert_config.json --init_checkpoint ckpt_8601.pt --layers -1,-2,-3,-4 --max_seq_length 128
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import torch

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.common.hardware import recipe_device
from bertrecipe.common.output_paths import check_writable, refuse_input_as_output
from bertrecipe.deploy.feature_extraction import (
    check_length,
    lay_out,
    layer_numbers,
    read_extraction_inputs,
    write_features,
)
from bertrecipe.finetuning.embedding import bare_encoder
from bertrecipe.finetuning.model_loading import build_model, config_and_weights, load_tokenizer
from bertrecipe.model.capture import encoder_layers
from bertrecipe.pretraining.run_tokenizer import released_vocab_file
from bertrecipe.tokenization.vocab_files import load_vocab_file, wordpiece_lower_case
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH, Vocab


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_file", required=True, help="text, one input a line (a pair: `text a ||| text b`)")
    p.add_argument("--output_file", required=True, help="the JSON lines to write")
    p.add_argument("--layers", default="-1,-2,-3,-4", help="comma-separated layer indexes (-1: the last layer)")
    p.add_argument("--bert_config_file", "--config_file", dest="bert_config_file",
                   help="the model's config (default: the checkpoint's own)")
    p.add_argument("--init_checkpoint", required=True, help="our or NVIDIA's checkpoint, or a Hugging Face folder")
    p.add_argument("--vocab_file", help="vocab.txt or tokenizer.json (default: the folder's own)")
    p.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction,
                   help="lower-case the text (default: what the vocab's tokens tell; Google's default, lower-cased, "
                        "for an uncased vocab)")
    p.add_argument("--max_seq_length", type=int, default=128, help="tokens a row, [CLS] and [SEP] included")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--no_cuda", action="store_true", help="run on the CPU even where a GPU is present")
    p.add_argument(ALLOW_VOCAB_MISMATCH, action="store_true", help="warn instead of refusing a vocab that does not "
                                                                  "fit the model or its casing")
    return p.parse_args(argv)


def layer_indexes(text: str) -> list[int]:
    try:
        indexes = [int(part) for part in text.split(",")]
    except ValueError:
        raise InputError(f"--layers {text!r}: comma-separated whole numbers, e.g. -1,-2,-3,-4") from None
    if len(set(indexes)) != len(indexes):
        raise InputError(f"--layers {text!r}: an index is given twice")
    return indexes


def vocab_file_of(args: argparse.Namespace) -> str:
    found = args.vocab_file or released_vocab_file(args.init_checkpoint)
    if found is None:
        raise InputError(f"{args.init_checkpoint}: no vocab.txt or tokenizer.json beside the weights; "
                         "pass --vocab_file")
    return str(found)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    indexes = layer_indexes(args.layers)
    if args.batch_size < 1:
        raise InputError(f"--batch_size {args.batch_size}: at least 1")
    inputs = read_extraction_inputs(args.input_file)
    check_length(args.max_seq_length, any(item.text_b is not None for item in inputs))
    output = Path(args.output_file)
    refuse_input_as_output(output, "--output_file", [("--input_file", Path(args.input_file)),
                                                     ("--init_checkpoint", Path(args.init_checkpoint))],
                           fix="choose another output file")
    check_writable(output, "--output_file")
    vocab_file = vocab_file_of(args)
    vocab = load_vocab_file(vocab_file)
    lower_case = wordpiece_lower_case(vocab, args.do_lower_case) if isinstance(vocab, Vocab) else False
    tokenizer = load_tokenizer(vocab_file, lower_case, args.allow_vocab_mismatch)
    config, weights = config_and_weights(args.bert_config_file, args.init_checkpoint)
    encoder = build_model(bare_encoder, config, weights, args.init_checkpoint, tokenizer.vocab, args.max_seq_length,
                          args.allow_vocab_mismatch)
    layer_numbers(indexes, encoder_layers(encoder))  # an index the model lacks is refused before any write
    device = torch.device("cpu" if args.no_cuda else recipe_device())
    rows = lay_out(tokenizer, inputs, args.max_seq_length)
    write_atomic(output, lambda f: write_features(f, encoder.to(device), inputs, rows, indexes, args.batch_size,
                                                  device))
    print(f"{args.output_file}: {len(inputs)} lines, layers {args.layers}", file=sys.stderr, flush=True)


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
