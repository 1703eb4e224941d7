#!/usr/bin/env python3
"""Draws loss, learning-rate, throughput and evaluation curves from dllogger JSON logs (pre-training or
fine-tuning) to a PNG.

The command is bertrecipe/cli/plot_logs.py (also the console script after `pip install -e .`); `--help` lists its
flags."""
from bertrecipe.cli.entry import plot_logs

if __name__ == "__main__":
    plot_logs()
