#!/usr/bin/env python3
"""Prepare BERT pre-training data, with NVIDIA's actions and flags.

The command is bertrecipe/cli/bert_prep.py (also the console script after `pip install -e .`); `--help` lists its
flags."""
from bertrecipe.cli.entry import bert_prep

if __name__ == "__main__":
    bert_prep()
