#!/usr/bin/env python3
"""Exports a fine-tuned SQuAD (or GLUE) checkpoint to a Triton Inference Server model repository.

The command is bertrecipe/cli/triton_deployer.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import triton_deployer

if __name__ == "__main__":
    triton_deployer()
