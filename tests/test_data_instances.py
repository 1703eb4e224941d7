"""Pre-training instances: the HDF5 contract of interfaces section 1 and Google's algorithm.

The reference below is a plain-Python rendering of Google's create_pretraining_data instance algorithm
(pairs, truncation, masking), written for this test; ours must give the same statistics on real books (the
excerpts in tests/data/books, tokenized with the vocab excerpt).
"""
from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertrecipe.dataprep import documents, instances
from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard, shard_attributes
from bertrecipe.dataprep.documents import tokenize_documents
from bertrecipe.dataprep.instances import MaskingConfig, SpecialIds, truncate_spans
from bertrecipe.dataprep.shard_writer import write_shard, write_shard_blocks
from bertrecipe.dataprep.sharding import split_sentences
from bertrecipe.pretraining.shard_schema import SHARD_ARRAYS
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from helpers import TEST_DATA

SEQ, PREDS = 128, 20
# A pass over the two book excerpts gives about 77 instances: 80 passes give about as many (6,000) as 3 passes
# over the two whole books did, so the statistics below keep their sample size. Each pass draws anew.
DUPE = 80
ONE_BOOK_PASS = 30  # about 2,300 instances, a little more than one pass over the two whole books gave


# ---------------------------------------------------------------- reference (Google's algorithm, plain Python)
def ref_truncate(a: list, b: list, max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def ref_mask(tokens: list, prob: float, max_preds: int, vocab_size: int, cls: int, sep: int, mask: int,
             rng: random.Random) -> tuple[list, list, list]:
    candidates = [i for i, t in enumerate(tokens) if t not in (cls, sep)]
    rng.shuffle(candidates)
    n = min(max_preds, max(1, int(round(len(tokens) * prob))))
    out = list(tokens)
    chosen = sorted(candidates[:n])
    for i in chosen:
        if rng.random() < 0.8:
            out[i] = mask
        elif rng.random() < 0.5:
            out[i] = tokens[i]
        else:
            out[i] = rng.randint(0, vocab_size - 1)
    return out, chosen, [tokens[i] for i in chosen]


def ref_instances(docs: list[list[list[int]]], seq: int, short_prob: float, dupe: int, rng: random.Random,
                  vocab_size: int, cls: int, sep: int, mask: int) -> list[dict]:
    result = []
    max_tokens = seq - 3
    for _ in range(dupe):
        for d, doc in enumerate(docs):
            target = rng.randint(2, max_tokens) if rng.random() < short_prob else max_tokens
            chunk, length, i = [], 0, 0
            while i < len(doc):
                chunk.append(doc[i])
                length += len(doc[i])
                if i == len(doc) - 1 or length >= target:
                    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                    a = [t for s in chunk[:a_end] for t in s]
                    if len(chunk) == 1 or rng.random() < 0.5:
                        is_random, b = 1, []
                        for _ in range(10):
                            other = rng.randint(0, len(docs) - 1)
                            if other != d:
                                break
                        rdoc = docs[other]
                        for s in rdoc[rng.randint(0, len(rdoc) - 1):]:
                            b += s
                            if len(b) >= target - len(a):
                                break
                        i -= len(chunk) - a_end
                    else:
                        is_random, b = 0, [t for s in chunk[a_end:] for t in s]
                    ref_truncate(a, b, max_tokens, rng)
                    tokens = [cls] + a + [sep] + b + [sep]
                    masked, positions, labels = ref_mask(tokens, 0.15, PREDS, vocab_size, cls, sep, mask, rng)
                    result.append({"tokens": tokens, "input": masked, "positions": positions, "labels": labels,
                                   "random": is_random, "len_a": len(a)})
                    chunk, length = [], 0
                i += 1
    return result


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def vocab_path(vocab_file: Path) -> Path:
    return vocab_file


@pytest.fixture(scope="module")
def books_text(tmp_path_factory) -> Path:
    """Two real book excerpts, one sentence a line, documents of 30 sentences separated by blank lines."""
    lines = []
    for name in ("pg11.txt", "pg1661.txt"):
        sentences = split_sentences(" ".join((TEST_DATA / "books" / name).read_text(encoding="utf-8").split()))
        for start in range(0, len(sentences), 30):
            lines += sentences[start:start + 30] + [""]
    path = tmp_path_factory.mktemp("books") / "books.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def books_shard(books_text: Path, vocab_path: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hdf5") / "books.hdf5"
    create_shard(ShardConfig(books_text, out, vocab_path, True, SEQ, PREDS, 0.15, 0.1, DUPE, 12345))
    return out


@pytest.fixture(scope="module")
def arrays(books_shard: Path) -> dict[str, np.ndarray]:
    with h5py.File(books_shard, "r") as f:
        return {k: f[k][:] for k in f}


@pytest.fixture(scope="module")
def reference(books_text: Path, vocab_path: Path) -> list[dict]:
    vocab = load_vocab(vocab_path)
    docs = tokenize_documents([books_text.read_text(encoding="utf-8")], BertTokenizer(vocab, True))
    tok, so, do = docs.tokens.tolist(), docs.sentence_offsets.tolist(), docs.document_offsets.tolist()
    doc_lists = [[tok[so[s]:so[s + 1]] for s in range(do[d], do[d + 1])] for d in range(len(do) - 1)]
    return ref_instances(doc_lists, SEQ, 0.1, DUPE, random.Random(7), len(vocab), 101, 102, 103)


# ---------------------------------------------------------------- the HDF5 contract
def test_keys_dtypes_and_shapes(arrays):
    n = len(arrays["next_sentence_labels"])
    assert n > 5000
    expected = {"input_ids": ("int32", (n, SEQ)), "input_mask": ("int8", (n, SEQ)), "segment_ids": ("int8", (n, SEQ)),
                "masked_lm_positions": ("int32", (n, PREDS)), "masked_lm_ids": ("int32", (n, PREDS)),
                "next_sentence_labels": ("int8", (n,))}
    assert {k: (v.dtype.name, v.shape) for k, v in arrays.items()} == expected


def test_attributes_describe_the_shard(books_shard, vocab_path):
    with h5py.File(books_shard, "r") as f:
        attrs = dict(f.attrs)
    assert attrs["vocab_size"] == 8960 and attrs["max_seq_length"] == SEQ and attrs["do_lower_case"] == 1
    assert attrs["max_predictions_per_seq"] == PREDS and attrs["dupe_factor"] == DUPE and attrs["random_seed"] == 12345
    assert attrs["masked_lm_prob"] == pytest.approx(0.15) and attrs["format_version"] == 1
    assert attrs["vocab_sha256"] == load_vocab(vocab_path).sha256


def test_layout_of_every_instance(arrays):
    ids, mask, seg = arrays["input_ids"], arrays["input_mask"], arrays["segment_ids"]
    lengths = mask.sum(axis=1)
    assert (lengths <= SEQ).all() and (lengths >= 5).all()
    cols = np.arange(SEQ)[None, :]
    assert (mask == (cols < lengths[:, None])).all(), "mask must be 1 then 0"
    assert (ids[mask == 0] == 0).all() and (seg[mask == 0] == 0).all(), "padding must be zeros"
    assert (ids[:, 0] == 101).all()
    for row in range(0, len(ids), 97):
        n = lengths[row]
        assert ids[row, n - 1] == 102
        b_start = np.flatnonzero(seg[row])[0]
        assert ids[row, b_start - 1] == 102, "segment B starts right after the first [SEP]"
        assert (seg[row, :b_start] == 0).all() and (seg[row, b_start:n] == 1).all()


def test_masked_positions_sorted_padded_and_never_special(arrays):
    pos, lab, ids, seg = (arrays[k] for k in ("masked_lm_positions", "masked_lm_ids", "input_ids", "segment_ids"))
    lengths = arrays["input_mask"].sum(axis=1)
    for row in range(len(pos)):
        n_pred = int((pos[row] > 0).sum())
        p = pos[row, :n_pred]
        assert (pos[row, n_pred:] == 0).all() and (lab[row, n_pred:] == 0).all()
        assert (np.diff(p) > 0).all() and p.max() < lengths[row] - 1
        b_start = int(np.flatnonzero(seg[row])[0])
        assert b_start - 1 not in p, "the first [SEP] is never masked"
        assert n_pred == min(PREDS, max(1, round(lengths[row] * 0.15)))
    assert not np.isin(lab[pos > 0], [101, 102]).any()


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compression_does_not_change_the_data(compression, books_text, vocab_path, arrays, tmp_path):
    out = tmp_path / "other.hdf5"
    create_shard(ShardConfig(books_text, out, vocab_path, True, SEQ, PREDS, 0.15, 0.1, DUPE, 12345,
                             compression=compression))
    with h5py.File(out, "r") as f:
        assert all(np.array_equal(f[k][:], v) for k, v in arrays.items())


# ---------------------------------------------------------------- statistics against the reference
def test_statistics_match_reference_algorithm(arrays, reference):
    n = len(arrays["next_sentence_labels"])
    assert abs(n - len(reference)) / len(reference) < 0.05
    lengths = arrays["input_mask"].sum(axis=1)
    ref_lengths = [len(r["tokens"]) for r in reference]
    assert abs(lengths.mean() - statistics.mean(ref_lengths)) / statistics.mean(ref_lengths) < 0.03
    # Short sequences: Google draws a short target for 10 % of the documents.
    short, ref_short = (lengths < 64).mean(), statistics.mean(x < 64 for x in ref_lengths)
    assert abs(short - ref_short) < 0.025 and short > 0.02
    nsp, ref_nsp = arrays["next_sentence_labels"].mean(), statistics.mean(r["random"] for r in reference)
    assert abs(nsp - ref_nsp) < 0.03 and 0.45 < nsp < 0.6
    rate = ((arrays["masked_lm_positions"] > 0).sum(axis=1) / lengths).mean()
    ref_rate = statistics.mean(len(r["positions"]) / len(r["tokens"]) for r in reference)
    assert abs(rate - ref_rate) < 0.003 and abs(rate - 0.15) < 0.01


def test_eighty_ten_ten_split(arrays, reference):
    pos, lab, ids = arrays["masked_lm_positions"], arrays["masked_lm_ids"], arrays["input_ids"]
    valid = pos > 0
    shown = np.take_along_axis(ids, pos, axis=1)[valid]
    original = lab[valid]
    as_mask, kept = (shown == 103).mean(), (shown == original).mean()
    ref_shown = [r["input"][p] for r in reference for p in r["positions"]]
    ref_orig = [lbl for r in reference for lbl in r["labels"]]
    ref_mask = statistics.mean(s == 103 for s in ref_shown)
    ref_kept = statistics.mean(s == o for s, o in zip(ref_shown, ref_orig, strict=True))
    assert abs(as_mask - 0.8) < 0.01 and abs(as_mask - ref_mask) < 0.015
    assert abs(kept - 0.1) < 0.01 and abs(kept - ref_kept) < 0.015
    assert abs(1 - as_mask - kept - 0.1) < 0.01


# ---------------------------------------------------------------- pieces of the algorithm
def test_truncation_removes_what_googles_loop_removes():
    rng = random.Random(3)
    gen = np.random.default_rng(3)
    for _ in range(300):
        la, lb, limit = rng.randint(1, 200), rng.randint(1, 200), rng.randint(5, 125)
        a, b = list(range(la)), list(range(1000, 1000 + lb))
        ref_truncate(a, b, limit, rng)
        out = truncate_spans(np.array([[0, la, 1000, 1000 + lb, 0]]), limit, gen)[0]
        assert (out[1] - out[0], out[3] - out[2]) == (len(a), len(b))
        assert 0 <= out[0] and out[1] <= la and 1000 <= out[2] and out[3] <= 1000 + lb


def test_truncation_front_or_back_is_a_fair_coin():
    gen = np.random.default_rng(0)
    spans = np.tile([[0, 300, 300, 310, 0]], (4000, 1))
    out = truncate_spans(spans, 125, gen)
    removed_front = out[:, 0].astype(float)
    assert abs(removed_front.mean() - (300 - 115) / 2) < 1.0


def test_same_seed_same_shard_other_seed_other_shard(books_text, vocab_path, tmp_path):
    def build(seed: int, name: str) -> np.ndarray:
        out = tmp_path / name
        create_shard(ShardConfig(books_text, out, vocab_path, True, 64, 10, 0.15, 0.1, 1, seed))
        with h5py.File(out, "r") as f:
            return f["input_ids"][:]
    first, again, other = build(1, "a.hdf5"), build(1, "b.hdf5"), build(2, "c.hdf5")
    assert np.array_equal(first, again)
    assert first.shape != other.shape or not np.array_equal(first, other)


def test_a_vocab_rewritten_in_place_is_read_again(books_text, vocab_path, tmp_path):
    """The tokenizer is kept per process for the vocab file as it is (its inode, mtime and size): a vocab
    rewritten under the same name between two shards is the new vocab, not the cached one."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(vocab_path.read_bytes())

    def build(name: str) -> tuple[np.ndarray, str]:
        out = tmp_path / name
        create_shard(ShardConfig(books_text, out, vocab, True, 64, 10, 0.15, 0.1, 1, 3))
        with h5py.File(out, "r") as f:
            return f["masked_lm_ids"][:], f.attrs["vocab_sha256"]  # the original tokens, vocab-mapped
    ids, sha = build("a.hdf5")
    lines = vocab.read_text(encoding="utf-8").splitlines()
    the = lines.index("the")
    lines[the], lines[the + 1] = lines[the + 1], lines[the]  # same size, other ids for two tokens
    vocab.write_text("\n".join(lines) + "\n", encoding="utf-8")
    new_ids, new_sha = build("b.hdf5")
    assert new_sha != sha and np.isin([the, the + 1], ids).all()
    assert np.array_equal(np.where(ids == the, the + 1, np.where(ids == the + 1, the, ids)), new_ids)


def _words(original: np.ndarray, length: int, continuation: np.ndarray, cls: int, sep: int) -> list[list[int]]:
    """Google's whole words of one instance: its positions except [CLS]/[SEP], a "##" piece joining the word
    before it (across [SEP] too, as Google's cand_indexes do; a "##" first piece opens a word)."""
    words: list[list[int]] = []
    for position in range(length):
        token = int(original[position])
        if token in (cls, sep):
            continue
        if continuation[token] and words:
            words[-1].append(position)
        else:
            words.append([position])
    return words


@pytest.mark.parametrize("preds", [PREDS, 4], ids=["20 predictions", "4 predictions"])
def test_whole_word_masking_masks_all_pieces_of_a_word(preds, books_text, vocab_path, tmp_path):
    """Every word is masked whole or not at all, and a word that does not fit in what is left of the budget is
    skipped (Google: `if len(masked_lms) + len(index_set) > num_to_predict: continue`): the loop goes on with the
    other words, so an instance masks fewer than num_to_predict tokens only when every word left is too long
    (never on this text: a rule that stopped at the first word too long would leave many instances short; one
    that cut the word would mask part of it)."""
    out = tmp_path / "wwm.hdf5"
    create_shard(ShardConfig(books_text, out, vocab_path, True, SEQ, preds, 0.15, 0.1, ONE_BOOK_PASS, 5,
                             whole_word_masking=True))
    vocab = load_vocab(vocab_path)
    cls, sep = vocab.id("[CLS]"), vocab.id("[SEP]")
    continuation = np.array([t.startswith("##") for t in vocab.tokens])
    with h5py.File(out, "r") as f:
        ids, pos, lab, mask = (f[k][:] for k in ("input_ids", "masked_lm_positions", "masked_lm_ids", "input_mask"))
    multi_piece_masked = 0
    for row in range(len(pos)):
        p = pos[row][pos[row] > 0].tolist()
        original = ids[row].copy()
        original[p] = lab[row][: len(p)]
        length = int(mask[row].sum())
        words = _words(original, length, continuation, cls, sep)
        masked = set(p)
        for word in words:
            taken = [position in masked for position in word]
            assert all(taken) or not any(taken), (row, word, sorted(masked))
            multi_piece_masked += len(word) > 1 and all(taken)
        budget = min(preds, max(1, round(length * 0.15)))
        assert len(masked) <= budget
        if len(masked) < budget:  # then every word left was visited and skipped: none of them fits
            assert all(len(word) > budget - len(masked) for word in words if word[0] not in masked), row
    assert multi_piece_masked > 20


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_whole_word_masking_skips_a_word_that_does_not_fit(order):
    """Words visited in every order: with a budget of 2 the word of 3 pieces never fits and is skipped, the
    two single-piece words are taken even when it comes first (no stop at it, no part of it); with a budget of 4
    it is taken whole when visited before both others, else skipped."""
    from bertrecipe.dataprep.instances import SpecialIds, _whole_word_positions

    class Order:  # a generator whose permutation() is the given visiting order
        def permutation(self, n: int) -> np.ndarray:
            assert n == 3
            return np.array(order)

    # [CLS] a ##b ##c d [SEP] e [SEP]: words [1, 2, 3], [4], [6] (ids 2 and 3 are "##" pieces).
    input_ids = np.array([[9, 1, 2, 3, 4, 8, 5, 8]])
    candidates = np.array([[False, True, True, True, True, False, True, False]])
    continuation = np.zeros(10, bool)
    continuation[[2, 3]] = True
    special = SpecialIds(cls=9, sep=8, mask=7, vocab_size=10, continuation=continuation)
    words = [[1, 2, 3], [4], [6]]
    assert _whole_word_positions(input_ids, candidates, np.array([2]), 4, special, Order()).tolist() == [[4, 6, 0, 0]]
    got = _whole_word_positions(input_ids, candidates, np.array([4]), 4, special, Order())[0].tolist()
    first_single = next(w for w in order if w)  # the budget then holds the long word and this one
    want = sorted(words[0] + words[first_single]) if order.index(0) < 2 else [4, 6, 0, 0]
    assert got == want, (order, got)


@pytest.mark.parametrize("levels", [2**30, 8])
def test_random_positions_are_the_k_smallest_keys(levels):
    """Masked positions: the k candidates with the smallest keys, sorted; ties (forced with 8 key levels) take
    the earlier position, and never change how many are chosen."""
    from bertrecipe.dataprep.instances import _random_positions

    class Keys:  # a generator whose random() gives keys on a coarse grid, so that ties are common
        def __init__(self) -> None:
            self.gen = np.random.default_rng(3)
            self.drawn = None

        def random(self, shape):
            self.drawn = np.floor(self.gen.random(shape) * levels) / levels
            return self.drawn.copy()

    gen = np.random.default_rng(11)
    candidates = gen.random((300, 40)) < 0.7
    candidates[:, 0] = False
    k = np.minimum(gen.integers(0, 21, 300), candidates.sum(axis=1))
    keys = Keys()
    got = _random_positions(candidates, k, 20, keys)
    for row in range(300):
        cand = np.flatnonzero(candidates[row])
        order = cand[np.argsort(keys.drawn[row, cand], kind="stable")]
        want = sorted(order[:k[row]].tolist())
        assert got[row, :k[row]].tolist() == want and not got[row, k[row]:].any()


# ---------------------------------------------------------------- streamed writing
def _same_shards(a: Path, b: Path) -> None:
    """Equal arrays (values, dtypes, shapes), storage options and attributes."""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert set(fa) == set(fb) == set(SHARD_ARRAYS)
        for key in fa:
            x, y = fa[key], fb[key]
            assert (x.dtype, x.shape, x.chunks, x.compression, x.compression_opts, x.shuffle) == \
                   (y.dtype, y.shape, y.chunks, y.compression, y.compression_opts, y.shuffle), key
            assert np.array_equal(x[()], y[()]), key
        assert dict(fa.attrs).keys() == dict(fb.attrs).keys()
        assert all(np.array_equal(fa.attrs[k], fb.attrs[k]) for k in fa.attrs)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_streamed_shard_equals_whole_arrays(compression, books_text, vocab_path, tmp_path, monkeypatch):
    """create_shard, which tokenizes in slices, collects pairs in parts and writes block by block, against the
    same steps done whole: one slice, one list, the blocks joined into whole arrays and write_shard."""
    cfg = ShardConfig(books_text, tmp_path / "streamed.hdf5", vocab_path, True, SEQ, PREDS, 0.15, 0.1,
                      ONE_BOOK_PASS, 99, compression=compression)
    # 300-row blocks end inside HDF5 chunks (2,048 rows of input_ids); BLOCK fixes the draws: same for both.
    monkeypatch.setattr(instances, "BLOCK", 300)
    monkeypatch.setattr(instances, "ROWS_FLUSH", 55)
    monkeypatch.setattr(documents, "BATCH_CHARS", 20_000)
    assert create_shard(cfg).instances > 2048  # several blocks, a chunk boundary inside one

    monkeypatch.setattr(instances, "ROWS_FLUSH", 10**12)
    monkeypatch.setattr(documents, "BATCH_CHARS", 10**12)
    vocab = load_vocab(vocab_path)
    docs = tokenize_documents([books_text.read_text(encoding="utf-8")], BertTokenizer(vocab, True))
    masking = MaskingConfig(SEQ, PREDS, 0.15, 0.1, ONE_BOOK_PASS)
    gen = np.random.default_rng(99)
    spans = instances.pair_spans(docs, masking, random.Random(99))
    spans = truncate_spans(spans[gen.permutation(len(spans))], SEQ - 3, gen)
    special = SpecialIds(vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.id("[MASK]"), len(vocab))
    blocks = list(instances.instance_blocks(docs.tokens, spans, masking, special, gen))
    arrays = {key: np.concatenate([block[key] for block in blocks]) for key in blocks[0]}
    write_shard(tmp_path / "whole.hdf5", arrays, shard_attributes(cfg, len(vocab), vocab.sha256),
                None if compression == "none" else compression)
    _same_shards(tmp_path / "streamed.hdf5", tmp_path / "whole.hdf5")


@pytest.mark.parametrize("compression", [None, "gzip", "lzf"])
def test_blocks_of_any_size_write_the_same_shard(compression, tmp_path):
    gen = np.random.default_rng(5)
    rows = 3000
    shapes = {k: (() if ndim == 1 else (9 if k.startswith("masked") else 40,)) for k, (_, ndim) in SHARD_ARRAYS.items()}
    arrays = {k: gen.integers(0, 120, (rows, *shapes[k])).astype(dtype) for k, (dtype, _) in SHARD_ARRAYS.items()}
    write_shard(tmp_path / "whole.hdf5", arrays, {"random_seed": 5}, compression)
    cuts = [0, 1, 1, 999, 2048, 2049, rows]  # an empty block, one row, blocks across chunk boundaries
    blocks = ({k: v[lo:hi] for k, v in arrays.items()} for lo, hi in itertools.pairwise(cuts))
    write_shard_blocks(tmp_path / "blocks.hdf5", rows, shapes, blocks, {"random_seed": 5}, compression)
    _same_shards(tmp_path / "whole.hdf5", tmp_path / "blocks.hdf5")
    with h5py.File(tmp_path / "blocks.hdf5", "r") as f:  # and both hold the arrays written (h5py reads them)
        assert all(np.array_equal(f[key][()], arrays[key]) for key in SHARD_ARRAYS)


@pytest.mark.parametrize("fault", ["too few rows", "wrong dtype"])
def test_bad_blocks_leave_nothing(fault, tmp_path):
    shapes = {k: (() if ndim == 1 else (4,)) for k, (_, ndim) in SHARD_ARRAYS.items()}
    block = {k: np.zeros((10, *shapes[k]), dtype) for k, (dtype, _) in SHARD_ARRAYS.items()}
    if fault == "wrong dtype":
        block["input_ids"] = block["input_ids"].astype(np.int64)
    out = tmp_path / "new" / "shard.hdf5"
    with pytest.raises(ValueError):
        write_shard_blocks(out, 20 if fault == "too few rows" else 10, shapes, [block], {})
    assert not (tmp_path / "new").exists()
