"""Peak memory and wall time of inference.py on long contexts: 10,000, 30,000 and 100,000 words by default.

A small random SQuAD model (hidden 32, 2 layers, 2 heads, the vocab excerpt tests/data/vocab-uncased-excerpt.txt)
is saved once in a temporary folder; the context is the two book chapters of tests/data/books repeated to the
wanted number of words. Each size runs inference.py's main() in a fresh Python process, which reports its own peak
resident memory (VmHWM of /proc/self/status: imports, model, features and answers together) and the wall time of
main() (model loading, features, the forward passes in fp32 on the CPU, answers). The memory of one question about
a context should grow linearly with the context; the goal is 100,000 words within 1 GB.

    python -m benchmarks.inference_memory                       # 10k, 30k, 100k words
    python -m benchmarks.inference_memory --words 1000 100000 --max_seq_length 384 --doc_stride 128
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, VOCAB_EXCERPT, benchmark_command, status_bytes

BOOKS = REPO / "tests" / "data" / "books"
MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 512, "type_vocab_size": 2}
QUESTION = "Who went down the rabbit hole?"


def save_model(folder: Path) -> None:
    """A seeded random BertForQuestionAnswering as run_squad.py saves one (pytorch_model.bin, bert_config.json)."""
    import torch

    from bertrecipe.finetuning.staged_outputs import save_finetuned
    from bertrecipe.model.bert import BertConfig, BertForQuestionAnswering

    vocab_size = sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8"))
    config = BertConfig.from_dict({**MODEL, "vocab_size": vocab_size})
    torch.manual_seed(0)
    save_finetuned(BertForQuestionAnswering(config), config, folder)


def write_context(path: Path, words: int) -> None:
    """The books' words, repeated until there are `words` of them."""
    source = " ".join(p.read_text(encoding="utf-8") for p in sorted(BOOKS.glob("*.txt"))).split()
    repeated = (source * (words // len(source) + 1))[:words]
    path.write_text(" ".join(repeated), encoding="utf-8")


def measure_one(argv: list[str]) -> dict:
    """Runs inference.main(argv) here; its wall time, peak memory and answer's window count."""
    from bertrecipe.cli import inference

    out = io.StringIO()
    began = time.perf_counter()
    with contextlib.redirect_stdout(out):
        inference.main(argv)
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "peak_rss": status_bytes("VmHWM"), "windows": json.loads(out.getvalue())["windows"]}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--words", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    p.add_argument("--max_seq_length", type=int, default=384)
    p.add_argument("--doc_stride", type=int, default=128)
    p.add_argument("--one", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # the child: inference.py's flags
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return
    import torch

    print(f"CPU {cpu_model()} ({len(__import__('os').sched_getaffinity(0))} cores usable), torch {torch.__version__}, "
          f"fp32, max_seq_length {args.max_seq_length}, doc_stride {args.doc_stride}")
    print(f"{'words':>8} {'windows':>8} {'peak RSS (MB)':>14} {'wall (s)':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_model(folder / "model")
        for words in args.words:
            context = folder / f"context_{words}.txt"
            write_context(context, words)
            flags = ["--init_checkpoint", str(folder / "model" / "pytorch_model.bin"), "--vocab_file",
                     str(VOCAB_EXCERPT), "--do_lower_case", "--question", QUESTION, "--context_file", str(context),
                     "--max_seq_length", str(args.max_seq_length), "--doc_stride", str(args.doc_stride)]
            done = subprocess.run(benchmark_command("inference_memory", "--one", *flags), capture_output=True,
                                  text=True, cwd=REPO)
            if done.returncode != 0:
                raise SystemExit(f"{words} words: inference failed: {done.stderr.strip()[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{words:>8} {row['windows']:>8} {row['peak_rss'] / 1e6:>14.0f} {row['seconds']:>9.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
