"""What a pre-training run may continue from, and what a resume may change (docs/reliability.md, "Resuming").

- Which checkpoint: a phase-1 run continues the newest phase-1 checkpoint; a phase-2 run the newest phase-2 one,
  or, when there is none yet, hands over from the newest phase-1 checkpoint, whose step must be
  --phase1_end_step. A phase-1 run in a folder that phase 2 has begun is either finished (nothing left to train)
  or refused.
- What it writes: never a checkpoint that exists already, whatever the phases' step numbers (checked before the
  first step).
- Which flags may change: RULES, one line each for every flag that shapes the run. A flag is applied (the run
  takes the new value and says so), or refused (one line naming old and new).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bertrecipe.common.errors import InputError
from bertrecipe.model.families import ModelConfig, is_modern_config, recorded_config
from bertrecipe.pretraining.sample_order import check_lanes, default_lanes
from bertrecipe.pretraining.settings import PretrainingSettings, StreamSettings
from bertrecipe.pretraining.shard_schema import ShardInfo, content_fingerprint
from bertrecipe.pretraining.token_budget import batch_ramp
from bertrecipe.training import checkpointing
from bertrecipe.training.checkpointing import SavedCheckpoint, move_aside
from bertrecipe.training.process_group import DistributedContext, all_gather_objects


@dataclass(frozen=True)
class ResumeRule:
    flag: str  # the flag is --<flag>; its value is the run record's (PretrainingSettings.record)
    action: str  # "applied" or "refused"
    why: str
    before: Any = None  # the value of checkpoints older than the flag (None: those are not compared)
    limit: str = ""  # when an applied change is refused or does nothing after all (the docs' table, not the line)


RULES = (
    ResumeRule("learning_rate", "applied", "the schedule goes on from the checkpoint's step with the new peak"),
    ResumeRule("warmup_proportion", "applied", "the schedule goes on from the checkpoint's step with the new warm-up"),
    ResumeRule("max_steps", "applied", "the decay now ends at the new step",
               limit="below the checkpoint's step, or under a --masked_lm_prob_schedule: refused"),
    ResumeRule("train_budget_minutes", "applied", "the budget's schedule goes on with the new budget"),
    ResumeRule("max_tokens", "applied", "the schedule goes on from the checkpoint's token count with the new budget",
               before=0, limit="reached already: nothing left to train"),
    ResumeRule("warmup_tokens", "applied", "the schedule goes on from the checkpoint's token count with the new "
                                           "warm-up"),
    ResumeRule("batch_size_warmup_tokens", "applied", "the next steps take the batch the new ramp gives at the "
                                                      "checkpoint's token count; the stream goes on in order",
               before=0),
    ResumeRule("batch_size_warmup_start", "applied", "the next steps take the batch the new ramp gives at the "
                                                     "checkpoint's token count"),
    ResumeRule("lr_schedule", "applied", "the schedule goes on from the checkpoint's step in the new shape",
               before="poly"),
    ResumeRule("decay_proportion", "applied", "the decay now takes the new share of the steps (a stable run "
                                              "can branch into its decay)"),
    ResumeRule("min_lr_ratio", "applied", "the decay ends at the new floor"),
    ResumeRule("decay_shape", "applied", "the decay goes on in the new shape"),
    ResumeRule("weight_decay", "applied", "the decay takes the new rate from the next step", before=0.01),
    ResumeRule("adam_beta1", "applied", "the moments go on, averaged at the new rate from the next step"),
    ResumeRule("adam_beta2", "applied", "the moments go on, averaged at the new rate from the next step"),
    ResumeRule("adam_epsilon", "applied", "the update's denominator takes the new epsilon"),
    ResumeRule("gradient_accumulation_steps", "applied", "the same samples per step, in other micro-batches"),
    ResumeRule("train_batch_size", "applied", "allowed while the global batch (all processes) stays the same"),
    ResumeRule("fp16", "applied", "precision may change; the loss scale starts afresh where there was none"),
    ResumeRule("bf16", "applied", "precision may change"),
    ResumeRule("tf32", "applied", "precision may change"),
    ResumeRule("deterministic", "applied", "the kernels change from the next step; the numbers already trained stay"),
    ResumeRule("sharding", "applied", "a single file or a folder of shards, each process reads what it holds: the "
                                      "run goes on sharded or not, on any number of processes that keeps the "
                                      "global batch", before="ddp"),
    ResumeRule("bin_by_length", "applied", "the step's samples stay; only their micro-batches change"),
    ResumeRule("pack_sequences", "applied", "the step's samples stay; only their rows change"),
    ResumeRule("seed", "refused", "the seed orders the sample stream: another one mid-epoch repeats some samples and "
                                  "skips others"),
    ResumeRule("max_seq_length", "refused", "another sequence length is another phase: pass --phase2 for phase 2"),
    ResumeRule("max_predictions_per_seq", "refused", "the masked positions per sequence shape every batch"),
    ResumeRule("dynamic_masking", "refused", "it changes what every sample of the stream is"),
    ResumeRule("masked_lm_prob", "refused", "it changes what every sample of the stream is"),
    ResumeRule("masked_lm_prob_schedule", "refused", "the mask rate of every step left would change (a new phase "
                                                     "may take another)", before="constant"),
    ResumeRule("masked_lm_prob_end", "refused", "the mask rate of every step left would change (a new phase may "
                                                "take another)", before=None),
    ResumeRule("whole_word_masking", "refused", "it changes what every sample of the stream is"),
    ResumeRule("optimizer", "refused", "the checkpoint holds that optimizer's state (LAMB's and AdamW's moments "
                                       "are not interchangeable)", before="lamb"),
)
# Compared outside RULES, with the same words in the docs' table.
OTHER_CHECKS = (
    ("the input shards (--input_dir), by name and content", "refused",
     "the stream's position counts samples of those very files (compared by a fingerprint of each shard's "
     "attributes, shapes and first rows)"),
    ("the global batch (train_batch_size x processes)", "refused", "the stream's position counts whole steps"),
    ("`--no_nsp`", "refused", "the optimizer holds state for the heads that were trained"),
    ("--phase2 / --phase1_end_step", "see the phases", "a phase-1 run never continues a phase-2 checkpoint"),
)


def docs_table() -> str:
    """The markdown table docs/reliability.md shows (a test keeps the two the same)."""
    rows = ["| flag | on resume | why |", "|---|---|---|"]
    rows += [f"| `--{rule.flag}` | {rule.action} | {rule.why}{f' ({rule.limit})' if rule.limit else ''} |"
             for rule in RULES]
    rows += [f"| {what} | {action} | {why} |" for what, action, why in OTHER_CHECKS]
    return "\n".join(rows)


def choose_checkpoint(everything: list[SavedCheckpoint], output_dir: str | Path, phase2: bool,
                      phase1_end_step: int, max_steps: int) -> Optional[SavedCheckpoint]:
    """The checkpoint of output_dir (`everything`: checkpointing.survey's) that a --resume_from_checkpoint run
    continues (or hands over from); None when there is none for this phase (see the module for the rules).
    Unreadable ones newer than it are skipped with a warning."""
    saved = [s for s in everything if s.phase is not None]
    newest_good = saved[-1].step if saved else -1
    for unreadable in (s for s in everything if s.phase is None and s.step > newest_good):
        print(f"warning: skipping {unreadable.path}: it does not load", file=sys.stderr, flush=True)
    first = [s for s in saved if s.phase == 1]
    second = [s for s in saved if s.phase == 2]
    if phase2:
        if second:
            newest = second[-1]
            if newest.phase1_end_step is not None and newest.phase1_end_step != phase1_end_step:
                raise InputError(f"{newest.path}: phase 2 here counts its steps after phase 1's step "
                                 f"{newest.phase1_end_step}, not --phase1_end_step {phase1_end_step}; pass "
                                 f"--phase1_end_step {newest.phase1_end_step}")
            return newest
        if not first:
            raise InputError(f"{output_dir}: phase 2 needs the phase-1 checkpoint to resume from")
        handoff = first[-1]
        if handoff.step != phase1_end_step:
            raise InputError(f"{handoff.path}: phase 1 ended at step {handoff.step}, not --phase1_end_step "
                             f"{phase1_end_step}; pass --phase1_end_step {handoff.step} (run.sub: PHASE1_END_STEP) so "
                             "that phase 2's checkpoints follow phase 1's")
        return handoff
    if second and not (first and first[-1].phase_step >= max_steps):
        where = f"phase 1 stopped at step {first[-1].step}" if first else "it holds no phase-1 checkpoint"
        raise InputError(f"{output_dir}: phase 2 has begun here ({second[-1].path.name}) but {where} of "
                         f"--max_steps {max_steps}; phase 1 cannot go on under phase 2's checkpoints: resume "
                         "phase 2 (--phase2), or start phase 1 again in a new --output_dir")
    return first[-1] if first else None


def refuse_phase_mismatch(path: Path, ckpt: dict[str, Any], phase2: bool) -> None:
    """A phase-1 run never continues a phase-2 checkpoint (it would train phase 1 on phase-2 weights)."""
    if ckpt.get("phase2") and not phase2:
        raise InputError(f"{path}: is a phase-2 checkpoint; continue it with --phase2, or pick a phase-1 one with "
                         "--resume_step")


def refuse_overwrites(everything: list[SavedCheckpoint], first_step: int, last_step: int) -> None:
    """One line before the first step when a checkpoint this run would write (global steps first_step..last_step)
    is among `everything` (checkpointing.survey's): the phases' step numbers overlap, or the run was set back with
    --resume_step. One that does not load is moved aside as `*.corrupt` instead, as rotation does."""
    for saved in everything:
        if not first_step <= saved.step <= last_step:
            continue
        if saved.phase is None:
            move_aside(saved.path)
            continue
        raise InputError(f"{saved.path}: (phase {saved.phase}) lies in the steps this run would checkpoint "
                         f"({first_step}-{last_step}) and would be overwritten; check --phase1_end_step and "
                         "--max_steps, or move it away")


def saved_optimizer(ckpt: dict[str, Any]) -> str:
    """The --optimizer a checkpoint was trained with ("lamb" for those older than the flag)."""
    return str((ckpt.get("args") or {}).get("optimizer", "lamb"))


def same_value(old: Any, new: Any) -> bool:
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        return float(old) == float(new)
    return old == new


def with_fingerprints(shards: list[ShardInfo], ctx: DistributedContext) -> list[ShardInfo]:
    """The shards with their content fingerprints (shard_schema.content_fingerprint), each process hashing its
    share (every world_size-th shard) and all of them gathering the rest; a shard that cannot be read stops every
    process with the same line."""
    mine: dict[int, str] = {}
    problem = None
    for index in range(ctx.rank, len(shards), ctx.world_size):
        try:
            mine[index] = content_fingerprint(shards[index].path)
        except InputError as error:
            problem = str(error)
            break
    everyone = all_gather_objects((mine, problem), ctx)
    problems = [found for _, found in everyone if found]
    if problems:
        raise InputError(problems[0])
    merged = {index: value for part, _ in everyone for index, value in part.items()}
    return [dataclasses.replace(shard, fingerprint=merged[index]) for index, shard in enumerate(shards)]


def compare_shards(path: Path, data: dict[str, Any], shards: list[ShardInfo]) -> None:
    """The shards a resume reads must be the checkpoint's, by name and by content (where the checkpoint recorded
    their fingerprints: NVIDIA's layout gives every shard folder the same names)."""
    files, names = data.get("files"), [shard.path.name for shard in shards]
    if files is not None and list(files) != names:
        gone, added = sorted(set(files) - set(names)), sorted(set(names) - set(files))
        raise InputError(f"{path}: was trained on other shards than --input_dir holds now ({len(gone)} missing, e.g. "
                         f"{gone[:2]}; {len(added)} new, e.g. {added[:2]}): the stream's position counts samples of "
                         "those files; resume with the same shards")
    saved = data.get("fingerprints")
    if saved is None:
        return
    changed = [shard.path for shard, old in zip(shards, saved, strict=True) if old != shard.fingerprint]
    if changed:
        raise InputError(f"{path}: was trained on shards of the same names but other contents than --input_dir "
                         f"holds now ({len(changed)} of {len(shards)} differ, e.g. {changed[0]}: another vocab, "
                         "casing, dupe factor or seed makes other samples); the stream's position counts samples "
                         "of those very files: resume with the shards it was trained on, or start from it with "
                         "--init_checkpoint in a new --output_dir")


def compare_flags(path: Path, ckpt: dict[str, Any], record: dict[str, Any], shards: list[ShardInfo],
                  global_batch: int) -> list[str]:
    """The changes a resume applies, one line each, comparing the run's flat record of flags
    (PretrainingSettings.record) with the checkpoint's ("args"); InputError naming old and new for a refused one."""
    saved = ckpt.get("args") or {}
    data = ckpt.get("data") or {}
    applied = []
    for rule in RULES:
        if rule.flag == "warmup_proportion" and record.get("warmup_tokens") is not None:
            continue  # derived from --warmup_tokens and --max_tokens, whose own rules name the change
        old, new = saved.get(rule.flag, rule.before), record[rule.flag]
        if (rule.flag not in saved and rule.before is None) or same_value(old, new):
            continue
        if rule.action == "refused":
            raise InputError(f"{path}: was trained with --{rule.flag} {old}, this run has {new}: {rule.why}; resume "
                             f"with --{rule.flag} {old}, or start from it with --init_checkpoint in a new --output_dir")
        applied.append(f"--{rule.flag} {old} -> {new} ({rule.why})")
    compare_shards(path, data, shards)
    saved_batch = data.get("global_batch")
    if saved_batch is not None and int(saved_batch) != global_batch:
        raise InputError(f"{path}: was trained with a global batch of {saved_batch} sequences, this run has "
                         f"{global_batch} (--train_batch_size x processes): the stream's position counts whole steps; "
                         f"keep {saved_batch} sequences per step")
    return applied


CONTEXT_EXTENSION_KEYS = ("rope_parameters", "max_position_embeddings")


def find_resume_checkpoint(settings: PretrainingSettings, config: ModelConfig,
                           existing: list[checkpointing.SavedCheckpoint]) -> Optional[tuple[Path, dict[str, Any]]]:
    """The checkpoint this run continues from (None for a fresh start) among the `existing` ones
    (checkpointing.survey's), chosen by phase (resume_rules) and checked to fit the run."""
    run = settings.run
    if run.do_train and existing and not run.resume_from_checkpoint:
        raise InputError(f"{run.output_dir}: holds checkpoints of another run ({existing[-1].path.name}); pass "
                         "--resume_from_checkpoint to continue it or choose another --output_dir")
    if not run.resume_from_checkpoint:
        return None
    if not existing and run.resume_step < 0:
        if run.do_train and run.phase2:
            raise InputError(f"{run.output_dir}: phase 2 needs the phase-1 checkpoint to resume from")
        return None  # NVIDIA's scripts always pass --resume_from_checkpoint: the first run starts fresh
    step = run.resume_step
    if step < 0 and run.do_train:
        chosen = choose_checkpoint(existing, run.output_dir, run.phase2, run.phase1_end_step,
                                   settings.optimizer.max_steps)
        step = chosen.step if chosen is not None else -1
    path, ckpt = checkpointing.load_newest_checkpoint(run.output_dir, step)
    if run.do_train:
        refuse_phase_mismatch(path, ckpt, run.phase2)
        missing = [key for key in ("optimizer", "phase_step", "data") if key not in ckpt]
        if missing:
            raise InputError(f"{path}: holds weights but no training state ({', '.join(missing)}), so a run cannot "
                             "resume from it; pass it as --init_checkpoint in a new --output_dir instead")
    refuse_another_config(path, ckpt, config, settings.model.config_file, run.phase2)
    return path, ckpt


def refuse_another_config(path: Path, ckpt: dict[str, Any], config: ModelConfig, config_file: str,
                          phase2: bool) -> None:
    """One line naming the changed keys when the checkpoint was trained with another config than config_file's
    (the modern family's context extension aside: phase 2 may take longer rows with other rotary bases)."""
    saved = ckpt.get("config")
    if not isinstance(saved, dict):
        return
    saved, ours = recorded_config(saved), config.to_dict()
    extending = phase2 and not ckpt.get("phase2") and is_modern_config(config)
    changed = [f"{key} {saved.get(key)} -> {ours.get(key)}" for key in sorted(set(saved) | set(ours))
               if saved.get(key) != ours.get(key) and not (extending and key in CONTEXT_EXTENSION_KEYS)]
    if changed:
        raise InputError(f"{path}: was trained with another config than {config_file} ({'; '.join(changed)}); "
                         "resume with the same --config_file or use a new --output_dir")


def check_resume(settings: PretrainingSettings, ctx: DistributedContext, shards: list,
                 resume_from: Optional[tuple[Path, dict[str, Any]]],
                 existing: list[checkpointing.SavedCheckpoint]) -> tuple[int, list[str]]:
    """Before the first write: what is left to train (steps), and the flag changes a resume applies (one line
    each); refuses a changed flag that cannot apply (RULES), a --max_steps behind the checkpoint, and a
    run that would write over an existing checkpoint."""
    run, max_steps, max_tokens = settings.run, settings.optimizer.max_steps, settings.optimizer.max_tokens
    start, tokens, changes = 0, 0, []
    if resume_from is not None:
        path, ckpt = resume_from
        if bool(ckpt.get("phase2")) == bool(run.phase2):  # continuing a phase (a hand-over starts one afresh)
            start = int(ckpt["phase_step"])
            changes = compare_flags(path, ckpt, settings.record(), shards,
                                    settings.stream.train_batch_size * ctx.world_size)
            refuse_stretched_mask_schedule(path, ckpt, settings)
            if ctx.is_main and "fingerprints" not in (ckpt.get("data") or {}):
                print(f"warning: {path}: was written before checkpoints recorded their shards' contents; the shards "
                      "of --input_dir are compared with it by name only", file=sys.stderr, flush=True)
            if start > max_steps:
                raise InputError(f"{path}: is at step {start} of this phase, beyond --max_steps {max_steps}; pass "
                                 f"--max_steps {start} or more to go on")
            tokens = saved_tokens(path, ckpt, settings)
    steps_left = max_steps - start if not (max_tokens and tokens >= max_tokens) else 0
    if run.steps_this_run > 0:
        steps_left = min(steps_left, run.steps_this_run)
    offset = run.phase1_end_step if run.phase2 else 0
    if steps_left > 0 and not run.skip_checkpoint:
        refuse_overwrites(existing, offset + start + 1, offset + start + steps_left)
    return steps_left, changes


def refuse_stretched_mask_schedule(path: Path, ckpt: dict[str, Any], settings: PretrainingSettings) -> None:
    """A mask-rate schedule spans --max_steps: a resume that moves it would mask the steps left at other rates
    than the phase began with (a constant rate allows it, as the lr schedule does)."""
    stream = settings.stream
    if stream.masked_lm_prob_schedule == "constant" or not stream.dynamic_masking:
        return
    saved = (ckpt.get("args") or {}).get("max_steps")
    if saved is not None and int(saved) != settings.optimizer.max_steps:
        raise InputError(f"{path}: was trained with --max_steps {saved}, this run has {settings.optimizer.max_steps}: "
                         f"--masked_lm_prob_schedule {stream.masked_lm_prob_schedule} spans --max_steps, so the mask "
                         f"rate of every step left would change; resume with --max_steps {saved}")


def saved_tokens(path: Path, ckpt: dict[str, Any], settings: PretrainingSettings) -> int:
    """The phase's token count in a checkpoint it continues; refuses a token flag on one older than the count."""
    if "tokens" not in ckpt and (settings.optimizer.max_tokens or settings.stream.batch_size_warmup_tokens):
        raise InputError(f"{path}: was written before checkpoints counted the tokens trained, which --max_tokens and "
                         "--batch_size_warmup_tokens go by; continue it without them")
    return int(ckpt.get("tokens", 0))


def stream_lanes(stream: StreamSettings, phase2: bool, ctx: DistributedContext,
                 resume_from: Optional[tuple[Path, dict[str, Any]]]) -> int:
    """The lane count of the sample stream: the checkpoint's when continuing a phase (its stream goes on), else
    --data_lanes or the default; checked to split the global batch over this many processes, and to leave a
    batch-size warm-up steps smaller than the full one."""
    global_batch = stream.train_batch_size * ctx.world_size
    # A batch-size warm-up's steps are whole micro-batches per process: the default lanes split the smallest.
    lanes = stream.data_lanes or default_lanes(stream.micro_batch * ctx.world_size if stream.batch_size_warmup_tokens
                                               else global_batch, ctx.world_size)
    if resume_from is not None:
        path, ckpt = resume_from
        saved = int((ckpt.get("data") or {}).get("lanes", 0))
        continuing = bool(ckpt.get("phase2", False)) == bool(phase2)
        if continuing and saved:
            if stream.data_lanes and stream.data_lanes != saved:
                raise InputError(f"{path}: its stream has {saved} lanes, not --data_lanes {stream.data_lanes}; drop "
                                 "the flag to continue it")
            lanes = saved
    check_lanes(lanes, global_batch, ctx.world_size)
    batch_ramp(stream.batch_size_warmup_tokens, stream.batch_size_warmup_start, stream.gradient_accumulation_steps,
               stream.micro_batch, ctx.world_size, lanes)  # InputError when the lanes leave no smaller step
    return lanes
