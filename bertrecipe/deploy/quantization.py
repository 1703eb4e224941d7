"""int8 models for CPU inference: an fp32 ONNX export (onnx_export's SQuAD and GLUE graphs, embedding_export's
embedding graph, of either family) with its matrix products in int8 by ONNX Runtime's dynamic quantization. Each
linear layer's MatMul becomes DynamicQuantizeLinear + MatMulInteger: its weight stored as int8 with one scale per
output column, its input quantized to uint8 per batch at run time, the product summed in int32 (VNNI's vpdpbusd on
AVX-512 VNNI or AVX-VNNI CPUs) and scaled back to fp32. Attention's two activation products (Q.K^T and P.V) are
quantized the same way, both sides at run time, one scale each. Softmax, layer norms, GELU and the embeddings stay
fp32. Inputs and outputs are the export's own: whatever runs the fp32 file runs this one (inference.py
--onnx_model, run_squad.py/run_glue.py --onnx_model, Triton's onnxruntime backend).

Why these options: `python -m benchmarks.int8_inference` measures the alternatives (per-tensor scales,
reduce_range, uint8 weights, embeddings in int8, attention's activation products in fp32, ORT's transformer fusions
first) and docs/benchmarks.md has the figures behind each choice."""
from __future__ import annotations

import logging
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError

# Nodes that only a quantized graph holds (ORT's dynamic and static formats): a second quantization is refused.
QUANTIZED_OPS = frozenset({"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "QLinearMatMul",
                           "QuantizeLinear", "DequantizeLinear", "QAttention", "MatMulIntegerToFloat"})


@dataclass(frozen=True)
class Int8Options:
    """ORT dynamic quantization's choices. The defaults are the chosen ones; the others are here to be measured."""

    op_types: tuple[str, ...] = ("MatMul",)  # ("MatMul", "Gather"): the embedding tables in int8 too
    per_channel: bool = True  # one weight scale per output column: per matrix lost 1.5 points of SST-2 accuracy
    reduce_range: bool = False  # 7-bit weights: only for CPUs without VNNI, whose u8*s8 pairs can saturate
    weight_type: str = "int8"  # or "uint8"
    activation_products: bool = True  # attention's Q.K^T and P.V too, as Optimum does: faster, accuracy kept


CHOSEN = Int8Options()


def load_onnx(path: Path):
    """The ONNX model in a file; an InputError naming it when it is none."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        return onnx.load(str(path))
    except FileNotFoundError:
        raise InputError(f"{path}: ONNX model not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not an ONNX model") from None
    except (DecodeError, ValueError, RuntimeError) as error:  # protobuf's parse failure, onnx's own checks
        raise InputError(f"{path}: not an ONNX model ({str(error).splitlines()[0] if str(error) else 'unparsable'})"
                         ) from None


def is_int8(model) -> bool:
    """Whether an ONNX model (a ModelProto) was quantized: it holds one of QUANTIZED_OPS."""
    return any(node.op_type in QUANTIZED_OPS for node in model.graph.node)


def onnx_precision(path: Path) -> str:
    """"int8" or "fp32": what an ONNX file runs in, for the commands that report it."""
    return "int8" if is_int8(load_onnx(path)) else "fp32"


def check_quantizable(model, source: str) -> None:
    """InputError naming source unless the model is an fp32 graph with a weight MatMul to quantize."""
    if is_int8(model):
        raise InputError(f"{source}: already quantized (it holds int8 nodes); quantize the fp32 export instead")
    initializers = {tensor.name for tensor in model.graph.initializer}
    if not any(node.op_type == "MatMul" and node.input[1] in initializers for node in model.graph.node):
        raise InputError(f"{source}: no MatMul with a weight matrix to quantize; not a BERT export")


@contextmanager
def quiet_root_logger():
    """quantize_dynamic logs advice (pre-processing, shape inference) on the root logger: not for our users."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantized_bytes(fp32_model: bytes, source: str, options: Int8Options = CHOSEN) -> bytes:
    """The int8 ONNX model (serialized) of an fp32 one; source names it in errors."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        model = onnx.load_from_string(fp32_model)
    except Exception as error:  # protobuf's DecodeError and onnx's checks
        raise InputError(f"{source}: not an ONNX model ({str(error).splitlines()[0] if str(error) else 'unparsable'})"
                         ) from None
    check_quantizable(model, source)
    weight_type = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[options.weight_type]
    with tempfile.TemporaryDirectory(prefix="int8-") as scratch:
        # quantize_dynamic writes a file; a scratch folder, so that nothing half-written lands beside the target
        target = Path(scratch) / "model.onnx"
        with quiet_root_logger():
            quantize_dynamic(model, target, op_types_to_quantize=list(options.op_types),
                             per_channel=options.per_channel, reduce_range=options.reduce_range,
                             weight_type=weight_type,
                             extra_options={"MatMulConstBOnly": not options.activation_products})
        return target.read_bytes()


def quantize_file(source: Path, target: Path, overwrite: bool = False, options: Int8Options = CHOSEN) -> None:
    """Writes the int8 model of the fp32 ONNX file source to target, whole or not at all; an existing target is
    replaced only with overwrite (the flag --overwrite, as convert_checkpoint's)."""
    if Path(source).resolve() == Path(target).resolve():
        raise InputError(f"{target}: is the fp32 model being quantized; write the int8 model to another file")
    if Path(target).exists() and not overwrite:
        raise InputError(f"{target}: exists; pass --overwrite to replace it")
    fp32 = load_onnx(Path(source)).SerializeToString()
    int8 = quantized_bytes(fp32, str(source), options)
    write_atomic(target, lambda f: f.write(int8))
