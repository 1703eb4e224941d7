#!/usr/bin/env python3
"""Converts BERT weights between our checkpoints, NVIDIA's checkpoints and Hugging Face directories.

The command is bertrecipe/cli/convert_checkpoint.py (also the console script after `pip install -e .`); `--help`
lists its flags."""
from bertrecipe.cli.entry import convert_checkpoint

if __name__ == "__main__":
    convert_checkpoint()
