"""Dynamic masking (as in RoBERTa and NVIDIA's LDDL): a fresh masked-LM mask for every sample in every epoch.

A static shard of create_pretraining_data.py fixes each sample's mask once. Here the original tokens of a row
are recovered (`recover_original_tokens`) and masked again with Google's rules (`dynamic_mask`):
min(max_predictions, max(1, round(len(tokens) * masked_lm_prob))) predictions, len(tokens) counting [CLS] and
[SEP] as Google's create_pretraining_data does, chosen among the non-special tokens; of those 80 % become
[MASK], 10 % a token drawn uniformly from the whole vocab, 10 % stay. With whole-word masking, words ('##'
pieces join the candidate before them) are taken in random order, each whole if it still fits.

The rate may differ from row to row (`MaskSchedule`, --masked_lm_prob_schedule: each row at the rate of the step
that takes it); the positions drawn at a lower rate are the first of those drawn at a higher one.

Randomness is a function of (seed, epoch, sample id) alone: each sample has its own SplitMix64 stream, whose
n-th value is a hash of its key and n, so a value is computed directly from its index without running a
generator. The mask of a sample therefore does not depend on the batch it is in, the number of processes or
DataLoader workers, or the order of reading, and resuming needs no generator state.

Stream layout of a sample (value n counts from 1, as SplitMix64's first output): value 3 * p + 1 is the sort
key of position p, 3 * p + 2 decides [MASK] / random / keep for p, 3 * p + 3 draws p's random token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

IGNORE_INDEX = -1  # the label of a position not predicted (every batch's masked_lm_labels)

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment (2**64 / golden ratio)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_U64 = (1 << 64) - 1
STREAMS = 3  # values per position: sort key, 80/10/10 decision, random token
NEVER = np.uint64(_U64)  # the sort key of a position that is no candidate: after every candidate


@dataclass(frozen=True, eq=False)
class MaskingSpec:
    """What `dynamic_mask` needs to know about the vocab and the masking rules."""

    vocab_size: int  # tokens of vocab.txt (Google draws random tokens among them), not a padded config size
    mask_id: int
    special_ids: tuple[int, ...]  # never predicted: [CLS], [SEP], [PAD] at least
    masked_lm_prob: float = 0.15
    max_predictions: int = 20
    is_continuation: Optional[np.ndarray] = None  # bool [vocab_size], True for '##' pieces: whole-word masking

    def __post_init__(self) -> None:
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ValueError(f"masked_lm_prob {self.masked_lm_prob} is not in (0, 1]")
        if self.max_predictions < 1:
            raise ValueError(f"max_predictions {self.max_predictions} is below 1")
        if not 0 <= self.mask_id < self.vocab_size:
            raise ValueError(f"mask id {self.mask_id} is outside the vocab of {self.vocab_size}")
        if self.is_continuation is not None and self.is_continuation.shape != (self.vocab_size,):
            raise ValueError(f"is_continuation has shape {self.is_continuation.shape}, "
                             f"expected ({self.vocab_size},)")


SCHEDULE_SHAPES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class MaskSchedule:
    """The masked share of each optimizer step of a phase of `steps` steps (--masked_lm_prob_schedule): `start` at
    the phase's step 0, `end` at its last step (steps - 1), linearly or along a half cosine in between; constant
    is `start` throughout. A pure function of the phase step, so a resumed run masks as an uninterrupted one."""

    start: float
    end: float
    shape: str = "constant"
    steps: int = 1

    def __post_init__(self) -> None:
        if self.shape not in SCHEDULE_SHAPES:
            raise ValueError(f"mask-rate schedule {self.shape!r} is not one of {', '.join(SCHEDULE_SHAPES)}")
        if not (0.0 < self.start <= 1.0 and 0.0 < self.end <= 1.0):
            raise ValueError(f"mask rates {self.start} and {self.end} must lie in (0, 1]")

    @property
    def varies(self) -> bool:
        return self.shape != "constant" and self.start != self.end and self.steps > 1

    def rate(self, step: int) -> float:
        """The rate of phase step `step` (0-based), held at the ends outside [0, steps - 1]."""
        if not self.varies:
            return self.start
        progress = min(max(step / (self.steps - 1), 0.0), 1.0)
        if self.shape == "cosine":
            progress = (1.0 - math.cos(math.pi * progress)) / 2.0
        return self.start + (self.end - self.start) * progress

    def rates(self, steps: np.ndarray) -> np.ndarray:
        """float64 [B]: rate() of each step, computed once per distinct step (the same float as rate())."""
        distinct, inverse = np.unique(np.asarray(steps, np.int64), return_inverse=True)
        return np.array([self.rate(int(step)) for step in distinct], np.float64)[inverse.reshape(-1)]


def continuation_table(tokens: Sequence[str]) -> np.ndarray:
    """bool [len(tokens)]: which vocab entries are '##' word pieces (data/tokenization.Vocab.tokens)."""
    return np.fromiter((t.startswith("##") for t in tokens), dtype=bool, count=len(tokens))


def spec_from_vocab(tokens: Sequence[str], masked_lm_prob: float, max_predictions: int,
                    whole_word_masking: bool = False) -> MaskingSpec:
    """MaskingSpec of a vocab.txt's tokens, with [CLS], [SEP] and [PAD] never predicted."""
    index = {t: i for i, t in enumerate(tokens)}  # a repeated token keeps its last line, as Google's load_vocab
    missing = [t for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]") if t not in index]
    if missing:
        raise ValueError(f"the vocab lacks {' '.join(missing)}")
    return MaskingSpec(vocab_size=len(tokens), mask_id=index["[MASK]"],
                       special_ids=(index["[CLS]"], index["[SEP]"], index["[PAD]"]),
                       masked_lm_prob=masked_lm_prob, max_predictions=max_predictions,
                       is_continuation=continuation_table(tokens) if whole_word_masking else None)


def spec_from_shard(arrays: dict[str, np.ndarray], vocab_size: int, masked_lm_prob: float,
                    max_predictions: int) -> MaskingSpec:
    """MaskingSpec read off a static shard when no vocab is at hand (NVIDIA's run_pretraining takes none):
    [CLS] opens every row, [SEP] ends every row's tokens, [MASK] is what 80 % of the masked positions hold.
    vocab_size: the shard's vocab_size attribute (ours) or the config's. No whole-word masking: it needs the
    vocab's '##' pieces."""
    input_ids, input_mask = arrays["input_ids"], arrays["input_mask"]
    if not len(input_ids):
        raise ValueError("an empty shard shows no special tokens; pass the vocab")
    cls = np.unique(input_ids[:, 0])
    sep = np.unique(input_ids[np.arange(len(input_ids)), np.count_nonzero(input_mask, axis=1) - 1])
    _, rows, cols = masked_positions(arrays["masked_lm_positions"])
    at_masked = input_ids[rows, cols]
    values, counts = np.unique(at_masked, return_counts=True)
    if len(cls) != 1 or len(sep) != 1 or cls[0] == sep[0]:
        raise ValueError(f"rows do not all start with one [CLS] ({cls[:5].tolist()}) and end with one [SEP] "
                         f"({sep[:5].tolist()}); pass the vocab")
    if not len(values) or counts.max() * 2 <= len(at_masked) or values[counts.argmax()] in (cls[0], sep[0]):
        raise ValueError("no token holds most masked positions, as [MASK] should; pass the vocab")
    return MaskingSpec(vocab_size=vocab_size, mask_id=int(values[counts.argmax()]),
                       special_ids=(int(cls[0]), int(sep[0])), masked_lm_prob=masked_lm_prob,
                       max_predictions=max_predictions)


def spec_from_special_ids(cls: int, sep: int, pad: int, mask: int, vocab_size: int, masked_lm_prob: float,
                          max_predictions: int) -> MaskingSpec:
    """MaskingSpec of the special ids a document-chunk shard records (any tokenizer: WordPiece or BPE)."""
    return MaskingSpec(vocab_size=vocab_size, mask_id=mask, special_ids=(cls, sep, pad),
                       masked_lm_prob=masked_lm_prob, max_predictions=max_predictions)


def labels_to_positions(labels: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A static shard's masked_lm_positions (int32) and masked_lm_ids (labels' dtype), [B, width], of labels
    [B, S] (IGNORE_INDEX where not predicted): each row's predicted positions ascending, then 0. ValueError if a
    row has more than width."""
    rows, cols = np.nonzero(labels != IGNORE_INDEX)  # row-major: a row's positions come out ascending
    counts = np.bincount(rows, minlength=len(labels))
    if counts.size and counts.max() > width:
        raise ValueError(f"a row has {counts.max()} predicted positions, more than {width}")
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = np.zeros((len(labels), width), np.int32)
    ids = np.zeros((len(labels), width), labels.dtype)
    positions[rows, slot] = cols
    ids[rows, slot] = labels[rows, cols]
    return positions, ids


def masked_positions(masked_lm_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where a static shard's rows [B, P] of masked_lm_positions point: (valid [B, P] bool, row, column), the
    list of a row ending at its first 0 (position 0 is [CLS], never masked); row and column index the masked
    tokens of the [B, S] arrays, and valid picks their entries out of masked_lm_positions and masked_lm_ids."""
    positions = np.asarray(masked_lm_positions, dtype=np.int64)
    valid = np.cumprod(positions != 0, axis=1).astype(bool)
    return valid, np.nonzero(valid)[0], positions[valid]


def recover_original_tokens(input_ids: np.ndarray, masked_lm_positions: np.ndarray,
                            masked_lm_ids: np.ndarray) -> np.ndarray:
    """The tokens of static rows [B, S] before masking: masked_lm_ids written back at masked_lm_positions."""
    original = np.array(input_ids, copy=True)
    valid, rows, cols = masked_positions(masked_lm_positions)
    original[rows, cols] = np.asarray(masked_lm_ids)[valid]
    return original


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (Stafford's mix 13), a bijection of uint64; z is overwritten."""
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def sample_keys(seed: int, epoch: int, sample_ids: np.ndarray) -> np.ndarray:
    """uint64 [B]: each sample's stream key. For a fixed (seed, epoch) distinct ids give distinct keys (every
    step is a bijection); across epochs keys are unrelated hashes."""
    ids = np.asarray(sample_ids)
    if ids.size and ids.min() < 0:
        raise ValueError("sample ids must be non-negative")
    base = _mix64(np.array([(seed & _U64)], np.uint64) + _GAMMA)
    base = _mix64(base ^ np.uint64(epoch & _U64))
    return _mix64(ids.astype(np.uint64) ^ base)


def stream_values(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Value number `counters` (from 1) of SplitMix64 started at `keys`: mix(key + n * gamma), broadcast."""
    return _mix64(keys + np.asarray(counters, np.uint64) * _GAMMA)


def _position_keys(keys: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """uint64 [B, S] sort keys: random high bits, the position in the low bits (no two equal in a row, so
    ordering by key is a uniformly random order with no ties); NEVER where no candidate."""
    seq = candidates.shape[1]
    bits = np.uint64(max(1, (seq - 1).bit_length()))
    positions = np.arange(seq, dtype=np.uint64)
    sort_keys = stream_values(keys[:, None], positions * np.uint64(STREAMS) + np.uint64(1))
    sort_keys >>= bits
    sort_keys <<= bits
    sort_keys |= positions
    sort_keys[~candidates] = NEVER
    return sort_keys


def number_of_predictions(input_mask: np.ndarray, candidates: np.ndarray, spec: MaskingSpec,
                          rates: Optional[np.ndarray] = None) -> np.ndarray:
    """int64 [B]: Google's min(max_predictions, max(1, round(len(tokens) * prob))), len(tokens) with [CLS]
    and [SEP]; round and np.rint both round half to even. Fewer where the row has fewer candidates. prob is
    spec.masked_lm_prob, or each row's own rate (`rates` [B], a mask-rate schedule's)."""
    length = np.count_nonzero(input_mask, axis=1)
    prob = spec.masked_lm_prob if rates is None else np.asarray(rates, np.float64)
    k = np.minimum(spec.max_predictions, np.maximum(1, np.rint(length * prob).astype(np.int64)))
    return np.minimum(k, np.count_nonzero(candidates, axis=1))


def _choose_tokens(sort_keys: np.ndarray, k: np.ndarray) -> np.ndarray:
    """bool [B, S]: the k[i] candidates with the smallest keys of each row."""
    width = int(k.max(initial=0))
    if width == 0:
        return np.zeros(sort_keys.shape, bool)
    smallest = np.sort(np.partition(sort_keys, width - 1, axis=1)[:, :width], axis=1)
    threshold = smallest[np.arange(len(k)), np.maximum(k - 1, 0)]
    return (sort_keys <= threshold[:, None]) & (k[:, None] > 0)


def _word_starts(candidates: np.ndarray, continuation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Google's cand_indexes in the [B, S] layout: which candidates start a word, and each start's word length
    in candidates (0 elsewhere). A '##' candidate joins the candidate before it, across [SEP] too as in
    Google's loop, unless it is the row's first candidate."""
    seen = np.cumsum(candidates, axis=1, dtype=np.int32)  # candidates up to and including each position
    starts = candidates & ~(continuation & (seen > 1))
    rows, cols = np.nonzero(starts)  # row-major: the starts of a row in order
    lengths = np.zeros(candidates.shape, np.int32)
    if rows.size == 0:
        return starts, lengths
    first_seen = seen[rows, cols]
    # A word ends where the next one starts, or after the row's last candidate.
    next_seen = np.empty_like(first_seen)
    next_seen[:-1] = first_seen[1:]
    last_of_row = np.append(rows[1:] != rows[:-1], True)
    next_seen[last_of_row] = seen[rows[last_of_row], -1] + 1
    lengths[rows, cols] = next_seen - first_seen
    return starts, lengths


def _spread_to_words(taken_starts: np.ndarray, starts: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """bool [B, S]: the candidates whose word start is taken. A step of +1/-1 at each start where the state
    changes from the row's previous start, summed along the row, is the state of the last start."""
    rows, cols = np.nonzero(starts)
    if rows.size == 0:
        return np.zeros(starts.shape, bool)
    state = taken_starts[rows, cols].astype(np.int8)
    previous = np.empty_like(state)
    previous[1:] = state[:-1]
    previous[np.append(True, rows[1:] != rows[:-1])] = 0
    steps = np.zeros(starts.shape, np.int8)
    steps[rows, cols] = state - previous
    return candidates & (np.cumsum(steps, axis=1, dtype=np.int8) > 0)


def _greedy_fill(lengths: np.ndarray, k: np.ndarray) -> np.ndarray:
    """bool [B, W]: Google's loop over words in column order: a word is taken whole if it fits in what is
    left of k, else skipped. Per pass every row takes its longest run of fitting words; a word longer than
    what is then left can never fit (the room only shrinks), so it is dropped at once and the next pass
    starts with a word that fits: at most k passes, about 2 in practice."""
    columns = np.arange(lengths.shape[1])
    count = np.zeros(len(k), np.int64)
    taken = np.zeros(lengths.shape, bool)
    alive = (lengths > 0) & (lengths <= k[:, None])
    while alive.any():
        live_lengths = np.where(alive, lengths, 0)
        over = count[:, None] + np.cumsum(live_lengths, axis=1) > k[:, None]
        first_over = np.where(over.any(axis=1), over.argmax(axis=1), lengths.shape[1])
        accept = alive & (columns < first_over[:, None])
        taken |= accept
        count += np.where(accept, live_lengths, 0).sum(axis=1)
        alive &= ~accept & (lengths <= (k - count)[:, None])
    return taken


def _choose_words(sort_keys: np.ndarray, candidates: np.ndarray, continuation: np.ndarray,
                  k: np.ndarray) -> np.ndarray:
    """bool [B, S]: whole-word masking, words in the order of the keys of their first pieces."""
    starts, lengths = _word_starts(candidates, continuation)
    width = max(1, int(np.count_nonzero(starts, axis=1).max(initial=0)))
    # Sorting the keys themselves (faster than argsort) orders the words; a key's low bits are its position.
    ordered = np.sort(np.where(starts, sort_keys, NEVER), axis=1)[:, :width]
    position_bits = np.uint64((1 << max(1, (candidates.shape[1] - 1).bit_length())) - 1)
    real = ordered != NEVER
    order = np.where(real, ordered & position_bits, 0).astype(np.int64)
    rows, slots = np.nonzero(_greedy_fill(np.take_along_axis(lengths, order, axis=1) * real, k))
    taken = np.zeros(candidates.shape, bool)
    taken[rows, order[rows, slots]] = True
    return _spread_to_words(taken, starts, candidates)


def _replace(original: np.ndarray, chosen: np.ndarray, keys: np.ndarray, spec: MaskingSpec
             ) -> tuple[np.ndarray, np.ndarray]:
    """Masked input_ids and labels [B, S] int64: 80 % [MASK], 10 % unchanged, 10 % a random vocab token at
    the chosen positions (value mod 10: 0-7, 8, 9; the bias of a 64-bit value mod 10 is below 1e-18)."""
    rows, cols = np.nonzero(chosen)
    first = cols.astype(np.uint64) * np.uint64(STREAMS)
    decision = stream_values(keys[rows], first + np.uint64(2)) % np.uint64(10)
    random_tokens = (stream_values(keys[rows], first + np.uint64(3)) % np.uint64(spec.vocab_size)).astype(np.int64)
    truth = original[rows, cols]
    replacement = np.where(decision < 8, spec.mask_id, np.where(decision == 8, truth, random_tokens))
    input_ids = original.copy()
    input_ids[rows, cols] = replacement
    labels = np.full(original.shape, IGNORE_INDEX, np.int64)
    labels[rows, cols] = truth
    return input_ids, labels


def dynamic_mask(original_ids: np.ndarray, input_mask: np.ndarray, sample_ids: np.ndarray, epoch: int,
                 seed: int, spec: MaskingSpec, rates: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, masked_lm_labels), int64 [B, S], of unmasked rows [B, S] masked afresh with Google's rules;
    labels are IGNORE_INDEX except at predicted positions, where they hold the original token. Row i depends
    only on its own tokens, (seed, epoch, sample_ids[i]) and its rate (rates[i], else spec.masked_lm_prob): a
    sample's global index, not its place in the batch or the stream. The positions drawn at a lower rate are
    the first of those drawn at a higher one (the same order, cut shorter)."""
    original = np.asarray(original_ids).astype(np.int64)
    if np.shape(sample_ids) != original.shape[:1] or np.shape(input_mask) != original.shape:
        raise ValueError(f"sample_ids {np.shape(sample_ids)} and input_mask {np.shape(input_mask)} do not match "
                         f"rows {original.shape}")
    candidates = np.asarray(input_mask).astype(bool)
    for special in spec.special_ids:
        candidates &= original != special
    keys = sample_keys(seed, epoch, sample_ids)
    sort_keys = _position_keys(keys, candidates)
    if rates is not None and np.shape(rates) != original.shape[:1]:
        raise ValueError(f"rates {np.shape(rates)} do not match rows {original.shape}")
    k = number_of_predictions(input_mask, candidates, spec, rates)
    if spec.is_continuation is None:
        chosen = _choose_tokens(sort_keys, k)
    else:
        chosen = _choose_words(sort_keys, candidates, spec.is_continuation[original], k)
    return _replace(original, chosen, keys, spec)
