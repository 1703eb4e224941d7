#!/usr/bin/env python3
"""Answers one question about a context with a BERT QA model served by Triton (HTTP or gRPC).

The command is bertrecipe/cli/triton_client.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import triton_client

if __name__ == "__main__":
    triton_client()
