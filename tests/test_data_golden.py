"""create_pretraining_data's output is pinned: speed work must not change a single instance for a given seed.

The digests below were computed with the implementation of commit ad3a628 (before the vectorised tokenizer,
the bisecting pair loop and the threshold masking), on real book text mixed with lines that take every
tokenizer path: non-ASCII, control characters, lines that strip to nothing, very long words. A change of
output must be deliberate: recompute the digests and say why in the commit. They were recomputed once, when the
WordPiece word limit went from 100 to Google's 200 characters: the 101-character word of AWKWARD, one [UNK]
before, became 51 pieces (the book text itself has no word over 100 characters), and AWKWARD gained a line with
words of 200 and 201 characters. Those digests are over two whole books with the full vocabulary (../shared/data):
they are the integration tier.

EXCERPT_GOLDEN pins the same output on what every clone has: the two book excerpts of tests/data/books (all their
lines, AWKWARD spliced in every 37 lines so that each of its lines occurs) tokenized with tests/data's vocab
excerpt, same settings. Those digests were computed with the code of commit 13f095f (whose uncased, cased and
whole-word output over the whole books still matched GOLDEN above), not with an older implementation.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import pytest

from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard
from bertrecipe.pretraining.shard_schema import SHARD_ARRAYS
from helpers import TEST_DATA, VOCAB_EXCERPT

AWKWARD = [
    "Café naïve résumé — “quoted” ¿Qué? 中文字符 ΟΔΟΣ ΣΟΦΟΣ \ue000private",
    "control\x00chars\x01in\x07the\x1bmiddle\x7fof words and\x0bvertical\x0cfeed",
    "\x1c", " \t ", "\x01", "\u2028", "\u00a0",  # blank to Python's strip, or only removed characters
    "a" * 100 + " " + "b" * 101 + " " + "x" * 17 + ", " + "antidisestablishmentarianism" * 3 + "!",
    "c" * 200 + " " + "d" * 201 + " end",  # at and just over WordPiece's 200-character limit
    "Tabs\tand\rcarriage returns, (brackets) [MASK] [CLS] don't--stop...",
]

GOLDEN = {
    "uncased": "264103a97e204be5739e8c16024354a849a9162ba40b2748a0db71bae61c016c",
    "cased": "8b43b63eeabeff65ce3cb40329cf99706b23e653f0c1898b5c7f2d553e802a6c",
    "whole_word": "2ae0fd3f765db45dc3c861182c7934d6a2ab8b8b1c5d1deaab89789cc602a199",
}


EXCERPT_GOLDEN = {  # about 320 instances each
    "cased": "e7121460fecf274b77c09a91ca445943ca2a5a9195467dc3e0d196db2609f682",
    "uncased": "08951f3ae0a5ae723a895481fdc446f7bd42ebcf47402cd087f2f734c555e580",
    "whole_word": "66a925f2fc9f75361d8a3f2f701aad9424eb6273a44b159deb45aa72a337728d",
}


def _golden_input(books: Path, path: Path, cut: slice, every: int) -> None:
    """Raw lines of two books (blank lines end documents) with AWKWARD lines spliced in every `every` lines."""
    lines: list[str] = []
    for name in ("pg11.txt", "pg1661.txt"):
        text = (books / name).read_text(encoding="utf-8")
        lines += [line.strip() for line in text.split("\n")[cut]]
    for i in range(0, len(lines), every):
        lines[i] = AWKWARD[(i // every) % len(AWKWARD)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def shard_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with h5py.File(path, "r") as f:
        for key in SHARD_ARRAYS:
            array = f[key][:]
            digest.update(f"{key}{array.dtype.str}{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def make_golden_shard(shared_data: Path | None, folder: Path, variant: str, compression: str = "none") -> Path:
    """The pinned shard: over the whole books with the full vocab, or (shared_data None) over the excerpts."""
    text, out = folder / "golden.txt", folder / f"{variant}-{compression}.hdf5"
    if shared_data is None:
        _golden_input(TEST_DATA / "books", text, slice(None), 37)
        vocab = VOCAB_EXCERPT
    else:
        _golden_input(shared_data / "books", text, slice(200, 2200), 97)
        vocab = shared_data / "minilm" / "vocab.txt"
    # The cased variant keeps the case with the uncased vocab, as when it was pinned: only with the override now.
    create_shard(ShardConfig(text, out, vocab, do_lower_case=variant != "cased", max_seq_length=128,
                             max_predictions_per_seq=20, dupe_factor=2, random_seed=4321,
                             whole_word_masking=variant == "whole_word", compression=compression,
                             allow_vocab_mismatch=variant == "cased"),
                 progress=False)
    return out


@pytest.mark.parametrize("variant", sorted(GOLDEN))
def test_output_is_unchanged(variant, shared_data, tmp_path):
    assert shard_digest(make_golden_shard(shared_data, tmp_path, variant)) == GOLDEN[variant]


@pytest.mark.parametrize("variant", sorted(EXCERPT_GOLDEN))
def test_output_on_the_excerpts_is_unchanged(variant, tmp_path):
    assert shard_digest(make_golden_shard(None, tmp_path, variant)) == EXCERPT_GOLDEN[variant]


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compression_does_not_change_the_output(compression, tmp_path):
    assert shard_digest(make_golden_shard(None, tmp_path, "uncased", compression)) == EXCERPT_GOLDEN["uncased"]
