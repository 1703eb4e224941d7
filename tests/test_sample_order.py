"""The pre-training sample stream at cluster scale (sample_order.py, pretraining_data.PretrainingData): each rank
reads only its share, the order is a function of (seed, lanes, global batch) and never of the number of
processes or DataLoader workers, and a resume on another number of processes continues the same stream."""
import dataclasses

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import FileStamp
from bertrecipe.pretraining import masking, sample_order
from bertrecipe.pretraining.data import PretrainingData, StepShape
from bertrecipe.pretraining.shard_schema import inspect_shard

VOCAB = 5000


def write_shards(folder, sizes, chunk_rows=16):
    """Shards whose input_ids[:, 0] is a unique sample id: 1000 * shard + row."""
    infos = []
    for index, n in enumerate(sizes):
        path = folder / f"tiny_training_{index}.hdf5"
        ids = np.zeros((n, 8), np.int32)
        ids[:, 0] = 1000 * index + np.arange(n)
        with h5py.File(path, "w") as f:
            f.create_dataset("input_ids", data=ids, chunks=(min(chunk_rows, n), 8), compression="gzip")
            f.create_dataset("input_mask", data=np.ones((n, 8), np.int8))
            f.create_dataset("segment_ids", data=np.zeros((n, 8), np.int8))
            f.create_dataset("masked_lm_positions", data=np.tile(np.arange(1, 3, dtype=np.int32), (n, 1)))
            f.create_dataset("masked_lm_ids", data=np.ones((n, 2), np.int32))
            f.create_dataset("next_sentence_labels", data=np.zeros(n, np.int8))
        infos.append(inspect_shard(path, VOCAB, 64))
    return infos


def global_steps(infos, world, workers, accumulation, micro, lanes, steps, start=0, seed=3):
    """Every step's micro-batches (lists of sample ids), ranks in order, as the real loader delivers them."""
    per_rank = []
    for rank in range(world):
        data = PretrainingData(infos, seed, StepShape(micro, accumulation, world, rank), lanes, VOCAB, start=start,
                               max_steps=steps)
        loader = DataLoader(data.reader(), batch_size=None, num_workers=workers)
        batches = [b["input_ids"][:, 0].tolist() for b in data.batches(iter(loader))]
        per_rank.append([batches[s * accumulation:(s + 1) * accumulation] for s in range(steps)])
    return [[m for rank in per_rank for m in rank[s]] for s in range(steps)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"), [37, 100, 5, 64])  # very different sizes


def test_every_row_of_an_epoch_is_in_exactly_one_lane_and_rank():
    stream = sample_order.StreamOrder([37, 100, 5, 64], [16, 16, 5, 16], seed=1, lanes=8)
    rows = []
    for lane in range(8):
        for portion in stream.lane_portions(lane, epoch=0):
            rows += [(portion.file, r) for r in range(portion.start, portion.stop)]
    assert len(rows) == len(set(rows)) == 8 * (206 // 8)  # the last 206 mod 8 rows wait for the next epoch


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_ranks_and_workers_read_disjoint_portions_whose_union_is_the_stream(world, workers):
    lanes = 8 * 3 * 5 * 7  # divisible by every world size here
    stream = sample_order.StreamOrder([3000, 700, 40, 2600], [64, 64, 40, 64], seed=5, lanes=lanes)
    seen = []
    for rank in range(world):
        lane_range = sample_order.rank_lanes(lanes, world, rank)
        portions = list(sample_order.portions_needed(stream, lane_range, per_lane=1, first_index=0,
                                                     steps=stream.lane_length))
        for worker in range(workers):  # what PortionReader's worker reads: every workers-th portion
            seen += [(p.epoch, p.file, r) for p in portions[worker::workers] for r in range(p.start, p.stop)]
    assert len(seen) == len(set(seen)) == lanes * stream.lane_length  # no row twice, none missing


def portions_by_walking_requests(stream, lane_range, per_lane, first_index, steps):
    """The plain reference: walk every (lane, index, count) request of every step and hand out a lane's next
    portion whenever a request reaches past what that lane was given."""
    given, streams, out = {}, {}, []
    for step in range(steps):
        for lane in lane_range:
            index = first_index + step * per_lane
            if lane not in streams:
                streams[lane], given[lane] = sample_order.lane_portion_stream(stream, lane, index), index
            while given[lane] < index + per_lane:
                portion = next(streams[lane])
                given[lane] = portion.lane_index + portion.stop - portion.start
                out.append(portion)
    return out


@pytest.mark.parametrize("case", range(40))
def test_portions_come_in_the_order_the_steps_first_need_them(case):
    rng = np.random.default_rng(case)
    sizes = rng.integers(1, 300, rng.integers(1, 7)).tolist()
    blocks = rng.integers(1, 80, len(sizes)).tolist()
    lanes = int(rng.choice([1, 2, 4, 6, 8]))
    if sum(sizes) < lanes:
        sizes.append(lanes)
        blocks.append(3)
    stream = sample_order.StreamOrder(sizes, blocks, seed=case, lanes=lanes)
    world = int(rng.choice([w for w in (1, 2, 3, 4) if lanes % w == 0]))
    lane_range = sample_order.rank_lanes(lanes, world, int(rng.integers(0, world)))
    per_lane, first_index = int(rng.integers(1, 40)), int(rng.integers(0, 3 * stream.lane_length))
    steps = int(rng.integers(1, 4 * stream.lane_length // per_lane + 3))  # across several epochs
    got = list(sample_order.portions_needed(stream, lane_range, per_lane, first_index, steps))
    assert got == portions_by_walking_requests(stream, lane_range, per_lane, first_index, steps)


def test_each_chunk_is_decompressed_about_once_per_epoch_across_ranks():
    sizes, chunk = [4096] * 64, 64  # 64 shards of 4096 rows in chunks of 64 rows, 512 ranks
    stream = sample_order.StreamOrder(sizes, [chunk] * 64, seed=0, lanes=512)
    touched = 0
    for lane in range(512):
        for portion in stream.lane_portions(lane, 0):
            touched += (portion.stop - 1) // chunk - portion.start // chunk + 1
    assert touched <= 1.2 * sum(sizes) / chunk


@pytest.mark.slow
def test_order_does_not_depend_on_processes_or_workers(shards):
    reference = global_steps(shards, world=1, workers=0, accumulation=8, micro=2, lanes=8, steps=30)
    for world, workers, accumulation in [(2, 0, 4), (4, 2, 2), (8, 3, 1), (2, 4, 4)]:
        assert global_steps(shards, world, workers, accumulation, 2, 8, 30) == reference, (world, workers)


def test_an_epoch_visits_every_sample_once_and_the_next_epoch_reshuffles(shards):
    steps = global_steps(shards, world=1, workers=0, accumulation=1, micro=8, lanes=8, steps=50)
    lane_major = [ids for step in steps for ids in step]
    # Step s takes lane index s of each of the 8 lanes; lanes hold 206 // 8 = 25 samples an epoch.
    first = [ids for step in steps[:25] for ids in step]
    second = [ids for step in steps[25:50] for ids in step]
    flat_first, flat_second = sum(first, []), sum(second, [])
    assert len(set(flat_first)) == len(flat_first) == 200 and len(set(flat_second)) == 200
    assert flat_first != flat_second and len(lane_major) == 50


def test_resume_on_another_number_of_processes_continues_the_stream(shards):
    reference = global_steps(shards, world=1, workers=0, accumulation=8, micro=2, lanes=8, steps=40)
    # Step 13 lies mid-epoch (an epoch is 25 lane indexes; a step takes 2): position = 13 steps * 16 samples.
    resumed = global_steps(shards, world=2, workers=1, accumulation=4, micro=2, lanes=8, steps=27, start=13 * 16)
    assert resumed == reference[13:]


def test_the_stream_keeps_its_position_in_its_state_and_a_resume_goes_on_from_it(shards):
    """PretrainingData's state_dict() is the checkpoint's "data": after k steps handed out it holds position k * G,
    and load_state_dict() goes on with step k + 1 on another number of processes."""
    reference = global_steps(shards, world=1, workers=0, accumulation=8, micro=2, lanes=8, steps=20)
    data = PretrainingData(shards, 3, StepShape(2, 8, 1, 0), 8, VOCAB)
    micro_batches = data.batches(iter(data.reader()))
    for _ in range(13 * 8):  # 13 steps of 8 micro-batches
        next(micro_batches)
    state = data.state_dict()
    assert state == {"stream_position": 13 * 16, "seed": 3, "lanes": 8,
                     "files": [info.path.name for info in shards], "global_batch": 16}
    assert data.epoch() == 13 * 2 // 25  # an epoch is 25 lane indexes; a step takes 2
    per_rank = []
    for rank in range(2):
        resumed = PretrainingData(shards, 3, StepShape(2, 4, 2, rank), 8, VOCAB, max_steps=7)
        resumed.load_state_dict(state)
        loader = DataLoader(resumed.reader(), batch_size=None, num_workers=1)
        batches = [b["input_ids"][:, 0].tolist() for b in resumed.batches(iter(loader))]
        per_rank.append([batches[s * 4:(s + 1) * 4] for s in range(7)])
        assert resumed.state_dict()["stream_position"] == 20 * 16
    assert [per_rank[0][s] + per_rank[1][s] for s in range(7)] == reference[13:]
    for key, other in (("seed", 4), ("lanes", 4), ("global_batch", 32), ("files", ["other.hdf5"])):
        with pytest.raises(ValueError, match=f"sample stream has {key}"):
            PretrainingData(shards, 3, StepShape(2, 8, 1, 0), 8, VOCAB).load_state_dict({**state, key: other})


def test_fewer_shards_than_ranks_still_splits_the_reading(tmp_path):
    infos = write_shards(tmp_path, [300, 260])
    reference = global_steps(infos, world=1, workers=0, accumulation=8, micro=1, lanes=8, steps=5)
    assert global_steps(infos, world=8, workers=0, accumulation=1, micro=1, lanes=8, steps=5) == reference


def test_memory_is_bounded_by_the_block_not_the_shard():
    stream = sample_order.StreamOrder([1_000_000, 250_000], [4875, 4875], seed=0, lanes=64)
    longest = max(p.stop - p.start for lane in range(64) for p in stream.lane_portions(lane, 0))
    assert longest <= 4875


@pytest.mark.parametrize("lanes, world, global_batch, fragment", [
    (6, 2, 16, "6 lanes .* must divide the global batch of 16"),
    (8, 3, 24, "not a multiple of the 3 processes"),
])
def test_lane_counts_that_cannot_split_are_one_line(lanes, world, global_batch, fragment):
    with pytest.raises(InputError, match=fragment):
        sample_order.check_lanes(lanes, global_batch, world)


def test_default_lanes_divide_the_batch_and_suit_the_processes():
    assert sample_order.default_lanes(65536, 8) == 64
    assert sample_order.default_lanes(8, 1) == 8
    assert sample_order.default_lanes(24, 2) == 24
    assert sample_order.default_lanes(4096, 512) == 512


def test_a_shard_that_shrank_since_the_start_is_one_line(tmp_path):
    infos = write_shards(tmp_path, [64, 64])
    write_shards(tmp_path, [64, 10])  # rewritten (the second shorter) while the run goes on
    data = PretrainingData(infos, 0, StepShape(8, 1, 1, 0), 8, VOCAB, max_steps=16)
    with pytest.raises(InputError, match="tiny_training_0.hdf5: shard changed while this command ran"):
        list(data.batches(iter(data.reader())))  # its stamp (size, mtime, inode) tells at its first opening
    # Where the stamps cannot tell (a clock too coarse, a file system that keeps mtime), the rows still do.
    unstamped = [dataclasses.replace(info, stamp=None) for info in infos]
    data = PretrainingData(unstamped, 0, StepShape(8, 1, 1, 0), 8, VOCAB, max_steps=16)
    with pytest.raises(InputError, match="tiny_training_1.hdf5: holds fewer rows"):
        list(data.batches(iter(data.reader())))


# --- Dynamic masking through the loader (masking.py does the masking; its statistics are in test_masking.py) ---
SPEC = masking.MaskingSpec(vocab_size=VOCAB, mask_id=4, special_ids=(0, 2, 3), masked_lm_prob=0.3, max_predictions=3)


def dynamic_steps(infos, world, workers, steps=12, start=0):
    """(rank, input_ids, labels) of every sample each rank trains on, with dynamic masking."""
    out = []
    for rank in range(world):
        data = PretrainingData(infos, 7, StepShape(2, 8 // world, world, rank), 8, VOCAB, start=start,
                               max_steps=steps, masking_spec=SPEC)
        for batch in data.batches(iter(DataLoader(data.reader(), batch_size=None, num_workers=workers))):
            out += [(rank, ids.tolist(), labels.tolist())
                    for ids, labels in zip(batch["input_ids"], batch["masked_lm_labels"], strict=True)]
    return out


@pytest.fixture(scope="module")
def text_shards(tmp_path_factory):
    """Rows as create_pretraining_data writes them: [CLS] words [SEP] padding, 2 positions masked with [MASK]."""
    folder, infos = tmp_path_factory.mktemp("text"), []
    for index, n in enumerate([40, 30]):
        rng = np.random.default_rng(index)
        original = rng.integers(10, VOCAB, (n, 12)).astype(np.int32)
        original[:, 0], original[:, 9], original[:, 10:] = 2, 3, 0
        masked = original.copy()
        masked[:, [3, 5]] = 4
        with h5py.File(folder / f"text_training_{index}.hdf5", "w") as f:
            f.create_dataset("input_ids", data=masked)
            f.create_dataset("input_mask", data=(original != 0).astype(np.int8))
            f.create_dataset("segment_ids", data=np.zeros((n, 12), np.int8))
            f.create_dataset("masked_lm_positions", data=np.tile(np.array([3, 5], np.int32), (n, 1)))
            f.create_dataset("masked_lm_ids", data=original[:, [3, 5]])
            f.create_dataset("next_sentence_labels", data=np.zeros(n, np.int8))
            f.create_dataset("original", data=original)  # for the test only; the reader never looks at it
        infos.append(inspect_shard(folder / f"text_training_{index}.hdf5", VOCAB, 64))
    return infos


def test_dynamic_masks_predict_the_original_tokens_and_are_the_same_for_any_processes(text_shards):
    originals = set()
    for info in text_shards:
        with h5py.File(info.path) as f:
            originals |= {tuple(row) for row in f["original"][()].tolist()}
    one = dynamic_steps(text_shards, world=1, workers=0)
    # the same masks of each sample
    assert sorted(x[1:] for x in one) == sorted(x[1:] for x in dynamic_steps(text_shards, world=2, workers=2))
    for _, ids, labels in one:
        predicted = [i for i, label in enumerate(labels) if label >= 0]
        assert 1 <= len(predicted) <= 3 and 0 not in predicted and 9 not in predicted  # never [CLS]/[SEP]
        # Labels hold the original tokens and every other position is the original: together, a shard row.
        assert tuple(label if label >= 0 else token for token, label in zip(ids, labels, strict=True)) in originals


def test_dynamic_masks_change_from_epoch_to_epoch(text_shards):
    # 70 samples in 8 lanes: an epoch is 8 lanes x 8 samples = 4 steps of 16.
    samples = dynamic_steps(text_shards, world=1, workers=0, steps=8)
    first, second = samples[:64], samples[64:128]
    masks = {}
    for chunk in (first, second):
        for _, ids, labels in chunk:
            original = tuple(i if label < 0 else label for i, label in zip(ids, labels, strict=True))
            masks.setdefault(original, []).append(labels)
    changed = sum(1 for pair in masks.values() if len(pair) == 2 and pair[0] != pair[1])
    assert changed >= 40  # nearly every sample seen in both epochs got another mask


@pytest.mark.slow
def test_run_pretraining_trains_with_dynamic_masking_and_refuses_whole_words_without_a_vocab(text_shards, tmp_path):
    import json
    import subprocess
    import sys

    from helpers import REPO_ROOT
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(5, VOCAB)])
                     + "\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 16}))
    command = [sys.executable, str(REPO_ROOT / "run_pretraining.py"), "--input_dir", str(text_shards[0].path.parent),
               "--config_file", str(config), "--output_dir", str(tmp_path / "out"), "--max_seq_length", "12",
               "--max_predictions_per_seq", "2", "--train_batch_size", "8", "--max_steps", "3", "--do_train",
               "--disable_progress_bar", "--json-summary", str(tmp_path / "out" / "log.json"), "--dynamic_masking",
               "--masked_lm_prob", "0.3"]
    run = subprocess.run(command + ["--vocab_file", str(vocab), "--whole_word_masking"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    # Without a vocab, [CLS], [SEP] and [MASK] are read off the first shard's first rows.
    other_out = [str(tmp_path / "out2") if arg == str(tmp_path / "out") else arg for arg in command]
    run = subprocess.run(other_out, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    refused = subprocess.run(command + ["--whole_word_masking"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--whole_word_masking" in refused.stderr
    assert refused.stderr.count("\n") == 1


def test_a_shard_truncated_mid_run_is_one_line_naming_it(tmp_path):
    infos = write_shards(tmp_path, [64, 64])
    path = infos[1].path
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy that stopped half way
    data = PretrainingData(infos, 0, StepShape(8, 1, 1, 0), 8, VOCAB, max_steps=16)
    with pytest.raises(InputError, match=r"tiny_training_1.hdf5: shard changed while this command ran \(size"):
        list(data.batches(iter(data.reader())))
    unstamped = [dataclasses.replace(info, stamp=None) for info in infos]  # where a stamp cannot tell
    data = PretrainingData(unstamped, 0, StepShape(8, 1, 1, 0), 8, VOCAB, max_steps=16)
    with pytest.raises(InputError, match="tiny_training_1.hdf5: cannot read rows"):
        list(data.batches(iter(data.reader())))


def restamped(infos):
    """The shards as they are now: a test that edits them after inspecting them is not a run they changed under."""
    return [dataclasses.replace(info, stamp=FileStamp.of(info.path)) for info in infos]


def test_binning_by_length_keeps_each_steps_samples_and_groups_like_lengths(tmp_path):
    infos = write_shards(tmp_path, [64, 64])
    rng = np.random.default_rng(0)
    for info in infos:  # real lengths 2..8, in random order
        with h5py.File(info.path, "r+") as f:
            f["input_mask"][...] = (np.arange(8) < rng.integers(2, 9, (64, 1))).astype(np.int8)
    infos = restamped(infos)

    def steps(bin_by_length):
        data = PretrainingData(infos, 0, StepShape(4, 4, 1, 0), 8, VOCAB, max_steps=6, bin_by_length=bin_by_length)
        micro = list(data.batches(iter(data.reader())))
        return [micro[s * 4:(s + 1) * 4] for s in range(6)]

    for plain, binned in zip(steps(False), steps(True), strict=True):
        assert sample_ids(plain) == sample_ids(binned)  # the same samples, so the same step
        lengths = [length for b in binned for length in b["input_mask"].sum(1).tolist()]
        assert lengths == sorted(lengths)
        assert attended_columns(binned) <= attended_columns(plain)


def sample_ids(batches):
    return sorted(int(i) for b in batches for i in b["input_ids"][:, 0])


def attended_columns(batches):
    """What attention costs grows with: each micro-batch runs up to its longest sample."""
    return sum(int(b["input_mask"].sum(1).max()) for b in batches)


def test_blocks_follow_the_chunks_of_input_ids_as_nvidias_shards_are_chunked(tmp_path):
    path = tmp_path / "nvidia_training_0.hdf5"
    with h5py.File(path, "w") as f:  # NVIDIA's create_dataset calls: gzip, h5py's own chunk shapes
        for key, dtype, tail in [("input_ids", "i4", (128,)), ("input_mask", "i1", (128,)),
                                 ("segment_ids", "i1", (128,)), ("masked_lm_positions", "i4", (20,)),
                                 ("masked_lm_ids", "i4", (20,)), ("next_sentence_labels", "i1", ())]:
            f.create_dataset(key, shape=(137000, *tail), dtype=dtype, compression="gzip")
        chunk = f["input_ids"].chunks[0]
    info = inspect_shard(path, 30522, 512)
    stream = sample_order.StreamOrder([info.num_samples], [info.block_rows], seed=0, lanes=1)
    touched = sum((p.stop - 1) // chunk - p.start // chunk + 1 for p in stream.lane_portions(0, 0))
    assert touched == -(-137000 // chunk)  # every input_ids chunk decompressed once


# ---------------------------------------------------------------- held-out evaluation (--eval_dir)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_evaluation_batches_split_the_rows_between_ranks_each_read_once(shards, world, monkeypatch):
    from bertrecipe.pretraining import data as pretraining_data
    reads = []
    real = pretraining_data.read_rows
    monkeypatch.setattr(pretraining_data, "read_rows",
                        lambda info, f, a, b, v: reads.append((info.path.name, a, b)) or real(info, f, a, b, v))
    per_rank = [[b["input_ids"][:, 0].tolist() for b in
                 pretraining_data.evaluation_batches(shards, VOCAB, 12, rank, world)] for rank in range(world)]
    # Plain reference: every sample in shard order, cut into batches of 12; rank r takes a contiguous run.
    everything = [1000 * index + row for index, info in enumerate(shards) for row in range(info.num_samples)]
    reference = [everything[i:i + 12] for i in range(0, len(everything), 12)]
    assert [b for rank in per_rank for b in rank] == reference
    assert all(abs(len(a) - len(b)) <= 1 for a in per_rank for b in per_rank)
    read = [(name, row) for name, a, b in reads for row in range(a, b)]
    assert len(read) == len(set(read)) == len(everything)  # each row read by one rank, once
    assert all(b - a <= 16 and a // 16 == (b - 1) // 16 for _, a, b in reads)  # never across a chunk of 16


def test_a_binned_samples_loss_does_not_depend_on_its_batch_mates(tmp_path):
    """Binning regroups a step's samples: each sample's masked-LM loss must be what it is in the plain grouping
    (no token attends to another sample or to padding), so the step trains on the same per-sample losses."""
    from bertrecipe.model.bert import BertConfig, BertForPreTraining
    infos = write_shards(tmp_path, [64, 64])
    rng = np.random.default_rng(1)
    for info in infos:  # random tokens, real lengths 3..8
        with h5py.File(info.path, "r+") as f:
            lengths = rng.integers(3, 9, (64, 1))
            f["input_mask"][...] = (np.arange(8) < lengths).astype(np.int8)
            ids = rng.integers(5, 100, (64, 8)).astype(np.int32)
            ids[:, 0] = f["input_ids"][:, 0]  # keeps the sample id (and [CLS]'s place)
            f["input_ids"][...] = ids * (np.arange(8) < lengths)
    infos = restamped(infos)
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=64))
    model.eval()

    def per_sample_losses(bin_by_length):
        data = PretrainingData(infos, 0, StepShape(4, 4, 1, 0), 8, VOCAB, max_steps=3, bin_by_length=bin_by_length)
        losses, groups = {}, set()
        for batch in data.batches(iter(data.reader())):
            groups.add(frozenset(batch["input_ids"][:, 0].tolist()))
            labels = batch["masked_lm_labels"]
            with torch.no_grad():
                logits = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"]).prediction_logits
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-1,
                                                     reduction="none").sum(1)
            losses.update(zip(batch["input_ids"][:, 0].tolist(), loss.tolist(), strict=True))
        return losses, groups

    (plain, plain_groups), (binned, binned_groups) = per_sample_losses(False), per_sample_losses(True)
    assert plain.keys() == binned.keys() and len(plain) == 48
    assert plain_groups != binned_groups  # the samples really were regrouped
    assert all(abs(plain[k] - binned[k]) <= 1e-4 * max(1.0, abs(plain[k])) for k in plain)
