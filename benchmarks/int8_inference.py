"""int8 against fp32 inference on this CPU: sequences per second at 128 tokens (batch 1 and a serving batch of 32)
and the accuracy kept, for a BERT teacher (the released MiniLM, 6 x 384) and a student of every other layer (3 x
384), with the recipe's own commands, beside two peers on the same weights, the same token ids and the same
threads: transformers' BERT exported and quantized as Optimum does it (ONNX Runtime), and OpenVINO int8 through
optimum-intel, each in its own environment (bash benchmarks/peer_envs/make_peer_envs.sh; a missing one is
reported and skipped).

    python -m benchmarks.int8_inference                       # everything: about 30 minutes on 2 cores
    python -m benchmarks.int8_inference --skip_squad --peers  # SST-2 and speed only, no peers

Models (benchmarks/int8_models.py, reused when already made): each fine-tuned with run_glue.py on a subset of SST-2,
the teacher also with run_squad.py on SQuAD v1.1 (the first dev articles train, the last 8 score). Each is exported
by triton/deployer.py twice, fp32 and --int8, and scored by run_glue.py/run_squad.py --onnx_model; the teacher as an
embedding model by run_retrieval.py --export_onnx [--int8] (cosine to the fp32 embeddings, top-10 neighbours kept).
The quantization options (per-channel, reduce_range, uint8 weights, int8 embeddings, attention's activation
products in fp32, ORT's transformer fusions first) are each measured on the SST-2 teacher: accuracy and speed.

Speed: every engine in turns for --rounds rounds (ours in this process; each peer a process per round), the middle
round reported, and a ratio of two engines the middle of the rounds' own ratios; threads: this process's usable
cores (--threads). Writes results.json and table.md to --output_dir.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from benchmarks.common import REPO, middle, time_steps, write_json
from benchmarks.int8_models import TEACHER, FineTuning, fine_tuned_models

SEQ = 128  # the timed length
SQUAD_SEQ = 256  # the SQuAD teacher's windows (FineTuning.squad_seq)
BATCH_SIZES = (1, 32)
STEPS = {1: 20, 32: 4}  # timed calls per round at each batch size (after 2 untimed ones)
PEERS = ("optimum", "openvino")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def isa_line(cpuinfo: str) -> str:
    """The int8-relevant instruction sets among /proc/cpuinfo's flags: int8 speed depends on VNNI."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            flags.update(line.split(":", 1)[1].split())
    present = [flag for flag in ("avx2", "avx512f", "avx512_bf16", *VNNI_FLAGS, "amx_bf16") if flag in flags]
    vnni = "VNNI" if any(flag in flags for flag in VNNI_FLAGS) else "no VNNI (int8 products without vpdpbusd)"
    return f"{', '.join(present) or 'none of avx2/avx512/vnni/amx'}; {vnni}"


def sequences_per_second(batch: int, seconds_per_round: Sequence[float]) -> float:
    """The middle round's rate."""
    return batch / middle(seconds_per_round)


def neighbour_overlap(reference: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """The share of each row's k nearest rows (by cosine of unit vectors, itself excluded) under `reference` that
    `other` also puts among its k nearest, over all rows."""
    def nearest(vectors: np.ndarray) -> np.ndarray:
        scores = vectors @ vectors.T
        np.fill_diagonal(scores, -np.inf)
        return np.argsort(-scores, axis=1)[:, :k]

    ours, theirs = nearest(reference), nearest(other)
    kept = [len(set(a) & set(b)) for a, b in zip(ours.tolist(), theirs.tolist(), strict=True)]
    return float(np.mean(kept)) / k


def run(command: list[str], log: Path | None = None) -> None:
    """A command of the recipe (or a peer) from the checkout, printed first; its output kept in log."""
    print("$ " + " ".join(str(c) for c in command), flush=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log or os.devnull, "w") as out:
        done = subprocess.run([str(c) for c in command], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = Path(log).read_text()[-1500:] if log else ""
        raise SystemExit(f"exit {done.returncode}: {' '.join(str(c) for c in command[:3])} ...\n{tail}")


def export_both(name: str, checkpoint: Path, task: str, seq: int, repository: Path) -> dict[str, Path]:
    """triton/deployer.py's fp32 (version 1) and --int8 (version 2) exports of a fine-tuned model."""
    paths = {}
    for version, precision in ((1, "fp32"), (2, "int8")):
        run([sys.executable, "triton/deployer.py", "--init_checkpoint", checkpoint / "pytorch_model.bin",
             "--vocab_file", TEACHER / "vocab.txt", "--do_lower_case", "--task", task, "--max_seq_length", seq,
             "--model_repository", repository, "--model_name", name, "--model_version", version,
             "--instance_kind", "KIND_CPU", *(["--int8"] if precision == "int8" else [])],
            repository / f"{name}_{precision}.log")
        paths[precision] = repository / name / str(version) / "model.onnx"
    return paths


def glue_accuracy(model: Path, data: Path, out: Path) -> float:
    """SST-2 dev accuracy of an exported model by run_glue.py --onnx_model."""
    run([sys.executable, "run_glue.py", "--task_name", "sst-2", "--data_dir", data, "--onnx_model", model,
         "--vocab_file", TEACHER / "vocab.txt", "--do_lower_case", "--do_eval", "--max_seq_length", SEQ,
         "--eval_batch_size", 32, "--output_dir", out, "--disable_progress_bar"], out.with_suffix(".log"))
    return 100 * json.loads((out / "results.json").read_text())["eval_acc"]


def squad_scores(model: Path, predict: Path, out: Path) -> dict[str, float]:
    """SQuAD v1.1 EM and F1 of an exported model by run_squad.py --onnx_model."""
    run([sys.executable, "run_squad.py", "--onnx_model", model, "--vocab_file", TEACHER / "vocab.txt",
         "--do_lower_case", "--predict_file", predict, "--do_predict", "--do_eval", "--max_seq_length", SQUAD_SEQ,
         "--doc_stride", 128, "--predict_batch_size", 32, "--output_dir", out, "--json-summary", out / "log.json",
         "--disable_progress_bar"], out.with_suffix(".log"))
    from bertrecipe.training.metric_logger import read_log

    closing = read_log(out / "log.json")[-1]["data"]
    return {"exact_match": closing["exact_match"], "f1": closing["F1"]}


def answer_agreement(reference: dict[str, str], other: dict[str, str]) -> dict[str, float]:
    """How far the int8 answers stay from the fp32 ones, whatever either scores against the gold: the share of
    questions answered alike (after SQuAD's normalization) and the F1 of the other answers against the
    reference's, in percent."""
    from bertrecipe.finetuning.squad_metrics import exact_match_score, f1_score_v1

    same = [exact_match_score(other[qid], answer) for qid, answer in reference.items()]
    overlap = [f1_score_v1(other[qid], answer) for qid, answer in reference.items()]
    return {"same_answer": 100 * float(np.mean(same)), "f1_to_fp32": 100 * float(np.mean(overlap))}


def tokenizer():
    from bertrecipe.finetuning.model_loading import load_tokenizer

    return load_tokenizer(TEACHER / "vocab.txt", True)


def timing_rows(squad_file: Path, count: int = max(BATCH_SIZES)) -> dict[str, np.ndarray]:
    """count real 128-token windows with no padding (SQuAD questions and their paragraphs): what is timed."""
    from bertrecipe.finetuning import squad

    examples = squad.read_squad_examples(squad_file, is_training=False)
    features = squad.convert_examples_to_features(examples, tokenizer(), squad.WindowSettings(SEQ, 64, 32))
    full = np.flatnonzero(features.input_mask.sum(axis=1) == SEQ)[:count]
    if len(full) < count:
        raise SystemExit(f"{squad_file}: only {len(full)} full {SEQ}-token windows, {count} needed")
    rows = {"ids": features.input_ids[full], "segments": features.segment_ids[full], "mask": features.input_mask[full]}
    return {k: np.ascontiguousarray(v, dtype=np.int64) for k, v in rows.items()}


def sst2_rows(data: Path, split: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    from bertrecipe.finetuning import glue, glue_task

    features = glue_task.split_features(glue.get_task("sst-2"), data, split, tokenizer(), SEQ)
    rows = {"ids": features.input_ids, "segments": features.segment_ids, "mask": features.input_mask}
    return {k: np.asarray(v, dtype=np.int64) for k, v in rows.items()}, np.asarray(features.labels)


def squad_rows(squad_file: Path) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """The examples, the SQUAD_SEQ windows and their arrays, as run_squad.py makes them."""
    from bertrecipe.finetuning import squad

    examples = squad.read_squad_examples(squad_file, is_training=False)
    features = squad.convert_examples_to_features(examples, tokenizer(), squad.WindowSettings(SQUAD_SEQ, 128, 64))
    rows = {"ids": features.input_ids, "segments": features.segment_ids, "mask": features.input_mask}
    return examples, features, {k: np.asarray(v, dtype=np.int64) for k, v in rows.items()}


def squad_f1_of_logits(squad_file: Path, examples: Any, features: Any, start: np.ndarray, end: np.ndarray
                       ) -> dict[str, float]:
    """EM and F1 of start/end logits, with run_squad.py's answer extraction and the official metric."""
    from bertrecipe.finetuning import squad_answers, squad_metrics

    predictions = squad_answers.extract_answers(examples, features, start, end, tokenizer().vocab,
                                                squad_answers.AnswerSettings())
    scores = squad_metrics.evaluate_predictions(squad_file, predictions.answers)
    return {"exact_match": scores["exact_match"], "f1": scores["f1"]}


def our_engines(checkpoint: Path, exports: dict[str, Path], threads: int
                ) -> dict[str, Callable[[dict[str, np.ndarray]], object]]:
    """Our three ways to run a fine-tuned SST-2 model: PyTorch eager fp32, and the two exports on ONNX Runtime."""
    import torch

    from bertrecipe.deploy.onnx_export import open_classifier_session
    from bertrecipe.finetuning.model_loading import build_model, config_and_weights
    from bertrecipe.model.families import sequence_classification_model

    config, weights = config_and_weights(None, str(checkpoint / "pytorch_model.bin"))
    model = build_model(lambda c: sequence_classification_model(c, 2), config, weights, str(checkpoint),
                        tokenizer().vocab, SEQ).eval()

    def pytorch(rows: dict[str, np.ndarray]) -> object:
        with torch.inference_mode():
            return model(*(torch.from_numpy(rows[k]) for k in ("ids", "segments", "mask")))

    engines: dict[str, Callable[[dict[str, np.ndarray]], object]] = {"pytorch fp32": pytorch}
    for precision, path in exports.items():
        session = open_classifier_session(path, 2, threads)
        engines[f"ours {precision}"] = onnx_runner(session)
    return engines


def onnx_runner(session: Any) -> Callable[[dict[str, np.ndarray]], object]:
    from bertrecipe.deploy.serving import INPUTS

    return lambda rows: session.run(None, dict(zip(INPUTS, (rows["ids"], rows["segments"], rows["mask"]),
                                                   strict=True)))


def time_round(engines: dict[str, Callable[[dict[str, np.ndarray]], object]], rows: dict[str, np.ndarray]
               ) -> dict[str, dict[str, float]]:
    """Seconds per batch of each engine at each batch size: one round."""
    return {name: {str(size): time_steps(lambda s=size, e=engine: e({k: v[:s] for k, v in rows.items()}), 2,
                                         STEPS[size]) for size in BATCH_SIZES}
            for name, engine in engines.items()}


def option_variants() -> dict[str, Any]:
    """The quantization choices measured against the chosen one (deploy.quantization.CHOSEN)."""
    from bertrecipe.deploy.quantization import CHOSEN, Int8Options

    return {"chosen: every MatMul, int8 weights with per-channel scales": CHOSEN,
            "per-tensor weight scales": Int8Options(per_channel=False),
            "reduce_range (7-bit weights)": Int8Options(reduce_range=True),
            "uint8 weights": Int8Options(weight_type="uint8"),
            "embeddings (Gather) in int8 too": Int8Options(op_types=("MatMul", "Gather")),
            "attention's activation products in fp32": Int8Options(activation_products=False),
            "ORT transformer fusions, then quantized": "fusion"}


def fused_then_quantized(fp32: Path, target: Path) -> None:
    """onnxruntime.transformers' BERT fusions (SkipLayerNorm, BiasGelu; attention where its pattern is found),
    then the chosen quantization (the fused ops' types need a default tensor type to be quantized after)."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    logging.disable(logging.WARNING)
    fused = optimizer.optimize_model(str(fp32), model_type="bert", num_heads=12, hidden_size=384, opt_level=1)
    fused_path = target.with_name("fused_fp32.onnx")
    fused.save_model_to_file(str(fused_path))
    quantize_dynamic(fused_path, target, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8, per_channel=True,
                     extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})
    logging.disable(logging.NOTSET)


def measure_options(fp32: Path, dev: tuple[dict[str, np.ndarray], np.ndarray], rows: dict[str, np.ndarray],
                    threads: int, rounds: int, scratch: Path) -> list[dict[str, Any]]:
    """Each quantization variant of the SST-2 teacher: dev accuracy, seconds per batch (rounds in turns)."""
    from bertrecipe.deploy.onnx_export import open_classifier_session, timed_onnx_outputs
    from bertrecipe.deploy.quantization import quantize_file

    sessions, records = {"fp32": open_classifier_session(fp32, 2, threads)}, []
    for number, (name, options) in enumerate(option_variants().items()):
        path = scratch / f"option_{number}.onnx"
        if options == "fusion":
            fused_then_quantized(fp32, path)
        else:
            quantize_file(fp32, path, overwrite=True, options=options)
        sessions[name] = open_classifier_session(path, 2, threads)
    ids, labels = dev
    for name, session in sessions.items():
        (logits,), _ = timed_onnx_outputs(session, (ids["ids"], ids["segments"], ids["mask"]), 32, trim=True)
        records.append({"option": name, "accuracy": 100 * float(np.mean(logits.argmax(axis=1) == labels))})
    times = [time_round({n: onnx_runner(s) for n, s in sessions.items()}, rows) for _ in range(rounds)]
    for record in records:
        record["sequences_per_second"] = {size: sequences_per_second(int(size), [t[record["option"]][size]
                                                                                 for t in times])
                                          for size in map(str, BATCH_SIZES)}
    return records


def retrieval_agreement(work: Path, texts: list[str], threads: int) -> dict[str, Any]:
    """The teacher as an embedding model (mean pooling), exported by run_retrieval.py fp32 and --int8: how close
    the int8 embeddings of real sentences stay to the fp32 ones."""
    from bertrecipe.deploy.embedding_export import onnx_embeddings, open_embedding_session
    from bertrecipe.finetuning.embedding import tokenize_texts

    vectors = {}
    ids, mask = tokenize_texts(tokenizer(), texts, SEQ)
    for precision in ("fp32", "int8"):
        out = work / f"retrieval_{precision}"
        run([sys.executable, "run_retrieval.py", "--init_checkpoint", TEACHER, "--vocab_file", TEACHER / "vocab.txt",
             "--do_lower_case", "--data_dir", work / "no_beir_data", "--export_onnx", "--output_dir", out,
             "--max_seq_length", SEQ, "--disable_progress_bar", *(["--int8"] if precision == "int8" else [])],
            out.with_suffix(".log"))
        vectors[precision] = onnx_embeddings(open_embedding_session(out / "model.onnx", threads), ids, mask, 32)
    cosine = (vectors["fp32"] * vectors["int8"]).sum(axis=1)
    return {"sentences": len(texts), "mean_cosine": float(cosine.mean()), "min_cosine": float(cosine.min()),
            "top10_neighbours_kept": neighbour_overlap(vectors["fp32"], vectors["int8"])}


def peer_python(peer: str) -> Path | None:
    """The peer's environment's interpreter (benchmarks/peer_envs/make_peer_envs.sh), None where it is missing."""
    python = REPO / f".venv-{peer}" / "bin" / "python"
    return python if python.is_file() else None


def peer_command(peer: str, action: str, *flags: object) -> list[object]:
    return [peer_python(peer), "-m", "benchmarks.peer_envs.int8_peer", action, "--engine", peer, *flags]


def hf_folder(checkpoint: Path, target: Path) -> Path:
    """The fine-tuned checkpoint as a Hugging Face folder (scripts/convert_checkpoint.py): the peers' weights."""
    run([sys.executable, "scripts/convert_checkpoint.py", checkpoint / "pytorch_model.bin", target, "--vocab_file",
         TEACHER / "vocab.txt", "--overwrite"], target.with_suffix(".log"))
    return target


def prepare_peers(peers: list[str], models: dict[str, dict[str, Any]], work: Path, threads: int) -> None:
    """Each peer's fp32 and int8 models of each fine-tuned model, and their outputs on the evaluation rows."""
    for name, model in models.items():
        folder = hf_folder(model["checkpoint"], work / "hf" / name)
        np.savez(work / f"{name}_evaluate.npz", **model["evaluate"])
        np.savez(work / f"{name}_calibration.npz", **model["calibration"])
        for peer in peers:
            out = work / peer / name
            run(peer_command(peer, "prepare", "--model_dir", folder, "--task", model["task"], "--work_dir", out,
                             "--evaluate", work / f"{name}_evaluate.npz", "--calibration",
                             work / f"{name}_calibration.npz", "--threads", threads), out.with_suffix(".log"))


def peer_round(peer: str, name: str, work: Path, threads: int) -> dict[str, dict[str, float]]:
    """One timing round of a peer's two models of `name` (a process of its own): seconds per batch."""
    output = work / peer / f"{name}_times.json"
    run(peer_command(peer, "time", "--work_dir", work / peer / name, "--batch", work / "timing_rows.npz",
                     "--threads", threads, "--output", output, "--steps", *(f"{s}={STEPS[s]}" for s in BATCH_SIZES)))
    times = json.loads(output.read_text())
    return {f"{peer} {precision}": seconds for precision, seconds in times.items()}


def peer_accuracy(peer: str, name: str, model: dict[str, Any], work: Path) -> dict[str, Any]:
    """The peer's fp32 and int8 scores from its outputs on the evaluation rows, scored as ours are."""
    with np.load(work / peer / name / "eval_outputs.npz") as outputs:
        kept = {key: outputs[key] for key in outputs.files}
    scores = {}
    for precision in sorted({key.rsplit("_", 1)[0] for key in kept}):
        if model["task"] == "classification":
            scores[precision] = 100 * float(np.mean(kept[f"{precision}_0"].argmax(axis=1) == model["labels"]))
        else:
            scores[precision] = squad_f1_of_logits(model["squad_file"], model["examples"], model["features"],
                                                   kept[f"{precision}_0"], kept[f"{precision}_1"])
    return scores


def what_else_ran() -> dict[str, Any]:
    """The load and the busiest processes now, to be recorded with the figures (a shared machine)."""
    busiest = subprocess.run(["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True)
    lines = [line[:160] for line in busiest.stdout.splitlines()[1:7]]
    return {"loadavg": Path("/proc/loadavg").read_text().split()[:3], "busiest_processes": lines}


def usable_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


ENGINE_ORDER = ("pytorch fp32", "ours fp32", "ours int8", "optimum fp32", "optimum int8", "optimum int8_per_channel",
                "openvino fp32", "openvino int8")


def speedup(results: dict[str, Any], model: str, engine: str, reference: str, size: str) -> float:
    """engine's sequences per second over reference's: the middle of the rounds' own ratios, each of two timings a
    moment apart, so that the machine's speed changing between rounds cancels (on this 2-core VM the batch-1 rate
    of every engine jumps between two levels, about 80 and 130 for the teacher); the middle rates' ratio where a
    report has no rounds."""
    rounds = results.get("speed_rounds")
    if not rounds:
        return results["speed"][model][engine][size] / results["speed"][model][reference][size]
    return middle(timed[model][reference][size] / timed[model][engine][size] for timed in rounds)


def goal_lines(results: dict[str, Any]) -> list[str]:
    """The issue's goals, each met or not, from the figures."""
    lines = []
    for model, engines in results["speed"].items():
        for size in map(str, BATCH_SIZES):
            ratio = speedup(results, model, "ours int8", "ours fp32", size)
            lines.append(f"- {model}, batch {size}: int8 {ratio:.2f}x fp32 (goal 1.7x): "
                         f"{'met' if ratio >= 1.7 else 'not met'}")
            if "optimum int8" in engines:  # Optimum's documented config: per-tensor, less accurate than ours
                peer = speedup(results, model, "ours int8", "optimum int8", size)
                lines.append(f"- {model}, batch {size}: ours int8 {peer:.2f}x Optimum's per-tensor int8 "
                             "(informative: Optimum's default, not our accuracy)")
            if "optimum int8_per_channel" in engines:  # the same accuracy as ours: the goal's comparison
                peer = speedup(results, model, "ours int8", "optimum int8_per_channel", size)
                lines.append(f"- {model}, batch {size}: ours int8 {peer:.2f}x Optimum's per-channel int8, the "
                             f"accuracy ours keeps (goal at least 1x): {'met' if peer >= 1 else 'not met'}")
    for row in results["accuracy"]:
        lost = row["ours fp32"] - row["ours int8"]
        lines.append(f"- {row['model']}, {row['task']}: {lost:+.2f} points lost (goal at most 1): "
                     f"{'met' if lost <= 1 else 'not met'}")
    return lines


def table(header: Sequence[str], rows: list[Sequence[object]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]


def report_markdown(results: dict[str, Any]) -> str:
    """table.md: the run's facts, the speed and accuracy tables, the options, the embeddings, the goals."""
    lines = [f"# int8 inference, {results['date']}", "", f"{results['host']}; {results['threads']} threads; "
             f"ISA: {results['isa']}", "", "Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
             "", f"Load at start {results['what_else_ran']['start']['loadavg']}, at end "
             f"{results['what_else_ran']['end']['loadavg']} (busiest processes in results.json)", "",
             f"Sequences per second at {SEQ} tokens (middle of {results['rounds']} rounds):", ""]
    rows = []
    for model, engines in results["speed"].items():
        for engine in (e for e in ENGINE_ORDER if e in engines):
            rates = [engines[engine][str(size)] for size in BATCH_SIZES]
            ratios = [speedup(results, model, engine, "ours fp32", str(size)) for size in BATCH_SIZES]
            rows.append([model, engine, *(f"{r:.1f}" for r in rates), *(f"{r:.2f}x" for r in ratios)])
    lines += table(["model", "engine", *(f"batch {s}" for s in BATCH_SIZES), *(f"vs ours fp32, batch {s} (rounds' "
                                                                              "ratios)" for s in BATCH_SIZES)], rows)
    lines += ["", "Accuracy (the same fine-tuned weights in every column):", ""]
    engines = [e for e in ENGINE_ORDER if any(e in row for row in results["accuracy"])]
    lines += table(["model", "task", *engines], [[row["model"], row["task"],
                                                  *(f"{row[e]:.2f}" if e in row else "" for e in engines)]
                                                 for row in results["accuracy"]])
    if results.get("options"):
        lines += ["", "Quantization options on the SST-2 teacher (ours, ONNX Runtime):", ""]
        lines += table(["option", "SST-2 accuracy", *(f"batch {s} seq/s" for s in BATCH_SIZES)],
                       [[o["option"], f"{o['accuracy']:.2f}", *(f"{o['sequences_per_second'][str(s)]:.1f}"
                                                                for s in BATCH_SIZES)] for o in results["options"]])
    for row in (r for r in results["accuracy"] if "int8_against_fp32" in r):
        agreement = row["int8_against_fp32"]
        lines += ["", f"{row['model']}, {row['task']}: the int8 answers are the fp32 answers for "
                  f"{agreement['same_answer']:.2f} % of the questions (F1 {agreement['f1_to_fp32']:.2f} against them)"]
    if results.get("retrieval"):
        r = results["retrieval"]
        lines += ["", "Embeddings (the teacher, mean pooling, run_retrieval.py --export_onnx --int8) of "
                  f"{r['sentences']} SST-2 dev sentences: cosine to fp32 mean {r['mean_cosine']:.4f}, lowest "
                  f"{r['min_cosine']:.4f}; "
                  f"{100 * r['top10_neighbours_kept']:.1f} % of each sentence's 10 nearest neighbours kept"]
    for peer, reason in results.get("peers_skipped", {}).items():
        lines += ["", f"Peer {peer} not run: {reason}"]
    return "\n".join([*lines, "", "Goals (a speed ratio is the middle of the rounds' own ratios):", "",
                      *goal_lines(results), ""])


def versions(peers_run: list[str], work: Path) -> dict[str, str]:
    import onnxruntime
    import torch

    found = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
    for peer in peers_run:
        record = next(iter(sorted((work / peer).glob("*/versions.json"))), None)
        if record is not None:
            found.update({f"{peer} peer: {k}": v for k, v in json.loads(record.read_text()).items()})
    return found


def our_accuracy(models: dict[str, dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """Each model's score by our commands, fp32 and int8 exports (and PyTorch's from its fine-tuning for SST-2)."""
    rows = []
    for name, model in models.items():
        row: dict[str, Any] = {"model": model["label"], "name": name}
        if model["task"] == "classification":
            row["task"] = "SST-2 dev accuracy (872)"
            row["pytorch fp32"] = 100 * json.loads((model["checkpoint"] / "results.json").read_text())["eval_acc"]
            for precision, path in model["exports"].items():
                row[f"ours {precision}"] = glue_accuracy(path, model["data"], work / "scores" / f"{name}_{precision}")
        else:
            row["task"] = "SQuAD v1.1 F1 (last 8 dev articles, 1,589 questions)"
            for precision, path in model["exports"].items():
                row[f"ours {precision}"] = squad_scores(path, model["squad_file"],
                                                        work / "scores" / f"{name}_{precision}")["f1"]
            answers = [json.loads((work / "scores" / f"{name}_{p}" / "predictions.json").read_text())
                       for p in ("fp32", "int8")]
            row["int8_against_fp32"] = answer_agreement(*answers)
        rows.append(row)
    return rows


def describe_models(work: Path, settings: FineTuning, squad: bool, threads: int) -> dict[str, dict[str, Any]]:
    """The fine-tuned models with their exports and the rows each is scored and calibrated on."""
    folders = fine_tuned_models(work, settings, squad)
    data = work / "sst2"
    dev, labels = sst2_rows(data, "dev")
    train, _ = sst2_rows(data, "train")
    models: dict[str, dict[str, Any]] = {}
    for name, label in (("sst2_teacher", "teacher (6 x 384)"), ("sst2_student", "student (3 x 384)")):
        models[name] = {"label": label, "task": "classification", "checkpoint": folders[name], "data": data,
                        "evaluate": dev, "labels": labels, "calibration": {k: v[:300] for k, v in train.items()},
                        "exports": export_both(name, folders[name], "glue", SEQ, work / "repo")}
    if squad:
        evaluate = work / "squad" / "squad_eval.json"
        examples, features, rows = squad_rows(evaluate)
        _, _, calibration = squad_rows(work / "squad" / "squad_train.json")
        models["squad_teacher"] = {
            "label": "teacher (6 x 384)", "task": "question-answering", "checkpoint": folders["squad_teacher"],
            "squad_file": evaluate, "examples": examples, "features": features, "evaluate": rows,
            "calibration": {k: v[:300] for k, v in calibration.items()},
            "exports": export_both("squad_teacher", folders["squad_teacher"], "squad", SQUAD_SEQ, work / "repo")}
    return models


def speed(models: dict[str, dict[str, Any]], peers: list[str], work: Path, threads: int, rounds: int
          ) -> tuple[dict[str, Any], list[Any]]:
    """Sequences per second of every engine on the SST-2 models, in turns for `rounds` rounds."""
    rows = timing_rows(work / "squad" / "squad_eval.json")
    np.savez(work / "timing_rows.npz", **rows)
    timed = {"sst2_teacher": "teacher (6 x 384)", "sst2_student": "student (3 x 384)"}
    engines = {name: our_engines(models[name]["checkpoint"], models[name]["exports"], threads) for name in timed}
    history: list[dict[str, Any]] = []
    for number in range(rounds):
        print(f"timing round {number + 1} of {rounds}", flush=True)
        history.append({label: {**time_round(engines[name], rows),
                                **{k: v for peer in peers for k, v in peer_round(peer, name, work, threads).items()}}
                        for name, label in timed.items()})
    rates = {label: {engine: {size: sequences_per_second(int(size), [h[label][engine][size] for h in history])
                              for size in map(str, BATCH_SIZES)} for engine in history[0][label]}
             for label in timed.values()}
    return rates, history


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", type=Path, default=Path("results") / "int8_work",
                        help="fine-tuned models, exports and scratch files (kept: a second run reuses the models)")
    parser.add_argument("--output_dir", type=Path,
                        default=REPO / "benchmarks" / "results" / "int8" / datetime.date.today().isoformat())
    parser.add_argument("--threads", type=int, default=usable_threads(), help="default: this process's cores")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS))
    parser.add_argument("--skip_squad", action="store_true")
    parser.add_argument("--skip_options", action="store_true")
    parser.add_argument("--sst2_train_rows", type=int, default=FineTuning.sst2_train_rows)
    parser.add_argument("--squad_train_articles", type=int, default=FineTuning.squad_train_articles)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import torch

    from bertrecipe.common.hardware import detect, host_line, read_cpuinfo

    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the peers read local folders only: no hub look-ups
    results: dict[str, Any] = {"date": datetime.date.today().isoformat(), "threads": args.threads,
                               "host": host_line(detect(), "fp32 and int8"), "isa": isa_line(read_cpuinfo() or ""),
                               "rounds": args.rounds, "what_else_ran": {"start": what_else_ran()}}
    skipped = {peer: f"no .venv-{peer} (bash benchmarks/peer_envs/make_peer_envs.sh {peer})"
               for peer in args.peers if peer_python(peer) is None}
    peers = [peer for peer in args.peers if peer not in skipped]
    settings = FineTuning(args.sst2_train_rows, args.squad_train_articles)
    models = describe_models(args.work_dir, settings, not args.skip_squad, args.threads)
    results["fine_tuning"] = {**vars(settings), "models": {name: json.loads((m["checkpoint"] / "run.json").read_text())
                                                           for name, m in models.items()}}
    results["accuracy"] = our_accuracy(models, args.work_dir)
    prepare_peers(peers, models, args.work_dir, args.threads)
    for row in results["accuracy"]:
        for peer in peers:
            scores = peer_accuracy(peer, row["name"], models[row["name"]], args.work_dir)
            row.update({f"{peer} {p}": s if isinstance(s, float) else s["f1"] for p, s in scores.items()})
    results["speed"], results["speed_rounds"] = speed(models, peers, args.work_dir, args.threads, args.rounds)
    if not args.skip_options:
        with tempfile.TemporaryDirectory(dir=args.work_dir) as scratch:
            results["options"] = measure_options(models["sst2_teacher"]["exports"]["fp32"],
                                                 (models["sst2_teacher"]["evaluate"], models["sst2_teacher"]["labels"]),
                                                 timing_rows(args.work_dir / "squad" / "squad_eval.json"),
                                                 args.threads, args.rounds, Path(scratch))
    texts = [line.split("\t")[0] for line in (args.work_dir / "sst2" / "dev.tsv").read_text().splitlines()[1:]]
    results["retrieval"] = retrieval_agreement(args.work_dir, texts, args.threads)
    results["versions"], results["peers_skipped"] = versions(peers, args.work_dir), skipped
    results["what_else_ran"]["end"] = what_else_ran()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.output_dir / "results.json", results)
    (args.output_dir / "table.md").write_text(report_markdown(results), encoding="utf-8")
    print(report_markdown(results))


if __name__ == "__main__":
    main()
