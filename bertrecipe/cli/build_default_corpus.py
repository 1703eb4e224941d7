"""One command from nothing to pre-training shards, with no download: the embedded default corpus.

    python data/build_default_corpus.py [--n_processes 2] [--vocab_size 8192]

Text that ships with the Python interpreter (bertrecipe/dataprep/default_corpus.py) -> formatted text -> an uncased
WordPiece vocab trained on it -> 2 training + 1 test text shards -> phase-1 (128/20) and phase-2 (512/80) HDF5
shards, all under $BERT_PREP_WORKING_DIR (default `data/`). Prints where each product went.
"""
from __future__ import annotations

import time
from typing import NoReturn

from bertrecipe.cli import bert_prep as bertPrep
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.dataprep import layout
from bertrecipe.dataprep.vocab_training import vocab_path

CORPUS = "python_docs"
SHARDS = ["--n_training_shards", "2", "--n_test_shards", "1", "--fraction_test_set", "0.1"]
PHASES = {"phase1": ("128", "20"), "phase2": ("512", "80")}


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(prog="build_default_corpus.py", description=__doc__.split("\n")[0])
    p.add_argument("--n_processes", type=int, default=2)
    p.add_argument("--vocab_size", type=int, default=8192)
    p.add_argument("--dupe_factor", type=int, default=5)
    args = p.parse_args(argv)
    started = time.perf_counter()
    root = layout.working_dir()
    vocab = vocab_path(root, CORPUS, True, args.vocab_size)
    common = ["--dataset", CORPUS, "--do_lower_case", "1"]
    text = layout.formatted_text(root, CORPUS)
    if text.is_file():  # written atomically, so whole; reading the standard library again takes seconds
        print(f"text {text} exists, reused")
    else:
        bertPrep.main(["--action", "text_formatting", *common])
    if vocab.is_file():  # a vocab is never retrained under shards and models that use it (training is not
        print(f"vocab {vocab} exists, reused")  # deterministic across runs: tie order varies)
    else:
        bertPrep.main(["--action", "create_vocab", *common, "--vocab_size", str(args.vocab_size),
                       "--vocab_file", str(vocab)])
    bertPrep.main(["--action", "sharding", *common, *SHARDS])
    for phase, (seq, preds) in PHASES.items():
        print(f"{phase}: max_seq_length {seq}, max_predictions_per_seq {preds}")
        bertPrep.main(["--action", "create_hdf5_files", *common, *SHARDS, "--vocab_file", str(vocab),
                       "--max_seq_length", seq, "--max_predictions_per_seq", preds,
                       "--dupe_factor", str(args.dupe_factor), "--n_processes", str(args.n_processes)])
    print(f"default corpus ready in {time.perf_counter() - started:.0f} s")
    print(f"  text:  {text}")
    print(f"  vocab: {vocab}")
    for phase, (seq, preds) in PHASES.items():
        params = layout.InstanceParams(True, int(seq), int(preds), 0.15, 12345, args.dupe_factor)
        print(f"  {phase} --input_dir {layout.hdf5_split_dir(root, params, CORPUS, 'training')}")


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
