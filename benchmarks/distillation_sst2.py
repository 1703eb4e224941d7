"""Task distillation on SST-2 against plain fine-tuning of the same student (issue 49), each run a command of the
repository with the flags printed:

    python -m benchmarks.distillation_sst2 --work_dir results/distillation_sst2 --seeds 1 2 3

The teacher is the released MiniLM (6 layers, hidden 384; ../shared/data/minilm) fine-tuned with run_glue.py on
SST-2's training set (all of it unless --train_rows). The student (--student) either takes the teacher's layers 2, 4
and 6 with its embeddings and classifier (`layers`: DistilBERT's start), or is a 4-layer, 192-wide model generally
distilled from the released MiniLM with general_distill.py on shards of the shared books (`general`: TinyBERT's
first stage, --general_steps steps, from random weights or, with --general_init teacher, from the teacher's layers
cut to the student's widths; its classifier starts at random); per seed it is
  - fine-tuned on the same rows with run_glue.py for the same number of epochs as the two stages below together
    (the baseline), and
  - task-distilled with task_distill.py: the backbone stage (states: attention scores, hidden states, value
    relations), then the heads stage (the teacher's logits, soft cross-entropy), --aug_train when --aug_n > 0
    (data_augmentation.py's set, from a masked-LM head trained here for the augmentation alone, as
    run_e2e_distillation.sh does; --aug_stages says which stages read it). --heads_learning_rate, --heads_epochs
    and --baseline_epochs change the heads stage and the baseline; a stage or baseline run with settings other
    than the defaults gets a folder (and the report a file) named by them.
Every figure is SST-2 dev accuracy (872 sentences); the table has each seed's, the medians, the student's share of
the teacher's and its distance to the baseline. With --speed, the teacher and the first seed's distilled student
are also timed at 128 tokens (batch 1 and 32; full SQuAD windows, no padding), each as a PyTorch model and as
triton/deployer.py's fp32 and int8 ONNX exports, with benchmarks/int8_inference.py's timing (rounds in turns,
the middle one kept): the student's sequences per second over the teacher's (goal >= 2.5x). Each stage's outputs
are reused when present, so an interrupted benchmark goes on where it stopped.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import SHARED
from benchmarks.finetune_accuracy import run
from bertrecipe.common.hardware import detect, host_line
from bertrecipe.distillation.pairing import teacher_layers_for
from bertrecipe.distillation.student import student_weights_from_teacher
from bertrecipe.model.weights import read_config, read_weights

MINILM = SHARED / "minilm"
SEQ = 64  # SST-2's longest sentence is 55 tokens of this vocab's; batches are trimmed to their longest row
COMMON = ["--do_lower_case", "--max_seq_length", str(SEQ), "--train_batch_size", "32", "--eval_batch_size", "64",
          "--disable_progress_bar", "--log_freq", "200"]


def accuracy(folder: Path) -> float:
    return json.loads((folder / "results.json").read_text())["eval_acc"]


def sst2_rows(work: Path, rows: int | None) -> Path:
    """SST-2's dev set and its training set (or its first `rows` rows) in a task folder of the work dir."""
    folder = work / "data" / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    lines = (SHARED / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "train.tsv").write_text("".join(lines[:rows + 1] if rows else lines), encoding="utf-8")
    (folder / "dev.tsv").write_text((SHARED / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8"))
    return folder


def teacher(work: Path, data: Path, epochs: float) -> Path:
    out = work / "teacher"
    if not (out / "results.json").is_file():
        run([sys.executable, "run_glue.py", "--task_name", "SST-2", "--data_dir", str(data), "--init_checkpoint",
             str(MINILM), "--vocab_file", str(MINILM / "vocab.txt"), "--output_dir", str(out), "--do_train",
             "--do_eval", "--learning_rate", "5e-5", "--num_train_epochs", str(epochs), "--seed", "42", *COMMON])
    return out


def student_start(work: Path, teacher_folder: Path, layers: int) -> Path:
    """The student both arms start from: the fine-tuned teacher's embeddings, classifier and layers (the last of
    each block), saved as a checkpoint of ours with its config."""
    out = work / "student_start"
    if not (out / "pytorch_model.bin").is_file():
        weights = read_weights(teacher_folder)
        out.mkdir(parents=True, exist_ok=True)
        config = {**read_config(MINILM / "config.json").to_dict(), "num_hidden_layers": layers}
        (work / "student_config.json").write_text(json.dumps(config, indent=2) + "\n")
        student_config = read_config(work / "student_config.json")
        chosen = teacher_layers_for(layers, weights.config.num_hidden_layers)
        state = student_weights_from_teacher(weights.state_dict, weights.config, student_config, chosen)
        torch.save({"model": state, "config": config, "tokenizer": weights.tokenizer}, out / "pytorch_model.bin")
        (out / "bert_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


BASELINE_EPOCHS = 2.0  # run_glue.py's plain fine-tuning; other counts get folders and reports of their own
GENERAL_STUDENT = {"num_hidden_layers": 4, "hidden_size": 192, "intermediate_size": 768}  # 12 heads of 16


def general_name(init: str) -> str:
    """The general student's folder and the name its seeds' folders and reports start with."""
    return "general" if init == "random" else "general-from-teacher"


def general_student(work: Path, steps: int, init: str) -> Path:
    """A 4-layer, 192-wide student of the released MiniLM's states on shards of the shared books (the backbone
    terms: the released folder has no masked-LM head for the prediction term), started at random or (init
    "teacher") from an evenly spaced share of the teacher's layers 2, 3, 4 and 6 (general_distill.py's
    --student_init teacher)."""
    out, shards = work / general_name(init), work / "data" / "general"
    if (out / f"ckpt_{steps}.pt").is_file():
        return out / f"ckpt_{steps}.pt"
    for index, book in enumerate(sorted((SHARED / "books").glob("pg*.txt"))):
        if not (shards / f"books_training_{index}.hdf5").is_file():
            run([sys.executable, "data/create_pretraining_data.py", "--input_file", str(book), "--output_file",
                 str(shards / f"books_training_{index}.hdf5"), "--vocab_file", str(MINILM / "vocab.txt"),
                 "--do_lower_case", "--max_seq_length", "128", "--max_predictions_per_seq", "20",
                 "--dupe_factor", "1"])
    config = {**read_config(MINILM / "config.json").to_dict(), **GENERAL_STUDENT}
    (work / "general_student_config.json").write_text(json.dumps(config, indent=2) + "\n")
    run([sys.executable, "distillation/general_distill.py", "--input_dir", str(shards), "--teacher_model",
         str(MINILM), "--config_file", str(work / "general_student_config.json"), "--distill_config",
         "distillation/distillation_config_backbone.json", "--output_dir", str(out), "--max_seq_length", "128",
         "--max_predictions_per_seq", "20", "--train_batch_size", "32", "--learning_rate", "5e-4",
         "--max_steps", str(steps), "--num_steps_per_checkpoint", str(max(1, steps // 4)), "--do_lower_case",
         "--disable_progress_bar", "--log_freq", "100", "--student_init", init])
    return out / f"ckpt_{steps}.pt"


def baseline(work: Path, data: Path, start: Path, seed: int, epochs: float, tag: str) -> float:
    out = work / f"{tag}_baseline{'' if epochs == BASELINE_EPOCHS else f'-e{epochs:g}'}_seed{seed}"
    if not (out / "results.json").is_file():
        run([sys.executable, "run_glue.py", "--task_name", "SST-2", "--data_dir", str(data), "--init_checkpoint",
             str(start), "--vocab_file", str(MINILM / "vocab.txt"), "--output_dir", str(out), "--do_train",
             "--do_eval", "--learning_rate", "5e-5", "--num_train_epochs", str(epochs), "--seed", str(seed),
             *COMMON])
    return accuracy(out)


def distilled(work: Path, data: Path, teacher_folder: Path, start: Path, seed: int, stages: dict[str, dict],
              tag: str) -> Path:
    """The two stages of task_distill.py in turn; `stages` gives each its learning rate, epochs and whether it reads
    the augmented set. A stage's folder is named by its settings where they are not the first benchmark's, so that
    runs with other settings never reuse its outputs."""
    student, name = start, f"{tag}_distilled"
    for stage, settings in stages.items():
        name += stage_suffix(stage, settings)
        out = work / f"{name}_seed{seed}_{stage}"
        if not (out / "results.json").is_file():
            run([sys.executable, "distillation/task_distill.py", "--teacher_model", str(teacher_folder),
                 "--student_model", str(student), "--vocab_file", str(MINILM / "vocab.txt"), "--data_dir", str(data),
                 "--task_name", "SST-2", "--output_dir", str(out), "--distill_config",
                 f"distillation/distillation_config_{stage}.json", "--learning_rate", settings["rate"],
                 "--num_train_epochs", str(settings["epochs"]), "--seed", str(seed),
                 *(["--aug_train"] if settings["aug"] else []), *COMMON])
        student = out
    return student


FIRST_STAGES = {"backbone": {"rate": "1e-4", "epochs": 1.0, "aug": False},
                "heads": {"rate": "5e-5", "epochs": 1.0, "aug": False}}


def stage_suffix(stage: str, settings: dict) -> str:
    """'' for the first benchmark's settings of the stage, else e.g. '-heads-aug-e2-lr1e-4'."""
    if settings == FIRST_STAGES[stage]:
        return ""
    return f"-{stage}{'-aug' if settings['aug'] else ''}-e{settings['epochs']:g}-lr{settings['rate']}"


def augment(work: Path, data: Path, copies: int, mlm_steps: int) -> None:
    """data_augmentation.py's train_aug.tsv beside train.tsv, from a masked-LM head trained for it (the released
    MiniLM has none)."""
    if (data / "train_aug.tsv").is_file():
        return
    run([sys.executable, "distillation/data_augmentation.py", "--pretrained_bert_model",
         str(augmentation_masked_lm(work, mlm_steps)), "--vocab_file", str(MINILM / "vocab.txt"), "--do_lower_case",
         "--glue_dir", str(data.parent), "--task_name", "SST-2", "--N", str(copies), "--seed", "1",
         "--no_original_segment"])


def augmentation_masked_lm(work: Path, mlm_steps: int) -> Path:
    """The released MiniLM with a masked-LM head trained (mlm_steps steps on a shared book) for augmentation."""
    shards, masked = work / "data" / "mlm", work / "masked_lm"
    if (masked / f"ckpt_{mlm_steps}.pt").is_file():
        return masked / f"ckpt_{mlm_steps}.pt"
    run([sys.executable, "data/create_pretraining_data.py", "--input_file", str(SHARED / "books" / "pg1661.txt"),
         "--output_file", str(shards / "books_training_0.hdf5"), "--vocab_file", str(MINILM / "vocab.txt"),
         "--do_lower_case", "--max_seq_length", str(SEQ), "--max_predictions_per_seq", "10", "--dupe_factor", "1"])
    run([sys.executable, "run_pretraining.py", "--input_dir", str(shards), "--init_checkpoint", str(MINILM),
         "--config_file", str(MINILM / "config.json"), "--output_dir", str(masked), "--max_seq_length", str(SEQ),
         "--max_predictions_per_seq", "10", "--train_batch_size", "32", "--learning_rate", "5e-4", "--optimizer",
         "adamw", "--max_steps", str(mlm_steps), "--num_steps_per_checkpoint", str(mlm_steps), "--no_nsp",
         "--do_train", "--disable_progress_bar"])
    return masked / f"ckpt_{mlm_steps}.pt"


def speed(work: Path, teacher_folder: Path, student_folder: Path, rounds: int) -> dict:
    """Sequences per second of the teacher and the student at 128 tokens on each of our engines (PyTorch fp32, ONNX
    Runtime fp32 and int8), timed in turns, and the student's over the teacher's."""
    from benchmarks import int8_inference as timing

    threads = timing.usable_threads()
    rows = timing.timing_rows(SHARED / "squad" / "dev-v1.1.json")
    engines = {}
    for name, folder in (("teacher", teacher_folder), ("student", student_folder)):
        exports = timing.export_both(name, folder, "glue", timing.SEQ, work / "speed_models")
        for engine, call in timing.our_engines(folder, exports, threads).items():
            engines[f"{name} {engine}"] = call
    times = [timing.time_round(engines, rows) for _ in range(rounds)]
    rates = {name: {size: timing.sequences_per_second(int(size), [t[name][size] for t in times])
                    for size in map(str, timing.BATCH_SIZES)} for name in engines}
    engine_names = [name.removeprefix("teacher ") for name in engines if name.startswith("teacher ")]
    return {"threads": threads, "sequence_length": timing.SEQ, "sequences_per_second": rates,
            "student_over_teacher": {engine: {size: rates[f"student {engine}"][size] / rates[f"teacher {engine}"][size]
                                              for size in rates[f"teacher {engine}"]} for engine in engine_names}}


def speed_lines(measured: dict) -> list[str]:
    rows = [f"| {engine} | {size} | {measured['sequences_per_second'][f'teacher {engine}'][size]:.1f} | "
            f"{measured['sequences_per_second'][f'student {engine}'][size]:.1f} | {ratio:.2f}x |"
            for engine, by_size in measured["student_over_teacher"].items() for size, ratio in by_size.items()]
    return ["", f"Speed at {measured['sequence_length']} tokens, {measured['threads']} threads (sequences/s; "
            "goal: student >= 2.5x the teacher)", "",
            "| engine | batch | teacher | student | student / teacher |", "|---|---|---|---|---|", *rows]


def stages_line(report: dict) -> str:
    """The report's one line on what the distilled arms ran (each stage's epochs, rate and data) and the baseline."""
    said = [f"{stage} stage {settings['epochs']:g} epoch(s) at {settings['rate']}"
            f"{' on the augmented set' if settings['aug'] else ''}" for stage, settings in report["stages"].items()]
    augmented = f"{report['augmented_copies']} augmented copies a sentence, {report.get('augmented_rows', 0):,} rows"
    return f"distilled: {'; '.join(said)} ({augmented}); baseline: {report['baseline_epochs']:g} epochs of run_glue.py"


def table(report: dict) -> str:
    rows = [f"| seed {seed} | {100 * b:.2f} | {100 * d:.2f} |" for seed, b, d in
            zip(report["seeds"], report["baseline"], report["distilled"], strict=True)]
    median_b, median_d = statistics.median(report["baseline"]), statistics.median(report["distilled"])
    teacher_acc = report["teacher"]
    return "\n".join([
        f"SST-2 dev accuracy; teacher {100 * teacher_acc:.2f} ({report['teacher_layers']} layers), student "
        f"{report['student_layers']} layers; {report['train_rows']} training rows; {report['host']}",
        *([stages_line(report)] if "stages" in report else []), "",
        "| | fine-tuned (baseline) | task-distilled |", "|---|---|---|", *rows,
        f"| **median** | **{100 * median_b:.2f}** | **{100 * median_d:.2f}** |", "",
        f"distilled student: {100 * median_d / teacher_acc:.1f} % of the teacher's accuracy (goal >= 97 %), "
        f"{100 * (median_d - median_b):+.2f} points against the baseline (goal >= +2)",
        *(speed_lines(report["speed"]) if "speed" in report else [])])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--train_rows", type=int, help="the first N rows of SST-2's training set (default: all)")
    p.add_argument("--teacher_epochs", type=float, default=1.0)
    p.add_argument("--student", choices=("layers", "general"), default="layers")
    p.add_argument("--student_layers", type=int, default=3, help="--student layers: how many of the teacher's")
    p.add_argument("--general_steps", type=int, default=2000, help="--student general: general_distill's steps")
    p.add_argument("--general_init", choices=("random", "teacher"), default="random",
                   help="--student general: the student's start (general_distill.py's --student_init)")
    p.add_argument("--aug_n", type=int, default=0, help="augmented copies a sentence (0: no augmentation)")
    p.add_argument("--mlm_steps", type=int, default=200)
    p.add_argument("--aug_stages", nargs="+", choices=("backbone", "heads"), default=["backbone", "heads"],
                   help="with --aug_n: the stages that read the augmented set")
    p.add_argument("--heads_epochs", type=float, default=1.0)
    p.add_argument("--heads_learning_rate", default="5e-5")
    p.add_argument("--baseline_epochs", type=float, default=BASELINE_EPOCHS)
    p.add_argument("--speed", action="store_true", help="also time the teacher and the first seed's student")
    p.add_argument("--rounds", type=int, default=3, help="--speed: timing rounds")
    args = p.parse_args(argv)
    work = args.work_dir.resolve()
    data = sst2_rows(work, args.train_rows)
    if args.aug_n:
        augment(work, data, args.aug_n, args.mlm_steps)
    teacher_folder = teacher(work, data, args.teacher_epochs)
    if args.student == "general":
        start = general_student(work, args.general_steps, args.general_init)
        layers, tag = GENERAL_STUDENT["num_hidden_layers"], general_name(args.general_init)
    else:
        start, layers = student_start(work, teacher_folder, args.student_layers), args.student_layers
        tag = args.student
    # seed by seed, both arms: an interrupted benchmark has whole comparisons to show
    stages = {"backbone": {**FIRST_STAGES["backbone"], "aug": args.aug_n > 0 and "backbone" in args.aug_stages},
              "heads": {"rate": args.heads_learning_rate, "epochs": args.heads_epochs,
                        "aug": args.aug_n > 0 and "heads" in args.aug_stages}}
    arms = [(baseline(work, data, start, seed, args.baseline_epochs, tag),
             distilled(work, data, teacher_folder, start, seed, stages, tag)) for seed in args.seeds]
    report = {"seeds": args.seeds, "teacher": accuracy(teacher_folder), "teacher_layers": 6,
              "student_layers": layers, "student": tag,
              "host": f"{host_line(detect(), 'fp32')}, date {time.strftime('%Y-%m-%d')}",
              "train_rows": args.train_rows or "all", "augmented_copies": args.aug_n,
              "baseline": [plain for plain, _ in arms], "distilled": [accuracy(taught) for _, taught in arms],
              "stages": stages, "baseline_epochs": args.baseline_epochs}
    if args.aug_n:
        record = json.loads((data / "train_aug.tsv.augmentation.json").read_text())
        report["augmented_rows"] = record["rows"]
    if args.speed:
        report["speed"] = speed(work, teacher_folder, arms[0][1], args.rounds)
    name = f"report_{tag}" + "".join(stage_suffix(stage, settings) for stage, settings in stages.items())
    (work / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (work / f"{name}.md").write_text(table(report) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
