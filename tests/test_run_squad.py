"""run_squad.py end to end on a tiny randomly initialised BERT saved as a Hugging Face folder (conftest's
tiny_bert, laid out as a pretrained encoder download): a few training steps on some real dev-v1.1 articles, then
prediction and evaluation on others, from the excerpt in tests/data/squad (mechanics, files and formats, not
accuracy: see benchmarks/finetune_accuracy.py); and its refusals, staging and cleaning on a tiny model built in the
test's folder."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertrecipe.cli import run_squad
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import squad as squad_lib
from bertrecipe.tokenization.wordpiece import load_vocab
from bertrecipe.training.metric_logger import read_log
from helpers import (
    ENV,
    EXCERPT,
    QUESTIONS,
    REPO_ROOT,
    SHORT,
    run_command,
    snapshot,
    squad,
    squad_subset,
    tiny_model_files,
    tiny_squad_args,
    tiny_squad_file,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    dev = EXCERPT / "dev-v1.1.json"
    return {
        "root": root,
        "train": squad_subset(dev, root / "train.json", ["Jacksonville,_Florida", "Construction"], 3),
        "predict": squad_subset(dev, root / "predict.json", ["Intergovernmental_Panel_on_Climate_Change",
                                                             "1973_oil_crisis"], 2),
    }


@pytest.fixture(scope="module")
def trained(tiny_bert, files):
    out = files["root"] / "out"
    squad(tiny_bert / "vocab.txt", out, "--init_checkpoint", str(tiny_bert), "--train_file", str(files["train"]),
          "--predict_file", str(files["predict"]), "--do_train", "--do_predict", "--do_eval", "--train_batch_size",
          "8", "--max_steps", "3", "--log_freq", "1", "--cache_dir", str(files["root"] / "cache"))
    return out


@pytest.mark.slow
def test_training_prediction_and_evaluation_write_files_and_final_log(trained, files, tiny_bert):
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
    assert set(checkpoint) == {"model", "tokenizer", "task"} and "qa_outputs.weight" in checkpoint["model"]
    assert checkpoint["task"] == {"kind": "question-answering", "name": "squad-v1.1"}
    assert checkpoint["tokenizer"]["sha256"] == hashlib.sha256((tiny_bert / "vocab.txt").read_bytes()).hexdigest()
    written = json.loads((trained / "bert_config.json").read_text())
    assert written["hidden_size"] == json.loads((tiny_bert / "config.json").read_text())["hidden_size"] == 32


@pytest.mark.slow
def test_reloaded_checkpoint_predicts_the_same_and_external_eval_script_agrees(trained, files, tiny_bert):
    out = files["root"] / "reload"
    squad(tiny_bert / "vocab.txt", out, "--init_checkpoint", str(trained / "pytorch_model.bin"), "--predict_file",
          str(files["predict"]), "--do_predict", "--do_eval", "--eval_script", str(REPO_ROOT / "evaluate_squad.py"),
          "--cache_dir", str(files["root"] / "cache"))
    assert (out / "predictions.json").read_text() == (trained / "predictions.json").read_text()
    first, again = read_log(trained / "dllogger.json")[-1]["data"], read_log(out / "dllogger.json")[-1]["data"]
    assert (again["exact_match"], again["F1"]) == pytest.approx((first["exact_match"], first["F1"]))
    assert "e2e_train_time" not in again


@pytest.mark.slow
def test_run_squad_sh_prediction_mode_with_nvidia_positional_arguments(trained, files, tiny_bert, tmp_path):
    squad_dir = tmp_path / "v1.1"
    squad_dir.mkdir()
    (squad_dir / "dev-v1.1.json").write_bytes(files["predict"].read_bytes())
    out = tmp_path / "out"
    # init epochs batch lr warmup precision gpus seed squad_dir vocab out mode config max_steps
    args = [str(trained), "1.0", "16", "3e-5", "0.1", "fp32", "1", "1", str(squad_dir),
            str(tiny_bert / "vocab.txt"), str(out), "eval", "checkpoint", "-1"]
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_squad.sh"), *args], capture_output=True,
                            text=True, env={**ENV, "PYTHON": sys.executable}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    final = read_log(out / "dllogger.json")[-1]["data"]
    assert {"exact_match", "F1", "inference_sequences_per_second"} <= set(final) and "final_loss" not in final
    assert read_log(out / "dllogger.json")[0]["data"]["predict_batch_size"] == 16


def test_features_are_cached_once_per_file_and_setting(trained, files):
    cached = sorted(p.name for p in (files["root"] / "cache").glob("squad_features_*.npz"))
    assert len(cached) == 2  # training and prediction features; the reload run reused the latter


def test_squad_v2_prediction_writes_null_odds_and_v2_metrics(trained, files, tiny_bert):
    predict = squad_subset(EXCERPT / "dev-v2.0.json", files["root"] / "v2.json", ["Normans"], 2)
    out = files["root"] / "v2"
    squad(tiny_bert / "vocab.txt", out, "--init_checkpoint", str(trained), "--predict_file", str(predict),
          "--do_predict", "--do_eval", "--version_2_with_negative", "--skip_cache")
    null_odds = json.loads((out / "null_odds.json").read_text())
    assert set(null_odds) == set(json.loads((out / "predictions.json").read_text()))
    final = read_log(out / "dllogger.json")[-1]["data"]
    assert {"exact_match", "F1", "HasAns_exact", "NoAns_exact", "best_f1"} <= set(final)
    assert not list(out.glob("*.npz")) and not list(predict.parent.glob("squad_features_*.npz"))


@pytest.mark.slow
def test_checkpoint_with_another_config_is_a_one_line_error(files, tiny_bert, tmp_path):
    # BERT-base's shapes with the tiny vocabulary's size, so that the weights' shapes, not the vocabulary, differ.
    config = json.loads((REPO_ROOT / "bert_configs" / "base.json").read_text())
    config["vocab_size"] = json.loads((tiny_bert / "config.json").read_text())["vocab_size"]
    (tmp_path / "base.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    result = squad(tiny_bert / "vocab.txt", out, "--init_checkpoint", str(tiny_bert), "--config_file",
                   str(tmp_path / "base.json"), "--train_file", str(files["train"]), "--do_train",
                   "--max_steps", "1", "--skip_cache", check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tiny_bert) in lines[0] and "shape" in lines[0], result.stderr
    assert not (out / "pytorch_model.bin").exists()


def test_missing_predict_file_flag_is_a_one_line_error(tiny_bert, tmp_path):
    result = squad(tiny_bert / "vocab.txt", tmp_path, "--init_checkpoint", str(tiny_bert), "--do_predict",
                   check=False)
    assert result.returncode == 2 and result.stderr.strip() == "error: --do_predict/--do_eval need --predict_file"


# ---------------------------------------------------------------------------------------------------------
# A tiny model and SQuAD files made in tmp_path: refusals, all-or-nothing outputs, stale temporaries
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def previous_squad_run(tmp_path_factory):
    """Tiny train and predict files and the output of a train + predict + eval run on them."""
    root = tmp_path_factory.mktemp("tiny_squad")
    tiny_model_files(root / "model")
    tiny_squad_file(root / "train.json", QUESTIONS)
    tiny_squad_file(root / "predict.json", QUESTIONS[:2])
    run_squad.main(tiny_squad_args(root, "--do_train", "--train_file", str(root / "train.json"), "--do_predict",
                                   "--do_eval", "--predict_file", str(root / "predict.json")))
    assert {"pytorch_model.bin", "bert_config.json", "predictions.json", "nbest_predictions.json"} <= set(
        os.listdir(root / "out"))
    return root


@pytest.fixture
def squad_rerun(previous_squad_run, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(previous_squad_run, root)
    return root, snapshot(root)


def train_predict_eval(root: Path, train: str = "train.json", predict: str = "predict.json") -> list[str]:
    return ["--do_train", "--train_file", str(root / train), "--do_predict", "--do_eval", "--predict_file",
            str(root / predict), "--seed", "7"]


BAD_FILES = {
    "empty predict file": ("predict", {"version": "1.1", "data": []}, "predict.json: no questions"),
    "predict file without answers": ("predict", [("q1", "the movie was", [])],
                                     "predict.json: question 'q1' .* has no gold answer"),
    "empty train file": ("train", {"version": "1.1", "data": []}, "train.json: no usable training questions"),
    "no train answer in its context": ("train", "misplaced", "train.json: no usable training questions"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_squad_file_is_refused_before_anything_is_written(squad_rerun, case):
    root, before = squad_rerun
    which, content, message = BAD_FILES[case]
    path = root / f"{which}.json"
    if isinstance(content, dict):
        path.write_text(json.dumps(content))
    elif content == "misplaced":  # the answer text is not where answer_start says: skipped, as the reference does
        data = json.loads(path.read_text())
        for qa in data["data"][0]["paragraphs"][0]["qas"]:
            qa["answers"][0]["answer_start"] = 0  # "the", where every answer is another word
        path.write_text(json.dumps(data))
    else:
        tiny_squad_file(path, content)
    shutil.rmtree(root / "cache")  # a refused run writes no feature cache either
    before = {name: data for name, data in before.items() if not name.startswith("cache/")}
    before[f"{which}.json"] = path.read_bytes()
    with pytest.raises(InputError, match=message):
        run_squad.main(tiny_squad_args(root, *train_predict_eval(root)))
    assert snapshot(root) == before and not (root / "cache").exists()


def test_eval_without_predictions_is_refused_before_anything_is_written(tmp_path):
    tiny_model_files(tmp_path / "model")
    tiny_squad_file(tmp_path / "predict.json", QUESTIONS)
    with pytest.raises(InputError, match="predictions.json: --do_eval without --do_predict scores this file"):
        run_squad.main(tiny_squad_args(tmp_path, "--do_eval", "--predict_file", str(tmp_path / "predict.json")))
    assert sorted(os.listdir(tmp_path)) == ["model", "predict.json"]


def test_failing_eval_script_replaces_neither_model_nor_predictions(squad_rerun):
    root, before = squad_rerun
    script = root / "broken_eval.py"
    script.write_text("import sys\nsys.exit('no scores today')\n")
    before["broken_eval.py"] = script.read_bytes()
    with pytest.raises(InputError, match="broken_eval.py: exited with 1: no scores today"):
        run_squad.main(tiny_squad_args(root, *train_predict_eval(root), "--eval_script", str(script),
                                       "--json-summary", ""))
    assert snapshot(root) == before  # and no temporary file left in out/


def test_stale_squad_temporaries_are_removed_and_nothing_else(squad_rerun):
    root, _ = squad_rerun
    out = root / "out"
    ours = [".pytorch_model.bin.a1b2c3d4.tmp", ".predictions.json.tmp", "nbest_predictions.json.k3j4h5g6.tmp",
            ".null_odds.json.zz_99_aa.tmp"]
    theirs = [".results.txt.a1b2c3d4.tmp", "predictions.json.tmp", ".predictions.json.short.tmp", "other.tmp"]
    for name in ours + theirs:
        (out / name).write_text("left behind\n")
    run_squad.main(tiny_squad_args(root, "--do_predict", "--predict_file", str(root / "predict.json"),
                                   "--init_checkpoint", str(out / "pytorch_model.bin")))
    assert {p.name for p in out.iterdir() if p.name.endswith(".tmp")} == set(theirs)


SQUAD_NONSENSE = {
    "predict batch 0": (["--predict_batch_size", "0"], "--predict_batch_size must be at least 1"),
    "n_best_size 0": (["--n_best_size", "0"], "--n_best_size must be at least 1"),
    "max_answer_length 0": (["--max_answer_length", "0"], "--max_answer_length must be at least 1"),
    "max_seq_length below query + 4": (["--max_seq_length", "11"], "--max_seq_length 11 leaves no room"),
    "train batch negative": (["--train_batch_size", "-2"], "--train_batch_size must be at least 1"),
    "epochs nan": (["--num_train_epochs", "nan", "--max_steps", "-1"], "--num_train_epochs must be a finite"),
    "max_steps 0": (["--max_steps", "0"], "--max_steps must be -1"),
    "output_dir is a file": (["--output_dir", "{root}/a_file"], "--output_dir exists and is a file"),
    "json-summary is a folder": (["--json-summary", "{root}/model"], "--json-summary is a folder"),
    "cache_dir is a file": (["--cache_dir", "{root}/a_file"], "--cache_dir exists and is a file"),
}


@pytest.mark.parametrize("case", SQUAD_NONSENSE)
def test_nonsense_squad_arguments_are_one_line_errors_that_create_nothing(tmp_path, case):
    tiny_model_files(tmp_path / "model")
    tiny_squad_file(tmp_path / "train.json", QUESTIONS)
    tiny_squad_file(tmp_path / "predict.json", QUESTIONS)
    (tmp_path / "a_file").write_text("mine\n")
    before = snapshot(tmp_path)
    extra, message = SQUAD_NONSENSE[case]
    argv = tiny_squad_args(tmp_path, *train_predict_eval(tmp_path)) + [arg.format(root=tmp_path) for arg in extra]
    with pytest.raises(InputError, match=message) as error:
        run_squad.main(argv)
    assert "\n" not in str(error.value)
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == [
        "a_file", "model", "predict.json", "train.json"]


def test_unscorable_predict_file_from_the_command_line_is_one_line_exit_2(tmp_path):
    tiny_model_files(tmp_path / "model")
    tiny_squad_file(tmp_path / "train.json", QUESTIONS)
    tiny_squad_file(tmp_path / "predict.json", [("q1", "the movie was", []), ("q2", "the plot was", [])])
    result = run_command([sys.executable, str(REPO_ROOT / "run_squad.py"),
                             *tiny_squad_args(tmp_path, *train_predict_eval(tmp_path))], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'predict.json'}: question 'q1' (2 in all) has no gold answer, which the SQuAD 1.1 "
        'metric cannot score; mark such questions "is_impossible": true (SQuAD 2.0) or drop --do_eval']
    assert sorted(os.listdir(tmp_path)) == ["model", "predict.json", "train.json"]


# name: (flags, what the line says); {root} is the run's folder (model/, train.json, predict.json, out/)
SQUAD_OUTPUTS_ONTO_INPUTS = {
    "--json-summary is --config_file": (["--json-summary", "{root}/model/bert_config.json"],
                                        "--json-summary is the same file as --config_file"),
    "--json-summary is --vocab_file": (["--json-summary", "{root}/model/vocab.txt"],
                                       "--json-summary is the same file as --vocab_file"),
    "--json-summary is --train_file": (["--json-summary", "{root}/train.json"],
                                       "--json-summary is the same file as --train_file"),
    "--json-summary is --predict_file": (["--json-summary", "{root}/./predict.json"],
                                         "--json-summary is the same file as --predict_file"),
    "--json-summary is --eval_script": (["--json-summary", "{root}/eval.py", "--eval_script", "{root}/eval.py"],
                                        "--json-summary is the same file as --eval_script"),
    "training over --init_checkpoint": (["--init_checkpoint", "{root}/out/pytorch_model.bin"],
                                        r"pytorch_model.bin \(in --output_dir\) is the same file as --init_checkpoint"),
    "--output_dir is the --init_checkpoint folder": (["--init_checkpoint", "{root}/out"],
                                                     "--output_dir is the same folder as --init_checkpoint"),
    "predictions onto --predict_file": (["--predict_file", "{root}/out/predictions.json"],
                                        r"predictions.json \(in --output_dir\) is the same file as --predict_file"),
}


@pytest.mark.parametrize("case", SQUAD_OUTPUTS_ONTO_INPUTS)
def test_an_output_onto_an_input_is_refused_before_anything_is_written(squad_rerun, case):
    """The issue's example: --json-summary naming the config appended log records to it. Every file the run writes
    (model, predictions, log) is checked against every file it reads, and the output folder against input folders."""
    root, before = squad_rerun
    (root / "eval.py").write_text("print('{}')\n")
    before["eval.py"] = (root / "eval.py").read_bytes()
    flags, message = SQUAD_OUTPUTS_ONTO_INPUTS[case]
    argv = tiny_squad_args(root, *train_predict_eval(root)) + [flag.format(root=root) for flag in flags]
    with pytest.raises(InputError, match=message) as refused:
        run_squad.main(argv)
    assert "\n" not in str(refused.value) and "choose another" in str(refused.value)
    assert snapshot(root) == before


def test_eval_alone_refuses_a_log_onto_the_predictions_it_scores(squad_rerun):
    root, before = squad_rerun
    with pytest.raises(InputError, match="--json-summary is the same file as the predictions to score"):
        run_squad.main(tiny_squad_args(root, "--do_eval", "--predict_file", str(root / "predict.json"),
                                       "--json-summary", str(root / "out" / "predictions.json")))
    assert snapshot(root) == before


def test_the_predict_file_is_read_once_in_a_predict_and_eval_run(squad_rerun, monkeypatch):
    """Its examples, the scoring check, the feature cache's key and the evaluation all come from one read (they
    were five), so that they see the same bytes; the feature cache keeps its key (the sha256 of the bytes)."""
    import builtins
    import hashlib

    root, _ = squad_rerun
    predict = (root / "predict.json").resolve()
    real_open, opened = builtins.open, []

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).resolve() == predict:
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    run_squad.main(tiny_squad_args(root, "--do_predict", "--do_eval", "--predict_file", str(predict),
                                   "--init_checkpoint", str(root / "out" / "pytorch_model.bin")))
    assert len(opened) == 1
    key = squad_lib.features_cache_key(hashlib.sha256(predict.read_bytes()).hexdigest(),
                                       load_vocab(root / "model" / "vocab.txt"), False,
                                       squad_lib.WindowSettings(24, 8, 8), False, False)
    assert squad_lib.features_cache_path(root / "cache", key).is_file()


def test_the_predict_file_is_read_once_for_features_scoring_check_and_scores(tiny_bert, files, tmp_path,
                                                                              monkeypatch):
    """One squad.SquadFile is passed to all that uses --predict_file (no module-global cache): the examples, the
    feature-cache key, the scoring check and the scores see one read of it."""
    import builtins

    predict = files["predict"]
    real_open, opened = builtins.open, []

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).resolve() == predict.resolve():
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    run_squad.main(["--output_dir", str(tmp_path / "out"), "--vocab_file", str(tiny_bert / "vocab.txt"),
                    "--do_lower_case", "--disable_progress_bar", "--init_checkpoint", str(tiny_bert),
                    "--predict_file", str(predict), "--do_predict", "--do_eval", "--skip_cache", *SHORT])
    assert len(opened) == 1
    assert (tmp_path / "out" / "predictions.json").is_file()
