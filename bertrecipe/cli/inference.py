"""Question answering from the command line with a SQuAD-fine-tuned BERT (NVIDIA's inference.py flags).

    python inference.py --init_checkpoint results/pytorch_model.bin --config_file bert_config.json \
        --vocab_file vocab.txt --do_lower_case --question "Who ...?" --context "..."   (or --context_file F)
    python inference.py --onnx_model triton/model_repository/bert/1/model.onnx --vocab_file vocab.txt ...

--onnx_model runs, instead of a checkpoint, the ONNX file that triton/deployer.py --format onnx exported (and
checked against PyTorch) on ONNX Runtime's CPU kernels: in fp32, faster than PyTorch on a CPU, or the int8 model of
deployer.py --int8, about 2-3x faster again on a CPU with VNNI (docs/benchmarks.md has the figures and the
accuracy kept).

Prints one JSON object: the question, the answer, the n-best list and the number of windows (plus the null
odds with --version_2_with_negative). Without --question, questions are read from stdin, one per line, and
answered as JSON lines (blank lines skipped; an empty --question is refused). Unlike NVIDIA's script, which
truncates the context, long contexts are covered by the same sliding windows as run_squad.py (--max_seq_length,
--doc_stride), in memory linear in the context's length.

A vocab that cannot be the model's (more tokens than its embeddings, far fewer, or a casing --do_lower_case
contradicts) is refused in one line naming it, as in every fine-tuning command (tokenization.wordpiece.
check_vocab_for_model; --allow_vocab_mismatch warns instead where the run can go on), and so is standard output
sent into one of the input files.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NoReturn, Optional, Sequence

import torch

from bertrecipe.cli import finetuning_flags, squad_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.files import read_text_file
from bertrecipe.common.output_paths import refuse_input_as_output
from bertrecipe.deploy.onnx_export import onnx_logits_function
from bertrecipe.finetuning import model_loading, squad, squad_answers
from bertrecipe.finetuning.question_answering import (
    LogitsFunction,
    answer_about_context,
    check_question,
    load_qa_model,
    predict_logits,
)
from bertrecipe.tokenization.bpe import BpeVocab
from bertrecipe.tokenization.wordpiece import Vocab


@dataclass(frozen=True)
class InferenceOptions:
    """Everything the command line decides, parsed once."""

    init_checkpoint: Optional[Path]  # one of these two
    onnx_model: Optional[Path]
    config_file: Optional[Path]
    vocab_file: Path
    questions: Optional[list[str]]  # None: read them from stdin
    context: str
    window: squad.WindowSettings
    answer: squad_answers.AnswerSettings
    batch_size: int
    precision: str  # "fp32", "fp16" or "bf16"
    seed: int
    allow_vocab_mismatch: bool = False


def parse_args(argv: Optional[Sequence[str]] = None) -> InferenceOptions:
    """Parses NVIDIA's inference.py flags (plus --context_file, --bf16, --predict_batch_size, --seed)."""
    p = ArgumentParser(description="Answer questions about a context with a fine-tuned BERT.")
    p.add_argument("--bert_model", default="bert-large-uncased", help="model name, informational (NVIDIA's flag)")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--init_checkpoint", help="fine-tuned checkpoint: ours, NVIDIA's or a HF directory")
    model.add_argument("--onnx_model", help="instead: a model.onnx of triton/deployer.py --format onnx (fp32, or int8 "
                                            "with --int8), run on ONNX Runtime (CPU)")
    p.add_argument("--config_file", help="bert_config.json (default: the one in or beside the checkpoint)")
    p.add_argument("--vocab_file", required=True,
                   help="vocab.txt or tokenizer.json (WordPiece or byte-level BPE) of the model")
    p.add_argument("--question", help="the question (default: one question per line on stdin)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--context", help="the context paragraph")
    source.add_argument("--context_file", help="a UTF-8 text file holding the context")
    squad_flags.add_window_arguments(p)
    squad_flags.add_answer_arguments(p)
    p.add_argument("--do_lower_case", action="store_true", help="for uncased models")
    finetuning_flags.add_allow_vocab_mismatch(p)
    p.add_argument("--fp16", "--amp", dest="fp16", action="store_true", help="fp16 autocast (CUDA)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or CUDA)")
    p.add_argument("--predict_batch_size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--seed", type=int, default=42, help="initializes heads the checkpoint lacks, reproducibly")
    args = p.parse_args(argv)
    if args.fp16 and args.bf16:
        p.error("--fp16 and --bf16 exclude each other")
    if args.onnx_model and (args.fp16 or args.bf16 or args.config_file):
        p.error("--onnx_model runs the exported model as it is: --fp16, --bf16 and --config_file do not apply")
    for flag in ("max_seq_length", "doc_stride", "n_best_size", "max_answer_length", "predict_batch_size"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1")
    if args.question is not None:
        check_question(args.question)
    refuse_output_onto_inputs(args)
    if args.context_file is not None:
        context = read_text_file(args.context_file, "context file")
    else:
        context = args.context
    return InferenceOptions(
        init_checkpoint=Path(args.init_checkpoint) if args.init_checkpoint else None,
        onnx_model=Path(args.onnx_model) if args.onnx_model else None,
        config_file=Path(args.config_file) if args.config_file else None,
        vocab_file=Path(args.vocab_file),
        questions=None if args.question is None else [args.question],
        context=context,
        window=squad_flags.window_settings(args),
        answer=squad_flags.answer_settings(args),
        batch_size=args.predict_batch_size,
        precision="fp16" if args.fp16 else "bf16" if args.bf16 else "fp32",
        seed=args.seed,
        allow_vocab_mismatch=args.allow_vocab_mismatch,
    )


def refuse_output_onto_inputs(args: argparse.Namespace) -> None:
    """The answers go to the standard output: refused (InputError) when the shell sends it into one of the inputs
    (`> context.txt` has emptied the file already, `>> context.txt` would append to it)."""
    inputs = [*finetuning_flags.model_inputs(args), ("--context_file", args.context_file)]
    refuse_input_as_output("/dev/stdout", "the standard output", inputs,
                           fix="send the output (>) to another file")


def _stdin_questions() -> Iterator[str]:
    for line in sys.stdin:
        if line.strip():
            yield line.strip()


def logits_function(options: InferenceOptions, vocab: Vocab | BpeVocab) -> LogitsFunction:
    """The windows' start and end logits from the ONNX Runtime session or the PyTorch model that options name;
    either must fit the vocab (tokenization.wordpiece.check_vocab_for_model)."""
    if options.onnx_model is not None:
        return onnx_logits_function(options.onnx_model, vocab, options.batch_size, options.allow_vocab_mismatch)
    torch.manual_seed(options.seed)
    model = load_qa_model(options.init_checkpoint, options.config_file, vocab, options.window.max_seq_length,
                          options.allow_vocab_mismatch)
    model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return lambda features: predict_logits(model, features, options.batch_size, options.precision)


def main(argv: Optional[Sequence[str]] = None) -> None:
    options = parse_args(argv)
    tokenizer = model_loading.load_tokenizer(options.vocab_file, options.answer.do_lower_case,
                                             options.allow_vocab_mismatch)
    logits = logits_function(options, tokenizer.vocab)
    if options.questions is not None:
        [result] = answer_about_context(logits, tokenizer, options.questions, options.context, options.window,
                                        options.answer)
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return
    for question in _stdin_questions():  # one JSON line per question, as soon as it is answered
        [result] = answer_about_context(logits, tokenizer, [question], options.context, options.window,
                                        options.answer)
        print(json.dumps(result, ensure_ascii=False), flush=True)


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
