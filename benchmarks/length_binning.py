"""Real (non-padding) tokens per second of the whole pre-training loop at seq 512, with and without
--bin_by_length, on the same samples: both runs train the same steps of the same stream, so the ratio of their
throughputs is the ratio of real tokens per second.

Shards: the embedded default corpus's phase-2 shards (data/build_default_corpus.py, made in a temporary folder),
or any folder of seq-512 shards given with --input_dir.

    python -m benchmarks.length_binning                       # 4 layers, hidden 256, bf16 where the CPU has it
    python -m benchmarks.length_binning --input_dir DIR --config_file bert_configs/base.json --steps 6
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py

from benchmarks.common import REPO, loop_sequences_per_second, real_token_fraction
from bertrecipe.common.hardware import detect, host_line, pick_precisions, recipe_device

SMALL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
         "max_position_embeddings": 512, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def default_shards(work: Path) -> Path:
    env = {**os.environ, "BERT_PREP_WORKING_DIR": str(work)}
    subprocess.run([sys.executable, str(REPO / "data" / "build_default_corpus.py")], env=env, check=True,
                   capture_output=True)
    return next(work.glob("hdf5_*seq_len_512*/*/training"))


def throughput(args: argparse.Namespace, folder: Path, config: Path, work: Path, binned: bool) -> float:
    """Sequences per second of run_pretraining.py (its final record: the steps after the first two)."""
    out = work / ("binned" if binned else "plain")
    command = [sys.executable, str(REPO / "run_pretraining.py"), "--input_dir", str(folder), "--config_file",
               str(config), "--output_dir", str(out), "--max_seq_length", "512", "--max_predictions_per_seq", "80",
               "--train_batch_size", str(args.batch), "--gradient_accumulation_steps", str(args.accumulation),
               "--max_steps", str(args.steps), "--learning_rate", "1e-3", "--do_train", "--skip_checkpoint",
               "--disable_progress_bar", "--json-summary", str(out / "log.json")]
    command += (["--bf16"] if args.precision == "bf16" else []) + (["--bin_by_length"] if binned else [])
    subprocess.run(command, check=True, capture_output=True)
    rate = loop_sequences_per_second(out / "log.json")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_dir", type=Path, help="seq-512 training shards (default: the embedded corpus's)")
    p.add_argument("--config_file", type=Path, help="model config (default: 4 layers, hidden 256)")
    p.add_argument("--batch", type=int, default=64, help="per step, before accumulation")
    p.add_argument("--accumulation", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--precision", choices=("bf16", "fp32"),
                   help="default: bf16 where the hardware has it natively, else fp32")
    args = p.parse_args()
    host = detect(recipe_device())  # run_pretraining.py trains on the GPU when there is one
    args.precision = pick_precisions(host, [args.precision] if args.precision else None, ["bf16"])[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = args.input_dir or default_shards(work / "prep")
        config = args.config_file or work / "config.json"
        if not args.config_file:
            vocab = int(h5py.File(next(folder.glob("*.hdf5"))).attrs.get("vocab_size", 30522))
            config.write_text(json.dumps({**SMALL, "vocab_size": vocab}))
        real = real_token_fraction(folder) * 512
        results = {False: [], True: []}
        for _ in range(args.repeats):  # alternated, so that a busy moment of the machine hits both
            for binned in (False, True):
                results[binned].append(throughput(args, folder, config, work, binned))
    shards = args.input_dir or "the embedded corpus's phase-2 shards"
    print(f"{host_line(host, args.precision)}; {shards}; {real:.0f} real tokens per "
          f"sequence of 512; batch {args.batch} x accumulation {args.accumulation}, {args.steps} steps")
    for binned in (False, True):
        best = max(results[binned])
        print(f"  {'binned' if binned else 'plain ':6s}  {best:8.2f} seq/s  {best * real:10,.0f} real tokens/s")
    print(f"  ratio {max(results[True]) / max(results[False]):.2f}x")


if __name__ == "__main__":
    main()
