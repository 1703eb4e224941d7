"""Google BERT's BasicTokenizer: its character rules and the tokenizer built on them, in one place.

The rules (what is whitespace, a control character, punctuation or a CJK ideograph) are those of Google's
`tokenization.py`. Everything in the recipe that needs them takes them from here: `basic_tokenize` maps SQuAD
answers back onto the context (squad_answers.py), `clean_text` fixes lines for the `tokenizers` path
(data/tokenization.py), and the byte classes of the vectorised ASCII path (data/ascii_wordpiece.py) are built
from the predicates.
"""
from __future__ import annotations

import unicodedata

# The CJK ideograph blocks that BERT spaces out (each ideograph becomes a word of its own).
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# All non-alphanumeric printable ASCII counts as punctuation ("$", "^", "`" are not Unicode punctuation).
ASCII_PUNCTUATION_RANGES = ((33, 47), (58, 64), (91, 96), (123, 126))
_ASCII_PUNCTUATION = frozenset(chr(c) for low, high in ASCII_PUNCTUATION_RANGES for c in range(low, high + 1))


def is_whitespace(char: str) -> bool:
    """Tab, newline, carriage return, and the space separators (Zs)."""
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def is_control(char: str) -> bool:
    """The Cc and Cf characters other than tab, newline and carriage return (those are whitespace)."""
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


def is_punctuation(char: str) -> bool:
    """Unicode punctuation (P*) and every non-alphanumeric printable ASCII character."""
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def is_cjk(char: str) -> bool:
    """A CJK ideograph (not Hangul, Hiragana or Katakana: those are written with spaces)."""
    cp = ord(char)
    return cp >= 0x3400 and any(low <= cp <= high for low, high in CJK_RANGES)  # most text is below the blocks


def clean_text(text: str) -> str:
    """Google's _clean_text: drop NUL, U+FFFD and control characters; every whitespace becomes a space."""
    return "".join(" " if is_whitespace(c) else c for c in text if not (c in "\x00\ufffd" or is_control(c)))


def holds_no_text(text: str) -> bool:
    """True for a text that tokenizes to nothing: empty, or only whitespace, control, format (zero-width) and
    NUL characters, which Google's tokenizer drops (clean_text)."""
    return not clean_text(text).strip()


def strip_accents(word: str) -> str:
    """The word in NFD without its combining marks (Mn)."""
    return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")


def split_on_punctuation(word: str) -> list[str]:
    """The word cut before and after every punctuation character, which stands alone."""
    tokens: list[str] = []
    current = ""
    for char in word:
        if is_punctuation(char):
            tokens += [current, char] if current else [char]
            current = ""
        else:
            current += char
    if current:
        tokens.append(current)
    return tokens


def basic_tokenize(text: str, do_lower_case: bool) -> list[str]:
    """BERT's basic tokenizer: clean the text, space out CJK ideographs, split on whitespace, lower-case and
    strip accents when uncased, split off every punctuation character."""
    spaced = "".join(f" {c} " if is_cjk(c) else c for c in clean_text(text))
    tokens: list[str] = []
    for word in spaced.split():
        if do_lower_case:
            word = strip_accents(word.lower())
        tokens += split_on_punctuation(word)
    return tokens
