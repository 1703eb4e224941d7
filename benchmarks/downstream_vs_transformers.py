"""The suite's GLUE table for a real pretrained checkpoint against transformers' fine-tuning of the same weights on
the same grid (issue "judge a checkpoint", item 3):

    flock /tmp/bert-bench.lock python -m benchmarks.downstream_vs_transformers [--tasks mrpc sts-b]
        [--train_rows 400] [--dev_rows 300] [--learning_rates 1e-4 5e-5] [--seeds 1 2 3] [--epochs 2]
        [--batch 16] [--seq 64] [--processes 2] [--model ../shared/data/minilm] [--output PREFIX]

The data: the first --train_rows of each task's real train.tsv and --dev_rows of its dev.tsv (../shared/data/glue),
copied with their header into a scratch folder. Ours: run_downstream.py on that folder (its cpu_tiny preset with
the grid given here, one thread a run, --processes runs at a time). The peer: for each task, learning rate and
seed, a process of its own that fine-tunes transformers' AutoModelForSequenceClassification of the same folder with
the options our run_glue.py uses (AdamW, betas 0.9/0.999, eps 1e-6, weight decay 0.01 except biases and LayerNorm
weights, a linear warm-up over 10 % of the steps then a linear decay to 0, no gradient clipping, dropout as the
config says, inputs padded to --seq, each epoch shuffled by the seed), the same process count and one thread a
process, and scores the dev rows with metrics written here in plain Python (accuracy, F1 of class 1, Pearson,
Spearman with ties ranked by their mean). Both tables give, per task and learning rate, the median and min-max of
the seeds; a task's score is its best learning rate's median. They agree where the two scores differ by no more
than the larger of the two best configurations' seed spreads (max - min). The table goes to stdout and PREFIX.txt,
every figure to PREFIX.json (default benchmarks/results/downstream_vs_transformers/<date>)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import REPO, SHARED

MODEL = SHARED / "minilm"
GLUE_DATA = SHARED / "glue"
RESULTS = REPO / "benchmarks" / "results" / "downstream_vs_transformers"
# task -> (folder, first text column, second text column or None, label column, labels or None for regression,
# the score's metric and the other one reported, as run_downstream names them).
TASKS = {
    "mrpc": ("MRPC", 3, 4, 0, ("0", "1"), ("F1", "acc")),
    "sts-b": ("STS-B", 7, 8, -1, None, ("Spearman", "Pearson")),
    "rte": ("RTE", 1, 2, 3, ("entailment", "not_entailment"), ("acc", None)),
    "sst-2": ("SST-2", 0, None, 1, ("0", "1"), ("acc", None)),
}


def excerpt(task: str, rows: int, source: Path, target: Path) -> None:
    """The header and the first `rows` rows of a GLUE TSV (read as bytes: its quoting and BOM stay as they are)."""
    lines = source.read_bytes().splitlines(keepends=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"".join(lines[:rows + 1]))


def make_data(tasks: list[str], train_rows: int, dev_rows: int, root: Path) -> Path:
    for task in tasks:
        folder = TASKS[task][0]
        excerpt(task, train_rows, GLUE_DATA / folder / "train.tsv", root / folder / "train.tsv")
        excerpt(task, dev_rows, GLUE_DATA / folder / "dev.tsv", root / folder / "dev.tsv")
    return root


# --- ours -----------------------------------------------------------------------------------------------------------

def run_ours(args: argparse.Namespace, data: Path, out: Path) -> dict:
    command = [sys.executable, str(REPO / "run_downstream.py"), "--init_checkpoint", str(args.model),
               "--data_dir", str(data), "--output_dir", str(out), "--tasks", ",".join(args.tasks),
               "--preset", "cpu_tiny", "--learning_rates", ",".join(map(str, args.learning_rates)),
               "--seeds", ",".join(map(str, args.seeds)), "--epochs", str(args.epochs),
               "--train_batch_size", str(args.batch), "--max_seq_length", str(args.seq),
               "--workers", str(args.processes), "--do_lower_case"]
    print("$ " + " ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    report = json.loads((out / "results.json").read_text(encoding="utf-8"))
    table = {}
    for task in args.tasks:
        metric = TASKS[task][5][0]
        table[task] = {str(config["learning_rate"]): [config["seeds"][str(seed)][metric] for seed in args.seeds]
                       for config in report["tasks"][task]["configurations"]}
    return {"seconds": time.perf_counter() - started, "table": table, "command": command}


# --- the peer: transformers, one process a run ----------------------------------------------------------------------

def read_rows(path: Path, task: str) -> tuple[list[tuple[str, ...]], list[str]]:
    _, first, second, label, _, _ = TASKS[task]
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8-sig").splitlines()[1:] if line]
    texts = [(row[first],) if second is None else (row[first], row[second]) for row in rows]
    return texts, [row[label] for row in rows]


def peer_run(task: str, data: Path, model_dir: Path, lr: float, seed: int, epochs: float, batch: int, seq: int
             ) -> dict:
    """One fine-tuning of the peer and its dev metrics (fractions)."""
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.set_seed(seed)
    labels = TASKS[task][4]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=1 if labels is None else len(labels))

    def encode(split: str):
        texts, raw = read_rows(data / TASKS[task][0] / f"{split}.tsv", task)
        enc = tokenizer(*zip(*texts, strict=True), padding="max_length", truncation=True, max_length=seq,
                        return_tensors="pt")
        target = (torch.tensor([float(x) for x in raw]) if labels is None
                  else torch.tensor([labels.index(x) for x in raw]))
        return enc, target

    train, train_labels = encode("train")
    steps = int(-(-len(train_labels) // batch) * epochs)
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.999), eps=1e-6)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    done = 0
    while done < steps:
        for index in torch.randperm(len(train_labels), generator=generator).split(batch):
            if done == steps:
                break
            out = model(**{k: v[index] for k, v in train.items()}, labels=train_labels[index])
            out.loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            done += 1
    dev, dev_labels = encode("dev")
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(**{k: v[i:i + 64] for k, v in dev.items()}).logits
                            for i in range(0, len(dev_labels), 64)])
    if labels is None:
        return correlations(logits[:, 0].tolist(), dev_labels.tolist())
    return classification(logits.argmax(-1).tolist(), dev_labels.tolist())


def classification(predicted: list[int], gold: list[int]) -> dict:
    right = sum(p == g for p, g in zip(predicted, gold, strict=True))
    tp = sum(p == g == 1 for p, g in zip(predicted, gold, strict=True))
    fp = sum(p == 1 and g == 0 for p, g in zip(predicted, gold, strict=True))
    fn = sum(p == 0 and g == 1 for p, g in zip(predicted, gold, strict=True))
    return {"acc": right / len(gold), "F1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0}


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def pearson(x: list[float], y: list[float]) -> float:
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5


def correlations(predicted: list[float], gold: list[float]) -> dict:
    return {"Pearson": pearson(predicted, gold), "Spearman": pearson(ranks(predicted), ranks(gold))}


def run_peer(args: argparse.Namespace, data: Path) -> dict:
    jobs = [(task, lr, seed) for task in args.tasks for lr in args.learning_rates for seed in args.seeds]
    started = time.perf_counter()

    def one(job):
        task, lr, seed = job
        command = [sys.executable, "-m", "benchmarks.downstream_vs_transformers", "--child", task, str(lr), str(seed),
                   "--data", str(data), "--model", str(args.model), "--epochs", str(args.epochs),
                   "--batch", str(args.batch), "--seq", str(args.seq)]
        done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error",
                                   "HF_HUB_OFFLINE": "1"})
        print(f"peer {task} lr {lr} seed {seed}: {done.stdout.strip()}", flush=True)
        return job, json.loads(done.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(args.processes) as pool:
        results = dict(pool.map(one, jobs))
    table = {task: {str(lr): [100 * results[(task, lr, seed)][TASKS[task][5][0]] for seed in args.seeds]
                    for lr in args.learning_rates} for task in args.tasks}
    return {"seconds": time.perf_counter() - started, "table": table}


# --- the comparison -------------------------------------------------------------------------------------------------

def best(table: dict[str, list[float]]) -> tuple[str, float, float]:
    """(learning rate, median, spread) of the configuration with the highest median."""
    lr = max(table, key=lambda key: statistics.median(table[key]))
    return lr, statistics.median(table[lr]), max(table[lr]) - min(table[lr])


def report(args: argparse.Namespace, ours: dict, peer: dict) -> tuple[str, dict]:
    lines = ["| task (score) | learning rate | ours: median (min-max) | transformers: median (min-max) |",
             "|---|---|---|---|"]
    verdicts = {}
    for task in args.tasks:
        metric = TASKS[task][5][0]
        for lr in map(str, args.learning_rates):
            a, b = ours["table"][task][lr], peer["table"][task][lr]
            lines.append(f"| {TASKS[task][0]} ({metric}) | {lr} | {statistics.median(a):.2f} ({min(a):.2f}-"
                         f"{max(a):.2f}) | {statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) |")
        (lr_a, score_a, spread_a), (lr_b, score_b, spread_b) = best(ours["table"][task]), best(peer["table"][task])
        verdicts[task] = {"ours": score_a, "peer": score_b, "ours_lr": lr_a, "peer_lr": lr_b,
                          "difference": score_a - score_b, "allowed": max(spread_a, spread_b),
                          "agree": abs(score_a - score_b) <= max(spread_a, spread_b)}
    averages = {side: statistics.fmean(verdicts[t][side] for t in args.tasks) for side in ("ours", "peer")}
    lines.append("")
    for task, v in verdicts.items():
        lines.append(f"{TASKS[task][0]}: ours {v['ours']:.2f} (lr {v['ours_lr']}), transformers {v['peer']:.2f} "
                     f"(lr {v['peer_lr']}), difference {v['difference']:+.2f}, seeds' spread {v['allowed']:.2f}: "
                     f"{'agree' if v['agree'] else 'DISAGREE'}")
    lines.append(f"average of the tasks' scores: ours {averages['ours']:.2f}, transformers {averages['peer']:.2f}; "
                 f"wall: ours {ours['seconds']:.0f} s, transformers {peer['seconds']:.0f} s")
    return "\n".join(lines), {"verdicts": verdicts, "averages": averages}


def header(args: argparse.Namespace) -> str:
    import transformers

    from bertrecipe.common.hardware import detect, host_line

    return (f"{host_line(detect(), 'fp32')}; {os.cpu_count()} cores; transformers {transformers.__version__}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
            f"model {args.model}; tasks {', '.join(args.tasks)}: the first {args.train_rows} train rows, "
            f"{args.dev_rows} dev rows; learning rates {args.learning_rates}, seeds {args.seeds}, {args.epochs:g} "
            f"epoch(s), batch {args.batch}, seq {args.seq}, warm-up 10 %; {args.processes} runs at a time, one "
            "thread each, on both sides")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.downstream_vs_transformers",
                                description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["mrpc", "sts-b"])
    p.add_argument("--train_rows", type=int, default=400)
    p.add_argument("--dev_rows", type=int, default=300)
    p.add_argument("--learning_rates", type=float, nargs="+", default=[1e-4, 5e-5])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--output", type=Path)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        task, lr, seed = args.child
        print(json.dumps(peer_run(task, args.data, args.model, float(lr), int(seed), args.epochs, args.batch,
                                  args.seq)))
        return
    with tempfile.TemporaryDirectory(prefix="downstream_vs_transformers_") as scratch:
        data = make_data(args.tasks, args.train_rows, args.dev_rows, Path(scratch) / "glue")
        ours = run_ours(args, data, Path(scratch) / "ours")
        peer = run_peer(args, data)
    table, figures = report(args, ours, peer)
    text = f"{header(args)}\n\n{table}"
    print(text)
    output = args.output or RESULTS / time.strftime("%Y-%m-%d", time.gmtime())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    output.with_suffix(".json").write_text(json.dumps({"ours": ours, "peer": peer, **figures}, indent=1) + "\n",
                                           encoding="utf-8")


if __name__ == "__main__":
    main()
