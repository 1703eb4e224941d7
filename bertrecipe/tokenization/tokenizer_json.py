"""A tokenizer.json (the `tokenizers` library's file, which transformers saves beside a model) known by its content:
which model it holds (tokenizer_json_model), and a WordPiece one, as a released BERT folder carries, loaded as the
recipe's WordPiece Vocab (load_wordpiece_json).

Such a file is the vocab.txt of the same tokens in another form: its tokens in id order, its casing from its
normalizer (Vocab.lower_case), and as its sha256 that of the vocab.txt holding those tokens (one a line, each line
ending in "\\n"), so that shards, checkpoints and fine-tuned models made with either file are one tokenizer wherever
identities are compared (vocab_files.TokenizerIdentity). It tokenizes as a vocab.txt does (wordpiece.BertTokenizer,
Google's rules): a word of up to Google's 200 characters is split, where the file's own max_input_chars_per_word
(transformers writes 100) would make a word of 101 to 200 characters [UNK]. A file whose normalizer or
pre-tokenizer is not BERT's is refused, since its ids could not be reproduced."""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from bertrecipe.common.errors import DataError
from bertrecipe.tokenization.wordpiece import MAX_CHARS_PER_WORD, SPECIAL_TOKENS, Vocab, vocab_from_bytes

WORDPIECE_MODEL = "WordPiece"  # the "type" of a tokenizer.json's "model" that loads as a Vocab
BPE_MODEL = "BPE"
# What the recipe's WordPiece tokenizer does, which a tokenizer.json must do too for the same ids.
_BERT_NORMALIZER = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True}
_BERT_MODEL = {"unk_token": "[UNK]", "continuing_subword_prefix": "##"}
KINDS_TAKEN = ("--vocab_file takes a WordPiece vocab.txt or tokenizer.json, or a byte-level BPE tokenizer.json")


def is_tokenizer_json(path: str | Path) -> bool:
    """A --vocab_file that names a tokenizer.json rather than a vocab.txt; which model it holds, its content says."""
    return Path(path).suffix == ".json"


def read_tokenizer_json(path: str | Path) -> tuple[bytes, dict[str, Any]]:
    """The file's bytes and its JSON; DataError (one line) when it cannot be read, is not JSON, or names no model
    type (then it is no tokenizer.json)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(path, f"cannot read the tokenizer ({err.strerror}); check --vocab_file") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        problem = " ".join(str(err).split())[:200] or type(err).__name__
        raise DataError(path, f"not a tokenizers tokenizer.json: not JSON ({problem}); {KINDS_TAKEN}") from None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("type"), str):
        raise DataError(path, "not a tokenizers tokenizer.json: it names no model type (no \"model\": {\"type\": "
                              f"...}}); {KINDS_TAKEN}")
    return raw, data


def tokenizer_json_model(path: str | Path) -> str:
    """The type of the model a tokenizer.json holds ("WordPiece", "BPE", "Unigram", ...); read once per process for
    a file as it is now. DataError as read_tokenizer_json."""
    try:
        stat = os.stat(path)
        key: tuple = (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = ()  # read_tokenizer_json reports the problem
    return _cached_model(key, str(path))


@lru_cache(maxsize=8)
def _cached_model(key: tuple, path: str) -> str:
    return read_tokenizer_json(path)[1]["model"]["type"]


def other_model_problem(model: str) -> str:
    """The one line for a tokenizer.json of a model the recipe has no tokenizer for (Unigram, WordLevel)."""
    return f"a tokenizer.json of a {model} model, which the recipe has no tokenizer for; {KINDS_TAKEN}"


def load_wordpiece_json(path: str | Path) -> Vocab:
    """The WordPiece Vocab of a tokenizer.json whose model is WordPiece: its tokens in id order, its casing, and the
    sha256 of the equivalent vocab.txt. DataError (one line naming the file) for another model, ids that are not
    0..n-1, a token no vocab.txt line can hold, or a normalizer, pre-tokenizer or model setting the recipe's
    WordPiece tokenizer does not reproduce."""
    path = Path(path)
    _, data = read_tokenizer_json(path)
    model = data["model"]
    if model["type"] != WORDPIECE_MODEL:
        raise DataError(path, f"its model is {model['type']}, not WordPiece")
    tokens = _tokens_in_id_order(path, model.get("vocab"))
    _check_bert_pipeline(path, data)
    canonical = "".join(token + "\n" for token in tokens).encode("utf-8")
    vocab = vocab_from_bytes(path, canonical)
    if vocab.tokens != tokens:
        at = next((i for i, (a, b) in enumerate(zip(vocab.tokens, tokens, strict=False)) if a != b), len(tokens) - 1)
        raise DataError(path, f"its token {at} ({tokens[at]!r}) cannot be a line of a vocab.txt (a line break, or "
                              "blank space or a byte-order mark at an end), which the recipe's WordPiece needs")
    _check_added_tokens(path, data.get("added_tokens"), vocab)
    normalizer = data["normalizer"]
    return Vocab(path=path, tokens=vocab.tokens, ids=vocab.ids, sha256=vocab.sha256,
                 lower_case=bool(normalizer.get("lowercase", True)))


def _tokens_in_id_order(path: Path, vocab: Any) -> tuple[str, ...]:
    """The tokens of the model's {token: id}, which must give the ids 0..n-1, each once."""
    if not isinstance(vocab, dict) or not vocab:
        raise DataError(path, "its WordPiece model has no vocab ({token: id})")
    bad = [index for index in vocab.values() if type(index) is not int]  # bool is no id either
    if bad:
        raise DataError(path, f"its WordPiece vocab gives a token the id {bad[0]!r}, not an integer")
    ids = sorted(vocab.values())
    gap = next((n for n, i in enumerate(ids) if i != n), None)
    if gap is not None:
        what = f"id {ids[gap]} is given twice" if gap and ids[gap] == ids[gap - 1] else f"id {gap} is missing"
        raise DataError(path, f"its WordPiece ids are not 0..{len(ids) - 1} without gaps ({what}), as the lines of a "
                              "vocab.txt are")
    tokens = [""] * len(ids)
    for token, index in vocab.items():
        tokens[index] = token
    return tuple(tokens)


def _check_bert_pipeline(path: Path, data: dict[str, Any]) -> None:
    """BERT's normalizer (strip_accents as lowercase), pre-tokenizer and model settings, which the recipe's
    WordPiece tokenizer applies to every vocab; anything else would give other ids than the file's."""
    normalizer, pre_tokenizer, model = data.get("normalizer"), data.get("pre_tokenizer"), data["model"]
    if not isinstance(normalizer, dict) or any(normalizer.get(k) != v for k, v in _BERT_NORMALIZER.items()):
        raise DataError(path, f"its normalizer ({json.dumps(normalizer)}) is not BERT's (BertNormalizer with "
                              "clean_text and handle_chinese_chars), which the recipe's WordPiece tokenizer applies")
    lower_case = normalizer.get("lowercase", True)
    strip_accents = normalizer.get("strip_accents")
    if not isinstance(lower_case, bool) or strip_accents not in (None, lower_case):
        raise DataError(path, f"its normalizer has lowercase {json.dumps(lower_case)} and strip_accents "
                              f"{json.dumps(strip_accents)}: the recipe strips accents exactly when it lower-cases "
                              "(strip_accents null or equal to lowercase)")
    if not isinstance(pre_tokenizer, dict) or pre_tokenizer.get("type") != "BertPreTokenizer":
        raise DataError(path, f"its pre-tokenizer ({json.dumps(pre_tokenizer)}) is not BertPreTokenizer, which the "
                              "recipe's WordPiece tokenizer applies")
    for key, value in _BERT_MODEL.items():
        if model.get(key, value) != value:
            raise DataError(path, f"its WordPiece {key} is {json.dumps(model.get(key))}, the recipe's is "
                                  f"{json.dumps(value)}")


def _check_added_tokens(path: Path, added: Any, vocab: Vocab) -> None:
    """Added tokens (BERT's special tokens) must be the vocab's own tokens at their ids: the recipe's ids come from
    the vocab alone."""
    for entry in added if isinstance(added, list) else []:
        content, index = (entry.get("content"), entry.get("id")) if isinstance(entry, dict) else (None, None)
        if not isinstance(index, int) or not 0 <= index < len(vocab) or vocab.tokens[index] != content:
            raise DataError(path, f"its added token {content!r} (id {index!r}) is not the WordPiece vocab's token "
                                  "of that id; the recipe tokenizes with the vocab alone")


def wordpiece_tokenizer_json(vocab: Vocab, lower_case: bool) -> str:
    """A vocab.txt as the tokenizer.json of the recipe's WordPiece tokenizer (load_wordpiece_json reads it back as
    the same vocab): BERT's normalizer, pre-tokenizer and Google's 200-character words, the special tokens as
    special, and [CLS] A [SEP] B [SEP] around texts, so that transformers' fast tokenizers (ModernBERT's is one, and
    reads nothing but a tokenizer.json) give the recipe's ids."""
    tokenizer = Tokenizer(models.WordPiece({token: vocab.id(token) for token in vocab.tokens}, unk_token="[UNK]",
                                           max_input_chars_per_word=MAX_CHARS_PER_WORD))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=lower_case, lowercase=lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    cls, sep = ("[CLS]", vocab.id("[CLS]")), ("[SEP]", vocab.id("[SEP]"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[cls, sep])
    return tokenizer.to_str(pretty=True)
