#!/usr/bin/env python3
"""Fine-tuning and evaluation of BERT on the GLUE tasks (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, MNLI-mm, QNLI,
RTE, WNLI).

The command is bertrecipe/cli/run_glue.py (also the console script after `pip install -e .`); `--help` lists its
flags."""
from bertrecipe.cli.entry import run_glue

if __name__ == "__main__":
    run_glue()
