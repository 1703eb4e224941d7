#!/usr/bin/env python3
"""SQuAD evaluation exactly as the official evaluate-v1.1.py and evaluate-v2.0.py compute it, importable and as
a drop-in command line:

The command is bertrecipe/finetuning/squad_metrics.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.finetuning.squad_metrics import cli

if __name__ == "__main__":
    cli()
