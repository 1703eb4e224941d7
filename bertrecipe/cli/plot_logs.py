"""Draws loss, learning-rate, throughput and evaluation curves from dllogger JSON logs (pre-training or
fine-tuning) to a PNG.

    python scripts/plot_logs.py results/dllogger_phase1.json results/dllogger_phase2.json -o curves.png

One panel each, against the global step each log records: the loss (`average_loss` and `step_loss`, else
`loss`/`train_loss`), the learning rate, the training throughput (sequences/s of all processes, from the
per-step `training_sequences_per_second` that run_pretraining.py and the fine-tuning loop write; logs without
it, e.g. NVIDIA's own, are drawn without that curve and the panel is left out when no log has it) and, when a
log has them, `eval_loss`/`eval_mlm_accuracy`. Where logs follow each other (phase 1, phase 2) the boundary is
marked on every panel. The final summaries' throughputs are written in the title.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.training.metric_logger import read_log

LOSS_KEYS = ("average_loss", "step_loss", "loss", "train_loss")
THROUGHPUT_KEY = "training_sequences_per_second"
EVAL_KEYS = ("eval_loss", "eval_mlm_accuracy")


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


def figure(paths: list[Path]):
    """The matplotlib Figure of the logs, one panel (Axes) per quantity, top to bottom: "loss", "learning rate",
    "sequences/s" (when a log has per-step throughput), "evaluation" (when a log has evaluation records)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [(p, series(p)) for p in paths]
    labels = ["loss", "learning rate"]
    if any(THROUGHPUT_KEY in data for _, data in logs):
        labels.append("sequences/s")
    if any(key in data for _, data in logs for key in EVAL_KEYS):
        labels.append("evaluation")
    fig, axes = plt.subplots(len(labels), 1, figsize=(9, 3.2 * len(labels)), sharex=True, squeeze=False)
    panel = dict(zip(labels, axes[:, 0], strict=True))

    def draw(axis_label: str, key: str, data: dict, **style) -> None:
        if axis_label in panel and key in data:
            steps, values = zip(*data[key], strict=True)
            panel[axis_label].plot(steps, values, **style)

    for index, (path, data) in enumerate(logs):
        label = path.stem
        for key in LOSS_KEYS[:2] if "average_loss" in data else LOSS_KEYS:
            draw("loss", key, data, label=f"{label} {key}", alpha=0.9 if key == "average_loss" else 0.4)
        draw("learning rate", "learning_rate", data, label=label)
        draw("sequences/s", THROUGHPUT_KEY, data, label=label)
        for key in EVAL_KEYS:
            draw("evaluation", key, data, marker="o", label=f"{label} {key}")
        if index > 0:  # the boundary between consecutive logs (phases)
            first = min(step for values in data.values() for step, _ in values)
            for axis in panel.values():
                axis.axvline(first, color="grey", linestyle="--", linewidth=1)
            panel["loss"].annotate(f"{label} starts", (first, 0.95), xycoords=("data", "axes fraction"),
                                   fontsize=8)
    for axis_label, axis in panel.items():
        axis.set_ylabel(axis_label)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    if "sequences/s" in panel:
        panel["sequences/s"].set_ylim(bottom=0)
    axes[-1, 0].set_xlabel("global step")
    summaries = [final_summary(p) for p in paths]
    speeds = [f"{s[THROUGHPUT_KEY]:.1f}" for s in summaries if THROUGHPUT_KEY in s]
    fig.suptitle("training curves" + (f" (final sequences/s: {', '.join(speeds)})" if speeds else ""))
    fig.tight_layout()
    return fig


def plot(paths: list[Path], output: Path) -> Path:
    """Writes figure(paths) to output (a PNG, through a temporary file and a rename)."""
    import matplotlib.pyplot as plt

    fig = figure(paths)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(output, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path, help="dllogger JSON-lines files, in phase order")
    parser.add_argument("-o", "--output", type=Path, default=Path("training_curves.png"))
    args = parser.parse_args(argv)
    for path in args.logs:
        if not path.is_file():
            raise InputError(f"{path}: no such log file")
    print(plot(args.logs, args.output))


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
