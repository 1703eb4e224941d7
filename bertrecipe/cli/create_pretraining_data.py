"""Make one HDF5 pre-training shard from text (one sentence per line, blank line between documents).

Same flags as NVIDIA's script: --input_file (file, directory of .txt, or Google's comma-separated list and globs)
--output_file --vocab_file --do_lower_case --max_seq_length --max_predictions_per_seq --masked_lm_prob
--short_seq_prob --dupe_factor --random_seed, plus --whole_word_masking, and --document_chunks: rows of whole
documents for masked-LM-only training (no sentence pairs, masked as they are read; --vocab_file may then be a
byte-level BPE tokenizer.json). --vocab_file may be a WordPiece tokenizer.json wherever a vocab.txt is (its model type
says which kind a .json is). Bad input: exit status 2 and one line on stderr, before anything is written. The
shard is made by bertrecipe/dataprep/create_pretraining_data.py.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.cli.record_flags import RECORD_FLAGS, add_record_arguments, selection_from
from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard


def parse_args(argv: list[str] | None = None) -> ShardConfig:
    p = ArgumentParser(prog="create_pretraining_data.py", description=__doc__.split("\n")[0])
    p.add_argument("--input_file", required=True,
                   help="a text file (one sentence a line, a blank line between documents), a Parquet or JSON Lines "
                        "file (.jsonl, .json, also .gz or .zst; one record a document), a folder that datasets' "
                        "save_to_disk wrote, a folder of such files, or (as Google's) a comma-separated list of "
                        "files, folders and glob patterns")
    p.add_argument("--output_file", type=Path, required=True, help="the .hdf5 shard to write")
    p.add_argument("--vocab_file", type=Path, required=True,
                   help="BERT vocab.txt or a WordPiece tokenizer.json (a released BERT folder's: the same shards as "
                        "its vocab.txt), or with --document_chunks a byte-level BPE tokenizer.json (bertPrep.py "
                        "--action create_vocab --vocab_type bpe)")
    p.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction, default=True,
                   help="uncased model (default; --no-do_lower_case for cased)")
    p.add_argument("--allow_vocab_mismatch", action="store_true",
                   help="warn instead of refusing a casing the WordPiece vocab contradicts (an uncased vocab with "
                        "--no-do_lower_case, a cased one without it): e.g. to finish a set of shards made so before")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20)
    p.add_argument("--masked_lm_prob", type=float, default=0.15)
    p.add_argument("--short_seq_prob", type=float, default=0.1)
    p.add_argument("--dupe_factor", type=int, default=10)
    p.add_argument("--random_seed", type=int, default=12345)
    p.add_argument("--whole_word_masking", action="store_true", help="mask all pieces of a word together")
    p.add_argument("--document_chunks", action="store_true",
                   help="masked-LM-only shards: each document's tokens cut into rows of [CLS] up to max_seq_length - 2 "
                        "tokens [SEP], no sentence pairs, no masks (train with run_pretraining.py --dynamic_masking "
                        "--no_nsp); --max_predictions_per_seq, --masked_lm_prob, --short_seq_prob and --dupe_factor "
                        "are unused")
    p.add_argument("--compression", choices=("gzip", "lzf", "none"), default="none",
                   help="HDF5 compression: none (default, fastest; files ~12x the size of the text at "
                        "dupe_factor 5), gzip level 1 with byte shuffle (~4x smaller, readable by any HDF5 "
                        "library as NVIDIA's files, but writing then takes about as long as all the rest), "
                        "lzf with byte shuffle (h5py only, ~3x smaller, half the time of gzip). Readers accept all")
    add_record_arguments(p)
    a = p.parse_args(argv)
    settings = {key: value for key, value in vars(a).items() if key not in RECORD_FLAGS}
    return ShardConfig(**settings, selection=selection_from(a))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    result = create_shard(cfg)
    mb = result.input_bytes / 1e6
    what = "document chunks" if cfg.document_chunks else "instances"
    if result.records is not None:
        counts = result.records
        print(f"{counts.kept} of {counts.records} records kept as documents ({counts.dropped()})")
    print(f"wrote {result.instances} {what} to {result.output_file} "
          f"({mb:.1f} MB of input in {result.seconds:.1f} s, {mb / max(result.seconds, 1e-9):.2f} MB/s)")


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
