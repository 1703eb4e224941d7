#!/usr/bin/env python3
"""SQuAD evaluation exactly as the official evaluate-v1.1.py and evaluate-v2.0.py compute it, as a drop-in
command line.

The command is bertrecipe/cli/evaluate_squad.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import evaluate_squad

if __name__ == "__main__":
    evaluate_squad()
