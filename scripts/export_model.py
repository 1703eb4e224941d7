#!/usr/bin/env python3
"""Release a checkpoint as a folder that transformers, sentence-transformers and ONNX Runtime load, with a model card.

The command is bertrecipe/cli/export_model.py (also the console script after `pip install -e .`); `--help` lists its
flags, and docs/release.md walks through it."""
from bertrecipe.cli.entry import export_model

if __name__ == "__main__":
    export_model()
