"""masking.py against plain-Python references written here: SplitMix64, Google's create_pretraining_data masking
loop (for building static rows and for checking dynamic masks), and binomial statistics.

Statistical checks use 5-sigma binomial bounds: a two-sided tail of 5.7e-7 per check, so the few hundred checks
of this file fail by chance with probability below 1e-3 (the data are fixed, so a pass is repeatable).
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bertrecipe.pretraining import masking

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = (CLS, SEP, PAD)
VOCAB = 64  # small, so that uniform random tokens can be counted per id
U64 = (1 << 64) - 1
SIGMAS = 5.0


def continuation(vocab: int = VOCAB) -> np.ndarray:
    """Every third non-special id is a '##' piece: words of 1 to several pieces."""
    table = np.arange(vocab) % 3 == 0
    table[:5] = False
    return table


def make_spec(prob: float = 0.15, preds: int = 20, wwm: bool = False, vocab: int = VOCAB) -> masking.MaskingSpec:
    return masking.MaskingSpec(vocab_size=vocab, mask_id=MASK, special_ids=SPECIALS, masked_lm_prob=prob,
                               max_predictions=preds, is_continuation=continuation(vocab) if wwm else None)


def make_rows(n: int, seq: int, rng: np.random.Generator, min_len: int = 3, vocab: int = VOCAB
              ) -> tuple[np.ndarray, np.ndarray]:
    """Unmasked rows [CLS] A [SEP] B [SEP] + padding (int32 ids, int8 mask) of random lengths."""
    ids = np.zeros((n, seq), np.int32)
    mask = np.zeros((n, seq), np.int8)
    for i in range(n):
        length = int(rng.integers(min_len, seq + 1))
        ids[i, :length] = rng.integers(5, vocab, length)
        ids[i, 0] = CLS
        ids[i, int(rng.integers(1, length - 1))] = SEP
        ids[i, length - 1] = SEP
        mask[i, :length] = 1
    return ids, mask


# ----- plain-Python references -----

def ref_mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


class RefSplitMix64:
    """Vigna's splitmix64.c: state += gamma, then mix."""

    def __init__(self, seed: int) -> None:
        self.state = seed & U64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & U64
        return ref_mix(self.state)


def ref_value_by_running(key: int, n: int) -> int:
    """The n-th output (from 1) of splitmix64 seeded with key, by running it."""
    gen = RefSplitMix64(key)
    for _ in range(n - 1):
        gen.next()
    return gen.next()


def ref_value(key: int, n: int) -> int:
    """The same value in closed form (its state after n steps is key + n * gamma), fast enough for the
    reference masker; test_stream_values_are_splitmix64 checks it against running the generator."""
    return ref_mix((key + n * 0x9E3779B97F4A7C15) & U64)


def ref_sample_key(seed: int, epoch: int, sample_id: int) -> int:
    base = ref_mix(ref_mix((seed + 0x9E3779B97F4A7C15) & U64) ^ epoch)
    return ref_mix(base ^ sample_id)


def ref_words(tokens: list[int], length: int, cont: np.ndarray | None) -> list[list[int]]:
    """Google's cand_indexes: [CLS]/[SEP] skipped, a '##' token joins the last group when whole-word masking."""
    words: list[list[int]] = []
    for i, token in enumerate(tokens[:length]):
        if token in (CLS, SEP):
            continue
        if cont is not None and words and cont[token]:
            words[-1].append(i)
        else:
            words.append([i])
    return words


def ref_dynamic_row(tokens: list[int], length: int, key: int, spec: masking.MaskingSpec
                    ) -> tuple[list[int], list[int]]:
    """Google's create_masked_lm_predictions for one row; its shuffle is the order of the stream's sort keys and
    its rng.random()/randint draws are stream values 3p+2 (mod 10) and 3p+3 (mod vocab) of position p."""
    seq = len(tokens)
    bits = max(1, (seq - 1).bit_length())
    words = ref_words(tokens, length, spec.is_continuation)
    words.sort(key=lambda w: (ref_value(key, 3 * w[0] + 1) >> bits << bits) | w[0])
    k = min(spec.max_predictions, max(1, int(round(length * spec.masked_lm_prob))))
    chosen: list[int] = []
    for word in words:
        if len(chosen) >= k:
            break
        if len(chosen) + len(word) > k:
            continue
        chosen += word
    output, labels = list(tokens), [-1] * seq
    for p in chosen:
        draw = ref_value(key, 3 * p + 2) % 10
        output[p] = MASK if draw < 8 else tokens[p] if draw == 8 else ref_value(key, 3 * p + 3) % spec.vocab_size
        labels[p] = tokens[p]
    return output, labels


def ref_static_mask(tokens: list[int], length: int, preds: int, rng: random.Random
                    ) -> tuple[list[int], list[int], list[int]]:
    """A static shard row as Google writes it: (input_ids, masked_lm_positions, masked_lm_ids), 0-padded."""
    cands = [i for i in range(length) if tokens[i] not in (CLS, SEP)]
    rng.shuffle(cands)
    k = min(preds, max(1, int(round(length * 0.15))))
    chosen = sorted(cands[:k])
    output = list(tokens)
    for p in chosen:
        if rng.random() < 0.8:
            output[p] = MASK
        elif rng.random() >= 0.5:
            output[p] = rng.randint(0, VOCAB - 1)
    pad = [0] * (preds - len(chosen))
    return output, chosen + pad, [tokens[p] for p in chosen] + pad


def within_sigmas(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= SIGMAS * math.sqrt(n * p * (1 - p))


# ----- the random source -----

def test_stream_values_are_splitmix64():
    # Known answer: splitmix64 seeded with 1234567 (Vigna's reference outputs).
    gen = RefSplitMix64(1234567)
    assert [gen.next() for _ in range(3)] == [6457827717110365317, 3203168211198807973, 9817491932198370423]
    keys = np.array([0, 1234567, U64, 0xDEADBEEF], np.uint64)
    counters = np.array([1, 2, 3, 100, 1537], np.uint64)
    got = masking.stream_values(keys[:, None], counters[None, :])
    for i, key in enumerate(keys.tolist()):
        assert got[i].tolist() == [ref_value_by_running(key, n) for n in counters.tolist()]
        assert got[i].tolist() == [ref_value(key, n) for n in counters.tolist()]


def test_sample_keys_follow_the_definition_and_are_distinct():
    ids = np.arange(1000)
    for seed, epoch in ((42, 0), (-1, 3), (2**70 + 5, 2**40)):
        keys = masking.sample_keys(seed, epoch, ids)
        assert keys[[0, 1, 999]].tolist() == [ref_sample_key(seed & U64, epoch & U64, s) for s in (0, 1, 999)]
        assert len(set(keys.tolist())) == len(ids)
    with pytest.raises(ValueError):
        masking.sample_keys(1, 0, np.array([-1]))
    with pytest.raises(ValueError, match="sample_ids"):
        masking.dynamic_mask(np.zeros((2, 4)), np.ones((2, 4)), np.arange(3), 0, 1, make_spec())


# ----- recovery of a static shard's originals -----

@pytest.mark.parametrize("seq,preds", [(16, 3), (64, 10), (128, 20)])
def test_recover_original_tokens_restores_google_static_rows(seq, preds):
    originals, mask = make_rows(300, seq, np.random.default_rng(seq))
    rng = random.Random(seq)
    static = [ref_static_mask(row.tolist(), int(m.sum()), preds, rng) for row, m in zip(originals, mask, strict=True)]
    input_ids = np.array([s[0] for s in static], np.int32)
    positions = np.array([s[1] for s in static], np.int32)
    ids = np.array([s[2] for s in static], np.int32)
    assert (input_ids != originals).any()  # the rows really were masked
    before = input_ids.copy()
    recovered = masking.recover_original_tokens(input_ids, positions, ids)
    np.testing.assert_array_equal(recovered, originals)
    assert recovered.dtype == input_ids.dtype
    np.testing.assert_array_equal(input_ids, before)  # the shard's arrays are not modified


def test_recovery_stops_at_the_first_zero_position():
    # Position 0 ends the list (make_batch's reading): the id after it is not written back.
    input_ids = np.array([[CLS, MASK, MASK, SEP]])
    recovered = masking.recover_original_tokens(input_ids, np.array([[1, 0, 2]]), np.array([[7, 8, 9]]))
    assert recovered.tolist() == [[CLS, 7, MASK, SEP]]


# ----- dynamic masks against Google's loop -----

@pytest.mark.parametrize("wwm", [False, True])
@pytest.mark.parametrize("seq,prob,preds", [(24, 0.15, 3), (64, 0.15, 10), (48, 0.4, 12), (128, 0.15, 20)])
def test_dynamic_mask_equals_googles_loop(wwm, seq, prob, preds):
    rng = np.random.default_rng(seq + preds)
    ids, mask = make_rows(120, seq, rng)
    ids[0], mask[0] = PAD, 0
    ids[0, :3], mask[0, :3] = (CLS, SEP, SEP), 1  # no candidate at all
    ids[1, :8], mask[1] = (CLS, 6, 7, SEP, 9, 8, 10, SEP), np.arange(seq) < 8
    ids[1, 8:] = PAD
    # Row 1: a '##' piece (6, 9) as the first candidate opens a word; right after [SEP] it joins the last word
    # of A, as in Google's loop.
    assert continuation()[[6, 9]].all() and not continuation()[[7, 8, 10]].any()
    spec = make_spec(prob, preds, wwm)
    sample_ids = rng.permutation(10**6)[:len(ids)]
    got_ids, got_labels = masking.dynamic_mask(ids, mask, sample_ids, 7, 1234, spec)
    assert got_ids.dtype == got_labels.dtype == np.int64
    for i in range(len(ids)):
        key = ref_sample_key(1234, 7, int(sample_ids[i]))
        want_ids, want_labels = ref_dynamic_row(ids[i].tolist(), int(mask[i].sum()), key, spec)
        assert got_ids[i].tolist() == want_ids, i
        assert got_labels[i].tolist() == want_labels, i
    assert (got_labels[0] == -1).all()


def test_whole_word_masking_skips_a_word_that_does_not_fit():
    # Words [1, 2, 3] (two '##' pieces), [4], [5]; k = 2: the 3-piece word never fits, whatever the order.
    cont = continuation()
    tokens = [CLS, 5, 6, 9, 7, 8, SEP] + [PAD] * 9
    assert cont[[6, 9]].all() and not cont[[5, 7, 8]].any()
    spec = make_spec(prob=0.3, preds=2, wwm=True)
    ids = np.array([tokens] * 200)
    mask = np.array([[1] * 7 + [0] * 9] * 200)
    _, labels = masking.dynamic_mask(ids, mask, np.arange(200), 0, 5, spec)
    assert ((labels != -1).sum(axis=1) == 2).all()
    np.testing.assert_array_equal(labels[:, 1:4], -1)
    np.testing.assert_array_equal(labels[:, 4:6], [[7, 8]] * 200)


@pytest.mark.parametrize("wwm", [False, True])
def test_rows_without_candidates_and_empty_batches(wwm):
    ids = np.array([[CLS, SEP, SEP, PAD], [CLS, SEP, PAD, PAD]])
    mask = (ids != PAD).astype(np.int8)
    out, labels = masking.dynamic_mask(ids, mask, np.arange(2), 0, 1, make_spec(wwm=wwm))
    np.testing.assert_array_equal(out, ids)
    assert (labels == -1).all()
    out, labels = masking.dynamic_mask(ids[:0], mask[:0], np.arange(0), 0, 1, make_spec(wwm=wwm))
    assert out.shape == labels.shape == (0, 4)


# ----- determinism -----

def test_same_seed_epoch_and_sample_give_the_same_mask_and_others_differ():
    ids, mask = make_rows(200, 128, np.random.default_rng(1), min_len=100)
    ids[:] = ids[0]  # every row the same tokens: only the sample id differs
    mask[:] = mask[0]
    spec = make_spec()
    sample_ids = np.arange(5000, 5200)
    first = masking.dynamic_mask(ids, mask, sample_ids, 3, 42, spec)
    again = masking.dynamic_mask(ids.copy(), mask.copy(), sample_ids.copy(), 3, 42, spec)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])

    def positions(result: tuple[np.ndarray, np.ndarray]) -> list[tuple[int, ...]]:
        return [tuple(np.flatnonzero(row != -1)) for row in result[1]]

    same = positions(first)
    # ~19 of ~125 candidates: two independent masks share all positions with probability ~1e-22.
    assert len(set(same)) == len(same)  # other samples, other masks
    for other in (masking.dynamic_mask(ids, mask, sample_ids, 4, 42, spec),
                  masking.dynamic_mask(ids, mask, sample_ids, 3, 43, spec)):
        assert all(a != b for a, b in zip(same, positions(other), strict=True))  # other epoch or seed, other masks


@pytest.mark.parametrize("wwm", [False, True])
def test_mask_of_a_sample_does_not_depend_on_its_batch(wwm):
    ids, mask = make_rows(32, 96, np.random.default_rng(2))
    spec = make_spec(wwm=wwm)
    sample_ids = np.random.default_rng(3).permutation(10**5)[:32]
    whole = masking.dynamic_mask(ids, mask, sample_ids, 1, 9, spec)
    order = np.random.default_rng(4).permutation(32)
    shuffled = masking.dynamic_mask(ids[order], mask[order], sample_ids[order], 1, 9, spec)
    for part in (whole, shuffled):
        assert part[0].shape == (32, 96)
    np.testing.assert_array_equal(shuffled[0], whole[0][order])
    np.testing.assert_array_equal(shuffled[1], whole[1][order])
    for i in (0, 5, 31):
        alone = masking.dynamic_mask(ids[i:i + 1], mask[i:i + 1], sample_ids[i:i + 1], 1, 9, spec)
        np.testing.assert_array_equal(alone[0][0], whole[0][i])
        np.testing.assert_array_equal(alone[1][0], whole[1][i])
    halves = [masking.dynamic_mask(ids[s], mask[s], sample_ids[s], 1, 9, spec) for s in (slice(0, 11), slice(11, 32))]
    np.testing.assert_array_equal(np.concatenate([h[1] for h in halves]), whole[1])


# ----- statistics -----

@pytest.fixture(scope="module")
def big_batch() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """20,000 rows of 128 tokens (126 candidates, 19 predictions each), masked once."""
    n, seq = 20_000, 128
    rng = np.random.default_rng(11)
    ids = rng.integers(5, VOCAB, (n, seq))
    ids[:, 0], ids[:, 60], ids[:, -1] = CLS, SEP, SEP
    mask = np.ones((n, seq), np.int8)
    out, labels = masking.dynamic_mask(ids, mask, np.arange(n), 0, 2024, make_spec(preds=40))
    return ids, mask, out, labels


def test_number_of_predictions_is_googles_and_about_masked_lm_prob():
    ids, mask = make_rows(3000, 128, np.random.default_rng(5), min_len=5)
    for prob, preds in ((0.15, 1000), (0.15, 12), (0.5, 20)):
        _, labels = masking.dynamic_mask(ids, mask, np.arange(3000), 0, 1, make_spec(prob, preds))
        length = mask.sum(axis=1)
        k = [min(preds, max(1, round(int(n) * prob))) for n in length]
        assert (labels != -1).sum(axis=1).tolist() == k  # max_predictions respected exactly
    uncapped = masking.dynamic_mask(ids, mask, np.arange(3000), 0, 1, make_spec(0.15, 1000))[1]
    # Rounding to whole predictions moves each row by at most half a token.
    fraction = (uncapped != -1).sum() / mask.sum()
    assert abs(fraction - 0.15) <= 0.5 * len(ids) / mask.sum()


def test_every_candidate_position_is_equally_likely(big_batch):
    ids, _, _, labels = big_batch
    per_position = (labels != -1).sum(axis=0)
    candidates = np.ones(128, bool)
    candidates[[0, 60, 127]] = False
    assert (per_position[~candidates] == 0).all()
    p = 19 / 126  # rint(128 * 0.15) = 19 of the 126 candidates
    for count in per_position[candidates].tolist():
        assert within_sigmas(count, len(ids), p), count


def test_eighty_ten_ten_and_uniform_random_tokens(big_batch):
    ids, _, out, labels = big_batch
    predicted = labels != -1
    np.testing.assert_array_equal(labels[predicted], ids[predicted])  # labels are the original tokens
    np.testing.assert_array_equal(out[~predicted], ids[~predicted])  # nothing else changes
    n = int(predicted.sum())
    became = out[predicted]
    truth = ids[predicted]
    # A random token is [MASK] or the original with probability 1/VOCAB each.
    assert within_sigmas(int((became == MASK).sum()), n, 0.8 + 0.1 / VOCAB)
    assert within_sigmas(int((became == truth).sum()), n, 0.1 + 0.1 / VOCAB)
    random_tokens = became[(became != MASK) & (became != truth)]
    assert within_sigmas(len(random_tokens), n, 0.1 * (1 - 2 / VOCAB))
    # Uniform over the whole vocab, specials included (as Google's randint over vocab_words); each id is
    # excluded where it is the original or is [MASK], so compare each count with its own expectation.
    others = truth[(became != MASK) & (became != truth)]
    for token in range(VOCAB):
        if token == MASK:
            continue
        eligible = int((others != token).sum())
        assert within_sigmas(int((random_tokens == token).sum()), eligible, 1 / (VOCAB - 2)), token


def test_specials_and_padding_are_never_predicted():
    ids, mask = make_rows(2000, 64, np.random.default_rng(6))
    ids[:, 5] = np.where(mask[:, 5] == 1, UNK, PAD)  # [UNK] is an ordinary candidate, as in Google's code
    for wwm in (False, True):
        out, labels = masking.dynamic_mask(ids, mask, np.arange(2000), 2, 3, make_spec(0.5, 30, wwm))
        special = np.isin(ids, SPECIALS) | (mask == 0)
        assert (labels[special] == -1).all()
        np.testing.assert_array_equal(out[special], ids[special])
        assert (labels[:, 5] == UNK).any()


def test_whole_words_are_all_or_nothing():
    ids, mask = make_rows(2000, 128, np.random.default_rng(7))
    spec = make_spec(0.15, 20, wwm=True)
    _, labels = masking.dynamic_mask(ids, mask, np.arange(2000), 0, 8, spec)
    multi_piece = 0
    for i in range(len(ids)):
        k = min(20, max(1, round(int(mask[i].sum()) * 0.15)))
        assert (labels[i] != -1).sum() <= k
        for word in ref_words(ids[i].tolist(), int(mask[i].sum()), spec.is_continuation):
            taken = [labels[i, p] != -1 for p in word]
            assert all(taken) or not any(taken), (i, word)
            multi_piece += len(word) > 1 and all(taken)
    assert multi_piece > 1000  # the check did meet masked words of several pieces


# ----- vocab helpers and the batch layout -----

def test_spec_from_vocab_reads_the_special_ids_and_pieces():
    tokens = ["[PAD]", "the", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "##s", "run", "##ning", "#"]
    spec = masking.spec_from_vocab(tokens, 0.15, 20, whole_word_masking=True)
    assert (spec.vocab_size, spec.mask_id, set(spec.special_ids)) == (10, 5, {0, 3, 4})
    assert np.flatnonzero(spec.is_continuation).tolist() == [6, 8]
    assert masking.spec_from_vocab(tokens, 0.15, 20).is_continuation is None
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        masking.spec_from_vocab(tokens[:5], 0.15, 20)
    with pytest.raises(ValueError):
        masking.MaskingSpec(vocab_size=10, mask_id=5, special_ids=(), masked_lm_prob=0.0)


def static_shard(n: int, seq: int, preds: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A static shard's six arrays from ref_static_mask, and the original tokens."""
    originals, mask = make_rows(n, seq, np.random.default_rng(seed))
    rng = random.Random(seed)
    static = [ref_static_mask(r.tolist(), int(m.sum()), preds, rng) for r, m in zip(originals, mask, strict=True)]
    arrays = {"input_ids": np.array([s[0] for s in static], np.int32), "input_mask": mask,
              "segment_ids": (np.cumsum(originals == SEP, axis=1) > 0).astype(np.int8) * mask,
              "masked_lm_positions": np.array([s[1] for s in static], np.int32),
              "masked_lm_ids": np.array([s[2] for s in static], np.int32),
              "next_sentence_labels": np.arange(n, dtype=np.int8) % 2}
    return arrays, originals


def test_spec_from_shard_reads_cls_sep_and_mask():
    arrays, _ = static_shard(40, 32, 5, seed=9)
    spec = masking.spec_from_shard(arrays, VOCAB, 0.15, 5)
    assert (spec.mask_id, set(spec.special_ids), spec.vocab_size) == (MASK, {CLS, SEP}, VOCAB)
    unmasked = dict(arrays, input_ids=masking.recover_original_tokens(
        arrays["input_ids"], arrays["masked_lm_positions"], arrays["masked_lm_ids"]))
    with pytest.raises(ValueError, match="MASK"):  # no [MASK] left to find
        masking.spec_from_shard(unmasked, VOCAB, 0.15, 5)
    no_cls = dict(arrays, input_ids=np.where(np.arange(32) == 0, np.arange(40)[:, None], arrays["input_ids"]))
    with pytest.raises(ValueError, match="CLS"):
        masking.spec_from_shard(no_cls, VOCAB, 0.15, 5)
