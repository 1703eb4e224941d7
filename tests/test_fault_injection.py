"""A 2-process pre-training run killed at random moments (SIGKILL, SIGTERM, SIGINT; during startup, steps and
checkpoint writes) and restarted until it ends has the uninterrupted run's final checkpoint, bit for bit
(benchmarks/fault_injection.py, issue 32 item 8). FAULT_INJECTION_SEED=<n> replays another schedule."""
import math
import os
import random

import pytest
import torch

from benchmarks import fault_injection as fi

SEED = int(os.environ.get("FAULT_INJECTION_SEED", "0"))


def test_checkpoint_comparison_sees_one_ulp_and_ignores_only_the_clock_and_the_paths():
    weights = torch.randn(4, 3)
    a = {"model": {"w": weights}, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}}, "train_seconds": 1.0,
         "args": {"output_dir": "reference", "json_summary": "reference/log.json", "seed": 42}, "phase_step": 4}
    b = {"model": {"w": weights.clone()}, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}},
         "train_seconds": 7.5, "args": {"output_dir": "faulted", "json_summary": "faulted/log.json", "seed": 42},
         "phase_step": 4}
    assert fi.differences(a, b) == []
    nudged = weights.clone()
    nudged[2, 1] = torch.nextafter(nudged[2, 1], torch.tensor(math.inf))  # one float32 ulp
    assert not torch.equal(nudged, weights)
    assert fi.differences(a, {**b, "model": {"w": nudged}}) == ["model.w"]
    assert fi.differences(a, {**b, "model": {"w": weights.double()}}) == ["model.w"]  # the dtype counts
    assert fi.differences(a, {**b, "args": {**b["args"], "seed": 43}}) == ["args.seed"]
    assert fi.differences(a, {**b, "phase_step": 5}) == ["phase_step"]
    assert fi.differences(a, {key: value for key, value in b.items() if key != "optimizer"}) == ["optimizer"]


def test_the_schedule_is_replayable_and_spreads_its_steps_over_the_run():
    settings = fi.Settings(max_steps=40)
    first = fi.plan(random.Random(5), 20, settings, startup_seconds=3.0, step_seconds=0.05)
    again = fi.plan(random.Random(5), 20, settings, startup_seconds=3.0, step_seconds=0.05)
    assert first == again and len(first) == 21
    steps = [fault.step for fault in first[:-1]]
    assert steps == sorted(steps) and 1 <= steps[0] <= 2 and 36 <= steps[-1] <= 38
    assert first[-1].final and first[-1].moment == "checkpoint" and first[-1].step == 40
    assert all(fault.target == "job" for fault in first if fault.signal == "SIGKILL")


@pytest.mark.slow
def test_twenty_faults_and_restarts_end_bit_for_bit_like_the_uninterrupted_run(tmp_path):
    campaign = fi.run_campaign(tmp_path, faults=20, seed=SEED)
    report = fi.table(campaign)
    print(report)
    summary = fi.summary(campaign)
    assert summary["faults"] >= 20, report
    if SEED == 0:  # what the pinned schedule covers (another seed's may miss a case, by chance)
        assert set(summary["by_signal"]) == {"SIGKILL", "SIGTERM", "SIGINT"}, report
        assert set(summary["by_target"]) == {"job", "launcher"}, report
        assert summary["in_checkpoint_write"] >= 5 and summary["half_written_left_by_sigkill"] >= 1, report
        assert summary["landed"].get("before the first step", 0) >= 1, report
    assert summary["problems"] == [], report
    assert "ckpt_40.pt" in campaign.compared and campaign.differences == [], report
    assert campaign.record_mismatches == [] and campaign.bit_exact, report
