"""SQuAD v1.1 / v2.0 for BERT: examples from the JSON, windowed features and their cache.

The algorithms are those of the original BERT `run_squad.py` (which NVIDIA's follows), written anew:
- a context is split on whitespace into words, and every character knows its word (answers are given in
  characters);
- each word is WordPiece-tokenized on its own; the query is cut to `max_query_length` pieces; the document
  pieces are covered by windows of `max_seq_length - len(query) - 3` pieces, `doc_stride` apart, each laid out
  as `[CLS] query [SEP] doc [SEP]`; a piece seen by several windows is scored in the one where it has the most
  context on its shorter side;
- a training answer becomes the piece span whose pieces equal the tokenized answer text (the "improve answer
  span" rule); outside the window, or for an impossible question, start and end point at [CLS] (0);
- prediction (squad_answers.py) takes the n best starts and ends of every window, keeps valid spans, and maps
  the best spans back onto the original context through the basic tokenizer ("get final text").
Only numpy is used here: the training scripts turn the arrays into tensors.
"""
from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.common.files import parse_json_text, read_json_text
from bertrecipe.tokenization.basic_tokenizer import holds_no_text
from bertrecipe.tokenization.bpe import BpeVocab, FineTuningTokenizer
from bertrecipe.tokenization.wordpiece import Vocab

logger = logging.getLogger(__name__)

FEATURES_FORMAT_VERSION = 1  # bump when the feature layout or algorithm changes, so old caches are not reused
# Context word separators of the reference code (U+202F, the narrow no-break space, included).
_CONTEXT_WHITESPACE = frozenset(" \t\r\n\u202f")


# ---------------------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------------------
@dataclass
class SquadAnswer:
    """One gold answer: its text, first character in the context, and first/last word of doc_tokens."""

    text: str
    start_char: int
    start_word: int
    end_word: int


@dataclass
class SquadExample:
    """One question about one context. `doc_tokens` are the whitespace-separated words of the context;
    examples of the same paragraph share `context_id` (and the list), so the paragraph is tokenized once."""

    qas_id: str
    question_text: str
    doc_tokens: list[str]
    answers: list[SquadAnswer]
    is_impossible: bool = False
    context_id: int = -1


def split_context(context: str) -> tuple[list[str], list[int]]:
    """Whitespace words of `context` and, for every character, the index of its word (a separator belongs to
    the word before it; leading separators to -1)."""
    words: list[str] = []
    char_to_word: list[int] = []
    after_space = True
    for char in context:
        if char in _CONTEXT_WHITESPACE:
            after_space = True
        else:
            if after_space:
                words.append(char)
            else:
                words[-1] += char
            after_space = False
        char_to_word.append(len(words) - 1)
    return words, char_to_word


@dataclass(frozen=True)
class SquadFile:
    """A SQuAD JSON file read once: its path, parsed JSON and the sha256 of its bytes. A run passes it to all that
    uses the file (examples, the scoring check, the feature-cache key, the metric), so that all see the same
    bytes even if the file changes meanwhile. The JSON is shared: read it, never change it."""

    path: Path
    data: dict[str, Any]
    sha256: str


def read_squad_file(path: str | Path) -> SquadFile:
    """The SQuAD file at path; InputError (naming the file) when it is missing, not UTF-8, not JSON or not an object
    with a 'data' list."""
    # newline="": the text as it is, so that its UTF-8 bytes are the file's own (the cache key's sha256)
    text = read_json_text(path, "SQuAD JSON file", {"missing": "file not found"}, newline="")
    data = parse_json_text(path, text)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise InputError(f"{path}: not a SQuAD file (expected an object with a 'data' list)")
    return SquadFile(Path(path), data, hashlib.sha256(text.encode("utf-8")).hexdigest())


def as_squad_file(source: SquadFile | str | Path) -> SquadFile:
    """A SquadFile as it is, or the one at a path, read now."""
    return source if isinstance(source, SquadFile) else read_squad_file(source)


def is_squad_v2(data: dict[str, Any]) -> bool:
    """True for a SQuAD 2.0 file: its version says 2, or a question carries `is_impossible`."""
    if str(data.get("version", "")).lstrip("v").startswith("2"):
        return True
    return any(
        "is_impossible" in qa
        for article in data["data"]
        for paragraph in article.get("paragraphs", ())
        for qa in paragraph.get("qas", ())
    )


def read_squad_examples(
    source: SquadFile | str | Path, is_training: bool, version_2_with_negative: bool = False
) -> list[SquadExample]:
    """Examples of a SQuAD JSON file, in file order.

    Every gold answer is located in words. For training, the first answer is the target; a question whose
    first answer text is not found in its words is skipped with a warning (as the reference code does), and a
    question without answers is an error unless `version_2_with_negative` marks it impossible.
    Raises InputError naming the file and the question for malformed input.
    """
    squad_file = as_squad_file(source)
    path, data = squad_file.path, squad_file.data
    examples: list[SquadExample] = []
    skipped = 0
    where = "the file"
    seen: dict[str, tuple[str, str, str]] = {}  # question id -> (where, question, context) where first met
    try:
        context_id = 0
        for a, article in enumerate(data["data"]):
            for p, paragraph in enumerate(article["paragraphs"]):
                where = paragraph_where = f"article {a} paragraph {p}"
                if not isinstance(paragraph["context"], str):  # split_context would take a list's items for words
                    raise _BadEntry(f"the context is a JSON {type(paragraph['context']).__name__}, expected a string")
                words, char_to_word = split_context(paragraph["context"])
                for qa in paragraph["qas"]:
                    where = f"question {qa['id']!r}"
                    # SQuAD 2.0 marks unanswerable questions; an empty answer list means the same there.
                    impossible = version_2_with_negative and bool(qa.get("is_impossible", False) or not qa["answers"])
                    answers = [] if impossible else [_locate(ans, char_to_word) for ans in qa["answers"]]
                    example = SquadExample(
                        _question_id(qa), _question_text(qa), words, answers, impossible, context_id
                    )
                    _refuse_another_question_of_that_id(seen, example.qas_id, paragraph_where,
                                                        example.question_text, paragraph["context"])
                    if is_training and not impossible and not _trainable(example, path, where):
                        skipped += 1
                        continue
                    examples.append(example)
                context_id += 1
    except (KeyError, TypeError, AttributeError) as error:
        detail = f"missing key {error}" if isinstance(error, KeyError) else "unexpected structure"
        raise InputError(f"{path}: not a SQuAD file ({where}: {detail})") from None
    except _BadEntry as error:
        raise InputError(f"{path}: {where}: {error}") from None
    if skipped:
        logger.warning("%s: %d training question(s) skipped", path, skipped)
    return examples


def _refuse_another_question_of_that_id(seen: dict[str, tuple[str, str, str]], qid: str, where: str, question: str,
                                       context: str) -> None:
    """Predictions and scores are keyed by question id: a second question of one id (another question or another
    context) would take the first one's answer. The same entry twice is the same question."""
    first = seen.setdefault(qid, (where, question, context))
    if first[1:] != (question, context):
        raise _BadEntry(f"given twice, in {first[0]} and in {where}, for different questions or contexts; "
                        "predictions are keyed by id: give each question an id of its own")


def _trainable(example: SquadExample, path: Path, where: str) -> bool:
    """Whether the first answer's text is found in its words (else a warning: the reference skips the question);
    InputError for an answerable question without answers."""
    if not example.answers:
        raise InputError(f"{path}: {where} has no answer (pass --version_2_with_negative for SQuAD 2.0)")
    first = example.answers[0]
    found = " ".join(example.doc_tokens[first.start_word : first.end_word + 1])
    if " ".join(first.text.split()) not in found:
        logger.warning("%s: %s: answer %r not in the context, skipped", path, where, first.text)
        return False
    return True


class _BadEntry(Exception):
    """A question or answer that cannot be used; read_squad_examples adds the file and the question."""


def _question_text(qa: dict[str, Any]) -> str:
    # The reference code accepts an empty question and trains or predicts on "[CLS] [SEP] context [SEP]":
    # an answer with no question to answer, almost surely a broken entry, so it is refused.
    question = qa["question"]
    if not isinstance(question, str) or holds_no_text(question):  # whitespace, control or zero-width characters
        raise _BadEntry(f"the question text is {question!r}, which tokenizes to nothing; write the question or "
                        "remove this entry")
    return question


def _question_id(qa: dict[str, Any]) -> str:
    qid = qa["id"]
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):  # the predictions file is keyed by it
        raise _BadEntry(f"the question id is {qid!r}; give every question a string id")
    return str(qid)


def _locate(answer: dict[str, Any], char_to_word: list[int]) -> SquadAnswer:
    text, start = answer["text"], answer["answer_start"]
    if not isinstance(text, str) or isinstance(start, bool):  # str() of a list or True as index 1 is no answer
        raise _BadEntry(f"answer {text!r} at {start!r}: expected a text string and a character index")
    end = start + len(text) - 1 if isinstance(start, int) else -1
    if not isinstance(start, int) or not text or start < 0 or end >= len(char_to_word):
        raise _BadEntry(f"answer {text!r} at {start!r} lies outside the context")
    if char_to_word[end] < 0:  # the span lies in the whitespace before the first word: it would end at word -1
        raise _BadEntry(f"answer {text!r} at {start!r} covers no word of the context")
    return SquadAnswer(text, start, max(char_to_word[start], 0), char_to_word[end])


# ---------------------------------------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowSettings:
    """How examples become fixed-length windows (NVIDIA's defaults)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64


@dataclass
class SquadFeatures:
    """N windows of length L. `token_to_orig` is the word (index into the example's doc_tokens) of each
    document piece, -1 on [CLS], the query, [SEP] and padding. Positions are 0 ([CLS]) when the window does not
    hold the answer, and 0 everywhere when not training."""

    input_ids: np.ndarray  # int32 [N, L], zero-padded
    input_mask: np.ndarray  # int8 [N, L]
    segment_ids: np.ndarray  # int8 [N, L]
    start_positions: np.ndarray  # int64 [N]
    end_positions: np.ndarray  # int64 [N]
    example_index: np.ndarray  # int32 [N], index into the example list
    token_to_orig: np.ndarray  # int32 [N, L]
    token_is_max_context: np.ndarray  # bool [N, L]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def _gather_pieces(ids: np.ndarray, offsets: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated pieces of lines `which` of a CSR (ids, offsets) layout, and the piece count of each line."""
    counts = offsets[which + 1] - offsets[which]
    starts = np.zeros(len(which), np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    index = np.repeat(offsets[which] - starts, counts) + np.arange(int(counts.sum()))
    return ids[index], counts


class _DocumentPieces:
    """Piece ids of contexts, each distinct word tokenized once for the whole data set (as the tokenizer's
    in_context gives it: a BPE word after the first keeps its leading space)."""

    def __init__(self, examples: Sequence[SquadExample], tokenizer: FineTuningTokenizer) -> None:
        self._word_id: dict[str, int] = {}
        self._line = tokenizer.in_context
        for example in examples:
            for index, word in enumerate(example.doc_tokens):
                self._word_id.setdefault(self._line(word, index == 0), len(self._word_id))
        self._ids, self._offsets = tokenizer.encode_lines(list(self._word_id))
        self._by_context: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def of(self, example: SquadExample) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pieces int32 [T], piece -> word int32 [T], word -> first piece int64 [W + 1]) of the context."""
        key = example.context_id
        if key >= 0 and key in self._by_context:
            return self._by_context[key]
        lines = (self._line(word, index == 0) for index, word in enumerate(example.doc_tokens))
        which = np.fromiter((self._word_id[line] for line in lines), np.int64, len(example.doc_tokens))
        pieces, counts = _gather_pieces(self._ids, self._offsets, which)
        word_start = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=word_start[1:])
        piece_word = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        result = (pieces, piece_word, word_start)
        if key >= 0:
            self._by_context[key] = result
        return result


def _improve_answer_span(pieces: np.ndarray, start: int, end: int, answer_pieces: np.ndarray) -> tuple[int, int]:
    """The first sub-span of pieces[start..end] whose pieces equal the tokenized answer text, else the span.
    (Words like "1895s" hold the answer "1895" only as a prefix; its own pieces are the better target.)"""
    n = len(answer_pieces)
    if n == 0:
        return start, end
    for new_start in range(start, end - n + 2):
        if np.array_equal(pieces[new_start : new_start + n], answer_pieces):
            return new_start, new_start + n - 1
    return start, end


def _windows(n_pieces: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of the windows over n_pieces document pieces: the last one ends at the document end."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < n_pieces:
        length = min(n_pieces - start, window)
        spans.append((start, length))
        if start + length == n_pieces:
            break
        start += min(length, stride)
    return spans


def _max_context_window(spans: list[tuple[int, int]], n_pieces: int) -> np.ndarray:
    """For each document piece, the window where min(left, right) context + 0.01 * window length is highest
    (the first such window on ties): int64 [n_pieces].

    Each window updates only its own pieces, so time and memory grow with the pieces the windows hold (a
    windows x pieces score table took gigabytes for a book-length context)."""
    best = np.zeros(n_pieces, np.int64)
    best_score = np.full(n_pieces, -np.inf)
    for k, (start, length) in enumerate(spans):
        inside = slice(start, start + length)
        position = np.arange(start, start + length)
        score = np.minimum(position - start, start + length - 1 - position) + 0.01 * length
        better = score > best_score[inside]  # strictly: the earlier window keeps a tie, as argmax does
        best_score[inside] = np.where(better, score, best_score[inside])
        best[inside] = np.where(better, k, best[inside])
    return best


@dataclass
class _WindowLayout:
    """One example before its windows are laid out: its query and document pieces, the word of every document
    piece, the windows (start, length) over the document, and the gold piece span (training, answerable)."""

    example_index: int
    query: np.ndarray
    pieces: np.ndarray
    piece_word: np.ndarray
    spans: list[tuple[int, int]]
    gold: Optional[tuple[int, int]]


def convert_examples_to_features(
    examples: Sequence[SquadExample],
    tokenizer: FineTuningTokenizer,
    settings: WindowSettings = WindowSettings(),
    is_training: bool = False,
) -> SquadFeatures:
    """Windows of every example, in example order (the windows of one example are consecutive)."""
    if settings.doc_stride < 1 or settings.max_query_length < 0:
        raise InputError(f"doc_stride ({settings.doc_stride}) must be >= 1 and max_query_length >= 0")
    layouts = _window_layouts(examples, tokenizer, settings, is_training)
    out = _empty_features(sum(len(layout.spans) for layout in layouts), settings.max_seq_length)
    cls_id, sep_id = tokenizer.vocab.id("[CLS]"), tokenizer.vocab.id("[SEP]")
    row = 0
    for layout in layouts:
        row = _lay_out_windows(out, row, layout, cls_id, sep_id)
    return out


def _window_layouts(
    examples: Sequence[SquadExample], tokenizer: FineTuningTokenizer, settings: WindowSettings, is_training: bool
) -> list[_WindowLayout]:
    """The window layout of every example; raises InputError when a query leaves no room for the document."""
    seq_len = settings.max_seq_length
    documents = _DocumentPieces(examples, tokenizer)
    # Questions and training answers tokenized in bulk; "\n" is whitespace to BERT and the line separator here.
    q_ids, q_offsets = tokenizer.encode_lines([e.question_text.replace("\n", " ") for e in examples])
    if is_training:
        # Each answer as it reads inside its context (the gold span's pieces start where a word does).
        answer_texts = [tokenizer.in_context(e.answers[0].text.replace("\n", " "), e.answers[0].start_word == 0)
                        if e.answers else "" for e in examples]
        a_ids, a_offsets = tokenizer.encode_lines(answer_texts)
    layouts = []
    for i, example in enumerate(examples):
        query = q_ids[q_offsets[i] : q_offsets[i + 1]][: settings.max_query_length]
        pieces, piece_word, word_start = documents.of(example)
        window = seq_len - len(query) - 3
        if window < 1:
            raise InputError(
                f"max_seq_length {seq_len} leaves no room for the document after the {len(query)}-token query of"
                f" question {example.qas_id!r} (lower max_query_length)"
            )
        spans = _windows(len(pieces), window, settings.doc_stride)
        gold = None
        if is_training and not example.is_impossible:
            answer = example.answers[0]
            start = int(word_start[answer.start_word])
            end = int(word_start[answer.end_word + 1]) - 1
            gold = _improve_answer_span(pieces, start, end, a_ids[a_offsets[i] : a_offsets[i + 1]])
        layouts.append(_WindowLayout(i, query, pieces, piece_word, spans, gold))
    return layouts


def _empty_features(n: int, seq_len: int) -> SquadFeatures:
    """n all-padding windows: zeros, no word (-1), no max context."""
    return SquadFeatures(
        input_ids=np.zeros((n, seq_len), np.int32),
        input_mask=np.zeros((n, seq_len), np.int8),
        segment_ids=np.zeros((n, seq_len), np.int8),
        start_positions=np.zeros(n, np.int64),
        end_positions=np.zeros(n, np.int64),
        example_index=np.zeros(n, np.int32),
        token_to_orig=np.full((n, seq_len), -1, np.int32),
        token_is_max_context=np.zeros((n, seq_len), bool),
    )


def _lay_out_windows(out: SquadFeatures, row: int, layout: _WindowLayout, cls_id: int, sep_id: int) -> int:
    """Writes the windows of `layout` as `[CLS] query [SEP] doc [SEP]` from row `row` on; returns the next row."""
    if not layout.spans:  # a context without any word piece has no window
        return row
    best_window = _max_context_window(layout.spans, len(layout.pieces))
    doc_offset = len(layout.query) + 2  # [CLS] query [SEP]
    gold = layout.gold
    for k, (start, length) in enumerate(layout.spans):
        end = doc_offset + length
        doc = slice(start, start + length)
        out.input_ids[row, 0] = cls_id
        out.input_ids[row, 1 : doc_offset - 1] = layout.query
        out.input_ids[row, doc_offset - 1] = sep_id
        out.input_ids[row, doc_offset:end] = layout.pieces[doc]
        out.input_ids[row, end] = sep_id
        out.input_mask[row, : end + 1] = 1
        out.segment_ids[row, doc_offset : end + 1] = 1
        out.token_to_orig[row, doc_offset:end] = layout.piece_word[doc]
        out.token_is_max_context[row, doc_offset:end] = best_window[doc] == k
        out.example_index[row] = layout.example_index
        if gold is not None and start <= gold[0] and gold[1] <= start + length - 1:
            out.start_positions[row] = gold[0] - start + doc_offset
            out.end_positions[row] = gold[1] - start + doc_offset
        row += 1
    return row


# ---------------------------------------------------------------------------------------------------------
# Feature cache (.npz: plain arrays, nothing unpickled)
# ---------------------------------------------------------------------------------------------------------
def features_cache_key(
    data_sha256: str,
    vocab: Vocab | BpeVocab,
    do_lower_case: bool,
    settings: WindowSettings,
    is_training: bool,
    version_2_with_negative: bool,
) -> str:
    """sha256 over everything the features depend on: data and vocab content, casing, window settings,
    training or not, v2 handling and the feature format version."""
    parts = {
        "format": FEATURES_FORMAT_VERSION,
        "data_sha256": data_sha256,
        "vocab_sha256": vocab.sha256,
        "do_lower_case": bool(do_lower_case),
        "max_seq_length": settings.max_seq_length,
        "doc_stride": settings.doc_stride,
        "max_query_length": settings.max_query_length,
        "is_training": bool(is_training),
        "version_2_with_negative": bool(version_2_with_negative),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def features_cache_path(cache_dir: str | Path, cache_key: str) -> Path:
    """Where the features of `cache_key` live in `cache_dir`."""
    return Path(cache_dir) / f"squad_features_{cache_key[:20]}.npz"


def save_features(path: str | Path, features: SquadFeatures, cache_key: str) -> None:
    """Writes the features and their key to an .npz, atomically."""
    arrays = {f.name: getattr(features, f.name) for f in fields(SquadFeatures)}
    write_atomic(Path(path), lambda f: np.savez(f, cache_key=np.array(cache_key), **arrays))


def load_features(path: str | Path, cache_key: str) -> Optional[SquadFeatures]:
    """The cached features if `path` holds features of exactly `cache_key`, else None (a missing, stale or
    damaged cache is rebuilt, never trusted)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            if str(npz["cache_key"]) != cache_key:
                logger.warning("%s: cache key differs, rebuilding features", path)
                return None
            features = SquadFeatures(**{f.name: npz[f.name] for f in fields(SquadFeatures)})
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as error:
        logger.warning("%s: unreadable feature cache (%s), rebuilding", path, error)
        return None
    return features


def cached_features(
    examples: Sequence[SquadExample],
    tokenizer: FineTuningTokenizer,
    settings: WindowSettings,
    is_training: bool,
    squad_file: SquadFile | str | Path,
    version_2_with_negative: bool,
    cache_dir: Optional[str | Path],
    deferred_writes: Optional[list[Callable[[], None]]] = None,
) -> SquadFeatures:
    """convert_examples_to_features through the cache in `cache_dir` (no cache when it is None). With
    `deferred_writes`, a missing cache entry is not written but its write appended there, for a caller that
    writes nothing before every input is checked."""
    if cache_dir is None:
        return convert_examples_to_features(examples, tokenizer, settings, is_training)
    key = features_cache_key(
        as_squad_file(squad_file).sha256, tokenizer.vocab, tokenizer.do_lower_case, settings, is_training,
        version_2_with_negative,
    )
    path = features_cache_path(cache_dir, key)
    features = load_features(path, key)
    if features is None:
        features = convert_examples_to_features(examples, tokenizer, settings, is_training)
        if deferred_writes is None:
            save_features(path, features, key)
        else:
            deferred_writes.append(lambda: save_features(path, features, key))
    return features


def examples_and_features(
    source: SquadFile | str | Path,
    tokenizer: FineTuningTokenizer,
    settings: WindowSettings,
    is_training: bool,
    version_2_with_negative: bool,
    cache_dir: Optional[str | Path],
    deferred_writes: Optional[list[Callable[[], None]]] = None,
) -> tuple[list[SquadExample], SquadFeatures]:
    """The examples and windowed features of a SQuAD file, the features through the cache (cached_features);
    InputError when the file holds no usable question or no question with a usable context."""
    squad_file = as_squad_file(source)
    examples = read_squad_examples(squad_file, is_training, version_2_with_negative)
    if not examples:
        raise InputError(f"{squad_file.path}: no {'usable training ' if is_training else ''}questions "
                         f"(--{'train' if is_training else 'predict'}_file needs at least one)")
    features = cached_features(examples, tokenizer, settings, is_training, squad_file, version_2_with_negative,
                               cache_dir, deferred_writes)
    if len(features) == 0:
        raise InputError(f"{squad_file.path}: no features (no questions with a usable context)")
    return examples, features
