#!/usr/bin/env python3
"""General distillation: a smaller student learns a teacher's states on the pre-training shards (NVIDIA's
distillation/general_distill.py, with run_pretraining.py's flags besides its own).

The command is bertrecipe/cli/general_distill.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import general_distill

if __name__ == "__main__":
    general_distill()
