"""What a pre-training run is asked to do, as typed, frozen settings: built once by the command
(cli/run_pretraining.py) from its checked flags, then read by the model and optimizer set-up (startup.py), the
resume rules (resume_rules.py) and the loop (loop.py), which never see the flags themselves.

Every flag is a field of exactly one group, under the flag's own name, with its effective value (a default filled
in, never a value computed later: derived values are fields of their own, e.g. Derived.lanes). `record()` gives
them back as one flat {flag: value} record: what each checkpoint stores as "args", what the log's PARAMETER record
shows, and what a resume compares with a checkpoint's (resume_rules.RULES).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class ModelSettings:
    """The model: its config, its starting weights and how it is run."""

    config_file: str
    init_checkpoint: Optional[str] = None
    bert_model: str = "bert-large-uncased"  # NVIDIA's flag, accepted and unused
    pretrain_dropout: Optional[float] = None  # the model's dropout while pre-training, the config's otherwise
    checkpoint_activations: bool = False
    no_nsp: bool = False  # masked LM alone: --no_nsp, or a modern config (which has no NSP head to train)
    compile: bool = False


@dataclass(frozen=True)
class DeviceSettings:
    """Where and in what precision the steps run, and how gradients are all-reduced."""

    no_cuda: bool = False
    fp16: bool = False
    bf16: bool = False
    tf32: bool = False
    deterministic: bool = False
    loss_scale: float = 0.0  # NVIDIA's flag, accepted: scaling is dynamic
    init_loss_scale: float = 2.0**20
    allreduce_post_accumulation: bool = False
    allreduce_post_accumulation_fp16: bool = False
    local_rank: int = -1
    sharding: str = "ddp"  # or "fsdp": parameters, gradients and optimizer state sharded over the processes


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer and its learning-rate schedule, over steps, tokens or a time budget."""

    optimizer: str = "lamb"
    learning_rate: float = 5e-5
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    weight_decay: float = 0.01
    compile_optimizer: Optional[bool] = None
    lr_schedule: str = "poly"
    warmup_proportion: float = 0.01  # --warmup_tokens / --max_tokens when those are given
    warmup_tokens: Optional[int] = None
    decay_proportion: float = 0.1
    min_lr_ratio: float = 0.0
    decay_shape: str = "linear"
    max_steps: int = 1000
    num_train_epochs: float = 3.0  # NVIDIA's flag, accepted: max_steps rules
    train_budget_minutes: float = 0.0
    max_tokens: int = 0


@dataclass(frozen=True)
class StreamSettings:
    """The sample stream: the shards, the batch and its accumulation, masking, binning, packing, the lanes."""

    input_dir: str
    seed: int = 42
    train_batch_size: int = 32  # per process, before accumulation
    gradient_accumulation_steps: int = 1
    max_seq_length: int = 512
    max_predictions_per_seq: int = 80
    dynamic_masking: bool = False
    masked_lm_prob: float = 0.15  # with a schedule: the rate at the phase's first step
    masked_lm_prob_end: Optional[float] = None  # the rate at the phase's last step (a schedule's; None: constant)
    masked_lm_prob_schedule: str = "constant"  # masking.SCHEDULE_SHAPES
    whole_word_masking: bool = False
    vocab_file: Optional[str] = None
    allow_vocab_mismatch: bool = False
    bin_by_length: bool = False
    pack_sequences: bool = False
    data_lanes: int = 0  # as given (0: the default count); Derived.lanes is the run's
    num_workers: int = 0
    batch_size_warmup_tokens: int = 0
    batch_size_warmup_start: float = 0.125

    @property
    def micro_batch(self) -> int:
        return self.train_batch_size // self.gradient_accumulation_steps


@dataclass(frozen=True)
class RunSettings:
    """The run: its folder and log, the phases, resuming, checkpoints, evaluation, how long it lasts."""

    output_dir: str
    json_summary: str  # --json-summary, or dllogger.json in output_dir
    do_train: bool = False
    do_eval: bool = False
    eval_dir: Optional[str] = None
    eval_steps: int = 0
    eval_batch_size: int = 0  # 0: the training micro-batch
    eval_interval_minutes: float = 0.0
    resume_from_checkpoint: bool = False
    resume_step: int = -1
    phase2: bool = False
    phase1_end_step: int = 7038
    num_steps_per_checkpoint: int = 100
    skip_checkpoint: bool = False
    steps_this_run: int = -1
    log_freq: int = 1
    disable_progress_bar: bool = False
    peak_tflops: Optional[float] = None  # the device's peak for the logs' mfu (None: a known GPU's, a CPU's measured)


@dataclass(frozen=True)
class Derived:
    """What the run computes from its flags and inputs, kept apart from the flags it came from."""

    lanes: int = 0  # the stream's lane count: the checkpoint's when continuing it, else --data_lanes or the default


@dataclass(frozen=True)
class PretrainingSettings:
    """Every setting of a pre-training run, by group (see the module)."""

    model: ModelSettings
    device: DeviceSettings
    optimizer: OptimizerSettings
    stream: StreamSettings
    run: RunSettings
    derived: Derived = field(default_factory=Derived)

    FLAG_GROUPS = ("model", "device", "optimizer", "stream", "run")

    def record(self) -> dict[str, Any]:
        """Every flag's effective value, flat: {flag: value} (checkpoints' "args", the log's PARAMETER record)."""
        flat: dict[str, Any] = {}
        for group in self.FLAG_GROUPS:
            flat.update(dataclasses.asdict(getattr(self, group)))
        return flat

    def with_derived(self, **changes: Any) -> PretrainingSettings:
        """A copy whose Derived values are changed (the settings themselves are frozen)."""
        return dataclasses.replace(self, derived=dataclasses.replace(self.derived, **changes))


def settings_from_flags(flags: dict[str, Any]) -> PretrainingSettings:
    """The settings of a flat {flag: value} record: each group takes its fields, and every flag must find one."""
    groups = {"model": ModelSettings, "device": DeviceSettings, "optimizer": OptimizerSettings,
              "stream": StreamSettings, "run": RunSettings}
    taken: set[str] = set()
    built = {}
    for name, kind in groups.items():
        names = {f.name for f in dataclasses.fields(kind)}
        built[name] = kind(**{key: value for key, value in flags.items() if key in names})
        taken |= names
    unplaced = sorted(set(flags) - taken)
    if unplaced:  # a flag added to the parser and to no group: a programming error, not the user's
        raise ValueError(f"flags of no settings group: {', '.join(unplaced)}")
    return PretrainingSettings(**built)
