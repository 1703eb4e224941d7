#!/usr/bin/env python3
"""Question answering from the command line with a SQuAD-fine-tuned BERT (NVIDIA's inference.py flags).

The command is bertrecipe/cli/inference.py (also the console script after `pip install -e .`); `--help` lists its
flags."""
from bertrecipe.cli.entry import inference

if __name__ == "__main__":
    inference()
