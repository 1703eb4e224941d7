"""BERT WordPiece tokenization that gives exactly the tokens of Google's reference tokenizer, fast.

The general path is Hugging Face `tokenizers` (BertNormalizer + BertPreTokenizer + WordPiece). Two places where
that pipeline differs from Google's BasicTokenizer are corrected before the text reaches it: private-use
characters (Google keeps them inside a word, `tokenizers` deletes them) and the Greek final sigma (Python's
`str.lower` gives "ς" at the end of a word, `tokenizers` lower-cases character by character to "σ").

Lines made only of ASCII take a faster path (data/ascii_wordpiece.py): words are found with numpy over the bytes
of all those lines at once and only distinct words reach the WordPiece model (`encode_text` takes a whole text).
"""
from __future__ import annotations

import functools
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence, Sized

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from bertrecipe.common.errors import DataError
from bertrecipe.common.files import kind_of_head
from bertrecipe.tokenization.ascii_wordpiece import AsciiWordPiece, non_ascii_lines, spread
from bertrecipe.tokenization.basic_tokenizer import clean_text

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Google's WordpieceTokenizer(max_input_chars_per_word=200): a longer word becomes [UNK], a shorter one is split.
MAX_CHARS_PER_WORD = 200

_PRIVATE_USE = re.compile("[\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]")
# Stand-ins for private-use characters: letters with no case, no decomposition and no punctuation class,
# so `tokenizers` keeps them and, being absent from the vocab, they make their word [UNK] as Google does.
_STAND_IN_CANDIDATES = "\ua500\ua501\ua502\u1401\u1402\u0f40\u0f41"


@dataclass(frozen=True)
class Vocab:
    """A BERT vocab.txt: token i on line i. `ids` maps token -> id as Google's load_vocab does."""

    path: Path
    tokens: tuple[str, ...]
    ids: dict[str, int] = field(repr=False)
    sha256: str
    # Whether its text is lower-cased, where the file says so (a tokenizer.json's normalizer); None for a vocab.txt,
    # whose casing its tokens tell (vocab_casing).
    lower_case: Optional[bool] = None

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, token: str) -> int:
        return self.ids[token]

    def size_problem(self, model_vocab_size: int) -> tuple[Optional[str], bool]:
        return wordpiece_size_problem(self, model_vocab_size)

    def casing_problem(self, do_lower_case: bool) -> Optional[str]:
        return _casing_problem(self, do_lower_case)


class ModelVocab(Protocol):
    """What check_vocab_for_model asks of a vocab: Vocab here, or a tokenizer.json's (tokenization.bpe.BpeVocab)."""

    path: Path

    def __len__(self) -> int: ...

    def size_problem(self, model_vocab_size: int) -> tuple[Optional[str], bool]: ...

    def casing_problem(self, do_lower_case: bool) -> Optional[str]: ...


def load_vocab(path: str | Path) -> Vocab:
    """Read and validate a vocab.txt (UTF-8, one token a line, must hold the five special tokens)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(path, "vocab file not found") from None
    except IsADirectoryError:
        raise DataError(path, "vocab file is a directory") from None
    except OSError as err:
        raise DataError(path, f"cannot read vocab file ({err.strerror})") from None
    return vocab_from_bytes(path, raw)


def vocab_from_bytes(path: Path, raw: bytes) -> Vocab:
    """The Vocab of a vocab.txt's bytes (load_vocab's rules; `path` names the file in the errors). Its sha256 is of
    these bytes."""
    found = kind_of_head(raw[:64])
    if found is not None:
        raise DataError(path, f"{found}, not a vocab file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(path, f"vocab file is not UTF-8 (byte {err.start})") from None
    # A byte-order mark (Windows editors) would otherwise glue itself to token 0 and hide [PAD].
    lines = text.removeprefix("\ufeff").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tokens = tuple([line.strip() for line in lines])
    if not tokens:
        raise DataError(path, "vocab file is empty")
    ids = {token: index for index, token in enumerate(tokens)}  # a repeated token keeps its last line, as Google's
    missing = [token for token in SPECIAL_TOKENS if token not in ids]
    if missing:
        raise DataError(path, f"vocab lacks the special token(s) {' '.join(missing)}")
    return Vocab(path=path, tokens=tokens, ids=ids, sha256=hashlib.sha256(raw).hexdigest())


# The flag of every command that takes a vocab with a model: vocab-model mismatches become warnings.
ALLOW_VOCAB_MISMATCH = "--allow_vocab_mismatch"
CONFIG_VOCAB_MULTIPLE = 8  # NVIDIA's configs round vocab_size up to a multiple of 8 (30,522 tokens -> 30,528)
# Fewer tokens with cased letters than this tell nothing about a vocab's casing (a test's toy vocab).
MIN_TOKENS_FOR_CASING = 1000
_BRACKETED = re.compile(r"\[[^\]]*\]")  # [PAD], [CLS], [unused17], ...


def vocab_casing(vocab: Vocab) -> Optional[str]:
    """"uncased", "cased", or None when the tokens do not tell.

    The rule: leave out the bracketed tokens ([PAD], [CLS], [unused0], ...) and count the tokens that hold a cased
    letter (token.lower() != token.upper()) and, among them, the capitalised ones (token.lower() changes them). With
    fewer than MIN_TOKENS_FOR_CASING tokens holding cased letters: None. Fewer than 1 in 1,000 capitalised:
    "uncased" (Google's uncased vocabs hold none: lower-casing came before the vocab was built, so a capital in
    the text can only become [UNK]). At least 1 in 100 capitalised: "cased" (a cased vocab keeps "The", "He",
    names...). In between: None.
    """
    cased_letters = capitalised = 0
    for token in vocab.tokens:
        if _BRACKETED.fullmatch(token) or token.lower() == token.upper():
            continue
        cased_letters += 1
        capitalised += token != token.lower()
    if cased_letters < MIN_TOKENS_FOR_CASING:
        return None
    if capitalised * 1000 < cased_letters:
        return "uncased"
    return "cased" if capitalised * 100 >= cased_letters else None


def vocab_lower_cases(vocab: Vocab) -> Optional[bool]:
    """Whether the vocab is made for lower-cased text: what a tokenizer.json's normalizer says, else what the tokens
    tell (vocab_casing); None when neither tells."""
    if vocab.lower_case is not None:
        return vocab.lower_case
    casing = vocab_casing(vocab)
    return None if casing is None else casing == "uncased"


def _casing_problem(vocab: Vocab, do_lower_case: bool) -> Optional[str]:
    if vocab.lower_case is not None:  # the file says how it normalizes: nothing to guess from its tokens
        return _declared_casing_problem(vocab.lower_case, do_lower_case)
    casing = vocab_casing(vocab)
    if casing == "uncased" and not do_lower_case:
        return ("the vocab is uncased (no capitalised tokens) but --do_lower_case is not given: every capitalised "
                "word would become [UNK]; add --do_lower_case")
    if casing == "cased" and do_lower_case:
        return ("the vocab is cased (it holds capitalised tokens) but --do_lower_case is given: the text would lose "
                "the case and accents the model was trained with; remove --do_lower_case")
    return None


def _declared_casing_problem(lower_case: bool, do_lower_case: bool) -> Optional[str]:
    """A tokenizer.json's normalizer against --do_lower_case, with each command's way to say it (bertPrep.py takes
    0 or 1, create_pretraining_data.py lower-cases unless --no-do_lower_case, the others only with the flag)."""
    if lower_case and not do_lower_case:
        return ("the tokenizer.json lower-cases the text (its normalizer's lowercase is true) but the run does not: "
                "capitalised words would miss its uncased tokens; pass --do_lower_case (bertPrep.py: "
                "--do_lower_case 1)")
    if do_lower_case and not lower_case:
        return ("the tokenizer.json keeps case (its normalizer's lowercase is false) but the run lower-cases: the "
                "text would lose the case and accents the model was trained with; pass --no-do_lower_case "
                "(bertPrep.py: --do_lower_case 0; run_squad.py, run_glue.py, inference.py: leave out --do_lower_case)")
    return None


def padded_vocab_size(tokens: int) -> int:
    """The most word embeddings a model of a vocab of `tokens` may have: the count rounded up as NVIDIA's configs
    round it."""
    return -(-tokens // CONFIG_VOCAB_MULTIPLE) * CONFIG_VOCAB_MULTIPLE


def wordpiece_size_problem(vocab: Sized, model_vocab_size: int) -> tuple[Optional[str], bool]:
    """(problem, whether the override may pass it) for a model of model_vocab_size word embeddings and a WordPiece
    vocab of len(vocab) tokens."""
    n = len(vocab)
    if n > model_vocab_size:  # the extra ids would index past the embeddings: no override makes that work
        return (f"the vocab has {n:,} tokens but the model embeds only {model_vocab_size:,}: ids from "
                f"{model_vocab_size:,} on have no embedding; pass the model's own vocab.txt"), False
    padded = padded_vocab_size(n)
    if model_vocab_size > padded:
        return (f"the vocab has {n:,} tokens but the model embeds {model_vocab_size:,} (more than the vocab padded "
                f"to a multiple of {CONFIG_VOCAB_MULTIPLE}, {padded:,}): it is not the model's vocab, its ids would "
                "stand for other words; pass the model's own vocab.txt"), True
    return None, True


def check_vocab_for_model(vocab: ModelVocab, *, do_lower_case: Optional[bool] = None,
                          model_vocab_size: Optional[int] = None, allow_mismatch: bool = False) -> list[str]:
    """Refuses (DataError naming the vocab file) a vocab that cannot belong to the model: more tokens than the
    model's word embeddings (model_vocab_size, when known), far fewer (more embeddings than the vocab padded to
    a multiple of 8), or a casing (vocab_casing) that do_lower_case contradicts (when given). With
    allow_mismatch, all but the first (ids without an embedding) are printed on stderr as warnings instead;
    returns the warnings. A tokenizer.json (tokenization.bpe.BpeVocab) has its own size rule and no casing one."""
    problems: list[tuple[str, bool]] = []
    if model_vocab_size is not None:
        problems.append(vocab.size_problem(model_vocab_size))
    if do_lower_case is not None:
        problems.append((vocab.casing_problem(do_lower_case), True))
    warnings = []
    for problem, may_pass in problems:
        if problem is None:
            continue
        if not (allow_mismatch and may_pass):
            hint = f" (or {ALLOW_VOCAB_MISMATCH} to go on)" if may_pass else ""
            raise DataError(vocab.path, problem + hint)
        warnings.append(f"warning: {vocab.path}: {problem.split('; ')[0]}; going on ({ALLOW_VOCAB_MISMATCH})")
        print(warnings[-1], file=sys.stderr, flush=True)
    return warnings


def ids_and_offsets(encodings: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """`tokenizers` encodings as one flat int32 id array and int64 offsets [len(encodings)+1] (encode_lines' form)."""
    offsets = np.zeros(len(encodings) + 1, np.int64)
    np.cumsum([len(encoding.ids) for encoding in encodings], out=offsets[1:])
    ids = np.fromiter((i for encoding in encodings for i in encoding.ids), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


class BertTokenizer:
    """Google-exact BERT tokenization to WordPiece ids (no [CLS]/[SEP] added).

    `encode_lines(lines)` is the bulk interface: it returns (ids int32 [T], offsets int64 [len(lines)+1]),
    line i being ids[offsets[i]:offsets[i+1]].
    """

    def __init__(self, vocab: Vocab, do_lower_case: bool) -> None:
        self.vocab = vocab
        self.do_lower_case = do_lower_case
        self._unk_id = vocab.id("[UNK]")
        model = models.WordPiece(dict(vocab.ids), unk_token="[UNK]", max_input_chars_per_word=MAX_CHARS_PER_WORD)
        # No added/special tokens on purpose: a literal "[MASK]" in the text must split like any other text.
        self._hf = Tokenizer(model)
        self._hf.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
        )
        self._hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._model = model
        self._ascii = AsciiWordPiece(model, vocab.ids, do_lower_case, MAX_CHARS_PER_WORD)

    # -- public -------------------------------------------------------------------------------------------
    @staticmethod
    def in_context(text: str, at_start: bool) -> str:
        """What to tokenize for a part of a longer text (a word, an answer) to get its pieces there: the part
        itself, since WordPiece splits at whitespace anyway."""
        return text

    def tokenize(self, text: str) -> list[str]:
        """Tokens of `text` as strings (for inspection and tests)."""
        ids, _ = self.encode_lines(text.split("\n"))
        return [self.vocab.tokens[i] for i in ids.tolist()]

    def encode(self, text: str) -> list[int]:
        """WordPiece ids of `text`."""
        return self.encode_lines(text.split("\n"))[0].tolist()

    def encode_text(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids of the lines of `text` (split on "\\n" only), as encode_lines(text.split("\\n")) but faster for
        ASCII text, which is tokenized whole without a Python object per line or word."""
        if text.isascii():
            return self._ascii.encode(text)
        raw = np.frombuffer(text.encode("utf-8"), np.uint8)
        bad, starts, ends = non_ascii_lines(raw)
        # The non-ASCII lines become empty lines of the ASCII text (UTF-8 keeps every ASCII byte as is).
        keep = np.ones(len(raw), bool)
        for start, end in zip(starts[bad].tolist(), ends[bad].tolist(), strict=True):
            keep[start:end] = False
        ascii_ids, ascii_offsets = self._ascii.encode_bytes(raw[keep].tobytes())
        spans = zip(starts[bad].tolist(), ends[bad].tolist(), strict=True)
        lines = [raw[s:e].tobytes().decode("utf-8") for s, e in spans]
        return _fill_lines(ascii_ids, ascii_offsets, bad, *self._encode_unicode(lines))

    def encode_lines(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of many lines (none may contain "\\n"): flat int32 ids and int64 offsets [len(lines)+1]."""
        n = len(lines)
        if n == 0:
            return np.zeros(0, np.int32), np.zeros(1, np.int64)
        ascii_mask = np.fromiter((line.isascii() for line in lines), dtype=bool, count=n)
        if ascii_mask.all():
            return self._encode_ascii(lines)
        parts = []
        for mask, encode in ((ascii_mask, self._encode_ascii), (~ascii_mask, self._encode_unicode)):
            where = np.flatnonzero(mask)
            if where.size:
                parts.append((where, *encode([lines[i] for i in where.tolist()])))
        return _merge(n, parts)

    def _encode_ascii(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return self._ascii.encode("\n".join(lines))

    # -- general path -------------------------------------------------------------------------------------
    def _encode_unicode(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        fixed = [self._fix_for_hf(line) for line in lines]
        return ids_and_offsets(self._hf.encode_batch(fixed, add_special_tokens=False))

    @functools.cached_property
    def _stand_in(self) -> str | None:
        """A stand-in letter absent from every vocab token (looked for only when a private-use character comes)."""
        return next((c for c in _STAND_IN_CANDIDATES if not any(c in token for token in self.vocab.tokens)), None)

    def _fix_for_hf(self, line: str) -> str:
        if _PRIVATE_USE.search(line):
            if self._stand_in is None:
                raise DataError(self.vocab.path, "vocab contains every stand-in letter for private-use characters")
            line = _PRIVATE_USE.sub(self._stand_in, line)
        if self.do_lower_case and "\u03a3" in line:
            # Python's lower() knows the final sigma; clean first so removed controls do not change the context.
            line = clean_text(line).lower()
        return line


def _fill_lines(ids: np.ndarray, offsets: np.ndarray, where: np.ndarray, line_ids: np.ndarray,
                line_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, offsets) of lines with the lines `where` (empty there) given the ids of (line_ids, line_offsets):
    _merge of the two for the usual case of a few lines into many, with one pass over the many."""
    added = np.zeros(len(offsets), np.int64)
    added[where + 1] = np.diff(line_offsets)
    new_offsets = offsets + np.cumsum(added)
    filled = spread(new_offsets[where], line_offsets)
    out = np.empty(int(new_offsets[-1]), np.int32)
    others = np.ones(len(out), bool)
    others[filled] = False
    out[others] = ids
    out[filled] = line_ids
    return out, new_offsets


def _merge(n: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Lines 0..n-1 from parts (line numbers, ids, offsets); a line found in several parts takes the ids of the
    last one, earlier parts must have it empty."""
    counts = np.zeros(n, np.int64)
    for where, _, offsets in parts:
        counts[where] = np.diff(offsets)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = np.empty(int(offsets[-1]), np.int32)
    for where, part_ids, part_offsets in parts:
        ids[spread(offsets[where], part_offsets)] = part_ids
    return ids, offsets
