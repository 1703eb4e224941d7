"""Google's BERT tokenization of pure-ASCII text, vectorised with numpy over the bytes of the whole text.

For ASCII, Google's basic tokenizer is: drop control characters, lower-case (uncased), split on whitespace,
then split runs of letters/digits from single punctuation marks. So a word is either a maximal run of
[A-Za-z0-9] or one punctuation byte, and it can be found from byte classes alone, with no Python object per
word. Words of up to 16 bytes are keyed by their zero-padded bytes (two uint64, exact since the cleaned text has
no NUL) and made distinct with a direct table (up to 3 bytes) or a hash table; only the distinct words become
Python strings, and those not in the vocab go through the `tokenizers` WordPiece model (once each; cached
across calls). Longer words, rare, go through a dict.
"""
from __future__ import annotations

from itertools import repeat

import numpy as np
from tokenizers import models

from bertrecipe.tokenization.basic_tokenizer import is_control, is_punctuation

_LETTER, _PUNCT, _CONTROL = 1, 2, 3
# Byte classes from the basic tokenizer's own rules; the ASCII characters left, tab, newline, carriage return
# and space, are its whitespace: class 0.
# Controls are NUL and the Cc characters other than tab, newline and carriage return (\x0b and \x0c included).
_ASCII = [chr(c) for c in range(128)]
_CLASS = np.zeros(256, np.uint8)
_CLASS[[ord(c) for c in _ASCII if is_control(c)]] = _CONTROL
_CLASS[[ord(c) for c in _ASCII if c.isalnum()]] = _LETTER
_CLASS[[ord(c) for c in _ASCII if is_punctuation(c)]] = _PUNCT
# The same as tables for bytes.translate, which maps and deletes bytes several times faster than a numpy lookup.
_CLASS_TABLE = _CLASS.tobytes()
_CONTROL_BYTES = bytes(np.flatnonzero(_CLASS == _CONTROL).tolist())
KEY_BYTES = 16
TINY_BYTES = 3  # 3 x 7 bits: a direct table of 2**21 entries
HASH_BITS = 20  # slots of the table that makes the longer words distinct
_NEWLINE = 10
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(9)], np.uint64)  # mask of the k low bytes of a uint64
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier: spreads the first key word before adding the second


class AsciiWordPiece:
    """Encodes ASCII text to WordPiece ids; the pieces of distinct words are cached across calls."""

    def __init__(self, model: models.WordPiece, vocab_ids: dict[str, int], do_lower_case: bool,
                 max_chars_per_word: int) -> None:
        # Vocab words that WordPiece keeps whole when they are the whole word ("##" entries never match a word:
        # "#" is punctuation; non-ASCII entries never match an ASCII word). Usually the vocab itself, unless it
        # has entries longer than WordPiece's limit (those words become [UNK]).
        self._whole = vocab_ids
        if any(len(w) > max_chars_per_word for w in vocab_ids):
            self._whole = {w: i for w, i in vocab_ids.items() if len(w) <= max_chars_per_word}
        # The WordPiece model alone: one word at a time is ~1.5x faster than a pre-tokenized Tokenizer.encode
        # of all of them, whose Encoding (offsets, word ids) costs more than the pieces.
        self._wordpiece = model.tokenize
        self.do_lower_case = do_lower_case
        # The cache: word -> row r of a table of pieces, (starts, flat): row r is flat[starts[r]:starts[r + 1]].
        self._row: dict[str, int] = {}
        self._table = (np.zeros(1, np.int64), np.zeros(0, np.int32))

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids of the lines of `text` (split on "\\n" only): flat int32 ids, int64 offsets [lines + 1]."""
        return self.encode_bytes(text.encode("ascii"))

    def encode_bytes(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """encode() of ASCII text given as bytes."""
        data = data.translate(None, _CONTROL_BYTES)  # Google's _clean_text
        if self.do_lower_case:
            data = data.lower()  # ASCII letters only, as Google's lower() on ASCII
        raw = np.frombuffer(data, np.uint8)
        kind = np.frombuffer(data.translate(_CLASS_TABLE), np.uint8)
        letter = kind == _LETTER
        punct = kind == _PUNCT
        before = np.zeros_like(letter)
        before[1:] = letter[:-1]
        after = np.zeros_like(letter)
        after[:-1] = letter[1:]
        starts = np.flatnonzero(punct | (letter & ~before))
        ends = np.flatnonzero(punct | (letter & ~after)) + 1  # words never nest: ends pair with starts in order
        del kind, letter, punct, before, after  # a byte each: the peak memory of a run is here
        newlines = np.flatnonzero(raw == _NEWLINE)
        line_words = np.empty(len(newlines) + 2, np.int64)
        line_words[0], line_words[-1] = 0, len(starts)
        line_words[1:-1] = np.searchsorted(starts, newlines)
        rows, table_start, table = self._word_rows(raw, starts, ends)
        counts = (table_start[1:] - table_start[:-1])[rows]
        piece_end = np.zeros(len(starts) + 1, np.int64)
        np.cumsum(counts, out=piece_end[1:])
        ids = table[spread(table_start[rows], piece_end)]
        return ids, piece_end[line_words]

    def _word_rows(self, raw: np.ndarray, starts: np.ndarray,
                   ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every word its row of the piece table: (rows [W], first piece of every row, flat piece ids)."""
        lengths = ends - starts
        short = np.flatnonzero(lengths <= KEY_BYTES)
        size = lengths[short]
        key0, key1 = _word_keys(raw, starts[short], size)
        # Words of up to 3 bytes (many of the most frequent: "the", ",", "of") by a direct table, the others by
        # a hash table.
        tiny = np.flatnonzero(size <= TINY_BYTES)
        tiny_rows, tiny_first = _tiny_rows(key0[tiny], tiny)
        other = np.flatnonzero(size > TINY_BYTES)
        other_rows, other_first = _hashed_rows(key0[other], key1[other])
        rows = np.empty(len(starts), np.int64)
        rows[short[tiny]] = tiny_rows
        rows[short[other]] = len(tiny_first) + other_rows
        chosen = short[np.concatenate((tiny_first, other[other_first]))]
        words = _slice_words(raw, starts[chosen], ends[chosen])
        # Longer words (rare) by a dict; they never equal a shorter one.
        rest = np.flatnonzero(lengths > KEY_BYTES)
        if rest.size:
            index: dict[str, int] = {}
            for i, word in enumerate(_slice_words(raw, starts[rest], ends[rest])):
                rows[rest[i]] = len(words) + index.setdefault(word, len(index))
            words += list(index)
        word_rows, table_start, table = self._pieces(words)
        return word_rows[rows], table_start, table

    def _pieces(self, words: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row of each word in the cached piece table, first piece of every row int64 [rows + 1], flat int32
        piece ids). Words not seen before are added at once: vocab words directly, the others through the
        WordPiece model."""
        row = self._row
        first_row = len(row)
        # The words are distinct: with an empty cache (the first text) all are new, in order.
        missing = [word for word in words if word not in row] if row else words
        if missing:
            # Greedy longest-match-first keeps a vocab word whole: one piece, its own id.
            whole_id = np.fromiter(map(self._whole.get, missing, repeat(-1)), np.int64, count=len(missing))
            hard = np.flatnonzero(whole_id < 0)
            counts = np.ones(len(missing), np.int64)
            hard_ids: list[int] = []
            if hard.size:
                pieces = list(map(self._wordpiece, [missing[i] for i in hard.tolist()]))
                counts[hard] = np.fromiter(map(len, pieces), np.int64, count=len(pieces))
                hard_ids = [piece.id for word_pieces in pieces for piece in word_pieces]
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
            row.update(zip(missing, range(len(old_starts) - 1, len(old_starts) - 1 + len(missing)), strict=True))
            self._table = (np.concatenate((old_starts[:-1], starts)), np.concatenate((old_flat, flat)))
        if missing is words:
            return np.arange(first_row, first_row + len(words)), *self._table
        return np.fromiter(map(row.__getitem__, words), np.int64, count=len(words)), *self._table


def _word_keys(raw: np.ndarray, first_byte: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The key of every word of up to KEY_BYTES bytes: its bytes, zero-padded to 16, as two uint64."""
    padded = np.zeros(len(raw) + KEY_BYTES, np.uint8)
    padded[:len(raw)] = raw
    # A little-endian uint64 starting at every byte (an unaligned view): 1-D gathers, no [S, 16] copy.
    at = np.ndarray((len(raw) + KEY_BYTES - 7,), np.dtype("<u8"), padded, 0, (1,))
    # The 16 bytes from the word's start with the bytes after the word zeroed (no NUL in a word): exact.
    # The second word is 0 for words of up to 8 bytes, most of them.
    key0 = at[first_byte] & _LOW_BYTES[np.minimum(size, 8)]
    key1 = np.zeros(len(first_byte), np.uint64)
    long = np.flatnonzero(size > 8)
    key1[long] = at[first_byte[long] + 8] & _LOW_BYTES[size[long] - 8]
    return key0, key1


def _tiny_rows(packed: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of words of up to TINY_BYTES bytes (keys `packed`, numbers `words`), packed exactly into 21
    bits and looked up in a direct table: (row of every word, number of a word of every row)."""
    code = (packed & 0x7F) | ((packed >> 1) & 0x3F80) | ((packed >> 2) & 0x1FC000)
    present = np.zeros(1 << 21, bool)
    present[code] = True
    codes = np.flatnonzero(present)
    lookup = np.empty(1 << 21, np.int32)
    lookup[codes] = np.arange(len(codes))
    rows = lookup[code]
    first = np.empty(len(codes), np.int64)
    first[rows] = words
    return rows, first


def _hashed_rows(k0: np.ndarray, k1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the words keyed (k0, k1) by a hash table: (row of every word, index of a word of every
    row). A slot keeps one word (the last written), the words equal to it take its row; the few that share a
    slot with a different word are made distinct by a sort."""
    slot = ((k0 * _MIX + k1) * _MIX) >> np.uint64(64 - HASH_BITS)
    owner = np.empty(1 << HASH_BITS, np.int32)
    owner[slot] = np.arange(len(k0))
    kept = owner[slot]
    settled = (k0[kept] == k0) & (k1[kept] == k1)
    firsts = np.flatnonzero(kept == np.arange(len(k0)))  # the words kept in a slot
    row_of_slot = np.empty(1 << HASH_BITS, np.int32)
    row_of_slot[slot[firsts]] = np.arange(len(firsts))
    rows = row_of_slot[slot]
    unsettled = np.flatnonzero(~settled)
    if unsettled.size:  # their words differ from every kept word (equal words share a slot)
        pairs = np.stack((k0[unsettled], k1[unsettled]), axis=1)
        distinct, where, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
        rows[unsettled] = len(firsts) + inverse.reshape(-1)
        firsts = np.concatenate((firsts, unsettled[where]))
    return rows, firsts


def _slice_words(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    """The words raw[starts[i]:ends[i]] as strings: gathered with one space between them, decoded and split
    once (ASCII words hold no space)."""
    if len(starts) == 0:
        return []
    packed = np.zeros(len(starts) + 1, np.int64)  # the words end to end
    np.cumsum(ends - starts, out=packed[1:])
    spaced = packed[:-1] + np.arange(len(starts))  # each word after the previous one and a space
    joined = np.full(int(packed[-1]) + len(starts) - 1, ord(" "), np.uint8)
    joined[spread(spaced, packed)] = raw[spread(starts, packed)]
    return joined.tobytes().decode("ascii").split(" ")


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
    line = np.searchsorted(newlines, np.flatnonzero(raw >= 0x80))  # sorted: dropping repeats is enough
    # (np.unique's first call in a process costs ~15 ms.)
    bad = line[np.flatnonzero(np.diff(line, prepend=-1))] if line.size else line
    return bad, starts, ends
