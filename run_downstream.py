#!/usr/bin/env python3
"""A checkpoint judged on every GLUE task, SQuAD v1.1/v2.0 and retrieval data found in --data_dir, over a preset's
grid of learning rates and seeds (the BERT paper's, ModernBERT's, a small CPU one), into one Markdown and one JSON
table.

The command is bertrecipe/cli/run_downstream.py (also the console script after `pip install -e .`); `--help` lists
its flags; docs/downstream.md explains the table."""
from bertrecipe.cli.entry import run_downstream

if __name__ == "__main__":
    run_downstream()
