"""The Triton clients without a Triton server: bad input files, a closed port and bad flags end with exit status 2
and one line on stderr naming the file or the URL; a stand-in HTTP endpoint answers the readiness check."""
import http.server
import os
import shutil
import sys
import threading
from typing import Iterator

import pytest

from bertrecipe.cli import triton_perf_client as run_perf_client
from bertrecipe.common.errors import InputError
from bertrecipe.deploy.serving import TritonQA
from helpers import REPO_ROOT, TEST_DATA, held_ports, run_command

TRITON = REPO_ROOT / "triton"


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on: bound by this test, never listening, until the test ends."""
    with held_ports() as [port]:
        yield port


def one_line_error(script: str, *args: str) -> str:
    done = run_command([sys.executable, TRITON / script, *args], cwd=REPO_ROOT)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert done.stdout == ""
    return lines[0]


@pytest.fixture
def vocab(vocab_file):
    return str(vocab_file)


@pytest.fixture
def predict_file(tmp_path):
    """A real SQuAD file (a dev-v1.1 excerpt), copied so that nothing the client might cache lands in tests/data."""
    return str(shutil.copyfile(TEST_DATA / "squad" / "dev-v1.1.json", tmp_path / "dev.json"))


def test_client_missing_context_file_names_the_file(vocab, tmp_path, closed_port):
    missing = tmp_path / "no_such_context.txt"
    line = one_line_error("client.py", "--vocab_file", vocab, "--question", "Who?", "--context_file", str(missing),
                          "--url", f"127.0.0.1:{closed_port}")
    assert str(missing) in line and "not found" in line, line


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.slow
def test_client_with_unreachable_server_names_the_url(vocab, protocol, closed_port):
    url = f"127.0.0.1:{closed_port}"
    line = one_line_error("client.py", "--vocab_file", vocab, "--do_lower_case", "--question", "Who?", "--context",
                          "Ann went home.", "--url", url, "--protocol", protocol, "--timeout", "10")
    assert url in line and "unreachable" in line and protocol in line, line


def test_squad_client_with_unreachable_server_names_the_url(vocab, predict_file, tmp_path, closed_port):
    url = f"127.0.0.1:{closed_port}"
    line = one_line_error("run_squad_client.py", "--vocab_file", vocab, "--do_lower_case", "--predict_file",
                          predict_file, "--output_dir", str(tmp_path / "out"),
                          "--url", url, "--timeout", "10")
    assert url in line and "unreachable" in line, line
    assert not (tmp_path / "out").exists()  # a refused run creates nothing


def test_squad_client_output_dir_that_is_a_file_is_one_line(vocab, predict_file, tmp_path, closed_port):
    (tmp_path / "out").write_text("keep me")
    line = one_line_error("run_squad_client.py", "--vocab_file", vocab, "--do_lower_case", "--predict_file",
                          predict_file, "--output_dir", str(tmp_path / "out"),
                          "--url", f"127.0.0.1:{closed_port}")
    assert "--output_dir" in line and (tmp_path / "out").read_text() == "keep me", line


NO_TEXT = "holds no text (only whitespace, control or zero-width characters, which tokenize to nothing)"


@pytest.mark.parametrize("question, said", [("", "is empty"), ("  ", NO_TEXT), ("\u200b", NO_TEXT)])
def test_client_refuses_an_empty_question_before_asking_the_server(vocab, question, said, closed_port):
    line = one_line_error("client.py", "--vocab_file", vocab, "--do_lower_case", "--question", question, "--context",
                          "Ann went home.", "--url", f"127.0.0.1:{closed_port}")
    assert line == f"error: --question {said}; ask a question"


def test_squad_client_predictions_onto_the_predict_file_are_refused(vocab, predict_file, tmp_path, closed_port):
    """--predict_file out/predictions.json with --output_dir out: the predictions would replace the questions."""
    out = tmp_path / "out"
    out.mkdir()
    questions = shutil.copyfile(predict_file, out / "predictions.json")
    before = questions.read_bytes()
    line = one_line_error("run_squad_client.py", "--vocab_file", vocab, "--do_lower_case", "--predict_file",
                          str(questions), "--output_dir", str(out), "--url", f"127.0.0.1:{closed_port}")
    assert f"predictions.json (in --output_dir) is the same file as --predict_file {questions}" in line, line
    assert questions.read_bytes() == before and os.listdir(out) == ["predictions.json"]


def test_squad_client_reads_the_predict_file_once(vocab, predict_file, tmp_path, monkeypatch, capsys):
    """Its examples, feature-cache key and scoring see one read of the file (one squad.SquadFile passed on), as
    run_squad.py's do; a stand-in answers for the server."""
    import builtins
    from pathlib import Path

    import numpy as np

    from bertrecipe.cli import triton_squad_client

    class StandIn:
        def logits(self, features, batch_size):
            return np.zeros(features.input_ids.shape, np.float32), np.zeros(features.input_ids.shape, np.float32)

        def close(self):
            pass

    monkeypatch.setattr(triton_squad_client, "check_server", lambda args: None)
    monkeypatch.setattr(triton_squad_client, "client_from_args", lambda args: StandIn())
    real_open, opened = builtins.open, []

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).resolve() == Path(predict_file).resolve():
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    scores = triton_squad_client.main(["--predict_file", predict_file, "--vocab_file", vocab, "--do_lower_case",
                                       "--output_dir", str(tmp_path / "out"), "--max_seq_length", "128"])
    assert len(opened) == 1 and "exact_match" in scores and "F1" in scores


def test_perf_client_with_unreachable_server_names_the_url(vocab, tmp_path, closed_port):
    url = f"127.0.0.1:{closed_port}"
    line = one_line_error("run_perf_client.py", "--vocab_file", vocab, "--do_lower_case", "--seq_length", "64",
                          "--batch_sizes", "1", "--concurrency", "1", "2", "--url", url, "--timeout", "10",
                          "--output_dir", str(tmp_path / "perf"))
    assert url in line and "unreachable" in line, line
    assert not (tmp_path / "perf" / "perf.csv").exists()


@pytest.mark.parametrize("concurrency, problem", [
    (["65", "1"], "--concurrency 65"),  # once only the last value was held to the limit
    (["1", "100", "2"], "--concurrency 100"),
    (["0", "2"], "--concurrency 0"),
])
def test_perf_client_checks_every_concurrency_value(concurrency, problem):
    with pytest.raises(InputError, match=problem):
        run_perf_client.parse_args(["--vocab_file", "v", "--concurrency", *concurrency])


def test_perf_client_accepts_values_within_the_limits():
    args = run_perf_client.parse_args(["--vocab_file", "v", "--concurrency", "64", "1", "--batch_sizes", "1", "8"])
    assert args.concurrency == [64, 1] and args.batch_sizes == [1, 8]
    with pytest.raises(InputError, match="--batch_sizes 0"):
        run_perf_client.parse_args(["--vocab_file", "v", "--batch_sizes", "4", "0"])


def test_url_with_a_scheme_is_an_input_error():
    with pytest.raises(InputError, match="without the scheme"):
        TritonQA("http://127.0.0.1:8000", "bert")


class ReadyHandler(http.server.BaseHTTPRequestHandler):
    """Triton's HTTP readiness endpoint for one model, "bert"; every other path is 400, as Triton answers."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/v2/models/bert/ready" else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


def test_readiness_check_names_a_model_the_server_lacks():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ReadyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"127.0.0.1:{server.server_address[1]}"
    try:
        ready = TritonQA(url, "bert", timeout_s=10)
        missing = TritonQA(url, "roberta", timeout_s=10)
        try:
            ready.check_ready()
            with pytest.raises(InputError, match=f"{url}: model 'roberta' is not ready"):
                missing.check_ready()
        finally:
            ready.close()
            missing.close()
    finally:
        server.shutdown()
        server.server_close()
