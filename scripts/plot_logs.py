#!/usr/bin/env python3
"""Draws loss, learning-rate and evaluation curves from dllogger JSON logs (pre-training or fine-tuning).

    python scripts/plot_logs.py results/dllogger_phase1.json results/dllogger_phase2.json -o curves.png

Each log is drawn against the global step it records; where logs follow each other (phase 1, phase 2) the
boundary is marked. Throughput and other final figures are written in the title.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import InputError, run_cli  # noqa: E402
from metric_logger import read_log  # noqa: E402

LOSS_KEYS = ("average_loss", "step_loss", "loss", "train_loss")


def series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(global_step, value)] of every per-step LOG record in the file."""
    try:
        records = read_log(path)
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: not a readable dllogger log ({error})") from None
    found: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        step = record.get("step")
        if record.get("type") != "LOG" or not isinstance(step, list) or not step:
            continue
        for key, value in record["data"].items():
            if isinstance(value, (int, float)):
                found.setdefault(key, []).append((int(step[-1]), float(value)))
    if not found:
        raise InputError(f"{path}: holds no per-step records")
    return found


def final_summary(path: Path) -> dict[str, float]:
    for record in reversed(read_log(path)):
        if record.get("type") == "LOG" and record.get("step") == []:
            return {k: v for k, v in record["data"].items() if isinstance(v, (int, float))}
    return {}


def plot(paths: list[Path], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [(p, series(p)) for p in paths]
    has_eval = any("eval_mlm_accuracy" in s or "eval_loss" in s for _, s in logs)
    panels = 3 if has_eval else 2
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.2 * panels), sharex=True)
    for index, (path, data) in enumerate(logs):
        label = path.stem
        for key in LOSS_KEYS[:2] if "average_loss" in data else LOSS_KEYS:
            if key in data:
                steps, values = zip(*data[key])
                axes[0].plot(steps, values, label=f"{label} {key}", alpha=0.9 if key == "average_loss" else 0.4)
        if "learning_rate" in data:
            steps, values = zip(*data["learning_rate"])
            axes[1].plot(steps, values, label=label)
        if has_eval:
            for key in ("eval_loss", "eval_mlm_accuracy"):
                if key in data:
                    steps, values = zip(*data[key])
                    axes[2].plot(steps, values, marker="o", label=f"{label} {key}")
        if index > 0:  # the boundary between consecutive logs (phases)
            first = min(step for values in data.values() for step, _ in values)
            for axis in axes:
                axis.axvline(first, color="grey", linestyle="--", linewidth=1)
            axes[0].annotate(f"{label} starts", (first, 0.95), xycoords=("data", "axes fraction"), fontsize=8)
    axes[0].set_ylabel("loss")
    axes[1].set_ylabel("learning rate")
    if has_eval:
        axes[2].set_ylabel("evaluation")
    axes[-1].set_xlabel("global step")
    for axis in axes:
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    summaries = [final_summary(p) for p in paths]
    speeds = [f"{s['training_sequences_per_second']:.1f}" for s in summaries if "training_sequences_per_second" in s]
    fig.suptitle("training curves" + (f" (sequences/s: {', '.join(speeds)})" if speeds else ""))
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp.png")
    fig.savefig(temporary, dpi=110)
    plt.close(fig)
    temporary.replace(output)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path, help="dllogger JSON-lines files, in phase order")
    parser.add_argument("-o", "--output", type=Path, default=Path("training_curves.png"))
    args = parser.parse_args(argv)
    for path in args.logs:
        if not path.is_file():
            raise InputError(f"{path}: no such log file")
    print(plot(args.logs, args.output))


if __name__ == "__main__":
    run_cli(main)
