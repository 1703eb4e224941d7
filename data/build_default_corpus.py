#!/usr/bin/env python3
"""One command from nothing to pre-training shards, with no download: the embedded default corpus.

The command is bertrecipe/cli/build_default_corpus.py (also the console script after `pip install -e .`); `--help`
lists its flags."""
from bertrecipe.cli.entry import build_default_corpus

if __name__ == "__main__":
    build_default_corpus()
