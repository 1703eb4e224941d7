"""What several benchmarks share: the checkout's and the shared data's paths, the middle of measurements and the
step timer, the host line, shards made by the recipe's own data/create_pretraining_data.py, run_pretraining.py's
closing record, a benchmark run as a module in a fresh interpreter, this process's memory figures, and JSON
results.

Loading this module imports the standard library alone: the functions that need torch, h5py or bertrecipe import
them when called, so that the child processes that measure their own peak memory (inference_memory.py's) carry
nothing they would not have carried before.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

if TYPE_CHECKING:
    from bertrecipe.common.hardware import Host

REPO = Path(__file__).resolve().parents[1]
# The large real data the integration tier uses (../shared/data in the development checkout), as in the tests.
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
SHARED_VOCAB = SHARED / "minilm" / "vocab.txt"  # BERT's whole uncased vocab
SHARED_BOOK = SHARED / "books" / "pg1342.txt"
VOCAB_EXCERPT = REPO / "tests" / "data" / "vocab-uncased-excerpt.txt"  # tracked: there on every checkout
MASKED_PER_SEQ = {128: 20, 512: 80}  # NVIDIA's max_predictions_per_seq at its two lengths

T = TypeVar("T")


def middle(values: Iterable[T], key: Callable[[T], Any] | None = None) -> T:
    """The middle of the sorted values, the upper one of an even count: always one of the measurements (a round
    that really ran, an lr that was tried), never the mean of two."""
    ordered = sorted(values, key=key)
    return ordered[len(ordered) // 2]


def time_steps(step: Callable[[], object], warmup: int, steps: int) -> float:
    """Seconds per step: the middle of `steps` timed calls after `warmup` untimed ones. The step must wait for its
    own device work (model_throughput.Trainer.step does) for the clock to count it."""
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return middle(times)


def host_threads_line(host: Host, precision: str) -> str:
    """The host line (device, precision, torch) and torch's thread count, which CPU figures depend on."""
    import torch

    from bertrecipe.common.hardware import host_line

    return f"{host_line(host, precision)}, {torch.get_num_threads()} threads"


def write_json(path: Path, data: Any) -> None:
    """Results as indented JSON ending in a newline (paths and other values JSON lacks as text), the folder made
    where missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


# --- shards -----------------------------------------------------------------------------------------------------

def masked_per_seq(seq: int) -> int:
    """Masked positions per sequence: NVIDIA's 20 at 128 and 80 at 512, else 15 %."""
    return MASKED_PER_SEQ.get(seq, max(1, round(seq * 0.15)))


def default_corpus_documents(max_chars: int | None = None) -> list[str]:
    """The embedded default corpus's articles, each a document, in its fixed order, up to about max_chars."""
    from bertrecipe.dataprep.default_corpus import articles

    documents, chars = [], 0
    for article in articles():
        if max_chars is not None and chars >= max_chars:
            break
        documents.append(article)
        chars += len(article)
    return documents


def shards_of_documents(documents: list[str], vocab: Path, seq: int, out: Path, name: str = "corpus",
                        dupe_factor: int = 1, timeout: float | None = None) -> Path:
    """A training shard of `documents` (one sentence a line by the recipe's splitter, a blank line between
    documents) at `seq`, masked as NVIDIA's 128/20 and 512/80 (else 15 %), in out/seq<seq>/."""
    from bertrecipe.dataprep.sharding import split_sentences

    folder = out / f"seq{seq}"
    folder.mkdir(parents=True, exist_ok=True)
    sentences = out / f"{name}_sentences.txt"
    sentences.write_text("\n\n".join("\n".join(split_sentences(d)) for d in documents) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, str(REPO / "data" / "create_pretraining_data.py"), "--input_file", str(sentences),
                    "--output_file", str(folder / "bench_training_0.hdf5"), "--vocab_file", str(vocab),
                    "--max_seq_length", str(seq), "--max_predictions_per_seq", str(masked_per_seq(seq)),
                    "--dupe_factor", str(dupe_factor), "--compression", "none"],
                   check=True, capture_output=True, timeout=timeout)
    return folder


def make_shards(text: Path, vocab: Path, seq: int, out: Path) -> Path:
    """The book through the recipe's own formatting and sentence splitting (one document, as bertPrep makes it),
    so that sequences fill up as on Wikipedia instead of ending at every paragraph of the raw file."""
    from bertrecipe.dataprep.text_formatting import book_text

    return shards_of_documents([book_text(text)], vocab, seq, out, text.stem)


def real_token_fraction(folder: Path) -> float:
    """The share of the positions of the folder's shards that hold a token rather than padding."""
    import h5py
    import numpy as np

    masks = []
    for path in sorted(folder.glob("*.hdf5")):
        with h5py.File(path) as f:
            masks.append(f["input_mask"][()])
    return float(np.mean(np.concatenate(masks)))


# --- processes --------------------------------------------------------------------------------------------------

def closing_record(log: Path) -> dict[str, Any]:
    """The data of the record run_pretraining.py logs once training ends (step []): the whole run's figures."""
    from bertrecipe.training.metric_logger import read_log

    return next(r["data"] for r in read_log(log) if r.get("step") == [])


def loop_sequences_per_second(log: Path) -> float:
    """run_pretraining.py's training sequences per second, from its closing record (its first two steps, the
    warm-up, not counted)."""
    return float(closing_record(log)["training_sequences_per_second"])


def benchmark_command(name: str, *args: str) -> list[str]:
    """`python -m benchmarks.<name> args...` in this interpreter: a benchmark, or a benchmark's own child
    measurement, in a fresh process. Run it with cwd=REPO, where `-m` finds the package."""
    return [sys.executable, "-m", f"benchmarks.{name}", *args]


def status_bytes(field: str) -> int:
    """A memory figure of this process (VmRSS, VmHWM: /proc/self/status gives kB), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")
