#!/usr/bin/env python3
"""Prepare BERT pre-training data, with NVIDIA's actions and flags.

The command is bertrecipe/cli/bert_prep.py (also the console script after `pip install -e .`); `--help` lists its
flags."""
from bertrecipe.cli.bert_prep import cli

if __name__ == "__main__":
    cli()
