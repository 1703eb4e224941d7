#!/usr/bin/env python3
"""A pre-trained checkpoint's masked-LM and next-sentence accuracy on HDF5 shards (NVIDIA's
run_pretraining_inference.py flags).

The command is bertrecipe/cli/run_pretraining_inference.py (also the console script after `pip install -e .`);
`--help` lists its flags."""
from bertrecipe.cli.entry import run_pretraining_inference

if __name__ == "__main__":
    run_pretraining_inference()
