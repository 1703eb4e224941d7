"""Training measured in tokens: --max_tokens (a token budget whose share consumed is the lr schedule's progress,
--warmup_tokens) and --batch_size_warmup_tokens (ModernBERT's batch-size warm-up). The schedule and the ramp
against plain-Python references; runs on the book shards whose steps' tokens the tests count from the shards
themselves (sample_order's lanes, h5py's input_mask), exact resumes, 2 processes against 1, and the refusals."""
import math
import subprocess
import sys
from fractions import Fraction

import h5py
import pytest
import torch

from bertrecipe.cli import run_pretraining
from bertrecipe.common.errors import InputError
from bertrecipe.pretraining import sample_order
from bertrecipe.pretraining.shard_schema import find_shards, inspect_shard
from bertrecipe.pretraining.startup import ResumePoint, build_scheduler
from bertrecipe.pretraining.token_budget import batch_ramp
from bertrecipe.training.metric_logger import read_log
from bertrecipe.training.optimization import TokenBudgetScheduler, TokenBudgetWsdScheduler
from helpers import ENV, REPO_ROOT, TINY, final_record, step_records

REQUIRED = ["--input_dir", "in", "--config_file", "c.json", "--output_dir", "out", "--do_train"]
PEAK = 2e-2


def train(corpus, out, *extra, nproc=1, config="bert_config.json", check=True):
    """run_pretraining.py on the phase-1 book shards (64 tokens, 10 predictions), in 1 or `nproc` processes."""
    args = ["--input_dir", corpus / "p1", "--config_file", corpus / config, "--output_dir", out,
            "--max_seq_length", 64, "--max_predictions_per_seq", 10, "--learning_rate", PEAK, "--do_train",
            "--max_steps", 100000, "--num_steps_per_checkpoint", 100000, "--disable_progress_bar",
            "--json-summary", out / "log.json", *extra]
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    result = subprocess.run([*launcher, str(REPO_ROOT / "run_pretraining.py"), *map(str, args)], env=ENV,
                            capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


# --- plain-Python references ------------------------------------------------------------------------------------
def reference_lr(tokens, budget, warmup_tokens, schedule="poly", decay=0.1):
    """The lr after the step that brought the count to `tokens`: progress = tokens / budget."""
    progress, warmup = min(tokens / budget, 1.0), warmup_tokens / budget
    if progress < warmup:
        return PEAK * progress / warmup
    if schedule == "poly":
        return PEAK * max(1.0 - progress, 0.0) ** 0.5
    if progress < 1.0 - decay:
        return PEAK
    return PEAK * (1.0 - min((progress - (1.0 - decay)) / decay, 1.0))


def reference_micro_batches(tokens, warmup_tokens, start_fraction, accumulation, micro, world, lanes):
    """A step's micro-batches per process: the largest whole multiple of the granule (the fewest micro-batches
    whose samples the lanes split evenly, found by trying) not above the linear ramp, never below its start."""
    granule = next(k for k in range(1, accumulation + 1) if k * micro * world % lanes == 0)
    if tokens >= warmup_tokens:
        return accumulation
    start = max(granule, math.floor(Fraction(start_fraction) * accumulation / granule) * granule)
    target = start + (accumulation - start) * Fraction(tokens, warmup_tokens)
    return max(start, math.floor(target / granule) * granule)


def lane_rows(folder, lanes, seed=42):
    """Each lane's rows, (shard, row), in the order the lane hands them out (epoch 0, as sample_order.py says)."""
    infos = [inspect_shard(path, vocab_size=TINY["vocab_size"], max_positions=128)
             for path in find_shards(folder, "training")]
    stream = sample_order.StreamOrder([i.num_samples for i in infos], [i.block_rows for i in infos], seed, lanes)
    return [[(portion.file, portion.start + int(k)) for portion in stream.lane_portions(lane, 0)
             for k in stream.portion_order(portion)] for lane in range(lanes)]


def expected_steps(folder, lanes, budget, samples_of_step, max_steps=10**6):
    """The steps a run takes, each (samples, tokens after it), counted from the shards: step by step, the next
    samples_of_step(tokens so far) / lanes rows of every lane, until the budget is reached."""
    masks = []
    for path in find_shards(folder, "training"):
        with h5py.File(path, "r") as f:
            masks.append(f["input_mask"][:].sum(axis=1))
    rows, index, tokens, steps = lane_rows(folder, lanes), 0, 0, []
    while tokens < budget and len(steps) < max_steps:
        samples = samples_of_step(tokens)
        per_lane = samples // lanes
        tokens += sum(int(masks[f][r]) for lane in rows for f, r in lane[index:index + per_lane])
        index += per_lane
        steps.append((samples, tokens))
    return steps


def logged_steps(path):
    records = step_records(path)
    return [(records[key].get("batch_samples"), records[key]["tokens"]) for key in sorted(records)]


def stop_records(path):
    return [r["data"] for r in read_log(path) if r.get("step") == "PARAMETER" and "stopped_by" in r["data"]]


# --- the schedule and the ramp ----------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["poly", "wsd"])
def test_the_schedules_progress_is_the_share_of_the_token_budget(schedule):
    budget, warmup = 10_000, 1_000
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    scheduler = (TokenBudgetScheduler(optimizer, warmup / budget, budget) if schedule == "poly"
                 else TokenBudgetWsdScheduler(optimizer, warmup / budget, budget, decay=0.1))
    for tokens in (0, 1, 400, 999, 1000, 5000, 8999, 9000, 9500, 9999, 10_000, 12_345):
        scheduler.tokens_seen = tokens
        scheduler.step()
        assert scheduler.get_last_lr()[0] == pytest.approx(reference_lr(tokens, budget, warmup, schedule),
                                                           rel=1e-12, abs=1e-18), tokens


@pytest.mark.parametrize("schedule, kind", [("poly", TokenBudgetScheduler), ("wsd", TokenBudgetWsdScheduler)])
def test_the_flags_pick_the_token_schedule_and_a_resume_goes_on_from_the_count(schedule, kind):
    args = run_pretraining.parse_args(REQUIRED + ["--learning_rate", str(PEAK), "--max_tokens", "1e4",
                                                  "--warmup_tokens", "2500", "--lr_schedule", schedule])
    assert (args.max_tokens, args.warmup_tokens, args.warmup_proportion) == (10_000, 2500, 0.25)
    first = build_scheduler(args, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK), ResumePoint())
    assert type(first) is kind
    for step in range(1, 8):
        first.tokens_seen = 1234 * step
        first.step()
    resumed = build_scheduler(args, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK),
                              ResumePoint(scheduler=first.state_dict(), tokens=first.tokens_seen))
    assert resumed.get_last_lr() == first.get_last_lr()
    assert first.get_last_lr()[0] == pytest.approx(reference_lr(1234 * 7, 10_000, 2500, schedule), rel=1e-12)


@pytest.mark.parametrize("lanes, micro, world, accumulation, start", [
    (2, 2, 1, 4, 0.125), (8, 4, 1, 4, 0.125), (8, 4, 2, 2, 0.125), (4, 1, 1, 12, 0.5), (6, 2, 2, 6, 0.3),
    (64, 8, 8, 8, 0.125), (16, 3, 1, 32, 0.6), (16, 3, 1, 32, 1.0),
])
def test_the_batch_ramp_follows_the_reference(lanes, micro, world, accumulation, start):
    warmup = 997  # prime: the ramp's divisions are not exact
    ramp = batch_ramp(warmup, start, accumulation, micro, world, lanes)
    got = [ramp.micro_batches(t) for t in range(0, warmup + 3)]
    assert got == [reference_micro_batches(t, warmup, start, accumulation, micro, world, lanes)
                   for t in range(0, warmup + 3)]
    assert got == sorted(got) and got[-1] == accumulation and all(c * micro * world % lanes == 0 for c in got)


def test_a_ramp_the_lanes_leave_no_room_for_is_refused():
    assert batch_ramp(0, 0.125, 4, 2, 1, 8) is None
    with pytest.raises(InputError, match="no smaller batch to start from"):
        batch_ramp(100, 0.125, 2, 4, 1, 8)  # 8 lanes: a step is 2 micro-batches of 4 or none


@pytest.mark.parametrize("extra, fragment", [
    (["--max_tokens", "-5"], "--max_tokens must be a whole number of tokens >= 0"),
    (["--max_tokens", "1.5"], "--max_tokens must be a whole number of tokens >= 0"),
    (["--max_tokens", "nan"], "--max_tokens must be a whole number of tokens >= 0"),
    (["--batch_size_warmup_tokens", "inf"], "--batch_size_warmup_tokens must be a whole number"),
    (["--max_tokens", "100", "--train_budget_minutes", "5"], "give one"),
    (["--warmup_tokens", "10"], "add --max_tokens"),
    (["--max_tokens", "100", "--warmup_tokens", "10", "--warmup_proportion", "0.1"], "give one"),
    (["--max_tokens", "100", "--warmup_tokens", "101"], "exceeds --max_tokens 100"),
    (["--max_tokens", "100", "--warmup_tokens", "50", "--lr_schedule", "wsd", "--decay_proportion", "0.6"],
     "overlap"),
    (["--batch_size_warmup_start", "0.5"], "goes with --batch_size_warmup_tokens"),
    (["--batch_size_warmup_tokens", "100", "--gradient_accumulation_steps", "2", "--batch_size_warmup_start", "0"],
     "--batch_size_warmup_start must lie in (0, 1]"),
    (["--batch_size_warmup_tokens", "100"], "needs --gradient_accumulation_steps 2 or more"),
])
def test_bad_token_flags_are_one_line_errors(extra, fragment):
    with pytest.raises(InputError) as error:
        run_pretraining.parse_args(REQUIRED + extra)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_token_flags_default_to_off_and_keep_the_nvidia_warmup():
    args = run_pretraining.parse_args(REQUIRED)
    assert (args.max_tokens, args.warmup_tokens, args.batch_size_warmup_tokens, args.warmup_proportion) == (
        0, None, 0, 0.01)


# --- runs ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_max_tokens_stops_at_the_step_that_reaches_it_with_the_lr_in_tokens(corpus, tmp_path):
    # The tokens after each of the first 8 steps of 8 samples (8 lanes: one row of each), from the shards.
    cumulative = [tokens for _, tokens in expected_steps(corpus / "p1", 8, math.inf, lambda t: 8, max_steps=8)]
    budget, warmup = cumulative[4] + 1, cumulative[1]  # step 5 falls one token short: step 6 is the last
    out = tmp_path / "run"
    train(corpus, out, "--train_batch_size", 8, "--max_tokens", budget, "--warmup_tokens", warmup)
    records = step_records(out / "log.json")
    assert sorted(records) == [(0, s) for s in range(1, 7)]
    assert [records[(0, s)]["tokens"] for s in range(1, 7)] == cumulative[:6]
    for s in range(1, 7):
        assert records[(0, s)]["learning_rate"] == pytest.approx(
            reference_lr(cumulative[s - 1], budget, warmup), rel=1e-12, abs=1e-18), s
    assert stop_records(out / "log.json") == [{"stopped_by": "max_tokens", "global_step": 6}]
    assert final_record(out / "log.json")["tokens"] == cumulative[5]
    assert sorted(p.name for p in out.glob("ckpt_*.pt")) == ["ckpt_6.pt"]
    checkpoint = torch.load(out / "ckpt_6.pt", weights_only=True)
    assert checkpoint["tokens"] == cumulative[5] and checkpoint["data"]["stream_position"] == 6 * 8
    # A checkpoint from before the count: a token budget cannot go on from it.
    del checkpoint["tokens"]
    torch.save(checkpoint, out / "ckpt_6.pt")
    refused = train(corpus, out, "--train_batch_size", 8, "--max_tokens", budget * 2, "--warmup_tokens", warmup,
                    "--resume_from_checkpoint", check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "before checkpoints counted the tokens" in refused.stderr


def ramp_of(warmup, accumulation, micro, world, lanes, start=0.125):
    """samples_of_step for expected_steps: the reference ramp's micro-batches x micro x processes."""
    return lambda tokens: reference_micro_batches(tokens, warmup, start, accumulation, micro, world, lanes) \
        * micro * world


@pytest.mark.slow
def test_the_batch_grows_with_the_tokens_and_a_resume_mid_ramp_is_bit_exact(corpus, tmp_path):
    # 8 samples a step in micro-batches of 2; the default lanes of a warm-up run (2) take steps of 1 micro-batch.
    warmup, budget = 1500, 3000
    expected = expected_steps(corpus / "p1", 2, budget, ramp_of(warmup, 4, 2, 1, 2))
    assert {samples for samples, _ in expected} == {2, 4, 6, 8}
    common = ["--train_batch_size", 8, "--gradient_accumulation_steps", 4, "--max_tokens", budget,
              "--batch_size_warmup_tokens", warmup]
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(corpus, straight, *common)
    assert logged_steps(straight / "log.json") == expected
    train(corpus, split, *common, "--steps_this_run", 5)
    assert logged_steps(split / "log.json")[-1][0] < 8  # stopped inside the ramp
    train(corpus, split, *common, "--resume_from_checkpoint")
    a, b = step_records(straight / "log.json"), step_records(split / "log.json")
    assert sorted(a) == sorted(b) == [(0, s) for s in range(1, len(expected) + 1)]
    timed = ("training_sequences_per_second", "tokens_per_second", "input_wait_share", "mfu")  # the clock's

    def untimed(record):
        return {key: value for key, value in record.items() if key not in timed}

    assert all(untimed(a[key]) == untimed(b[key]) for key in a)  # losses, lr, tokens and batch sizes to the last bit
    last = f"ckpt_{len(expected)}.pt"
    end_a = torch.load(straight / last, weights_only=True)
    end_b = torch.load(split / last, weights_only=True)
    assert all(torch.equal(end_a["model"][k], end_b["model"][k]) for k in end_a["model"])
    assert end_a["tokens"] == end_b["tokens"] == expected[-1][1]
    assert end_a["data"] == end_b["data"] and end_a["data"]["lanes"] == 2
    assert end_a["data"]["stream_position"] == sum(samples for samples, _ in expected)  # nothing skipped
    # The budget is spent: another run says so and writes nothing.
    again = train(corpus, split, *common, "--resume_from_checkpoint")
    assert f"has consumed {expected[-1][1]} tokens of --max_tokens {budget}: nothing left to train" in again.stderr
    assert {p.name for p in split.glob("ckpt_*.pt")} == {"ckpt_5.pt", last}


@pytest.mark.slow
def test_two_processes_count_the_tokens_and_grow_the_batch_as_one_process_does(corpus, tmp_path):
    """8 lanes, micro-batches of 4: one process takes steps of 2 then 4 micro-batches, two processes of 1 then 2
    each: the same samples, so the same tokens, steps and (without dropout) weights."""
    warmup, budget = 1000, 4000
    expected = expected_steps(corpus / "p1", 8, budget, ramp_of(warmup, 4, 4, 1, 8))
    assert expected == expected_steps(corpus / "p1", 8, budget, ramp_of(warmup, 2, 4, 2, 8))
    assert [samples for samples, _ in expected] == sorted(samples for samples, _ in expected)
    assert {samples for samples, _ in expected} == {8, 16}
    common = ["--data_lanes", 8, "--max_tokens", budget, "--batch_size_warmup_tokens", warmup]
    one, two = tmp_path / "one", tmp_path / "two"
    train(corpus, one, "--train_batch_size", 16, "--gradient_accumulation_steps", 4, *common,
          config="bert_config_no_dropout.json")
    train(corpus, two, "--train_batch_size", 8, "--gradient_accumulation_steps", 2, *common,
          "--allreduce_post_accumulation", config="bert_config_no_dropout.json", nproc=2)
    assert logged_steps(one / "log.json") == logged_steps(two / "log.json") == expected
    last = f"ckpt_{len(expected)}.pt"
    a = torch.load(one / last, weights_only=True)
    b = torch.load(two / last, weights_only=True)
    assert a["tokens"] == b["tokens"] == expected[-1][1] and a["data"] == b["data"]
    assert max(float((a["model"][k] - b["model"][k]).abs().max()) for k in a["model"]) < 1e-6


@pytest.mark.slow
def test_a_ramp_the_run_s_lanes_cannot_take_is_one_line_before_anything_is_written(corpus, tmp_path):
    out = tmp_path / "out"
    result = train(corpus, out, "--train_batch_size", 8, "--gradient_accumulation_steps", 2, "--data_lanes", 8,
                   "--batch_size_warmup_tokens", 100, check=False)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--data_lanes 1" in result.stderr and "no smaller batch" in result.stderr
    assert not list(out.glob("ckpt_*")) and not (out / "log.json").exists()


@pytest.mark.slow
def test_packed_micro_batches_count_the_tokens_of_their_samples(corpus, tmp_path):
    """--pack_sequences puts several samples in a row: the count is still their real tokens, as from the shards."""
    cumulative = [tokens for _, tokens in expected_steps(corpus / "p1", 8, math.inf, lambda t: 8, max_steps=6)]
    budget = cumulative[2] + 1  # step 4 is the last
    out = tmp_path / "packed"
    train(corpus, out, "--train_batch_size", 8, "--gradient_accumulation_steps", 2, "--no_nsp",
          "--pack_sequences", "--max_tokens", budget)
    assert [tokens for _, tokens in logged_steps(out / "log.json")] == cumulative[:4]
    assert stop_records(out / "log.json") == [{"stopped_by": "max_tokens", "global_step": 4}]


@pytest.mark.slow
def test_without_token_flags_two_processes_report_the_tokens_of_one_at_records_and_checkpoints(corpus, tmp_path):
    """No token budget and no warm-up: the count is summed over the processes only at the records (every third
    step), the checkpoints and the end, and still equals the shards' tokens of the steps taken."""
    cumulative = [tokens for _, tokens in expected_steps(corpus / "p1", 8, math.inf, lambda t: 8, max_steps=7)]
    common = ["--data_lanes", 8, "--max_steps", 7, "--log_freq", 3, "--num_steps_per_checkpoint", 5]
    one, two = tmp_path / "one", tmp_path / "two"
    train(corpus, one, "--train_batch_size", 8, *common)
    train(corpus, two, "--train_batch_size", 4, *common, nproc=2)
    for out in one, two:
        records = step_records(out / "log.json")
        assert {step: record["tokens"] for (_, step), record in records.items()} == {
            3: cumulative[2], 6: cumulative[5], 7: cumulative[6]}
        assert final_record(out / "log.json")["tokens"] == cumulative[6]
        assert torch.load(out / "ckpt_5.pt", weights_only=True)["tokens"] == cumulative[4]
        assert torch.load(out / "ckpt_7.pt", weights_only=True)["tokens"] == cumulative[6]
