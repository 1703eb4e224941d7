"""Serves an exported BERT (deployer.py's model.onnx or model.pt) from a real Triton server on a CPU machine.

    bash triton/setup_server_env.sh    # once: .venv-triton with triton/requirements-server.txt
    .venv-triton/bin/python triton/server.py --model_file triton/model_repository/bert/1/model.onnx \
        --model_name bert --http_port 8000 --grpc_port 8001 --metrics_port 8002

PyPI's nvidia-pytriton starts the Triton Inference Server it bundles (Python backend) and binds a Python
function that runs the model with ONNX Runtime (model.onnx) or TorchScript (model.pt). It runs in its own
environment with NumPy 1: the bundled backend's stub cannot return outputs under NumPy 2 (refused at start).
The tensors are those of deployer.py's config.pbtxt (input__0..2 int64 [batch, seq]; output__0..1 float32),
so the same clients work against a GPU Triton serving the model repository. Listens on 127.0.0.1 only unless
--address says otherwise; requests hold at most --max_batch_size rows (Triton refuses more) of at most
--max_seq_length tokens. Stops on SIGINT or SIGTERM.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import sysconfig
from pathlib import Path
from typing import NoReturn, Optional, Sequence

import numpy as np

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.deploy.serving import INPUTS, make_infer, runner_for


def require_numpy_1() -> None:
    """pytriton 0.7.0's bundled Python backend stub reads NumPy 1's array descriptors: under NumPy 2 every
    output it returns is empty, so the server would answer every request wrongly. Refused up front."""
    if int(np.__version__.split(".")[0]) >= 2:
        raise InputError(f"NumPy {np.__version__} in {sys.executable}: pytriton 0.7.0's bundled Python backend "
                         "cannot return outputs under NumPy 2; run the server with .venv-triton/bin/python "
                         "(created by `bash triton/setup_server_env.sh`)")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_file", required=True, help="model.onnx or model.pt written by deployer.py")
    p.add_argument("--model_name", default="bert")
    p.add_argument("--outputs", type=int, default=2, help="2 for SQuAD (start, end logits), 1 for GLUE")
    p.add_argument("--address", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--http_port", type=int, default=8000)
    p.add_argument("--grpc_port", type=int, default=8001)
    p.add_argument("--metrics_port", type=int, default=8002)
    p.add_argument("--max_batch_size", type=int, default=8)
    p.add_argument("--max_seq_length", type=int, default=512, help="longest accepted request")
    p.add_argument("--max_queue_delay_us", type=int, default=100, help="dynamic batching: wait to fill a batch")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of the model")
    args = p.parse_args(argv)
    suffix = Path(args.model_file).suffix
    if suffix not in (".onnx", ".pt"):
        raise InputError(f"{args.model_file}: expected a .onnx or .pt file written by deployer.py")
    if not Path(args.model_file).is_file():
        raise InputError(f"{args.model_file}: no such model file")
    if args.max_batch_size < 1 or args.max_seq_length < 1:
        raise InputError("--max_batch_size and --max_seq_length must be at least 1")
    return args


def serve(args: argparse.Namespace) -> None:
    # The bundled server's Python backend links against libpython; without its folder the model fails to load.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    if args.model_file.endswith(".pt"):
        import torch

        torch.set_num_threads(args.threads)
    run = runner_for(Path(args.model_file), "onnx" if args.model_file.endswith(".onnx") else "torchscript")
    config = TritonConfig(http_address=args.address, http_port=args.http_port, grpc_address=args.address,
                          grpc_port=args.grpc_port, metrics_address=args.address, metrics_port=args.metrics_port,
                          allow_gpu_metrics=False, exit_timeout_secs=10)
    inputs = [Tensor(name=name, dtype=np.int64, shape=(-1,)) for name in INPUTS]
    outputs = [Tensor(name=f"output__{i}", dtype=np.float32, shape=(-1,)) for i in range(args.outputs)]
    batcher = DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us)
    with Triton(config=config) as triton:
        triton.bind(model_name=args.model_name, infer_func=make_infer(run, args.outputs, args.max_seq_length),
                    inputs=inputs, outputs=outputs,
                    config=ModelConfig(max_batch_size=args.max_batch_size, batcher=batcher), strict=True)
        print(f"serving {args.model_name} on http://{args.address}:{args.http_port} and "
              f"grpc {args.address}:{args.grpc_port}", flush=True)
        triton.serve()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # pytriton's serve() stops the server and its workers on KeyboardInterrupt only


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    require_numpy_1()
    signal.signal(signal.SIGTERM, _interrupt)
    serve(args)


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
