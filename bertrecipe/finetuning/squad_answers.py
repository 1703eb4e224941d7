"""From a SQuAD model's start/end logits to answers: n-best spans per question, the answer text mapped back
onto the original context ("get final text"), the SQuAD 2.0 null rule, and the prediction files.

The algorithm is that of the original BERT `run_squad.py` (which NVIDIA's follows), written anew; features
come from squad.py. Only numpy is used.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.finetuning.squad import SquadExample, SquadFeatures
from bertrecipe.tokenization.basic_tokenizer import basic_tokenize
from bertrecipe.tokenization.bpe import BpeVocab
from bertrecipe.tokenization.wordpiece import Vocab


@dataclass(frozen=True)
class AnswerSettings:
    """How spans are chosen and when SQuAD 2.0 answers nothing (NVIDIA's defaults)."""

    n_best_size: int = 20
    max_answer_length: int = 30
    do_lower_case: bool = True
    version_2_with_negative: bool = False
    null_score_diff_threshold: float = 0.0


@dataclass
class SquadPredictions:
    """qas_id -> answer text; qas_id -> n-best list of {text, probability, start_logit, end_logit};
    for SQuAD 2.0, qas_id -> null score minus the best non-null score (the `null_odds.json` values)."""

    answers: dict[str, str]
    nbest: dict[str, list[dict[str, Any]]]
    null_odds: dict[str, float]


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
    """The part of `orig_text` (original words, original case and accents) that the de-tokenized prediction
    `pred_text` covers. Both are aligned through the basic-tokenized original with spaces removed; when they
    do not align character for character, the whole `orig_text` is returned."""
    return _align(pred_text, orig_text, " ".join(basic_tokenize(orig_text, do_lower_case)))


@functools.lru_cache(maxsize=1 << 18)
def _basic_word(word: str, do_lower_case: bool) -> str:
    return " ".join(basic_tokenize(word, do_lower_case))


def _final_text_of_words(pred_text: str, words: Sequence[str], do_lower_case: bool) -> str:
    """get_final_text(pred_text, " ".join(words)): basic tokenization is local to a word, so it is cached per
    word (post-processing spends most of its time here otherwise)."""
    tok_text = " ".join(t for t in (_basic_word(w, do_lower_case) for w in words) if t)
    return _align(pred_text, " ".join(words), tok_text)


def _align(pred_text: str, orig_text: str, tok_text: str) -> str:
    """Maps pred_text, found in tok_text, onto orig_text by counting non-space characters (both texts must
    hold the same number of them)."""
    start = tok_text.find(pred_text)
    if start == -1 or not pred_text:
        return orig_text
    end = start + len(pred_text) - 1
    if len(orig_text) - orig_text.count(" ") != len(tok_text) - tok_text.count(" "):
        return orig_text
    if tok_text[start] == " " or tok_text[end] == " ":
        return orig_text
    ns_start = start - tok_text.count(" ", 0, start)
    ns_end = end - tok_text.count(" ", 0, end)
    codes = np.frombuffer(orig_text.encode("utf-32-le"), np.uint32)
    orig_positions = np.flatnonzero(codes != ord(" "))
    return orig_text[int(orig_positions[ns_start]) : int(orig_positions[ns_end]) + 1]


def _softmax(scores: list[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def _top_indexes(logits: np.ndarray, n: int) -> np.ndarray:
    """Indexes of the n largest logits, largest first, lower index first on ties."""
    return np.argsort(-logits, kind="stable")[:n]


class _Span(NamedTuple):
    """A candidate answer: pieces start..end of window `row`, scored by start + end logit."""

    score: float
    row: int
    start: int
    end: int
    start_logit: float
    end_logit: float


@dataclass(frozen=True)
class _AnswerFinder:
    """The model's logits with what turns them into answers; each step of the reference algorithm is a method."""

    features: SquadFeatures
    start_logits: np.ndarray  # float32 [N, L]
    end_logits: np.ndarray
    vocab: Vocab | BpeVocab
    settings: AnswerSettings

    def null_span(self, rows: list[int]) -> Optional[_Span]:
        """SQuAD 2.0's null answer: the window with the smallest [CLS] start + end (the first on ties)."""
        if not self.settings.version_2_with_negative:
            return None
        null = None
        for row in rows:
            start, end = self.start_logits[row, 0].astype(np.float64), self.end_logits[row, 0].astype(np.float64)
            if null is None or start + end < null.score:
                null = _Span(start + end, row, 0, 0, start, end)
        return null

    def window_spans(self, row: int) -> list[_Span]:
        """The valid spans among the n_best_size best starts x ends of one window, in the reference's order."""
        features, n_best = self.features, self.settings.n_best_size
        # Padded positions never take an n-best slot: with padding skipped their logits are only the head's
        # bias, where a dense model has learnt low values (its SQuAD loss spans them).
        padded = features.input_mask[row] == 0
        starts = _top_indexes(np.where(padded, -np.inf, self.start_logits[row]), n_best)[:, None]
        ends = _top_indexes(np.where(padded, -np.inf, self.end_logits[row]), n_best)[None, :]
        in_doc = features.token_to_orig[row] >= 0
        valid = (
            in_doc[starts] & in_doc[ends] & features.token_is_max_context[row][starts]
            & (ends >= starts) & (ends - starts + 1 <= self.settings.max_answer_length)
        )
        s_logits = self.start_logits[row].astype(np.float64)
        e_logits = self.end_logits[row].astype(np.float64)
        spans = []
        for s, e in zip(*np.nonzero(valid), strict=True):
            start, end = int(starts[s, 0]), int(ends[0, e])
            spans.append(_Span(s_logits[start] + e_logits[end], row, start, end, s_logits[start], e_logits[end]))
        return spans

    def nbest(self, example: SquadExample, rows: list[int]) -> tuple[list[tuple[str, float, float]], Optional[_Span]]:
        """The n best distinct answer texts with their start and end logits, best first, and the null span."""
        null = self.null_span(rows)
        candidates = [span for row in rows for span in self.window_spans(row)]
        if null is not None:
            candidates.append(null)
        candidates.sort(key=lambda span: span.score, reverse=True)  # stable, like the reference's sorted()
        nbest: list[tuple[str, float, float]] = []
        seen: set[str] = set()
        for span in candidates:
            if len(nbest) >= self.settings.n_best_size:
                break
            text = self.text(example, span) if span.start > 0 else ""
            if text not in seen:
                seen.add(text)
                nbest.append((text, float(span.start_logit), float(span.end_logit)))
        if null is not None and "" not in seen:
            nbest.append(("", float(null.start_logit), float(null.end_logit)))
        if not any(text for text, _, _ in nbest) and rows:
            # No valid span in any window: a placeholder keeps the n-best non-empty, as later reference code does.
            nbest.insert(0, ("empty", 0.0, 0.0))
        return nbest, null

    def text(self, example: SquadExample, span: _Span) -> str:
        return span_text(example, self.features, span.row, span.start, span.end, self.vocab,
                         self.settings.do_lower_case)


def extract_answers(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    vocab: Vocab | BpeVocab,
    settings: AnswerSettings = AnswerSettings(),
) -> SquadPredictions:
    """Answers from the model's logits (float [N, L], one row per feature, same order as `features`).

    Candidates of a window: the n_best_size best starts x ends that both lie in its document part, end >= start,
    at most max_answer_length pieces, start in its max-context window; ranked by start + end logit over all
    windows of the question. SQuAD 2.0 adds the null answer scored by the smallest [CLS] start + end over the
    windows and answers "" when null score - best non-null score > null_score_diff_threshold.
    """
    finder = _AnswerFinder(
        features, np.asarray(start_logits, np.float32), np.asarray(end_logits, np.float32), vocab, settings
    )
    order = np.argsort(features.example_index, kind="stable")
    bounds = np.searchsorted(features.example_index[order], np.arange(len(examples) + 1))
    result = SquadPredictions({}, {}, {})
    for i, example in enumerate(examples):
        nbest, null = finder.nbest(example, order[bounds[i] : bounds[i + 1]].tolist())
        probabilities = _softmax([s + e for _, s, e in nbest])
        entries = [
            {"text": text, "probability": p, "start_logit": s, "end_logit": e}
            for (text, s, e), p in zip(nbest, probabilities, strict=True)
        ]
        result.nbest[example.qas_id] = entries
        answer, null_odds = _choose_answer(entries, null, settings)
        result.answers[example.qas_id] = answer
        if null_odds is not None:
            result.null_odds[example.qas_id] = null_odds
    return result


def _choose_answer(
    entries: list[dict[str, Any]], null: Optional[_Span], settings: AnswerSettings
) -> tuple[str, Optional[float]]:
    """The answer of one question and, for SQuAD 2.0, its null score minus the best non-null score."""
    v2 = settings.version_2_with_negative
    best = next((entry for entry in entries if entry["text"]), None)
    if best is None:  # an example without any window (empty context)
        return "", (0.0 if v2 else None)
    if not v2:
        return entries[0]["text"], None
    diff = float(null.score) - best["start_logit"] - best["end_logit"]
    return ("" if diff > settings.null_score_diff_threshold else best["text"]), diff


def span_text(
    example: SquadExample, features: SquadFeatures, row: int, start: int, end: int, vocab: Vocab | BpeVocab, lower: bool
) -> str:
    """The original context text that pieces start..end (positions in window `row`) stand for: the pieces are
    de-tokenized ("##" joined) and aligned with the words they come from by get_final_text. BPE pieces (a
    tokenizer.json's) stand for whole words here, as each context word is tokenized alone: their words."""
    first, last = int(features.token_to_orig[row, start]), int(features.token_to_orig[row, end])
    if isinstance(vocab, BpeVocab):
        return " ".join(example.doc_tokens[first : last + 1])
    pieces = " ".join(vocab.tokens[i] for i in features.input_ids[row, start : end + 1].tolist())
    pred_text = " ".join(pieces.replace(" ##", "").replace("##", "").split())
    return _final_text_of_words(pred_text, example.doc_tokens[first : last + 1], lower)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """JSON (4-space indent, UTF-8) to `path` through a temporary file and a rename: never half written."""
    text = json.dumps(obj, indent=4) + "\n"  # serialized first: an unserializable object leaves no trace
    write_atomic(Path(path), lambda f: f.write(text.encode("utf-8")))


def write_predictions(
    output_dir: str | Path, predictions: SquadPredictions, version_2_with_negative: bool
) -> list[Path]:
    """Writes predictions.json, nbest_predictions.json and, for SQuAD 2.0, null_odds.json; returns the paths."""
    output_dir = Path(output_dir)
    files = [(output_dir / "predictions.json", predictions.answers)]
    files.append((output_dir / "nbest_predictions.json", predictions.nbest))
    if version_2_with_negative:
        files.append((output_dir / "null_odds.json", predictions.null_odds))
    for path, obj in files:
        write_json_atomic(path, obj)
    return [path for path, _ in files]
