"""A byte-level BPE tokenizer.json (ModernBERT's, or one that bertPrep.py --action create_vocab --vocab_type bpe
writes; a tokenizer.json whose model is WordPiece is a vocab.txt's other form: tokenizer_json.py) with BERT's special
tokens: load_bpe checks it and finds the special ids; BpeTokenizer gives the fine-tuning commands the interface of
wordpiece.BertTokenizer (encode_lines, vocab, in_context).

Byte-level BPE is cased and lossless: the tokenizer's own normalizer rules, so --do_lower_case does not apply.
A word keeps the leading space its pieces were learnt with ("Ġword"), except the first word of a text: so a SQuAD
context tokenized word by word gives the pieces of the whole context tokenized at once (the byte-level
pre-tokenizer never joins two words into one piece)."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Sequence, Sized, Union

import numpy as np
from tokenizers import Tokenizer

from bertrecipe.common.errors import DataError
from bertrecipe.tokenization.tokenizer_json import (
    BPE_MODEL,
    WORDPIECE_MODEL,
    is_tokenizer_json,
    other_model_problem,
    read_tokenizer_json,
    tokenizer_json_model,
)
from bertrecipe.tokenization.wordpiece import SPECIAL_TOKENS, BertTokenizer, ids_and_offsets

# word_rule's answers: texts tokenized whole; words cached, new ones through the tokenizer; and new ASCII words
# through the model alone, cut by the byte-level pattern here (ASCII's letters, digits and spaces are fixed).
WHOLE_TEXTS, WORDS, ASCII_WORDS = "whole texts", "words", "ascii words"
# The byte-level pre-tokenizer's pattern (GPT-2's) on ASCII, where \p{L} is [A-Za-z] and \p{N} is [0-9].
_ASCII_PIECES = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
# Byte-level BPE's characters for the ASCII bytes: printable ones stand for themselves, bytes 0-32 are U+0100 on
# (the space U+0120, "Ġ"), DEL U+0121.
_BYTE_LEVEL_ASCII = {b: chr(b) if 33 <= b <= 126 else chr(256 + b if b < 33 else 289) for b in range(128)}

# ModernBERT embeds 50,368 ids for the 50,280 of its tokenizer: a model may hold this many more embeddings than a
# tokenizer.json has tokens (its vocab padded to a multiple of 64, and more) and still be its model.
BPE_EMBEDDING_SLACK = 128


@dataclass(frozen=True)
class BpeVocab:
    """A loaded tokenizer.json: its tokenizer, size (added tokens included), file hash and special ids."""

    path: Path
    tokenizer: Tokenizer
    size: int
    sha256: str
    special: dict[str, int]  # [PAD] [UNK] [CLS] [SEP] [MASK] -> id
    word_rule: str = WHOLE_TEXTS  # how SpacedWordEncoder may tokenize data preparation's texts (word_rule)

    def __len__(self) -> int:
        return self.size

    def id(self, token: str) -> int:
        return self.special[token]

    def size_problem(self, model_vocab_size: int) -> tuple[str | None, bool]:
        return bpe_size_problem(self, model_vocab_size)

    def casing_problem(self, do_lower_case: bool) -> str | None:
        """None: the tokenizer's own normalizer decides the casing, and --do_lower_case does not apply to it."""
        return None


def is_bpe_file(path: str | Path) -> bool:
    """A --vocab_file that names a byte-level BPE tokenizer.json: a tokenizer.json whose model is not WordPiece (a
    released BERT's is, and loads as a vocab.txt: tokenizer_json.py). One that cannot be read yet counts by its
    name: a file still to be written, or one whose loader will say what is wrong with it."""
    if not is_tokenizer_json(path):
        return False
    try:
        return tokenizer_json_model(path) != WORDPIECE_MODEL
    except DataError:
        return True


def load_bpe(path: str | Path) -> BpeVocab:
    """The tokenizer.json at path; DataError (one line) if it cannot be read, parsed, holds another model than BPE,
    or lacks a special token."""
    path = Path(path)
    raw, data = read_tokenizer_json(path)  # one line for a file that is no tokenizer.json
    model = data["model"]["type"]
    if model != BPE_MODEL:
        raise DataError(path, other_model_problem(model) if model != WORDPIECE_MODEL else
                        "a WordPiece tokenizer.json, where a byte-level BPE one is needed")
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as err:  # tokenizers raises plain Exception for a bad file; UnicodeDecodeError too
        problem = " ".join(str(err).split())[:200]
        raise DataError(path, f"not a tokenizers tokenizer.json ({problem}); write one with bertPrep.py --action "
                              "create_vocab --vocab_type bpe") from None
    special = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, index in special.items() if index is None]
    if missing:
        raise DataError(path, f"the tokenizer lacks the special token(s) {' '.join(missing)}, which BERT's rows and "
                              "masks need; train it with bertPrep.py --action create_vocab --vocab_type bpe")
    # Text that spells a special token ("[SEP]" in an article about BERT) is text: its bytes, not the token's id,
    # as Google's WordPiece tokenizer splits it into pieces.
    tokenizer.encode_special_tokens = True
    # A tokenizer.json may carry a model's truncation or padding settings: ids are wanted whole and unpadded (the
    # shards' rows and the fine-tuning windows are cut by the recipe), so a document is never cut at 512 tokens.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return BpeVocab(path, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True),
                    hashlib.sha256(raw).hexdigest(), special, word_rule(data))


def word_rule(data: dict) -> str:
    """How a tokenizer.json may tokenize a text whose only whitespace is single spaces between words. WORDS where
    its pieces never cross a space and each space leads the word after it, whatever the neighbouring words: true
    of byte-level BPE without a normalizer or BPE dropout when no added token could match across a space (its
    pattern, runs of letters, of numbers, of other characters, each with one optional leading space, and
    contractions, stops at every space). ASCII_WORDS where, besides, nothing but the model acts after the
    pattern (no added token to match, no space added in front)."""
    pre_tokenizer = data.get("pre_tokenizer") or {}
    if data.get("normalizer") is not None or data["model"].get("dropout") is not None:
        return WHOLE_TEXTS
    if pre_tokenizer.get("type") != "ByteLevel" or not pre_tokenizer.get("use_regex", True):
        return WHOLE_TEXTS
    # Special tokens are text here (encode_special_tokens); another added token is matched in the raw text.
    added = [token for token in data.get("added_tokens", []) if not token.get("special")]
    if not all(_never_spans_a_space(token) for token in added):
        return WHOLE_TEXTS
    return WORDS if added or pre_tokenizer.get("add_prefix_space", True) else ASCII_WORDS


def _never_spans_a_space(token: dict) -> bool:
    """An added token that no single-spaced text matches across a space: no whitespace and no right strip (which
    would take the next word's space), or whitespace that such a text never holds (a run, a tab, a newline)."""
    content = token.get("content", "")
    if not any(character.isspace() for character in content):
        return not token.get("rstrip", False)
    return "  " in content or any(character.isspace() and character != " " for character in content)


class SpacedWordEncoder:
    """A tokenizer.json's ids of texts a batch at a time, equal to its encode_batch's (no special tokens), through
    a cache of the words already seen. Where word_rule allows, a text whose only whitespace is single spaces
    between words (a document as data preparation makes it) has the ids of its words, the first as it is, each
    other one with its leading space, looked up or tokenized once; a text with other whitespace is tokenized
    whole. Natural text repeats its words (Zipf), so a corpus is mostly lookups, and tokenizers' pattern, which
    takes most of its byte-level time, runs on new non-ASCII words alone."""

    def __init__(self, vocab: BpeVocab, capacity: int = 1 << 17) -> None:
        self.tokenizer = vocab.tokenizer
        self.rule = vocab.word_rule
        # Words and pieces kept, about 200 bytes each (25 MB in all); the cache starts afresh when it is full. A 5 MB
        # shard of books held 90,000; most of a corpus's words are its few thousand commonest, soon cached again.
        self.capacity = capacity
        self.leading: dict[str, list[int] | None] = {}  # a text's first word; None: not a word (tokenize whole)
        self.spaced: dict[str, list[int] | None] = {}  # a later word, tokenized with its leading space
        self.pieces: dict[str, list[int]] = {}  # an ASCII word's byte-level pieces (ASCII_WORDS)

    def encode(self, texts: list[str]) -> tuple[list[int], list[int]]:
        """(all texts' ids in order, each text's number of ids)."""
        if self.rule == WHOLE_TEXTS:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
            return [i for encoding in encodings for i in encoding.ids], [len(e.ids) for e in encodings]
        words = [text.split(" ") for text in texts]
        self._learn(words)
        ids: list[int] = []
        lengths: list[int] = []
        leading, spaced = self.leading, self.spaced
        for text, text_words in zip(texts, words, strict=True):
            pieces = [leading[text_words[0]], *map(spaced.__getitem__, text_words[1:])]
            if None in pieces:  # whitespace other than single spaces between words: the text as a whole
                pieces = [self.tokenizer.encode(text, add_special_tokens=False).ids]
            start = len(ids)
            ids.extend(chain.from_iterable(pieces))
            lengths.append(len(ids) - start)
        return ids, lengths

    def _learn(self, words: list[list[str]]) -> None:
        """Tokenize the first and later words of the texts that the cache lacks."""
        if len(self.leading) + len(self.spaced) + len(self.pieces) > self.capacity:
            for cache in (self.leading, self.spaced, self.pieces):
                cache.clear()
        new_leading = {text_words[0] for text_words in words} - self.leading.keys()
        new_spaced = {word for text_words in words for word in text_words[1:]} - self.spaced.keys()
        self._add(self.leading, new_leading, "")
        self._add(self.spaced, new_spaced, " ")

    def _add(self, cache: dict[str, list[int] | None], words: set[str], lead: str) -> None:
        cache.update(dict.fromkeys(words))
        # A word is a non-empty run without whitespace; "" (two spaces, an edge space) or a tab inside is not.
        real = [word for word in words if word.split() == [word]]
        if self.rule == ASCII_WORDS:
            cache.update((word, self._ascii_ids(lead + word)) for word in real if word.isascii())
            real = [word for word in real if not word.isascii()]
        encodings = self.tokenizer.encode_batch([lead + word for word in real], add_special_tokens=False)
        cache.update((word, encoding.ids) for word, encoding in zip(real, encodings, strict=True))

    def _ascii_ids(self, text: str) -> list[int]:
        """The ids of an ASCII word (with its leading space, if any): its byte-level pieces, each looked up or
        merged by the model once ("word," and "(word" share "word")."""
        ids: list[int] = []
        for piece in _ASCII_PIECES.findall(text):
            piece_ids = self.pieces.get(piece)
            if piece_ids is None:
                tokens = self.tokenizer.model.tokenize(piece.translate(_BYTE_LEVEL_ASCII))
                piece_ids = self.pieces[piece] = [token.id for token in tokens]
            ids += piece_ids
        return ids


def bpe_size_problem(vocab: Sized, model_vocab_size: int) -> tuple[str | None, bool]:
    """(problem, whether --allow_vocab_mismatch may pass it) for a model of model_vocab_size word embeddings."""
    n = len(vocab)
    if n > model_vocab_size:
        return (f"the tokenizer has {n:,} tokens but the model embeds only {model_vocab_size:,}: ids from "
                f"{model_vocab_size:,} on have no embedding; pass the model's own tokenizer.json"), False
    if model_vocab_size > n + BPE_EMBEDDING_SLACK:
        return (f"the tokenizer has {n:,} tokens but the model embeds {model_vocab_size:,} (more than "
                f"{BPE_EMBEDDING_SLACK} past them): it is not the model's tokenizer, its ids would stand for other "
                "words; pass the model's own tokenizer.json"), True
    return None, True


class BpeTokenizer:
    """A tokenizer.json's ids without special tokens, through the interface of wordpiece.BertTokenizer."""

    do_lower_case = False  # the tokenizer's normalizer decides

    def __init__(self, vocab: BpeVocab) -> None:
        self.vocab = vocab

    def encode_lines(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of many texts: flat int32 ids and int64 offsets [len(lines)+1]."""
        return ids_and_offsets(self.vocab.tokenizer.encode_batch(list(lines), add_special_tokens=False))

    @staticmethod
    def in_context(text: str, at_start: bool) -> str:
        """What to tokenize for a part of a longer text (a word, an answer) to get its pieces there: after the
        start, with the leading space that the part has in the text."""
        return text if at_start else " " + text


FineTuningTokenizer = Union[BertTokenizer, BpeTokenizer]  # what load_tokenizer gives the fine-tuning commands
