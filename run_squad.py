#!/usr/bin/env python3
"""Fine-tuning BERT for SQuAD v1.1 / v2.0 question answering, prediction and evaluation.

The command is bertrecipe/cli/run_squad.py (also the console script after `pip install -e .`); `--help` lists its
flags."""
from bertrecipe.cli.entry import run_squad

if __name__ == "__main__":
    run_squad()
