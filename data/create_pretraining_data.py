#!/usr/bin/env python3
"""Make one HDF5 pre-training shard from text (one sentence per line, blank line between documents).

The command is bertrecipe/cli/create_pretraining_data.py (also the console script after `pip install -e .`);
`--help` lists its flags."""
from bertrecipe.cli.entry import create_pretraining_data

if __name__ == "__main__":
    create_pretraining_data()
