"""The int8 benchmark's peers, run by benchmarks/int8_inference.py in their own environments (made by
benchmarks/peer_envs/make_peer_envs.sh), never by the tests. Each takes a Hugging Face folder of the benchmark's own
fine-tuned weights, exports and quantizes it its own way, and runs the same token ids with the same threads:

- optimum: Optimum's ONNX export (optimum-onnx) and ORTQuantizer with AutoQuantizationConfig.avx512_vnni, dynamic,
  per-tensor (Optimum's documented recipe for this CPU; `int8`) and per-channel (the same config with
  per_channel=True, the accuracy our default keeps; `int8_per_channel`), run on ONNX Runtime sessions as ours are;
- openvino: optimum-intel's OpenVINO export and OVQuantizer's static int8 (NNCF, transformer preset, calibrated on
  the benchmark's calibration rows), compiled for the CPU with fp32 as the precision of what stays unquantized
  (OpenVINO's default on a CPU with bf16 would be bf16, which is not the fp32 baseline).

    python -m benchmarks.peer_envs.int8_peer prepare --engine optimum --model_dir HF_FOLDER --task classification \
        --work_dir W --evaluate EVAL.npz --calibration CALIB.npz
    python -m benchmarks.peer_envs.int8_peer time --engine optimum --work_dir W --batch BATCH.npz --threads 2 \
        --steps 1=20 32=4 --output TIMES.json

prepare writes W/fp32, W/int8 (and W/int8_per_channel for optimum), W/eval_outputs.npz (each precision's outputs
on EVAL.npz's rows, as `<precision>_<output index>`) and W/versions.json; time writes the seconds per batch of each
precision and batch size (the middle of the timed steps, benchmarks.common.time_steps). The .npz files hold int64
arrays `ids`, `segments`, `mask` [rows, length]. Imports only numpy, the standard library, benchmarks.common
(standard library alone) and the peer's own packages.
"""
from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.common import time_steps

TASKS = ("classification", "question-answering")
PRECISIONS = {"optimum": ("fp32", "int8", "int8_per_channel"), "openvino": ("fp32", "int8")}
PACKAGES = {"optimum": ("optimum-onnx", "optimum", "transformers", "onnxruntime", "torch"),
            "openvino": ("optimum-intel", "optimum", "transformers", "openvino", "nncf", "torch")}


def read_rows(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: np.ascontiguousarray(data[name], dtype=np.int64) for name in ("ids", "segments", "mask")}


def feed_of(rows: dict[str, np.ndarray], first: int = 0, count: int | None = None) -> dict[str, np.ndarray]:
    """transformers' input names for rows[first:first + count]."""
    cut = slice(first, None if count is None else first + count)
    return {"input_ids": rows["ids"][cut], "attention_mask": rows["mask"][cut], "token_type_ids": rows["segments"][cut]}


def prepare_optimum(model_dir: Path, task: str, work: Path) -> None:
    from optimum.onnxruntime import ORTModelForQuestionAnswering, ORTModelForSequenceClassification, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    model_class = ORTModelForSequenceClassification if task == "classification" else ORTModelForQuestionAnswering
    model_class.from_pretrained(model_dir, export=True).save_pretrained(work / "fp32")
    for folder, per_channel in (("int8", False), ("int8_per_channel", True)):
        quantizer = ORTQuantizer.from_pretrained(work / "fp32")
        quantizer.quantize(save_dir=work / folder, quantization_config=AutoQuantizationConfig.avx512_vnni(
            is_static=False, per_channel=per_channel))


def prepare_openvino(model_dir: Path, task: str, work: Path, calibration: dict[str, np.ndarray]) -> None:
    import nncf
    from optimum.intel import (
        OVConfig,
        OVModelForQuestionAnswering,
        OVModelForSequenceClassification,
        OVQuantizationConfig,
        OVQuantizer,
    )

    model_class = OVModelForSequenceClassification if task == "classification" else OVModelForQuestionAnswering
    model = model_class.from_pretrained(model_dir, export=True)
    model.save_pretrained(work / "fp32")
    rows = len(calibration["ids"])
    samples = [feed_of(calibration, i, 1) for i in range(rows)]
    config = OVConfig(quantization_config=OVQuantizationConfig(num_samples=rows))
    OVQuantizer.from_pretrained(model).quantize(calibration_dataset=nncf.Dataset(samples), ov_config=config,
                                                save_directory=work / "int8")


def runner(engine: str, folder: Path, threads: int) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """A function from transformers-named inputs to the model's outputs, on `threads` threads."""
    if engine == "optimum":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        [path] = sorted(folder.glob("*.onnx"))
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [node.name for node in session.get_inputs()]
        return lambda feed: session.run(None, {name: feed[name] for name in names})
    import openvino

    compiled = openvino.Core().compile_model(str(folder / "openvino_model.xml"), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
    names = [port.get_any_name() for port in compiled.inputs]
    request = compiled.create_infer_request()

    def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        result = request.infer({name: feed[name] for name in names})
        return [np.asarray(result[port]) for port in compiled.outputs]
    return run


def evaluate(engine: str, work: Path, rows: dict[str, np.ndarray], threads: int, batch: int = 32) -> None:
    outputs: dict[str, np.ndarray] = {}
    for precision in PRECISIONS[engine]:
        run = runner(engine, work / precision, threads)
        parts = [run(feed_of(rows, first, batch)) for first in range(0, len(rows["ids"]), batch)]
        for index in range(len(parts[0])):
            outputs[f"{precision}_{index}"] = np.concatenate([p[index] for p in parts]).astype(np.float32)
    np.savez(work / "eval_outputs.npz", **outputs)


def prepare(args: argparse.Namespace) -> None:
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if args.engine == "optimum":
        prepare_optimum(Path(args.model_dir), args.task, work)
    else:
        prepare_openvino(Path(args.model_dir), args.task, work, read_rows(Path(args.calibration)))
    evaluate(args.engine, work, read_rows(Path(args.evaluate)), args.threads)
    versions = {name: version(name) for name in PACKAGES[args.engine]}
    (work / "versions.json").write_text(json.dumps(versions, indent=1) + "\n", encoding="utf-8")


def time_precisions(args: argparse.Namespace) -> None:
    work, rows = Path(args.work_dir), read_rows(Path(args.batch))
    steps = dict(pair.split("=") for pair in args.steps)
    times: dict[str, Any] = {}
    for precision in PRECISIONS[args.engine]:
        run = runner(args.engine, work / precision, args.threads)
        times[precision] = {size: time_steps(lambda s=int(size), r=run: r(feed_of(rows, 0, s)), 2, int(count))
                            for size, count in steps.items()}
    Path(args.output).write_text(json.dumps(times) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("prepare", "time"))
    parser.add_argument("--engine", choices=tuple(PACKAGES), required=True)
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--model_dir", help="prepare: a Hugging Face folder (config.json, model.safetensors)")
    parser.add_argument("--task", choices=TASKS, default="classification")
    parser.add_argument("--evaluate", help="prepare: .npz of the rows whose outputs are kept")
    parser.add_argument("--calibration", help="prepare, openvino: .npz of the calibration rows")
    parser.add_argument("--batch", help="time: .npz of the timed rows (the largest batch size of them)")
    parser.add_argument("--steps", nargs="+", default=["1=20", "32=4"], help="time: BATCH_SIZE=STEPS pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", help="time: the JSON file of seconds per batch")
    args = parser.parse_args()
    (prepare if args.action == "prepare" else time_precisions)(args)


if __name__ == "__main__":
    main()
