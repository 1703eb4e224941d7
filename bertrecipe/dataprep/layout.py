"""Where data preparation puts things under $BERT_PREP_WORKING_DIR (interfaces section 1).

Every writer and reader of shards takes its paths from here, so the names cannot drift apart.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("training", "test")


def working_dir() -> Path:
    """$BERT_PREP_WORKING_DIR, default `data/` in the checkout (NVIDIA's convention), made absolute where it is read
    (at the start), so that what a command records names the same files from any folder."""
    return Path(os.environ.get("BERT_PREP_WORKING_DIR") or REPO_ROOT / "data").absolute()


@dataclass(frozen=True)
class InstanceParams:
    """The parameters that name an HDF5 directory; two runs with equal params write the same files."""

    do_lower_case: bool
    max_seq_length: int
    max_predictions_per_seq: int
    masked_lm_prob: float
    random_seed: int
    dupe_factor: int
    document_chunks: bool = False  # masked-LM-only rows: only the tokenizer, L and the seed name the directory
    bpe: bool = False  # document chunks tokenized by a BPE tokenizer.json (cased; do_lower_case unused)


def hdf5_dir(root: str | Path, params: InstanceParams) -> Path:
    """`<root>/hdf5_lower_case_<0|1>_seq_len_<L>_max_pred_<P>_masked_lm_prob_<p>_random_seed_<s>_dupe_factor_<d>`;
    document chunks: `<root>/hdf5_document_chunks_<lower_case_<0|1>|bpe>_seq_len_<L>_random_seed_<s>`."""
    if params.document_chunks:
        tokenizer = "bpe" if params.bpe else f"lower_case_{int(params.do_lower_case)}"
        return Path(root) / (f"hdf5_document_chunks_{tokenizer}_seq_len_{params.max_seq_length}"
                             f"_random_seed_{params.random_seed}")
    name = (f"hdf5_lower_case_{int(params.do_lower_case)}_seq_len_{params.max_seq_length}"
            f"_max_pred_{params.max_predictions_per_seq}_masked_lm_prob_{float(params.masked_lm_prob)}"
            f"_random_seed_{params.random_seed}_dupe_factor_{params.dupe_factor}")
    return Path(root) / name


def hdf5_split_dir(root: str | Path, params: InstanceParams, corpus: str, split: str) -> Path:
    """The directory `run_pretraining.py --input_dir` is pointed at: `<hdf5_dir>/<corpus>/<split>`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return hdf5_dir(root, params) / corpus / split


def hdf5_shard(root: str | Path, params: InstanceParams, corpus: str, split: str, index: int) -> Path:
    """`<hdf5_dir>/<corpus>/<split>/<corpus>_<split>_<index>.hdf5`."""
    return hdf5_split_dir(root, params, corpus, split) / f"{corpus}_{split}_{index}.hdf5"


def formatted_text(root: str | Path, corpus: str) -> Path:
    """One article (or book) per line, articles separated by a blank line."""
    return Path(root) / "formatted_one_article_per_line" / f"{corpus}_one_article_per_line.txt"


def sharded_dir(root: str | Path, n_training: int, n_test: int, fraction_test: float) -> Path:
    return Path(root) / f"sharded_training_shards_{n_training}_test_shards_{n_test}_fraction_{float(fraction_test)}"


def text_shard(root: str | Path, n_training: int, n_test: int, fraction_test: float, corpus: str, split: str,
               index: int) -> Path:
    """One sentence per line, documents separated by a blank line (the input of create_pretraining_data)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return sharded_dir(root, n_training, n_test, fraction_test) / corpus / f"{corpus}_{split}_{index}.txt"


def download_dir(root: str | Path) -> Path:
    return Path(root) / "download"
