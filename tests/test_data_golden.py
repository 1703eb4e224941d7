"""create_pretraining_data's output is pinned: speed work must not change a single instance for a given seed.

The digests below were computed with the implementation of commit ad3a628 (before the vectorised tokenizer,
the bisecting pair loop and the threshold masking), on real book text mixed with lines that take every
tokenizer path: non-ASCII, control characters, lines that strip to nothing, very long words. A change of
output must be deliberate: recompute the digests and say why in the commit.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import pytest

from data.create_pretraining_data import ShardConfig, create_shard
from data.shard_writer import KEYS

AWKWARD = [
    "Café naïve résumé — “quoted” ¿Qué? 中文字符 ΟΔΟΣ ΣΟΦΟΣ \ue000private",
    "control\x00chars\x01in\x07the\x1bmiddle\x7fof words and\x0bvertical\x0cfeed",
    "\x1c", " \t ", "\x01", "\u2028", "\u00a0",  # blank to Python's strip, or only removed characters
    "a" * 100 + " " + "b" * 101 + " " + "x" * 17 + ", " + "antidisestablishmentarianism" * 3 + "!",
    "Tabs\tand\rcarriage returns, (brackets) [MASK] [CLS] don't--stop...",
]

GOLDEN = {
    "uncased": "7a3ec9b718c14158a53c94c2057a16d38bfa8f12c2217e8e7d88c7bacd8370d7",
    "cased": "d0e520f226aceb9c2ec0cc62a94229559c1f6a6f5b5e19fd43925be169667560",
    "whole_word": "aecc232d7f82f15fa57a1588128276c903c369a4bb06fb8deadd78dff7ab4dd3",
}


def _golden_input(shared_data: Path, path: Path) -> None:
    """Raw lines of two books (blank lines end documents) with AWKWARD lines spliced in every 97 lines."""
    lines: list[str] = []
    for name in ("pg11.txt", "pg1661.txt"):
        text = (shared_data / "books" / name).read_text(encoding="utf-8")
        lines += [line.strip() for line in text.split("\n")[200:2200]]
    for i in range(0, len(lines), 97):
        lines[i] = AWKWARD[(i // 97) % len(AWKWARD)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def shard_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with h5py.File(path, "r") as f:
        for key in KEYS:
            array = f[key][:]
            digest.update(f"{key}{array.dtype.str}{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def make_golden_shard(shared_data: Path, folder: Path, variant: str, compression: str = "none") -> Path:
    text, out = folder / "golden.txt", folder / f"{variant}-{compression}.hdf5"
    if not text.exists():
        _golden_input(shared_data, text)
    vocab = shared_data / "minilm" / "vocab.txt"
    create_shard(ShardConfig(text, out, vocab, do_lower_case=variant != "cased", max_seq_length=128,
                             max_predictions_per_seq=20, dupe_factor=2, random_seed=4321,
                             whole_word_masking=variant == "whole_word", compression=compression),
                 progress=False)
    return out


@pytest.mark.parametrize("variant", sorted(GOLDEN))
def test_output_is_unchanged(variant, shared_data, tmp_path):
    assert shard_digest(make_golden_shard(shared_data, tmp_path, variant)) == GOLDEN[variant]


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compression_does_not_change_the_output(compression, shared_data, tmp_path):
    assert shard_digest(make_golden_shard(shared_data, tmp_path, "uncased", compression)) == GOLDEN["uncased"]
