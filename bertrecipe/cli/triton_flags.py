"""The flags of a Triton server that the Triton clients share (triton/client.py, run_squad_client.py,
run_perf_client.py), and the client they describe."""
from __future__ import annotations

import argparse

from bertrecipe.deploy.serving import TritonQA


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by the Triton clients."""
    p.add_argument("--url", default="127.0.0.1:8000", help="host:port of Triton's HTTP (8000) or gRPC (8001) port")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--model_name", default="bert")
    p.add_argument("--model_version", default="", help="default: the server's choice")
    p.add_argument("--batch_size", type=int, default=8, help="windows per request (<= the model's max_batch_size)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")


def check_server(args: argparse.Namespace) -> None:
    """InputError, naming the URL, unless the server of add_server_arguments' flags has the model ready. Its
    client is closed at once: clients report a dead server before long preparations, without an idle
    connection meanwhile."""
    probe = client_from_args(args)
    try:
        probe.check_ready()
    finally:
        probe.close()


def client_from_args(args: argparse.Namespace) -> TritonQA:
    """The client that add_server_arguments' flags describe."""
    return TritonQA(args.url, args.model_name, args.protocol, args.model_version, args.timeout)
