#!/usr/bin/env python3
"""Task distillation's data augmentation (TinyBERT's method), with NVIDIA's flags: writes train_aug.tsv beside a
GLUE task's train.tsv (SQuAD: train-v1.1_aug.json) for task distillation's --aug_train.

The command is bertrecipe/cli/data_augmentation.py (also the console script after `pip install -e .`); `--help`
lists its flags."""
from bertrecipe.cli.entry import data_augmentation

if __name__ == "__main__":
    data_augmentation()
