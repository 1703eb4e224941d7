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
from dataclasses import dataclass
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
    return BpeVocab(path, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True),
                    hashlib.sha256(raw).hexdigest(), special)


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
