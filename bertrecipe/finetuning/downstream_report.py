"""run_downstream.py's tables: each task's configurations with the median and the spread (min and max) of their
seeds, the best configuration (the highest median of the task's score on dev) and its median as the task's score,
GLUE's average as the BERT paper computes it, and what the table was measured with: the checkpoint (its weights'
sha256), the vocab, the protocol and the hardware. Written as results.json and results.md."""
from __future__ import annotations

import json
import os
import shlex
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.hardware import cpu_model, read_cpuinfo
from bertrecipe.finetuning.downstream_plan import (
    GLUE_AVERAGE_EXCLUDES,
    GLUE_FOLDERS,
    Grid,
    GridOverrides,
    PlannedRun,
    Preset,
    Task,
)

SELECTION = ("each configuration (learning rate, epochs, batch size) is run once per seed; its median over the "
             "seeds is its value; the task's score is the highest median on the dev set (ties: the first in the "
             "grid), reported with the min and max of that configuration's seeds")


def hardware_record(gpus: int, workers: int, threads_per_run: Optional[int], precision: str) -> dict[str, Any]:
    """What the runs ran on: the GPUs' names (or none), the CPU, torch, the precision and how many ran at once."""
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    return {"gpus": names, "cpu": cpu_model(read_cpuinfo()), "cpu_cores": len(os.sched_getaffinity(0)),
            "torch": torch.__version__, "cuda": torch.version.cuda if gpus else None, "precision": precision,
            "concurrent_runs": workers, "threads_per_run": threads_per_run}


def seed_spread(values: Sequence[float]) -> dict[str, Any]:
    """The median, min and max of some seeds' values (None for each when there are none) and their count."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize_task(task: Task, runs: Sequence[PlannedRun], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A task's configurations (in grid order), each with its seeds' metrics and their spread, and the best one."""
    configs: dict[tuple[float, float, int], dict[str, Any]] = {}
    for run in runs:
        entry = configs.setdefault(run.config, {"learning_rate": run.learning_rate, "epochs": run.epochs,
                                                "batch_size": run.batch_size, "seeds": {}, "missing_seeds": []})
        record = records.get(run.label)
        if record is None:
            entry["missing_seeds"].append(run.seed)
        else:
            entry["seeds"][str(run.seed)] = record["metrics"]
    for entry in configs.values():
        entry["metrics"] = {metric.name: seed_spread([m[metric.name] for m in entry["seeds"].values()
                                                 if metric.name in m]) for metric in task.metrics}
    score_name = task.metrics[0].name
    ranked = [entry for entry in configs.values() if entry["metrics"][score_name]["n"]]
    best = max(ranked, key=lambda entry: entry["metrics"][score_name]["median"], default=None)
    return {"kind": task.kind, "folder": str(task.folder), "data_sha256": task.data_sha256, "metric": score_name,
            "score": best["metrics"][score_name]["median"] if best else None,
            "best": None if best is None else {k: best[k] for k in ("learning_rate", "epochs", "batch_size")},
            "complete": all(not entry["missing_seeds"] for entry in configs.values()),
            "configurations": list(configs.values())}


def glue_average(tasks: dict[str, dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The mean of the GLUE tasks' scores (WNLI left out, as in the BERT paper; MNLI counted once, by its matched
    accuracy), naming the tasks it averages; None without a GLUE task."""
    names = [name for name in GLUE_FOLDERS if name in tasks and name not in GLUE_AVERAGE_EXCLUDES]
    if not names:
        return None
    scores = [tasks[name]["score"] for name in names]
    known = [score for score in scores if score is not None]
    return {"score": statistics.fmean(known) if len(known) == len(scores) else None,
            "tasks": [GLUE_FOLDERS[name] for name in names],
            "excluded": [GLUE_FOLDERS[name] for name in GLUE_AVERAGE_EXCLUDES if name in tasks],
            "complete": all(tasks[name]["complete"] for name in names)}


def build_report(header: dict[str, Any], tasks: Sequence[Task], runs: Sequence[PlannedRun],
                 records: dict[str, dict[str, Any]], failed: Sequence[str]) -> dict[str, Any]:
    """results.json: the header (checkpoint, vocab, protocol, hardware, command), every task's summary, the GLUE
    average and the runs that failed in this call."""
    summaries = {task.name: summarize_task(task, [r for r in runs if r.task == task], records) for task in tasks}
    return {**header, "tasks": summaries, "glue_average": glue_average(summaries),
            "runs": {"planned": len(runs), "finished": sum(r.label in records for r in runs), "failed": list(failed),
                     "run_hours": sum(float(records[r.label].get("seconds", 0)) for r in runs
                                      if r.label in records) / 3600}}


def protocol_record(preset: Preset, grids: dict[str, Grid], max_steps: Optional[int] = None,
                    overrides: Optional[GridOverrides] = None) -> dict[str, Any]:
    """The preset, the grid fields this command's flags replaced, the grid each task actually ran (replacements
    applied) and --max_steps when runs were cut short."""
    replaced = {name: list(value) if isinstance(value, tuple) else value
                for name, value in (overrides.given() if overrides else {}).items()}
    return {"preset": preset.name, "source": preset.source, "selection": SELECTION, "max_steps": max_steps,
            "replaced": replaced,
            "grids": {name: {"learning_rates": list(g.learning_rates), "epochs": list(g.epochs),
                             "batch_sizes": list(g.batch_sizes), "seeds": list(g.seeds),
                             "max_seq_length": g.max_seq_length, "warmup_proportion": g.warmup_proportion}
                      for name, g in grids.items()}}


def replaced_text(replaced: Optional[dict[str, Any]]) -> str:
    """'; **replaced by this command: seeds 1, 2, 3**' for the grid fields a command's flags replaced."""
    if not replaced:
        return ""
    values = ", ".join(f"{name} {', '.join(f'{v:g}' for v in value) if isinstance(value, list) else value}"
                       for name, value in replaced.items())
    return f"; **replaced by this command: {values}** (each task's grid below is what ran)"


def task_title(name: str) -> str:
    """The task's name as papers print it: GLUE's folder names, `SQuAD v1.1`."""
    return GLUE_FOLDERS.get(name) or name.replace("squad-v", "SQuAD v")


def number(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def configuration_text(config: Optional[dict[str, Any]]) -> str:
    if config is None:
        return "-"
    return f"lr {config['learning_rate']:g}, {config['epochs']:g} ep, batch {config['batch_size']}"


def markdown(report: dict[str, Any]) -> str:
    """results.md: what was measured and how, the scores, then every configuration."""
    lines = header_lines(report) + ["", "## Scores", "",
                                    "| task | metric | score (median) | seeds (min - max) | best configuration | "
                                    "other metrics (median) |", "|---|---|---|---|---|---|"]
    for name, task in report["tasks"].items():
        best = next((c for c in task["configurations"] if task["best"] and all(
            c[k] == task["best"][k] for k in task["best"])), None)
        score = best["metrics"][task["metric"]] if best else seed_spread([])
        others = ", ".join(f"{m} {number(s['median'])}" for m, s in (best["metrics"] if best else {}).items()
                           if m != task["metric"])
        flag = "" if task["complete"] else " (incomplete)"
        lines.append(f"| {task_title(name)}{flag} | {task['metric']} | {number(task['score'])} | n={score['n']}, "
                     f"{number(score['min'])} - {number(score['max'])} | {configuration_text(task['best'])} | "
                     f"{others or '-'} |")
    average = report["glue_average"]
    if average is not None:
        excluded = f"; {', '.join(average['excluded'])} excluded" if average["excluded"] else ""
        flag = "" if average["complete"] else ", incomplete"
        lines.append(f"| **GLUE average** ({', '.join(average['tasks'])}{excluded}{flag}) | | "
                     f"**{number(average['score'])}** | | | |")
    return "\n".join(lines + configuration_lines(report)) + "\n"


def header_lines(report: dict[str, Any]) -> list[str]:
    checkpoint, vocab, protocol, hardware = (report[k] for k in ("checkpoint", "vocab", "protocol", "hardware"))
    device = (f"{len(hardware['gpus'])} GPU(s): {', '.join(dict.fromkeys(hardware['gpus']))}" if hardware["gpus"]
              else f"CPU: {hardware['cpu']}, {hardware['cpu_cores']} cores")
    runs = report["runs"]
    return [f"# Downstream scores of {checkpoint['path']}", "",
            f"- checkpoint: `{checkpoint['path']}` (weights {checkpoint['weights_file']}, sha256 "
            f"`{checkpoint['sha256']}`)",
            f"- vocab: `{vocab['path']}` ({vocab['kind']}, {vocab['size']:,} tokens, sha256 `{vocab['sha256']}`), "
            f"--do_lower_case {'on' if vocab['do_lower_case'] else 'off'}",
            f"- protocol: preset `{protocol['preset']}`: {protocol['source']}"
            + replaced_text(protocol.get("replaced"))
            + (f"; **every run stopped after {protocol['max_steps']} steps (--max_steps): not the preset's "
               "protocol**" if protocol.get("max_steps") else ""),
            f"- selection: {protocol['selection']}",
            f"- hardware: {device}; torch {hardware['torch']}; precision {hardware['precision']}; "
            f"{hardware['concurrent_runs']} run(s) at a time",
            f"- runs: {runs['finished']} of {runs['planned']} finished ({runs['run_hours']:.2f} hours of runs, summed)"
            + (f"; failed in this call: {', '.join(runs['failed'])}" if runs["failed"] else ""),
            f"- command: `{shlex.join(str(part) for part in report.get('command', []))}`",
            "- metrics are percentages on each task's dev set; MRPC and QQP are scored by F1, STS-B by Spearman, "
            "CoLA by Matthews correlation, MNLI by matched accuracy, SQuAD by F1 (v2.0: at the null-answer threshold "
            "best on dev, as the BERT paper), retrieval by nDCG@10"]


def configuration_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "## Every configuration"]
    for name, task in report["tasks"].items():
        grid = report["protocol"]["grids"][name]
        lines += ["", f"### {task_title(name)} ({task['metric']}; seeds {', '.join(map(str, grid['seeds']))}, "
                      f"max_seq_length {grid['max_seq_length']})", "",
                  "| learning rate | epochs | batch | seeds done | median | min | max | missing seeds |",
                  "|---|---|---|---|---|---|---|---|"]
        for config in task["configurations"]:
            s = config["metrics"][task["metric"]]
            missing = ", ".join(map(str, config["missing_seeds"])) or "-"
            lines.append(f"| {config['learning_rate']:g} | {config['epochs']:g} | {config['batch_size']} | {s['n']} | "
                         f"{number(s['median'])} | {number(s['min'])} | {number(s['max'])} | {missing} |")
    return lines


def write_report(output_dir: Path, report: dict[str, Any]) -> None:
    """results.json and results.md, each written whole."""
    text = json.dumps(report, indent=1) + "\n"
    write_atomic(output_dir / "results.json", lambda f: f.write(text.encode("utf-8")))
    table = markdown(report)
    write_atomic(output_dir / "results.md", lambda f: f.write(table.encode("utf-8")))
