"""Mask-rate schedules (--masked_lm_prob_schedule, --masked_lm_prob_end; issue 40): the rate of each step against a
plain-Python reference, each row masked at its own step's rate on both shard kinds, a stream resumed mid-schedule
masking as an uninterrupted one, whole runs of both families resumed bit for bit, and the refusals."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bertrecipe.cli import run_pretraining as run_pretraining_command
from bertrecipe.common.errors import InputError
from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard
from bertrecipe.pretraining import masking
from bertrecipe.pretraining.data import PretrainingData, StepShape
from bertrecipe.pretraining.shard_schema import inspect_shard
from helpers import TEST_DATA, TINY, VOCAB_EXCERPT, pretrain, step_records

REQUIRED = ["--input_dir", "in", "--config_file", "c.json", "--output_dir", "out", "--do_train"]
SCHEDULE = ["--dynamic_masking", "--masked_lm_prob", "0.3", "--masked_lm_prob_end", "0.15",
            "--masked_lm_prob_schedule", "linear"]


def reference_rate(start: float, end: float, shape: str, steps: int, step: int) -> float:
    """The rate of step `step` of `steps`, written out: start at step 0, end at step steps - 1."""
    if shape == "constant" or steps == 1:
        return start
    x = min(1.0, max(0.0, step / (steps - 1)))
    weight = x if shape == "linear" else 0.5 - 0.5 * math.cos(math.pi * x)
    return (1 - weight) * start + weight * end


@pytest.mark.parametrize("shape", ["constant", "linear", "cosine"])
def test_the_rate_of_each_step_is_the_references(shape):
    schedule = masking.MaskSchedule(0.3, 0.15, shape, 11)
    for step in range(-2, 14):
        assert schedule.rate(step) == pytest.approx(reference_rate(0.3, 0.15, shape, 11, step), abs=1e-15)
    assert schedule.rate(0) == 0.3 and schedule.rate(10) == (0.15 if shape != "constant" else 0.3)
    if shape == "cosine":  # halfway at the middle, slower than linear at the ends
        assert schedule.rate(5) == pytest.approx(0.225) and schedule.rate(1) > 0.3 - 0.015
    steps = np.array([3, 0, 10, 3, 7])
    assert schedule.rates(steps).tolist() == [schedule.rate(int(s)) for s in steps]
    assert masking.MaskSchedule(0.3, 0.05, "linear", 1).rate(0) == 0.3  # a one-step phase: the start rate


def test_each_row_takes_its_own_rate_and_a_lower_rate_masks_a_subset():
    rng = np.random.default_rng(0)
    rows, seq = 64, 48
    ids = rng.integers(5, 60, (rows, seq))
    ids[:, 0], lengths = 2, rng.integers(10, seq + 1, rows)
    mask = (np.arange(seq) < lengths[:, None]).astype(np.int64)
    ids[np.arange(rows), lengths - 1] = 3
    ids[mask == 0] = 0
    spec = masking.MaskingSpec(64, 4, (2, 3, 0), 0.3, 40)
    rates = np.linspace(0.3, 0.05, rows)
    sample_ids = np.arange(rows)
    _, labels = masking.dynamic_mask(ids, mask, sample_ids, 1, 42, spec, rates)
    predicted = (labels != masking.IGNORE_INDEX).sum(axis=1)
    assert predicted.tolist() == [min(40, max(1, round(n * r))) for n, r in zip(lengths, rates, strict=True)]
    _, high = masking.dynamic_mask(ids, mask, sample_ids, 1, 42, spec)  # everyone at 0.3
    assert np.all((labels == masking.IGNORE_INDEX) | (high != masking.IGNORE_INDEX))
    with pytest.raises(ValueError, match="rates"):
        masking.dynamic_mask(ids, mask, sample_ids, 1, 42, spec, rates[:3])


@pytest.fixture(scope="module")
def chunk_shards(tmp_path_factory):
    """Two document-chunk shards (WordPiece excerpt) of a few hundred lines of two books."""
    root = tmp_path_factory.mktemp("chunks")
    for i, book in enumerate(["pg11.txt", "pg1661.txt"]):
        text = root / f"book{i}.txt"
        lines = (TEST_DATA / "books" / book).read_text(encoding="utf-8").splitlines(keepends=True)
        text.write_text("".join(lines[:600]), encoding="utf-8")
        create_shard(ShardConfig(text, root / "p1" / f"books_training_{i}.hdf5", VOCAB_EXCERPT, max_seq_length=64,
                                 document_chunks=True), progress=False)
    (root / "bert_config.json").write_text(json.dumps(TINY))
    return root


def stream(folder, schedule, start_step=0, steps=6, predictions=30):
    """The stream of the folder's shards (4 lanes, 8 samples a step in 2 micro-batches), masked on the fly."""
    infos = [inspect_shard(path, TINY["vocab_size"], 64) for path in sorted(folder.glob("*training*.hdf5"))]
    special = infos[0].special
    if special is None:  # sentence pairs: the excerpt's ids
        spec = masking.spec_from_vocab(VOCAB_EXCERPT.read_text(encoding="utf-8").splitlines(), 0.3, predictions)
    else:
        spec = masking.spec_from_special_ids(special.cls, special.sep, special.pad, special.mask, special.vocab_size,
                                             0.3, predictions)
    data = PretrainingData(infos, 42, StepShape(4, 2, 1, 0), 4, TINY["vocab_size"], max_steps=steps - start_step,
                           masking_spec=spec, mask_schedule=schedule, first_step=start_step)
    data.start = data.position = start_step * 8
    return data


@pytest.mark.parametrize("kind", ["sentence_pairs", "document_chunks"])
def test_every_row_of_a_step_is_masked_at_that_steps_rate_and_a_resumed_stream_masks_alike(corpus, chunk_shards,
                                                                                          kind):
    folder = corpus / "p1" if kind == "sentence_pairs" else chunk_shards / "p1"
    schedule = masking.MaskSchedule(0.3, 0.05, "cosine", 6)
    data = stream(folder, schedule)
    batches = list(data.batches(iter(data.reader())))
    assert len(batches) == 12
    for index, batch in enumerate(batches):
        rate = schedule.rate(index // 2)
        lengths = batch["input_mask"].sum(1)
        predicted = (batch["masked_lm_labels"] != masking.IGNORE_INDEX).sum(1)
        assert predicted.tolist() == torch.clamp(torch.round(lengths * rate), 1, 30).long().tolist()
    # Going on from step 3 (a checkpoint's position) gives steps 3-5 exactly.
    resumed = stream(folder, schedule, start_step=3)
    later = list(resumed.batches(iter(resumed.reader())))
    assert len(later) == 6
    for ours, theirs in zip(later, batches[6:], strict=True):
        assert all(torch.equal(ours[key], theirs[key]) for key in ours)


@pytest.mark.parametrize("extra, fragment", [
    (["--masked_lm_prob_schedule", "linear", "--masked_lm_prob_end", "0.15"], "add --dynamic_masking"),
    (["--masked_lm_prob_end", "0.15"], "add --dynamic_masking"),
    (["--dynamic_masking", "--masked_lm_prob_schedule", "cosine"], "needs --masked_lm_prob_end"),
    (["--dynamic_masking", "--masked_lm_prob_end", "0.15"], "needs --masked_lm_prob_schedule linear or cosine"),
    (["--dynamic_masking", "--masked_lm_prob_schedule", "linear", "--masked_lm_prob_end", "0"],
     "--masked_lm_prob_end must lie in"),
    ([*SCHEDULE, "--max_tokens", "1000"], "--max_tokens makes unknown"),
    ([*SCHEDULE, "--train_budget_minutes", "5"], "--train_budget_minutes makes unknown"),
])
def test_schedules_that_cannot_apply_are_one_line_errors(extra, fragment):
    with pytest.raises(InputError, match=fragment):
        run_pretraining_command.parse_args(REQUIRED + extra)


def test_a_static_run_refuses_a_schedule_with_exit_2_and_writes_nothing(corpus, tmp_path):
    out = tmp_path / "out"
    result = pretrain(corpus, out, "--max_steps", 2, "--masked_lm_prob_schedule", "linear",
                      "--masked_lm_prob_end", "0.15", check=False)
    assert result.returncode == 2 and "add --dynamic_masking" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow
def test_a_run_resumed_mid_schedule_is_bit_for_bit_and_records_the_rate(corpus, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--train_batch_size", 8, "--max_steps", 6, "--num_steps_per_checkpoint", 3, "--no_nsp",
              "--max_predictions_per_seq", 19, *SCHEDULE]
    pretrain(corpus, straight, *common)
    pretrain(corpus, split, *common, "--steps_this_run", 2)
    moved = pretrain(corpus, split, *common, "--resume_from_checkpoint", "--masked_lm_prob_end", 0.1, check=False)
    assert moved.returncode == 2 and "--masked_lm_prob_end 0.15, this run has 0.1" in moved.stderr
    stretched = pretrain(corpus, split, *common[:2], "--max_steps", 8, *common[4:], "--resume_from_checkpoint",
                         check=False)
    assert stretched.returncode == 2 and "resume with --max_steps 6" in stretched.stderr
    pretrain(corpus, split, *common, "--resume_from_checkpoint")
    a, b = step_records(straight / "log.json"), step_records(split / "log.json")
    assert [a[(0, s)]["masked_lm_prob"] for s in range(1, 7)] == pytest.approx([0.3, 0.27, 0.24, 0.21, 0.18, 0.15])
    assert all(a[(0, s)]["step_loss"] == b[(0, s)]["step_loss"] for s in range(3, 7))
    whole = torch.load(straight / "ckpt_6.pt", weights_only=True)["model"]
    resumed = torch.load(split / "ckpt_6.pt", weights_only=True)["model"]
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)


@pytest.mark.slow
def test_a_new_phase_takes_its_own_rate(corpus, tmp_path):
    """30 % in phase 1, then 15 % in phase 2 (Ankner et al.'s step down, one rate per phase)."""
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 2, "--no_nsp", "--dynamic_masking",
             "--masked_lm_prob", 0.3, "--max_predictions_per_seq", 19)
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 2, "--no_nsp", "--dynamic_masking",
             "--masked_lm_prob", 0.15, "--phase2", "--phase1_end_step", 2, "--resume_from_checkpoint", phase=2)
    records = step_records(tmp_path / "log.json")
    assert [records[(0, s)]["masked_lm_prob"] for s in (1, 2, 3, 4)] == [0.3, 0.3, 0.15, 0.15]


@pytest.mark.slow
def test_the_modern_family_resumes_mid_schedule_on_document_chunks_bit_for_bit(chunk_shards, tmp_path):
    modern = {"model_type": "modernbert", "vocab_size": TINY["vocab_size"], "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 48, "max_position_embeddings": 64,
              "local_attention": 16, "pad_token_id": 0, "global_attn_every_n_layers": 2}
    config = tmp_path / "modern.json"
    config.write_text(json.dumps(modern))
    common = ["--train_batch_size", 8, "--max_steps", 5, "--num_steps_per_checkpoint", 2,
              "--dynamic_masking", "--masked_lm_prob", "0.3", "--masked_lm_prob_end", "0.05",
              "--masked_lm_prob_schedule", "cosine", "--max_predictions_per_seq", 19, "--optimizer", "adamw"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    pretrain(chunk_shards, straight, *common, config=config)
    pretrain(chunk_shards, split, *common, "--steps_this_run", 2, config=config)
    pretrain(chunk_shards, split, *common, "--resume_from_checkpoint", config=config)
    a, b = step_records(straight / "log.json"), step_records(split / "log.json")
    expected = [reference_rate(0.3, 0.05, "cosine", 5, s) for s in range(5)]
    assert [a[(0, s)]["masked_lm_prob"] for s in range(1, 6)] == pytest.approx(expected, abs=1e-15)
    assert all(a[(0, s)]["step_loss"] == b[(0, s)]["step_loss"] for s in range(3, 6))
    whole = torch.load(straight / "ckpt_5.pt", weights_only=True)["model"]
    resumed = torch.load(split / "ckpt_5.pt", weights_only=True)["model"]
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
