"""run_glue.py end to end on real GLUE rows (the excerpts in tests/data/glue) with a tiny random BERT folder
(file formats, metrics, checkpoints, launchers), real fine-tuning accuracy of the pretrained MiniLM on the full data
(integration), and its refusals, staging and cleaning on a tiny model built in the test's folder."""
import errno
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertrecipe.cli import run_glue
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import staged_outputs
from bertrecipe.training.metric_logger import read_log
from helpers import (
    ENV,
    GLUE_EXCERPTS,
    REPO_ROOT,
    glue,
    run_command,
    snapshot,
    subset,
    tiny_args,
    tiny_model_files,
    tiny_sst2,
)


def mrpc_test_file(dev: Path, target: Path, skip: int, rows: int) -> None:
    """GLUE's MRPC test layout (index, #1 ID, #2 ID, #1 String, #2 String: no label) from dev rows not otherwise
    used."""
    picked = dev.read_text(encoding="utf-8").splitlines()[1 + skip: 1 + skip + rows]
    lines = ["index\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    lines += [f"{i}\t" + "\t".join(line.split("\t")[1:]) for i, line in enumerate(picked)]
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


def sst2_finetuning(vocab: Path, init: Path, data: Path, out: Path) -> None:
    """One epoch of SST-2 from init, then evaluation on the dev rows (never trained on)."""
    glue(vocab, data, out, "--task_name", "SST-2", "--init_checkpoint", str(init), "--do_train", "--do_eval",
         "--max_seq_length", "64", "--train_batch_size", "16", "--learning_rate", "1e-4", "--num_train_epochs", "1",
         "--eval_batch_size", "64", "--seed", "1", "--log_freq", "10")


def reload_and_compare(vocab: Path, task: str, data: Path, out: Path, again: Path) -> None:
    """Evaluation alone from the model a train + eval run saved in out gives the same dev predictions."""
    glue(vocab, data, again, "--task_name", task, "--init_checkpoint", str(out / "pytorch_model.bin"),
         "--mode", "eval", "--max_seq_length", "64", "--eval_batch_size", "64")
    assert (again / "eval_predictions.tsv").read_text() == (out / "eval_predictions.tsv").read_text()
    assert "e2e_train_time" not in json.loads((again / "results.json").read_text())


@pytest.mark.shared_data
def test_sst2_finetuning_beats_the_majority_class(shared_data, tmp_path):
    """Real accuracy: 640 SST-2 training sentences on the pretrained MiniLM, the first 200 dev sentences; then
    the run's files, and its saved model reloaded."""
    data = subset(shared_data / "glue" / "SST-2", tmp_path / "SST-2", 640, 200)
    minilm = shared_data / "minilm"
    sst2_finetuning(minilm / "vocab.txt", minilm, data, tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    dev_labels = [line.split("\t")[1] for line in (data / "dev.tsv").read_text().splitlines()[1:]]
    majority = max(dev_labels.count("0"), dev_labels.count("1")) / len(dev_labels)
    print(f"SST-2 dev accuracy {results['eval_acc']:.3f} vs majority class {majority:.3f}")
    assert results["eval_examples"] == 200
    assert results["eval_acc"] >= majority + 0.15
    check_run_outputs(tmp_path / "out", 200)
    reload_and_compare(minilm / "vocab.txt", "sst-2", data, tmp_path / "out", tmp_path / "eval")


@pytest.mark.slow
def test_glue_run_writes_checkpoint_predictions_results_and_log(tiny_bert, vocab_file, tmp_path):
    """The 40 SST-2 training sentences of the excerpt, one epoch of the tiny random BERT, then the 40 dev
    sentences: every output file, at a fraction of a real model's cost."""
    data = subset(GLUE_EXCERPTS / "SST-2", tmp_path / "SST-2", 40, 40)
    sst2_finetuning(vocab_file, tiny_bert, data, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "results.json").read_text())["eval_examples"] == 40
    check_run_outputs(tmp_path / "out", 40)


@pytest.mark.slow
def test_saved_checkpoint_reloads_to_the_same_predictions(tiny_bert, vocab_file, tmp_path):
    """On STS-B: the tiny random model's class predictions are all one class on SST-2, but its scores (written
    with 6 decimals) differ from one pair to the next, so only the saved weights reproduce them."""
    data = subset(GLUE_EXCERPTS / "STS-B", tmp_path / "STS-B", 40, 40)
    out = tmp_path / "out"
    glue(vocab_file, data, out, "--task_name", "sts-b", "--init_checkpoint", str(tiny_bert), "--do_train",
         "--do_eval", "--max_seq_length", "64", "--train_batch_size", "16", "--learning_rate", "1e-3",
         "--num_train_epochs", "1", "--eval_batch_size", "64", "--seed", "1")
    scores = [row.split("\t")[1] for row in (out / "eval_predictions.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 40 and len(set(scores)) >= 20
    reload_and_compare(vocab_file, "sts-b", data, out, tmp_path / "eval")


def check_run_outputs(out: Path, n_dev: int) -> None:
    """The files of a train + eval SST-2 run: timings, predictions agreeing with the accuracy, log, model."""
    results = json.loads((out / "results.json").read_text())
    for key in ("e2e_train_time", "training_sequences_per_second", "final_loss", "e2e_inference_time",
                "inference_sequences_per_second", "latency_p50_ms", "latency_p90_ms", "latency_p95_ms",
                "latency_p99_ms"):
        assert results[key] > 0, key
    assert results["latency_p50_ms"] <= results["latency_p90_ms"] <= results["latency_p99_ms"]
    rows = (out / "eval_predictions.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction\tlabel" and len(rows) == n_dev + 1
    assert {row.split("\t")[1] for row in rows[1:]} <= {"0", "1"}
    correct = sum(row.split("\t")[1] == row.split("\t")[2] for row in rows[1:])
    assert correct / n_dev == pytest.approx(results["eval_acc"])
    records = read_log(out / "dllogger.json")
    assert records[0]["step"] == "PARAMETER"
    assert [r["step"] for r in records if r.get("type") == "LOG"][-1] == []
    assert records[-1]["data"]["eval_acc"] == results["eval_acc"]
    assert (out / "bert_config.json").is_file() and (out / "pytorch_model.bin").is_file()


@pytest.mark.slow
def test_checkpoint_with_another_config_is_a_one_line_error(tiny_bert, vocab_file, tmp_path):
    data = subset(GLUE_EXCERPTS / "RTE", tmp_path / "RTE", 8, 8)
    # BERT-base's config with the checkpoint's own vocabulary size: the layers' shapes are what differ.
    base = json.loads((REPO_ROOT / "bert_configs" / "base.json").read_text())
    vocab_size = json.loads((tiny_bert / "config.json").read_text())["vocab_size"]
    (tmp_path / "base.json").write_text(json.dumps({**base, "vocab_size": vocab_size}))
    result = glue(vocab_file, data, tmp_path / "out", "--task_name", "rte", "--init_checkpoint",
                  str(tiny_bert), "--config_file", str(tmp_path / "base.json"),
                  "--do_train", "--max_steps", "1", check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tiny_bert) in lines[0] and "shape" in lines[0], result.stderr
    assert not (tmp_path / "out" / "pytorch_model.bin").exists()


@pytest.mark.slow
def test_two_process_gloo_run_trains_and_evaluates(tiny_bert, vocab_file, tmp_path):
    data = subset(GLUE_EXCERPTS / "STS-B", tmp_path / "STS-B", 40, 24)
    out = tmp_path / "out"
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    glue(vocab_file, data, out, "--task_name", "sts-b", "--init_checkpoint", str(tiny_bert),
         "--mode", "train eval", "--max_seq_length", "32", "--train_batch_size", "4",
         "--gradient_accumulation_steps", "2", "--max_steps", "3", "--log_freq", "1", launcher=launcher)
    results = json.loads((out / "results.json").read_text())
    assert results["train_steps"] == 3 and -1 <= results["eval_pearson"] <= 1 and results["eval_examples"] == 24
    steps = [r["step"] for r in read_log(out / "dllogger.json") if r.get("type") == "LOG" and r["step"]]
    assert steps[1:] == [[0, 1], [0, 2], [0, 3]]  # one log, from the first process only
    float_rows = (out / "eval_predictions.tsv").read_text().splitlines()[1:]
    assert len(float_rows) == 24 and all(math.isfinite(float(row.split("\t")[1])) for row in float_rows)


@pytest.mark.parametrize("mode, expected", [
    ("train", (True, False, False)), ("eval prediction", (False, True, True)),
    ("train_eval", (True, True, False)), ("train eval prediction", (True, True, True)),
])
def test_mode_spellings_of_nvidia_script(mode, expected):
    args = run_glue.parse_args(["--task_name", "mrpc", "--data_dir", "d", "--vocab_file", "v", "--output_dir", "o",
                                "--init_checkpoint", "c", "--mode", mode])
    assert (args.do_train, args.do_eval, args.do_predict) == expected


def test_unknown_mode_or_nothing_to_do_is_an_input_error():
    base = ["--task_name", "mrpc", "--data_dir", "d", "--vocab_file", "v", "--output_dir", "o"]
    with pytest.raises(InputError, match="--mode"):
        run_glue.parse_args([*base, "--mode", "training"])
    with pytest.raises(InputError, match="nothing to do"):
        run_glue.parse_args(base)


@pytest.mark.slow
def test_run_glue_sh_passes_nvidia_positional_arguments(tiny_bert, vocab_file, tmp_path):
    """Also the one end-to-end run of --bf16 and of prediction (with eval in the same run): cheapest here."""
    data = subset(GLUE_EXCERPTS / "MRPC", tmp_path / "MRPC", 16, 8)
    mrpc_test_file(GLUE_EXCERPTS / "MRPC" / "dev.tsv", data / "test.tsv", skip=8, rows=12)
    out = tmp_path / "out"
    # init data vocab config out task gpus batch accumulation lr warmup epochs max_steps precision seed mode
    args = [str(tiny_bert), str(data), str(vocab_file), "checkpoint", str(out), "mrpc", "1", "8", "2",
            "5e-5", "0.1", "1", "2", "bf16", "3", "train eval prediction"]
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_glue.sh"), *args], capture_output=True,
                            text=True, env={**ENV, "PYTHON": sys.executable}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    params = read_log(out / "dllogger.json")[0]["data"]
    assert (params["train_batch_size"], params["gradient_accumulation_steps"], params["seed"]) == (8, 2, 3)
    assert (params["do_train"], params["do_eval"], params["do_predict"]) == (True, True, True)
    assert params["bf16"] is True
    results = json.loads((out / "results.json").read_text())
    assert results["train_steps"] == 2 and math.isfinite(results["final_loss"])
    assert 0 <= results["eval_acc"] <= 1 and 0 <= results["eval_acc_and_f1"] <= 1 and results["eval_examples"] == 8
    # Both passes keep their timings: the dev pass under the plain keys, the test pass under prediction_*.
    for key in ("e2e_inference_time", "inference_sequences_per_second", "latency_p50_ms", "latency_p99_ms"):
        assert results[key] > 0 and results[f"prediction_{key}"] > 0, key
    assert results["prediction_examples"] == 12
    # Throughput times time gives back each pass's own example count: 8 dev rows, 12 test rows.
    assert results["inference_sequences_per_second"] * results["e2e_inference_time"] == pytest.approx(8)
    assert results["prediction_inference_sequences_per_second"] * results["prediction_e2e_inference_time"] == \
        pytest.approx(12)
    rows = (out / "test_predictions.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 13
    assert [row.split("\t")[0] for row in rows[1:]] == [str(i) for i in range(12)]
    assert all(row.split("\t")[1] in ("0", "1") for row in rows[1:])
    assert len((out / "eval_predictions.tsv").read_text().splitlines()) == 9
    assert (out / "logfile.txt").read_text().strip()


def mnli_file(path: Path, pairs: list[tuple[str, str]], labels: list[str]) -> None:
    """GLUE's MNLI dev layout (ten fields, five annotator labels, gold label last) around real sentence pairs."""
    header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
              "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")
    rows = [f"{i}\t{i}\t{i}e\tfiction\t( a )\t( b )\t(ROOT a)\t(ROOT b)\t{a}\t{b}\t" + "\t".join([label] * 6)
            for i, ((a, b), label) in enumerate(zip(pairs, labels, strict=True))]
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_mnli_reports_matched_and_mismatched_dev_sets(tiny_bert, vocab_file, tmp_path):
    lines = (GLUE_EXCERPTS / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:20]
    pairs = [tuple(line.split("\t")[1:3]) for line in lines]
    classes = ["entailment", "neutral", "contradiction"]
    data = tmp_path / "MNLI"
    data.mkdir()
    mnli_file(data / "train.tsv", pairs[:8], [classes[i % 3] for i in range(8)])
    mnli_file(data / "dev_matched.tsv", pairs[8:14], [classes[i % 3] for i in range(6)])
    mnli_file(data / "dev_mismatched.tsv", pairs[14:19], [classes[i % 3] for i in range(5)])
    out = tmp_path / "out"
    glue(vocab_file, data, out, "--task_name", "mnli", "--init_checkpoint", str(tiny_bert),
         "--do_train", "--do_eval", "--max_seq_length", "32", "--train_batch_size", "4", "--max_steps", "1")
    results = json.loads((out / "results.json").read_text())
    assert results["eval_examples"] == 6 and results["eval_mm_examples"] == 5
    assert 0 <= results["eval_acc"] <= 1 and 0 <= results["eval_mm_acc"] <= 1
    rows = (out / "eval_mismatched_predictions.tsv").read_text().splitlines()[1:]
    assert len(rows) == 5 and all(row.split("\t")[1] in classes for row in rows)


# ---------------------------------------------------------------------------------------------------------
# A tiny model and task folder made in tmp_path: refusals, all-or-nothing outputs, stale temporaries
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def previous_run(tmp_path_factory):
    """A tiny SST-2 folder and the output of a train + eval + predict run on it (model, predictions, results)."""
    root = tmp_path_factory.mktemp("tiny_glue")
    tiny_model_files(root / "model")
    tiny_sst2(root / "SST-2")
    run_glue.main(tiny_args(root, "--do_train", "--do_eval", "--do_predict"))
    assert {"pytorch_model.bin", "results.json", "eval_predictions.tsv", "test_predictions.tsv"} <= set(
        os.listdir(root / "out"))
    return root


@pytest.fixture
def rerun(previous_run, tmp_path):
    """A copy of the previous run's folder to run again in, and the snapshot of it before."""
    root = tmp_path / "run"
    shutil.copytree(previous_run, root)
    return root, snapshot(root)


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_header_only_split_is_refused_before_anything_is_replaced(rerun, split):
    root, before = rerun
    name = f"{split}.tsv"
    (root / "SST-2" / name).write_text("index\tsentence\n" if split == "test" else "sentence\tlabel\n")
    before["SST-2/" + name] = (root / "SST-2" / name).read_bytes()
    with pytest.raises(InputError, match=rf"{name}: no examples .* needs at least one"):
        run_glue.main(tiny_args(root, "--do_train", "--do_eval", "--do_predict", "--seed", "7"))
    assert snapshot(root) == before  # the old model, results and log as they were


def test_failure_during_evaluation_replaces_neither_model_nor_results(rerun, monkeypatch):
    root, before = rerun

    def broken(*args, **kwargs):
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(run_glue.glue, "compute_metrics", broken)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        run_glue.main(tiny_args(root, "--do_train", "--do_eval", "--seed", "7", "--json-summary", ""))
    assert snapshot(root) == before  # no new model beside the old results, no temporary file left


def test_rerun_replaces_model_predictions_and_results_together(rerun):
    root, before = rerun
    run_glue.main(tiny_args(root, "--do_train", "--do_eval", "--seed", "7", "--learning_rate", "1e-2"))
    after = snapshot(root)
    assert after["out/pytorch_model.bin"] != before["out/pytorch_model.bin"]
    final = read_log(root / "dllogger.json")[-1]["data"]  # this run's summary, appended to the previous log
    assert json.loads(after["out/results.json"]) == pytest.approx(final)
    assert after["out/test_predictions.tsv"] == before["out/test_predictions.tsv"]  # not part of this run
    assert not [name for name in after if name.endswith(".tmp")]
    umask = os.umask(0o22)
    os.umask(umask)
    assert (root / "out" / "pytorch_model.bin").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_a_crash_between_renames_leaves_no_old_results_beside_a_new_model(tmp_path, monkeypatch):
    (tmp_path / "pytorch_model.bin").write_text("old model")
    (tmp_path / "results.json").write_text("old results")
    stage = staged_outputs.StagedOutputs(tmp_path, run_glue.OUTPUTS)
    stage.write_text("pytorch_model.bin", "new model")
    stage.write_text("results.json", "new results")
    real_replace = os.replace

    def crash_before_results(source, target):
        if Path(target).name == "results.json":
            raise KeyboardInterrupt  # stands for a kill between two renames
        real_replace(source, target)

    monkeypatch.setattr(staged_outputs.os, "replace", crash_before_results)
    with pytest.raises(KeyboardInterrupt):
        stage.commit()
    assert (tmp_path / "pytorch_model.bin").read_text() == "new model"
    assert not (tmp_path / "results.json").exists()


def test_stale_temporaries_of_our_outputs_are_removed_and_nothing_else(rerun):
    root, _ = rerun
    out = root / "out"
    ours = [".pytorch_model.bin.a1b2c3d4.tmp", ".results.json.x_9yz8w7.tmp", ".eval_predictions.tsv.tmp",
            "results.json.k3j4h5g6.tmp", ".bert_config.json.abcdefgh.tmp"]
    theirs = [".notes.txt.a1b2c3d4.tmp", ".results.json.toolong123.tmp", "results.json.tmp", "mine.tmp",
              ".pytorch_model.bin.A1B2C3D4.tmp", "pytorch_model.bin.tmp"]
    for name in ours + theirs:
        (out / name).write_text("left behind\n")
    run_glue.main(tiny_args(root, "--do_eval", "--init_checkpoint", str(out / "pytorch_model.bin")))
    left = {p.name for p in out.iterdir() if p.name.endswith(".tmp")}
    assert left == set(theirs)
    assert all((out / name).read_text() == "left behind\n" for name in theirs)


NONSENSE = {
    "accumulation 0": (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps must be at least 1"),
    "train batch 0": (["--train_batch_size", "0"], "--train_batch_size must be at least 1"),
    "train batch negative": (["--train_batch_size", "-4"], "--train_batch_size must be at least 1"),
    "eval batch 0": (["--eval_batch_size", "0"], "--eval_batch_size must be at least 1"),
    "eval batch negative": (["--eval_batch_size", "-8"], "--eval_batch_size must be at least 1"),
    "max_steps 0": (["--max_steps", "0"], "--max_steps must be -1"),
    "max_steps -2": (["--max_steps", "-2"], "--max_steps must be -1"),
    "max_steps fraction": (["--max_steps", "1.5"], "--max_steps must be -1"),
    "max_steps nan": (["--max_steps", "nan"], "--max_steps must be -1"),
    "learning rate nan": (["--learning_rate", "nan"], "--learning_rate must be a finite number > 0"),
    "learning rate inf": (["--learning_rate", "inf"], "--learning_rate must be a finite number > 0"),
    "learning rate negative": (["--learning_rate=-1e-5"], "--learning_rate must be a finite number > 0"),
    "epochs nan": (["--num_train_epochs", "nan", "--max_steps", "-1"], "--num_train_epochs must be a finite"),
    "epochs inf": (["--num_train_epochs", "inf", "--max_steps", "-1"], "--num_train_epochs must be a finite"),
    "epochs negative": (["--num_train_epochs", "-1"], "--num_train_epochs must be a finite"),
    "warmup nan": (["--warmup_proportion", "nan"], "--warmup_proportion must lie in"),
    "workers negative": (["--num_workers", "-1"], "--num_workers must be 0 or more"),
    "max_seq_length 2 (single sentence)": (["--max_seq_length", "2"], "--max_seq_length 2 is too small for sst-2"),
    "max_seq_length 4 (pairs)": (["--max_seq_length", "4", "--task_name", "mrpc"],
                                 "--max_seq_length 4 is too small for mrpc"),
    "output_dir is a file": (["--output_dir", "{root}/a_file"], "--output_dir exists and is a file"),
    "output_dir under a file": (["--output_dir", "{root}/a_file/out"], "--output_dir cannot be created because"),
    "json-summary is a folder": (["--json-summary", "{root}/SST-2"], "--json-summary is a folder"),
}


@pytest.mark.parametrize("case", NONSENSE)
def test_nonsense_arguments_are_one_line_errors_that_create_nothing(tmp_path, case):
    tiny_model_files(tmp_path / "model")
    tiny_sst2(tmp_path / "SST-2")
    (tmp_path / "a_file").write_text("mine\n")
    before = snapshot(tmp_path)
    extra, message = NONSENSE[case]
    argv = tiny_args(tmp_path, "--do_train", "--do_eval") + [arg.format(root=tmp_path) for arg in extra]
    with pytest.raises(InputError, match=message.replace("(", r"\(")) as error:
        run_glue.main(argv)
    assert "\n" not in str(error.value)
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


def test_max_steps_minus_one_trains_the_epochs():
    base = ["--task_name", "sst-2", "--data_dir", "d", "--vocab_file", "v", "--output_dir", "o", "--do_train"]
    for spelling in ("-1", "-1.0"):  # run_glue.sh passes -1.0
        assert run_glue.parse_args([*base, "--max_steps", spelling]).max_steps == -1
    assert run_glue.parse_args([*base, "--max_steps", "3"]).max_steps == 3


def test_refusal_from_the_command_line_is_one_line_exit_2_and_creates_nothing(tmp_path):
    tiny_model_files(tmp_path / "model")
    tiny_sst2(tmp_path / "SST-2", dev_rows=0)
    result = run_command([sys.executable, str(REPO_ROOT / "run_glue.py"),
                             *tiny_args(tmp_path, "--do_train", "--do_eval")], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'SST-2' / 'dev.tsv'}: no examples (the file holds no line after its header); "
        "--do_eval needs at least one"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "dllogger.json").exists()


# name: (flags, what the line says); {root} is the run's folder (model/, SST-2/, out/)
GLUE_OUTPUTS_ONTO_INPUTS = {
    "--json-summary is --config_file": (["--json-summary", "{root}/model/bert_config.json"],
                                        "--json-summary is the same file as --config_file"),
    "--json-summary is the train file": (["--json-summary", "{root}/SST-2/train.tsv"],
                                         "--json-summary is the same file as the train file of --data_dir"),
    "--json-summary is the test file": (["--json-summary", "{root}/SST-2/../SST-2/test.tsv"],
                                        "--json-summary is the same file as the test file of --data_dir"),
    "--output_dir is --data_dir": (["--output_dir", "{root}/SST-2"], "--output_dir is the same folder as --data_dir"),
    "training over --init_checkpoint": (["--init_checkpoint", "{root}/out/pytorch_model.bin"],
                                        r"pytorch_model.bin \(in --output_dir\) is the same file as --init_checkpoint"),
}


@pytest.mark.parametrize("case", GLUE_OUTPUTS_ONTO_INPUTS)
def test_an_output_onto_an_input_is_refused_before_anything_is_written(rerun, case):
    root, before = rerun
    flags, message = GLUE_OUTPUTS_ONTO_INPUTS[case]
    argv = tiny_args(root, "--do_train", "--do_eval", "--do_predict") + [flag.format(root=root) for flag in flags]
    with pytest.raises(InputError, match=message) as refused:
        run_glue.main(argv)
    assert "\n" not in str(refused.value) and "choose another" in str(refused.value)
    assert snapshot(root) == before


def test_a_second_run_into_a_locked_output_dir_is_refused_and_changes_nothing(rerun):
    """One run per --output_dir for fine-tuning too (run_lock.py): a live holder of the folder's lock (another
    process on this host) keeps a second run out before it writes anything, its log included."""
    from helpers import start_holder

    root, before = rerun
    holder, said = start_holder(root / "out")
    assert said == "held"
    try:
        with pytest.raises(InputError, match=rf"another run is using this --output_dir \(host .*process {holder.pid}"):
            run_glue.main(tiny_args(root, "--do_train", "--do_eval", "--seed", "7"))
        lock = root / "out" / ".run.lock"
        assert {name: data for name, data in snapshot(root).items() if name != "out/.run.lock"} == before
        assert lock.exists()  # the holder's, untouched
    finally:
        holder.communicate("", timeout=30)
    run_glue.main(tiny_args(root, "--do_train", "--do_eval", "--seed", "7"))
    assert not (root / "out" / ".run.lock").exists()


def test_a_full_disk_while_writing_the_outputs_is_one_line_and_replaces_nothing(rerun, monkeypatch):
    root, before = rerun
    real = staged_outputs.write_temporary

    def disk_full_at_results(path, write):
        if path.name == "results.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, write)

    monkeypatch.setattr(staged_outputs, "write_temporary", disk_full_at_results)
    with pytest.raises(InputError, match=r"results.json: cannot write it \(No space left on device\); nothing in "):
        run_glue.main(tiny_args(root, "--do_train", "--do_eval", "--seed", "7", "--json-summary", ""))
    assert snapshot(root) == before  # the old model and results, no temporary left
