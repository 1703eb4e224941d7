#!/usr/bin/env python3
"""Dense retrieval: an embedding model (mean or [CLS] pooling) scored on a BEIR-layout folder (nDCG@10, MRR@10,
recall@100), optionally fine-tuned first with in-batch negatives; corpus embeddings and ONNX exported.

The command is bertrecipe/cli/run_retrieval.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import run_retrieval

if __name__ == "__main__":
    run_retrieval()
