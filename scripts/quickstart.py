#!/usr/bin/env python3
"""The recipe end to end on the embedded default corpus (called by scripts/quickstart.sh).

Stages, each skipped when its output is already complete: default corpus (text, vocab, phase-1 and phase-2
shards) -> a small BERT pre-trained through phase 1 (seq 128) and phase 2 (seq 512) with LAMB, bf16 where the
CPU supports it -> masked-LM loss and accuracy on the held-out shards -> loss curves (PNG) -> a fill-in-the-mask
demonstration on held-out sentences -> a summary of what was made and where.

With --family modern the model is a small ModernBERT (rotary positions, GeGLU, local and global attention, no
NSP) trained the modern way on the same shards: 30 % dynamic masking, packed rows, StableAdamW with a
warmup-stable-decay schedule, and phase 2 as a context extension (seq 512 with a larger global rotary base).

An output folder holds one run: a second run with the same QUICKSTART_STEPS and --family reuses what is complete
and finishes what is not (appending to its logs); one with another step count or family is refused before any
write, naming the folder to move away, since that run's checkpoints and logs are its record.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import torch

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.common.hardware import detect, recipe_device
from bertrecipe.common.output_paths import check_writable_folder
from bertrecipe.dataprep import layout
from bertrecipe.dataprep.vocab_training import vocab_path
from bertrecipe.model.families import (
    ModelConfig,
    config_from_dict,
    config_from_json_file,
    is_modern_config,
    pretraining_model,
)
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from bertrecipe.training.checkpointing import load_checkpoint, survey
from bertrecipe.training.metric_logger import read_log

REPO = Path(__file__).resolve().parents[1]

CORPUS = "python_docs"
VOCAB_SIZE = 8192
DUPE_FACTOR = 5
SMALL_BERT = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512,
              "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu", "initializer_range": 0.02,
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
SMALL_MODERN = {"model_type": "modernbert", "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2,
                "intermediate_size": 256, "max_position_embeddings": 128, "local_attention": 64,
                "global_attn_every_n_layers": 3, "global_rope_theta": 10_000.0, "local_rope_theta": 10_000.0,
                "mlp_dropout": 0.0, "attention_dropout": 0.0, "embedding_dropout": 0.0, "pad_token_id": 0}
# Phase 2 of the modern family: longer rows with the global layers' rotary base raised (ModernBERT: 160,000).
MODERN_PHASE2 = {"max_position_embeddings": 512, "global_rope_theta": 160_000.0}
PHASES = {1: (128, 20), 2: (512, 80)}
# Per family: phase-1 and phase-2 learning rates, masked positions per row (None: the shards'; 30 % of the
# modern family's rows need more room than the shards' 15 %) and the flags both phases add.
TRAINING = {
    "bert": ((1e-2, 4e-3), None, []),
    "modern": ((2e-3, 1e-3), {1: 40, 2: 160},
               ["--dynamic_masking", "--masked_lm_prob", "0.3", "--pack_sequences", "--optimizer", "stable_adamw",
                "--adam_beta2", "0.98", "--lr_schedule", "wsd", "--decay_shape", "1-sqrt",
                "--decay_proportion", "0.2"]),
}


ERROR_PREFIX = b"error: "


def relay_stderr(stream: IO[bytes]) -> list[str]:
    """Copies a stage's stderr to ours as it comes (progress bars' partial lines included) and returns its
    `error:` lines instead of copying them."""
    held, pending = [], b""

    def keep_or_pass(line: bytes, end: bytes) -> None:
        if line.startswith(ERROR_PREFIX):
            held.append(line.decode("utf-8", "replace").strip())
        else:
            sys.stderr.buffer.write(line + end)

    while chunk := os.read(stream.fileno(), 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            keep_or_pass(line, b"\n")
        if pending and not (pending.startswith(ERROR_PREFIX) or ERROR_PREFIX.startswith(pending)):
            keep_or_pass(pending, b"")  # a progress bar's update: no newline until it ends
            pending = b""
        sys.stderr.buffer.flush()
    if pending:
        keep_or_pass(pending, b"")
    return held


def run(command: list[str], again: str, **kwargs) -> None:
    """Runs a stage's command. Its `error:` line advises the stage's own flags, which the quick start's user does
    not pass: the quick start says the problem again with `again`, what to do here instead."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, **kwargs)
    try:
        errors = relay_stderr(process.stderr)
        code = process.wait()
    except BaseException:  # Ctrl-C, SIGTERM: the stage stops with the quick start (as subprocess.run does)
        process.kill()
        process.wait()
        raise
    if code == 0:
        for line in errors:
            print(line, file=sys.stderr)
        return
    if errors:
        problem = errors[-1].removeprefix("error: ").split("; ")[0]  # "<file>: <problem>; <what to do>"
    else:  # killed by a signal, or stopped without a message of its own
        problem = f"{Path(command[1]).name} stopped with status {code if code > 0 else 128 - code}"
    print(f"error: {problem}; {again}", file=sys.stderr, flush=True)
    raise SystemExit(code if code > 0 else 128 - code)


def shard_dir(seq: int, preds: int, split: str) -> Path:
    params = layout.InstanceParams(True, seq, preds, 0.15, 12345, DUPE_FACTOR)
    return layout.hdf5_split_dir(layout.working_dir(), params, CORPUS, split)


def final_record(path: Path) -> dict:
    return next((r["data"] for r in reversed(read_log(path)) if r.get("step") == []), {})


def earlier_figures(out: Path, phase: int) -> dict:
    """The phase's figures in an earlier run's summary.json ({} when there are none)."""
    try:
        figures = json.loads((out / "summary.json").read_text(encoding="utf-8")).get(f"phase{phase}")
    except (OSError, ValueError, AttributeError):
        return {}
    return figures if isinstance(figures, dict) else {}


def pretrain_phase(phase: int, steps: int, batch: int, lr: float, out: Path, config: Path, bf16: bool,
                   phase1_steps: int, family: str) -> dict:
    seq, preds = PHASES[phase]
    _, predictions, extra = TRAINING[family]
    global_end = steps if phase == 1 else phase1_steps + steps
    log = out / f"dllogger_phase{phase}.json"
    if (out / "checkpoints" / f"ckpt_{global_end}.pt").exists():
        print(f"phase {phase}: already complete (checkpoints/ckpt_{global_end}.pt), reused")
        if not log.exists():  # training it again would not bring it back: the phase has nothing left to train
            print(f"phase {phase}: its log {log} is gone; its figures are taken from the earlier summary.json")
            return earlier_figures(out, phase)
        return final_record(log)
    # An unfinished phase of this very run (refuse_another_run saw to that) resumes and appends to its log,
    # which stays the record of the steps trained so far.
    command = [sys.executable, str(REPO / "run_pretraining.py"), "--input_dir", str(shard_dir(seq, preds, "training")),
               "--eval_dir", str(shard_dir(seq, preds, "test")), "--do_eval", "--config_file", str(config),
               "--output_dir", str(out / "checkpoints"), "--max_seq_length", str(seq),
               "--max_predictions_per_seq", str(predictions[phase] if predictions else preds),
               "--train_batch_size", str(batch),
               "--learning_rate", str(lr), "--warmup_proportion", "0.1", "--max_steps", str(steps),
               "--num_steps_per_checkpoint", str(max(steps // 2, 1)), "--do_train", "--resume_from_checkpoint",
               "--log_freq", str(max(steps // 20, 1)), "--json-summary", str(log), "--seed", "42"]
    if phase == 2:
        command += ["--phase2", "--phase1_end_step", str(phase1_steps)]
    if bf16:
        command.append("--bf16")
    command += extra
    print(f"phase {phase}: {steps} steps of {batch} sequences of {seq} tokens"
          f"{' in bf16' if bf16 else ''}", flush=True)
    run(command, again_advice(out, phase1_steps))
    return final_record(log)


def again_advice(out: Path, steps: int) -> str:
    """What a quick-start user does after a stage failed: the same settings go on from what `out` holds."""
    return (f"once that is fixed, run the quick start again with QUICKSTART_STEPS={steps}: it goes on from what "
            f"{out} holds (or move {out} away to start afresh)")


def draw_curves(out: Path, steps: int) -> Path | None:
    """loss_curve.png from the phases' logs; one drawn before a log went is kept (it holds what is lost), and
    with neither log nor picture there is none (None)."""
    logs = [str(log) for log in (out / "dllogger_phase1.json", out / "dllogger_phase2.json") if log.exists()]
    curves = out / "loss_curve.png"
    if len(logs) < 2 and curves.exists():
        print(f"  {curves} kept: a log it was drawn from is gone")
        return curves
    if not logs:
        print("  no log left to draw: the curves are left out")
        return None
    run([sys.executable, str(REPO / "scripts" / "plot_logs.py"), *logs, "-o", str(curves)],
        again_advice(out, steps), stdout=subprocess.DEVNULL)
    return curves


def release_model(checkpoint: Path, vocab: Path, out: Path, steps: int) -> Path:
    """scripts/export_model.py on the final checkpoint: out/release, replacing an earlier quick start's release."""
    release = out / "release"
    casing = ["--do_lower_case"] if vocab.suffix == ".txt" else []  # a BPE tokenizer.json has its own normalizer
    run([sys.executable, str(REPO / "scripts" / "export_model.py"), str(checkpoint), str(release), "--vocab_file",
         str(vocab), *casing, "--model_name", f"quickstart-{out.resolve().name}", "--overwrite"],
        again_advice(out, steps), stdout=subprocess.DEVNULL)
    return release


def fill_mask_demo(checkpoint: Path, config: ModelConfig, vocab: Path, count: int = 5) -> list[dict]:
    """Masks one word in each of `count` held-out sentences and asks the model for it."""
    tokenizer = BertTokenizer(load_vocab(vocab), do_lower_case=True)
    sentences = []
    test_text = layout.text_shard(layout.working_dir(), 2, 1, 0.1, CORPUS, "test", 0)
    for line in test_text.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if 8 <= len(words) <= 30:
            sentences.append(line.strip())
        if len(sentences) == count:
            break
    model = pretraining_model(config).eval()
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["model"])
    ids = tokenizer.vocab.ids
    results = []
    for sentence in sentences:
        pieces = tokenizer.encode(sentence)
        # Mask the longest whole-word token in the middle, a word the context can tell.
        candidates = [i for i, p in enumerate(pieces) if not tokenizer.vocab.tokens[p].startswith("##")
                      and (i + 1 == len(pieces) or not tokenizer.vocab.tokens[pieces[i + 1]].startswith("##"))
                      and tokenizer.vocab.tokens[p].isalpha()]
        if not candidates:
            continue
        target = max(candidates, key=lambda i: len(tokenizer.vocab.tokens[pieces[i]]))
        truth = tokenizer.vocab.tokens[pieces[target]]
        masked = list(pieces)
        masked[target] = ids["[MASK]"]
        input_ids = torch.tensor([[ids["[CLS]"], *masked, ids["[SEP]"]]])
        with torch.no_grad():
            logits = model(input_ids, predict_positions=(input_ids == ids["[MASK]"])).prediction_logits[0]
        guesses = [tokenizer.vocab.tokens[i] for i in logits.topk(5).indices.tolist()]
        shown = " ".join("[MASK]" if i == target else tokenizer.vocab.tokens[p] for i, p in enumerate(pieces))
        results.append({"text": shown.replace(" ##", ""), "answer": truth, "top5": guesses})
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path,
                        help="default: quickstart_output/ (bert) or quickstart_output_modern/ (modern)")
    parser.add_argument("--steps", type=int, default=int(os.environ.get("QUICKSTART_STEPS", 400)),
                        help="phase-1 steps (phase 2 runs a tenth of them); env QUICKSTART_STEPS. An output folder "
                             "holds a run of one step count: another needs another --output_dir")
    parser.add_argument("--family", choices=sorted(TRAINING), default="bert",
                        help="bert: NVIDIA's BERT recipe (default); modern: a small ModernBERT trained the modern way")
    args = parser.parse_args(argv)
    if args.output_dir is None:
        args.output_dir = REPO / ("quickstart_output" if args.family == "bert" else "quickstart_output_modern")
    if args.steps < 2:
        raise InputError(f"--steps/QUICKSTART_STEPS must be at least 2, got {args.steps}")
    return args


def last_parameter(log: Path, key: str) -> int | None:
    """`key` of the newest run's PARAMETER record in a dllogger log; None when the log or the key is missing or
    the log does not read."""
    try:
        records = read_log(log)
    except (OSError, ValueError):
        return None
    values = [r["data"].get(key) for r in records if r.get("step") == "PARAMETER" and isinstance(r.get("data"), dict)]
    return int(values[-1]) if values and values[-1] is not None else None


def recorded_steps(out: Path) -> int | None:
    """The phase-1 step count (QUICKSTART_STEPS) of the quick start whose output `out` holds, newest evidence
    first: phase 2's checkpoints and log (phase 2 follows phase 1's end), then phase 1's; None when `out` holds
    no training yet."""
    saved = survey(out / "checkpoints")
    second = [s for s in saved if s.phase == 2 and s.phase1_end_step is not None]
    if second:
        return second[-1].phase1_end_step
    from_phase2_log = last_parameter(out / "dllogger_phase2.json", "phase1_end_step")
    if from_phase2_log is not None:
        return from_phase2_log
    for first in reversed([s for s in saved if s.phase == 1]):
        max_steps = (load_checkpoint(first.path, mmap=True).get("args") or {}).get("max_steps")
        if max_steps is not None:
            return int(max_steps)
    return last_parameter(out / "dllogger_phase1.json", "max_steps")


def refuse_another_run(out: Path, steps: int, family: str) -> None:
    """One line, before any write, when `out` holds a quick start of another step count or model family: its
    checkpoints and logs are that run's record, and training this one there would mix the two (or, phase 2
    having begun, could not go on at all)."""
    earlier = recorded_steps(out)
    if earlier is None:
        return  # nothing trained here yet: the configs alone are rewritten
    move_away = f"or move {out} away (or pass --output_dir <another folder>) for a new run"
    if earlier != steps:
        raise InputError(f"{out}: holds the quick start run with QUICKSTART_STEPS={earlier}, not {steps}; run it "
                         f"again with QUICKSTART_STEPS={earlier} to reuse or finish that run, {move_away} of "
                         f"{steps} steps")
    config_file = out / "bert_config.json"
    if config_file.is_file():
        earlier_family = "modern" if is_modern_config(config_from_json_file(config_file)) else "bert"
        if earlier_family != family:
            raise InputError(f"{out}: holds the quick start run of --family {earlier_family}, not {family}; pass "
                             f"--family {earlier_family} to reuse or finish that run, {move_away} of --family "
                             f"{family}")


def build_corpus(out: Path, family: str) -> tuple[Path, ModelConfig, Path, Path]:
    """The default corpus's text, vocab and shards; the small model's configs (phase 1, phase 2) sized to that
    vocab (the modern family's rounded up to a multiple of 64, as ModernBERT's)."""
    run([sys.executable, str(REPO / "data" / "build_default_corpus.py"), "--vocab_size", str(VOCAB_SIZE),
         "--dupe_factor", str(DUPE_FACTOR)],
        f"once that is fixed, run the quick start again: it reuses the corpus's complete parts in "
        f"{layout.working_dir()}")
    vocab = vocab_path(layout.working_dir(), CORPUS, True, VOCAB_SIZE)
    tokens = len(load_vocab(vocab))
    if family == "bert":
        values, phase2_values = {**SMALL_BERT, "vocab_size": tokens}, {}
    else:
        values, phase2_values = {**SMALL_MODERN, "vocab_size": -(-tokens // 64) * 64}, MODERN_PHASE2
    configs = []
    for name, settings in (("bert_config.json", values), ("bert_config_phase2.json", {**values, **phase2_values})):
        text = json.dumps(config_from_dict(settings).to_dict(), indent=2, sort_keys=True) + "\n"
        write_atomic(out / name, lambda f, text=text: f.write(text.encode("utf-8")))
        configs.append(out / name)
    return vocab, config_from_dict(values), configs[0], configs[1]


def print_summary(summary: dict, out: Path) -> None:
    print("\nQuick start finished in {seconds} s".format(**summary))
    for phase in ("phase1", "phase2"):
        figures = summary[phase]
        if None in (figures["final_loss"], figures["eval_loss"], figures["eval_mlm_accuracy"]):
            print(f"  {phase}: no figures (its log is gone)")
            continue
        print(f"  {phase}: final loss {figures['final_loss']:.3f}, held-out masked-LM loss "
              f"{figures['eval_loss']:.3f}, accuracy {figures['eval_mlm_accuracy']:.1%}")
    print(f"  model:       {summary['checkpoint']}  (convert: python scripts/convert_checkpoint.py "
          f"{summary['checkpoint']} hf_dir/)")
    print(f"  release:     {summary['release']}  (transformers' AutoModelForMaskedLM loads it; its README.md is "
          "the model card)")
    print(f"  curves:      {summary['loss_curve'] or 'none (no log)'}")
    print(f"  logs:        {out / 'dllogger_phase1.json'}, {out / 'dllogger_phase2.json'}")
    print(f"  shards:      {shard_dir(128, 20, 'training').parent.parent}")
    print(f"  summary:     {out / 'summary.json'}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.time()
    out = args.output_dir
    check_writable_folder(out, "--output_dir")
    refuse_another_run(out, args.steps, args.family)
    out.mkdir(parents=True, exist_ok=True)
    phase1_steps, phase2_steps = args.steps, max(args.steps // 10, 2)

    print(f"== 1/6 default corpus: text, vocab, phase-1 and phase-2 shards ({args.family} family)", flush=True)
    vocab, config, config_path, phase2_config = build_corpus(out, args.family)
    bf16 = detect(recipe_device()).native_bf16  # bf16 only where the hardware computes it natively
    lr1, lr2 = TRAINING[args.family][0]
    print("== 2/6 pre-training phase 1 (seq 128)", flush=True)
    phase1 = pretrain_phase(1, phase1_steps, 64, lr1, out, config_path, bf16, phase1_steps, args.family)
    print("== 3/6 pre-training phase 2 (seq 512)", flush=True)
    phase2 = pretrain_phase(2, phase2_steps, 16, lr2, out, phase2_config, bf16, phase1_steps, args.family)

    print("== 4/6 loss curves", flush=True)
    curves = draw_curves(out, phase1_steps)

    print("== 5/6 fill in the mask on held-out sentences", flush=True)
    final_checkpoint = out / "checkpoints" / f"ckpt_{phase1_steps + phase2_steps}.pt"
    demo = fill_mask_demo(final_checkpoint, config_from_json_file(phase2_config), vocab)
    for item in demo:
        print(f"  {item['text']}\n    answer: {item['answer']:<15} model's top 5: {', '.join(item['top5'])}")

    print("== 6/6 release the model: a folder transformers loads, with its model card", flush=True)
    release = release_model(final_checkpoint, vocab, out, phase1_steps)

    figures = ("final_loss", "eval_loss", "eval_mlm_accuracy", "training_sequences_per_second")
    summary = {"phase1": {k: phase1.get(k) for k in figures}, "phase2": {k: phase2.get(k) for k in figures},
               "fill_mask": demo, "checkpoint": str(final_checkpoint), "loss_curve": curves and str(curves),
               "release": str(release), "vocab": str(vocab), "config": str(config_path),
               "seconds": round(time.time() - started, 1)}
    text = json.dumps(summary, indent=2) + "\n"
    write_atomic(out / "summary.json", lambda f: f.write(text.encode("utf-8")))
    print_summary(summary, out)


if __name__ == "__main__":
    run_cli(main)
