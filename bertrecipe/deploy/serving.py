"""What the Triton scripts (triton/*.py) share: the model's tensor names, a runner for an exported model file, the
function the server binds to it (make_infer), the client of a Triton server (TritonQA; its flags are
cli/triton_flags.py's), and real SQuAD windows to send.

Imports only numpy at top level (onnxruntime, torch, tritonclient or the tokenizer's stack when used), so that
triton/server.py runs in the server environment (.venv-triton, triton/requirements-server.txt), which has no
tokenizers package and not the training stack.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from bertrecipe.common.errors import InputError

if TYPE_CHECKING:
    from bertrecipe.finetuning import squad

INPUTS = ("input__0", "input__1", "input__2")  # int64 [batch, seq]: token ids, segment ids, attention mask
OUTPUTS = ("output__0", "output__1")  # float32 SQuAD start and end logits [batch, seq]; GLUE: output__0 alone

SAMPLE_QUESTIONS = ("Where do the gentry of the county visit?", "Who came to the house that morning?")
SAMPLE_CONTEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
    "of a wife. However little known the feelings or views of such a man may be on his first entering a "
    "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
    "the rightful property of some one or other of their daughters. The gentry of the county visit the assembly "
    "rooms at Meryton every month, and that morning a young man of large fortune from the north of England came "
    "down on Monday in a chaise and four to see the place."
)


def runner_for(path: Path, fmt: str) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    """A function that runs the exported file (fmt "onnx" or "torchscript") on int64 arrays, as Triton's
    backend would."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda arrays: session.run(None, dict(zip(INPUTS, arrays, strict=True)))
    import torch

    loaded = torch.jit.load(str(path))

    def run(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in loaded(*(torch.from_numpy(a) for a in arrays))]
    return run


def make_infer(run: Callable[[Sequence[np.ndarray]], list[np.ndarray]], outputs: int,
               max_seq_length: int) -> Callable[[list], list[dict[str, np.ndarray]]]:
    """The function triton/server.py binds to the model: requests of the three int64 [B, S] inputs ->
    [{output__i: float32 logits}] per request. Requests that the dynamic batcher gathered may differ in length: they
    are zero-padded (mask 0) to the longest, run together, and each answer is cut back to its request's rows and
    length."""

    def infer(requests: list) -> list[dict[str, np.ndarray]]:
        batches = []
        for request in requests:
            arrays = [np.asarray(request[name], dtype=np.int64) for name in INPUTS]
            if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 2:
                raise ValueError(f"inputs must share one [batch, seq] shape, got {[a.shape for a in arrays]}")
            if arrays[0].shape[1] > max_seq_length:
                raise ValueError(f"sequence length {arrays[0].shape[1]} exceeds the server's limit {max_seq_length}")
            batches.append(arrays)
        longest = max(arrays[0].shape[1] for arrays in batches)
        joined = [np.concatenate([np.pad(arrays[i], ((0, 0), (0, longest - arrays[i].shape[1])))
                                  for arrays in batches]) for i in range(len(INPUTS))]
        results = [np.asarray(r, dtype=np.float32) for r in run(joined)[:outputs]]
        answers, first = [], 0
        for arrays in batches:
            rows, length = arrays[0].shape
            # SQuAD's outputs are per token ([B, S]): cut back to the request's length; GLUE's [B, labels] not.
            # Copies: the server sizes each output from a contiguous buffer of its own.
            answers.append({f"output__{i}": np.ascontiguousarray(r[first:first + rows, :length] if outputs == 2
                                                                 else r[first:first + rows])
                            for i, r in enumerate(results)})
            first += rows
        return answers
    return infer


def sample_inputs(tokenizer: Any, predict_file: Optional[str], window: squad.WindowSettings,
                  count: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Real windows (ids, segments, mask as int64 [N, L]) from a SQuAD file, else from the built-in paragraph."""
    from bertrecipe.finetuning import squad  # the tokenizer's stack, which the server environment lacks

    if predict_file:
        examples = squad.read_squad_examples(predict_file, is_training=False, version_2_with_negative=True)
    else:
        words, _ = squad.split_context(SAMPLE_CONTEXT)
        examples = [squad.SquadExample(str(i), q, words, [], context_id=0) for i, q in enumerate(SAMPLE_QUESTIONS)]
    features = squad.convert_examples_to_features(examples[:count], tokenizer, window)
    if len(features) == 0:
        raise InputError(f"{predict_file or 'sample'}: no features to check the export with")
    rows = slice(0, count)
    return tuple(np.asarray(a[rows], dtype=np.int64) for a in (features.input_ids, features.segment_ids,
                                                              features.input_mask))


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
        for name, array in zip(INPUTS, arrays, strict=True):
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
