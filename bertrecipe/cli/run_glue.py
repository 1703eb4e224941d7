"""Fine-tuning and evaluation of BERT on the GLUE tasks (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, MNLI-mm, QNLI,
RTE, WNLI).

Flags are NVIDIA DeepLearningExamples' (`--task_name --data_dir --init_checkpoint --vocab_file --config_file
--output_dir --do_train --do_eval --do_predict ...`), plus --bf16, --num_workers and --mode ("train",
"eval", "prediction" or any combination such as "train eval", like NVIDIA's run_glue.sh). Writes
<output_dir>/pytorch_model.bin + bert_config.json after training, eval_predictions.tsv and results.json (all
metrics, inference latency percentiles and throughput) after evaluation, test_predictions.tsv after prediction
(its latency and throughput also in results.json, under prediction_* keys). Every input is checked before the
first write (a refused run creates nothing; no output, --json-summary included, may be one of the inputs, and the
vocab must be the model's: --allow_vocab_mismatch), and the run's files are renamed into place together at its end:
a failure on the way leaves the previous run's model and results.json as they were.
--onnx_model evaluates (and predicts with) an exported model instead of a checkpoint, fp32 or int8, on ONNX
Runtime's CPU kernels (triton/deployer.py --task glue [--int8]); results.json then names it and its precision.
Launch with torchrun for more than one process; evaluation and prediction run on the first process.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

import numpy as np
import torch
from tqdm import tqdm

from bertrecipe.cli import finetuning_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.deploy.onnx_export import check_session_vocab, open_classifier_session, timed_onnx_outputs
from bertrecipe.deploy.quantization import onnx_precision
from bertrecipe.finetuning import glue, glue_task, loop
from bertrecipe.finetuning.model_loading import build_model, config_and_weights, load_tokenizer
from bertrecipe.finetuning.objective import TASK_LOSS, FinetuningObjective
from bertrecipe.finetuning.staged_outputs import MODEL_FILES, StagedOutputs, stage_finetuned
from bertrecipe.finetuning.timed_inference import latency_summary, timed_inference
from bertrecipe.model.families import ModelConfig, sequence_classification_model
from bertrecipe.tokenization.vocab_files import AnyVocab
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.process_group import DistributedContext, barrier, init_distributed, shutdown
from bertrecipe.training.stepper import Precision, make_precision, seed_everything

MODES = ("train", "eval", "prediction")
OUTPUTS = (*MODEL_FILES, "results.json", "eval_predictions.tsv", "eval_mismatched_predictions.tsv",
           "test_predictions.tsv")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task_name", required=True, help=", ".join(glue.TASKS))
    p.add_argument("--data_dir", required=True, help="the task's folder of train.tsv, dev.tsv, test.tsv")
    finetuning_flags.add_common_arguments(p, batch_size=32, learning_rate=5e-5, epochs=3.0, warmup=0.1)
    p.add_argument("--do_eval", action="store_true", help="metrics on the dev set")
    p.add_argument("--do_predict", action="store_true", help="predictions for the test set")
    p.add_argument("--mode", help='NVIDIA run_glue.sh spelling: "train", "eval", "prediction" or a combination')
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--eval_batch_size", type=int, default=8)
    finetuning_flags.add_onnx_model_argument(p, "triton/deployer.py --task glue")
    args = p.parse_args(argv)
    if args.mode:
        words = [w for w in re.split(r"[\s,+_]+", args.mode) if w]
        unknown = [w for w in words if w not in MODES]
        if unknown or not words:
            raise InputError(f"--mode {args.mode!r}: use {', '.join(MODES)} or a combination such as 'train eval'")
        args.do_train |= "train" in words
        args.do_eval |= "eval" in words
        args.do_predict |= "prediction" in words
    if not (args.do_train or args.do_eval or args.do_predict):
        raise InputError("nothing to do: pass --do_train, --do_eval and/or --do_predict (or --mode)")
    finetuning_flags.check_onnx_model_flags(args)
    if not (args.do_train or args.init_checkpoint or args.onnx_model):
        raise InputError("evaluation without training needs --init_checkpoint (a fine-tuned model) or --onnx_model")
    task = glue.get_task(args.task_name)
    finetuning_flags.check_common_arguments(args)
    finetuning_flags.check_positive(args, "eval_batch_size")
    if args.max_seq_length < glue.min_seq_length(task):
        raise InputError(f"--max_seq_length {args.max_seq_length} is too small for {task.name}: it needs at least "
                         f"{glue.min_seq_length(task)} ([CLS], [SEP] and one token of each sentence)")
    check_glue_outputs(args, task)
    args.max_steps = int(args.max_steps)
    args.log_freq = max(1, args.log_freq)
    return args


def check_glue_outputs(args: argparse.Namespace, task: glue.GlueTask) -> None:
    """None of the files this run writes (model, predictions, results, log) may be one of its inputs: the task's
    folder and files, the model's files."""
    tasks = [task, glue.get_task("mnli-mm")] if task.name == "mnli" else [task]
    inputs = [*finetuning_flags.model_inputs(args), ("--data_dir", args.data_dir),
              *((f"the {split} file of --data_dir", glue.split_file(t, args.data_dir, split))
                for t in tasks for split in glue.SPLITS)]
    files = [*(MODEL_FILES if args.do_train else ()),
             *(("results.json",) if args.do_eval or args.do_predict else ()),
             *(("eval_predictions.tsv",) if args.do_eval else ()),
             *(("eval_mismatched_predictions.tsv",) if args.do_eval and task.name == "mnli" else ()),
             *(("test_predictions.tsv",) if args.do_predict else ())]
    finetuning_flags.check_run_outputs(args, inputs, files)


def read_splits(task: glue.GlueTask, args: argparse.Namespace, tokenizer: Any,
                train_split: str = "train") -> dict[str, glue.GlueFeatures]:
    """Every split the run needs, read before any training or writing so that a bad file stops it first; the
    training examples from `train_split` (task distillation's --aug_train: "train_aug")."""
    splits = {}
    for split, wanted in (("train", args.do_train), ("dev", args.do_eval), ("test", args.do_predict)):
        if wanted:
            source = train_split if split == "train" else split
            splits[split] = glue_task.split_features(task, args.data_dir, source, tokenizer, args.max_seq_length)
    mismatched = glue.get_task("mnli-mm")
    if task.name == "mnli" and args.do_eval and glue.split_file(mismatched, args.data_dir, "dev").is_file():
        # MNLI is reported on both dev sets, as GLUE does: matched (eval_*) and mismatched (eval_mm_*).
        splits["dev_mm"] = glue_task.split_features(mismatched, args.data_dir, "dev", tokenizer,
                                                    args.max_seq_length)
    return splits


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    ctx = init_distributed(args.no_cuda)
    try:
        run(args, ctx)
    finally:
        shutdown(ctx)


@dataclass
class GlueRun:
    """What the steps of one run share: the flags, this process, the task, its features and the model."""

    args: argparse.Namespace
    ctx: DistributedContext
    task: glue.GlueTask
    precision: Precision
    bar: bool  # this process shows progress bars
    config: Optional[ModelConfig]  # None with --onnx_model
    model: Optional[torch.nn.Module]  # None with --onnx_model: the session predicts
    splits: dict[str, glue.GlueFeatures]  # "train", "dev", "dev_mm", "test": those the run needs
    vocab: AnyVocab  # --vocab_file's, whose identity the fine-tuned model records
    session: Any = None  # --onnx_model's ONNX Runtime session
    objective: FinetuningObjective = TASK_LOSS  # what is trained and its loss (task distillation gives its own)


def run(args: argparse.Namespace, ctx: DistributedContext, objective: FinetuningObjective = TASK_LOSS,
        train_split: str = "train") -> dict[str, Any]:
    """Trains, evaluates and predicts as the flags ask; returns the results (those of results.json on the first
    process). The objective (finetuning/objective.py) says what is trained and its loss, on `train_split`."""
    state = prepare(args, ctx, objective, train_split)
    # The lock is the run's first write into --output_dir: one run there at a time (run_lock.py).
    with finetuning_flags.locked_output_dir(args, ctx):
        log = open_glue_log(args, ctx, state.bar)
        results: dict[str, Any] = {"task": state.task.name}
        # The model, the predictions and results.json are staged and renamed into place together at the end, so
        # that a failure on the way leaves the previous run's files as they were (StagedOutputs).
        with StagedOutputs(args.output_dir, OUTPUTS) as stage:
            if args.do_train:
                results.update(train_glue(state, log))
                if ctx.is_main:
                    stage_finetuned(stage, state.model, state.config, state.vocab,
                                    glue_task.glue_task_record(state.task))
                barrier(ctx)
            if ctx.is_main and (args.do_eval or args.do_predict):
                results.update(evaluate_and_predict(state, stage))
                results["eval_batch_size"] = args.eval_batch_size
                if args.onnx_model:
                    results.update(onnx_model=str(args.onnx_model), precision=onnx_precision(Path(args.onnx_model)))
                stage.write_json("results.json", results)
            if ctx.is_main:
                stage.commit()
        barrier(ctx)
        log.log([], results)
        log.close()
    return results


def prepare(args: argparse.Namespace, ctx: DistributedContext, objective: FinetuningObjective = TASK_LOSS,
            train_split: str = "train") -> GlueRun:
    """Reads and checks every input and builds the model (or opens --onnx_model). It writes nothing: a refused run
    creates nothing, not even the log."""
    task = glue.get_task(args.task_name)
    precision = make_precision(ctx.device, args.fp16, args.bf16)
    tokenizer = load_tokenizer(args.vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    bar = ctx.is_main and not args.disable_progress_bar
    if args.onnx_model:
        if ctx.world_size != 1:
            raise InputError("--onnx_model evaluates in one process; launch it without torchrun")
        session = open_classifier_session(Path(args.onnx_model), task.num_labels)
        check_session_vocab(session, Path(args.onnx_model), tokenizer.vocab, args.allow_vocab_mismatch)
        splits = read_splits(task, args, tokenizer)
        return GlueRun(args, ctx, task, precision, bar, None, None, splits, tokenizer.vocab, session)
    config, weights = config_and_weights(args.config_file, args.init_checkpoint)
    objective.check(config, task.num_labels, tokenizer.vocab)
    weights, source = ((weights, args.init_checkpoint) if weights
                       else (objective.initial_weights(config) or (None, None)))
    splits = read_splits(task, args, tokenizer, train_split)
    seed_everything(args.seed)  # the same new classifier on every process
    model = build_model(lambda c: sequence_classification_model(c, task.num_labels), config, weights,
                        source, tokenizer.vocab, args.max_seq_length,
                        args.allow_vocab_mismatch).to(ctx.device)
    torch.manual_seed(args.seed + ctx.rank)  # a different dropout stream per process
    return GlueRun(args, ctx, task, precision, bar, config, objective.trainable(model), splits, tokenizer.vocab,
                   objective=objective)


def open_glue_log(args: argparse.Namespace, ctx: DistributedContext, bar: bool) -> MetricLogger:
    log = MetricLogger(args.json_summary, enabled=ctx.is_main, printer=tqdm.write if bar else print)
    log.log("PARAMETER", {k: v for k, v in vars(args).items() if not k.startswith("_")}, echo=False)
    for metric, unit in (("e2e_train_time", "s"), ("training_sequences_per_second", "sequences/s"),
                         ("e2e_inference_time", "s"), ("inference_sequences_per_second", "sequences/s"),
                         ("prediction_e2e_inference_time", "s"),
                         ("prediction_inference_sequences_per_second", "sequences/s")):
        log.metadata(metric, {"unit": unit})
    return log


def train_glue(state: GlueRun, log: MetricLogger) -> dict[str, Any]:
    args, ctx, features = state.args, state.ctx, state.splits["train"]
    settings = finetuning_flags.finetuning_loop_settings(args, state.bar, trim_padding=True)
    compute_loss = state.objective.compute_loss(glue_task.glue_loss)
    results = loop.finetuning_loop(state.model, glue_task.glue_arrays(features), compute_loss, settings,
                              state.precision, ctx, log)
    return {**results, "train_examples": len(features),
            "train_steps": loop.optimizer_steps(len(features), settings, ctx)}


def evaluate_and_predict(state: GlueRun, stage: StagedOutputs) -> dict[str, Any]:
    """Dev metrics and test predictions (staged); returns their results.json entries."""
    results: dict[str, Any] = {}
    if state.args.do_eval:
        dev = state.splits["dev"]
        scores, latencies = score_dev(state, stage, state.task, dev, "eval", "eval_predictions.tsv")
        results.update(scores)
        results.update(latency_summary(latencies, len(dev)))
        if "dev_mm" in state.splits:
            scores, _ = score_dev(state, stage, glue.get_task("mnli-mm"), state.splits["dev_mm"], "eval_mm",
                                  "eval_mismatched_predictions.tsv")
            results.update(scores)
    if state.args.do_predict:
        results.update(predict_test(state, stage))
    return results


def score_dev(state: GlueRun, stage: StagedOutputs, task: glue.GlueTask, features: glue.GlueFeatures,
              prefix: str, file_name: str) -> tuple[dict[str, Any], list[float]]:
    """The metrics of one dev set as `<prefix>_<metric>` and `<prefix>_examples`, its predictions staged as
    file_name; also the batches' latencies."""
    preds, latencies = predict_split(state, task, features)
    scores = {f"{prefix}_{k}": v for k, v in glue.compute_metrics(task, preds, features.labels).items()}
    scores[f"{prefix}_examples"] = len(features)
    stage.write_text(file_name, glue_task.predictions_tsv(task, preds, features.labels))
    return scores, latencies


def predict_test(state: GlueRun, stage: StagedOutputs) -> dict[str, Any]:
    """Test predictions (staged as test_predictions.tsv) and the timings of that pass."""
    test = state.splits["test"]
    preds, latencies = predict_split(state, state.task, test)
    stage.write_text("test_predictions.tsv", glue_task.predictions_tsv(state.task, preds, None))
    timing = latency_summary(latencies, len(test))
    # The unprefixed keys belong to the dev pass when there is one; the test pass always keeps its own
    # prediction_* copy, so that running both never drops the prediction latency.
    results: dict[str, Any] = {} if state.args.do_eval else dict(timing)
    results.update({f"prediction_{k}": v for k, v in timing.items()})
    results["prediction_examples"] = len(test)
    return results


def predict_split(state: GlueRun, task: glue.GlueTask,
                  features: glue.GlueFeatures) -> tuple[np.ndarray, list[float]]:
    if state.session is not None:
        arrays = glue_task.glue_arrays(features)
        (logits,), latencies = timed_onnx_outputs(state.session, (arrays["input_ids"], arrays["segment_ids"],
                                                                  arrays["input_mask"]),
                                                  state.args.eval_batch_size, trim=True)
        return glue_task.glue_predictions(task, logits), latencies
    (logits,), latencies = timed_inference(state.model, glue_task.glue_arrays(features), state.args.eval_batch_size,
                                           state.precision, glue_task.glue_logits, state.bar, trim=True)
    return glue_task.glue_predictions(task, logits), latencies


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
