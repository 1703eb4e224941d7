"""run_squad.py end to end on the real pretrained MiniLM: a few training steps on some dev-v1.1 articles, then
prediction and evaluation on others (mechanics, not accuracy: see benchmarks/finetune_accuracy.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from metric_logger import read_log

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # two cores: one thread per process avoids oversubscription
SHORT = ["--max_seq_length", "128", "--doc_stride", "64", "--max_query_length", "32", "--predict_batch_size", "32"]


def squad_subset(source: Path, target: Path, titles: list[str], paragraphs: int) -> Path:
    data = json.loads(source.read_text(encoding="utf-8"))
    chosen = [dict(a, paragraphs=a["paragraphs"][:paragraphs]) for a in data["data"] if a["title"] in titles]
    assert len(chosen) == len(titles)
    target.write_text(json.dumps({"version": data["version"], "data": chosen}), encoding="utf-8")
    return target


def squad(shared_data, out, *extra, check=True):
    cmd = [sys.executable, str(REPO_ROOT / "run_squad.py"), "--output_dir", str(out), "--vocab_file",
           str(shared_data / "minilm" / "vocab.txt"), "--do_lower_case", "--disable_progress_bar",
           "--json-summary", str(out / "dllogger.json"), *SHORT, *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO_ROOT)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def files(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    dev = shared_data / "squad" / "dev-v1.1.json"
    return {
        "root": root,
        "train": squad_subset(dev, root / "train.json", ["Jacksonville,_Florida", "Construction"], 5),
        "predict": squad_subset(dev, root / "predict.json", ["Intergovernmental_Panel_on_Climate_Change",
                                                             "1973_oil_crisis"], 3),
    }


@pytest.fixture(scope="module")
def trained(shared_data, files):
    out = files["root"] / "out"
    squad(shared_data, out, "--init_checkpoint", str(shared_data / "minilm"), "--train_file", str(files["train"]),
          "--predict_file", str(files["predict"]), "--do_train", "--do_predict", "--do_eval", "--train_batch_size",
          "8", "--max_steps", "3", "--log_freq", "1", "--cache_dir", str(files["root"] / "cache"))
    return out


def test_training_prediction_and_evaluation_write_files_and_final_log(trained, files):
    qids = {q["id"] for a in json.loads(files["predict"].read_text())["data"] for p in a["paragraphs"]
            for q in p["qas"]}
    predictions = json.loads((trained / "predictions.json").read_text())
    assert set(predictions) == qids and all(isinstance(v, str) and v for v in predictions.values())
    nbest = json.loads((trained / "nbest_predictions.json").read_text())
    assert set(nbest) == qids
    first = nbest[next(iter(qids))]
    assert 1 <= len(first) <= 20 and set(first[0]) == {"text", "probability", "start_logit", "end_logit"}
    assert sum(e["probability"] for e in first) == pytest.approx(1.0, abs=1e-5)
    assert not (trained / "null_odds.json").exists()
    final = read_log(trained / "dllogger.json")[-1]
    assert final["step"] == [] and final["type"] == "LOG"
    for key in ("e2e_train_time", "training_sequences_per_second", "final_loss", "e2e_inference_time",
                "inference_sequences_per_second"):
        assert final["data"][key] > 0, key
    assert 0 <= final["data"]["exact_match"] <= final["data"]["F1"] <= 100
    assert final["data"]["train_steps"] == 3
    checkpoint = torch.load(trained / "pytorch_model.bin", weights_only=True)
    assert set(checkpoint) == {"model"} and "qa_outputs.weight" in checkpoint["model"]
    assert json.loads((trained / "bert_config.json").read_text())["hidden_size"] == 384


def test_reloaded_checkpoint_predicts_the_same_and_external_eval_script_agrees(trained, files, shared_data):
    out = files["root"] / "reload"
    squad(shared_data, out, "--init_checkpoint", str(trained / "pytorch_model.bin"), "--predict_file",
          str(files["predict"]), "--do_predict", "--do_eval", "--eval_script", str(REPO_ROOT / "evaluate_squad.py"),
          "--cache_dir", str(files["root"] / "cache"))
    assert (out / "predictions.json").read_text() == (trained / "predictions.json").read_text()
    first, again = read_log(trained / "dllogger.json")[-1]["data"], read_log(out / "dllogger.json")[-1]["data"]
    assert (again["exact_match"], again["F1"]) == pytest.approx((first["exact_match"], first["F1"]))
    assert "e2e_train_time" not in again


def test_run_squad_sh_prediction_mode_with_nvidia_positional_arguments(trained, files, shared_data, tmp_path):
    squad_dir = tmp_path / "v1.1"
    squad_dir.mkdir()
    (squad_dir / "dev-v1.1.json").write_bytes(files["predict"].read_bytes())
    out = tmp_path / "out"
    # init epochs batch lr warmup precision gpus seed squad_dir vocab out mode config max_steps
    args = [str(trained), "1.0", "16", "3e-5", "0.1", "fp32", "1", "1", str(squad_dir),
            str(shared_data / "minilm" / "vocab.txt"), str(out), "eval", "checkpoint", "-1"]
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_squad.sh"), *args], capture_output=True,
                            text=True, env={**ENV, "PYTHON": sys.executable}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    final = read_log(out / "dllogger.json")[-1]["data"]
    assert {"exact_match", "F1", "inference_sequences_per_second"} <= set(final) and "final_loss" not in final
    assert read_log(out / "dllogger.json")[0]["data"]["predict_batch_size"] == 16


def test_features_are_cached_once_per_file_and_setting(trained, files):
    cached = sorted(p.name for p in (files["root"] / "cache").glob("squad_features_*.npz"))
    assert len(cached) == 2  # training and prediction features; the reload run reused the latter


def test_squad_v2_prediction_writes_null_odds_and_v2_metrics(trained, files, shared_data):
    predict = squad_subset(shared_data / "squad" / "dev-v2.0.json", files["root"] / "v2.json", ["Normans"], 2)
    out = files["root"] / "v2"
    squad(shared_data, out, "--init_checkpoint", str(trained), "--predict_file", str(predict), "--do_predict",
          "--do_eval", "--version_2_with_negative", "--skip_cache")
    null_odds = json.loads((out / "null_odds.json").read_text())
    assert set(null_odds) == set(json.loads((out / "predictions.json").read_text()))
    final = read_log(out / "dllogger.json")[-1]["data"]
    assert {"exact_match", "F1", "HasAns_exact", "NoAns_exact", "best_f1"} <= set(final)
    assert not list(out.glob("*.npz")) and not list(predict.parent.glob("squad_features_*.npz"))


def test_checkpoint_with_another_config_is_a_one_line_error(files, shared_data, tmp_path):
    result = squad(shared_data, tmp_path, "--init_checkpoint", str(shared_data / "minilm"), "--config_file",
                   str(REPO_ROOT / "bert_configs" / "base.json"), "--train_file", str(files["train"]), "--do_train",
                   "--max_steps", "1", "--skip_cache", check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "minilm" in lines[0] and "shape" in lines[0], result.stderr
    assert not (tmp_path / "pytorch_model.bin").exists()


def test_missing_predict_file_flag_is_a_one_line_error(shared_data, tmp_path):
    result = squad(shared_data, tmp_path, "--init_checkpoint", str(shared_data / "minilm"), "--do_predict",
                   check=False)
    assert result.returncode == 2 and result.stderr.strip() == "error: --do_predict/--do_eval need --predict_file"
