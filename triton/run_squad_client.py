#!/usr/bin/env python3
"""SQuAD prediction through a Triton server: a SQuAD JSON file -> predictions.json -> exact match and F1.

The command is bertrecipe/cli/triton_squad_client.py (also the console script after `pip install -e .`); `--help`
lists its flags."""
from bertrecipe.cli.entry import triton_squad_client

if __name__ == "__main__":
    triton_squad_client()
