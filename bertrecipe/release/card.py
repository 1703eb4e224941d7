"""README.md, the model card: the metadata the Hub reads (library, pipeline tag, base model, language, licence and
datasets as the user gives them, a model-index of the scores) and what the model is, how to load it, how it was
trained and what it scores, every figure from records.py's records or from the weights themselves."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from bertrecipe.release.model_files import NSP_FILE, ReleaseKind
from bertrecipe.release.records import METRIC_TYPES, Score


@dataclass(frozen=True)
class CardFacts:
    """Everything the card states: given by the user (name, licence, language, datasets, base model), read from
    the model (family, sizes, vocab, casing) or from the records (training rows, manifest, scores)."""

    name: str
    kind: ReleaseKind
    family: str  # BERT or ModernBERT
    sizes: dict[str, int]  # layers, hidden size, heads, intermediate size, maximum length, parameters
    vocab: str  # e.g. "30,522 WordPiece tokens, uncased"
    training: list[tuple[str, str]] = field(default_factory=list)
    manifest: Optional[dict[str, Any]] = None
    scores: list[Score] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    license: Optional[str] = None
    language: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    base_model: Optional[str] = None


def yaml_value(value: Any, indent: int) -> list[str]:
    """Block YAML of dicts, lists and scalars (strings double-quoted as JSON writes them, which YAML reads)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines += [f"{pad}{key}:", *yaml_value(item, indent + 2)]
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
    elif isinstance(value, list):
        for item in value:
            nested = yaml_value(item, indent + 2)
            lines.append(f"{pad}- {nested[0].strip()}" if nested else f"{pad}- {json.dumps(item)}")
            lines += nested[1:]
    else:
        lines.append(f"{pad}{json.dumps(value)}")
    return lines


def metadata(facts: CardFacts) -> dict[str, Any]:
    kind = facts.kind
    meta: dict[str, Any] = {"library_name": "sentence-transformers" if kind.is_embedding else "transformers",
                            "pipeline_tag": kind.pipeline_tag,
                            "tags": [facts.family.lower(), "bertrecipe", *(["sentence-transformers"]
                                                                           if kind.is_embedding else [])]}
    for key, value in (("base_model", facts.base_model), ("license", facts.license),
                       ("language", facts.language), ("datasets", facts.datasets)):
        if value:
            meta[key] = value
    if facts.scores:
        meta["model-index"] = [{"name": facts.name, "results": [
            {"task": {"type": score.kind}, "dataset": {"name": score.task, "type": score.task},
             "metrics": [{"type": METRIC_TYPES.get(score.metric, score.metric), "name": score.metric,
                          "value": round(score.value, 2)}]} for score in facts.scores]}]
    return meta


def usage(facts: CardFacts) -> list[str]:
    kind, name = facts.kind, facts.name
    if kind.is_embedding:
        code = ["from sentence_transformers import SentenceTransformer", "",
                f'model = SentenceTransformer("{name}")',
                'embeddings = model.encode(["a first sentence", "a second one"])  # unit vectors: dot = cosine']
    elif kind.pipeline_tag == "feature-extraction":
        code = ["from transformers import AutoModel, AutoTokenizer", "",
                f'tokenizer, model = AutoTokenizer.from_pretrained("{name}"), AutoModel.from_pretrained("{name}")',
                'hidden = model(**tokenizer("a sentence", return_tensors="pt")).last_hidden_state']
    else:
        example = {"fill-mask": '"The capital of France is [MASK]."',
                   "text-classification": '"a sentence to classify"',
                   "question-answering": 'question="Who wrote it?", context="It was written by Ann."'}
        code = ["from transformers import pipeline", "",
                f'run = pipeline("{kind.pipeline_tag}", model="{name}")', f"print(run({example[kind.pipeline_tag]}))"]
    return ["## Use it", "", "```python", *code, "```", ""]


def model_section(facts: CardFacts) -> list[str]:
    sizes, kind = facts.sizes, facts.kind
    rows = [("family", facts.family), ("class", f"`{kind.architecture}`"),
            ("layers", sizes["layers"]), ("hidden size", sizes["hidden"]), ("attention heads", sizes["heads"]),
            ("intermediate size", sizes["intermediate"]), ("parameters", f"{sizes['parameters']:,}"),
            ("vocabulary", facts.vocab), ("maximum length", f"{sizes['max_length']} tokens")]
    if kind.labels:
        rows.append(("labels", ", ".join(f"`{label}`" for label in kind.labels)))
    if kind.is_embedding:
        rows.append(("sentence embedding", f"{kind.pooling} pooling, L2-normalised, texts cut to "
                                           f"{kind.max_seq_length} tokens"))
    if kind.task_name:
        rows.append(("fine-tuned on", kind.task_name))
    return ["## Model", "", "| | |", "|---|---|", *(f"| {what} | {value} |" for what, value in rows), ""]


def training_section(facts: CardFacts) -> list[str]:
    lines = ["## Training", ""]
    if not facts.training:
        return lines + ["The checkpoint carries no record of its training (steps, data, hardware), so none is "
                        "stated here.", ""]
    lines += ["From the checkpoint's own records:", "", "| | |", "|---|---|",
              *(f"| {what} | {value} |" for what, value in facts.training), ""]
    if facts.manifest:
        totals = (facts.manifest.get("totals") or {}).get("training") or {}
        lines += [f"Data, from the shards' manifest: {totals.get('tokens', 0):,} tokens in "
                  f"{totals.get('rows', 0):,} sequences of training shards.", "",
                  "| source | tokens |", "|---|---|",
                  *(f"| {source.get('name')} | {int((source.get('articles') or {}).get('training_tokens', 0)):,} |"
                    for source in facts.manifest.get("sources", [])), ""]
    return lines


def scores_section(facts: CardFacts) -> list[str]:
    if not facts.scores:
        return ["## Scores", "", "No results file of this checkpoint was given (`--results`), so no score is "
                "stated.", ""]
    return ["## Scores", "", "| task | metric | score | measured by |", "|---|---|---|---|",
            *(f"| {s.task} | {s.metric} | {s.value:.2f} | {s.source} |" for s in facts.scores), ""]


def card_text(facts: CardFacts) -> str:
    lines = ["---", *yaml_value(metadata(facts), 0), "---", "", f"# {facts.name}", "",
             f"A {facts.family} {facts.kind.pipeline_tag} model with {facts.sizes['layers']} layers, released by "
             "`scripts/export_model.py` of bertrecipe. Every figure below comes from the checkpoint's records, its "
             "data manifest or the results files of this very checkpoint (matched by the sha256 of its weights).",
             "", *usage(facts), *model_section(facts), *training_section(facts), *scores_section(facts)]
    if facts.notes:
        lines += ["## Notes", "", *(f"- {note}" for note in facts.notes), ""]
    files = [*facts.files, "release.json"]
    lines += ["## Files", "", *(f"- `{name}`" + (" (the next-sentence head and pooler, which the masked-LM class "
                                                  "has not)" if name == NSP_FILE else "") for name in files), ""]
    return "\n".join(lines)
