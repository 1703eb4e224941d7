#!/usr/bin/env python3
"""Per-token activations of chosen layers of a BERT as JSON lines (Google's and NVIDIA's extract_features.py).

The command is bertrecipe/cli/extract_features.py (also the console script after `pip install -e .`); `--help`
lists its flags."""
from bertrecipe.cli.entry import extract_features

if __name__ == "__main__":
    extract_features()
