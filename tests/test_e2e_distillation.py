"""distillation/run_e2e_distillation.sh: NVIDIA's SST-2 chain (teacher, masked LM for the augmentation, augmented
set, backbone and heads stages) through the repository's own commands, ending in OUT/summary.json."""
import json
import os
import subprocess
import sys

import pytest

from helpers import ENV, REPO_ROOT

SCRIPT = REPO_ROOT / "distillation" / "run_e2e_distillation.sh"
TINY = {"E2E_TRAIN_ROWS": "48", "E2E_AUG_N": "1", "E2E_MLM_STEPS": "2", "E2E_SEQ": "32"}


def run_script(*args, env=None):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], env={**ENV, "PYTHON": sys.executable, **(env or {})},
                          capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("args, env, expected", [
    ((), {}, "usage: bash distillation/run_e2e_distillation.sh cpu OUT"),
    (("gpu", "OUT"), {}, "usage: bash distillation/run_e2e_distillation.sh cpu OUT"),
    (("cpu", "OUT"), {"BERT_SHARED_DATA": "/nonexistent"}, "/nonexistent/minilm/model.safetensors: not found"),
    (("cpu", "OUT"), {"E2E_TRAIN_ROWS": "ten"}, "the E2E_* sizes are whole numbers >= 1, got 'ten'"),
])
def test_a_call_it_cannot_run_is_one_line_and_creates_nothing(tmp_path, args, env, expected, shared_data):
    args = tuple(str(tmp_path / arg) if arg == "OUT" else arg for arg in args)
    done = run_script(*args, env={"BERT_SHARED_DATA": str(shared_data), **env})
    assert done.returncode == 2 and done.stderr.splitlines() == [f"error: {done.stderr.split('error: ')[1].strip()}"]
    assert expected in done.stderr and not (tmp_path / "OUT").exists()


@pytest.mark.slow
def test_the_sst2_chain_ends_in_a_summary_and_a_second_call_reuses_its_stages(tmp_path, shared_data):
    out = tmp_path / "out"
    env = {"BERT_SHARED_DATA": str(shared_data), **TINY}
    done = run_script("cpu", out, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sst2_train_rows_used"] == 48 and summary["dev_examples"] == 872
    assert summary["student_layers"] == 3 and summary["teacher_layers"] == 6
    for model in ("teacher", "student"):
        assert 0 < summary[f"{model}_dev_accuracy"] <= 1 and os.path.isfile(summary[f"{model}_checkpoint"])
    assert summary["augmented_train_examples"] > 48  # the originals and their copies
    assert set(summary["seconds_per_stage"]) == {"data", "teacher", "masked_lm", "augmentation", "backbone", "heads"}
    student = summary["student_checkpoint"]
    stamp = os.stat(student).st_mtime_ns
    again = run_script("cpu", out, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert os.stat(student).st_mtime_ns == stamp and "reused" in again.stdout + again.stderr
