"""One pre-training run, from its settings (settings.py, built by cli/run_pretraining.py from the flags) to its
closing record: the inputs checked by content and the outputs by place before the first write, the output folder
locked, the resume point chosen (resume_rules.py), the model, optimizer and stream set up (startup.py), then the
loop (loop.py) and the evaluation. The command keeps the flags, the signals and the exit statuses."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from tqdm import tqdm

from bertrecipe.common.atomic_files import remove_stale_temporaries
from bertrecipe.common.output_paths import check_writable_folder, refuse_input_as_output
from bertrecipe.model.families import ModelConfig
from bertrecipe.pretraining import masking
from bertrecipe.pretraining.loop import LoopSettings, TrainingSetup, evaluate, pretraining_loop
from bertrecipe.pretraining.objective import MASKED_LM, Criterion, PretrainingObjective
from bertrecipe.pretraining.resume_rules import check_resume, find_resume_checkpoint, stream_lanes, with_fingerprints
from bertrecipe.pretraining.run_tokenizer import (
    TextCasing,
    casing_record,
    checkpoint_casing,
    refuse_checkpoint_of_another_tokenizer,
    refuse_other_casing,
    run_casing,
    run_tokenizer,
)
from bertrecipe.pretraining.settings import PretrainingSettings
from bertrecipe.pretraining.shard_schema import ShardInfo, find_shards, inspect_shard
from bertrecipe.pretraining.startup import (
    ResumePoint,
    build_pretraining_model,
    masking_spec,
    read_init_checkpoint,
    sample_stream,
    set_up_optimizer,
)
from bertrecipe.pretraining.token_budget import BatchRamp, batch_ramp
from bertrecipe.tokenization.vocab_files import AnyVocab, TokenizerIdentity, load_vocab_file
from bertrecipe.tokenization.wordpiece import check_vocab_for_model
from bertrecipe.training import checkpointing
from bertrecipe.training.metric_logger import MetricLogger, check_log_paths
from bertrecipe.training.process_group import DistributedContext, any_process
from bertrecipe.training.run_lock import locked_output_folder
from bertrecipe.training.sharding import sharding_active
from bertrecipe.training.stepper import allow_tf32, make_precision, seed_everything, use_deterministic_algorithms


def pretrain(settings: PretrainingSettings, config: ModelConfig, ctx: DistributedContext,
             start_time: float, objective: PretrainingObjective = MASKED_LM) -> dict[str, Any]:
    """The run of these settings: inputs and outputs checked before the first write, the output folder locked,
    the resume point chosen, model, optimizer and sample stream set up, then pretraining_loop and the
    evaluation; returns the closing record (its "stopped_by" says when a SIGTERM ended the run early). The
    objective (pretraining/objective.py) says what is trained and how its loss is computed."""
    device, run_settings = settings.device, settings.run
    precision = make_precision(ctx.device, device.fp16, device.bf16, device.init_loss_scale,
                               sharded=sharding_active(device.sharding, ctx))
    allow_tf32(device.tf32)
    use_deterministic_algorithms(device.deterministic)
    # Every torch optimizer imports torch._dynamo when it takes its parameters (~2 s): done here, before the first
    # write, so that no process spends those seconds between a peer's failed write and the collective that tells it.
    import torch._dynamo  # noqa: F401
    train_shards, eval_shards = inspect_inputs(settings, config, ctx)
    vocab = load_run_vocab(settings, config)
    allow_mismatch = settings.stream.allow_vocab_mismatch
    tokenizer = run_tokenizer(train_shards + eval_shards, vocab, config.vocab_size, allow_mismatch)
    casing = run_casing(train_shards + eval_shards, vocab, allow_mismatch)
    objective.check(config, tokenizer, casing, allow_mismatch)
    init_weights = read_init_checkpoint(settings.model, config, tokenizer, casing, allow_mismatch, warn=ctx.is_main)
    init_source = None
    if init_weights is None and objective.initial_weights(config) is not None:
        init_weights, init_source = objective.initial_weights(config)
    check_pretraining_outputs(settings, train_shards, eval_shards)
    # The lock is the first write: the resume point is chosen, and the checkpoints written, by one run at a time.
    with locked_output_folder(run_settings.output_dir, ctx.is_main, lambda flag: any_process(flag, ctx),
                              log_file=run_settings.json_summary) as lock:
        settings, resume_from, steps_left, changes = choose_resume(settings, config, ctx, train_shards, tokenizer,
                                                                   casing)
        if resume_from is not None:
            objective.check_resume(*resume_from)
        spec = None
        if run_settings.do_train:
            spec = masking_spec(settings.stream, train_shards, config, vocab, settings.model.no_nsp,
                                warn=ctx.is_main)
        seed_everything(settings.stream.seed + ctx.rank)
        # A resumed run's weights are its checkpoint's: what --init_checkpoint lacks does not matter then.
        model = objective.trainable(build_pretraining_model(settings.model, config, ctx.device, init_weights,
                                                            warn=ctx.is_main and resume_from is None,
                                                            init_source=init_source))
        if ctx.is_main:
            remove_stale_temporaries(run_settings.output_dir, checkpointing.CHECKPOINT_NAME)
        loop = replace(pretraining_loop_settings(settings, ctx, tokenizer, casing),
                       objective=objective.checkpoint_record())
        log = open_pretraining_log(settings, ctx, loop.progress_bar)
        for change in changes:
            log.log("PARAMETER", {"resume_applies": change}, echo=False)
            if ctx.is_main:
                print(f"resume: {change}", file=sys.stderr, flush=True)
        ddp_model, optimizer, scheduler, resume = set_up_optimizer(settings, ctx, model, precision, log, resume_from)
        rate = rate_change(resume_from, optimizer, resume.phase_step) if changes else None
        if rate is not None:
            log.log("PARAMETER", {"resume_applies": rate}, echo=False)
            if ctx.is_main:
                print(f"resume: {rate}", file=sys.stderr, flush=True)
        setup = TrainingSetup(ctx, config, ddp_model, optimizer, scheduler, precision, log, eval_shards, lock,
                              start_time, evaluate_nsp=not settings.model.no_nsp)
        with checkpointing.failures_name_the_checkpoint(run_settings.output_dir):
            criterion = objective.criterion(nsp=not settings.model.no_nsp)
            final = train_and_evaluate(settings, setup, loop, train_shards, spec, resume, steps_left, criterion)
    return final


def rate_change(resume_from: Optional[tuple[Path, dict[str, Any]]], optimizer: Any, step: int) -> Optional[str]:
    """What a resume's changes did to the learning rate at the checkpoint's step (a longer WSD run's decay starts
    later, so a rate decayed to ~0 is back at its peak), or None where it is the same."""
    groups = ((resume_from or (None, {}))[1].get("optimizer") or {}).get("param_groups") or [{}]
    saved, now = groups[0].get("lr"), optimizer.param_groups[0]["lr"]
    if saved is None or float(saved) == float(now):
        return None
    return f"the learning rate at step {step} goes from {float(saved):.3g} to {float(now):.3g} under the new schedule"


def check_pretraining_outputs(settings: PretrainingSettings, train_shards: list, eval_shards: list) -> None:
    """The output folder and the logs must be creatable where the flags point, and none of them may be one of the
    run's inputs (checked before any write)."""
    run, model, stream = settings.run, settings.model, settings.stream
    check_writable_folder(run.output_dir, "--output_dir")
    check_log_paths(run.json_summary, Path(run.output_dir) / "tensorboard")
    inputs = [("--config_file", model.config_file), ("--init_checkpoint", model.init_checkpoint),
              ("--vocab_file", stream.vocab_file), ("--input_dir", stream.input_dir), ("--eval_dir", run.eval_dir)]
    shards = [("a shard of --input_dir", s.path) for s in train_shards] + [
        ("a shard of --eval_dir", s.path) for s in eval_shards]
    refuse_input_as_output(run.json_summary, "--json-summary", inputs + shards)  # a file: it could be a shard
    refuse_input_as_output(run.output_dir, "--output_dir", inputs)
    refuse_input_as_output(Path(run.output_dir) / "tensorboard", "the TensorBoard folder (--output_dir/tensorboard)",
                           inputs)


def load_run_vocab(settings: PretrainingSettings, config: ModelConfig) -> Optional[AnyVocab]:
    """--vocab_file (a vocab.txt or a tokenizer.json), checked against the model's word embeddings; None without
    the flag."""
    stream = settings.stream
    if not stream.vocab_file:
        return None
    vocab = load_vocab_file(stream.vocab_file)
    check_vocab_for_model(vocab, model_vocab_size=config.vocab_size, allow_mismatch=stream.allow_vocab_mismatch)
    return vocab


def inspect_inputs(settings: PretrainingSettings, config: ModelConfig,
                   ctx: DistributedContext) -> tuple[list[ShardInfo], list[ShardInfo]]:
    """The training and held-out shards, their keys, shapes and attributes checked against the flags and config;
    the training shards with their content fingerprints, which checkpoints record and a resume compares."""
    limits = {"vocab_size": config.vocab_size, "max_positions": config.max_position_embeddings,
              "type_vocab_size": config.type_vocab_size}
    stream, run = settings.stream, settings.run
    train_shards = []
    if run.do_train:
        # Dynamic masks are drawn anew, up to --max_predictions_per_seq: the shards' own count need not match it.
        shard_predictions = None if stream.dynamic_masking else stream.max_predictions_per_seq
        train_shards = [inspect_shard(f, max_seq_length=stream.max_seq_length, max_predictions=shard_predictions,
                                      **limits)
                        for f in find_shards(stream.input_dir, "training")]
        train_shards = with_fingerprints(train_shards, ctx)
    eval_shards = [inspect_shard(f, **limits) for f in find_shards(run.eval_dir)] if run.eval_dir else []
    return train_shards, eval_shards


def open_pretraining_log(settings: PretrainingSettings, ctx: DistributedContext, bar_enabled: bool) -> MetricLogger:
    """The DLLogger log (--json-summary, and TensorBoard in --output_dir), opened with the flags' record."""
    log = MetricLogger(settings.run.json_summary, enabled=ctx.is_main, printer=tqdm.write if bar_enabled else print,
                       tensorboard_dir=Path(settings.run.output_dir) / "tensorboard")
    log.log("PARAMETER", settings.record(), echo=False)
    for metric, unit in (("average_loss", None), ("step_loss", None), ("learning_rate", None),
                         ("training_sequences_per_second", "sequences/s"), ("e2e_train_time", "s")):
        log.metadata(metric, {"unit": unit} if unit else {})
    return log


def choose_resume(settings: PretrainingSettings, config: ModelConfig, ctx: DistributedContext,
                  train_shards: list[ShardInfo], tokenizer: Optional[TokenizerIdentity],
                  casing: Optional[TextCasing] = None
                  ) -> tuple[PretrainingSettings, Optional[tuple[Path, dict[str, Any]]], int, list[str]]:
    """Under the lock: the checkpoint the run continues (checked to be of its tokenizer and casing), the steps left
    and the changes a resume applies; returns the settings with the stream's lanes (those of the checkpoint's stream
    when the run continues it)."""
    existing = checkpointing.survey(settings.run.output_dir)  # each checkpoint's phase, read once
    resume_from = find_resume_checkpoint(settings, config, existing)
    if resume_from is not None:
        path, record = str(resume_from[0]), resume_from[1].get("tokenizer")
        refuse_checkpoint_of_another_tokenizer(tokenizer, record, path, settings.stream.allow_vocab_mismatch)
        refuse_other_casing(casing, checkpoint_casing(record, path), settings.stream.allow_vocab_mismatch)
    if not settings.run.do_train:
        return settings, resume_from, 0, []
    steps_left, changes = check_resume(settings, ctx, train_shards, resume_from, existing)
    lanes = stream_lanes(settings.stream, settings.run.phase2, ctx, resume_from)
    return settings.with_derived(lanes=lanes), resume_from, steps_left, changes


def pretraining_loop_settings(settings: PretrainingSettings, ctx: DistributedContext,
                              tokenizer: Optional[TokenizerIdentity] = None,
                              casing: Optional[TextCasing] = None) -> LoopSettings:
    """The loop's settings; the checkpoints record every flag (settings.record()) and the run's tokenizer with the
    casing of its shards."""
    run, stream = settings.run, settings.stream
    return LoopSettings(
        output_dir=run.output_dir, flags=settings.record(),
        tokenizer={**tokenizer.record(), **casing_record(casing)} if tokenizer is not None else None,
        num_workers=stream.num_workers,
        log_freq=run.log_freq, num_steps_per_checkpoint=run.num_steps_per_checkpoint,
        skip_checkpoint=run.skip_checkpoint, phase2=run.phase2, phase1_end_step=run.phase1_end_step,
        do_eval=run.do_eval, eval_steps=run.eval_steps, eval_batch_size=run.eval_batch_size or stream.micro_batch,
        eval_interval_minutes=run.eval_interval_minutes, train_budget_minutes=settings.optimizer.train_budget_minutes,
        max_tokens=settings.optimizer.max_tokens, batch_ramp=step_ramp(settings, ctx) if run.do_train else None,
        progress_bar=ctx.is_main and not run.disable_progress_bar, peak_tflops=run.peak_tflops)


def step_ramp(settings: PretrainingSettings, ctx: DistributedContext) -> Optional[BatchRamp]:
    """The batch-size warm-up over the run's lanes (resume_rules.stream_lanes checked that it has room)."""
    stream = settings.stream
    return batch_ramp(stream.batch_size_warmup_tokens, stream.batch_size_warmup_start,
                      stream.gradient_accumulation_steps, stream.micro_batch, ctx.world_size, settings.derived.lanes)


def train_and_evaluate(settings: PretrainingSettings, setup: TrainingSetup, loop: LoopSettings,
                       shards: list[ShardInfo], spec: Optional[masking.MaskingSpec], resume: ResumePoint,
                       steps_left: int, criterion: Criterion) -> dict[str, Any]:
    """Trains the steps left (saying so when there are none), evaluates as asked, logs the closing record."""
    final: dict[str, Any] = {}
    run, optimizer = settings.run, settings.optimizer
    if run.do_train and steps_left <= 0:
        where = resume.path or run.output_dir
        at = (f"has consumed {resume.tokens} tokens of --max_tokens {optimizer.max_tokens}"
              if optimizer.max_tokens and resume.tokens >= optimizer.max_tokens
              else f"is at step {resume.phase_step} of --max_steps {optimizer.max_steps}")
        message = f"{where}: phase {2 if run.phase2 else 1} {at}: nothing left to train"
        setup.log.log("PARAMETER", {"nothing_left_to_train": message}, echo=False)
        if setup.ctx.is_main:
            print(message, file=sys.stderr, flush=True)
    elif run.do_train:
        data = sample_stream(settings.stream, settings.derived.lanes, setup.ctx, shards, spec, resume, steps_left,
                             setup.config.vocab_size, optimizer.max_steps)
        final.update(pretraining_loop(setup, data, criterion, loop, resume, steps_left))
    if run.do_eval and setup.eval_shards and "eval_mlm_accuracy" not in final:
        final.update(evaluate(setup, loop.eval_batch_size))
    setup.log.log([], final)
    setup.log.close()
    return final
