"""Task distillation on SQuAD v1.1 (issue 49), each run a command of the repository with the flags printed:

    python -m benchmarks.distillation_squad --work_dir results/distillation_squad

The official SQuAD training set is not here, so the dev set's 48 articles are split in two: the first 24 train (as
train-v1.1.json), the other 24 are scored (as dev-v1.1.json). The teacher is the released MiniLM (6 layers, hidden
384; ../shared/data/minilm) fine-tuned with run_squad.py on the training half; the student takes the teacher's
layers 2, 4 and 6 (--student_layers: that many, evenly spaced) with its embeddings and span head (DistilBERT's
start) and is task-distilled with task_distill.py: the backbone stage (attention scores, hidden states), then the
heads stage (the teacher's start and end logits, soft cross-entropy). --student_start starts the student from a
checkpoint instead (for instance a general student of benchmarks.distillation_sst2; its span head starts at random),
its runs' folders and report named by --tag. With --aug_n, the stages in --aug_stages read data_augmentation.py's
copies of the training half's contexts or questions (--aug_part; from a masked-LM head trained for it as the SST-2
benchmark does), written once into a data folder of their own. With --baseline the same student is also fine-tuned
plainly for as many epochs as the stages together. Every figure is EM and F1 on the scored half; the report gives
the student's share of the teacher's F1 (goal >= 90 %; NVIDIA's 4-layer student keeps 93.8 %). Each stage's outputs
are reused when present, so an interrupted benchmark goes on where it stopped.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from benchmarks.common import SHARED
from benchmarks.distillation_sst2 import MINILM, augmentation_masked_lm, student_start
from benchmarks.finetune_accuracy import run
from bertrecipe.common.hardware import detect, host_line
from bertrecipe.model.weights import read_weights
from bertrecipe.training.metric_logger import read_log

TRAIN_ARTICLES = 24  # of dev-v1.1's 48


def common_flags(seq: int, bf16: bool) -> list[str]:
    return ["--do_lower_case", "--max_seq_length", str(seq), "--doc_stride", "128", "--train_batch_size", "32",
            "--disable_progress_bar", "--log_freq", "50", *(["--bf16"] if bf16 else [])]


def split_dev(work: Path) -> Path:
    """A folder with the first half of dev-v1.1's articles as train-v1.1.json and the rest as dev-v1.1.json."""
    folder = work / "data"
    if not (folder / "dev-v1.1.json").is_file():
        dev = json.loads((SHARED / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
        folder.mkdir(parents=True, exist_ok=True)
        for name, articles in (("train", dev["data"][:TRAIN_ARTICLES]), ("dev", dev["data"][TRAIN_ARTICLES:])):
            (folder / f"{name}-v1.1.json").write_text(json.dumps({"version": dev["version"], "data": articles}),
                                                       encoding="utf-8")
    return folder


def augmented(work: Path, data: Path, copies: int, part: str, mlm_steps: int) -> Path:
    """A data folder holding the split and data_augmentation.py's train-v1.1_aug.json: `copies` copies of each
    context (or question) of the training half."""
    folder = work / f"data_aug{copies}-{part}"
    if not (folder / "train-v1.1_aug.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("train-v1.1.json", "dev-v1.1.json"):
            shutil.copyfile(data / name, folder / name)
        run([sys.executable, "distillation/data_augmentation.py", "--pretrained_bert_model",
             str(augmentation_masked_lm(work, mlm_steps)), "--vocab_file", str(MINILM / "vocab.txt"),
             "--do_lower_case", "--glue_dir", str(folder), "--task_name", "SQuADv1.1", "--N", str(copies),
             "--squad_part", part, "--seed", "1", "--no_original_segment"])
    return folder


def scores(folder: Path) -> dict:
    final = read_log(folder / "dllogger.json")[-1]["data"]
    return {"exact_match": final["exact_match"], "F1": final["F1"], "train_minutes": final["e2e_train_time"] / 60}


def fine_tune(out: Path, data: Path, start: Path, epochs: float, rate: str, flags: list[str]) -> dict:
    if not (out / "dllogger.json").is_file() or "F1" not in read_log(out / "dllogger.json")[-1]["data"]:
        run([sys.executable, "run_squad.py", "--init_checkpoint", str(start), "--vocab_file",
             str(MINILM / "vocab.txt"), "--train_file", str(data / "train-v1.1.json"), "--predict_file",
             str(data / "dev-v1.1.json"), "--output_dir", str(out), "--do_train", "--do_predict", "--do_eval",
             "--predict_batch_size", "64", "--learning_rate", rate, "--num_train_epochs", str(epochs), "--seed",
             "42", "--json-summary", str(out / "dllogger.json"), *flags])
    return scores(out)


def distil(work: Path, data: Path, teacher_folder: Path, start: Path, epochs: dict, rates: dict,
           flags: list[str], stages: list[str], prefix: str, aug: dict[str, Path]) -> dict:
    """The stages in turn; a stage in `aug` reads that folder's augmented set (and its folder says so)."""
    student, name = start, f"{prefix}distilled"
    for stage in stages:
        if stage in aug:
            name += f"-{stage}-{aug[stage].name.removeprefix('data_')}"
        out = work / f"{name}_{stage}"
        if not (out / "dllogger.json").is_file() or "F1" not in read_log(out / "dllogger.json")[-1]["data"]:
            run([sys.executable, "distillation/task_distill.py", "--teacher_model", str(teacher_folder),
                 "--student_model", str(student), "--vocab_file", str(MINILM / "vocab.txt"), "--data_dir",
                 str(aug.get(stage, data)), *(["--aug_train"] if stage in aug else []), "--task_name",
                 "SQuADv1.1", "--output_dir", str(out), "--distill_config",
                 f"distillation/distillation_config_{stage}.json", "--learning_rate", rates[stage],
                 "--num_train_epochs", str(epochs[stage]), "--seed", "42", "--eval_batch_size", "64",
                 "--json-summary", str(out / "dllogger.json"), *flags])
        student = out
    return scores(student)


def student_label(start: Path, tag: str | None) -> str:
    """"<layers> layers" for the teacher's layers; "<layers> x <width>, <tag>" for a --student_start."""
    config = read_weights(start).config
    if not tag:
        return f"{config.num_hidden_layers} layers"
    return f"{config.num_hidden_layers} x {config.hidden_size}, {tag}"


def table(report: dict) -> str:
    teacher, student = report["teacher"], report["distilled"]
    label = report.get("student_label", "3 layers")
    lines = [f"SQuAD v1.1, dev articles {TRAIN_ARTICLES + 1}-48 scored (trained on 1-{TRAIN_ARTICLES}); "
             f"{report['settings']}; {report['host']}", "",
             "| model | EM | F1 | training minutes |", "|---|---|---|---|",
             f"| teacher (6 layers) | {teacher['exact_match']:.2f} | {teacher['F1']:.2f} | "
             f"{teacher['train_minutes']:.1f} |",
             f"| student ({label}), task-distilled | {student['exact_match']:.2f} | {student['F1']:.2f} | "
             f"{student['train_minutes']:.1f} (last stage) |"]
    if report.get("baseline"):
        plain = report["baseline"]
        lines.append(f"| student ({label}), fine-tuned | {plain['exact_match']:.2f} | {plain['F1']:.2f} | "
                     f"{plain['train_minutes']:.1f} |")
    lines += ["", f"distilled student: {100 * student['F1'] / teacher['F1']:.1f} % of the teacher's F1 "
              "(goal >= 90 %)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", type=Path, required=True)
    p.add_argument("--max_seq_length", type=int, default=256, help="256 holds most SQuAD paragraphs in one window")
    p.add_argument("--teacher_epochs", type=float, default=2.0)
    p.add_argument("--backbone_epochs", type=float, default=1.0)
    p.add_argument("--heads_epochs", type=float, default=1.0)
    p.add_argument("--backbone_learning_rate", default="1e-4")
    p.add_argument("--heads_learning_rate", default="5e-5")
    p.add_argument("--fp32", action="store_true", help="train in fp32 (default: bf16 autocast)")
    p.add_argument("--baseline", action="store_true", help="also fine-tune the student plainly")
    p.add_argument("--student_start", type=Path, help="a student checkpoint to start from (default: the "
                   "fine-tuned teacher's layers 2, 4 and 6)")
    p.add_argument("--tag", help="with --student_start: what its runs' folders and report are named by")
    p.add_argument("--student_layers", type=int, default=3,
                   help="without --student_start: how many of the teacher's layers the student takes")
    p.add_argument("--aug_n", type=int, default=0, help="augmented copies of each context or question (0: none)")
    p.add_argument("--aug_part", choices=("context", "question"), default="context",
                   help="what the copies vary (NVIDIA's: the context, answers kept)")
    p.add_argument("--aug_stages", nargs="+", choices=("backbone", "heads"), default=["backbone", "heads"],
                   help="--aug_n: the stages that read the augmented set")
    p.add_argument("--mlm_steps", type=int, default=200, help="--aug_n: the augmentation masked LM's steps")
    p.add_argument("--stages", nargs="+", choices=("backbone", "heads"), default=["backbone", "heads"],
                   help="the task-distillation stages, in order (NVIDIA's: both; heads alone: the logits only)")
    args = p.parse_args(argv)
    if bool(args.student_start) != bool(args.tag):
        p.error("--student_start and --tag go together")
    work = args.work_dir.resolve()
    flags = common_flags(args.max_seq_length, not args.fp32)
    data = split_dev(work)
    teacher_folder = work / "teacher"
    teacher = fine_tune(teacher_folder, data, MINILM, args.teacher_epochs, "1e-4", flags)
    if args.student_start:
        start, prefix = args.student_start.resolve(), f"{args.tag}_"
    elif args.student_layers == 3:  # the first benchmark's student, in its folders
        start, prefix = student_start(work, teacher_folder, 3), ""
    else:
        start = student_start(work / f"layers{args.student_layers}", teacher_folder, args.student_layers)
        prefix = f"layers{args.student_layers}_"
    epochs = {"backbone": args.backbone_epochs, "heads": args.heads_epochs}
    aug = {}
    if args.aug_n:
        folder = augmented(work, data, args.aug_n, args.aug_part, args.mlm_steps)
        aug = {stage: folder for stage in args.aug_stages}
    rates = {"backbone": args.backbone_learning_rate, "heads": args.heads_learning_rate}
    report = {"teacher": teacher,
              "distilled": distil(work, data, teacher_folder, start, epochs, rates, flags, args.stages, prefix,
                                  aug),
              "student_label": student_label(start, args.tag),
              "host": f"{host_line(detect(), 'fp32' if args.fp32 else 'bf16')}, date {time.strftime('%Y-%m-%d')}",
              "settings": f"seq {args.max_seq_length}, stride 128, batch 32, teacher {args.teacher_epochs:g} epochs "
                          f"lr 1e-4, student "
                          + " + ".join(f"{stage} {epochs[stage]:g} epochs at {rates[stage]}"
                                       f"{f' on {args.aug_n} {args.aug_part} copies' if stage in aug else ''}"
                                       for stage in args.stages)}
    if args.baseline:
        total = sum(epochs[stage] for stage in args.stages)
        report["baseline"] = fine_tune(work / f"{prefix}baseline", data, start, total, "1e-4", flags)
    (work / f"{prefix}report.json").write_text(json.dumps(report, indent=2) + "\n")
    (work / f"{prefix}report.md").write_text(table(report) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
