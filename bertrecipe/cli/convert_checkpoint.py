"""Converts BERT weights between our checkpoints, NVIDIA's checkpoints and Hugging Face directories.

The source kind is recognized from its contents. The target kind follows from DST: a directory (an existing
one, or a path without a suffix) becomes a Hugging Face directory; a file (.pt/.bin) becomes a checkpoint
{"model": state_dict, "config": ...}, in NVIDIA's names when the source is ours or Hugging Face's and in ours
when the source is NVIDIA's. --to overrides the inference. A sharded checkpoint (the folder ckpt_<step>.dcp that
run_pretraining.py --sharding fsdp writes) becomes, in a file, the single ckpt_<step>.pt an unsharded run would have
written (the whole model and optimizer state: a run resumes from it on any number of processes), or with --to
nvidia its weights in NVIDIA's names; in a directory, a Hugging Face one.

With --vocab_file, the directory also gets the vocab (vocab.txt, or the tokenizer.json as it is) and what
transformers' AutoTokenizer needs besides it: tokenizer_config.json and special_tokens_map.json (the special tokens,
model_max_length, and for WordPiece the casing, which the vocab's tokens or its normalizer tell, else
--do_lower_case / --no-do_lower_case).

Nothing is deleted: into an existing directory only config.json, model.safetensors (and those vocab files) are
written, and an existing file of those, or an existing DST file, is replaced only with --overwrite. No file written
may be one of the inputs (SRC or its files, --config_file, --vocab_file). A --vocab_file must fit the model: not
more tokens than its word embeddings, nor far fewer (--allow_vocab_mismatch warns instead of the latter).

Examples:
  convert_checkpoint.py results/ckpt_8601.pt hf_bert/                      # ours -> Hugging Face
  convert_checkpoint.py hf_bert/ bert_nvidia.pt                             # Hugging Face -> NVIDIA names
  convert_checkpoint.py nvidia_ckpt.pt ours.pt --config_file bert_configs/large.json   # NVIDIA -> ours
  convert_checkpoint.py results/ckpt_8601.dcp ckpt_8601.pt                # sharded -> one training checkpoint
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable, refuse_input_as_output
from bertrecipe.model import sharded_checkpoint
from bertrecipe.model.torch_files import save_torch_atomic
from bertrecipe.model.weights import (
    check_export_target,
    export_huggingface,
    export_state_dict,
    huggingface_export_names,
    load_weights_into,
    model_for_weights,
    read_config,
    read_weights,
)
from bertrecipe.tokenization.vocab_files import (
    identity_from_record,
    identity_of,
    load_vocab_file,
    refuse_other_tokenizer,
    wordpiece_lower_case,
)
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH, Vocab, check_vocab_for_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="checkpoint file (ours or NVIDIA's) or Hugging Face directory")
    parser.add_argument("dst", type=Path, help="output: a directory for Hugging Face, a .pt/.bin file otherwise")
    parser.add_argument("--config_file", type=Path, help="bert_config.json, needed when SRC carries no config")
    parser.add_argument("--vocab_file", type=Path,
                        help="vocab.txt or tokenizer.json to place in a Hugging Face directory")
    parser.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction,
                        help="a WordPiece --vocab_file's casing, for tokenizer_config.json (default: what its tokens "
                             "or its normalizer tell)")
    parser.add_argument(ALLOW_VOCAB_MISMATCH, action="store_true",
                        help="warn instead of refusing a --vocab_file with far fewer tokens than the model embeds")
    parser.add_argument("--to", choices=("huggingface", "ours", "nvidia"), help="target kind (default: inferred)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing DST file, or the export's files in an existing DST directory")
    return parser.parse_args(argv)


def target_kind(dst: Path, source_format: str) -> str:
    if dst.is_dir() or not dst.suffix:
        return "huggingface"
    return "ours" if source_format == "nvidia" else "nvidia"


def check_export_paths(args: argparse.Namespace, kind: str) -> None:
    """Refuses, before anything is read or written, a file to write that is one of the inputs (SRC and its files,
    --config_file, --vocab_file) or cannot be written, one that would be overwritten without --overwrite, and a
    --vocab_file that is not a file."""
    if args.vocab_file is not None and not args.vocab_file.is_file():
        raise InputError(f"{args.vocab_file}: --vocab_file not found")
    if kind == "huggingface":
        names = huggingface_export_names(args.vocab_file)
        targets = [args.dst / name for name in names]
        check_export_target(args.dst, names, args.overwrite)
    else:
        targets = [args.dst]
        if args.dst.is_dir():
            raise InputError(f"{args.dst}: is a directory; a {kind} checkpoint is one .pt file (or pass --to "
                             "huggingface)")
        if args.dst.exists() and not args.overwrite:
            raise InputError(f"{args.dst}: exists; pass --overwrite to replace it or choose another name")
    inputs = [("the source (SRC)", args.src), ("--config_file", args.config_file), ("--vocab_file", args.vocab_file)]
    if args.src.is_dir():
        inputs += [("a file of the source (SRC)", path) for path in args.src.iterdir()]
    for target in [args.dst, *targets]:
        refuse_input_as_output(target, "DST", inputs, fix="choose another destination")
    for target in targets:
        check_writable(target, "DST")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.src.exists():
        raise InputError(f"{args.src}: no such checkpoint file or directory")
    # Whether DST is a directory or a file does not depend on the source's naming: check it before reading.
    exporting = (args.to or target_kind(args.dst, "ours")) == "huggingface"
    check_export_paths(args, "huggingface" if exporting else "checkpoint")
    if sharded_checkpoint.is_sharded_checkpoint(args.src) and not exporting and args.to != "nvidia":
        save_torch_atomic(sharded_checkpoint.whole_checkpoint(args.src), args.dst)
        print(f"{args.src} (sharded checkpoint) -> {args.dst} (one training checkpoint)")
        return
    weights = read_weights(args.src)
    config = read_config(args.config_file) if args.config_file else weights.config
    if config is None:
        raise InputError(f"{args.src}: carries no model config; pass --config_file bert_config.json")
    lower_case = args.do_lower_case
    if args.vocab_file is not None:  # placed beside the model: it must be the model's
        vocab = load_vocab_file(args.vocab_file)
        check_vocab_for_model(vocab, model_vocab_size=config.vocab_size, do_lower_case=args.do_lower_case,
                              allow_mismatch=args.allow_vocab_mismatch)
        refuse_other_tokenizer(identity_of(vocab), identity_from_record(weights.tokenizer, str(args.src)),
                               "pass the vocab the checkpoint was trained with", args.allow_vocab_mismatch)
        if isinstance(vocab, Vocab) and exporting:  # tokenizer_config.json states it: known before any write
            lower_case = wordpiece_lower_case(vocab, args.do_lower_case)
        elif not isinstance(vocab, Vocab) and args.do_lower_case is not None:
            print(f"warning: {args.vocab_file}: --do_lower_case does not apply to a tokenizer.json of byte-level BPE "
                  "(its own normalizer decides the casing); ignored", file=sys.stderr, flush=True)
    model = model_for_weights(weights, config)
    load_weights_into(model, weights, args.src)
    kind = args.to or target_kind(args.dst, weights.source_format)
    if kind == "huggingface":
        export_huggingface(model, args.dst, vocab_file=args.vocab_file, overwrite=args.overwrite,
                           do_lower_case=lower_case)
    else:
        save_torch_atomic({"model": export_state_dict(model, naming=kind), "config": config.to_dict(),
                           "tokenizer": weights.tokenizer}, args.dst)
    print(f"{args.src} ({weights.source_format}, {type(model).__name__}) -> {args.dst} ({kind})")


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
