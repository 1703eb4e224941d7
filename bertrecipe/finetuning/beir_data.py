"""Retrieval data as BEIR lays it out, read with one-line errors naming the file and line: corpus.jsonl (`_id`,
`title`, `text`), queries.jsonl (`_id`, `text`), qrels/<split>.tsv (header, then query-id, corpus-id, score);
and the training pairs of run_retrieval.py --do_train: JSON Lines of `query`, `positive` and optional `negative`
texts, or BEIR's qrels/train.tsv made into pairs.

A query, or a side of a training pair, that tokenizes to nothing (empty, whitespace, control or zero-width
characters) is refused, as SQuAD refuses such a question: it would be embedded as `[CLS] [SEP]` and scored or
trained on. A document without text is kept, as BEIR keeps it, with one warning (corpora carry a few; dropping them
would change every score against BEIR's), but is no training pair. The same id (or qrels pair) twice with other
contents is refused naming both lines; twice alike, it is read once."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import read_text_file
from bertrecipe.tokenization.basic_tokenizer import holds_no_text

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


def _meaningful_text(path: Path, number: int, row: dict[str, Any], key: str, what: str) -> str:
    """A text field that must say something: InputError naming the line when it tokenizes to nothing."""
    text = _text_field(path, number, row, key)
    if holds_no_text(text):
        raise InputError(f"{path}:{number}: {what} is {_quoted(text)}, which tokenizes to nothing; write it or "
                         "remove the line")
    return text


def _quoted(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."  # a blank run must not flood the line


def _id_field(path: Path, number: int, row: dict[str, Any]) -> str:
    value = row.get("_id")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # some BEIR sets write numeric ids
    if not isinstance(value, str) or not value:
        raise InputError(f"{path}:{number}: field '_id' is missing or not a string")
    return value


def _keep_once(path: Path, number: int, records: dict[str, tuple[int, str]], key: str, text: str) -> None:
    """records[key] = (line, text); the same id again with the same text is one record read twice, with another
    text a contradiction (InputError naming both lines)."""
    if key in records:
        first, earlier = records[key]
        if earlier != text:
            raise InputError(f"{path}:{number}: _id {key!r} is given on line {first} with other contents; keep one "
                             "of the two lines")
        return
    records[key] = (number, text)


def _corpus_records(path: Path) -> dict[str, tuple[int, str]]:
    """Document id -> (line, "title text", or the text alone without a title)."""
    documents: dict[str, tuple[int, str]] = {}
    for number, row in _json_lines(path, "BEIR corpus"):
        doc_id = _id_field(path, number, row)
        title = _text_field(path, number, row, "title", required=False)
        text = _text_field(path, number, row, "text")
        _keep_once(path, number, documents, doc_id, f"{title} {text}".strip())
    if not documents:
        raise InputError(f"{path}: the corpus holds no document")
    empty = [(doc_id, number) for doc_id, (number, text) in documents.items() if holds_no_text(text)]
    if empty:
        print(f"warning: {path}: {len(empty)} document{'s have' if len(empty) > 1 else ' has'} no text (first: "
              f"{empty[0][0]!r}, line {empty[0][1]}); kept and embedded as BEIR embeds them", file=sys.stderr,
              flush=True)
    return documents


def read_corpus(path: Path) -> tuple[list[str], list[str]]:
    """Ids and texts ("title text", or the text alone without a title) of corpus.jsonl."""
    documents = _corpus_records(path)
    return list(documents), [text for _, text in documents.values()]


def read_queries(path: Path) -> dict[str, str]:
    """Query id -> text of queries.jsonl."""
    queries: dict[str, tuple[int, str]] = {}
    for number, row in _json_lines(path, "BEIR queries file"):
        query_id = _id_field(path, number, row)
        _keep_once(path, number, queries, query_id, _meaningful_text(path, number, row, "text",
                                                                     f"query {query_id!r}"))
    return {query_id: text for query_id, (_, text) in queries.items()}


def read_qrels(path: Path) -> Qrels:
    """qrels/<split>.tsv: a header line, then `query-id <TAB> corpus-id <TAB> integer score` per line."""
    lines = read_text_file(path, "BEIR qrels file").splitlines()
    if not lines or lines[0].split("\t")[:2] != ["query-id", "corpus-id"]:
        raise InputError(f"{path}:1: the header 'query-id<TAB>corpus-id<TAB>score' is missing")
    qrels: Qrels = {}
    lines_of: dict[tuple[str, str], int] = {}  # the line that first judged each pair, for a contradiction
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
        earlier = qrels.setdefault(cells[0], {}).get(cells[1])
        if earlier is not None and earlier != score:
            raise InputError(f"{path}:{number}: query-id {cells[0]!r} corpus-id {cells[1]!r} is given on line "
                             f"{lines_of[cells[0], cells[1]]} with score {earlier}, here {score}; keep one of the two "
                             "lines")
        lines_of.setdefault((cells[0], cells[1]), number)
        qrels[cells[0]][cells[1]] = score
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
        pairs.queries.append(_meaningful_text(path, number, row, "query", "field 'query'"))
        pairs.positives.append(_meaningful_text(path, number, row, "positive", "field 'positive'"))
        if "negative" in row:
            negatives.append(_meaningful_text(path, number, row, "negative", "field 'negative'"))
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
    documents = _corpus_records(folder / "corpus.jsonl")
    queries = read_queries(folder / "queries.jsonl")
    qrels = read_qrels(qrels_file)
    check_qrels_ids(qrels_file, qrels, queries, set(documents))
    pairs = TrainingPairs()
    for query_id, judged in qrels.items():
        for doc_id, score in judged.items():
            if score <= 0:
                continue
            line, text = documents[doc_id]
            if holds_no_text(text):  # a pair with an empty side teaches nothing
                raise InputError(f"{folder / 'corpus.jsonl'}:{line}: document {doc_id!r}, judged relevant to query "
                                 f"{query_id!r} in {qrels_file}, has no text; write it or remove the judgment")
            pairs.queries.append(queries[query_id])
            pairs.positives.append(text)
    if not pairs.queries:
        raise InputError(f"{qrels_file}: no judgment with a score above 0 to train on")
    return pairs
