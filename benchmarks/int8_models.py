"""The models int8_inference.py measures, made with the recipe's own commands: the teacher (the released MiniLM,
6 layers x 384), a student of every other teacher layer (3 layers), each fine-tuned on a subset of SST-2 with
run_glue.py, the teacher also on SQuAD v1.1 with run_squad.py (the official train set is not here: the first
articles of dev-v1.1 train, the last 8 score, as finetune_accuracy.py splits it). A run is skipped when its folder
already holds the model of the same command (run.json records it), so a second benchmark run reuses them.

    python -m benchmarks.int8_models --work_dir results/int8_work      # fine-tunes what is missing, prints the commands
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, SHARED
from benchmarks.finetune_accuracy import squad_split

TEACHER = SHARED / "minilm"
SQUAD_EVAL_ARTICLES = 8  # the last 8 of dev-v1.1's 48 articles (1,589 questions), finetune_accuracy.py's split


@dataclass(frozen=True)
class FineTuning:
    """How much fine-tuning the benchmark's models get: small enough for a few CPU minutes each."""

    sst2_train_rows: int = 8000
    squad_train_articles: int = 10
    squad_seq: int = 256
    bf16: bool = True  # native on a CPU with AVX-512 BF16 or AMX; the figures name it


def every_other_layer(source: Path, target: Path) -> Path:
    """A Hugging Face BERT folder of the source's layers 0, 2, 4, ... renumbered 0, 1, 2, ... with the same
    embeddings, pooler and vocab: the student, made without training."""
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    kept = list(range(0, config["num_hidden_layers"], 2))
    renumber = {old: new for new, old in enumerate(kept)}
    tensors = {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        parts = name.split(".")
        if parts[0] == "encoder" and parts[1] == "layer":
            layer = int(parts[2])
            if layer not in renumber:
                continue
            parts[2] = str(renumber[layer])
        tensors[".".join(parts)] = tensor.contiguous()
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps({**config, "num_hidden_layers": len(kept)}, indent=2) + "\n",
                                        encoding="utf-8")
    (target / "vocab.txt").write_bytes((source / "vocab.txt").read_bytes())
    return target


def sst2_subset(source: Path, target: Path, train_rows: int) -> Path:
    """SST-2's first train_rows training rows (header kept) and its whole dev set."""
    target.mkdir(parents=True, exist_ok=True)
    with (source / "train.tsv").open(encoding="utf-8") as lines:
        head = [line for _, line in zip(range(train_rows + 1), lines, strict=False)]
    (target / "train.tsv").write_text("".join(head), encoding="utf-8")
    (target / "dev.tsv").write_bytes((source / "dev.tsv").read_bytes())
    return target


def glue_command(encoder: Path, data: Path, out: Path, settings: FineTuning) -> list[str]:
    return [sys.executable, "run_glue.py", "--task_name", "sst-2", "--data_dir", str(data), "--init_checkpoint",
            str(encoder), "--vocab_file", str(encoder / "vocab.txt"), "--do_lower_case", "--output_dir", str(out),
            "--do_train", "--do_eval", "--max_seq_length", "128", "--train_batch_size", "32", "--learning_rate",
            "1e-4", "--num_train_epochs", "1", "--warmup_proportion", "0.1", "--seed", "42", "--eval_batch_size",
            "64", "--disable_progress_bar", *(["--bf16"] if settings.bf16 else [])]


def squad_command(encoder: Path, train: Path, evaluate: Path, out: Path, settings: FineTuning) -> list[str]:
    return [sys.executable, "run_squad.py", "--init_checkpoint", str(encoder), "--vocab_file",
            str(encoder / "vocab.txt"), "--do_lower_case", "--train_file", str(train), "--predict_file", str(evaluate),
            "--output_dir", str(out), "--do_train", "--do_predict", "--do_eval", "--max_seq_length",
            str(settings.squad_seq), "--doc_stride", "128", "--train_batch_size", "32", "--learning_rate", "1e-4",
            "--num_train_epochs", "1", "--warmup_proportion", "0.1", "--seed", "42", "--predict_batch_size", "32",
            "--disable_progress_bar", *(["--bf16"] if settings.bf16 else [])]


def run_once(command: list[str], out: Path) -> float:
    """Runs command (a fine-tuning into out) unless out holds the model the same command made; returns its minutes
    (0 when reused)."""
    record = out / "run.json"
    if (out / "pytorch_model.bin").is_file() and record.is_file() and \
            json.loads(record.read_text(encoding="utf-8"))["command"] == command[1:]:
        print(f"reusing {out} (run.json: the same command)", flush=True)
        return 0.0
    print("$ " + " ".join(command), flush=True)
    start = time.time()
    subprocess.run(command, check=True, cwd=REPO)
    minutes = (time.time() - start) / 60
    record.write_text(json.dumps({"command": command[1:], "minutes": minutes}) + "\n", encoding="utf-8")
    return minutes


def squad_files(work: Path, settings: FineTuning) -> tuple[Path, Path]:
    """dev-v1.1 split: the first squad_train_articles articles train, the last SQUAD_EVAL_ARTICLES score."""
    data = json.loads((SHARED / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    articles = data["data"]
    if settings.squad_train_articles > len(articles) - SQUAD_EVAL_ARTICLES:
        raise SystemExit(f"--squad_train_articles {settings.squad_train_articles}: at most "
                         f"{len(articles) - SQUAD_EVAL_ARTICLES} (the last {SQUAD_EVAL_ARTICLES} score)")
    first_scored = len(articles) - SQUAD_EVAL_ARTICLES
    train, evaluate = squad_split(SHARED / "squad" / "dev-v1.1.json", work / "squad", first_scored)
    trimmed = {"version": data["version"], "data": articles[:settings.squad_train_articles]}
    train.write_text(json.dumps(trimmed), encoding="utf-8")
    return train, evaluate


def fine_tuned_models(work: Path, settings: FineTuning, squad: bool = True) -> dict[str, Path]:
    """Each fine-tuned model's folder by name (sst2_teacher, sst2_student, squad_teacher), made when missing."""
    student = work / "student"
    if not (student / "model.safetensors").is_file():
        every_other_layer(TEACHER, student)
    data = sst2_subset(SHARED / "glue" / "SST-2", work / "sst2", settings.sst2_train_rows)
    models = {}
    for name, encoder in (("sst2_teacher", TEACHER), ("sst2_student", student)):
        models[name] = work / name
        run_once(glue_command(encoder, data, models[name], settings), models[name])
    if squad:
        train, evaluate = squad_files(work, settings)
        models["squad_teacher"] = work / "squad_teacher"
        run_once(squad_command(TEACHER, train, evaluate, models["squad_teacher"], settings), models["squad_teacher"])
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", type=Path, default=Path("results") / "int8_work")
    parser.add_argument("--sst2_train_rows", type=int, default=FineTuning.sst2_train_rows)
    parser.add_argument("--squad_train_articles", type=int, default=FineTuning.squad_train_articles)
    parser.add_argument("--skip_squad", action="store_true")
    args = parser.parse_args()
    settings = FineTuning(args.sst2_train_rows, args.squad_train_articles)
    for name, folder in fine_tuned_models(args.work_dir, settings, not args.skip_squad).items():
        print(name, folder)


if __name__ == "__main__":
    main()
