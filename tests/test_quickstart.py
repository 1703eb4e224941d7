"""scripts/quickstart.sh in its reduced mode: every stage runs end to end and its outputs are sane."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bertrecipe.training.metric_logger import read_log
from bertrecipe.training.run_lock import RunLock
from helpers import REPO_ROOT, made_once_per_run


def quickstart(tmp_path, steps: int, *extra: str) -> tuple[dict[str, str], list[str], Path]:
    """scripts/quickstart.sh's environment (QUICKSTART_STEPS, its data under tmp_path), its command line and its
    output folder."""
    env = {**os.environ, "QUICKSTART_STEPS": str(steps), "BERT_PREP_WORKING_DIR": str(tmp_path / "data"),
           "OMP_NUM_THREADS": "1"}  # one thread: the suite runs a test per core
    out = tmp_path / "out"
    return env, ["bash", str(REPO_ROOT / "scripts" / "quickstart.sh"), "--output_dir", str(out), *extra], out


def release_gives_our_logits(out: Path, checkpoint: Path) -> None:
    """transformers' AutoModelForMaskedLM of the quick start's release, every weight found and used, gives the
    checkpoint's masked-LM logits (ours) on a sentence its AutoTokenizer encodes."""
    import transformers

    from bertrecipe.model.weights import load_weights_into, model_for_weights, read_weights

    theirs, info = transformers.AutoModelForMaskedLM.from_pretrained(out / "release", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    batch = transformers.AutoTokenizer.from_pretrained(out / "release")("the module returns a [MASK] value .",
                                                                          return_tensors="pt")
    weights = read_weights(checkpoint)
    ours = model_for_weights(weights, weights.config)
    load_weights_into(ours, weights, checkpoint)
    with torch.no_grad():
        found = theirs.eval()(**batch).logits
        expected = ours.eval()(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
    assert (found - expected.prediction_logits).abs().max() < 1e-4


def run_from_nothing(folder: Path) -> None:
    env, command, _ = quickstart(folder, 4)
    first = subprocess.run(command, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]


@pytest.fixture(scope="session")
def short_run(tmp_path_factory) -> Path:
    """A quick start of 4 steps from nothing, run once for the tests of this module whichever worker runs them:
    data/ (the default corpus, which the others copy rather than build again) and out/ (its outputs)."""
    return made_once_per_run(tmp_path_factory, "quickstart_4_steps", run_from_nothing)


def corpus_from(short_run: Path, tmp_path: Path) -> None:
    shutil.copytree(short_run / "data", tmp_path / "data", symlinks=True)


@pytest.mark.slow
def test_quickstart_runs_every_stage_and_reuses_its_work_on_a_second_run(tmp_path, short_run):
    corpus_from(short_run, tmp_path)
    env, command, out = quickstart(tmp_path, 20)
    first = subprocess.run(command, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for phase in ("phase1", "phase2"):
        assert 0.0 <= summary[phase]["eval_mlm_accuracy"] <= 1.0 and summary[phase]["eval_loss"] > 0
    steps = [r["data"]["average_loss"] for r in read_log(out / "dllogger_phase1.json")
             if r.get("type") == "LOG" and isinstance(r.get("step"), list) and r["step"]
             and "average_loss" in r["data"]]
    assert steps[-1] < steps[0] - 0.5  # the loss falls
    checkpoint = torch.load(out / "checkpoints" / "ckpt_22.pt", weights_only=True)
    assert checkpoint["phase2"] and checkpoint["phase_step"] == 2
    png = (out / "loss_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert len(summary["fill_mask"]) >= 3 and all(len(x["top5"]) == 5 for x in summary["fill_mask"])
    assert "Quick start finished" in first.stdout
    release_gives_our_logits(out, out / "checkpoints" / "ckpt_22.pt")  # the quick start's model is released
    assert json.loads((out / "release" / "release.json").read_text())["source"].endswith("ckpt_22.pt")

    second = subprocess.run(command, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "phase 1: already complete" in second.stdout and "phase 2: already complete" in second.stdout
    assert "0 of 3 shards already complete" not in second.stdout
    reused = [line for line in second.stdout.splitlines() if line.startswith("text ") and line.endswith(" reused")]
    assert len(reused) == 1 and "python_docs: " not in second.stdout  # the stdlib is not read again for the text


@pytest.mark.slow
def test_quickstart_trains_the_modern_family_with_one_flag(tmp_path, short_run):
    """--family modern: a ModernBERT config, the modern training options, and phase 2 as a context extension."""
    corpus_from(short_run, tmp_path)
    env, command, out = quickstart(tmp_path, 20, "--family", "modern")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checkpoint = torch.load(out / "checkpoints" / "ckpt_22.pt", weights_only=True)
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
    release_gives_our_logits(out, out / "checkpoints" / "ckpt_22.pt")


def files_under(folder):
    """Every file under folder with its bytes: the oracle that a refused run changed nothing."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_second_run_keeps_the_first_and_says_what_to_do_in_the_quick_starts_terms(tmp_path, short_run):
    """Issue "Nothing lost, round three", case 8: another QUICKSTART_STEPS (or --family) in the same folder is
    refused in one line phrased in the quick start's own settings, before any write (it used to delete phase 1's
    log, then advise run_pretraining.py's --phase2); a complete phase whose log is gone is reused with its figures
    and curves; a stage that fails says what to do with the quick start; a stopped phase of the same run resumes
    and appends to its log."""
    corpus_from(short_run, tmp_path)
    env, command, out = quickstart(tmp_path, 4)
    shutil.copytree(short_run / "out", out, symlinks=True)  # the first run, from nothing
    before = files_under(out)
    assert "dllogger_phase1.json" in before and "checkpoints/ckpt_6.pt" in before

    for steps, extra, advice in (("6", [], "QUICKSTART_STEPS=4"), ("4", ["--family", "modern"], "--family bert")):
        refused = subprocess.run(command + extra, env={**env, "QUICKSTART_STEPS": steps}, capture_output=True,
                                 text=True)
        assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {out}: ") and advice in lines[0], lines
        assert f"move {out} away" in lines[0]
        # run_pretraining.py's flags are no advice to someone who runs the quick start
        assert not any(flag in lines[0] for flag in ("--max_steps", "--phase2", "--phase1_end_step", "--resume"))
        assert files_under(out) == before  # the first run's logs, checkpoints and configs untouched

    figures = json.loads(before["summary.json"])["phase1"]
    (out / "dllogger_phase1.json").unlink()  # an earlier version deleted it
    again = subprocess.run(command, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "phase 1: already complete" in again.stdout and "phase 2: already complete" in again.stdout
    assert (out / "loss_curve.png").read_bytes() == before["loss_curve.png"]  # drawn from the lost log: kept
    assert json.loads((out / "summary.json").read_text())["phase1"] == figures
    assert not (out / "dllogger_phase1.json").exists()  # nothing trained again, no empty log made

    (out / "checkpoints" / "ckpt_6.pt").unlink()  # as if phase 2 had been stopped after its first step
    with RunLock(out / "checkpoints"):  # ... while another run holds its folder
        held = subprocess.run(command, env=env, capture_output=True, text=True)
    assert held.returncode == 2, held.stdout[-3000:] + held.stderr[-3000:]
    errors = [line for line in held.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "another run is using" in errors[0], held.stderr[-3000:]
    assert "QUICKSTART_STEPS=4" in errors[0] and f"move {out} away" in errors[0]
    assert "--resume_from_checkpoint" not in held.stderr and "choose another --output_dir" not in held.stderr

    resumed = subprocess.run(command, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "phase 1: already complete" in resumed.stdout
    assert (out / "dllogger_phase2.json").read_bytes().startswith(before["dllogger_phase2.json"])  # appended
    assert torch.load(out / "checkpoints" / "ckpt_6.pt", weights_only=True)["phase_step"] == 2
