"""Google's BERT pre-training instance algorithm (interfaces section 1), fast.

Documents -> (A, B, is_random_next) pairs -> truncation -> [CLS] A [SEP] B [SEP] -> masked LM predictions.
The pair loop is Google's, chunk by chunk, but it only draws the random numbers and keeps sentence numbers: chunk
ends and the ends of random B segments are found with numpy, and an instance becomes four token offsets into the
flat token array instead of token lists; truncation and masking are then vectorised over blocks of instances.
Distributions are Google's exactly; the random streams differ (Python `random` for the pair loop, a numpy
Generator for the rest), so the output is not bit-identical to Google's script for the same seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from bertrecipe.dataprep.documents import Documents

BLOCK = 4096  # instances masked at a time (the order of the random draws depends on it: fixed)
ROWS_FLUSH = 5 * 2**14  # pair_spans' list of numbers is made an array when it is this long
SUB_BLOCK = 512  # rows assembled at a time: their [rows, max_seq_length] temporaries stay in the cache


@dataclass(frozen=True)
class MaskingConfig:
    max_seq_length: int
    max_predictions_per_seq: int
    masked_lm_prob: float
    short_seq_prob: float
    dupe_factor: int
    whole_word_masking: bool = False


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    vocab_size: int
    continuation: np.ndarray | None = None  # bool [vocab_size]: token starts with "##" (whole-word masking)


def _chunk_ends(sentence_offsets: np.ndarray, document_offsets: np.ndarray, target: int, first: int = 0,
                last: int | None = None) -> list[int]:
    """For every sentence s of first..last-1, the last sentence i of the chunk Google starts at s with this
    target: it adds sentences until the chunk has at least target tokens or its document ends.

    i is the sentence before the first one whose end offset is at least target tokens after s's start, within
    s's document; every sentence has a token, so i < s + target. Item s - first of the list.
    """
    last = len(sentence_offsets) - 1 if last is None else last
    s = np.arange(first, last)
    doc_end = document_offsets[np.searchsorted(document_offsets, s, side="right")]  # one past s's document
    found = np.searchsorted(sentence_offsets, sentence_offsets[first:last] + target, side="left")
    return (np.clip(found, s + 1, np.minimum(doc_end, s + target + 1)) - 1).tolist()


def pair_spans(docs: Documents, cfg: MaskingConfig, rng: random.Random,
               on_progress: Callable[[int], None] | None = None) -> np.ndarray:
    """All (a_start, a_end, b_start, b_end, is_random_next) rows, int64 [N, 5], over dupe_factor passes.

    Offsets index docs.tokens; A and B are contiguous runs of whole sentences before truncation.
    """
    bounds = docs.document_offsets.tolist()
    sizes = np.diff(docs.document_offsets).tolist()
    n_docs = len(bounds) - 1
    max_num_tokens = cfg.max_seq_length - 3
    # The chunk ends for the usual target, for all sentences at once; a document with a short target (a
    # fraction short_seq_prob of them) gets its own.
    full_ends = _chunk_ends(docs.sentence_offsets, docs.document_offsets, max_num_tokens)
    # The loop keeps sentence numbers, (chunk start, A's end, B's start, B's end, 0) for an actual next B and
    # (chunk start, A's end, B's first sentence, target, 1) for a random B, whose end is found afterwards.
    rows: list[int] = []
    parts: list[np.ndarray] = []  # rows moved to int64 every ROWS_FLUSH numbers: a Python int costs ~36 bytes
    uniform = rng.random  # bound once: this loop is the only per-instance Python in the pipeline

    # randint(lo, hi) is written inline as lo + int(uniform() * (hi - lo + 1)): random.randint is ~5x slower
    # and a call costs as much as the draw; the bias of floor(u * n) for n << 2**53 is negligible.

    for _ in range(cfg.dupe_factor):
        for d in range(n_docs):
            first, last = bounds[d], bounds[d + 1]
            if uniform() < cfg.short_seq_prob:
                target = 2 + int(uniform() * (max_num_tokens - 1))
                ends, base = _chunk_ends(docs.sentence_offsets, docs.document_offsets, target, first, last), first
            else:
                target, ends, base = max_num_tokens, full_ends, 0
            chunk_start = first
            while chunk_start < last:
                i = ends[chunk_start - base]  # the chunk is chunk_start..i
                if i > chunk_start:
                    a_end = chunk_start + 1 + int(uniform() * (i - chunk_start))
                    if uniform() >= 0.5:  # B is the rest of the chunk
                        rows += (chunk_start, a_end, a_end, i + 1, 0)
                        chunk_start = i + 1
                        continue
                else:
                    a_end = chunk_start + 1
                r = int(uniform() * n_docs)
                if r == d:  # Google draws up to 10 times for another document
                    for _ in range(9):
                        r = int(uniform() * n_docs)
                        if r != d:
                            break
                rows += (chunk_start, a_end, bounds[r] + int(uniform() * sizes[r]), target, 1)
                chunk_start = a_end  # the unused sentences of the chunk start the next one
            if len(rows) >= ROWS_FLUSH:
                parts.append(np.array(rows, np.int64))
                rows.clear()
            if on_progress is not None:
                on_progress(1)
    parts.append(np.array(rows, np.int64))
    return _token_spans(np.concatenate(parts).reshape(-1, 5), docs)


def _token_spans(rows: np.ndarray, docs: Documents) -> np.ndarray:
    """pair_spans' rows of sentence numbers -> token offsets, with the end of every random B."""
    sent = docs.sentence_offsets
    out = np.empty_like(rows)
    out[:, 0] = sent[rows[:, 0]]
    out[:, 1] = sent[rows[:, 1]]
    out[:, 4] = rows[:, 4]
    b_end = rows[:, 3].copy()
    random_b = np.flatnonzero(rows[:, 4] == 1)
    start = rows[random_b, 2]
    target_b = rows[random_b, 3] - (out[random_b, 1] - out[random_b, 0])
    # Google adds sentences until B has target_b tokens or its document ends: B ends at the first end offset
    # at least target_b after its start, within its document (and within target_b sentences: each has a token).
    doc_end = docs.document_offsets[np.searchsorted(docs.document_offsets, start, side="right")]
    window = np.minimum(doc_end, start + 1 + np.maximum(target_b, 0))
    found = np.searchsorted(sent, sent[start] + target_b, side="left")
    b_end[random_b] = np.clip(found, start + 1, window)
    out[:, 2] = sent[rows[:, 2]]
    out[:, 3] = sent[b_end]
    return out


def truncate_spans(spans: np.ndarray, max_num_tokens: int, gen: np.random.Generator) -> np.ndarray:
    """Google's truncate_seq_pair in closed form, on a copy of spans [N, 5].

    Google removes one token at a time from the longer side (B on ties), from the front or the back with
    probability 1/2. So the longer side first loses the difference, the rest alternates starting with B, and
    the number taken from the front of a side is Binomial(removed, 1/2).
    """
    out = spans.copy()
    la = out[:, 1] - out[:, 0]
    lb = out[:, 3] - out[:, 2]
    excess = np.maximum(la + lb - max_num_tokens, 0)
    first = np.minimum(np.abs(la - lb), excess)
    rest = excess - first
    from_a = np.where(la > lb, first, 0) + rest // 2
    from_b = np.where(la > lb, 0, first) + (rest + 1) // 2
    front_a = gen.binomial(from_a, 0.5)
    front_b = gen.binomial(from_b, 0.5)
    out[:, 0] += front_a
    out[:, 1] -= from_a - front_a
    out[:, 2] += front_b
    out[:, 3] -= from_b - front_b
    return out


def instance_blocks(tokens: np.ndarray, spans: np.ndarray, cfg: MaskingConfig, ids: SpecialIds,
                    gen: np.random.Generator) -> Iterator[dict[str, np.ndarray]]:
    """The six HDF5 arrays (docs/interfaces.md, section 1) for truncated spans [N, 5], in the order of spans, as
    consecutive blocks of up to BLOCK rows each, made as they are asked for: a consumer that writes a block
    before asking for the next holds one block, not the whole shard."""
    windows = _windows(tokens, cfg.max_seq_length)
    for lo in range(0, len(spans), BLOCK):
        block_spans = spans[lo:lo + BLOCK]
        out = _empty_rows(block_spans, cfg)
        _assemble_block(windows, block_spans, cfg, ids, gen, out)
        yield out


def instance_row_shapes(cfg: MaskingConfig) -> dict[str, tuple[int, ...]]:
    """The shape of one row of each array (the arrays are [N, *shape])."""
    seq, preds = (cfg.max_seq_length,), (cfg.max_predictions_per_seq,)
    return {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "masked_lm_positions": preds,
            "masked_lm_ids": preds, "next_sentence_labels": ()}


def _empty_rows(spans: np.ndarray, cfg: MaskingConfig) -> dict[str, np.ndarray]:
    """Zeroed arrays for the rows of spans, with their next-sentence labels."""
    n, seq, preds = len(spans), cfg.max_seq_length, cfg.max_predictions_per_seq
    return {
        "input_ids": np.zeros((n, seq), np.int32),
        "input_mask": np.zeros((n, seq), np.int8),
        "segment_ids": np.zeros((n, seq), np.int8),
        "masked_lm_positions": np.zeros((n, preds), np.int32),
        "masked_lm_ids": np.zeros((n, preds), np.int32),
        "next_sentence_labels": spans[:, 4].astype(np.int8),
    }


def _windows(tokens: np.ndarray, seq: int) -> np.ndarray:
    """Rows of seq tokens starting anywhere: windows[j] is padded[j:j + seq], padded being the tokens with seq
    zeros before and after, so that a row can be read whole even where it runs past either end."""
    padded = np.zeros(len(tokens) + 2 * seq, np.int32)
    padded[seq:seq + len(tokens)] = tokens
    return np.lib.stride_tricks.sliding_window_view(padded, seq)


def _assemble_block(windows: np.ndarray, spans: np.ndarray, cfg: MaskingConfig, ids: SpecialIds,
                    gen: np.random.Generator, out: dict[str, np.ndarray]) -> None:
    # The random draws of a block are: the position keys of its rows in row order, then the three replacement
    # draws of the whole block. Positions are chosen in sub-blocks of SUB_BLOCK rows, whose [rows, seq]
    # temporaries stay in the core's cache; drawing the keys in row slices gives the same numbers.
    seq = cfg.max_seq_length
    input_ids, positions = out["input_ids"], out["masked_lm_positions"]
    for lo in range(0, len(spans), SUB_BLOCK):
        hi = min(lo + SUB_BLOCK, len(spans))
        _positions_of_rows(windows, spans[lo:hi], cfg, ids, gen, input_ids[lo:hi], out["input_mask"][lo:hi],
                           out["segment_ids"][lo:hi], positions[lo:hi])
    valid = positions > 0
    cells = positions + np.arange(len(positions))[:, None] * seq  # indices into the block's flat input_ids
    flat_ids = input_ids.reshape(-1)  # a view: the rows of a block are contiguous
    original = flat_ids[cells]
    original *= valid
    # 80 % [MASK], 10 % unchanged, 10 % a random vocab id (Google draws any word of the vocab).
    u_mask = gen.random(positions.shape)
    u_keep = gen.random(positions.shape)
    replaced = gen.integers(0, ids.vocab_size, positions.shape).astype(np.int32)
    np.copyto(replaced, original, where=u_keep < 0.5)
    np.copyto(replaced, ids.mask, where=u_mask < 0.8)
    # Padding slots point at column 0: they write [CLS] over [CLS].
    np.copyto(replaced, ids.cls, where=~valid)
    flat_ids[cells] = replaced
    out["masked_lm_ids"][:] = original


def _positions_of_rows(windows: np.ndarray, spans: np.ndarray, cfg: MaskingConfig, ids: SpecialIds,
                       gen: np.random.Generator, input_ids: np.ndarray, input_mask: np.ndarray,
                       segment_ids: np.ndarray, positions: np.ndarray) -> None:
    """[CLS] A [SEP] B [SEP] and padding into input_ids, input_mask and segment_ids of these rows, and their
    masked positions (sorted, zero-padded) into positions; input_ids are not masked yet."""
    seq = cfg.max_seq_length
    # int32 [B, seq] temporaries where offsets allow: half the memory traffic of int64.
    spans = spans.astype(np.int32 if len(windows) < 2**31 else np.int64)
    la = (spans[:, 1] - spans[:, 0])[:, None]
    lb = (spans[:, 3] - spans[:, 2])[:, None]
    length = la + lb + 3
    col = np.arange(seq, dtype=spans.dtype)[None, :]
    in_sequence = col < length
    # Tokens of A are columns 1..la, tokens of B la+2..length-2: whole rows of windows (one copy of seq
    # contiguous tokens each), B's shifted so that column la + 2 is its first token, then A's columns over it.
    # [CLS], [SEP] and padding are written over the cells that are no token of A or B.
    input_ids[:] = windows[spans[:, 2] - la[:, 0] + (seq - 2)]
    np.copyto(input_ids, windows[spans[:, 0] + (seq - 1)], where=col <= la)
    np.copyto(input_ids, 0, where=~in_sequence)
    input_ids[:, 0] = ids.cls
    rows = np.arange(len(spans))
    input_ids[rows, la[:, 0] + 1] = ids.sep
    input_ids[rows, length[:, 0] - 1] = ids.sep
    input_mask[:] = in_sequence
    segment_ids[:] = in_sequence & (col >= la + 2)
    candidates = (col >= 1) & (col < length - 1) & (col != la + 1)

    n_cand = la[:, 0] + lb[:, 0]
    # Google: min(max_predictions, max(1, round(len(tokens) * prob))); Python's round and rint both round half
    # to even. A sequence with fewer candidates than that gets all of them masked, as in Google's loop.
    k = np.minimum(cfg.max_predictions_per_seq, np.maximum(1, np.rint(length[:, 0] * cfg.masked_lm_prob)))
    k = np.minimum(k, n_cand).astype(np.int64)
    if cfg.whole_word_masking:
        positions[:] = _whole_word_positions(input_ids, candidates, k, cfg.max_predictions_per_seq, ids, gen)
    else:
        positions[:] = _random_positions(candidates, k, cfg.max_predictions_per_seq, gen)


def _random_positions(candidates: np.ndarray, k: np.ndarray, preds: int, gen: np.random.Generator) -> np.ndarray:
    """k[i] distinct candidate positions per row, uniformly at random, sorted, zero-padded: int32 [B, preds].

    A row takes the candidates with the k smallest of one uniform key per position (k <= its candidates).
    """
    keys = gen.random(candidates.shape)
    np.copyto(keys, 2.0, where=~candidates)  # never chosen before every candidate has been
    width = min(preds, keys.shape[1])
    # The k-th smallest key of each row. A full sort of the values is ~4x faster than np.partition here
    # (numpy's vectorised sort), and argpartition, which also moves indices, is slower still.
    smallest = np.sort(keys, axis=1)[:, :width]
    rows_with_k = np.flatnonzero(k > 0)
    threshold = np.full(len(k), -1.0)
    threshold[rows_with_k] = smallest[rows_with_k, k[rows_with_k] - 1]
    chosen = keys <= threshold[:, None]
    flat = np.flatnonzero(chosen)
    # A row has at least k[i] keys at or below its threshold, more only where keys are equal at the threshold
    # (probability ~2**-40): then choose by rank.
    if len(flat) != k.sum():
        return _random_positions_by_rank(keys, k, preds)
    # Row-major: the positions of a row come out sorted, k[i] of them for row i. The j-th of row i (at
    # flat index first[i] + j) is column flat - i * columns and goes to cell i * preds + j of the result.
    first = np.cumsum(k) - k
    rows = np.arange(len(k))
    result = np.zeros((len(k), preds), np.int32)
    cell = np.arange(len(flat)) + np.repeat(rows * preds - first, k)
    result.reshape(-1)[cell] = flat - np.repeat(rows * keys.shape[1], k)
    return result


def _random_positions_by_rank(keys: np.ndarray, k: np.ndarray, preds: int) -> np.ndarray:
    """_random_positions for keys with ties: the k first positions in (key, position) order of each row."""
    order = np.argsort(keys, axis=1, kind="stable")
    result = np.zeros((len(k), preds), np.int32)
    for row in range(len(k)):
        chosen = np.sort(order[row, :k[row]])
        result[row, :len(chosen)] = chosen
    return result


def _whole_word_positions(input_ids: np.ndarray, candidates: np.ndarray, k: np.ndarray, preds: int,
                          ids: SpecialIds, gen: np.random.Generator) -> np.ndarray:
    """Google's whole-word masking: words ("##" pieces join the previous candidate) in random order, each taken
    whole if it still fits in k; a word that does not fit is skipped. Sorted, zero-padded int32 [B, preds]."""
    assert ids.continuation is not None
    result = np.zeros((len(k), preds), np.int32)
    cont = ids.continuation[input_ids] & candidates
    for row in range(len(k)):
        cand = np.flatnonzero(candidates[row])
        starts = np.flatnonzero(~cont[row, cand])
        if starts.size == 0 or starts[0] != 0:
            starts = np.insert(starts, 0, 0)  # a "##" first candidate still opens a word, as in Google's
        words = np.split(cand, starts[1:])
        chosen: list[int] = []
        for w in gen.permutation(len(words)).tolist():
            if len(chosen) >= k[row]:
                break
            if len(chosen) + len(words[w]) <= k[row]:
                chosen.extend(words[w].tolist())
        chosen.sort()
        result[row, :len(chosen)] = chosen
    return result
