"""scripts/run_pretraining.sh, run_squad.sh and run_glue.sh (issue 32): bad arguments are the entry point's one
line and exit status 2 with nothing created (no output folder, no log); a log is appended to, never truncated;
Ctrl-C and SIGTERM end a run with the workers' own status and no torchrun traceback; a log writer's failure is
one line from the entry point. Tiny random shards and stand-in entry points (CODEDIR) keep them short."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertrecipe.training.metric_logger import read_log
from helpers import REPO_ROOT, permissions_are_ignored, run_command

SCRIPTS = REPO_ROOT / "scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHON": sys.executable}
NOISE = ("Traceback", "ChildFailedError", "SignalException", "failed (exitcode")
SEQ, PREDS, VOCAB = 128, 20, 128  # run_pretraining.sh's phase 1 lengths
CONFIG = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 64, "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}


def write_shard(path: Path, n: int = 64, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    segment_ids = np.zeros((n, SEQ), np.int8)
    segment_ids[:, SEQ // 2:] = 1
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=rng.integers(5, VOCAB, (n, SEQ)).astype(np.int32))
        f.create_dataset("input_mask", data=np.ones((n, SEQ), np.int8))
        f.create_dataset("segment_ids", data=segment_ids)
        f.create_dataset("masked_lm_positions", data=np.tile(np.arange(1, PREDS + 1, dtype=np.int32), (n, 1)))
        f.create_dataset("masked_lm_ids", data=rng.integers(5, VOCAB, (n, PREDS)).astype(np.int32))
        f.create_dataset("next_sentence_labels", data=rng.integers(0, 2, n).astype(np.int8))


@pytest.fixture
def pretraining(tmp_path):
    """Phase-1 shards and a tiny config; the positional arguments of a long phase 1 (it never finishes)."""
    (tmp_path / "p1").mkdir()
    write_shard(tmp_path / "p1" / "tiny_training_0.hdf5")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    # batch lr precision gpus warmup steps save resume logfile accumulate acc seed job allreduce allreduce_fp16
    # batch2 lr2 warmup2 steps2 acc2 data1 config data2 codedir
    positional = [8, "1e-3", "fp32", 1, 0.1, 100000, 100000, "false", "true", "false", 1, 42, "job", "false",
                  "false", 4, "1e-3", 0.1, 2, 1, tmp_path / "p1", tmp_path / "config.json", tmp_path / "p2",
                  REPO_ROOT]
    env = {**ENV, "RESULTS_DIR": str(tmp_path / "results"), "EXTRA_ARGS": "--disable_progress_bar"}
    return [str(arg) for arg in positional], env


def run_script(script, args, env=ENV, cwd=None):
    return subprocess.run(["bash", str(SCRIPTS / script), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def one_line(result, *fragments):
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def squad_args(tmp_path, out, **change):
    # init epochs batch lr warmup precision gpus seed squad_dir vocab out mode config max_steps
    args = {"init": tmp_path / "model.pt", "epochs": "1.0", "batch": "4", "lr": "3e-5", "warmup": "0.1",
            "precision": "fp32", "gpus": "1", "seed": "1", "squad_dir": tmp_path / "v1.1",
            "vocab": tmp_path / "vocab.txt", "out": out, "mode": "eval", "config": "checkpoint", "steps": "-1"}
    return list({**args, **change}.values())


def glue_args(tmp_path, out, **change):
    # init data vocab config out task gpus batch accumulation lr warmup epochs max_steps precision seed mode
    args = {"init": tmp_path / "model.pt", "data": tmp_path / "MRPC", "vocab": tmp_path / "vocab.txt",
            "config": "checkpoint", "out": out, "task": "mrpc", "gpus": "1", "batch": "8", "accumulation": "1",
            "lr": "5e-5", "warmup": "0.1", "epochs": "1", "steps": "-1.0", "precision": "fp32", "seed": "2",
            "mode": "train eval"}
    return list({**args, **change}.values())


@pytest.mark.slow
@pytest.mark.parametrize("script, arguments", [("run_squad.sh", squad_args), ("run_glue.sh", glue_args)])
def test_finetuning_arguments_the_entry_point_refuses_create_nothing(tmp_path, script, arguments):
    """The missing vocabulary is found by the entry point: its one line and exit status 2 come through the
    launcher unchanged, and neither the output folder nor its log is created."""
    out = tmp_path / "results" / "out"
    result = run_script(script, arguments(tmp_path, out), cwd=tmp_path)
    one_line(result, "vocab")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("script, arguments, change, fragments", [
    ("run_squad.sh", squad_args, {"mode": "trian eval"}, ["mode (argument 12)", "'trian eval'"]),
    ("run_squad.sh", squad_args, {"gpus": "eight"}, ["num_gpu (argument 7)", "'eight'"]),
    ("run_squad.sh", squad_args, {"precision": "fp61"}, ["unknown precision 'fp61'"]),
    ("run_glue.sh", glue_args, {"gpus": "0"}, ["num_gpu (argument 7)", "at least 1"]),
])
def test_arguments_only_a_script_reads_are_one_line_before_anything_runs(tmp_path, script, arguments, change,
                                                                         fragments):
    out = tmp_path / "results" / "out"
    one_line(run_script(script, arguments(tmp_path, out, **change)), *fragments)
    assert not (tmp_path / "results").exists()


STAND_IN = """import sys
args = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
if "{refuse}" in sys.argv:
    print("error: --task_name: a typo", file=sys.stderr)
    sys.exit(2)
open(args["json-summary"], "a").write("DLLL {{}}\\n")
print("eval_acc: 0.86")
"""


@pytest.mark.slow
def test_a_second_run_into_the_same_folder_appends_to_its_log_and_a_refused_one_leaves_it(tmp_path):
    """run_glue.sh with a stand-in run_glue.py (CODEDIR): a typo leaves the first run's logfile.txt, scores
    included, as it was; a run that starts adds its output after a line naming its start."""
    codedir = tmp_path / "code"
    codedir.mkdir()
    (codedir / "run_glue.py").write_text(STAND_IN.format(refuse="--task_name=mrcp"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "logfile.txt").write_text("eval_acc: 0.84 (the first run)\n")
    env = {**ENV, "CODEDIR": str(codedir)}
    one_line(run_script("run_glue.sh", glue_args(tmp_path, out, task="mrcp"), env=env), "a typo")
    assert (out / "logfile.txt").read_text() == "eval_acc: 0.84 (the first run)\n"
    result = run_script("run_glue.sh", glue_args(tmp_path, out), env=env)
    assert result.returncode == 0, result.stderr
    lines = (out / "logfile.txt").read_text().splitlines()
    assert lines[0] == "eval_acc: 0.84 (the first run)" and lines[-1] == "eval_acc: 0.86"
    assert lines[1].startswith("===== run started ") and "run_glue.py --task_name=mrpc" in lines[1]


@pytest.mark.slow
@pytest.mark.parametrize("change, fragments", [
    ({20: "/nowhere/p1"}, ["/nowhere/p1"]),  # found by run_pretraining.py
    ({8: "ture"}, ["create_logfile (argument 9)", "'ture'", "neither true nor false"]),  # by the script
])
def test_pretraining_arguments_refused_create_no_results_folder_and_no_log(pretraining, tmp_path, change,
                                                                          fragments):
    positional, env = pretraining
    for index, value in change.items():
        positional[index] = value
    result = run_script("run_pretraining.sh", positional, env=env)
    one_line(result, *fragments)
    assert not (tmp_path / "results").exists()


def has_step(summary: Path) -> bool:
    return summary.exists() and any(isinstance(r.get("step"), list) and r["step"] for r in read_log(summary))


@pytest.fixture
def started(pretraining, tmp_path):
    """start(): run_pretraining.sh in a session of its own (a terminal's job), once phase 1 logged a training
    step. A test that fails leaves no run behind: its process group is killed."""
    positional, env = pretraining
    processes = []

    def start():
        process = subprocess.Popen(["bash", str(SCRIPTS / "run_pretraining.sh"), *positional], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        processes.append(process)
        deadline = time.time() + 240
        while not has_step(tmp_path / "results" / "dllogger_phase1.json"):
            assert process.poll() is None and time.time() < deadline, process.communicate()
            time.sleep(0.2)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


@pytest.mark.slow
def test_ctrl_c_through_run_pretraining_sh_is_the_run_s_line_and_exit_130(started, tmp_path):
    process = started()
    os.killpg(process.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    for noise in NOISE:
        assert noise not in stderr, stderr[-3000:]
    assert "interrupted (Ctrl-C)" in stderr and "phase 2 not started" not in stdout
    log = (tmp_path / "results" / "job.log").read_text()
    assert log.startswith("===== run started ") and "interrupted (Ctrl-C)" in log


@pytest.mark.slow
def test_sigterm_to_run_pretraining_sh_alone_checkpoints_and_exits_143(started, tmp_path):
    """docker stop or a scheduler signals the script's own process: the launcher gets it, the workers finish
    their step and checkpoint, phase 2 does not start."""
    process = started()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    for noise in NOISE:
        assert noise not in stderr, stderr[-3000:]
    assert list((tmp_path / "results" / "checkpoints").glob("ckpt_*.pt"))
    assert not (tmp_path / "results" / "dllogger_phase2.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["full device", "read-only tensorboard folder"])
def test_a_log_that_cannot_be_written_is_one_line_from_the_entry_point(pretraining, tmp_path, case):
    """metric_logger's failures through run_pretraining.py: one line naming the file and errno's text, exit 2,
    and (refused before any work) no checkpoint."""
    if case == "read-only tensorboard folder" and permissions_are_ignored():
        pytest.skip("root writes where permissions forbid it")
    out = tmp_path / "out"
    (out / "tensorboard").mkdir(parents=True)
    summary = "/dev/full" if case == "full device" else out / "log.json"
    (out / "tensorboard").chmod(0o755 if case == "full device" else 0o555)
    try:
        flags = ["--input_dir", tmp_path / "p1", "--config_file", tmp_path / "config.json", "--output_dir", out,
                 "--json-summary", summary, "--max_seq_length", SEQ, "--max_predictions_per_seq", PREDS,
                 "--train_batch_size", 8, "--max_steps", 2, "--do_train", "--disable_progress_bar"]
        result = run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *map(str, flags)])
    finally:
        (out / "tensorboard").chmod(0o755)
    expected = {"full device": "error: /dev/full: cannot write the JSON log (No space left on device)",
                "read-only tensorboard folder": f"error: {out / 'tensorboard'}: the TensorBoard folder cannot be "
                                                "written to (Permission denied)"}[case]
    assert result.returncode == 2 and result.stderr == expected + "\n"
    assert not list(out.glob("ckpt_*.pt"))
