"""Downstream accuracy of a small pretrained BERT (default: ../shared/data/minilm) fine-tuned with run_glue.py and
run_squad.py, one command for the whole table:

    python -m benchmarks.finetune_accuracy                          # squad mrpc sst-2 cola rte sts-b
    python -m benchmarks.finetune_accuracy --tasks mrpc rte         # a subset

GLUE tasks train on the full train.tsv and are scored on dev.tsv. The official SQuAD train set is not available
here, so SQuAD v1.1 trains on the first 40 of the 48 dev-v1.1 articles and is scored on the other 8. Every run is
a subprocess with the exact flags printed, so each figure can be reproduced on its own. The runs are fp32 unless
--extra passes --bf16 or --fp16; the table names the device, precision and torch version.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, SHARED
from bertrecipe.common.hardware import detect, host_line, recipe_device, warn_if_emulated
from bertrecipe.training.metric_logger import read_log

# Task -> (folder, flags, metrics to report). Small model: a higher learning rate than BERT-large's.
GLUE = {
    "mrpc": ("MRPC", ["--num_train_epochs", "3", "--learning_rate", "1e-4"], ["eval_acc", "eval_f1"]),
    "sst-2": ("SST-2", ["--num_train_epochs", "1", "--learning_rate", "5e-5"], ["eval_acc"]),
    "cola": ("CoLA", ["--num_train_epochs", "3", "--learning_rate", "1e-4"], ["eval_mcc"]),
    "rte": ("RTE", ["--num_train_epochs", "3", "--learning_rate", "1e-4"], ["eval_acc"]),
    "sts-b": ("STS-B", ["--num_train_epochs", "3", "--learning_rate", "1e-4"], ["eval_pearson", "eval_spearmanr"]),
}
COMMON = ["--do_lower_case", "--train_batch_size", "32", "--warmup_proportion", "0.1", "--seed", "42",
          "--disable_progress_bar", "--log_freq", "100"]


def run(cmd: list[str]) -> float:
    print("$ " + " ".join(cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, check=True, cwd=REPO)
    return time.time() - start


def glue_task(task: str, data: Path, model: Path, out: Path, extra: list[str]) -> dict:
    folder, flags, metrics = GLUE[task]
    cmd = [sys.executable, "run_glue.py", "--task_name", task, "--data_dir", str(data / "glue" / folder),
           "--init_checkpoint", str(model), "--vocab_file", str(model / "vocab.txt"), "--output_dir", str(out),
           "--do_train", "--do_eval", "--max_seq_length", "128", "--eval_batch_size", "64", *COMMON, *flags, *extra]
    minutes = run(cmd) / 60
    results = json.loads((out / "results.json").read_text())
    scores = ", ".join(f"{m.removeprefix('eval_')} {100 * results[m]:.2f}" for m in metrics)
    settings = " ".join(flags[i].removeprefix("--") + "=" + flags[i + 1] for i in range(0, len(flags), 2))
    return {"task": task, "scores": scores, "settings": " ".join([f"seq 128, batch 32, {settings}", *extra]),
            "minutes": minutes}


def squad_split(dev_file: Path, out: Path, train_articles: int = 40) -> tuple[Path, Path]:
    data = json.loads(dev_file.read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, articles in (("train", data["data"][:train_articles]), ("eval", data["data"][train_articles:])):
        path = out / f"squad_{name}.json"
        path.write_text(json.dumps({"version": data["version"], "data": articles}), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def squad_task(data: Path, model: Path, out: Path, extra: list[str]) -> dict:
    train, evaluate = squad_split(data / "squad" / "dev-v1.1.json", out)
    # One epoch: about half an hour with --bf16 on 2 CPU cores (two took over an hour).
    flags = ["--num_train_epochs", "1", "--learning_rate", "1e-4", "--max_seq_length", "384", "--doc_stride", "128"]
    cmd = [sys.executable, "run_squad.py", "--init_checkpoint", str(model), "--vocab_file", str(model / "vocab.txt"),
           "--train_file", str(train), "--predict_file", str(evaluate), "--output_dir", str(out), "--do_train",
           "--do_predict", "--do_eval", "--predict_batch_size", "32", "--json-summary", str(out / "dllogger.json"),
           *COMMON, *flags, *extra]
    minutes = run(cmd) / 60
    final = read_log(out / "dllogger.json")[-1]["data"]
    settings = " ".join(flags[i].removeprefix("--") + "=" + flags[i + 1] for i in range(0, len(flags), 2))
    return {"task": "squad-v1.1 (dev 40/8 articles)", "scores": f"EM {final['exact_match']:.2f}, F1 {final['F1']:.2f}",
            "settings": " ".join([f"batch 32, {settings}", *extra]), "minutes": minutes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["squad", *GLUE], choices=["squad", *GLUE])
    parser.add_argument("--data", type=Path, default=SHARED, help="the shared data folder")
    parser.add_argument("--model", type=Path, help="a Hugging Face BERT directory (default: <data>/minilm)")
    parser.add_argument("--output_dir", type=Path, default=REPO / "results" / "finetune_accuracy")
    parser.add_argument("--extra", default="", help="more flags for every run, e.g. '--bf16'")
    args = parser.parse_args()
    model = args.model or args.data / "minilm"
    extra = args.extra.split()
    host = detect(recipe_device())  # run_glue.py and run_squad.py train on the GPU when there is one
    precision = next((flag[2:] for flag in extra if flag in ("--bf16", "--fp16")), "fp32")
    warn_if_emulated(host, [precision])
    print(host_line(host, precision), flush=True)
    rows = []
    for task in args.tasks:
        out = args.output_dir / task
        if task == "squad":
            rows.append(squad_task(args.data, model, out, extra))
        else:
            rows.append(glue_task(task, args.data, model, out, extra))
    print(f"\n{host_line(host, precision)}; model: {model}, torch threads: "
          f"{os.environ.get('OMP_NUM_THREADS', 'default')}")
    print("| task | score | settings | minutes |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['task']} | {row['scores']} | {row['settings']} | {row['minutes']:.1f} |")


if __name__ == "__main__":
    main()
