"""A --vocab_file of either kind, known by its content: WordPiece (a vocab.txt, or a tokenizer.json whose model is
WordPiece, as a released BERT folder holds) or a byte-level BPE tokenizer.json, loaded alike (load_vocab_file), and
a tokenizer's identity (its kind, size and the sha256 of its file; of a WordPiece tokenizer.json, that of the
vocab.txt of its tokens), which shards (their vocab_sha256 attribute) and checkpoints (their "tokenizer" entry)
record, so that wherever a model meets a tokenizer the two are compared by content, never by name; and the files that
give a model folder its tokenizer as transformers' AutoTokenizer reads it (transformers_tokenizer_files)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from bertrecipe.common.errors import DataError, InputError
from bertrecipe.tokenization.bpe import BpeVocab, bpe_size_problem, load_bpe
from bertrecipe.tokenization.tokenizer_json import (
    BPE_MODEL,
    WORDPIECE_MODEL,
    is_tokenizer_json,
    load_wordpiece_json,
    other_model_problem,
    tokenizer_json_model,
    wordpiece_tokenizer_json,
)
from bertrecipe.tokenization.wordpiece import (
    ALLOW_VOCAB_MISMATCH,
    Vocab,
    load_vocab,
    vocab_casing,
    wordpiece_size_problem,
)

AnyVocab = Union[Vocab, BpeVocab]
WORDPIECE, BPE = "wordpiece", "bpe"
# transformers' names for BERT's special tokens, which every vocab the recipe loads holds (either kind).
TRANSFORMERS_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                               "mask_token": "[MASK]"}
# What a model folder holds beside its vocab so that transformers' AutoTokenizer tokenizes as the recipe does.
TRANSFORMERS_TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def vocab_file_kind(path: str | Path) -> str:
    """WORDPIECE or BPE, by content: a vocab.txt and a tokenizer.json whose model is WordPiece are WordPiece, a
    tokenizer.json whose model is BPE is BPE. DataError (one line naming the file) for a tokenizer.json that cannot
    be read, is no tokenizer, or holds another model (its type named)."""
    if not is_tokenizer_json(path):
        return WORDPIECE
    model = tokenizer_json_model(path)
    if model == WORDPIECE_MODEL:
        return WORDPIECE
    if model == BPE_MODEL:
        return BPE
    raise DataError(path, other_model_problem(model))


def load_wordpiece_file(path: str | Path) -> Vocab:
    """The WordPiece Vocab of a vocab.txt or of a tokenizer.json whose model is WordPiece."""
    return load_wordpiece_json(path) if is_tokenizer_json(path) else load_vocab(path)


def load_vocab_file(path: str | Path) -> AnyVocab:
    """The tokenizer of a --vocab_file, of the kind its content says (vocab_file_kind); DataError naming the file
    when it is neither kind."""
    return load_bpe(path) if vocab_file_kind(path) == BPE else load_wordpiece_file(path)


@dataclass(frozen=True)
class TokenizerIdentity:
    """Which tokenizer made some ids: its kind, token count and the sha256 of its file. `source` says where the
    identity was read (a vocab file, a shard, a checkpoint) for the messages. It is a tokenization.wordpiece
    ModelVocab: check_vocab_for_model applies the size rules of its kind to it."""

    kind: str
    size: int
    sha256: str
    source: str

    @property
    def path(self) -> str:  # ModelVocab's: the name that a size problem is reported against
        return self.source

    def __len__(self) -> int:
        return self.size

    def size_problem(self, model_vocab_size: int) -> tuple[Optional[str], bool]:
        if self.kind == BPE:
            return bpe_size_problem(self, model_vocab_size)
        return wordpiece_size_problem(self, model_vocab_size)

    def casing_problem(self, do_lower_case: bool) -> Optional[str]:
        return None  # the tokens are not at hand; the vocab file's own check reads them

    def record(self) -> dict[str, Any]:
        """What a checkpoint stores ("tokenizer")."""
        return {"kind": self.kind, "size": self.size, "sha256": self.sha256}

    def describe(self) -> str:
        return f"{self.kind}, {self.size:,} tokens, sha256 {self.sha256[:12]}"


def identity_of(vocab: AnyVocab) -> TokenizerIdentity:
    """The identity of a loaded --vocab_file."""
    return TokenizerIdentity(BPE if isinstance(vocab, BpeVocab) else WORDPIECE, len(vocab), vocab.sha256,
                             str(vocab.path))


def identity_from_record(record: Any, source: str) -> Optional[TokenizerIdentity]:
    """A checkpoint's "tokenizer" entry as an identity; None when it has none (older checkpoints, NVIDIA's, Hugging
    Face's: nothing to compare)."""
    if not isinstance(record, dict):
        return None
    try:
        return TokenizerIdentity(str(record["kind"]), int(record["size"]), str(record["sha256"]), source)
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{source}: its 'tokenizer' entry {record!r} is not a tokenizer record (kind, size, "
                         "sha256); it was not written by run_pretraining.py") from None


def refuse_other_tokenizer(given: Optional[TokenizerIdentity], expected: Optional[TokenizerIdentity], fix: str,
                           allow_mismatch: bool = False) -> None:
    """One line naming both when `given` is another tokenizer than `expected` (either unknown: nothing to
    compare); with allow_mismatch, a warning instead."""
    if given is None or expected is None or given.sha256 == expected.sha256:
        return
    problem = (f"its tokenizer ({given.describe()}) is not the one of {expected.source} ({expected.describe()}): the "
               "same ids stand for other tokens")
    if allow_mismatch:
        print(f"warning: {given.source}: {problem}; going on ({ALLOW_VOCAB_MISMATCH})", file=sys.stderr, flush=True)
        return
    raise DataError(given.source, f"{problem}; {fix} (or {ALLOW_VOCAB_MISMATCH} to go on)")


def wordpiece_lower_case(vocab: Vocab, do_lower_case: Optional[bool] = None) -> bool:
    """Whether a WordPiece vocab's text is lower-cased: do_lower_case where given, else what the file declares (a
    tokenizer.json's normalizer) or its tokens tell (wordpiece.vocab_casing); DataError naming the file when none
    of them says, since either guess would tokenize some text as the model never saw it."""
    if do_lower_case is not None:
        return do_lower_case
    if vocab.lower_case is not None:
        return vocab.lower_case
    casing = vocab_casing(vocab)
    if casing is None:
        raise DataError(vocab.path, "its tokens do not tell whether the model's text was lower-cased (too few "
                                    "tokens with cased letters, or both kinds); pass --do_lower_case or "
                                    "--no-do_lower_case")
    return casing == "uncased"


def transformers_tokenizer_names(vocab_file: str | Path) -> list[str]:
    """The files a model folder gets for a --vocab_file (transformers_tokenizer_files), known from its name alone."""
    if is_tokenizer_json(vocab_file):
        return ["tokenizer.json", *TRANSFORMERS_TOKENIZER_FILES]
    return ["vocab.txt", "tokenizer.json", *TRANSFORMERS_TOKENIZER_FILES]


def transformers_tokenizer_files(vocab: AnyVocab, model_max_length: int, do_lower_case: Optional[bool] = None,
                                 model_input_names: Optional[list[str]] = None) -> dict[str, bytes]:
    """The files (name -> content) that give a model folder `vocab`'s tokenizer as transformers' AutoTokenizer reads
    it: the vocab's own file as it is (a vocab.txt, or a tokenizer.json); for a vocab.txt, its tokenizer.json too
    (ModernBERT's tokenizer class reads nothing else); and tokenizer_config.json with special_tokens_map.json: the
    tokenizer class (BertTokenizer for WordPiece; the generic fast one for byte-level BPE, whose tokenizer.json says
    the rest), BERT's five special tokens by role, the longest input (the model's max_position_embeddings) and, for
    WordPiece, the casing (wordpiece_lower_case: DataError where it is unknown). `model_input_names` for a model
    that takes no segment ids."""
    names = transformers_tokenizer_names(vocab.path)
    files = {names[0]: Path(vocab.path).read_bytes()}
    settings: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast" if isinstance(vocab, BpeVocab)
                                else "BertTokenizer", **TRANSFORMERS_SPECIAL_TOKENS,
                                "model_max_length": model_max_length}
    if isinstance(vocab, Vocab):
        settings["do_lower_case"] = wordpiece_lower_case(vocab, do_lower_case)
        if not is_tokenizer_json(vocab.path):
            files["tokenizer.json"] = wordpiece_tokenizer_json(vocab, settings["do_lower_case"]).encode("utf-8")
    if model_input_names is not None:
        settings["model_input_names"] = model_input_names
    for name, values in zip(TRANSFORMERS_TOKENIZER_FILES, (settings, TRANSFORMERS_SPECIAL_TOKENS), strict=True):
        files[name] = (json.dumps(values, indent=2) + "\n").encode("utf-8")
    return files
