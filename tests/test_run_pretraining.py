"""run_pretraining.py end to end on shards made from real book excerpts: learning, exact resume, DDP equivalence,
the phase-2 hand-off, preemption, evaluation and every bad input of the pre-training issue."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch

from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.model.families import config_from_json_file, pretraining_model
from bertrecipe.pretraining import sample_order
from bertrecipe.pretraining.shard_schema import inspect_shard
from bertrecipe.training.metric_logger import read_log
from helpers import (
    ENV,
    REPO_ROOT,
    TINY,
    final_record,
    make_shard,
    masked_lm_reference,
    pretrain,
    run_command,
    step_records,
)


@pytest.mark.slow
def test_loss_falls_on_real_text_and_logs_follow_dllogger_format(corpus, tmp_path):
    pretrain(corpus, tmp_path, "--train_batch_size", 16, "--max_steps", 40, "--log_freq", 5)
    records = read_log(tmp_path / "log.json")
    first = records[0]
    assert list(first) == ["timestamp", "datetime", "elapsedtime", "type", "step", "data"]
    assert first["step"] == "PARAMETER" and first["type"] == "LOG"
    assert any(r["type"] == "METADATA" and list(r)[3:] == ["type", "metric", "metadata"] for r in records)
    steps = step_records(tmp_path / "log.json")
    assert sorted(steps) == [(0, s) for s in range(5, 41, 5)]
    assert steps[(0, 40)]["average_loss"] < steps[(0, 5)]["average_loss"] - 1.0
    assert set(steps[(0, 5)]) == {"average_loss", "step_loss", "learning_rate", "skipped_steps",
                                  "training_sequences_per_second", "tokens", "tokens_per_second",
                                  "input_wait_share", "mfu"}
    assert all(data["training_sequences_per_second"] > 0 for data in steps.values())
    final = final_record(tmp_path / "log.json")
    assert {"e2e_train_time", "training_sequences_per_second", "final_loss", "raw_train_time"} <= set(final)
    assert final["training_sequences_per_second"] > 0
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == ["ckpt_40.pt"]


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.slow
def test_resume_continues_bit_for_bit(corpus, tmp_path, nproc):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--train_batch_size", 8, "--gradient_accumulation_steps", 2, "--max_steps", 8,
              "--num_steps_per_checkpoint", 4]
    pretrain(corpus, straight, *common, nproc=nproc)
    pretrain(corpus, split, *common, "--steps_this_run", 3, nproc=nproc)
    assert sorted(p.name for p in split.glob("ckpt_*.pt")) == ["ckpt_3.pt"]
    if nproc > 1:  # each rank's dropout stream is kept: the ranks draw different masks
        states = torch.load(split / "ckpt_3.pt", weights_only=True)["rng_per_rank"]
        assert len(states) == 2 and not torch.equal(states[0]["torch"], states[1]["torch"])
    pretrain(corpus, split, *common, "--resume_from_checkpoint", nproc=nproc)
    a, b = step_records(straight / "log.json"), step_records(split / "log.json")
    assert sorted(a) == sorted(b) == [(0, s) for s in range(1, 9)]
    for step in range(4, 9):  # after the resume: identical to the last bit, dropout and data order included
        assert a[(0, step)]["step_loss"] == b[(0, step)]["step_loss"]
    weights_a = torch.load(straight / "ckpt_8.pt", weights_only=True)["model"]
    weights_b = torch.load(split / "ckpt_8.pt", weights_only=True)["model"]
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.slow
def test_two_processes_equal_one_process_with_double_accumulation(corpus, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    pretrain(corpus, one, "--train_batch_size", 8, "--gradient_accumulation_steps", 4, "--max_steps", 3,
             config="bert_config_no_dropout.json")
    pretrain(corpus, two, "--train_batch_size", 4, "--gradient_accumulation_steps", 2, "--max_steps", 3,
             "--allreduce_post_accumulation", config="bert_config_no_dropout.json", nproc=2)
    a = torch.load(one / "ckpt_3.pt", weights_only=True)["model"]
    b = torch.load(two / "ckpt_3.pt", weights_only=True)["model"]
    differences = [float((a[k] - b[k]).abs().max()) for k in a]
    assert max(differences) < 1e-6
    # Per-step throughput counts the sequences of both processes (4 x 2 a step): the intervals it implies hold
    # rank 0's step times and lie within the run. The final throughput is timed on the third step alone, whose
    # time lies within its record's interval and is at least the run's step time less the first two intervals;
    # bounds from the records, not from how long logging took, so a loaded machine cannot fail them.
    steps, summary = step_records(two / "log.json"), final_record(two / "log.json")
    assert sorted(steps) == [(0, 1), (0, 2), (0, 3)]
    intervals = {key: 8 / steps[key]["training_sequences_per_second"] for key in steps}
    taken = sum(intervals.values())
    assert summary["raw_train_time"] * (1 - 1e-9) <= taken <= summary["e2e_train_time"], (taken, summary)
    third_step = 8 / summary["training_sequences_per_second"]
    at_least = summary["raw_train_time"] - intervals[(0, 1)] - intervals[(0, 2)]
    assert at_least - 1e-9 * taken <= third_step <= intervals[(0, 3)] * (1 + 1e-9), (steps, summary)
    initial = BertForPreTraining(BertConfig(**TINY)).state_dict()
    assert any(not torch.equal(a[k], initial[k]) for k in a if k.endswith("query.weight"))


# run_pretraining.main with torch's fp16 all-reduce hook wrapped: each rank records the gradients it sent and
# what the all-reduce handed back.
HOOK_SPY = """
import sys
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from bertrecipe.cli import run_pretraining

calls = []
real_hook = default_hooks.fp16_compress_hook


def spy(state, bucket):
    sent = bucket.buffer().clone()

    def record(future):
        calls.append((sent, future.value().clone()))
        torch.save(calls, {out!r} + f"/hook_rank{{torch.distributed.get_rank()}}.pt")
        return future.value()

    return real_hook(state, bucket).then(record)


default_hooks.fp16_compress_hook = spy
run_pretraining.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_fp16_compressed_allreduce_hands_every_rank_the_fp16_rounded_mean(corpus, tmp_path):
    """--allreduce_post_accumulation_fp16 with --fp16 on two gloo processes: the gradients DDP hands back are
    the mean of both ranks' gradients rounded to fp16, as a plain computation here gives, not the fp32 mean."""
    spy = tmp_path / "spy_run.py"
    spy.write_text(HOOK_SPY.format(repo=str(REPO_ROOT), out=str(tmp_path)))
    pretrain(corpus, tmp_path, "--train_batch_size", 4, "--gradient_accumulation_steps", 2, "--max_steps", 2,
             "--allreduce_post_accumulation", "--allreduce_post_accumulation_fp16", "--fp16", "--init_loss_scale",
             256, nproc=2, script=spy)
    ranks = [torch.load(tmp_path / f"hook_rank{rank}.pt", weights_only=True) for rank in range(2)]
    assert len(ranks[0]) == len(ranks[1]) >= 2  # a bucket or more per step, two steps
    for (sent0, got0), (sent1, got1) in zip(*ranks, strict=True):
        assert torch.isfinite(got0).all() and not torch.equal(sent0, sent1)  # the ranks saw different data
        expected = (sent0.half() / 2 + sent1.half() / 2).float()  # cast, divide by the world size, sum in fp16
        assert torch.equal(got0, expected) and torch.equal(got1, expected)
        mean = (sent0 + sent1) / 2
        touched = mean != 0  # rows of the embedding that no token of the batch used stay 0 either way
        assert (got0[touched] != mean[touched]).float().mean() > 0.5  # the fp16 rounding is visible
    assert (tmp_path / "ckpt_2.pt").exists()


@pytest.mark.slow
def test_fp16_on_cpu_checkpoints_the_loss_scale_and_resumes_bit_for_bit(corpus, tmp_path):
    """--fp16 on a CPU from NVIDIA's initial scale 2**20: the first steps overflow in fp16 and halve the scale;
    ckpt_3 keeps the scaler's state and the resumed run goes on from it exactly (from 2**20 again it would skip
    steps the straight run made)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--train_batch_size", 8, "--gradient_accumulation_steps", 2, "--max_steps", 8,
              "--num_steps_per_checkpoint", 4, "--fp16", "--init_loss_scale", 2.0**20]
    pretrain(corpus, straight, *common)
    pretrain(corpus, split, *common, "--steps_this_run", 3)
    a = step_records(straight / "log.json")
    skipped = [a[(0, step)]["skipped_steps"] for step in range(1, 9)]
    assert skipped[2] >= 1 and all(math.isfinite(a[key]["step_loss"]) for key in a)
    scaler = torch.load(split / "ckpt_3.pt", weights_only=True)["scaler"]
    # torch's dynamic scaling: halved per skipped step; the doubling waits for 2000 good steps in a row.
    assert scaler["scale"] == 2.0**20 * 0.5 ** skipped[2] == a[(0, 3)]["loss_scale"]
    good_since_last_skip = 3 - max([step for step in range(1, 4) if skipped[step - 1] > (skipped[step - 2] if
                                                                                        step > 1 else 0)])
    assert scaler["_growth_tracker"] == good_since_last_skip
    pretrain(corpus, split, *common, "--resume_from_checkpoint")
    b = step_records(split / "log.json")
    for step in range(4, 9):
        assert a[(0, step)]["step_loss"] == b[(0, step)]["step_loss"]
        assert a[(0, step)]["loss_scale"] == b[(0, step)]["loss_scale"]
    end_a = torch.load(straight / "ckpt_8.pt", weights_only=True)
    end_b = torch.load(split / "ckpt_8.pt", weights_only=True)
    assert end_a["scaler"] == end_b["scaler"]
    assert all(torch.equal(end_a["model"][k], end_b["model"][k]) for k in end_a["model"])


@pytest.mark.slow
def test_phase2_starts_from_phase1_with_reset_schedule_and_continued_numbers(corpus, tmp_path):
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 4, "--num_steps_per_checkpoint", 2)
    phase1 = torch.load(tmp_path / "ckpt_4.pt", weights_only=True)
    pretrain(corpus, tmp_path, "--train_batch_size", 4, "--max_steps", 4, "--num_steps_per_checkpoint", 2,
             "--resume_from_checkpoint", "--phase2", "--phase1_end_step", 4, "--learning_rate", 8e-3, phase=2)
    # Phase 2 rotates only its own checkpoints: phase 1's stay whole.
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == ["ckpt_2.pt", "ckpt_4.pt", "ckpt_6.pt", "ckpt_8.pt"]
    steps = step_records(tmp_path / "log.json")
    # Phase 2's schedule starts again from its own lr: step 1 of 4 is past the 10 % warm-up.
    assert steps[(0, 5)]["learning_rate"] == pytest.approx(8e-3 * (1 - 1 / 4) ** 0.5)
    phase2 = torch.load(tmp_path / "ckpt_8.pt", weights_only=True)
    assert phase2["phase2"] and phase2["phase_step"] == 4 and phase2["optimizer"]["param_groups"][0]["step"] == 4
    assert phase1["optimizer"]["param_groups"][0]["step"] == 4
    # Phase 2 resumes within itself exactly like phase 1 does.
    pretrain(corpus, tmp_path, "--train_batch_size", 4, "--max_steps", 6, "--num_steps_per_checkpoint", 2,
             "--resume_from_checkpoint", "--phase2", "--phase1_end_step", 4, phase=2)
    assert (tmp_path / "ckpt_10.pt").exists()


@pytest.mark.parametrize("workers, whole_job", [(0, False), (1, True)])
@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_and_exits_143_saying_so(corpus, tmp_path, workers, whole_job):
    """SIGTERM to the main process, or (as Slurm does) to the whole job including DataLoader workers: the step
    finishes, a checkpoint is written, and the run says it stopped early and exits 143 (128 + SIGTERM), so that
    neither run_pretraining.sh nor a Slurm dependency (afterok) takes the phase for finished."""
    process = pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 100000,
                       "--num_steps_per_checkpoint", 100000, "--num_workers", workers, popen=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "log.json").exists() or not step_records_safe(tmp_path):
        time.sleep(0.2)
        assert process.poll() is None, process.stderr.read()
    if whole_job:
        os.killpg(process.pid, signal.SIGTERM)
    else:
        process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    checkpoints = list(tmp_path.glob("ckpt_*.pt"))
    assert len(checkpoints) == 1
    step = int(checkpoints[0].stem.split("_")[1])
    assert f"stopped by SIGTERM at step {step} before the end of the phase; checkpoint {checkpoints[0]}" in stderr
    assert torch.load(checkpoints[0], weights_only=True)["phase_step"] == step >= 1
    stop = [r for r in read_log(tmp_path / "log.json") if r.get("step") == "PARAMETER" and "stopped_by" in r["data"]]
    assert stop and stop[0]["data"]["global_step"] == step


def step_records_safe(folder):
    try:
        return step_records(folder / "log.json")
    except (json.JSONDecodeError, FileNotFoundError):
        return {}


@pytest.mark.slow
def test_do_eval_alone_reports_masked_lm_loss_and_accuracy(corpus, tmp_path):
    pretrain(corpus, tmp_path / "train", "--train_batch_size", 16, "--max_steps", 10)
    result = run_command(
        [sys.executable, str(REPO_ROOT / "run_pretraining.py"), "--input_dir", str(corpus / "p1"), "--config_file",
         str(corpus / "bert_config.json"), "--output_dir", str(tmp_path / "eval_out"), "--do_eval", "--eval_dir",
         str(corpus / "eval"), "--init_checkpoint", str(tmp_path / "train" / "ckpt_10.pt"),
         "--train_batch_size", "32", "--json-summary", str(tmp_path / "eval.json"), "--disable_progress_bar"])
    assert result.returncode == 0, result.stderr
    final = final_record(tmp_path / "eval.json")
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    model.load_state_dict(torch.load(tmp_path / "train" / "ckpt_10.pt", weights_only=True)["model"])
    loss, accuracy, nsp = masked_lm_reference(model, corpus / "eval" / "books_test_0.hdf5", with_nsp=True)
    assert final["eval_loss"] == pytest.approx(loss, rel=1e-4)
    assert final["eval_mlm_accuracy"] == pytest.approx(accuracy, abs=1e-4)
    assert final["eval_nsp_accuracy"] == pytest.approx(nsp, abs=1e-9)
    assert not list((tmp_path / "eval_out").glob("ckpt_*.pt"))


@pytest.mark.slow
def test_non_finite_losses_stop_with_exit_1_and_the_last_checkpoint_intact(corpus, tmp_path):
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 30, "--steps_this_run", 2)
    good = torch.load(tmp_path / "ckpt_2.pt", weights_only=True)
    broken = dict(good)
    broken["model"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                       for k, v in good["model"].items()}
    broken["phase_step"] = 3  # as its name says
    torch.save(broken, tmp_path / "ckpt_3.pt")
    before = {p.name: p.read_bytes() for p in tmp_path.glob("ckpt_*.pt")}
    result = pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 30, "--resume_from_checkpoint",
                      "--num_steps_per_checkpoint", 1, check=False)
    assert result.returncode == 1
    assert "not finite for 10 steps" in result.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.glob("ckpt_*.pt")} == before


@pytest.mark.slow
def test_corrupt_newest_checkpoint_is_skipped_for_the_previous(corpus, tmp_path):
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 6, "--num_steps_per_checkpoint", 2,
             "--steps_this_run", 4)
    (tmp_path / "ckpt_4.pt").write_bytes((tmp_path / "ckpt_4.pt").read_bytes()[:1000])  # half-written
    result = pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 6, "--num_steps_per_checkpoint", 2,
                      "--resume_from_checkpoint")
    assert "skipping" in result.stderr and "ckpt_4.pt" in result.stderr
    resumed = [r for r in read_log(tmp_path / "log.json")
               if r.get("step") == "PARAMETER" and "resumed_from" in r["data"]]
    assert resumed[-1]["data"]["resumed_from"].endswith("ckpt_2.pt")
    assert (tmp_path / "ckpt_6.pt").exists()


def write_shard(path, n=16, seq=64, preds=10, drop=None, seq_override=None, bad_row=0, **attrs):
    rng = np.random.default_rng(0)
    seq = seq_override or seq
    arrays = {
        "input_ids": rng.integers(1000, 2000, (n, seq)).astype(np.int32),
        "input_mask": np.ones((n, seq), np.int8),
        "segment_ids": np.zeros((n, seq), np.int8),
        "masked_lm_positions": np.tile(np.arange(1, preds + 1, dtype=np.int32), (n, 1)),
        "masked_lm_ids": rng.integers(1000, 2000, (n, preds)).astype(np.int32),
        "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8),
    }
    arrays["input_ids"][bad_row, 5] = attrs.pop("bad_id", 1500)
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            if key != drop:
                f.create_dataset(key, data=value)
        for key, value in attrs.items():
            f.attrs[key] = value


def cli(corpus, tmp_path, input_dir, *extra, own_process=False):
    command = [sys.executable, str(REPO_ROOT / "run_pretraining.py"), "--input_dir", str(input_dir), "--config_file",
               str(corpus / "bert_config.json"), "--output_dir", str(tmp_path / "out"), "--max_seq_length", "64",
               "--max_predictions_per_seq", "10", "--train_batch_size", "8", "--max_steps", "2", "--do_train",
               "--disable_progress_bar", "--json-summary", str(tmp_path / "log.json"), *map(str, extra)]
    if own_process:
        # A bounded wait: a DataLoader worker that outlived its main process's shutdown would hang here otherwise.
        return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    return run_command(command)


def assert_clear_error(result, *fragments):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("case, fragments", [
    ("missing_dir", ["does not exist"]),
    ("no_training_files", ["holds no"]),
    ("missing_key", ["books_training_0.hdf5", "masked_lm_ids"]),
    ("wrong_shape", ["books_training_0.hdf5", "--max_seq_length"]),
    ("id_beyond_vocab", ["books_training_0.hdf5", "outside the model's vocab"]),
    ("id_beyond_vocab_in_a_worker", ["books_training_0.hdf5", "outside the model's vocab"]),
    ("too_long_for_positions", ["books_training_0.hdf5", "max_position_embeddings"]),
    ("vocab_attr_mismatch", ["books_training_0.hdf5", "vocab of 50000"]),
    ("not_hdf5", ["books_training_0.hdf5", "HDF5"]),
])
@pytest.mark.slow
def test_bad_shards_are_clear_errors(corpus, tmp_path, case, fragments):
    data = tmp_path / "data"
    data.mkdir()
    shard = data / "books_training_0.hdf5"
    extra = []
    if case == "missing_dir":
        data = tmp_path / "nowhere"
    elif case == "no_training_files":
        write_shard(data / "books_test_0.hdf5")
    elif case == "missing_key":
        write_shard(shard, drop="masked_lm_ids")
    elif case == "wrong_shape":
        write_shard(shard, seq_override=32)
    elif case.startswith("id_beyond_vocab"):
        # The bad id sits in the row lane 0 trains on in step 2 (seed 42, 8 lanes of 2 rows): a check per batch
        # instead of one of each portion as it is read would train step 1 and leave ckpt_1.pt.
        write_shard(shard)
        stream = sample_order.StreamOrder([16], [inspect_shard(shard, TINY["vocab_size"], 128).block_rows], 42, 8)
        portion = next(stream.lane_portions(0, 0))
        write_shard(shard, bad_id=40000, bad_row=portion.start + int(stream.portion_order(portion)[1]))
        extra = ["--num_workers", "1"] if case.endswith("worker") else []
    elif case == "too_long_for_positions":
        write_shard(shard, seq_override=256)
        extra = ["--max_seq_length", "256"]
    elif case == "vocab_attr_mismatch":
        write_shard(shard, vocab_size=50000)
    elif case == "not_hdf5":
        shard.write_text("plain text")
    # A checkpoint every step: a shard found bad only after a step had trained on it would leave ckpt_1.pt.
    assert_clear_error(cli(corpus, tmp_path, data, *extra, "--num_steps_per_checkpoint", 1), *fragments)
    assert not list((tmp_path / "out").glob("ckpt_*.pt"))


def test_output_dir_of_another_run_needs_resume(corpus, tmp_path):
    (tmp_path / "out").mkdir()
    torch.save({"model": {}}, tmp_path / "out" / "ckpt_7.pt")
    assert_clear_error(cli(corpus, tmp_path, corpus / "p1"), "ckpt_7.pt", "--resume_from_checkpoint")


@pytest.mark.slow
def test_do_eval_alone_needs_weights(corpus, tmp_path):
    result = run_command(
        [sys.executable, str(REPO_ROOT / "run_pretraining.py"), "--input_dir", str(corpus / "p1"), "--config_file",
         str(corpus / "bert_config.json"), "--output_dir", str(tmp_path / "out"), "--do_eval", "--eval_dir",
         str(corpus / "eval")])
    assert_clear_error(result, "--init_checkpoint")


@pytest.mark.slow
def test_fp16_with_a_loss_scale_of_0_is_a_clear_error(corpus, tmp_path):
    assert_clear_error(cli(corpus, tmp_path, corpus / "p1", "--fp16", "--init_loss_scale", "0"), "--init_loss_scale")


@pytest.mark.slow
def test_bf16_and_workers_train(corpus, tmp_path):
    result = cli(corpus, tmp_path, corpus / "p1", "--bf16", "--num_workers", "2", own_process=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "ckpt_2.pt").exists()


@pytest.mark.slow
def test_run_pretraining_sh_runs_both_phases_on_one_cpu_process(vocab_file, corpus, tmp_path):
    """NVIDIA's positional arguments: phase 1 (128/20) then phase 2 (512/80) from phase 1's checkpoint."""
    for folder, seq, preds in (("p1", 128, 20), ("p2", 512, 80)):
        (tmp_path / folder).mkdir()
        make_shard(vocab_file, corpus / "alice.txt", tmp_path / folder / "books_training_0.hdf5", seq, preds)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY, "max_position_embeddings": 512}))
    positional = [8, "1e-2", "bf16", 1, 0.1, 3, 2, "false", "false", "true", 2, 42, "job", "false", "false",
                  4, "5e-3", 0.1, 2, 2, tmp_path / "p1", config, tmp_path / "p2", REPO_ROOT]
    env = {**ENV, "RESULTS_DIR": str(tmp_path / "results"), "PYTHON": sys.executable,
           "EXTRA_ARGS": "--disable_progress_bar"}
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_pretraining.sh"), *map(str, positional)],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checkpoints = sorted(p.name for p in (tmp_path / "results" / "checkpoints").glob("ckpt_*.pt"))
    assert checkpoints == ["ckpt_2.pt", "ckpt_3.pt", "ckpt_5.pt"]  # phase 2 numbers continue after step 3
    phase2 = step_records(tmp_path / "results" / "dllogger_phase2.json")
    assert sorted(phase2) == [(0, 4), (0, 5)]


@pytest.mark.slow
def test_run_pretraining_sh_trains_the_modern_family_through_its_context_extension(vocab_file, corpus, tmp_path):
    """Arguments 26-31 (32-33, the batch-size warm-up, left at none): the modern recipe, 128/40 then 512/160,
    phase 2's config raising the rotary base; phase 1 ends at its peak lr (no decay) and phase 2 decays to 0 at its
    last step."""
    for folder, seq, preds in (("p1", 128, 20), ("p2", 512, 80)):
        (tmp_path / folder).mkdir()
        make_shard(vocab_file, corpus / "alice.txt", tmp_path / folder / "books_training_0.hdf5", seq, preds)
    configs = {}
    for name in ("modernbert-tiny.json", "modernbert-tiny-512.json"):  # with the embeddings of the shards' vocab
        config = json.loads((REPO_ROOT / "bert_configs" / name).read_text())
        configs[name] = tmp_path / name
        configs[name].write_text(json.dumps({**config, "vocab_size": TINY["vocab_size"]}))
    positional = [8, "1e-2", "bf16", 1, 0.1, 3, 2, "false", "false", "true", 2, 42, "job", "false", "false",
                  4, "5e-3", 0.1, 2, 2, tmp_path / "p1", configs["modernbert-tiny.json"], tmp_path / "p2", REPO_ROOT,
                  "None", "modern", 128, 40, 512, 160, configs["modernbert-tiny-512.json"]]
    env = {**ENV, "RESULTS_DIR": str(tmp_path / "results"), "PYTHON": sys.executable,
           "EXTRA_ARGS": "--disable_progress_bar"}
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_pretraining.sh"), *map(str, positional)],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checkpoints = tmp_path / "results" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("ckpt_*.pt")) == ["ckpt_2.pt", "ckpt_3.pt", "ckpt_5.pt"]
    phase1 = step_records(tmp_path / "results" / "dllogger_phase1.json")
    phase2 = step_records(tmp_path / "results" / "dllogger_phase2.json")
    assert phase1[(0, 3)]["learning_rate"] == pytest.approx(1e-2) and phase2[(0, 5)]["learning_rate"] < 1e-12
    end = torch.load(checkpoints / "ckpt_5.pt", weights_only=True)
    assert end["config"]["max_position_embeddings"] == 512
    assert end["config"]["rope_parameters"]["full_attention"]["rope_theta"] == 160000.0
    assert end["args"]["optimizer"] == "stable_adamw" and end["args"]["masked_lm_prob"] == 0.3
    assert end["args"]["pack_sequences"] and end["args"]["max_predictions_per_seq"] == 160


@pytest.mark.parametrize("tail, fragment", [
    (["modren"], "recipe (argument 26): 'modren' is neither bert nor modern"),
    (["modern", 128, "forty"], "max_predictions_per_seq (argument 28): 'forty' is not a whole number"),
    (["modern", 128, 40, 512, 160, "missing-8k.json"], "phase 2's config (argument 31): 'missing-8k.json' does not"),
    (["modern", 128, 40, 512, 160, "", 0, 0.125, "zero"], "sharding (argument 34): 'zero' is neither ddp nor fsdp"),
    (["modern", 128, 40, 512, 160, "", 0, 0.125, "fsdp", 8], "nodes (argument 35): '8' needs NODE_RANK"),
])
def test_run_pretraining_sh_refuses_a_bad_modern_argument_before_running_anything(tmp_path, tail, fragment):
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@" >> "$ARGS_LOG"\n')
    fake.chmod(0o755)
    positional = [8, "1e-2", "bf16", 1, 0.1, 3, 2, "false", "false", "true", 2, 42, "job", "false", "false",
                  4, "5e-3", 0.1, 2, 2, tmp_path / "p1", tmp_path / "c.json", tmp_path / "p2", REPO_ROOT, "None", *tail]
    env = {**ENV, "RESULTS_DIR": str(tmp_path / "results"), "PYTHON": str(fake), "ARGS_LOG": str(tmp_path / "args")}
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_pretraining.sh"), *map(str, positional)],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert fragment in result.stderr
    assert not (tmp_path / "args").exists() and not (tmp_path / "results").exists()


def test_the_billion_parameter_presets_configs_hold_a_billion_parameters():
    """BERT-xlarge (ALBERT paper's, 1.27B counted there without the heads) and the modern family at Ettin-1B's
    shape, whose context extension has as many."""
    counts = {}
    for name in ("xlarge", "modernbert-1b", "modernbert-1b-8k"):
        with torch.device("meta"):
            model = pretraining_model(config_from_json_file(REPO_ROOT / "bert_configs" / f"{name}.json"))
        counts[name] = sum(p.numel() for p in model.parameters())
    assert 1.25e9 < counts["xlarge"] < 1.3e9 and 0.99e9 < counts["modernbert-1b"] < 1.01e9, counts
    assert counts["modernbert-1b-8k"] == counts["modernbert-1b"], counts  # rotary positions: nothing learned


def test_run_pretraining_sh_maps_tf32_and_stops_after_an_unfinished_phase_1(tmp_path):
    """With a stand-in python that records its arguments and trains nothing, phase 1 leaves no ckpt_<steps>.pt
    (as after a SIGTERM), so phase 2 must not start; precision tf32 becomes --tf32."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@" >> "$ARGS_LOG"\n')
    fake.chmod(0o755)
    positional = [8, "1e-2", "tf32", 1, 0.1, 3, 2, "false", "false", "true", 2, 42, "job", "false", "false",
                  4, "5e-3", 0.1, 2, 2, tmp_path / "p1", tmp_path / "config.json", tmp_path / "p2", REPO_ROOT]
    env = {**ENV, "RESULTS_DIR": str(tmp_path / "results"), "PYTHON": str(fake), "ARGS_LOG": str(tmp_path / "args")}
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_pretraining.sh"), *map(str, positional)],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "args").read_text().splitlines()
    assert len(calls) == 1 and "--tf32" in calls[0].split() and "--phase2" not in calls[0]
    assert "phase 2 not started" in result.stdout


PRESETS = ["dgxa100_8gpu_fp16", "dgxa100_8gpu_tf32", "dgx2_16gpu_fp16", "dgx1_8gpu_fp16", "h100_8gpu_bf16", "cpu",
           "modernbert_base_8gpu_bf16", "cpu_modern", "bert_xlarge_8gpu_bf16_fsdp", "bert_xlarge_64gpu_bf16_fsdp",
           "modernbert_1b_8gpu_bf16_fsdp", "modernbert_1b_64gpu_bf16_fsdp"]
# Global batches (sequences) of each phase: the LAMB paper's for BERT; ModernBERT's 4,608 rows of 1,024 tokens,
# then as many tokens a step in rows of 8,192. And each phase's length and masked positions.
MODERN_STEPS = ("1024", "308", "8192", "2458")
GLOBAL_BATCHES = {preset: (4608, 576) for preset in PRESETS if preset.startswith("modernbert_")}
LENGTHS = {**{preset: MODERN_STEPS for preset in GLOBAL_BATCHES}, "cpu_modern": ("128", "40", "512", "160")}
# The billion-parameter presets: sharded, and on 1 or 8 nodes (64 GPUs) through torchrun's static rendezvous.
SHARDED_NODES = {"bert_xlarge_8gpu_bf16_fsdp": 1, "bert_xlarge_64gpu_bf16_fsdp": 8,
                 "modernbert_1b_8gpu_bf16_fsdp": 1, "modernbert_1b_64gpu_bf16_fsdp": 8}
MODERN_FLAGS = {"--optimizer=stable_adamw", "--lr_schedule=wsd", "--decay_shape=1-sqrt", "--dynamic_masking",
                "--masked_lm_prob=0.3", "--no_nsp", "--pack_sequences", "--weight_decay=1e-5", "--adam_beta2=0.98"}


@pytest.mark.parametrize("preset", PRESETS)
def test_pretrain_presets_give_consistent_two_phase_commands(preset, tmp_path):
    """Each preset through run_pretraining.sh with a stand-in python that records its command and writes the
    phase's last checkpoint: the flags of both phases, and the global batches of the LAMB recipe."""
    fake = tmp_path / "python"
    # A sharded run's checkpoint is a folder: phase 2 must start from it too.
    fake.write_text('#!/bin/sh\necho "$@" >> "$ARGS_LOG"\nout=; steps=; kind=pt\nfor a in "$@"; do case "$a" in\n'
                    '  --output_dir=*) out=${a#--output_dir=} ;; --max_steps=*) steps=${a#--max_steps=} ;;\n'
                    '  --sharding=fsdp) kind=dcp ;;\n'
                    'esac; done\nmkdir -p "$out"\n'
                    'if [ $kind = dcp ]; then mkdir "$out/ckpt_$steps.dcp"; else touch "$out/ckpt_$steps.pt"; fi\n')
    fake.chmod(0o755)
    configs = REPO_ROOT / "scripts" / "configs" / "pretrain_config.sh"
    positional = subprocess.run(["bash", "-c", f"source {configs} && {preset}"], capture_output=True, text=True,
                                check=True).stdout.split()
    env = {**ENV, "RESULTS_DIR": str(tmp_path / "results"), "PYTHON": str(fake), "ARGS_LOG": str(tmp_path / "args"),
           "NODE_RANK": "3", "MASTER_ADDR": "node0"}
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_pretraining.sh"), *positional],
                            env=env, capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    phases = [dict(arg.split("=", 1) for arg in line.split() if arg.startswith("--") and "=" in arg)
              for line in (tmp_path / "args").read_text().splitlines()]
    assert len(phases) == 2
    flags = [set(line.split()) for line in (tmp_path / "args").read_text().splitlines()]
    nodes = SHARDED_NODES.get(preset, 1)
    gpus = int(positional[3])
    for phase, (batch, accumulation) in enumerate([(positional[0], positional[10]), (positional[15], positional[19])]):
        args = phases[phase]
        assert args["--nproc_per_node"] == str(gpus)
        assert ("--sharding=fsdp" in flags[phase]) == (preset in SHARDED_NODES)
        if nodes > 1:
            assert (args["--nnodes"], args["--node_rank"], args["--master_addr"]) == (str(nodes), "3", "node0")
        else:
            assert "--standalone" in flags[phase] and "--nnodes" not in args
        assert args["--train_batch_size"] == batch and args["--gradient_accumulation_steps"] == accumulation
        assert int(batch) % int(accumulation) == 0  # a whole micro-batch per accumulation step
        if not preset.startswith("cpu"):
            assert int(batch) * gpus * nodes == GLOBAL_BATCHES.get(preset, (65536, 32768))[phase]
        precision = {"fp16": "--fp16", "bf16": "--bf16", "tf32": "--tf32"}[positional[2]]
        assert precision in flags[phase]
        modern = "modern" in preset
        assert MODERN_FLAGS <= flags[phase] if modern else not MODERN_FLAGS & flags[phase]
    assert "--phase2" in flags[1] and phases[1]["--phase1_end_step"] == positional[5]
    lengths = tuple(phases[p][f] for p in (0, 1) for f in ("--max_seq_length", "--max_predictions_per_seq"))
    assert lengths == LENGTHS.get(preset, ("128", "20", "512", "80"))
    configs = [json.loads((REPO_ROOT / phases[p]["--config_file"]).read_text()) if modern else None for p in (0, 1)]
    if modern:  # phase 1 held at its peak; phase 2 the context extension: longer rows, a raised rotary base
        assert phases[0]["--decay_proportion"] == "0" and float(phases[1]["--decay_proportion"]) > 0
        # phase 1 warms its batch up (ModernBERT-base: 768 of 4,608 rows, whole micro-batches), phase 2 does not
        start = float(phases[0]["--batch_size_warmup_start"]) * int(positional[10])
        assert float(phases[0]["--batch_size_warmup_tokens"]) > 0 and start == pytest.approx(round(start), abs=0.01)
        assert "--batch_size_warmup_tokens" not in phases[1]
        if preset in GLOBAL_BATCHES:
            assert round(start) * int(positional[0]) // int(positional[10]) * gpus * nodes == 768
        assert configs[0]["max_position_embeddings"] == int(lengths[0])
        assert configs[1]["max_position_embeddings"] == int(lengths[2])
        assert configs[1]["global_rope_theta"] > configs[0]["global_rope_theta"]
        assert {k: v for k, v in configs[0].items() if k not in ("max_position_embeddings", "global_rope_theta")} \
            == {k: v for k, v in configs[1].items() if k not in ("max_position_embeddings", "global_rope_theta")}
    else:
        assert phases[0]["--config_file"] == phases[1]["--config_file"]
