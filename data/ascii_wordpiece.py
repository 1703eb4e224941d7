"""Google's BERT tokenization of pure-ASCII text, vectorised with numpy over the bytes of the whole text.

For ASCII, Google's basic tokenizer is: drop control characters, lower-case (uncased), split on whitespace,
then split runs of letters/digits from single punctuation marks. So a word is either a maximal run of
[A-Za-z0-9] or one punctuation byte, and it can be found from byte classes alone, with no Python object per
word. Words of up to 16 bytes are keyed by their zero-padded bytes (two uint64, exact since the cleaned text has
no NUL) and made distinct with a direct table (up to 3 bytes) or one numpy sort; only the distinct words become
Python strings, and those not in the vocab go through the `tokenizers` WordPiece model (once, batched; cached
across calls). Longer words, rare, go through a dict.
"""
from __future__ import annotations

from itertools import repeat

import numpy as np
from tokenizers import Tokenizer, models

_LETTER, _PUNCT, _CONTROL = 1, 2, 3
_CLASS = np.zeros(256, np.uint8)  # 0: whitespace (tab, newline, carriage return, space)
# Google removes NUL and the Cc controls except tab, newline and carriage return (\x0b and \x0c included).
_CLASS[[*range(0, 9), 11, 12, *range(14, 32), 127]] = _CONTROL
_CLASS[np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", np.uint8)] = _LETTER
_CLASS[[c for c in range(33, 127) if not chr(c).isalnum()]] = _PUNCT  # Google's ASCII punctuation ranges
KEY_BYTES = 16
TINY_BYTES = 3  # 3 x 7 bits: a direct table of 2**21 entries
_NEWLINE = 10
_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[65:91] += 32
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(9)], np.uint64)  # mask of the k low bytes of a uint64
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier: spreads the first key word before adding the second


class AsciiWordPiece:
    """Encodes ASCII text to WordPiece ids; the pieces of distinct words are cached across calls."""

    def __init__(self, model: models.WordPiece, vocab_ids: dict[str, int], do_lower_case: bool,
                 max_chars_per_word: int) -> None:
        # Vocab words that WordPiece keeps whole when they are the whole word ("##" entries never match a word:
        # "#" is punctuation).
        self._whole = {w: i for w, i in vocab_ids.items() if len(w) <= max_chars_per_word and w.isascii()}
        self._words_hf = Tokenizer(model)  # no normalizer, no pre-tokenizer: each given word is one word
        self.do_lower_case = do_lower_case
        # The cache: word -> row r of a table of pieces, (starts, flat): row r is flat[starts[r]:starts[r + 1]].
        self._row: dict[str, int] = {}
        self._table = (np.zeros(1, np.int64), np.zeros(0, np.int32))

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids of the lines of `text` (split on "\\n" only): flat int32 ids, int64 offsets [lines + 1]."""
        return self.encode_bytes(np.frombuffer(text.encode("ascii"), np.uint8))

    def encode_bytes(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """encode() of ASCII text given as uint8 [N]."""
        kind = _CLASS[raw]
        control = kind == _CONTROL
        if control.any():
            raw, kind = raw[~control], kind[~control]
        if self.do_lower_case:
            raw = _LOWER[raw]
        text = raw.tobytes().decode("ascii")  # only distinct words are ever sliced out of it
        letter = kind == _LETTER
        punct = kind == _PUNCT
        before = np.zeros_like(letter)
        before[1:] = letter[:-1]
        after = np.zeros_like(letter)
        after[:-1] = letter[1:]
        starts = np.flatnonzero(punct | (letter & ~before))
        ends = np.flatnonzero(punct | (letter & ~after)) + 1  # words never nest: ends pair with starts in order
        newlines = np.flatnonzero(raw == _NEWLINE)
        line_words = np.empty(len(newlines) + 2, np.int64)
        line_words[0], line_words[-1] = 0, len(starts)
        line_words[1:-1] = np.searchsorted(starts, newlines)
        rows, table_start, table = self._word_rows(text, raw, starts, ends)
        counts = (table_start[1:] - table_start[:-1])[rows]
        piece_end = np.zeros(len(starts) + 1, np.int64)
        np.cumsum(counts, out=piece_end[1:])
        ids = table[spread(table_start[rows], piece_end)]
        return ids, piece_end[line_words]

    def _word_rows(self, text: str, raw: np.ndarray, starts: np.ndarray,
                   ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every word its row of the piece table: (rows [W], first piece of every row, flat piece ids)."""
        lengths = ends - starts
        short = np.flatnonzero(lengths <= KEY_BYTES)
        padded = np.zeros(len(raw) + KEY_BYTES, np.uint8)
        padded[:len(raw)] = raw
        # A little-endian uint64 starting at every byte (an unaligned view): 1-D gathers, no [S, 16] copy.
        at = np.ndarray((len(raw) + KEY_BYTES - 7,), np.dtype("<u8"), padded, 0, (1,))
        first_byte = starts[short]
        size = lengths[short]
        # The 16 bytes from the word's start with the bytes after the word zeroed (no NUL in a word): exact.
        key0 = at[first_byte] & _LOW_BYTES[np.minimum(size, 8)]
        key1 = at[first_byte + 8] & _LOW_BYTES[np.clip(size - 8, 0, 8)]
        # Words of up to 3 bytes (many of the most frequent: "the", ",", "of") pack exactly into 21 bits and are
        # made distinct with a direct table instead of the sort.
        tiny = np.flatnonzero(size <= TINY_BYTES)
        other = np.flatnonzero(size > TINY_BYTES)
        packed = key0[tiny]
        code = (packed & 0x7F) | ((packed >> 1) & 0x3F80) | ((packed >> 2) & 0x1FC000)
        present = np.zeros(1 << 21, bool)
        present[code] = True
        tiny_codes = np.flatnonzero(present)
        lookup = np.empty(1 << 21, np.int64)
        lookup[tiny_codes] = np.arange(len(tiny_codes))
        tiny_rows = lookup[code]
        tiny_first = np.empty(len(tiny_codes), np.int64)
        tiny_first[tiny_rows] = tiny
        mixed = key0[other] * _MIX + key1[other]
        distinct, inverse = np.unique(mixed, return_inverse=True)
        first = np.empty(len(distinct), np.int64)
        first[inverse] = other  # one word with each value (the last)
        # The mixed value is only a hash: check that every word equals the word kept for its value.
        kept = first[inverse]
        exact = np.array_equal(key0[kept], key0[other]) and np.array_equal(key1[kept], key1[other])
        rows = np.empty(len(starts), np.int64)
        if exact:
            rows[short[tiny]] = tiny_rows
            rows[short[other]] = len(tiny_codes) + inverse
            chosen = short[np.concatenate((tiny_first, first))]
            words = [text[s:e] for s, e in zip(starts[chosen].tolist(), ends[chosen].tolist())]
            rest = np.flatnonzero(lengths > KEY_BYTES)
        else:  # two different words collided: key every word by its string instead
            words = []
            rest = np.arange(len(starts))
        if rest.size:
            index = {word: i for i, word in enumerate(words)}
            for i, word in enumerate(text[s:e] for s, e in zip(starts[rest].tolist(), ends[rest].tolist())):
                rows[rest[i]] = index.setdefault(word, len(index))
            words = list(index)
        word_rows, table_start, table = self._pieces(words)
        return word_rows[rows], table_start, table

    def _pieces(self, words: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row of each word in the cached piece table, first piece of every row int64 [rows + 1], flat int32
        piece ids). Words not seen before are added at once: vocab words directly, the others through one
        batched WordPiece call."""
        row = self._row
        missing = [word for word in words if word not in row]
        if missing:
            # Greedy longest-match-first keeps a vocab word whole: one piece, its own id.
            whole_id = np.fromiter(map(self._whole.get, missing, repeat(-1)), np.int64, count=len(missing))
            hard = np.flatnonzero(whole_id < 0)
            counts = np.ones(len(missing), np.int64)
            hard_ids: list[int] = []
            if hard.size:
                encoding = self._words_hf.encode([missing[i] for i in hard.tolist()], is_pretokenized=True,
                                                 add_special_tokens=False)
                hard_ids = encoding.ids
                counts[hard] = np.bincount(np.asarray(encoding.word_ids, np.int64), minlength=hard.size)
            old_starts, old_flat = self._table
            starts = np.empty(len(missing) + 1, np.int64)
            starts[0] = old_starts[-1]
            np.cumsum(counts, out=starts[1:])
            starts[1:] += old_starts[-1]
            flat = np.empty(int(counts.sum()), np.int32)
            easy = whole_id >= 0
            flat[starts[:-1][easy] - old_starts[-1]] = whole_id[easy]
            hard_offsets = np.zeros(hard.size + 1, np.int64)
            np.cumsum(counts[hard], out=hard_offsets[1:])
            flat[spread(starts[:-1][hard] - old_starts[-1], hard_offsets)] = hard_ids
            row.update(zip(missing, range(len(old_starts) - 1, len(old_starts) - 1 + len(missing))))
            self._table = (np.concatenate((old_starts[:-1], starts)), np.concatenate((old_flat, flat)))
        return np.fromiter(map(row.__getitem__, words), np.int64, count=len(words)), *self._table


def spread(dest_starts: np.ndarray, src_offsets: np.ndarray) -> np.ndarray:
    """For every position of a CSR layout (src_offsets), its position in a layout whose segment k starts at
    dest_starts[k]: int64 [src_offsets[-1] - src_offsets[0]]. Used both to scatter and to gather segments."""
    lengths = np.diff(src_offsets)
    total = int(src_offsets[-1] - src_offsets[0])
    shift = np.repeat(dest_starts - src_offsets[:-1], lengths)
    return shift + np.arange(src_offsets[0], src_offsets[0] + total)


def non_ascii_lines(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For UTF-8 bytes: (numbers of the lines holding a non-ASCII byte, start and end byte of every line)."""
    newlines = np.flatnonzero(raw == _NEWLINE)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(raw)]))
    bad = np.unique(np.searchsorted(newlines, np.flatnonzero(raw >= 0x80)))
    return bad, starts, ends
