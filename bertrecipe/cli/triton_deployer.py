"""Exports a fine-tuned SQuAD (or GLUE) checkpoint to a Triton Inference Server model repository.

    python triton/deployer.py --init_checkpoint results/pytorch_model.bin --vocab_file vocab.txt --do_lower_case \
        --predict_file dev-v1.1.json --format onnx --model_repository triton/model_repository --model_name bert \
        --max_batch_size 8 --dynamic_batching --preferred_batch_sizes 4 8 --max_queue_delay_us 100

writes <model_repository>/<model_name>/<model_version>/model.onnx (or model.pt for --format torchscript) and
<model_repository>/<model_name>/config.pbtxt. Inputs input__0, input__1, input__2 are int64 [batch, seq] token
ids, segment ids and attention mask; outputs output__0 and output__1 are float32 [batch, seq] start and end
logits (GLUE: output__0 alone, float32 [batch, num_labels]). Batch and sequence axes are dynamic. Before
anything is written, the export is run on real SQuAD features (--predict_file, else a built-in paragraph) at
two batch sizes and two lengths and compared with PyTorch; a maximum absolute difference above --tolerance is
refused (exit 2) and leaves the repository as it was.

--int8 writes the int8 model instead (ONNX Runtime's dynamic quantization of the linear layers, for CPU instances:
about 2-3x the fp32 model's sequences per second on a CPU with VNNI, docs/benchmarks.md); its check accepts a
difference up to --int8_tolerance of the largest logit.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, NoReturn, Optional, Sequence

import torch

from bertrecipe.cli import squad_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.cli.finetuning_flags import add_allow_vocab_mismatch
from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import inside
from bertrecipe.deploy.model_repository import PLATFORMS, TritonSettings, deploy
from bertrecipe.deploy.onnx_export import TritonSignature
from bertrecipe.deploy.serving import sample_inputs
from bertrecipe.finetuning import model_loading
from bertrecipe.model.families import question_answering_model, sequence_classification_model


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init_checkpoint", required=True, help="fine-tuned pytorch_model.bin, NVIDIA's or a HF folder")
    p.add_argument("--config_file", help="bert_config.json (default: the checkpoint's own)")
    p.add_argument("--vocab_file", required=True)
    p.add_argument("--do_lower_case", action="store_true")
    add_allow_vocab_mismatch(p)
    p.add_argument("--task", choices=("squad", "glue"), default="squad")
    p.add_argument("--num_labels", type=int, default=2, help="GLUE: classes (1 for regression)")
    p.add_argument("--predict_file", help="SQuAD JSON whose first windows check the export (default: built in)")
    squad_flags.add_window_arguments(p)
    p.add_argument("--format", choices=tuple(PLATFORMS), default="onnx")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--tolerance", type=float, default=1e-3, help="largest accepted |export - PyTorch| (fp32)")
    p.add_argument("--int8", action="store_true",
                   help="export the int8 model (ONNX Runtime dynamic quantization of the linear layers) for CPU "
                        "serving; needs --format onnx and KIND_CPU instances (the default with --int8)")
    p.add_argument("--int8_tolerance", type=float, default=0.25,
                   help="--int8: largest accepted |export - PyTorch| as a share of PyTorch's largest |logit| (int8 "
                        "weights move logits by a few percent, up to about 15 %% on short inputs; a broken export by "
                        "their whole size)")
    p.add_argument("--model_repository", default="triton/model_repository")
    p.add_argument("--model_name", default="bert")
    p.add_argument("--model_version", type=int, default=1)
    p.add_argument("--max_batch_size", type=int, default=8)
    p.add_argument("--dynamic_batching", action="store_true")
    p.add_argument("--preferred_batch_sizes", type=int, nargs="*", default=[])
    p.add_argument("--max_queue_delay_us", type=int, default=100)
    p.add_argument("--instance_count", type=int, default=1)
    p.add_argument("--instance_kind", choices=("KIND_GPU", "KIND_CPU"),
                   help="where Triton runs the model (default KIND_GPU; KIND_CPU with --int8)")
    p.add_argument("--seed", type=int, default=42, help="initializes heads the checkpoint lacks, reproducibly")
    args = p.parse_args(argv)
    if args.max_batch_size < 1 or args.instance_count < 1 or args.model_version < 1:
        raise InputError("--max_batch_size, --instance_count and --model_version must be at least 1")
    if any(not 1 <= size <= args.max_batch_size for size in args.preferred_batch_sizes):
        raise InputError(f"--preferred_batch_sizes must lie in 1..--max_batch_size ({args.max_batch_size})")
    check_int8_flags(args)
    return args


def check_int8_flags(args: argparse.Namespace) -> None:
    """--int8 is an ONNX model for CPU instances: its int8 kernels are ONNX Runtime's CPU ones (VNNI); on a GPU the
    fp32 or fp16 model is the faster one."""
    if args.int8 and args.format != "onnx":
        raise InputError(f"--int8 quantizes the ONNX export; --format {args.format} has no int8 form")
    if args.int8 and args.instance_kind == "KIND_GPU":
        raise InputError("--int8 runs on ONNX Runtime's CPU kernels: use --instance_kind KIND_CPU (the default with "
                         "--int8), or deploy the fp32 model for GPU instances")
    if not args.int8_tolerance > 0:
        raise InputError(f"--int8_tolerance must be positive, got {args.int8_tolerance:g}")
    if args.instance_kind is None:
        args.instance_kind = "KIND_CPU" if args.int8 else "KIND_GPU"


def check_version_folder(args: argparse.Namespace) -> None:
    """A deploy replaces `<repository>/<name>/<version>` whole: refused (one line, before any work) when it holds
    one of this run's inputs or anything a deploy does not write, which replacing it would delete."""
    target = Path(args.model_repository) / args.model_name / str(args.model_version)
    inputs = [("--init_checkpoint", args.init_checkpoint), ("--config_file", args.config_file),
              ("--vocab_file", args.vocab_file), ("--predict_file", args.predict_file)]
    for flag, path in inputs:
        if path is not None and inside(path, target):
            raise InputError(f"{target}: this deploy replaces the folder, which holds {flag} {path}; move the input "
                             "out of the model repository or choose another --model_version")
    ours = {filename for _, filename in PLATFORMS.values()}
    foreign = sorted(entry.name for entry in target.iterdir() if entry.name not in ours) if target.is_dir() else []
    if foreign:
        raise InputError(f"{target}: this deploy replaces the folder, which holds files it did not write "
                         f"({', '.join(foreign[:3])}); move them or choose another --model_version")


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    check_version_folder(args)
    tokenizer = model_loading.load_tokenizer(args.vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    config, weights = model_loading.config_and_weights(args.config_file, args.init_checkpoint)
    torch.manual_seed(args.seed)
    if args.task == "squad":
        make: Callable = question_answering_model
    else:
        def make(c):
            return sequence_classification_model(c, args.num_labels)
    model = model_loading.build_model(make, config, weights, args.init_checkpoint, tokenizer.vocab,
                                      args.max_seq_length, args.allow_vocab_mismatch)
    inputs = sample_inputs(tokenizer, args.predict_file, squad_flags.window_settings(args))
    settings = TritonSettings(args.max_batch_size, args.dynamic_batching, tuple(args.preferred_batch_sizes),
                              args.max_queue_delay_us, args.instance_count, args.instance_kind)
    model_dir, _ = deploy(TritonSignature(model).eval(), inputs, Path(args.model_repository), args.model_name,
                          args.model_version, args.format, args.task, args.num_labels, settings, args.tolerance,
                          args.opset, args.int8_tolerance if args.int8 else None)
    print(model_dir)


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
