#!/usr/bin/env python3
"""Task distillation: a student learns a fine-tuned teacher's states, then its predictions, on a GLUE task or SQuAD
(NVIDIA's distillation/task_distill.py).

The command is bertrecipe/cli/task_distill.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import task_distill

if __name__ == "__main__":
    task_distill()
