"""Fine-tuning BERT for SQuAD v1.1 / v2.0 question answering, prediction and evaluation.

Flags are NVIDIA DeepLearningExamples' (`--init_checkpoint --vocab_file --config_file --train_file
--predict_file --output_dir --do_train --do_predict --do_eval --max_seq_length --doc_stride ...`), plus --bf16
and --num_workers. After training, <output_dir> holds pytorch_model.bin ({"model": state_dict}) and
bert_config.json; prediction writes predictions.json, nbest_predictions.json (and null_odds.json for v2.0);
--do_eval scores predictions.json with the official metrics in process, or with --eval_script when given.
Every input is checked before the first write (a refused run creates nothing: no log, cache or output folder):
among others no output (model, predictions, --json-summary) may be one of the inputs, and the vocab must be the
model's (--allow_vocab_mismatch to go on with a warning where it can). The run's files are renamed into place
together at its end: a failure on the way leaves the previous run's model and predictions as they were.
--onnx_model predicts with an exported model instead of a checkpoint, fp32 or int8, on ONNX Runtime's CPU kernels
(triton/deployer.py --format onnx [--int8]); the log's closing record then names it and its precision.
Launch with torchrun for more than one process; prediction and evaluation run on the first process.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import torch
from tqdm import tqdm

from bertrecipe.cli import finetuning_flags, squad_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.cli.squad_flags import features_for
from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable_folder
from bertrecipe.deploy.onnx_export import check_session_vocab, open_qa_session, timed_onnx_outputs
from bertrecipe.deploy.quantization import onnx_precision
from bertrecipe.finetuning import loop, squad, squad_answers, squad_task
from bertrecipe.finetuning.model_loading import build_model, config_and_weights, load_tokenizer
from bertrecipe.finetuning.objective import TASK_LOSS, FinetuningObjective
from bertrecipe.finetuning.staged_outputs import MODEL_FILES, StagedOutputs, stage_finetuned
from bertrecipe.finetuning.timed_inference import latency_summary
from bertrecipe.model.families import question_answering_model
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.process_group import DistributedContext, barrier, init_distributed, shutdown
from bertrecipe.training.stepper import Precision, make_precision, seed_everything

OUTPUTS = (*MODEL_FILES, "predictions.json", "nbest_predictions.json", "null_odds.json")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    finetuning_flags.add_common_arguments(p, batch_size=32, learning_rate=5e-5, epochs=3.0, warmup=0.1)
    p.add_argument("--train_file", help="SQuAD JSON for training, e.g. train-v1.1.json")
    p.add_argument("--predict_file", help="SQuAD JSON to predict (and evaluate), e.g. dev-v1.1.json")
    p.add_argument("--do_predict", action="store_true")
    p.add_argument("--do_eval", action="store_true", help="score predictions.json against --predict_file")
    squad_flags.add_eval_script_argument(p)
    squad_flags.add_window_arguments(p)
    p.add_argument("--predict_batch_size", type=int, default=8)
    squad_flags.add_answer_arguments(p)
    p.add_argument("--verbose_logging", action="store_true", help="accepted for compatibility")
    squad_flags.add_cache_arguments(p)
    finetuning_flags.add_onnx_model_argument(p, "triton/deployer.py --format onnx")
    args = p.parse_args(argv)
    if not (args.do_train or args.do_predict or args.do_eval):
        raise InputError("nothing to do: pass --do_train, --do_predict and/or --do_eval")
    if args.do_train and not args.train_file:
        raise InputError("--do_train needs --train_file")
    if (args.do_predict or args.do_eval) and not args.predict_file:
        raise InputError("--do_predict/--do_eval need --predict_file")
    finetuning_flags.check_onnx_model_flags(args)
    if args.do_predict and not (args.do_train or args.init_checkpoint or args.onnx_model):
        raise InputError("--do_predict without --do_train needs --init_checkpoint (a fine-tuned model) or --onnx_model")
    if args.doc_stride < 1 or args.max_query_length < 1:
        raise InputError("--doc_stride and --max_query_length must be positive")
    finetuning_flags.check_common_arguments(args)
    finetuning_flags.check_positive(args, "predict_batch_size", "n_best_size", "max_answer_length")
    if args.max_seq_length < args.max_query_length + 4:
        raise InputError(f"--max_seq_length {args.max_seq_length} leaves no room for the document after a "
                         f"--max_query_length {args.max_query_length} question, [CLS] and two [SEP]: it needs at "
                         f"least {args.max_query_length + 4}")
    if args.cache_dir:
        check_writable_folder(args.cache_dir, "--cache_dir")
    check_squad_outputs(args)
    args.max_steps = int(args.max_steps)
    args.log_freq = max(1, args.log_freq)
    return args


def check_squad_outputs(args: argparse.Namespace) -> None:
    """None of the files this run writes (model, predictions, log) may be one of its inputs: the SQuAD files,
    the model's files, the evaluation script, the predictions that --do_eval alone scores."""
    inputs = [*finetuning_flags.model_inputs(args), ("--eval_script", args.eval_script),
              ("--train_file", args.train_file if args.do_train else None),
              ("--predict_file", args.predict_file if args.do_predict or args.do_eval else None)]
    if args.do_eval and not args.do_predict:
        inputs.append(("the predictions to score", Path(args.output_dir) / "predictions.json"))
    files = [*(MODEL_FILES if args.do_train else ()),
             *(("predictions.json", "nbest_predictions.json") if args.do_predict else ()),
             *(("null_odds.json",) if args.do_predict and args.version_2_with_negative else ())]
    finetuning_flags.check_run_outputs(args, inputs, files)


def stage_predictions(args: argparse.Namespace, model: Any, tokenizer: Any, precision: Precision,
                      progress_bar: bool, examples: list[squad.SquadExample], features: squad.SquadFeatures,
                      stage: StagedOutputs) -> tuple[dict[str, Any], dict[str, Path]]:
    """Stages predictions.json, nbest_predictions.json (and null_odds.json for v2.0) for the features of
    --predict_file, from the PyTorch model or the --onnx_model session; returns the inference timings and the
    staged files by name."""
    settings = squad_flags.answer_settings(args)
    if args.onnx_model:
        (start, end), latencies = timed_onnx_outputs(model, (features.input_ids, features.segment_ids,
                                                             features.input_mask), args.predict_batch_size)
        predictions = squad_answers.extract_answers(examples, features, start, end, tokenizer.vocab, settings)
        timings = {**latency_summary(latencies, len(features)), "predict_features": len(features),
                   "onnx_model": str(args.onnx_model), "precision": onnx_precision(Path(args.onnx_model))}
    else:
        predictions, timings = squad_task.predict_answers(model, tokenizer, examples, features,
                                                          args.predict_batch_size, precision, settings, progress_bar)
    contents = squad_task.prediction_contents(predictions, args.version_2_with_negative)
    staged = {name: stage.write_json(name, obj, indent=4) for name, obj in contents.items()}  # squad_answers' layout
    return timings, staged


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    ctx = init_distributed(args.no_cuda)
    try:
        run(args, ctx)
    finally:
        shutdown(ctx)


def open_squad_log(args: argparse.Namespace, ctx: DistributedContext, bar: bool) -> MetricLogger:
    log = MetricLogger(args.json_summary, enabled=ctx.is_main, printer=tqdm.write if bar else print)
    log.log("PARAMETER", {k: v for k, v in vars(args).items() if not k.startswith("_")}, echo=False)
    for metric, unit in (("e2e_train_time", "s"), ("training_sequences_per_second", "sequences/s"),
                         ("e2e_inference_time", "s"), ("inference_sequences_per_second", "sequences/s"),
                         ("exact_match", "%"), ("F1", "%")):
        log.metadata(metric, {"unit": unit})
    return log


def read_inputs(args: argparse.Namespace, ctx: DistributedContext, tokenizer: Any,
                cache_writes: list[Callable[[], None]], objective: FinetuningObjective = TASK_LOSS) -> dict[str, Any]:
    """Everything the run reads, checked before it writes anything: the model, and on the first process the
    training and prediction features and the file to score (other processes read the training features later,
    from the cache the first one writes)."""
    inputs: dict[str, Any] = {"model": None, "config": None, "train": None, "predict": None, "predict_file": None}
    if args.onnx_model:  # the session stands in for the model (prediction only)
        if ctx.world_size != 1:
            raise InputError("--onnx_model predicts in one process; launch it without torchrun")
        inputs["model"] = open_qa_session(Path(args.onnx_model))
        check_session_vocab(inputs["model"], Path(args.onnx_model), tokenizer.vocab, args.allow_vocab_mismatch)
    elif args.do_train or args.do_predict:
        config, weights = config_and_weights(args.config_file, args.init_checkpoint)
        objective.check(config, 2, tokenizer.vocab)  # a span's start and end
        weights, source = ((weights, args.init_checkpoint) if weights
                           else (objective.initial_weights(config) or (None, None)))
        seed_everything(args.seed)  # the same new QA head on every process
        model = build_model(question_answering_model, config, weights, source, tokenizer.vocab,
                            args.max_seq_length, args.allow_vocab_mismatch).to(ctx.device)
        inputs["model"] = objective.trainable(model)
        inputs["config"] = config
        torch.manual_seed(args.seed + ctx.rank)  # a different dropout stream per process
    if not ctx.is_main:
        return inputs
    # Each SQuAD file is read once: its examples, feature-cache key, scoring check and scores see the same bytes.
    if args.do_train:
        inputs["train"] = features_for(args, tokenizer, squad.read_squad_file(args.train_file), True,
                                       cache_writes)[1]
    if args.do_predict or args.do_eval:
        inputs["predict_file"] = squad.read_squad_file(args.predict_file)
    if args.do_predict:
        inputs["predict"] = features_for(args, tokenizer, inputs["predict_file"], False, cache_writes)
    if args.do_eval:
        squad_task.check_scorable(inputs["predict_file"])
        predictions = Path(args.output_dir) / "predictions.json"
        if not args.do_predict and not predictions.is_file():
            raise InputError(f"{predictions}: --do_eval without --do_predict scores this file, which does not "
                             "exist; add --do_predict")
    return inputs


def run(args: argparse.Namespace, ctx: DistributedContext,
        objective: FinetuningObjective = TASK_LOSS) -> dict[str, Any]:
    """Trains, predicts and scores as the flags ask; the objective (finetuning/objective.py) says what is trained and
    its loss (task distillation gives its own)."""
    precision = make_precision(ctx.device, args.fp16, args.bf16)
    bar = ctx.is_main and not args.disable_progress_bar
    tokenizer = load_tokenizer(args.vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    cache_writes: list[Callable[[], None]] = []
    inputs = read_inputs(args, ctx, tokenizer, cache_writes, objective)
    # Nothing was written before this point: a refused run leaves no log, cache or output folder behind.
    # The lock is the run's first write into --output_dir: one run there at a time (run_lock.py).
    with finetuning_flags.locked_output_dir(args, ctx):
        log = open_squad_log(args, ctx, bar)
        for write in cache_writes:
            write()
        results: dict[str, Any] = {}
        model = inputs["model"]
        # The model and the predictions are staged and renamed into place together at the end, so that a failure
        # on the way leaves the previous run's files as they were (StagedOutputs).
        with StagedOutputs(args.output_dir, OUTPUTS) as stage:
            if args.do_train:
                results.update(train_squad(args, ctx, model, tokenizer, inputs["train"], precision, bar, log,
                                           objective.compute_loss(squad_task.qa_loss)))
                if ctx.is_main:
                    stage_finetuned(stage, model, inputs["config"], tokenizer.vocab,
                                    squad_task.squad_task_record(args.version_2_with_negative))
                barrier(ctx)
            staged = {name: Path(args.output_dir) / name for name in squad_task.PREDICTION_FILES}
            if ctx.is_main and args.do_predict:
                timings, staged = stage_predictions(args, model, tokenizer, precision, bar, *inputs["predict"],
                                                    stage)
                results.update(timings)
            if ctx.is_main and args.do_eval:
                results.update(squad_task.score_prediction_files(inputs["predict_file"], staged,
                                                                 args.version_2_with_negative, args.eval_script))
            if ctx.is_main:
                stage.commit()
        barrier(ctx)
        log.log([], results)
        log.close()
    return results


def train_squad(args: argparse.Namespace, ctx: DistributedContext, model: torch.nn.Module, tokenizer: Any,
          features: Optional[squad.SquadFeatures], precision: Precision, bar: bool,
          log: MetricLogger, compute_loss: Callable = squad_task.qa_loss) -> dict[str, Any]:
    barrier(ctx)  # the first process has written the feature cache
    if features is None:  # another process than the first: the features come from the cache it wrote
        _, features = features_for(args, tokenizer, squad.read_squad_file(args.train_file), is_training=True)
    settings = finetuning_flags.finetuning_loop_settings(args, bar)
    results = loop.finetuning_loop(model, squad_task.qa_arrays(features, True), compute_loss, settings, precision,
                              ctx, log)
    return {**results, "train_features": len(features),
            "train_steps": loop.optimizer_steps(len(features), settings, ctx)}


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
