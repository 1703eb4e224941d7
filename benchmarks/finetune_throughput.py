"""SQuAD-shaped fine-tuning and inference throughput: our BertForQuestionAnswering against transformers'.

Both run in this process on the same batches, the same precision and the same optimizer (AdamW): a training
step is forward, backward and optimizer step; inference is a no-grad forward in eval mode. Reported: sequences
per second over all timed steps and our speed-up over the peer, for two kinds of seq-384 batches:
  real: windows of the real SQuAD v1.1 dev set (../shared/data, tokenized with its uncased vocab), drawn at
        random; on average 178 of their 384 positions are tokens, the rest padding, as in any SQuAD run;
  full: every position a token (no padding), the model's speed alone.
Inference on full windows is also put against this host's GEMM peak (gemm_peak.py, measured in the same run and
thread setting): achieved GFLOP/s = analytic forward FLOPs / time, and its share of the GEMM peak in the row's
precision (a bf16 run measures the fp32 peak too). --compile adds our model under torch.compile (inductor,
weights frozen) to inference on full windows: a third model in the turns; the peer stays eager. --onnxruntime adds
our model exported to ONNX as triton/deployer.py exports it and run on ONNX Runtime (inference.py --onnx_model), to
fp32 inference on full windows.

    python -m benchmarks.finetune_throughput                            # BERT-base, batch 4, bf16 where native
    python -m benchmarks.finetune_throughput --config large --precision fp32 bf16 --steps 5 --windows full
    python -m benchmarks.finetune_throughput --windows full --phases inference --compile
    python -m benchmarks.finetune_throughput --windows full --phases inference --precision fp32 --onnxruntime
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from benchmarks.common import SHARED, SHARED_VOCAB, host_threads_line, middle, write_json
from benchmarks.gemm_peak import (
    Peak,
    forward_flops,
    fraction_of_peak,
    gemm_peak,
    peak_line,
    precision_context,
    synchronize,
)
from benchmarks.model_throughput import LARGE
from bertrecipe.common.hardware import Host, detect, host_record, pick_precisions
from bertrecipe.deploy.onnx_export import TritonSignature, export_onnx, onnx_qa_logits, open_qa_session
from bertrecipe.model.bert import BertConfig, BertForQuestionAnswering
from bertrecipe.training.optimization import build_adamw

Batch = tuple[torch.Tensor, ...]


def real_windows(squad_file: Path, vocab_file: Path, seq: int) -> Batch:
    """Every training window of a SQuAD file (ids, segments, mask, start, end), as run_squad.py makes them."""
    from bertrecipe.finetuning import squad
    from bertrecipe.finetuning.model_loading import load_tokenizer

    for path in (squad_file, vocab_file):
        if not path.is_file():
            raise SystemExit(f"{path}: not found (pass --squad_file/--vocab_file, or --windows full)")
    examples = squad.read_squad_examples(squad_file, is_training=True)
    features = squad.convert_examples_to_features(examples, load_tokenizer(vocab_file, True),
                                                  squad.WindowSettings(max_seq_length=seq), is_training=True)
    return tuple(torch.from_numpy(a).long() for a in (features.input_ids, features.segment_ids, features.input_mask,
                                                      features.start_positions, features.end_positions))


def make_batches(kind: str, windows: Batch | None, vocab_size: int, batch: int, seq: int, count: int) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    if kind == "real":
        rows = torch.randperm(windows[0].shape[0], generator=g)[: batch * count].view(count, batch)
        return [tuple(t[r] for t in windows) for r in rows]
    batches = []
    for _ in range(count):  # [CLS] 24-token query [SEP] document [SEP], no padding
        input_ids = torch.randint(1000, vocab_size, (batch, seq), generator=g)
        token_type_ids = (torch.arange(seq) > 25).long().expand(batch, seq).contiguous()
        start = torch.randint(26, seq // 2, (batch,), generator=g)
        batches.append((input_ids, token_type_ids, torch.ones(batch, seq, dtype=torch.long), start,
                        start + torch.randint(0, 10, (batch,), generator=g)))
    return batches


def ours(config: BertConfig) -> torch.nn.Module:
    return BertForQuestionAnswering(config)


def peer(config: BertConfig) -> torch.nn.Module:
    import transformers

    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"})
    return transformers.BertForQuestionAnswering(hf_config)


def train_step(model: torch.nn.Module, is_peer: bool) -> Callable[[Batch], None]:
    model.train()
    optimizer = build_adamw(model, 3e-5)

    def step(batch: Batch) -> None:
        input_ids, token_type_ids, attention_mask, start, end = batch
        if is_peer:
            loss = model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                         start_positions=start, end_positions=end).loss
        else:
            loss = model(input_ids, token_type_ids, attention_mask, start, end)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def onnxruntime_step(model: torch.nn.Module, folder: Path) -> Callable[[Batch], None]:
    """Our model exported as triton/deployer.py exports it, run on an ONNX Runtime session with torch's thread
    count (fp32: the export's precision)."""
    example = make_batches("full", None, model.config.vocab_size, 2, 64, 1)[0][:3]  # dynamic axes: any shape
    export_onnx(TritonSignature(model.eval()).eval(), example, folder / "model.onnx", "squad", 17)
    session = open_qa_session(folder / "model.onnx", threads=torch.get_num_threads())

    def step(batch: Batch) -> None:
        onnx_qa_logits(session, [t.numpy() for t in batch[:3]], len(batch[0]))

    return step


def infer_step(model: torch.nn.Module, is_peer: bool, compile_model: bool = False) -> Callable[[Batch], None]:
    model.eval()
    if compile_model:  # compiled on the first (warm-up) step, under that step's autocast
        from torch._inductor import config as inductor

        # Weights as constants: inductor folds their casts and prepacks them for oneDNN (bf16, bias and GELU
        # fused into the GEMM) or MKL (fp32). Inference only: the weights must not change after the first call.
        inductor.freezing = True
        model = torch.compile(model)

    @torch.no_grad()
    def step(batch: Batch) -> None:
        input_ids, token_type_ids, attention_mask, _, _ = batch
        if is_peer:
            model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        else:
            model(input_ids, token_type_ids, attention_mask)

    return step


def sequences_per_second(steps: dict[str, Callable[[Batch], None]], batches: list[Batch], precision: str,
                         warmup: int, rounds: int, device: str = "cpu") -> dict[str, float]:
    """Each step function over every batch, `rounds` times, the functions taking turns so that a busy moment of
    the machine hits both alike; the median round of each, after `warmup` untimed steps. The batches live on
    `device`; a round's clock stops when its kernels are done."""
    sequences = sum(b[0].shape[0] for b in batches)
    rates: dict[str, list[float]] = {name: [] for name in steps}
    with precision_context(device, precision):
        for step in steps.values():
            for i in range(warmup):
                step(batches[i % len(batches)])
        for _ in range(rounds):
            for name, step in steps.items():
                synchronize(device)
                tick = time.perf_counter()
                for batch in batches:
                    step(batch)
                synchronize(device)
                rates[name].append(sequences / (time.perf_counter() - tick))
    return {name: middle(r) for name, r in rates.items()}


LABELS = {"ours": "ours", "ours_compiled": "ours compiled", "ours_onnxruntime": "ours on ONNX Runtime",
          "peer": "transformers"}


def build_steps(config: BertConfig, phase: str, compiled: bool, onnx_folder: Path | None = None,
                device: str = "cpu") -> dict[str, Callable[[Batch], None]]:
    """Ours and the peer, from the same seed, on `device`; with `compiled` also ours under torch.compile, a model
    of its own, and with `onnx_folder` ours exported there and run on ONNX Runtime (on the CPU)."""
    names = ["ours", *(["ours_compiled"] if compiled else []), *(["ours_onnxruntime"] if onnx_folder else []),
             "peer"]
    steps = {}
    for name in names:
        torch.manual_seed(0)
        is_peer = name == "peer"
        with torch.device("cpu" if name == "ours_onnxruntime" else device):  # initialised where it runs
            model = peer(config) if is_peer else ours(config)
        if name == "ours_onnxruntime":
            steps[name] = onnxruntime_step(model, onnx_folder)
        elif phase == "training":
            steps[name] = train_step(model, is_peer)
        else:
            steps[name] = infer_step(model, is_peer, compile_model=name == "ours_compiled")
    return steps


def rates_line(rates: dict[str, float]) -> str:
    """'ours 3.77 seq/s (1.02x), transformers 3.70 seq/s': each rate, and ours' speed-up over the peer."""
    return ", ".join(f"{LABELS[name]} {rate:.2f} seq/s" + ("" if name == "peer" else f" ({rate / rates['peer']:.2f}x)")
                     for name, rate in rates.items())


def peak_fields(peaks: dict[str, Peak], precision: str, flops_per_seq: int, rates: dict[str, float]
                ) -> dict[str, float]:
    """GEMM peaks, each model's achieved GFLOP/s and its share of the peak of `precision`, for a JSON row."""
    row = {"forward_gflop_per_seq": flops_per_seq / 1e9, "gemm_peak_gflops": peaks[precision].gflops,
           "gemm_peak_fp32_gflops": peaks["fp32"].gflops}
    for name, rate in rates.items():  # rate sequences per second: one sequence's FLOPs in 1/rate seconds
        row[f"{name}_gflops"], row[f"{name}_of_peak"] = fraction_of_peak(flops_per_seq, 1 / rate,
                                                                         peaks[precision].gflops)
    return row


def measure_peaks(peaks: dict[str, Peak], config: BertConfig, tokens: int, precision: str, repeats: int) -> None:
    """Adds the fp32 peak and that of `precision` to `peaks` where missing, printed as measured."""
    for name in dict.fromkeys(["fp32", precision]):
        if name not in peaks:
            peaks[name] = gemm_peak(config, tokens, name, repeats)
            print(peak_line(peaks[name]), flush=True)


def onnx_row(phase: str, kind: str, precision: str) -> bool:
    """The rows --onnxruntime adds ORT to: fp32 inference on full windows."""
    return phase == "inference" and kind == "full" and precision == "fp32"


def parse_args(host: Host) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="base", help="base, large, or a bert_config.json / config.json path")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"],
                        help="default: bf16 where the CPU has it natively, else fp32")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="batches per round, each a step")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds over the batches (median reported)")
    parser.add_argument("--windows", nargs="+", default=["real", "full"], choices=["real", "full"])
    parser.add_argument("--phases", nargs="+", default=["training", "inference"], choices=["training", "inference"])
    parser.add_argument("--compile", action="store_true",
                        help="also time our model under torch.compile, for inference on full windows")
    parser.add_argument("--onnxruntime", action="store_true",
                        help="also time our model exported to ONNX and run on ONNX Runtime, for fp32 inference on "
                             "full windows (what inference.py --onnx_model runs)")
    parser.add_argument("--gemm_repeats", type=int, default=5, help="timed repeats of each GEMM of the peak")
    parser.add_argument("--squad_file", type=Path, default=SHARED / "squad" / "dev-v1.1.json")
    parser.add_argument("--vocab_file", type=Path, default=SHARED_VOCAB)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    args.precisions = pick_precisions(host, args.precision, ["bf16"])
    if args.onnxruntime and not any(onnx_row(phase, kind, precision) for phase in args.phases
                                    for kind in args.windows for precision in args.precisions):
        # said before the minutes of timing, not discovered in a table without the row
        parser.error(f"--onnxruntime times fp32 inference on full windows only; this run has precision "
                     f"{' '.join(args.precisions)}, phases {' '.join(args.phases)}, windows {' '.join(args.windows)} "
                     f"(add --precision fp32 --phases inference --windows full)")
    return args


def measure_row(config: BertConfig, args: argparse.Namespace, host: Host, kind: str, batches: list[Batch],
                filled: float, precision: str, phase: str, peaks: dict[str, Peak]) -> dict:
    """Times one (windows, precision, phase) row, printed; full-window inference rows also against the peak."""
    compiled = args.compile and phase == "inference" and kind == "full"  # real: a shape per batch
    onnx = args.onnxruntime and onnx_row(phase, kind, precision)
    row = {"windows": kind, "tokens_per_position": round(filled, 3), "phase": phase,
           "batch": args.batch, "seq": args.seq, "steps": args.steps, "rounds": args.rounds,
           "threads": torch.get_num_threads(), **host_record(host, precision)}
    with tempfile.TemporaryDirectory() as scratch:
        steps = build_steps(config, phase, compiled, Path(scratch) if onnx else None)
        rates = sequences_per_second(steps, batches, precision, args.warmup, args.rounds)
    row.update({f"{name}_seq_per_s": rate for name, rate in rates.items()})
    row.update({f"{name}_speedup": rate / rates["peer"] for name, rate in rates.items() if name != "peer"})
    row["speedup"] = row.pop("ours_speedup")  # the name earlier JSON files use
    print(f"{kind} windows ({filled:.0%} tokens), {phase} {precision}: {rates_line(rates)}", flush=True)
    if kind == "full" and phase == "inference":  # padding-free: both do forward_flops' GEMMs
        # measured here, in the conditions of the timed rows
        measure_peaks(peaks, config, args.batch * args.seq, precision, args.gemm_repeats)
        row.update(peak_fields(peaks, precision, forward_flops(config, 1, args.seq), rates))
        print(f"  {row['forward_gflop_per_seq']:.3g} GFLOP per sequence; of the {precision} GEMM peak "
              f"{row['gemm_peak_gflops']:.0f} GFLOP/s: " + ", ".join(
                  f"{LABELS[name]} {row[name + '_gflops']:.0f} GFLOP/s ({row[name + '_of_peak']:.0%})"
                  for name in rates), flush=True)
    return row


def main() -> None:
    host = detect("cpu")  # both models run on the CPU
    args = parse_args(host)
    presets = {"base": BertConfig(), "large": LARGE}
    config = presets.get(args.config) or BertConfig.from_json_file(args.config)
    print(f"{host_threads_line(host, ' and '.join(args.precisions))}; BERT {args.config}, batch {args.batch}, "
          f"seq {args.seq}")
    windows = real_windows(args.squad_file, args.vocab_file, args.seq) if "real" in args.windows else None
    results = []
    peaks: dict[str, Peak] = {}
    for kind in args.windows:
        batches = make_batches(kind, windows, config.vocab_size, args.batch, args.seq, args.steps)
        filled = sum(int(b[2].sum()) for b in batches) / sum(b[2].numel() for b in batches)
        for precision in args.precisions:
            for phase in args.phases:
                results.append(measure_row(config, args, host, kind, batches, filled, precision, phase, peaks))
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
