"""Retrieval data as BEIR lays it out, read with one-line errors naming the file and line: corpus.jsonl (`_id`,
`title`, `text`), queries.jsonl (`_id`, `text`), qrels/<split>.tsv (header, then query-id, corpus-id, score);
and the training pairs of run_retrieval.py --do_train: JSON Lines of `query`, `positive` and optional `negative`
texts, or BEIR's qrels/train.tsv made into pairs."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import read_text_file

Qrels = dict[str, dict[str, int]]  # query id -> corpus id -> graded relevance


@dataclass
class BeirSplit:
    """A corpus, the queries that have judgments in the split, and those judgments (BEIR's GenericDataLoader keeps
    only the queries the qrels name)."""

    corpus_ids: list[str]
    corpus_texts: list[str]  # title and text joined by a space, as BEIR's dense models read a document
    query_ids: list[str]
    query_texts: list[str]
    qrels: Qrels


@dataclass
class TrainingPairs:
    """Query, positive document and (for every row or none) a hard-negative document."""

    queries: list[str] = field(default_factory=list)
    positives: list[str] = field(default_factory=list)
    negatives: Optional[list[str]] = None


def _json_lines(path: Path, what: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line; InputError naming the file and line otherwise."""
    rows = []
    for number, line in enumerate(read_text_file(path, what).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: malformed JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: a JSON object was expected, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _text_field(path: Path, number: int, row: dict[str, Any], key: str, required: bool = True) -> str:
    value = row.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        problem = "missing" if value is None else f"not a string ({type(value).__name__})"
        raise InputError(f"{path}:{number}: field {key!r} is {problem}")
    return value


def _id_field(path: Path, number: int, row: dict[str, Any], seen: set[str]) -> str:
    value = row.get("_id")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # some BEIR sets write numeric ids
    if not isinstance(value, str) or not value:
        raise InputError(f"{path}:{number}: field '_id' is missing or not a string")
    if value in seen:
        raise InputError(f"{path}:{number}: _id {value!r} appears twice")
    seen.add(value)
    return value


def read_corpus(path: Path) -> tuple[list[str], list[str]]:
    """Ids and texts ("title text", or the text alone without a title) of corpus.jsonl."""
    ids, texts, seen = [], [], set()
    for number, row in _json_lines(path, "BEIR corpus"):
        ids.append(_id_field(path, number, row, seen))
        title = _text_field(path, number, row, "title", required=False)
        text = _text_field(path, number, row, "text")
        texts.append(f"{title} {text}".strip())
    if not ids:
        raise InputError(f"{path}: the corpus holds no document")
    return ids, texts


def read_queries(path: Path) -> dict[str, str]:
    """Query id -> text of queries.jsonl."""
    queries, seen = {}, set()
    for number, row in _json_lines(path, "BEIR queries file"):
        queries[_id_field(path, number, row, seen)] = _text_field(path, number, row, "text")
    return queries


def read_qrels(path: Path) -> Qrels:
    """qrels/<split>.tsv: a header line, then `query-id <TAB> corpus-id <TAB> integer score` per line."""
    lines = read_text_file(path, "BEIR qrels file").splitlines()
    if not lines or lines[0].split("\t")[:2] != ["query-id", "corpus-id"]:
        raise InputError(f"{path}:1: the header 'query-id<TAB>corpus-id<TAB>score' is missing")
    qrels: Qrels = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != 3 or not cells[0] or not cells[1]:
            raise InputError(f"{path}:{number}: expected 3 tab-separated fields (query-id, corpus-id, score), got "
                             f"{len(cells)}")
        try:
            score = int(cells[2])
        except ValueError:
            raise InputError(f"{path}:{number}: score {cells[2]!r} is not an integer") from None
        qrels.setdefault(cells[0], {})[cells[1]] = score
    if not qrels:
        raise InputError(f"{path}: no judgments after the header")
    return qrels


def read_training_pairs(path: Path) -> TrainingPairs:
    """--train_file: a BEIR qrels file (.tsv, in its folder's qrels/) or JSON Lines of pairs."""
    return pairs_from_qrels(path) if path.suffix == ".tsv" else read_pair_file(path)


def beir_files(data_dir: Path, split: str) -> dict[str, Path]:
    return {"corpus": data_dir / "corpus.jsonl", "queries": data_dir / "queries.jsonl",
            "qrels": data_dir / "qrels" / f"{split}.tsv"}


def read_beir(data_dir: Path, split: str = "test") -> BeirSplit:
    """The corpus, queries and qrels of one split; every query and document the qrels name must exist."""
    files = beir_files(data_dir, split)
    corpus_ids, corpus_texts = read_corpus(files["corpus"])
    queries = read_queries(files["queries"])
    qrels = read_qrels(files["qrels"])
    check_qrels_ids(files["qrels"], qrels, queries, set(corpus_ids))
    query_ids = list(qrels)
    return BeirSplit(corpus_ids, corpus_texts, query_ids, [queries[q] for q in query_ids], qrels)


def check_qrels_ids(path: Path, qrels: Qrels, queries: dict[str, str], corpus_ids: set[str]) -> None:
    for query_id, judged in qrels.items():
        if query_id not in queries:
            raise InputError(f"{path}: query-id {query_id!r} is not in queries.jsonl")
        unknown = next((doc for doc in judged if doc not in corpus_ids), None)
        if unknown is not None:
            raise InputError(f"{path}: corpus-id {unknown!r} (query {query_id!r}) is not in corpus.jsonl")


def read_pair_file(path: Path) -> TrainingPairs:
    """JSON Lines of {"query", "positive"[, "negative"]}: either every row has a negative or none has."""
    pairs = TrainingPairs()
    negatives: list[str] = []
    for number, row in _json_lines(path, "training pairs file"):
        pairs.queries.append(_text_field(path, number, row, "query"))
        pairs.positives.append(_text_field(path, number, row, "positive"))
        if "negative" in row:
            negatives.append(_text_field(path, number, row, "negative"))
        if len(negatives) not in (0, len(pairs.queries)):
            raise InputError(f"{path}:{number}: 'negative' is given on some rows only; give it on every row or none")
    if not pairs.queries:
        raise InputError(f"{path}: no training pairs")
    pairs.negatives = negatives or None
    return pairs


def pairs_from_qrels(qrels_file: Path) -> TrainingPairs:
    """A BEIR train split as pairs: each (query, document) judged relevant (score > 0) in qrels_file
    (<folder>/qrels/train.tsv), the texts from the folder's corpus.jsonl and queries.jsonl."""
    folder = qrels_file.parent.parent
    corpus_ids, corpus_texts = read_corpus(folder / "corpus.jsonl")
    queries = read_queries(folder / "queries.jsonl")
    qrels = read_qrels(qrels_file)
    check_qrels_ids(qrels_file, qrels, queries, set(corpus_ids))
    text_of = dict(zip(corpus_ids, corpus_texts, strict=True))
    pairs = TrainingPairs()
    for query_id, judged in qrels.items():
        for doc_id, score in judged.items():
            if score > 0:
                pairs.queries.append(queries[query_id])
                pairs.positives.append(text_of[doc_id])
    if not pairs.queries:
        raise InputError(f"{qrels_file}: no judgment with a score above 0 to train on")
    return pairs
