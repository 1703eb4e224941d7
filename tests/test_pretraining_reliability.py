"""run_pretraining.py never loses work and answers bad input with one line (issue 13): checkpoint rotation around
corrupt files, shard values out of range, flags that make no sense, resuming into another config, a full disk,
non-finite training and the messages of unreadable checkpoints. Self-contained: tiny random shards and model."""
import errno
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np
import pytest
import torch

from bertrecipe.cli import run_pretraining
from bertrecipe.cli.command_line import Terminated
from bertrecipe.common.errors import InputError
from bertrecipe.pretraining import startup
from bertrecipe.pretraining.data import BertPretrainingCriterion
from bertrecipe.training.metric_logger import read_log
from bertrecipe.training.stepper import use_deterministic_algorithms
from helpers import ENV, REPO_ROOT, run_command

VOCAB, SEQ, PREDS = 128, 16, 3
CONFIG = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 64, "max_position_embeddings": 32, "type_vocab_size": 2, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}


def shard_arrays(n=32, seed=0):
    """What create_pretraining_data writes: ids in the vocab, two segments, positions 1..PREDS masked."""
    rng = np.random.default_rng(seed)
    segment_ids = np.zeros((n, SEQ), np.int8)
    segment_ids[:, SEQ // 2:] = 1
    return {"input_ids": rng.integers(5, VOCAB, (n, SEQ)).astype(np.int32),
            "input_mask": np.ones((n, SEQ), np.int8),
            "segment_ids": segment_ids,
            "masked_lm_positions": np.tile(np.arange(1, PREDS + 1, dtype=np.int32), (n, 1)),
            "masked_lm_ids": rng.integers(5, VOCAB, (n, PREDS)).astype(np.int32),
            "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8)}


def write_shard(path, arrays):
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value)


@pytest.fixture
def workspace(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "tiny_training_0.hdf5", shard_arrays(seed=0))
    write_shard(data / "tiny_training_1.hdf5", shard_arrays(seed=1))
    (tmp_path / "bert_config.json").write_text(json.dumps(CONFIG))
    return tmp_path


def flags(ws, *extra, out="out"):
    return ["--input_dir", str(ws / "data"), "--config_file", str(ws / "bert_config.json"),
            "--output_dir", str(ws / out), "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PREDS),
            "--train_batch_size", "4", "--learning_rate", "1e-3", "--max_steps", "10", "--do_train",
            "--disable_progress_bar", "--json-summary", str(ws / out / "log.json"), *map(str, extra)]


def pretrain(ws, *extra, out="out"):
    return run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *flags(ws, *extra, out=out)])


def one_line_error(result, *fragments, code=2):
    assert result.returncode == code, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def checkpoint_names(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("ckpt_"))


# --- Rotation (item 2) -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_rotation_after_resuming_past_a_corrupt_checkpoint_keeps_the_good_ones(workspace):
    out = workspace / "out"
    assert pretrain(workspace, "--num_steps_per_checkpoint", 2, "--steps_this_run", 6).returncode == 0
    assert checkpoint_names(out) == ["ckpt_2.pt", "ckpt_4.pt", "ckpt_6.pt"]
    (out / "ckpt_6.pt").write_bytes((out / "ckpt_6.pt").read_bytes()[:2000])  # killed mid-copy
    good = {name: (out / name).read_bytes() for name in ("ckpt_2.pt", "ckpt_4.pt")}
    result = pretrain(workspace, "--num_steps_per_checkpoint", 2, "--resume_from_checkpoint", "--steps_this_run", 1)
    assert result.returncode == 0, result.stderr
    assert "ckpt_6.pt" in result.stderr and "moved aside" in result.stderr
    assert checkpoint_names(out) == ["ckpt_2.pt", "ckpt_4.pt", "ckpt_5.pt", "ckpt_6.pt.corrupt"]
    assert all((out / name).read_bytes() == data for name, data in good.items())
    # The next resume meets no corrupt file and continues from step 5.
    result = pretrain(workspace, "--num_steps_per_checkpoint", 2, "--resume_from_checkpoint", "--steps_this_run", 1)
    assert result.returncode == 0 and "skipping" not in result.stderr, result.stderr
    assert torch.load(out / "ckpt_6.pt", weights_only=True)["phase_step"] == 6


@pytest.mark.slow
def test_rotation_never_deletes_the_checkpoint_it_resumed_from_nor_the_new_one(workspace):
    out = workspace / "out"
    assert pretrain(workspace, "--num_steps_per_checkpoint", 2, "--steps_this_run", 6).returncode == 0
    result = pretrain(workspace, "--num_steps_per_checkpoint", 2, "--resume_from_checkpoint", "--resume_step", 2,
                      "--steps_this_run", 1)
    assert result.returncode == 0, result.stderr
    # The newest three that load are 3 (just written), 4 and 6; 2 stays as the checkpoint this run resumed from.
    assert checkpoint_names(out) == ["ckpt_2.pt", "ckpt_3.pt", "ckpt_4.pt", "ckpt_6.pt"]


@pytest.mark.slow
def test_stale_temporary_checkpoints_of_a_killed_save_are_removed_and_nothing_else(workspace):
    out = workspace / "out"
    out.mkdir()
    stale = out / ".ckpt_4.pt.abcd1234.tmp"
    stale.write_bytes(b"half a checkpoint")
    mine = out / "notes.tmp"
    mine.write_text("the user's")
    assert pretrain(workspace, "--max_steps", 2).returncode == 0
    assert not stale.exists() and mine.read_text() == "the user's"


# --- Shard values out of range (item 6) -------------------------------------------------------------------------
@pytest.mark.parametrize("key, row, value, expected", [
    ("masked_lm_positions", 3, SEQ, "outside the sequence of 16 tokens"),
    ("masked_lm_positions", 5, -2, "outside the sequence of 16 tokens"),
    ("segment_ids", 7, 2, "segment ids 0..1"),
    ("next_sentence_labels", 9, 2, "labels 0 and 1"),
    ("input_ids", 11, -7, "outside the model's vocab of 128"),
    ("masked_lm_ids", 2, VOCAB, "outside the model's vocab of 128"),
    ("input_mask", 4, 3, "mask values 0 and 1"),
])
@pytest.mark.slow
def test_out_of_range_shard_values_name_file_key_row_and_value(workspace, key, row, value, expected):
    arrays = shard_arrays(seed=0)
    if arrays[key].ndim == 1:
        arrays[key][row] = value
    else:
        arrays[key][row, 1] = value
    write_shard(workspace / "data" / "tiny_training_0.hdf5", arrays)
    (workspace / "data" / "tiny_training_1.hdf5").unlink()  # the run must meet the bad shard first
    line = one_line_error(pretrain(workspace, "--max_steps", 2), "tiny_training_0.hdf5", key, f"row {row}",
                          f"holds {value}", expected)
    assert "Traceback" not in line
    assert not list((workspace / "out").glob("ckpt_*.pt"))


@pytest.mark.slow
def test_second_segment_with_type_vocab_size_1_names_the_config_value(workspace):
    (workspace / "bert_config.json").write_text(json.dumps({**CONFIG, "type_vocab_size": 1}))
    one_line_error(pretrain(workspace, "--max_steps", 2), "segment_ids", "type_vocab_size 1")


# --- Flags that make no sense (item 7) ---------------------------------------------------------------------------
@pytest.mark.parametrize("extra, fragment", [
    (["--max_steps", 0], "--max_steps"),
    (["--max_steps", -5], "--max_steps"),
    (["--learning_rate", "nan"], "--learning_rate"),
    (["--learning_rate=-1e-3"], "--learning_rate"),
    (["--learning_rate", "1e39"], "--learning_rate"),
    (["--gradient_accumulation_steps", 0], "--gradient_accumulation_steps"),
    (["--num_steps_per_checkpoint", 0], "--num_steps_per_checkpoint"),
    (["--train_batch_size=-4"], "--train_batch_size"),
    (["--warmup_proportion", 2], "--warmup_proportion"),
    (["--steps_this_run", 0], "--steps_this_run"),
    (["--init_loss_scale", "inf"], "--init_loss_scale"),
    (["--data_lanes", 3], "3 lanes (--data_lanes"),
])
@pytest.mark.slow
def test_senseless_flags_are_one_line_and_create_nothing(workspace, extra, fragment):
    one_line_error(pretrain(workspace, *extra), fragment)
    assert not (workspace / "out").exists()


@pytest.mark.slow
def test_output_dir_that_is_a_file_and_json_summary_that_is_a_folder(workspace):
    (workspace / "afile").write_text("keep me")
    one_line_error(pretrain(workspace, out="afile"), "afile", "--output_dir")
    assert (workspace / "afile").read_text() == "keep me"
    command_flags = flags(workspace)
    command_flags[command_flags.index("--json-summary") + 1] = str(workspace)
    result = run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *command_flags])
    one_line_error(result, "--json-summary", "is a folder")
    assert not (workspace / "out").exists()


@pytest.mark.slow
def test_refused_resume_with_another_config_names_the_changed_keys(workspace):
    assert pretrain(workspace, "--max_steps", 4, "--steps_this_run", 2).returncode == 0
    before = checkpoint_names(workspace / "out")
    (workspace / "bert_config.json").write_text(json.dumps({**CONFIG, "intermediate_size": 96}))
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint"), "ckpt_2.pt",
                   "intermediate_size 64 -> 96")
    assert checkpoint_names(workspace / "out") == before


@pytest.mark.slow
def test_resume_keeps_the_streams_lanes_and_refuses_others(workspace):
    assert pretrain(workspace, "--max_steps", 4, "--steps_this_run", 2, "--data_lanes", 2).returncode == 0
    assert torch.load(workspace / "out" / "ckpt_2.pt", weights_only=True)["data"]["lanes"] == 2
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint", "--data_lanes", 4),
                   "ckpt_2.pt", "2 lanes")
    assert pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint").returncode == 0


@pytest.mark.slow
def test_resume_from_a_weights_only_checkpoint_points_to_init_checkpoint(workspace):
    out = workspace / "out"
    out.mkdir()
    from bertrecipe.model.bert import BertConfig, BertForPreTraining
    model = BertForPreTraining(BertConfig.from_dict(CONFIG))
    torch.save({"model": model.state_dict(), "config": CONFIG}, out / "ckpt_3.pt")
    one_line_error(pretrain(workspace, "--resume_from_checkpoint"), "ckpt_3.pt", "--init_checkpoint")
    assert checkpoint_names(out) == ["ckpt_3.pt"] and not (out / "log.json").exists()


# --- A full disk (item 7) ----------------------------------------------------------------------------------------
def test_disk_full_while_saving_keeps_the_previous_checkpoint_and_says_so(workspace, monkeypatch, capsys):
    real_save = torch.save
    calls = []

    def save_until_the_disk_fills(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) < 2:
            return real_save(obj, f, *args, **kwargs)
        f.write(b"x" * 1000)  # part of it made it to disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_until_the_disk_fills)
    with pytest.raises(InputError, match="ckpt_4.pt: cannot write the checkpoint .No space left on device.") as error:
        run_pretraining.main(flags(workspace, "--num_steps_per_checkpoint", 2, "--max_steps", 6))
    out = workspace / "out"
    assert str(error.value).endswith(f"nothing of it is left; the newest good checkpoint is {out / 'ckpt_2.pt'}: "
                                     "resume from it with --resume_from_checkpoint")
    assert sorted(p.name for p in out.iterdir() if p.name != "tensorboard") == ["ckpt_2.pt", "log.json"]
    assert torch.load(out / "ckpt_2.pt", weights_only=True)["phase_step"] == 2


def test_disk_full_at_the_first_checkpoint_says_there_is_none_and_nothing_else(workspace, monkeypatch):
    """The line said "the earlier checkpoints ... are intact; no checkpoint ... yet" (issue 48)."""
    def disk_full(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(InputError) as error:
        run_pretraining.main(flags(workspace, "--num_steps_per_checkpoint", 2, "--max_steps", 6))
    out = workspace / "out"
    assert str(error.value) == (f"{out / 'ckpt_2.pt'}: cannot write the checkpoint (No space left on device); nothing "
                                f"of it is left; no checkpoint in {out} yet")


# --- Non-finite training (item 8) ---------------------------------------------------------------------------------
def nan_losses_from_the_third_step(monkeypatch) -> None:
    """The pre-training criterion, patched to return NaN from its third call on."""
    real_loss = BertPretrainingCriterion.__call__
    steps = []

    def loss_nan_from_the_third_step(criterion, model, batch):
        steps.append(1)
        loss = real_loss(criterion, model, batch)
        return loss * float("nan") if len(steps) >= 3 else loss

    monkeypatch.setattr(BertPretrainingCriterion, "__call__", loss_nan_from_the_third_step)


@pytest.mark.parametrize("precision", [[], ["--bf16"]])
def test_nan_loss_is_skipped_with_a_warning_then_stops_naming_the_step(workspace, monkeypatch, capsys, precision):
    nan_losses_from_the_third_step(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        run_pretraining.main(flags(workspace, "--num_steps_per_checkpoint", 1, "--max_steps", 30, *precision))
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "warning: step 3: the loss or gradients are not finite; step skipped (1 in a row" in err
    assert "error: step 12: the loss was not finite for 10 steps in a row" in err
    assert "the newest good checkpoint is" in err and "ckpt_2.pt" in err
    for path in (workspace / "out").glob("ckpt_*.pt"):
        state = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


def test_weights_that_become_infinite_are_never_checkpointed(workspace, monkeypatch, capsys):
    real_build = startup.build_lamb

    def optimizer_that_overflows_a_weight(*args, **kwargs):
        optimizer = real_build(*args, **kwargs)
        real_step = optimizer.step

        def step(*step_args, **step_kwargs):  # finite gradients, but an update fp32 cannot hold
            result = real_step(*step_args, **step_kwargs)
            with torch.no_grad():
                optimizer.param_groups[0]["params"][0].view(-1)[0] = float("inf")
            return result

        optimizer.step = step
        return optimizer

    monkeypatch.setattr(startup, "build_lamb", optimizer_that_overflows_a_weight)
    with pytest.raises(SystemExit) as stop:
        run_pretraining.main(flags(workspace, "--num_steps_per_checkpoint", 1))
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "error: step 1: the weights are no longer finite numbers; no checkpoint written" in err
    assert not list((workspace / "out").glob("ckpt_*.pt"))


# --- Messages of unreadable checkpoints (item 9) ----------------------------------------------------------------
class Marker:
    def __reduce__(self):
        return (print, ("unpickled!",))


@pytest.mark.parametrize("content, expected", [
    ("text", "not a torch checkpoint"),
    ("pickle", "never unpickles"),
    ("truncated", "truncated or damaged"),
])
@pytest.mark.slow
def test_unreadable_init_checkpoint_is_one_true_line(workspace, content, expected):
    path = workspace / "weights.pt"
    if content == "text":
        path.write_text("hello world\n" * 20)
    elif content == "pickle":
        torch.save({"model": {"x": torch.zeros(1)}, "extra": Marker()}, path)
    else:
        torch.save({"model": {"x": torch.zeros(1000)}}, path)
        path.write_bytes(path.read_bytes()[:-300])
    line = one_line_error(pretrain(workspace, "--init_checkpoint", path), "weights.pt", expected)
    assert "(101)" not in line and "weights_only" not in line and "unpickled!" not in line
    assert not (workspace / "out").exists()


@pytest.mark.parametrize("script", ["run_pretraining.py", "run_squad.py", "run_glue.py", "inference.py",
                                    "evaluate_squad.py", "scripts/convert_checkpoint.py", "triton/client.py"])
@pytest.mark.slow
def test_an_unknown_flag_is_one_line_naming_the_program(script):
    result = subprocess.run([sys.executable, str(REPO_ROOT / script), "--no_such_flag"], env=ENV,
                            capture_output=True, text=True, timeout=120)
    line = one_line_error(result, Path(script).name, "see --help")
    assert "usage:" not in line


@pytest.mark.slow
def test_skipped_steps_counter_goes_on_after_a_resume(workspace):
    from bertrecipe.training.metric_logger import read_log
    # fp16 from a loss scale of 2^30 overflows the first steps; the count must survive the resume.
    common = ["--fp16", "--init_loss_scale", 2.0**30, "--max_steps", 8]
    assert pretrain(workspace, *common, "--steps_this_run", 4).returncode == 0
    skipped = torch.load(workspace / "out" / "ckpt_4.pt", weights_only=True)["skipped_steps"]
    assert skipped >= 1
    assert pretrain(workspace, *common, "--resume_from_checkpoint").returncode == 0
    records = [r["data"] for r in read_log(workspace / "out" / "log.json")
               if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"] and "skipped_steps" in r["data"]]
    assert records[-1]["skipped_steps"] >= skipped


# --- Round two (issue 32): one run per folder, phases, resumes that are never silent, outputs never inputs ------
def phase2(ws, *extra):
    return pretrain(ws, "--resume_from_checkpoint", "--phase2", *extra)


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("ckpt_")}


def test_a_second_run_on_a_locked_output_dir_is_refused_then_a_dead_holders_lock_is_taken_over(workspace):
    from helpers import start_holder

    holder, said = start_holder(workspace / "out")
    assert said == "held"
    try:
        one_line_error(pretrain(workspace, "--max_steps", 2), "another run is using this --output_dir",
                       f"process {holder.pid}")
        assert sorted(p.name for p in (workspace / "out").iterdir()) == [".run.lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait(timeout=30)
    result = pretrain(workspace, "--max_steps", 2)
    assert result.returncode == 0, result.stderr
    assert "took over the lock of host" in result.stderr and f"process {holder.pid}" in result.stderr
    assert checkpoint_names(workspace / "out") == ["ckpt_2.pt"]
    assert not (workspace / "out" / ".run.lock").exists()  # released at exit


@pytest.mark.slow
def test_resume_training_after_a_preempted_phase_2_resumes_phase_2_and_keeps_phase_1(workspace):
    """run_pretraining.sh resume_training=true runs phase 1 again first: it must find phase 1 finished, write
    nothing, and let phase 2 go on from its own newest checkpoint."""
    out = workspace / "out"
    assert pretrain(workspace, "--max_steps", 4, "--num_steps_per_checkpoint", 2).returncode == 0
    result = phase2(workspace, "--max_steps", 4, "--phase1_end_step", 4, "--num_steps_per_checkpoint", 1,
                    "--steps_this_run", 2)
    assert result.returncode == 0, result.stderr
    before = snapshot(out)
    assert sorted(before) == ["ckpt_2.pt", "ckpt_4.pt", "ckpt_5.pt", "ckpt_6.pt"]
    result = pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint")
    assert result.returncode == 0, result.stderr
    assert "ckpt_4.pt: phase 1 is at step 4 of --max_steps 4: nothing left to train" in result.stderr
    assert snapshot(out) == before
    result = phase2(workspace, "--max_steps", 4, "--phase1_end_step", 4, "--num_steps_per_checkpoint", 1)
    assert result.returncode == 0, result.stderr
    resumed = [r["data"]["resumed_from"] for r in read_log(out / "log.json")
               if r.get("step") == "PARAMETER" and "resumed_from" in r["data"]]
    assert resumed[-1].endswith("ckpt_6.pt")
    after = snapshot(out)
    assert {name: after[name] for name in ("ckpt_2.pt", "ckpt_4.pt")} == {name: before[name] for name in
                                                                           ("ckpt_2.pt", "ckpt_4.pt")}
    assert torch.load(out / "ckpt_8.pt", weights_only=True)["phase_step"] == 4


@pytest.mark.slow
def test_phase_1_never_goes_on_under_phase_2_checkpoints(workspace):
    assert pretrain(workspace, "--max_steps", 4, "--steps_this_run", 2).returncode == 0
    assert phase2(workspace, "--max_steps", 2, "--phase1_end_step", 2).returncode == 0  # accepted explicitly
    before = snapshot(workspace / "out")
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint"), "phase 2 has begun here",
                   "phase 1 stopped at step 2 of --max_steps 4")
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint", "--resume_step", 4),
                   "ckpt_4.pt: is a phase-2 checkpoint")
    assert snapshot(workspace / "out") == before


@pytest.mark.slow
def test_phase_settings_that_contradict_the_checkpoints_are_one_line_before_any_write(workspace):
    """run.sub with TRAIN_STEPS changed and PHASE1_END_STEP not: phase 2 would number its steps from 2 and write
    ckpt_3..ckpt_6 over phase 1's ckpt_4, the one it starts from."""
    out = workspace / "out"
    assert pretrain(workspace, "--max_steps", 4, "--num_steps_per_checkpoint", 2).returncode == 0
    before = snapshot(out)
    one_line_error(phase2(workspace, "--max_steps", 4, "--phase1_end_step", 2), "ckpt_4.pt",
                   "phase 1 ended at step 4, not --phase1_end_step 2", "--phase1_end_step 4")
    assert phase2(workspace, "--max_steps", 4, "--phase1_end_step", 4, "--steps_this_run", 1).returncode == 0
    one_line_error(phase2(workspace, "--max_steps", 4, "--phase1_end_step", 3), "ckpt_5.pt",
                   "after phase 1's step 4, not --phase1_end_step 3")
    # A run set back to an older checkpoint would write over a newer one: refused.
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint", "--resume_step", 2),
                   "ckpt_4.pt: (phase 1) lies in the steps this run would checkpoint (3-4)")
    assert {name: data for name, data in snapshot(out).items() if name in before} == before


@pytest.mark.slow
def test_a_resume_applies_a_new_learning_rate_and_says_so(workspace):
    out = workspace / "out"
    assert pretrain(workspace, "--max_steps", 4, "--steps_this_run", 2).returncode == 0
    result = pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint", "--learning_rate", "2e-3")
    assert result.returncode == 0, result.stderr
    assert "resume: --learning_rate 0.001 -> 0.002 (the schedule goes on" in result.stderr
    records = {tuple(r["step"]): r["data"] for r in read_log(out / "log.json") if r.get("step")
               and isinstance(r["step"], list)}
    # Step 3 of 4 on the poly schedule (degree 0.5) with the new peak; the old one would give half of it.
    assert records[(0, 3)]["learning_rate"] == pytest.approx(2e-3 * (1 - 3 / 4) ** 0.5)
    assert torch.load(out / "ckpt_4.pt", weights_only=True)["args"]["learning_rate"] == 2e-3


def test_resume_lines_name_only_what_the_user_changed_and_never_say_refused(workspace, capsys):
    """An applied change is never printed with '(... refused)' inside; --warmup_proportion, derived from
    --warmup_tokens, is not named by a run that never passed it."""
    run_pretraining.main(flags(workspace, "--max_steps", 4, "--steps_this_run", 2, "--max_tokens", 10000,
                               "--warmup_tokens", 1000))
    capsys.readouterr()
    run_pretraining.main(flags(workspace, "--max_steps", 8, "--steps_this_run", 1, "--resume_from_checkpoint",
                               "--max_tokens", 20000, "--warmup_tokens", 1000))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("resume: ")]
    # still in the token warm-up, where the rate is tokens / warm-up tokens: no rate line, it has not changed
    assert lines == ["resume: --max_steps 4 -> 8 (the decay now ends at the new step)",
                     "resume: --max_tokens 10000 -> 20000 (the schedule goes on from the checkpoint's token count "
                     "with the new budget)"]


def test_a_longer_wsd_run_says_what_the_learning_rate_is_now(workspace, capsys):
    """A WSD run resumed with a larger --max_steps said that the decay now ends later, not that the rate, decayed
    to 2e-19, is back at its peak (issue 48)."""
    wsd = ("--lr_schedule", "wsd", "--decay_proportion", 0.5, "--warmup_proportion", 0)
    run_pretraining.main(flags(workspace, "--max_steps", 4, *wsd))
    capsys.readouterr()
    run_pretraining.main(flags(workspace, "--max_steps", 12, "--steps_this_run", 1, "--resume_from_checkpoint", *wsd))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("resume: ")]
    # step 4 of 4 ended the decay at 0; of 12, it lies in the stable part (the decay takes steps 6 to 12)
    assert lines == ["resume: --max_steps 4 -> 12 (the decay now ends at the new step)",
                     "resume: the learning rate at step 4 goes from 0 to 0.001 under the new schedule"]


@pytest.mark.slow
def test_a_resume_refuses_another_seed_other_shards_and_another_global_batch_naming_old_and_new(workspace):
    assert pretrain(workspace, "--max_steps", 4, "--steps_this_run", 2).returncode == 0
    before = snapshot(workspace / "out")
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint", "--seed", 7),
                   "ckpt_2.pt", "--seed 42, this run has 7")
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint", "--train_batch_size", 8),
                   "ckpt_2.pt", "global batch of 4 sequences, this run has 8")
    write_shard(workspace / "data" / "tiny_training_2.hdf5", shard_arrays(seed=2))
    one_line_error(pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint"), "ckpt_2.pt",
                   "other shards", "tiny_training_2.hdf5")
    assert snapshot(workspace / "out") == before


@pytest.mark.slow
def test_max_steps_behind_the_checkpoint_is_refused_and_nothing_left_is_a_line_not_nan(workspace):
    out = workspace / "out"
    assert pretrain(workspace, "--max_steps", 4).returncode == 0
    one_line_error(pretrain(workspace, "--max_steps", 2, "--resume_from_checkpoint"),
                   "ckpt_4.pt: is at step 4 of this phase, beyond --max_steps 2")
    result = pretrain(workspace, "--max_steps", 4, "--resume_from_checkpoint")
    assert result.returncode == 0, result.stderr
    assert "nothing left to train" in result.stderr
    summary = read_log(out / "log.json")[-1]
    assert summary["step"] == [] and "final_loss" not in summary["data"]
    assert "nan" not in result.stdout.lower()


def test_json_summary_or_output_dir_naming_an_input_is_refused_before_any_write(workspace):
    config = workspace / "bert_config.json"
    original = config.read_bytes()
    command_flags = flags(workspace)
    command_flags[command_flags.index("--json-summary") + 1] = str(config)
    result = run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *command_flags])
    one_line_error(result, "--json-summary is the same file as --config_file")
    assert config.read_bytes() == original and not (workspace / "out").exists()
    one_line_error(pretrain(workspace, out="data"), "--output_dir is the same folder as --input_dir")


@pytest.mark.slow
def test_ctrl_c_exits_130_naming_the_checkpoint_to_resume_from(workspace):
    command = [sys.executable, str(REPO_ROOT / "run_pretraining.py"),
               *flags(workspace, "--max_steps", 100000, "--num_steps_per_checkpoint", 1)]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (workspace / "out" / "ckpt_2.pt").exists() and time.time() < deadline:
            assert process.poll() is None
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    last = stderr.strip().splitlines()[-1]
    newest = checkpoint_names(workspace / "out")[-1]
    assert last == (f"interrupted (Ctrl-C): the newest good checkpoint is {workspace / 'out' / newest}: resume from it "
                    "with --resume_from_checkpoint")
    assert not (workspace / "out" / ".run.lock").exists()


SLOW_SAVES = """
import sys, time
import torch
from bertrecipe.cli.entry import run_pretraining

real_save = torch.save


class SlowFile:
    # Each of torch's writes takes a while, as a large checkpoint's do: the signal lands inside the zip writer.
    def __init__(self, file):
        self.file = file

    def write(self, data):
        time.sleep(0.005)
        return self.file.write(data)

    def flush(self):
        self.file.flush()


torch.save = lambda obj, file, **kw: real_save(obj, SlowFile(file), **kw)
sys.argv[0] = "run_pretraining.py"
run_pretraining()
"""


def size_or_0(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_ctrl_c_inside_a_checkpoint_write_is_the_interrupted_line_and_leaves_no_temporary(workspace):
    """torch's zip writer turned the KeyboardInterrupt into `RuntimeError: [enforce fail at inline_container.cc]`
    and 50 lines (issue 48); the one line names the checkpoint before, which loads."""
    out = workspace / "out"
    command = [sys.executable, "-c", SLOW_SAVES, *flags(workspace, "--max_steps", 100, "--num_steps_per_checkpoint", 1)]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               cwd=REPO_ROOT)
    try:
        deadline = time.time() + 120
        # the second checkpoint's temporary holds bytes: torch's zip writer is under way
        while not [tmp for tmp in out.glob(".ckpt_2.pt.*.tmp") if size_or_0(tmp) > 0]:
            assert process.poll() is None and time.time() < deadline, process.communicate()
            time.sleep(0.005)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1:] == [f"interrupted (Ctrl-C): the newest good checkpoint is "
                                                f"{out / 'ckpt_1.pt'}: resume from it with --resume_from_checkpoint"]
    assert "Traceback" not in stderr and "RuntimeError" not in stderr, stderr
    assert checkpoint_names(out) == ["ckpt_1.pt"] and not list(out.glob(".*.tmp"))
    assert run_pretraining.checkpointing.load_checkpoint(out / "ckpt_1.pt")["global_step"] == 1


class FailingFile:
    """A file whose third write raises `failure`, as a signal or a full disk would in the middle of torch.save."""

    def __init__(self, failure):
        self.failure, self.writes = failure, 0

    def write(self, data):
        self.writes += 1
        if self.writes == 3:
            raise self.failure
        return len(data)

    def flush(self):
        pass


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), Terminated(), OSError(errno.ENOSPC, "No space left")])
def test_what_interrupts_torchs_writer_is_raised_as_itself(failure):
    from bertrecipe.model.torch_files import save_torch_to

    with pytest.raises(type(failure)) as raised:
        save_torch_to({"weights": torch.zeros(100_000), "more": torch.ones(1000)}, FailingFile(failure))
    assert raised.value is failure


@pytest.mark.slow
def test_a_reader_of_the_output_that_leaves_is_a_quiet_141(workspace):
    """`run_pretraining.py ... | head -1` ended with exit 2 and `error: <output_dir>: Broken pipe` (issue 48)."""
    env = {key: value for key, value in ENV.items() if key != "PYTHONUNBUFFERED"}
    command = [sys.executable, str(REPO_ROOT / "run_pretraining.py"), *flags(workspace, "--max_steps", 1000)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline()
        process.stdout.close()  # as `| head -1` does
        stderr = process.stderr.read()
        process.wait(timeout=120)
    finally:
        process.kill()
    assert (process.returncode, stderr) == (128 + signal.SIGPIPE, "")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_shard_rewritten_while_the_run_goes_on_is_refused_at_its_next_opening(workspace, monkeypatch, workers):
    """A shard is checked once, at start-up, and read for the whole run: one rewritten in between (another
    create_pretraining_data writing into the folder) was read as if it were the one checked (issue 48)."""
    from bertrecipe.pretraining import session

    real_inspect = session.inspect_shard
    rewritten = workspace / "data" / "tiny_training_1.hdf5"

    def inspect_then_rewrite(path, *args, **kwargs):
        info = real_inspect(path, *args, **kwargs)
        if path == rewritten:
            write_shard(path, shard_arrays(seed=5))
        return info

    monkeypatch.setattr(session, "inspect_shard", inspect_then_rewrite)
    changed = rf"^{rewritten}: shard changed while this command ran \(modified\); run the command again once nothing"
    with pytest.raises(InputError, match=changed + " writes to it; (the newest good checkpoint is|no checkpoint in) "):
        # a loader worker's error reaches the run as the worker raised it (torch would make it a RuntimeError)
        run_pretraining.main(flags(workspace, "--max_steps", 40, "--num_steps_per_checkpoint", 1, "--num_workers",
                                   workers))


def test_the_docs_table_of_resume_rules_is_the_codes():
    from bertrecipe.pretraining.resume_rules import docs_table

    assert docs_table() in (REPO_ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")


def test_an_output_dir_that_cannot_be_written_is_one_line_before_any_work(workspace, monkeypatch):
    """A read-only or foreign folder (os.access is asked, since root, which runs CI, ignores permission bits)."""
    real_access = os.access
    read_only = workspace / "ro"
    read_only.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != read_only and real_access(path, mode))
    with pytest.raises(InputError,
                       match=r"ro/run: --output_dir cannot be created: .*ro is not writable \(Permission denied\)"):
        run_pretraining.main(flags(workspace, out="ro/run"))
    assert list(read_only.iterdir()) == []


def test_a_dynamic_masking_vocab_far_smaller_than_the_model_is_one_line_unless_allowed(workspace):
    vocab = workspace / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(35))]) + "\n")
    masking = ("--dynamic_masking", "--vocab_file", vocab, "--max_steps", 1)
    one_line_error(pretrain(workspace, *masking), str(vocab), "--allow_vocab_mismatch")
    assert not (workspace / "out").exists()
    result = pretrain(workspace, *masking, "--allow_vocab_mismatch")
    assert result.returncode == 0 and f"warning: {vocab}" in result.stderr, result.stderr


# --- The modern family (docs/modern-encoders.md) under the same rules -------------------------------------------
MODERN_CONFIG = {"model_type": "modernbert", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 64,
                 "local_attention": 8, "pad_token_id": 0}


def test_modern_family_nan_losses_are_skipped_then_stop_and_a_full_disk_keeps_the_checkpoint(workspace, monkeypatch,
                                                                                            capsys):
    (workspace / "bert_config.json").write_text(json.dumps(MODERN_CONFIG))
    real_loss = BertPretrainingCriterion.__call__
    nan_losses_from_the_third_step(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        run_pretraining.main(flags(workspace, "--num_steps_per_checkpoint", 1, "--max_steps", 30, "--optimizer",
                                   "adamw"))
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "error: step 12: the loss was not finite for 10 steps in a row" in err and "ckpt_2.pt" in err
    monkeypatch.setattr(BertPretrainingCriterion, "__call__", real_loss)
    real_save = torch.save

    def disk_full_after_one(obj, f, *args, **kwargs):
        if (workspace / "again" / "ckpt_2.pt").exists():
            f.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_after_one)
    with pytest.raises(InputError, match="ckpt_4.pt: cannot write the checkpoint .No space left on device."):
        run_pretraining.main(flags(workspace, "--num_steps_per_checkpoint", 2, "--max_steps", 6, out="again"))
    assert torch.load(workspace / "again" / "ckpt_2.pt", weights_only=True)["config"]["model_type"] == "modernbert"
    assert not list((workspace / "again").glob("ckpt_4*"))


@contextmanager
def small_tmpfs(folder: Path, size_bytes: int) -> Iterator[Path]:
    """A real tmpfs of about size_bytes mounted at folder, for a disk that fills (needs root: skipped elsewhere)."""
    folder.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(folder)],
                           capture_output=True, text=True)
    if mount.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mount.stderr.strip()}): needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_a_real_full_disk_while_saving_is_one_line_naming_the_newest_good_checkpoint(workspace, family):
    """torch's zip writer turns the OSError of a full disk into its own RuntimeError (47 lines of its internals);
    the run says one line naming the file and the checkpoint to resume from, on a real tmpfs that fills."""
    if family == "modern":
        (workspace / "bert_config.json").write_text(json.dumps(MODERN_CONFIG))
    assert pretrain(workspace, "--max_steps", 2, out="sizing").returncode == 0
    size = (workspace / "sizing" / "ckpt_2.pt").stat().st_size
    with small_tmpfs(workspace / "disk", size + size // 2) as disk:  # room for one checkpoint, not two
        command = flags(workspace, "--num_steps_per_checkpoint", 2, "--max_steps", 6, out="disk/out")
        command[command.index("--json-summary") + 1] = str(workspace / "log.json")
        result = run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *command])
        first = disk / "out" / "ckpt_2.pt"
        line = one_line_error(result, f"{disk / 'out' / 'ckpt_4.pt'}: cannot write the checkpoint (No space left on "
                                      f"device)", f"the newest good checkpoint is {first}: resume from it")
        assert "RuntimeError" not in line and "inline_container" not in result.stderr
        assert sorted(p.name for p in (disk / "out").iterdir() if p.name != "tensorboard") == ["ckpt_2.pt"]
        assert torch.load(first, weights_only=True)["phase_step"] == 2


@pytest.mark.slow
def test_two_runs_into_one_json_summary_are_one_run_and_one_refusal(workspace):
    """Runs with different --output_dir appended every step to a --json-summary they shared; the log is now
    locked as the output folder is."""
    shared = workspace / "logs" / "shared.json"
    command = flags(workspace, "--max_steps", 100000, "--skip_checkpoint", out="a")
    command[command.index("--json-summary") + 1] = str(shared)
    first = subprocess.Popen([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *command], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not shared.is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the first record: the run holds both locks by now
        assert shared.is_file(), first.stderr.read() if first.poll() is not None else "no log after 120 s"
        second = flags(workspace, "--max_steps", 2, out="b")
        second[second.index("--json-summary") + 1] = str(shared)
        with pytest.raises(InputError, match=rf"^{shared}: another run is using this --json-summary \(host .*process "
                                             rf"{first.pid}.*lock {shared.parent / '.shared.json.lock'}\)"):
            run_pretraining.main(second)
        assert not (workspace / "b").exists()
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert not (shared.parent / ".shared.json.lock").exists()  # released with the run


@pytest.mark.slow
def test_a_write_failure_of_the_first_process_is_one_line_from_each_process_of_two(workspace):
    """The first process cannot write its log (a full device): it says so; the second, whose next collective finds
    its peer gone, says that in one line instead of gloo's traceback."""
    command = flags(workspace, "--max_steps", 4)
    command[command.index("--json-summary") + 1] = "/dev/full"
    result = subprocess.run([sys.executable, "-m", "bertrecipe.cli.launch", "--nproc_per_node=2",
                             str(REPO_ROOT / "run_pretraining.py"), *command], env=ENV, capture_output=True,
                            text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode in (1, 2), result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and "Connection closed" not in result.stderr, result.stderr
    assert any(line.startswith("error: /dev/full: cannot write the JSON log (No space left on device)")
               for line in lines), result.stderr
    assert any(line.startswith("error: process 1: another process of this run stopped") for line in lines), lines
    # torch's elastic agent may add its own warning that it ended the other worker.
    assert all(line.startswith(("error: ", "stopped by SIGTERM")) or "closing signal" in line for line in lines), \
        result.stderr


def test_without_json_summary_the_log_goes_into_the_output_dir(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    command = flags(workspace, "--max_steps", 1)
    at = command.index("--json-summary")
    del command[at:at + 2]
    run_pretraining.main(command)
    assert read_log(workspace / "out" / "dllogger.json")[-1]["data"]["global_step"] == 1
    assert not (workspace / "results").exists()


def test_deterministic_runs_train_under_torch_deterministic_mode_and_repeat_to_the_last_bit(workspace):
    """--deterministic: every op of the training path has a deterministic kernel here (a missing one raises in
    that mode), cuBLAS's workspace setting is in the environment, and two runs end with equal weights."""
    ends = []
    for out in ("a", "b"):
        result = pretrain(workspace, "--deterministic", "--max_steps", 3, "--bf16", out=out)
        assert result.returncode == 0, result.stderr[-2000:]
        ends.append(torch.load(workspace / out / "ckpt_3.pt", weights_only=True)["model"])
    assert all(torch.equal(ends[0][k], ends[1][k]) for k in ends[0])
    before = torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        use_deterministic_algorithms(True)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before[0])
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if before[1] is not None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[1]
