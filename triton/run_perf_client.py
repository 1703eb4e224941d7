#!/usr/bin/env python3
"""Latency and throughput of a Triton-served BERT across batch sizes and concurrency: CSV + PNG.

The command is bertrecipe/cli/triton_perf_client.py (also the console script after `pip install -e .`); `--help`
lists its flags."""
from bertrecipe.cli.entry import triton_perf_client

if __name__ == "__main__":
    triton_perf_client()
