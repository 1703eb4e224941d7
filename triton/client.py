#!/usr/bin/env python3
"""Answers one question about a context with a BERT QA model served by Triton (HTTP or gRPC).

    python triton/client.py --vocab_file vocab.txt --do_lower_case --question "Who ...?" --context "..." \
        --url 127.0.0.1:8000 --protocol http --model_name bert

The context is cut into the same sliding windows as inference.py and run_squad.py (squad.py), the windows are
sent to the server's input__0..2 (int64 ids, segments, mask) and its output__0/1 (start/end logits) become an
answer with the same n-best extraction as inference.py (squad_answers.py). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Optional, Sequence

import numpy as np

from bertrecipe import squad
from bertrecipe import squad_answers
from bertrecipe.errors import ArgumentParser, InputError, read_text_file, run_cli
from bertrecipe.finetuning import load_tokenizer
from bertrecipe.inference import keep_document_logits

INPUTS = ("input__0", "input__1", "input__2")
OUTPUTS = ("output__0", "output__1")


class TritonQA:
    """Start and end logits of SQuAD windows from a Triton model, batch_size windows per request."""

    def __init__(self, url: str, model_name: str, protocol: str = "http", model_version: str = "",
                 timeout_s: float = 60.0) -> None:
        if protocol == "grpc":
            import tritonclient.grpc as client_module
        elif protocol == "http":
            import tritonclient.http as client_module
        else:
            raise InputError(f"--protocol must be http or grpc, not {protocol!r}")
        from tritonclient.utils import InferenceServerException

        if "://" in url:  # tritonclient refuses it, and its half-made client then prints a traceback on exit
            raise InputError(f"--url {url}: give host:port, without the scheme (e.g. 127.0.0.1:8000)")
        self.module = client_module
        self.server_error = InferenceServerException
        self.url, self.protocol = url, protocol
        self.model_name, self.model_version, self.timeout_s = model_name, model_version, timeout_s
        try:
            if protocol == "http":
                self.client = client_module.InferenceServerClient(url, connection_timeout=timeout_s,
                                                                  network_timeout=timeout_s)
            else:
                self.client = client_module.InferenceServerClient(url)
        except InferenceServerException as error:
            raise InputError(f"--url {url}: {error.message()}") from None

    def unreachable(self, error: BaseException) -> Optional[InputError]:
        """The one-line report for a connection failure (refused, unknown host, timed out), else None: errors
        the server itself returned stay InferenceServerException."""
        if isinstance(error, TimeoutError) or (isinstance(error, self.server_error)
                                               and error.status() == "StatusCode.DEADLINE_EXCEEDED"):
            return InputError(f"Triton server {self.url} ({self.protocol}): no answer within {self.timeout_s:g} s "
                              "(--timeout)")
        if isinstance(error, OSError):  # HTTP: refused, reset, unknown host
            reason = error.strerror or str(error) or type(error).__name__
        elif isinstance(error, self.server_error) and error.status() == "StatusCode.UNAVAILABLE":  # gRPC
            reason = error.message() or "unavailable"
        else:
            return None
        return InputError(f"Triton server {self.url} ({self.protocol}) unreachable: {reason}; is it running, and "
                          f"is --url its {self.protocol} port?")

    def check_ready(self) -> None:
        """InputError, naming the URL, unless the server answers and has the model ready."""
        try:
            ready = self.client.is_model_ready(self.model_name, self.model_version)
        except Exception as error:
            report = self.unreachable(error)
            if report is None:
                raise
            raise report from None
        if not ready:
            version = f" version {self.model_version}" if self.model_version else ""
            raise InputError(f"Triton server {self.url}: model {self.model_name!r}{version} is not ready "
                             "(--model_name, --model_version)")

    def infer(self, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """One request: three int [B, L] arrays -> (start, end) float32 [B, L]."""
        inputs = []
        for name, array in zip(INPUTS, arrays):
            tensor = self.module.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(np.ascontiguousarray(array, dtype=np.int64))
            inputs.append(tensor)
        outputs = [self.module.InferRequestedOutput(name) for name in OUTPUTS]
        extra = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        try:
            result = self.client.infer(self.model_name, inputs, model_version=self.model_version, outputs=outputs,
                                       **extra)
        except Exception as error:
            report = self.unreachable(error)
            if report is None:
                raise
            raise report from None
        start, end = (result.as_numpy(name) for name in OUTPUTS)
        return start.astype(np.float32), end.astype(np.float32)

    def logits(self, features: squad.SquadFeatures, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Start and end logits, float32 [N, L], of every window."""
        starts, ends = [], []
        for first in range(0, len(features), batch_size):
            rows = slice(first, first + batch_size)
            start, end = self.infer((features.input_ids[rows], features.segment_ids[rows],
                                     features.input_mask[rows]))
            starts.append(start)
            ends.append(end)
        return np.concatenate(starts), np.concatenate(ends)

    def close(self) -> None:
        self.client.close()


def answer_question(qa: TritonQA, tokenizer: Any, question: str, context: str,
                    window: squad.WindowSettings = squad.WindowSettings(),
                    answer: squad_answers.AnswerSettings = squad_answers.AnswerSettings(),
                    batch_size: int = 8) -> dict[str, Any]:
    """{"question", "answer", "nbest", "windows"} (+ "null_odds" for SQuAD 2.0), as inference.py gives."""
    words, _ = squad.split_context(context)
    examples = [squad.SquadExample("0", question, words, [], context_id=0)]
    features = squad.convert_examples_to_features(examples, tokenizer, window)
    if len(features) == 0:
        raise InputError("the context is empty (no word pieces)")
    start, end = qa.logits(features, batch_size)
    start, end = keep_document_logits(features, start), keep_document_logits(features, end)
    predictions = squad_answers.extract_answers(examples, features, start, end, tokenizer.vocab, answer)
    result: dict[str, Any] = {"question": question, "answer": predictions.answers["0"],
                              "nbest": predictions.nbest["0"], "windows": len(features)}
    if answer.version_2_with_negative:
        result["null_odds"] = predictions.null_odds["0"]
    return result


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by the Triton clients."""
    p.add_argument("--url", default="127.0.0.1:8000", help="host:port of Triton's HTTP (8000) or gRPC (8001) port")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--model_name", default="bert")
    p.add_argument("--model_version", default="", help="default: the server's choice")
    p.add_argument("--batch_size", type=int, default=8, help="windows per request (<= the model's max_batch_size)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(p)
    p.add_argument("--vocab_file", required=True)
    p.add_argument("--do_lower_case", action="store_true")
    p.add_argument("--question", required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--context")
    source.add_argument("--context_file")
    p.add_argument("--max_seq_length", type=int, default=384)
    p.add_argument("--doc_stride", type=int, default=128)
    p.add_argument("--max_query_length", type=int, default=64)
    p.add_argument("--n_best_size", type=int, default=20)
    p.add_argument("--max_answer_length", type=int, default=30)
    p.add_argument("--version_2_with_negative", action="store_true")
    p.add_argument("--null_score_diff_threshold", type=float, default=0.0)
    args = p.parse_args(argv)
    context = args.context if args.context is not None else read_text_file(args.context_file, "--context_file")
    tokenizer = load_tokenizer(args.vocab_file, args.do_lower_case)
    qa = TritonQA(args.url, args.model_name, args.protocol, args.model_version, args.timeout)
    try:
        qa.check_ready()
        result = answer_question(
            qa, tokenizer, args.question, context,
            squad.WindowSettings(args.max_seq_length, args.doc_stride, args.max_query_length),
            squad_answers.AnswerSettings(args.n_best_size, args.max_answer_length, args.do_lower_case,
                                         args.version_2_with_negative, args.null_score_diff_threshold),
            args.batch_size)
    finally:
        qa.close()
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    run_cli(main)
