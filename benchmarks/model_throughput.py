"""Training-step throughput of our BertForPreTraining + LAMB against transformers' BertForPreTraining + AdamW.

Both run in this process on the same batch and precision: forward, backward and optimizer step. The achieved
FLOP/s is reported as a fraction of this machine's matrix-multiply peak, measured here with large GEMMs.

    python -m benchmarks.model_throughput                       # BERT-base, seq 128 and 512, fp32 and bf16
                                                                # (fp32 alone where the CPU has no native bf16)
    python -m benchmarks.model_throughput --seq 128 --precision bf16 --steps 3
    python -m benchmarks.model_throughput --device cuda --config large --batch 64 --precision bf16 fp16
"""
from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from benchmarks.common import host_threads_line, masked_per_seq, time_steps, write_json
from benchmarks.gemm_peak import DTYPES, SQUARE, gemm_gflops, precision_context
from bertrecipe.common.hardware import detect, host_record, pick_precisions
from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.training.optimization import Lamb, weight_decay_groups

Batch = tuple[torch.Tensor, ...]  # input_ids, token_type_ids, attention_mask, masked-LM labels (-1: none), NSP labels
LARGE = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)


def training_flops(config: BertConfig, batch: int, seq: int, masked: int) -> float:
    """Forward+backward FLOPs (3x forward) of the work BERT pre-training must do; the MLM head is counted on the
    masked positions only, as the task defines it, so that both implementations are held to the same count."""
    h, i, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    tokens = batch * seq
    per_token_layer = 2 * (4 * h * h + 2 * h * i) + 2 * 2 * seq * h  # projections, MLP, QK^T and AV
    forward = tokens * layers * per_token_layer
    forward += batch * masked * 2 * (h * h + h * vocab) + batch * 2 * (h * h + 2 * h)  # MLM head, pooler + NSP
    return 3 * forward


def make_batch(config: BertConfig, batch: int, seq: int, masked: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1000, config.vocab_size, (batch, seq), generator=g)
    token_type_ids = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[1::2, seq - seq // 8 :] = 0  # some padding, as real shards have
    labels = torch.full((batch, seq), -1)
    for row in range(batch):
        positions = torch.randperm(seq - seq // 8 - 1, generator=g)[:masked] + 1
        labels[row, positions] = torch.randint(1000, config.vocab_size, (masked,), generator=g)
    nsp = torch.randint(0, 2, (batch,), generator=g)
    return input_ids, token_type_ids, attention_mask, labels, nsp


@dataclass(frozen=True)
class StepOptions:
    """Where and how a training step runs: the device, the precision (gemm_peak.DTYPES: fp16 adds a GradScaler),
    the model under torch.compile (in place, as run_pretraining.py --compile does) and, for ours, LAMB's update
    fused by torch.compile (run_pretraining.py --compile_optimizer)."""

    device: str = "cpu"
    precision: str = "fp32"
    compile_model: bool = False
    compile_backend: str = "inductor"
    compiled_optimizer: bool = True


@dataclass
class Trainer:
    """A model, its optimizer and how a batch becomes its loss; step() is one training step at the options'
    precision (autocast around the forward and loss only, as the recipe's stepper does)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_of: Callable[[Batch], torch.Tensor]
    options: StepOptions

    def __post_init__(self) -> None:
        fp16 = self.options.precision == "fp16"
        self.scaler = torch.amp.GradScaler(torch.device(self.options.device).type) if fp16 else None

    def step(self, batch: Batch) -> float:
        with precision_context(self.options.device, self.options.precision):
            loss = self.loss_of(batch)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()  # waits for the step's kernels, as the recipe's loop does once a step


def to_device(batch: Batch, device: str) -> Batch:
    return tuple(t.to(device) for t in batch)


def built(model: torch.nn.Module, options: StepOptions) -> torch.nn.Module:
    model = model.to(options.device).train()
    if options.compile_model:
        model.compile(backend=options.compile_backend)  # in place, compiled on the first (warm-up) step
    return model


def ours_trainer(config: BertConfig, options: StepOptions = StepOptions()) -> Trainer:
    with torch.device(options.device):  # initialised where it trains: no copy of BERT-large through the host
        model = built(BertForPreTraining(config), options)
    optimizer = Lamb(weight_decay_groups(model, 0.01), lr=1e-4, compiled=options.compiled_optimizer)

    def loss_of(batch: Batch) -> torch.Tensor:
        input_ids, token_type_ids, attention_mask, labels, nsp = batch
        return model(input_ids, token_type_ids, attention_mask, masked_lm_labels=labels,
                     next_sentence_labels=nsp).loss

    return Trainer(model, optimizer, loss_of, options)


def peer_trainer(config: BertConfig, options: StepOptions = StepOptions()) -> Trainer:
    import transformers

    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"})
    with torch.device(options.device):
        model = built(transformers.BertForPreTraining(hf_config), options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # transformers' Trainer default

    def loss_of(batch: Batch) -> torch.Tensor:
        input_ids, token_type_ids, attention_mask, labels, nsp = batch
        return model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                     labels=labels.masked_fill(labels < 0, -100), next_sentence_label=nsp).loss

    return Trainer(model, optimizer, loss_of, options)


def ours_step(config: BertConfig, batch: Batch, options: StepOptions = StepOptions()) -> Callable[[], float]:
    trainer = ours_trainer(config, options)
    return functools.partial(trainer.step, to_device(batch, options.device))


def peer_step(config: BertConfig, batch: Batch, options: StepOptions = StepOptions()) -> Callable[[], float]:
    trainer = peer_trainer(config, options)
    return functools.partial(trainer.step, to_device(batch, options.device))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="base", help="base, large, or a bert_config.json path")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--precision", nargs="+", choices=sorted(DTYPES),
                        help="default: fp32 and bf16, fp32 alone where the CPU has no native bf16")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    presets = {"base": BertConfig(), "large": LARGE}
    config = presets.get(args.config) or BertConfig.from_json_file(args.config)
    torch.manual_seed(0)
    host = detect(torch.device(args.device).type)  # both models run there
    precisions = pick_precisions(host, args.precision, ["fp32", "bf16"])
    print(f"{host_threads_line(host, ' and '.join(precisions))}; BERT {args.config}, batch {args.batch}")
    # The practical ceiling of the dense layers: the best of 10 square 2048^3 GEMMs, in FLOP/s.
    peaks = {p: gemm_gflops(SQUARE, SQUARE, SQUARE, p, repeats=10, device=args.device) * 1e9 for p in precisions}
    for p, flops in peaks.items():
        print(f"matmul peak {p}: {flops / 1e12:.3f} TFLOP/s")
    results = []
    for seq in args.seq:
        masked = masked_per_seq(seq)
        batch = make_batch(config, args.batch, seq, masked)
        flops = training_flops(config, args.batch, seq, masked)
        for precision in precisions:
            row = {"seq": seq, "masked": masked, "batch": args.batch, **host_record(host, precision)}
            options = StepOptions(args.device, precision)
            for name, build in (("ours", ours_step), ("peer", peer_step)):
                seconds = time_steps(build(config, batch, options), args.warmup, args.steps)
                row[f"{name}_seq_per_s"] = args.batch / seconds
                row[f"{name}_peak_fraction"] = flops / seconds / peaks[precision]
            row["speedup"] = row["ours_seq_per_s"] / row["peer_seq_per_s"]
            results.append(row)
            print(f"seq {seq} ({masked} masked) {precision}: ours {row['ours_seq_per_s']:.2f} seq/s "
                  f"({row['ours_peak_fraction']:.0%} of peak), transformers+AdamW {row['peer_seq_per_s']:.2f} seq/s "
                  f"({row['peer_peak_fraction']:.0%}), speed-up {row['speedup']:.2f}x", flush=True)
    if args.json:
        write_json(args.json, {"host": host_record(host, " and ".join(precisions)), "peaks": peaks,
                               "results": results})


if __name__ == "__main__":
    main()
