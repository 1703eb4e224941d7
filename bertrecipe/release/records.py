"""What a release may say about its model, each fact from a record: the checkpoint's own (steps, tokens, sequence
lengths, precision, hardware, task), the data manifest of the shards it trained on (sources and token counts), and
the run_downstream.py / run_retrieval.py results of that very checkpoint (matched by the sha256 of its weights; a
results file of another checkpoint is refused). Nothing here guesses: a fact without a record is absent."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import read_json_file
from bertrecipe.model import sharded_checkpoint
from bertrecipe.model.torch_files import load_torch_file
from bertrecipe.model.weights import checkpoint_identity

WEIGHT_ENTRIES = ("model", "optimizer", "scheduler", "scaler", "rng", "rng_per_rank", "data")
STEP_IN_NAME = re.compile(r"ckpt_(\d+)\.pt$")
# run_downstream's metric names as the Hub's model-index types them
METRIC_TYPES = {"acc": "accuracy", "m acc": "accuracy", "mm acc": "accuracy", "F1": "f1", "EM": "exact_match",
                "MCC": "matthews_correlation", "Spearman": "spearmanr", "Pearson": "pearsonr",
                "nDCG@10": "ndcg_at_10", "MRR@10": "mrr_at_10", "R@100": "recall_at_100"}


@dataclass
class SourceRecords:
    """The checkpoint's identity and records, and the manifest of its training shards where one matches."""

    path: Path
    sha256: Optional[str]
    payload: dict[str, Any] = field(default_factory=dict)  # our checkpoint's records (its weights left out)
    data_files: list[str] = field(default_factory=list)  # the training shards' names, from the data state
    manifest: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class Score:
    """One row of the card's scores and of its model-index."""

    task: str  # e.g. sst-2, squad-v1.1, beir-scifact
    kind: str  # the pipeline the task scores: text-classification, question-answering, sentence-similarity
    metric: str  # as the results file names it
    value: float  # in percent
    source: str  # which command measured it, and how


def read_source_records(src: Path) -> SourceRecords:
    """The sha256 of the weights and, for a checkpoint of ours (a file, or a sharded one's folder), everything it
    records besides them."""
    records = SourceRecords(src, checkpoint_identity(src)["sha256"])
    payload = None
    if src.is_file():
        payload = load_torch_file(src, mmap=True)
    elif sharded_checkpoint.is_sharded_checkpoint(src):  # its training state records the rest
        payload = sharded_checkpoint.read_training_state(src)
    if payload is not None:
        if isinstance(payload, dict) and "model" in payload:  # a checkpoint of ours, or NVIDIA's
            records.data_files = list((payload.get("data") or {}).get("files") or [])
            records.payload = {k: v for k, v in payload.items() if k not in WEIGHT_ENTRIES}
    records.manifest = matching_manifest(records)
    return records


def matching_manifest(records: SourceRecords) -> Optional[dict[str, Any]]:
    """bertPrep's manifest.json beside the shards the checkpoint recorded (--input_dir or its parent), when every
    shard the run read is one of the manifest's training shards."""
    input_dir = (records.payload.get("args") or {}).get("input_dir")
    if not input_dir or not records.data_files:
        return None
    for candidate in (Path(input_dir) / "manifest.json", Path(input_dir).parent / "manifest.json"):
        if candidate.is_file():
            manifest = read_json_file(candidate, "data manifest")
            listed = {shard.get("file") for shard in (manifest.get("shards") or {}).get("training", [])}
            if set(records.data_files) <= listed:
                return manifest
    return None


def global_step(records: SourceRecords) -> Optional[int]:
    match = STEP_IN_NAME.search(records.path.name)
    if match:
        return int(match.group(1))
    return records.payload.get("phase_step")


def training_facts(records: SourceRecords) -> list[tuple[str, str]]:
    """(what, value) rows of how the checkpoint was trained, each from its records; none for a checkpoint that
    records nothing (a Hugging Face folder, NVIDIA's file, a fine-tuned checkpoint's task alone)."""
    payload, args = records.payload, records.payload.get("args") or {}
    if not args:
        return []
    rows = [("optimizer steps", str(global_step(records)))]
    if payload.get("phase2"):
        rows.append(("phases", f"2 (phase 1 ended at step {payload.get('phase1_end_step')})"))
    if payload.get("tokens"):
        rows.append(("tokens seen", f"{int(payload['tokens']):,}"))
    rows += [(name.replace("_", " "), str(args[name])) for name in
             ("max_seq_length", "max_predictions_per_seq", "train_batch_size", "gradient_accumulation_steps",
              "learning_rate", "optimizer", "masked_lm_prob") if args.get(name) is not None]
    rows.append(("next-sentence prediction", "no" if args.get("no_nsp") else "yes"))
    if args.get("dynamic_masking"):
        rows.append(("masking", "dynamic (drawn as samples are read)"))
    if payload.get("train_seconds"):
        rows.append(("training time", f"{float(payload['train_seconds']) / 3600:.2f} hours"))
    hardware = payload.get("hardware") or {}
    if hardware:
        rows.append(("hardware", f"{hardware.get('processes', 1)} x {hardware.get('device')}, "
                                 f"{hardware.get('precision')}, torch {hardware.get('torch')}"))
    if payload.get("objective"):
        rows.append(("objective", str(payload["objective"].get("kind", payload["objective"]))))
    return rows


def read_release_scores(path: Path, sha256: Optional[str]) -> list[Score]:
    """The scores of a run_downstream.py or run_retrieval.py results.json of the checkpoint whose weights have
    `sha256`; InputError for a file of another checkpoint or another kind."""
    results = read_json_file(path, "results.json")
    if not isinstance(results, dict):
        raise InputError(f"{path}: not a results.json of run_downstream.py or run_retrieval.py")
    if "tasks" in results and "protocol" in results:
        scored = (results.get("checkpoint") or {}).get("sha256")
        check_same_checkpoint(path, scored, sha256)
        return downstream_scores(results)
    if "ndcg@10" in results and "pooling" in results:
        check_same_checkpoint(path, results.get("checkpoint_sha256"), sha256)
        return [Score(f"beir-{results.get('dataset', 'retrieval')}", "sentence-similarity", name,
                      100 * float(results[key]), f"run_retrieval.py, {results.get('queries')} queries of the "
                                                 f"{results.get('split')} split")
                for name, key in (("nDCG@10", "ndcg@10"), ("MRR@10", "mrr@10"), ("R@100", "recall@100"))
                if key in results]
    raise InputError(f"{path}: not a results.json of run_downstream.py or run_retrieval.py")


def check_same_checkpoint(path: Path, scored: Optional[str], released: Optional[str]) -> None:
    if scored is None:
        raise InputError(f"{path}: records no sha256 of the checkpoint it scored, so its scores cannot be shown "
                         "to be this model's; run the command again with this version")
    if scored != released:
        raise InputError(f"{path}: scores the checkpoint with sha256 {scored[:12]}..., not this one "
                         f"({(released or 'unknown')[:12]}...); pass the results of the checkpoint you release")


def downstream_scores(results: dict[str, Any]) -> list[Score]:
    """Each task's score (the median of its seeds at the best configuration), with its own grid's seed count."""
    grids = (results.get("protocol") or {}).get("grids") or {}
    kinds = {"glue": "text-classification", "squad": "question-answering", "retrieval": "sentence-similarity"}
    scores = []
    for name, task in results["tasks"].items():
        if task.get("score") is None:
            continue
        seeds = len((grids.get(name) or {}).get("seeds") or [])
        count = f" ({seeds} seed{'s' if seeds != 1 else ''})" if seeds else ""
        how = f"run_downstream.py, median over seeds at the best configuration{count}"
        scores.append(Score(name, kinds.get(str(task.get("kind")), "text-classification"), str(task["metric"]),
                            float(task["score"]), how))
    return scores
