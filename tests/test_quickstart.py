"""scripts/quickstart.sh in its reduced mode: every stage runs end to end and its outputs are sane."""
import json
import os
import subprocess

import pytest
import torch

from bertrecipe.training.metric_logger import read_log
from conftest import REPO_ROOT


@pytest.mark.slow
def test_quickstart_runs_every_stage_and_reuses_its_work_on_a_second_run(tmp_path):
    env = {**os.environ, "QUICKSTART_STEPS": "40", "BERT_PREP_WORKING_DIR": str(tmp_path / "data"),
           "OMP_NUM_THREADS": "2"}
    out = tmp_path / "out"
    command = ["bash", str(REPO_ROOT / "scripts" / "quickstart.sh"), "--output_dir", str(out)]
    first = subprocess.run(command, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for phase in ("phase1", "phase2"):
        assert 0.0 <= summary[phase]["eval_mlm_accuracy"] <= 1.0 and summary[phase]["eval_loss"] > 0
    steps = [r["data"]["average_loss"] for r in read_log(out / "dllogger_phase1.json")
             if r.get("type") == "LOG" and isinstance(r.get("step"), list) and r["step"]
             and "average_loss" in r["data"]]
    assert steps[-1] < steps[0] - 0.5  # the loss falls
    checkpoint = torch.load(out / "checkpoints" / "ckpt_44.pt", weights_only=True)
    assert checkpoint["phase2"] and checkpoint["phase_step"] == 4
    png = (out / "loss_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert len(summary["fill_mask"]) >= 3 and all(len(x["top5"]) == 5 for x in summary["fill_mask"])
    assert "Quick start finished" in first.stdout

    second = subprocess.run(command, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "phase 1: already complete" in second.stdout and "phase 2: already complete" in second.stdout
    assert "0 of 3 shards already complete" not in second.stdout


@pytest.mark.slow
def test_quickstart_trains_the_modern_family_with_one_flag(tmp_path):
    """--family modern: a ModernBERT config, the modern training options, and phase 2 as a context extension."""
    env = {**os.environ, "QUICKSTART_STEPS": "40", "BERT_PREP_WORKING_DIR": str(tmp_path / "data"),
           "OMP_NUM_THREADS": "2"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "quickstart.sh"), "--output_dir", str(out),
                           "--family", "modern"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checkpoint = torch.load(out / "checkpoints" / "ckpt_44.pt", weights_only=True)
    assert checkpoint["config"]["model_type"] == "modernbert"
    assert checkpoint["config"]["max_position_embeddings"] == 512
    assert checkpoint["config"]["rope_parameters"]["full_attention"]["rope_theta"] == 160_000.0
    assert checkpoint["args"]["optimizer"] == "stable_adamw" and checkpoint["args"]["pack_sequences"]
    steps = [r["data"]["average_loss"] for r in read_log(out / "dllogger_phase1.json")
             if r.get("type") == "LOG" and isinstance(r.get("step"), list) and r["step"]
             and "average_loss" in r["data"]]
    assert steps[-1] < steps[0] - 0.5
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["phase2"]["eval_mlm_accuracy"] <= 1.0
