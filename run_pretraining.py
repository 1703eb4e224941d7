#!/usr/bin/env python3
"""BERT pre-training (masked LM + next sentence) with LAMB, mixed precision, gradient accumulation and DDP.

The command is bertrecipe/cli/run_pretraining.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import run_pretraining

if __name__ == "__main__":
    run_pretraining()
