"""Memory per process of `--sharding fsdp` against DDP, and the step time, on a BERT-large-sized model (336 million
parameters) on this CPU (gloo) or on the GPUs (--device cuda, NCCL, one process a GPU): each process's bytes of
parameters, gradients and LAMB state (its local tensors, counted after a backward, before the optimizer clears the
gradients), its peak resident memory (on a GPU also torch.cuda.max_memory_allocated), and the middle step time of a
few steps, for each layout asked (`ddp:W` or `fsdp:W`, W processes). fsdp:1 shards over one process (nothing to
share: what FSDP's machinery itself costs), which run_pretraining.py never does.

    python -m benchmarks.fsdp_memory [--config bert_configs/large.json] [--layouts ddp:2 fsdp:2 fsdp:4]
        [--steps 3] [--batch 2] [--seq 128] [--device cpu] [--output benchmarks/results/fsdp_memory/DATE.json]

The training step is the recipe's own: the model as run_pretraining.py builds it, wrapped by `wrap_ddp` or
`shard_model`, BertPretrainingCriterion's loss, the LAMB with its global-norm clipping. The batch is
model_throughput's synthetic one (memory and time do not depend on the words). Each layout runs as its own
torchrun job, one thread a process.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, benchmark_command, masked_per_seq, middle, status_bytes, write_json

GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "bert_configs" / "large.json")
    p.add_argument("--layouts", nargs="+", default=["ddp:2", "fsdp:2", "fsdp:4"],
                   help="ddp:W or fsdp:W, each run on W processes")
    p.add_argument("--steps", type=int, default=3, help="timed steps after one untimed")
    p.add_argument("--batch", type=int, default=2, help="sequences a process a step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--output", type=Path, help="the JSON results (default: benchmarks/results/fsdp_memory/DATE.json)")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a rank of one layout: its JSON goes here
    p.add_argument("--sharding", default="ddp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for layout in args.layouts:
        kind, _, count = layout.partition(":")
        if kind not in ("ddp", "fsdp") or not count.isdigit() or int(count) < 1:
            p.error(f"--layouts {layout}: expected ddp:W or fsdp:W with W >= 1")
    return args


def local_bytes(tensors) -> int:
    from bertrecipe.training.optimization import local_part

    return sum(local_part(t).numel() * t.element_size() for t in tensors)


def worker(args: argparse.Namespace) -> None:
    """One rank: the model wrapped as asked, steps timed, this process's tensors counted; rank 0 writes all."""
    import torch
    import torch.distributed as dist

    from benchmarks.model_throughput import make_batch
    from bertrecipe.model.families import config_from_json_file, pretraining_model
    from bertrecipe.pretraining.data import BertPretrainingCriterion
    from bertrecipe.training.optimization import Lamb, global_grad_norm, weight_decay_groups
    from bertrecipe.training.process_group import all_gather_objects, init_distributed, shutdown
    from bertrecipe.training.sharding import shard_model
    from bertrecipe.training.stepper import wrap_ddp

    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    ctx = init_distributed(no_cuda=not cuda)
    if args.sharding == "fsdp" and not dist.is_initialized():  # fsdp:1: a group of one to shard over
        dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    config = config_from_json_file(args.config)
    model = pretraining_model(config).to(ctx.device)
    model = shard_model(model, ctx) if args.sharding == "fsdp" else wrap_ddp(model, ctx)
    optimizer = Lamb(weight_decay_groups(model, 0.01), lr=1e-4)
    ids, segments, mask, labels, next_sentence = make_batch(config, args.batch, args.seq, masked_per_seq(args.seq))
    batch = {"input_ids": ids, "segment_ids": segments, "input_mask": mask, "masked_lm_labels": labels,
             "next_sentence_labels": next_sentence}
    batch = {key: value.to(ctx.device) for key, value in batch.items()}
    criterion = BertPretrainingCriterion()
    times, counted = [], {}
    for step in range(args.steps + 1):
        start = time.perf_counter()
        criterion(model, batch).backward()
        if step == args.steps:  # the gradients are there until the optimizer clears them
            counted["gradients"] = local_bytes([p.grad for p in model.parameters() if p.grad is not None])
        optimizer.step(global_grad_norm=global_grad_norm(optimizer))
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - start)
    counted["parameters"] = local_bytes(list(model.parameters()))
    counted["optimizer_state"] = local_bytes([v for state in optimizer.state.values() for v in state.values()
                                              if torch.is_tensor(v)])
    mine = {**counted, "peak_resident": status_bytes("VmHWM"), "step_seconds": middle(times)}
    if cuda:
        mine["peak_allocated"] = torch.cuda.max_memory_allocated()
    everyone = all_gather_objects(mine, ctx)
    if ctx.is_main:
        write_json(args.worker, {"parameters_total": sum(p.numel() for p in model.parameters()),
                                 "ranks": everyone})
    shutdown(ctx)  # before the interpreter's exit, which would abort a gloo thread still holding work


def run_layout(args: argparse.Namespace, layout: str) -> dict:
    kind, _, count = layout.partition(":")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "rank_figures.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", count,
                   "-m", "benchmarks.fsdp_memory", "--worker", str(out), "--sharding", kind,
                   "--config", str(args.config), "--steps", str(args.steps), "--batch", str(args.batch),
                   "--seq", str(args.seq), "--device", args.device]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        run = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode:
            raise RuntimeError(f"{layout} failed (exit status {run.returncode}); its processes said:\n"
                               + "\n".join(line for line in run.stderr.splitlines() if not line.startswith("W1")))
        figures = json.loads(out.read_text())
    ranks = figures["ranks"]
    state = [r["parameters"] + r["gradients"] + r["optimizer_state"] for r in ranks]
    row = {"layout": layout, "processes": int(count), "parameters": figures["parameters_total"],
           "state_bytes_per_process_max": max(state),
           "peak_resident_bytes_max": max(r["peak_resident"] for r in ranks),
           "step_seconds_max": max(r["step_seconds"] for r in ranks), "ranks": ranks}
    if "peak_allocated" in ranks[0]:
        row["peak_allocated_bytes_max"] = max(r["peak_allocated"] for r in ranks)
    return row


def table(rows: list[dict]) -> str:
    on_gpu = any("peak_allocated_bytes_max" in row for row in rows)
    allocated = " peak allocated a process |" if on_gpu else ""
    lines = [f"| layout | parameters + gradients + LAMB state a process |{allocated} peak resident a process | step "
             "time |", "|---|---|---|---|" + ("---|" if on_gpu else "")]
    for row in rows:
        peak = f" {row['peak_allocated_bytes_max'] / GIB:.2f} GiB |" if on_gpu else ""
        lines.append(f"| {row['layout']} | {row['state_bytes_per_process_max'] / GIB:.2f} GiB |{peak} "
                     f"{row['peak_resident_bytes_max'] / GIB:.2f} GiB | {row['step_seconds_max']:.3g} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    from bertrecipe.common.hardware import detect, host_line

    rows = [run_layout(args, layout) for layout in args.layouts]
    print(table(rows))
    stamp = datetime.date.today().isoformat()
    command = ["python", *benchmark_command("fsdp_memory", *(argv or sys.argv[1:]))[1:]]
    output = args.output or REPO / "benchmarks" / "results" / "fsdp_memory" / f"{stamp}.json"
    host = host_line(detect(args.device), "fp32") + (", 1 thread a process" if args.device == "cpu" else "")
    write_json(output, {"host": host,
                        "config": str(args.config.relative_to(REPO) if args.config.is_relative_to(REPO)
                                      else args.config),
                        "batch_per_process": args.batch, "seq": args.seq, "steps": args.steps, "layouts": rows,
                        "command": " ".join(command)})
    print(f"written to {output}")


if __name__ == "__main__":
    main()
