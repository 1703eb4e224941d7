"""Task distillation's data augmentation: TinyBERT's method, as NVIDIA's `data_augmentation.py` runs it before task
distillation, with the teacher's masked LM as the only source of candidates (docs/distillation.md says where this
differs from NVIDIA's).

Each text of a training example is copied N times; in each copy every replaceable word is replaced, with
probability p, by one of its K candidates drawn uniformly. A copy equal to the original or to an earlier copy is
dropped (so up to N remain, as in TinyBERT); the original comes first and every other field (labels included) is
copied as it is.

Words are BERT's basic tokens (split at whitespace, control characters and punctuation, each CJK ideograph alone),
found in the original text with their character spans: a copy changes the replaced words and nothing else (casing,
spacing and punctuation stay). A word is replaceable when it is all letters (str.isalpha: never a number,
punctuation, a CJK ideograph or a special token written in the text such as "[SEP]"), is not one of STOP_WORDS,
and overlaps no protected span (a SQuAD answer).

Candidates: the word, however many WordPiece pieces it has, becomes one [MASK]; the masked LM reads
`[CLS] masked text [SEP] unmasked text [SEP]` (TinyBERT's input: the second segment shows the word, which keeps
the candidates near its meaning) or, with `with_original` off, `[CLS] masked text [SEP]`; each segment is a
window of the text around the word when the text is longer than max_seq_length allows. The candidates are the K
tokens of highest logit at the [MASK] among the vocab's whole words (is_candidate_token: two letters or more, so
never a "##" piece, a special token, a number, punctuation, a CJK ideograph or a lone letter) other than the word
itself (compared case-insensitively, accents stripped). A candidate for a capitalised word is capitalised.

The draws, for a text with U replaceable words: rng = numpy.random.default_rng(key); replace = rng.random((N, U))
< p; pick = rng.random((N, U)); copy k puts candidates[j][floor(pick[k, j] * len(candidates[j]))] in word j's place
where replace[k, j]. The key says which text it is (see glue_rows and augment_squad), so a text's copies depend on
the seed and the text's place alone, never on batching or on the other texts.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import nn

from bertrecipe.common.atomic_files import atomic_output, write_atomic
from bertrecipe.common.errors import DataError, InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.finetuning.glue import GlueTask
from bertrecipe.finetuning.model_loading import build_model, config_and_weights
from bertrecipe.model.families import is_modern_config, pretraining_model
from bertrecipe.model.weights import CONFIG_FILES, HF_WEIGHT_FILES
from bertrecipe.tokenization.basic_tokenizer import is_cjk, is_control, is_punctuation, is_whitespace, strip_accents
from bertrecipe.tokenization.wordpiece import BertTokenizer, Vocab

# NLTK's English stop words, the list NVIDIA's script uses (its entries with an apostrophe left out: a word never
# holds one), with the question words NLTK has and NVIDIA's list dropped, so that a question keeps asking the same.
STOP_WORDS = frozenset("""
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers herself it
its itself they them their theirs themselves what which who whom this that these those am is are was were be been
being have has had having do does did doing a an the and but if or because as until while of at by for with about
against between into through during before after above below to from up down in out on off over under again
further then once here there when where why how all any both each few more most other some such no nor not only
own same so than too very s t can will just don should now d ll m o re ve y ain aren couldn didn doesn hadn hasn
haven isn ma mightn mustn needn shan shouldn wasn weren won wouldn
""".split())
# NVIDIA's copies per example (its script's table, which overrides --N; here --N overrides it).
DEFAULT_COPIES = {"cola": 30, "mnli": 10, "mrpc": 30, "sst-2": 20, "sts-b": 30, "qqp": 10, "qnli": 20, "rte": 30,
                  "wnli": 30, "squadv1.1": 15, "squadv2.0": 15}
RECORD_VERSION = 1  # bump when the algorithm changes, so that no earlier output is taken as this one's

Span = tuple[int, int]  # [start, end) in characters
Edit = tuple[int, int, str]  # the characters [start, end) of the original text become the string


@dataclass(frozen=True)
class AugmentationSettings:
    """N (copies), K (candidates), p (replacement probability), the seed, and how the masked LM runs."""

    copies: int = 20
    candidates: int = 15
    replace_probability: float = 0.4
    seed: int = 42
    max_seq_length: int = 128  # of a masked LM input, both segments together
    with_original: bool = True  # TinyBERT's second segment: the text unmasked
    batch_size: int = 256  # masked texts per forward pass

    def __post_init__(self) -> None:
        if self.copies < 1 or self.candidates < 1 or self.batch_size < 1:
            raise InputError(f"copies ({self.copies}), candidates ({self.candidates}) and batch_size "
                             f"({self.batch_size}) must each be at least 1")
        if not 0.0 <= self.replace_probability <= 1.0:
            raise InputError(f"the replacement probability p must lie in [0, 1], not {self.replace_probability}")
        if self.max_seq_length < (7 if self.with_original else 3):
            raise InputError(f"max_seq_length {self.max_seq_length} leaves no room around the [MASK]")

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sentence:
    """A text to augment: the character spans of its words and which of them may be replaced."""

    text: str
    spans: tuple[Span, ...]
    replaceable: tuple[int, ...]  # indexes into spans


def _separates(char: str) -> bool:
    return is_whitespace(char) or is_control(char) or char in "\x00\ufffd"


def word_spans(text: str) -> list[Span]:
    """The character spans of BERT's basic tokens in text: runs between separators (whitespace, control
    characters), with every punctuation character and CJK ideograph a word of its own."""
    spans: list[Span] = []
    start = None
    for index, char in enumerate(text):
        alone = is_punctuation(char) or is_cjk(char)
        if start is not None and (alone or _separates(char)):
            spans.append((start, index))
            start = None
        if alone:
            spans.append((index, index + 1))
        elif start is None and not _separates(char):
            start = index
    if start is not None:
        spans.append((start, len(text)))
    return spans


def sentence_of(text: str, protected: Sequence[Span] = ()) -> Sentence:
    """The text's words and the replaceable ones among them (see the module): all letters, no stop word, no
    part in a protected span."""
    spans = word_spans(text)
    replaceable = tuple(index for index, (start, end) in enumerate(spans)
                        if text[start:end].isalpha() and not is_cjk(text[start])
                        and text[start:end].lower() not in STOP_WORDS
                        and text[start - 1:start] + text[end:end + 1] != "[]"  # "[SEP]" written in the text
                        and not any(start < p_end and p_start < end for p_start, p_end in protected))
    return Sentence(text, tuple(spans), replaceable)


def draw_copies(sentence: Sentence, candidates: Sequence[Sequence[str]], settings: AugmentationSettings,
                rng: np.random.Generator) -> list[list[Edit]]:
    """The N copies of the module's draws, as edits of the original text (duplicates included)."""
    count = len(sentence.replaceable)
    replace = rng.random((settings.copies, count)) < settings.replace_probability
    pick = rng.random((settings.copies, count))
    copies = []
    for k in range(settings.copies):
        edits = []
        for j, word in enumerate(sentence.replaceable):
            if replace[k, j] and candidates[j]:
                start, end = sentence.spans[word]
                edits.append((start, end, candidates[j][math.floor(pick[k, j] * len(candidates[j]))]))
        copies.append(edits)
    return copies


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    """text with the edits (in order, not overlapping) made."""
    parts, last = [], 0
    for start, end, new in edits:
        parts += [text[last:start], new]
        last = end
    return "".join(parts) + text[last:]


def shifted(offset: int, edits: Sequence[Edit]) -> int:
    """Where character `offset` of the original text is after the edits (none of which covers it)."""
    return offset + sum(len(new) - (end - start) for start, end, new in edits if end <= offset)


def distinct_copies(sentence: Sentence, candidates: Sequence[Sequence[str]], settings: AugmentationSettings,
                    rng: np.random.Generator) -> list[list[Edit]]:
    """draw_copies without the copies equal to the original or to an earlier copy."""
    seen = {sentence.text}
    kept = []
    for edits in draw_copies(sentence, candidates, settings, rng):
        text = apply_edits(sentence.text, edits)
        if text not in seen:
            seen.add(text)
            kept.append(edits)
    return kept


def _same_word(word: str, token: str) -> bool:
    return strip_accents(word.lower()) == strip_accents(token.lower())


def _in_case_of(word: str, token: str) -> str:
    return token[:1].upper() + token[1:] if word[:1].isupper() else token


@dataclass
class _MaskedRow:
    """One masked LM input: which sentence and which of its replaceable words it asks about."""

    sentence: int
    slot: int
    ids: np.ndarray
    segment_ids: np.ndarray
    mask_position: int


class MaskedWordPredictor:
    """The candidates of every replaceable word of many texts from the teacher's masked LM, many masked texts per
    forward pass (the slow part: texts of similar length are batched together)."""

    def __init__(self, model: nn.Module, tokenizer: BertTokenizer, settings: AugmentationSettings) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.settings = settings
        vocab = tokenizer.vocab
        self._mask, self._cls, self._sep = vocab.id("[MASK]"), vocab.id("[CLS]"), vocab.id("[SEP]")
        self._pad = vocab.ids.get("[PAD]", 0)  # padding is masked out of attention: any id would do
        self._device = next(model.parameters()).device
        whole_word = [is_candidate_token(token) for token in vocab.tokens]
        self._whole_words = torch.tensor(whole_word, device=self._device)
        self._looked_at = min(settings.candidates + 4, sum(whole_word))  # room for the word's own spellings
        segments = 2 if settings.with_original else 1
        self._window = (settings.max_seq_length - 1 - segments) // segments

    def candidates(self, sentences: Sequence[Sentence]) -> list[list[list[str]]]:
        """For each sentence, the candidates of each of its replaceable words."""
        rows = self._masked_rows(sentences)
        found: list[list[list[str]]] = [[[] for _ in s.replaceable] for s in sentences]
        rows.sort(key=lambda row: len(row.ids))
        for first in range(0, len(rows), self.settings.batch_size):
            batch = rows[first:first + self.settings.batch_size]
            for row, tokens in zip(batch, self._top_tokens(batch), strict=True):
                sentence = sentences[row.sentence]
                start, end = sentence.spans[sentence.replaceable[row.slot]]
                word = sentence.text[start:end]
                kept = [_in_case_of(word, token) for token in tokens if not _same_word(word, token)]
                found[row.sentence][row.slot] = kept[:self.settings.candidates]
        return found

    def _masked_rows(self, sentences: Sequence[Sentence]) -> list[_MaskedRow]:
        words = [s.text[start:end] for s in sentences for start, end in s.spans]
        ids, offsets = self.tokenizer.encode_lines(words)
        rows, first_word = [], 0
        for index, sentence in enumerate(sentences):
            bounds = offsets[first_word:first_word + len(sentence.spans) + 1]
            pieces = ids[bounds[0]:bounds[-1]].astype(np.int64)
            bounds = bounds - bounds[0]
            rows += [self._masked_row(index, slot, pieces, int(bounds[word]), int(bounds[word + 1]))
                     for slot, word in enumerate(sentence.replaceable)]
            first_word += len(sentence.spans)
        return rows

    def _masked_row(self, sentence: int, slot: int, pieces: np.ndarray, start: int, end: int) -> _MaskedRow:
        """[CLS] masked [SEP] (unmasked [SEP]): pieces[start:end] (one word) as one [MASK], each segment a window of
        the text around the word."""
        masked = np.concatenate([pieces[:start], [self._mask], pieces[end:]])
        masked_from = _window_start(len(masked), start, self._window)
        segment_a = masked[masked_from:masked_from + self._window]
        ids = [[self._cls], segment_a, [self._sep]]
        if self.settings.with_original:
            original_from = _window_start(len(pieces), start, self._window)
            ids += [pieces[original_from:original_from + self._window], [self._sep]]
        joined = np.concatenate(ids).astype(np.int64)
        segment_ids = np.zeros(len(joined), np.int64)
        segment_ids[len(segment_a) + 2:] = 1
        return _MaskedRow(sentence, slot, joined, segment_ids, 1 + start - masked_from)

    @torch.inference_mode()
    def _top_tokens(self, batch: Sequence[_MaskedRow]) -> list[list[str]]:
        """The whole-word tokens of highest logit at each row's [MASK], best first (a few more than K, for the
        caller to drop the word's own spellings)."""
        length = max(len(row.ids) for row in batch)
        ids = np.full((len(batch), length), self._pad, np.int64)
        segments, real = np.zeros_like(ids), np.zeros_like(ids)
        for i, row in enumerate(batch):
            ids[i, :len(row.ids)] = row.ids
            segments[i, :len(row.ids)] = row.segment_ids
            real[i, :len(row.ids)] = 1
        input_ids = torch.from_numpy(ids).to(self._device)
        predict = torch.zeros_like(input_ids, dtype=torch.bool)
        predict[torch.arange(len(batch)), torch.tensor([row.mask_position for row in batch])] = True
        output = self.model(input_ids, torch.from_numpy(segments).to(self._device),
                            torch.from_numpy(real).to(self._device), predict_positions=predict)
        logits = output.prediction_logits.float()[:, :len(self._whole_words)]
        logits = logits.masked_fill(~self._whole_words, -math.inf)
        top = logits.topk(self._looked_at, dim=1).indices.tolist()
        return [[self.tokenizer.vocab.tokens[i] for i in row] for row in top]


def is_candidate_token(token: str) -> bool:
    """Whether a vocab token can replace a word: a whole word of two letters or more (never a "##" piece, a
    special token, a number, punctuation, a CJK ideograph or a lone letter)."""
    return len(token) >= 2 and token.isalpha() and not any(is_cjk(char) for char in token)


def _window_start(length: int, position: int, window: int) -> int:
    """The first piece of a window of `window` pieces of a text of `length` pieces with `position` near its
    middle (0 when the whole text fits)."""
    return max(0, min(position - window // 2, length - window))


# The masked-LM head's own weights (the decoder is tied to the word embeddings), by family.
MASKED_LM_HEADS = {"bert": ("cls.predictions.transform.dense.weight", "cls.predictions.bias"),
                   "modern": ("head.dense.weight",)}


def load_masked_lm(checkpoint: Path, config_file: Optional[Path], vocab: Vocab, max_seq_length: int) -> nn.Module:
    """The teacher with its masked-LM head (BertForPreTraining, or ModernBertForMaskedLM for a modern config) from
    any checkpoint the project loads (ours, NVIDIA's, a transformers folder); InputError naming the checkpoint when
    it has no masked-LM head (a fine-tuned classifier, a bare encoder), which augmentation cannot do without."""
    config, weights = config_and_weights(str(config_file) if config_file else None, str(checkpoint))
    head = MASKED_LM_HEADS["modern" if is_modern_config(config) else "bert"]
    missing = [name for name in head if name not in weights.state_dict]
    if missing:
        raise InputError(f"{checkpoint}: has no masked-LM head ({missing[0]} missing); data augmentation takes its "
                         "candidates from the teacher's masked-LM predictions: pass a checkpoint that has them (a "
                         "pre-training checkpoint, a BertForMaskedLM or BertForPreTraining folder)")
    return build_model(pretraining_model, config, weights, str(checkpoint), vocab, max_seq_length)


def teacher_files(checkpoint: Path, config_file: Optional[Path]) -> list[Path]:
    """The files the teacher is read from, for the record: its weights (a folder's model.safetensors or
    pytorch_model.bin) and its config file (the given one, else one in or beside the checkpoint, if any)."""
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    weights = next((checkpoint / name for name in HF_WEIGHT_FILES if (checkpoint / name).is_file()),
                   checkpoint) if checkpoint.is_dir() else checkpoint
    config = config_file or next((folder / name for name in CONFIG_FILES if (folder / name).is_file()), None)
    return [weights] + ([config] if config is not None else [])


def text_key(text: str) -> int:
    """A stable number for a text (an id, a context), for the draws' key: equal texts draw alike."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


@dataclass(frozen=True)
class Augmented:
    """One text's result: what the caller attached to it, the text, and its distinct copies as edits."""

    tag: Any
    sentence: Sentence
    copies: list[list[Edit]]


Progress = Callable[[int], None]  # called with the number of texts done so far


def augment_texts(predictor: MaskedWordPredictor, items: Iterable[tuple[Any, Sentence, Sequence[int]]],
                  chunk: int = 1024, progress: Optional[Progress] = None) -> Iterator[Augmented]:
    """(tag, sentence, key) in, Augmented out, in order: the masked LM runs on `chunk` texts at a time."""
    done = 0
    pending: list[tuple[Any, Sentence, Sequence[int]]] = []
    for item in _with_end(iter(items)):
        if item is not None:
            pending.append(item)
        if pending and (item is None or len(pending) == chunk):
            found = predictor.candidates([sentence for _, sentence, _ in pending])
            for (tag, sentence, key), candidates in zip(pending, found, strict=True):
                rng = np.random.default_rng(list(key))
                yield Augmented(tag, sentence, distinct_copies(sentence, candidates, predictor.settings, rng))
            done += len(pending)
            pending = []
            if progress is not None:
                progress(done)


def _with_end(items: Iterator[Any]) -> Iterator[Any]:
    yield from items
    yield None


# ---------------------------------------------------------------------------------------------------------
# GLUE: train.tsv -> train_aug.tsv
# ---------------------------------------------------------------------------------------------------------
def glue_items(rows: Sequence[Sequence[str]], task: GlueTask, seed: int
               ) -> Iterator[tuple[tuple[int, int], Sentence, Sequence[int]]]:
    """Each text of each row: tag (row, column), key [seed, row, 0 for the first text or 1 for the second]."""
    columns = [task.text_a] if task.text_b is None else [task.text_a, task.text_b]
    for row_index, row in enumerate(rows):
        for position, column in enumerate(columns):
            yield (row_index, column), sentence_of(row[column]), (seed, row_index, position)


def glue_rows(rows: Sequence[Sequence[str]], task: GlueTask, predictor: MaskedWordPredictor,
              progress: Optional[Progress] = None) -> Iterator[list[str]]:
    """The rows of train_aug.tsv after its header: each row, then the copies of its first text (the second text
    as it is), then those of its second text (the first as it is), as NVIDIA's script lays them out."""
    for result in augment_texts(predictor, glue_items(rows, task, predictor.settings.seed), progress=progress):
        row_index, column = result.tag
        row = list(rows[row_index])
        if column == task.text_a:
            yield row
        for edits in result.copies:
            yield [*row[:column], apply_edits(result.sentence.text, edits), *row[column + 1:]]


def write_augmented_tsv(path: Path, header: Optional[str], rows: Iterable[Sequence[str]],
                     before_commit: Callable[[], None] = lambda: None) -> tuple[str, int]:
    """Writes the TSV (the header line as given, then the rows as they come) whole or not at all; returns its
    sha256 and number of rows. before_commit() runs once everything is written, before the file takes its name (to
    check that the inputs did not change meanwhile)."""
    digest, count = hashlib.sha256(), 0
    with atomic_output(path) as tmp, open(tmp, "xb") as out:
        for line in _tsv_lines(header, rows):
            data = (line + "\n").encode("utf-8")
            digest.update(data)
            out.write(data)
            count += 1
        out.flush()
        os.fsync(out.fileno())  # the rename must never show a file whose data is still only in the page cache
        before_commit()
    return digest.hexdigest(), count - (header is not None)


def _tsv_lines(header: Optional[str], rows: Iterable[Sequence[str]]) -> Iterator[str]:
    if header is not None:
        yield header
    for row in rows:
        yield "\t".join(row)


# ---------------------------------------------------------------------------------------------------------
# SQuAD: train-v1.1.json -> train-v1.1_aug.json (v2.0 alike)
# ---------------------------------------------------------------------------------------------------------
SQUAD_PARTS = ("context", "question")


def first_questions(data: dict[str, Any], limit: Optional[int]) -> dict[str, Any]:
    """The SQuAD data cut to its first `limit` questions (paragraphs and articles left empty dropped); all of it
    for None."""
    if limit is None:
        return data
    articles, left = [], limit
    for article in data["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            if left > 0 and paragraph["qas"]:
                paragraphs.append({**paragraph, "qas": paragraph["qas"][:left]})
                left -= len(paragraphs[-1]["qas"])
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    return {**data, "data": articles}


def _answers_of(qa: dict[str, Any]) -> list[dict[str, Any]]:
    """A question's answers and, in SQuAD 2.0, its plausible answers: the spans a context copy keeps."""
    return [*qa.get("answers", ()), *qa.get("plausible_answers", ())]


def check_squad_answers(data: dict[str, Any], path: str | Path) -> None:
    """DataError naming the file and the question for an answer or plausible answer that is not a text at a
    character index inside its context (finetuning.squad checks the answers it reads; SQuAD 2.0's plausible
    answers it does not read)."""
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                for answer in _answers_of(qa):
                    start = answer.get("answer_start") if isinstance(answer, dict) else None
                    text = answer.get("text") if isinstance(answer, dict) else None
                    if (not isinstance(start, int) or isinstance(start, bool) or not isinstance(text, str)
                            or start < 0 or start + len(text) > len(paragraph["context"])):
                        raise DataError(path, f"question {qa['id']!r}: answer {answer!r} is not a text at a "
                                              "character index inside the context")


def augment_squad(data: dict[str, Any], part: str, predictor: MaskedWordPredictor,
                  progress: Optional[Progress] = None) -> dict[str, Any]:
    """The SQuAD data with copies: of each question (part "question": the copies follow it in its paragraph,
    ids `<id>_aug<k>`), or of each context with its answers (and plausible answers) never replaced and moved to
    their new places (part "context", NVIDIA's choice: each copy is a paragraph after its original, holding all its
    questions under ids `<id>_aug<k>`). The draws' keys: [seed, text_key(question id)] for a question, [seed,
    text_key(context)] for a context, so that an entry given twice gets the same copies twice."""
    if part not in SQUAD_PARTS:
        raise ValueError(f"part must be one of {SQUAD_PARTS}, not {part!r}")
    places = [(a, p) for a, article in enumerate(data["data"]) for p in range(len(article["paragraphs"]))]
    augment = _augmented_contexts if part == "context" else _augmented_questions
    paragraphs = augment(data, places, predictor, progress)
    articles = [{**article, "paragraphs": [made for p in range(len(article["paragraphs"]))
                                           for made in paragraphs[(a, p)]]}
                for a, article in enumerate(data["data"])]
    return {**data, "data": articles}


Place = tuple[int, int]  # (article, paragraph)


def _augmented_contexts(data: dict[str, Any], places: list[Place], predictor: MaskedWordPredictor,
                        progress: Optional[Progress]) -> dict[Place, list[dict[str, Any]]]:
    """Each paragraph's place -> the paragraph and its copies."""
    seed = predictor.settings.seed

    def item(place: Place) -> tuple[Place, Sentence, Sequence[int]]:
        paragraph = _paragraph(data, place)
        context = paragraph["context"]
        return place, sentence_of(context, _answer_spans(paragraph)), (seed, text_key(context))

    # a context has some hundred masked texts: a smaller chunk keeps their arrays small
    return {result.tag: _context_copies(_paragraph(data, result.tag), result)
            for result in augment_texts(predictor, map(item, places), chunk=64, progress=progress)}


def _augmented_questions(data: dict[str, Any], places: list[Place], predictor: MaskedWordPredictor,
                         progress: Optional[Progress]) -> dict[Place, list[dict[str, Any]]]:
    """Each paragraph's place -> the paragraph with each question followed by its copies."""
    seed = predictor.settings.seed
    items = (((a, p, q), sentence_of(qa["question"]), (seed, text_key(str(qa["id"]))))
             for a, p in places for q, qa in enumerate(_paragraph(data, (a, p))["qas"]))
    questions: dict[Place, list[dict[str, Any]]] = {place: [] for place in places}
    for result in augment_texts(predictor, items, progress=progress):
        place, index = result.tag[:2], result.tag[2]
        questions[place] += _question_copies(_paragraph(data, place)["qas"][index], result)
    return {place: [{**_paragraph(data, place), "qas": qas}] for place, qas in questions.items()}


def _paragraph(data: dict[str, Any], place: Sequence[int]) -> dict[str, Any]:
    return data["data"][place[0]]["paragraphs"][place[1]]


def _answer_spans(paragraph: dict[str, Any]) -> list[Span]:
    return [(answer["answer_start"], answer["answer_start"] + len(answer["text"]))
            for qa in paragraph["qas"] for answer in _answers_of(qa)]


def _question_copies(qa: dict[str, Any], result: Augmented) -> list[dict[str, Any]]:
    """The question, then its copies."""
    return [qa, *({**qa, "id": f"{qa['id']}_aug{k}", "question": apply_edits(result.sentence.text, edits)}
                  for k, edits in enumerate(result.copies, start=1))]


def _context_copies(paragraph: dict[str, Any], result: Augmented) -> list[dict[str, Any]]:
    """The paragraph, then its copies: the context edited, every answer moved with its text."""
    def moved(answers: list[dict[str, Any]], edits: list[Edit]) -> list[dict[str, Any]]:
        return [{**answer, "answer_start": shifted(answer["answer_start"], edits)} for answer in answers]

    copies = [paragraph]
    for k, edits in enumerate(result.copies, start=1):
        qas = []
        for qa in paragraph["qas"]:
            moved_qa = {**qa, "id": f"{qa['id']}_aug{k}", "answers": moved(qa["answers"], edits)}
            if "plausible_answers" in qa:
                moved_qa["plausible_answers"] = moved(qa["plausible_answers"], edits)
            qas.append(moved_qa)
        copies.append({**paragraph, "context": apply_edits(result.sentence.text, edits), "qas": qas})
    return copies


def refuse_taken_ids(original: dict[str, Any], augmented: dict[str, Any], output: str | Path) -> None:
    """DataError when the id of a copy (`<id>_aug<k>`) is already the id of a question of the input file:
    predictions are keyed by id."""
    taken = {str(qa["id"]) for article in original["data"] for paragraph in article["paragraphs"]
             for qa in paragraph["qas"]}
    originals = {id(qa) for article in original["data"] for paragraph in article["paragraphs"]
                 for qa in paragraph["qas"]}
    for article in augmented["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if id(qa) not in originals and str(qa["id"]) in taken:
                    raise DataError(output, f"the copy id {qa['id']!r} is already the id of a question of the input; "
                                            "rename that question (ids of copies end in _aug<k>)")


def write_augmented_json(path: Path, data: Any, before_commit: Callable[[], None] = lambda: None) -> str:
    """Writes the JSON whole or not at all; returns its sha256. before_commit() as in write_augmented_tsv."""
    content = json.dumps(data, ensure_ascii=False).encode("utf-8")

    def write(f: Any) -> None:
        f.write(content)
        before_commit()

    write_atomic(path, write)
    return hashlib.sha256(content).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# The record of inputs: an output made from the same teacher, train file and flags is reused
# ---------------------------------------------------------------------------------------------------------
def record_path(output: str | Path) -> Path:
    """The record beside an output: `<output name>.augmentation.json`."""
    output = Path(output)
    return output.with_name(output.name + ".augmentation.json")


def inputs_record(teacher_files: Sequence[Path], vocab_sha256: str, do_lower_case: bool, train_file: Path,
                  flags: dict[str, Any]) -> dict[str, Any]:
    """What an output is made from: the sha256 of the teacher's files (weights, config), of its vocab and of the
    train file, the casing, and the flags that change the output (settings, task, part, --max_examples)."""
    return {"version": RECORD_VERSION,
            "teacher": {path.name: file_sha256(path) for path in teacher_files},
            "vocab_sha256": vocab_sha256, "do_lower_case": do_lower_case,
            "train_file_sha256": file_sha256(train_file), "flags": flags}


def finished_before(output: Path, inputs: dict[str, Any]) -> bool:
    """True when output exists whole (its sha256 is the one its record names) and its record's inputs are these."""
    try:
        record = json.loads(record_path(output).read_text(encoding="utf-8"))
        return (isinstance(record, dict) and record.get("inputs") == inputs
                and record.get("output_sha256") == file_sha256(output))
    except (OSError, ValueError):  # no record or no output yet, or one that does not read: make it again
        return False


def write_record(output: Path, inputs: dict[str, Any], output_sha256: str, rows: int) -> Path:
    """The record beside the output, written after it (an output without its record is made again)."""
    record = {"inputs": inputs, "output": output.name, "output_sha256": output_sha256, "rows": rows}
    path = record_path(output)
    content = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8")
    write_atomic(path, lambda f: f.write(content))
    return path
