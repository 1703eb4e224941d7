#!/usr/bin/env python3
"""Serves an exported BERT (deployer.py's model.onnx or model.pt) from a real Triton server on a CPU machine.

The command is bertrecipe/cli/triton_server.py (also the console script after `pip install -e .`); `--help` lists
its flags."""
from bertrecipe.cli.entry import triton_server

if __name__ == "__main__":
    triton_server()
