"""Task distillation's data augmentation (TinyBERT's method), with the flags of NVIDIA's
`distillation/data_augmentation.py`:

    python distillation/data_augmentation.py --pretrained_bert_model <teacher> --glue_dir <dir> --task_name SST-2

writes <glue_dir>/<task_name>/train_aug.tsv beside the task's train.tsv (for SQuADv1.1, <glue_dir>/train-v1.1_aug.json
beside <glue_dir>/train-v1.1.json; SQuADv2.0 alike), which task distillation reads with --aug_train. The teacher is
any checkpoint the project loads that has its masked-LM head (ours, NVIDIA's, a transformers folder); its masked LM
gives every word's candidates (bertrecipe/distillation/augmentation.py; docs/distillation.md says what differs from
NVIDIA's, which uses GloVe for words of several pieces: --glove_embs is accepted and not read). A record beside the
output (<output>.augmentation.json: the sha256 of the teacher's files, of the vocab and of the train file, and the
flags) makes a second call with the same inputs reuse the output; any change makes it again. Every input is checked
before anything is written; the output is written whole or not at all.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

import torch

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.common.files import FileStamp
from bertrecipe.common.output_paths import check_writable, refuse_input_as_output
from bertrecipe.distillation import augmentation
from bertrecipe.distillation.augmentation import AugmentationSettings, MaskedWordPredictor
from bertrecipe.finetuning import glue, squad
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.tokenization.bpe import BpeVocab
from bertrecipe.tokenization.vocab_files import load_vocab_file, wordpiece_lower_case
from bertrecipe.tokenization.wordpiece import BertTokenizer

# NVIDIA's task names (the GLUE folder names) and ours, SQuADv2.0 and WNLI.
GLUE_NAMES = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")
SQUAD_FILES = {"squadv1.1": "train-v1.1.json", "squadv2.0": "train-v2.0.json"}
VOCAB_NAMES = ("vocab.txt", "tokenizer.json")
REPORT_EVERY_S = 30.0


@dataclass(frozen=True)
class AugmentationJob:
    """What the command line asks for, checked."""

    teacher: Path
    config_file: Optional[Path]
    vocab_file: Path
    do_lower_case: Optional[bool]  # None: the vocab tells
    task: str  # lower-case: "sst-2", "squadv1.1", ...
    train_file: Path
    output: Path
    squad_part: str
    max_examples: Optional[int]
    settings: AugmentationSettings

    @property
    def is_squad(self) -> bool:
        return self.task in SQUAD_FILES

    def flags(self) -> dict[str, Any]:
        """The flags that change the output, for the record."""
        return {"task": self.task, "squad_part": self.squad_part if self.is_squad else None,
                "max_examples": self.max_examples, **self.settings.record()}


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="data_augmentation.py", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained_bert_model", required=True,
                   help="the teacher with its masked-LM head: a model folder (ours, NVIDIA's, transformers') or a "
                        "checkpoint file")
    p.add_argument("--glove_embs", help="NVIDIA's GloVe file: accepted and not read (the masked LM replaces GloVe)")
    p.add_argument("--glue_dir", required=True, help="the folder of the GLUE task folders (or of train-v1.1.json)")
    p.add_argument("--task_name", required=True, help=f"{', '.join(GLUE_NAMES)}, SQuADv1.1 or SQuADv2.0")
    p.add_argument("--seed", type=int, default=42, help="the draws' seed: the same seed, the same output")
    p.add_argument("--N", type=int, help="copies drawn per text (default: NVIDIA's per task, e.g. SST-2 20)")
    p.add_argument("--M", type=int, default=15, help="candidates per word, K: the masked LM's top M words")
    p.add_argument("--p", type=float, default=0.4, help="probability that a word is replaced in a copy")
    p.add_argument("--config_file", help="the teacher's config when the checkpoint has none in or beside it")
    p.add_argument("--vocab_file", help="vocab.txt (default: the one in or beside --pretrained_bert_model)")
    p.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction,
                   help="the teacher's casing (default: as its vocab tells)")
    p.add_argument("--max_examples", type=int, help="augment only the first examples (SQuAD: questions)")
    p.add_argument("--output_file",
                   help="default NVIDIA's: <task folder>/train_aug.tsv, <glue_dir>/train-v1.1_aug.json")
    p.add_argument("--squad_part", choices=augmentation.SQUAD_PARTS, default="context",
                   help="SQuAD: copy the contexts (NVIDIA's; answers never replaced) or the questions")
    p.add_argument("--max_seq_length", type=int, default=128, help="of a masked LM input, both segments together")
    p.add_argument("--no_original_segment", action="store_true",
                   help="the masked LM sees the masked text alone, not TinyBERT's second segment holding it unmasked "
                        "(about twice as fast; candidates further from the word's meaning)")
    p.add_argument("--batch_size", type=int, default=256, help="masked texts per forward pass")
    return p


def parse_args(argv: Optional[list[str]] = None) -> AugmentationJob:
    """The job the flags describe, every path and number checked (InputError naming the flag or file)."""
    args = _parser().parse_args(argv)
    task = _task(args.task_name)
    teacher = Path(args.pretrained_bert_model)
    if not teacher.exists():
        raise InputError(f"{teacher}: --pretrained_bert_model does not exist")
    train_file, default_output = _task_files(Path(args.glue_dir), args.task_name, task)
    output = Path(args.output_file) if args.output_file else default_output
    vocab_file = Path(args.vocab_file) if args.vocab_file else _vocab_beside(teacher)
    if args.max_examples is not None and args.max_examples < 1:
        raise InputError(f"--max_examples {args.max_examples}: must be at least 1")
    settings = _settings(args, task)
    inputs = [("the train file", train_file), ("--pretrained_bert_model", teacher), ("--vocab_file", vocab_file),
              ("--config_file", args.config_file)]
    refuse_input_as_output(output, "--output_file", inputs)
    refuse_input_as_output(augmentation.record_path(output), "the record beside --output_file", inputs)
    check_writable(output, "--output_file")
    if args.glove_embs is not None:
        print(f"warning: --glove_embs {args.glove_embs}: not read; this recipe takes the candidates of every word, "
              "multi-piece words included, from the teacher's masked LM (docs/distillation.md)", file=sys.stderr)
    return AugmentationJob(teacher, Path(args.config_file) if args.config_file else None, vocab_file,
                           args.do_lower_case, task, train_file, output, args.squad_part, args.max_examples, settings)


def _task(name: str) -> str:
    lowered = name.lower()
    if lowered in SQUAD_FILES or lowered in {n.lower() for n in GLUE_NAMES}:
        return lowered
    raise InputError(f"--task_name {name!r}: not a task this command augments (known: {', '.join(GLUE_NAMES)}, "
                     "SQuADv1.1, SQuADv2.0)")


def _task_files(glue_dir: Path, name: str, task: str) -> tuple[Path, Path]:
    """(train file, default output) of the task, NVIDIA's places; InputError when the train file is missing."""
    if task in SQUAD_FILES:
        train = glue_dir / SQUAD_FILES[task]
        output = train.with_name(train.stem + "_aug.json")
    else:
        train = _task_folder(glue_dir, name) / "train.tsv"
        output = train.with_name("train_aug.tsv")
    if not train.is_file():
        place = SQUAD_FILES[task] if task in SQUAD_FILES else "<task_name>/train.tsv"
        raise InputError(f"{train}: no such file; --task_name {name} reads <glue_dir>/{place} (--glue_dir {glue_dir})")
    return train, output


def _task_folder(glue_dir: Path, name: str) -> Path:
    """<glue_dir>/<name>, or the one folder there whose name is name in another case (SST-2 for sst-2)."""
    if (glue_dir / name).is_dir() or not glue_dir.is_dir():
        return glue_dir / name
    others = [folder for folder in glue_dir.iterdir() if folder.name.lower() == name.lower() and folder.is_dir()]
    return others[0] if len(others) == 1 else glue_dir / name


def _vocab_beside(teacher: Path) -> Path:
    folder = teacher if teacher.is_dir() else teacher.parent
    found = next((folder / name for name in VOCAB_NAMES if (folder / name).is_file()), None)
    if found is None:
        raise InputError(f"{folder}: holds no {' or '.join(VOCAB_NAMES)}; pass the teacher's --vocab_file")
    return found


def _settings(args: argparse.Namespace, task: str) -> AugmentationSettings:
    for flag in ("N", "M", "batch_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise InputError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    if not 0.0 <= args.p <= 1.0:
        raise InputError(f"--p {args.p}: a probability, from 0 to 1")
    minimum = 3 if args.no_original_segment else 7
    if args.max_seq_length < minimum:
        raise InputError(f"--max_seq_length {args.max_seq_length}: must be at least {minimum} (the special tokens "
                         "and some text on each side of the [MASK])")
    return AugmentationSettings(copies=args.N or augmentation.DEFAULT_COPIES[task], candidates=args.M,
                                replace_probability=args.p, seed=args.seed, max_seq_length=args.max_seq_length,
                                with_original=not args.no_original_segment, batch_size=args.batch_size)


def _tokenizer(job: AugmentationJob) -> BertTokenizer:
    vocab = load_vocab_file(job.vocab_file)
    if isinstance(vocab, BpeVocab):
        raise InputError(f"{job.vocab_file}: a byte-level BPE tokenizer; data augmentation works on WordPiece "
                         "models (BERT's), whose vocab tells whole words from pieces")
    tokenizer = load_tokenizer(job.vocab_file, wordpiece_lower_case(vocab, job.do_lower_case))
    assert isinstance(tokenizer, BertTokenizer)
    return tokenizer


class _Progress:
    """A line every REPORT_EVERY_S seconds: texts done, of how many, and how fast."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.started = self.reported = time.perf_counter()
        self.done = 0

    def __call__(self, done: int) -> None:
        self.done = done
        now = time.perf_counter()
        if now - self.reported >= REPORT_EVERY_S:
            self.reported = now
            print(f"augmented {done:,} of {self.total:,} texts ({self.rate():.1f} texts/s)", flush=True)

    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.started, 1e-9)


@dataclass(frozen=True)
class _GlueTrain:
    task: glue.GlueTask
    header: Optional[str]  # as in the file, a byte-order mark included (MRPC's); None for CoLA
    rows: list[list[str]]


def _read_glue(job: AugmentationJob) -> _GlueTrain:
    """The train file's rows (the first --max_examples), checked as fine-tuning reads them: columns and labels."""
    task = glue.get_task(job.task)
    glue.read_examples(task, job.train_file.parent, "train")  # one line naming the file and the line
    rows = glue.read_tsv(job.train_file, columns=None if task.has_header else task.columns,
                         has_header=task.has_header)[:job.max_examples]
    header = None
    if task.has_header:
        header = job.train_file.read_bytes().decode("utf-8").split("\n", 1)[0].removesuffix("\r")
    return _GlueTrain(task, header, rows)


def _read_squad(job: AugmentationJob) -> dict[str, Any]:
    """The SQuAD file's data (its first --max_examples questions), checked as training reads it, its plausible
    answers too."""
    squad_file = squad.read_squad_file(job.train_file)
    squad.read_squad_examples(squad_file, is_training=True, version_2_with_negative=job.task == "squadv2.0")
    augmentation.check_squad_answers(squad_file.data, job.train_file)
    return augmentation.first_questions(squad_file.data, job.max_examples)


def _augment_glue(job: AugmentationJob, train: _GlueTrain, predictor: MaskedWordPredictor,
                  stamp: FileStamp) -> tuple[str, int, float]:
    """Writes train_aug.tsv; returns its sha256, its number of rows and the texts augmented per second."""
    progress = _Progress(len(train.rows) * (1 if train.task.text_b is None else 2))
    sha256, count = augmentation.write_augmented_tsv(
        job.output, train.header, augmentation.glue_rows(train.rows, train.task, predictor, progress),
        before_commit=lambda: stamp.check(job.train_file, "train file"))
    return sha256, count, progress.rate()


def _augment_squad(job: AugmentationJob, data: dict[str, Any], predictor: MaskedWordPredictor,
                   stamp: FileStamp) -> tuple[str, int, float]:
    """Writes the augmented SQuAD file; returns its sha256, its number of questions and the texts per second."""
    paragraphs = [p for article in data["data"] for p in article["paragraphs"]]
    progress = _Progress(len(paragraphs) if job.squad_part == "context" else sum(len(p["qas"]) for p in paragraphs))
    augmented = augmentation.augment_squad(data, job.squad_part, predictor, progress)
    augmentation.refuse_taken_ids(data, augmented, job.output)
    sha256 = augmentation.write_augmented_json(job.output, augmented,
                                            before_commit=lambda: stamp.check(job.train_file, "train file"))
    count = sum(len(p["qas"]) for article in augmented["data"] for p in article["paragraphs"])
    return sha256, count, progress.rate()


def main(argv: Optional[list[str]] = None) -> None:
    job = parse_args(argv)
    tokenizer = _tokenizer(job)
    stamp = FileStamp.of(job.train_file)  # before the hash: a file changed later is refused before the commit
    inputs = augmentation.inputs_record(augmentation.teacher_files(job.teacher, job.config_file),
                                        tokenizer.vocab.sha256, tokenizer.do_lower_case, job.train_file, job.flags())
    if augmentation.finished_before(job.output, inputs):
        print(f"{job.output}: complete, made before from the same teacher, train file and flags: reused (change an "
              "input or a flag, or delete it, to make it again)")
        return
    train = _read_squad(job) if job.is_squad else _read_glue(job)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = augmentation.load_masked_lm(job.teacher, job.config_file, tokenizer.vocab, job.settings.max_seq_length)
    predictor = MaskedWordPredictor(model.to(device), tokenizer, job.settings)
    started = time.perf_counter()
    augment = _augment_squad if job.is_squad else _augment_glue
    sha256, count, rate = augment(job, train, predictor, stamp)
    record = augmentation.write_record(job.output, inputs, sha256, count)
    what = "questions" if job.is_squad else "rows"
    print(f"{job.output}: {count:,} {what} in {time.perf_counter() - started:.0f} s ({rate:.1f} texts/s on "
          f"{device.type}, N {job.settings.copies}, K {job.settings.candidates}, p {job.settings.replace_probability}"
          f"); record {record}")


def cli() -> NoReturn:
    """The command line (root script and console script): bad input as one line and exit 2, signals one line."""
    run_cli(main)
