"""A real Triton server (pytriton's bundled tritonserver) serving the ONNX export of a tiny seeded BERT with a QA
head (`tiny_bert`: the serving path does not depend on pretrained weights) on 127.0.0.1, run by .venv-triton's
interpreter (numpy 1; scripts/test.sh makes it) while the clients run here: SQuAD predictions on a dev-v1.1
excerpt through it equal run_squad.py's, one question through client.py equals inference.py's answer, oversized
requests are refused, the perf client writes its CSV and PNG, and SIGTERM stops it in bounded time. Under NumPy 2
(this environment) server.py refuses to start."""
import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertrecipe.cli import triton_perf_client as run_perf_client
from bertrecipe.cli import triton_squad_client as run_squad_client
from bertrecipe.deploy.serving import TritonQA
from bertrecipe.finetuning import squad_answers
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.finetuning.question_answering import answer_questions, load_qa_model
from bertrecipe.training.metric_logger import read_log
from helpers import ENV, REPO_ROOT, SEQ, WINDOW, copy_squad_excerpt, deploy, held_ports, make_qa_checkpoint, run_command

SERVER = REPO_ROOT / "triton" / "server.py"
SERVER_PYTHON = REPO_ROOT / ".venv-triton" / "bin" / "python"  # bash triton/setup_server_env.sh
SERVER_ENV = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}  # its own environment, nothing of this one
SHORT = ["--max_seq_length", str(SEQ), "--doc_stride", "64", "--max_query_length", "32"]
START_SECONDS, STOP_SECONDS = 240, 60


def test_server_refuses_to_start_under_numpy_2(tmp_path):
    import numpy as np

    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip(f"this environment has NumPy {np.__version__}: the refusal concerns NumPy 2")
    model = tmp_path / "model.onnx"
    model.write_bytes(b"never read: the server refuses before loading it")
    with held_ports(3) as [http, grpc, metrics]:
        done = subprocess.run([sys.executable, str(SERVER), "--model_file", str(model), "--http_port", str(http),
                               "--grpc_port", str(grpc), "--metrics_port", str(metrics)],
                              env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.splitlines()
    assert line.startswith("error: NumPy 2") and "pytriton 0.7.0's bundled Python backend" in line, line
    assert ".venv-triton/bin/python" in line and "bash triton/setup_server_env.sh" in line, line
    assert done.stdout == "" and not listening_addresses(http)


@pytest.fixture(scope="module")
def served(tiny_bert, tmp_path_factory):
    if not SERVER_PYTHON.is_file():
        pytest.skip(f"{SERVER_PYTHON} does not exist: `bash triton/setup_server_env.sh` (or scripts/test.sh) "
                    "creates the server's environment")
    root = tmp_path_factory.mktemp("serve")
    checkpoint = make_qa_checkpoint(tiny_bert, root / "finetuned")
    predict = copy_squad_excerpt(root / "predict.json")
    setup = {"checkpoint": checkpoint, "predict": predict, "vocab": tiny_bert / "vocab.txt"}
    deploy(setup, root / "repo", "--format", "onnx")
    ports = contextlib.ExitStack()
    http, grpc, metrics = ports.enter_context(held_ports(3))  # held until the server listens on them
    log = open(root / "server.log", "w")
    process = subprocess.Popen(
        [str(SERVER_PYTHON), str(SERVER), "--model_file", str(root / "repo/bert/1/model.onnx"),
         "--http_port", str(http), "--grpc_port", str(grpc), "--metrics_port", str(metrics), "--max_batch_size", "8",
         "--max_seq_length", str(SEQ)], env=SERVER_ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    qa = TritonQA(f"127.0.0.1:{http}", "bert")
    deadline = time.time() + START_SECONDS
    try:
        while True:
            assert process.poll() is None, (root / "server.log").read_text()[-4000:]
            assert time.time() < deadline, "server not ready in time:\n" + (root / "server.log").read_text()[-4000:]
            try:
                if qa.client.is_model_ready("bert"):
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(1)
        ports.close()
        yield {**setup, "root": root, "process": process, "http": http, "grpc": grpc, "metrics": metrics}
    finally:
        ports.close()
        qa.close()
        if process.poll() is None:  # a failed test left it running: stop it as a user would, then by force
            process.send_signal(signal.SIGTERM)  # pytriton then stops tritonserver and its backend stubs
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        log.close()


# 127.0.0.1, ::ffff:127.0.0.1 and ::1 as /proc/net/tcp{,6} write them (32-bit words, little-endian hex).
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port`, from /proc/net/tcp{,6} (no traffic sent)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.slow
def test_server_listens_on_loopback_only(served):
    for port in (served["http"], served["grpc"], served["metrics"]):
        addresses = listening_addresses(port)
        assert addresses and addresses <= LOOPBACK, (port, addresses)


@pytest.mark.slow
def test_squad_predictions_through_triton_equal_run_squad(served):
    out_pt = served["root"] / "run_squad"
    done = run_command([sys.executable, str(REPO_ROOT / "run_squad.py"), "--init_checkpoint",
                           str(served["checkpoint"]), "--vocab_file", str(served["vocab"]), "--do_lower_case",
                           "--predict_file", str(served["predict"]), "--output_dir", str(out_pt), "--do_predict",
                           "--do_eval", "--skip_cache", "--disable_progress_bar", "--json-summary",
                           str(out_pt / "log.json"), *SHORT])
    assert done.returncode == 0, done.stderr[-3000:]
    out_triton = served["root"] / "triton_client"
    scores = run_squad_client.main(["--url", f"127.0.0.1:{served['http']}", "--predict_file", str(served["predict"]),
                                    "--vocab_file", str(served["vocab"]), "--do_lower_case", "--output_dir",
                                    str(out_triton), "--skip_cache", "--batch_size", "8", *SHORT])
    expected = json.loads((out_pt / "predictions.json").read_text())
    got = json.loads((out_triton / "predictions.json").read_text())
    assert got == expected and sum(bool(answer) for answer in got.values()) >= len(got) // 2
    assert (out_triton / "nbest_predictions.json").is_file()
    final = next(r for r in read_log(out_pt / "log.json") if r["type"] == "LOG" and r["step"] == [])["data"]
    assert scores["exact_match"] == pytest.approx(final["exact_match"])
    assert scores["F1"] == pytest.approx(final["F1"])


@pytest.mark.slow
def test_one_question_over_grpc_gets_inference_py_answer(served):
    tokenizer = load_tokenizer(served["vocab"], True)
    context = json.loads(served["predict"].read_text())["data"][0]["paragraphs"][0]["context"]
    question = "Which team won Super Bowl 50?"
    model = load_qa_model(served["checkpoint"], None, tokenizer.vocab, SEQ)
    [expected] = answer_questions(model, tokenizer, [question], context, WINDOW, squad_answers.AnswerSettings())
    done = subprocess.run([sys.executable, str(REPO_ROOT / "triton" / "client.py"), "--url",
                           f"127.0.0.1:{served['grpc']}", "--protocol", "grpc", "--vocab_file", str(served["vocab"]),
                           "--do_lower_case", "--question", question, "--context", context, *SHORT],
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["answer"] == expected["answer"] and got["answer"]
    assert [n["text"] for n in got["nbest"]] == [n["text"] for n in expected["nbest"]]


@pytest.mark.slow
@pytest.mark.parametrize("rows, length", [(9, 32), (1, SEQ + 1)])
def test_requests_beyond_the_bounds_are_refused(served, rows, length):
    import numpy as np
    from tritonclient.utils import InferenceServerException

    qa = TritonQA(f"127.0.0.1:{served['http']}", "bert", timeout_s=60)
    try:
        with pytest.raises(InferenceServerException):
            qa.infer([np.ones((rows, length), dtype=np.int64)] * 3)
        start, _ = qa.infer([np.ones((2, 16), dtype=np.int64)] * 3)  # the server still answers
        assert start.shape == (2, 16)
    finally:
        qa.close()


@pytest.mark.slow
def test_perf_client_writes_percentiles_and_throughput(served, capsys):
    out = served["root"] / "perf"
    rows = run_perf_client.main(["--url", f"127.0.0.1:{served['http']}", "--vocab_file", str(served["vocab"]),
                                 "--do_lower_case", "--seq_length", str(SEQ), "--batch_sizes", "1", "4",
                                 "--concurrency", "1", "2", "--requests", "6", "--max_seconds", "60",
                                 "--output_dir", str(out)])
    with open(out / "perf.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["batch_size"], r["concurrency"]) for r in table] == [("1", "1"), ("4", "1"), ("1", "2"), ("4", "2")]
    for row in table:
        assert int(row["requests"]) == 6
        assert 0 < float(row["p50_ms"]) <= float(row["p90_ms"]) <= float(row["p99_ms"])
        assert float(row["sequences_per_second"]) > 0
    assert (out / "perf.png").stat().st_size > 10_000
    print("\n" + (out / "perf.csv").read_text())
    assert len(rows) == 4


@pytest.mark.slow
def test_sigterm_stops_the_server_within_the_time_bound(served):
    process = served["process"]
    began = time.time()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=STOP_SECONDS)
    print(f"server stopped {time.time() - began:.1f} s after SIGTERM")
    time.sleep(1)
    assert not listening_addresses(served["http"]) and not listening_addresses(served["grpc"])
