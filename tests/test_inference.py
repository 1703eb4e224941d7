"""inference.py mechanics with a tiny seeded BERT laid out as a pretrained download (`tiny_bert`: config.json,
safetensors without a QA head, so the answers are not judged, only their form) and with a stand-in model whose
logits are known."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertrecipe.cli import inference
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import model_loading, question_answering, squad, squad_answers
from bertrecipe.finetuning.question_answering import answer_about_context
from helpers import TEST_DATA, run_command

REPO = Path(__file__).resolve().parents[1]

CONTEXT = (
    "Super Bowl 50 was an American football game to determine the champion of the National Football League "
    "(NFL) for the 2015 season. The American Football Conference (AFC) champion Denver Broncos defeated the "
    "National Football Conference (NFC) champion Carolina Panthers 24–10 to earn their third Super Bowl title."
)


@pytest.fixture(scope="module")
def encoder(tiny_bert):
    """The encoder folder, its tokenizer and a QA model loaded from it with a seeded (untrained) QA head."""
    folder = tiny_bert
    tokenizer = model_loading.load_tokenizer(folder / "vocab.txt", do_lower_case=True)
    torch.manual_seed(0)
    model = question_answering.load_qa_model(folder, None, tokenizer.vocab, 384)
    return folder, tokenizer, model


def test_answers_are_spans_of_the_context_with_an_nbest_list(encoder):
    _, tokenizer, model = encoder
    [result] = question_answering.answer_questions(model, tokenizer, ["Who won Super Bowl 50?"], CONTEXT)
    assert set(result) == {"question", "answer", "nbest", "windows"}
    assert result["windows"] == 1
    texts = [entry["text"] for entry in result["nbest"]]
    assert result["answer"] == texts[0] and result["answer"] in CONTEXT
    assert all(text in CONTEXT for text in texts) and len(set(texts)) == len(texts) == 20
    probabilities = [entry["probability"] for entry in result["nbest"]]
    assert probabilities == sorted(probabilities, reverse=True) and abs(sum(probabilities) - 1) < 1e-9
    json.dumps(result)  # plain JSON types


def test_bf16_and_v2_give_the_same_form(encoder):
    _, tokenizer, model = encoder
    for threshold, empty in ((1e9, False), (-1e9, True)):  # null odds above the threshold: no answer
        answer = squad_answers.AnswerSettings(version_2_with_negative=True, null_score_diff_threshold=threshold)
        results = question_answering.answer_questions(
            model, tokenizer, ["Who won?", "When?"], CONTEXT, answer=answer, precision="bf16"
        )
        for result in results:
            assert isinstance(result["null_odds"], float)
            assert result["answer"] in CONTEXT and (result["answer"] == "") == empty
            assert "" in [entry["text"] for entry in result["nbest"]]


class PointAtWord(torch.nn.Module):
    """A stand-in QA model whose start and end logits peak on one token id wherever it occurs."""

    def __init__(self, token_id):
        super().__init__()
        self.token_id = token_id
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the module a device

    def forward(self, input_ids, token_type_ids, attention_mask):
        hit = (input_ids == self.token_id).float() * 10 + self.anchor
        return None, hit, hit


def test_long_context_is_covered_by_sliding_windows(encoder):
    _, tokenizer, _ = encoder
    book = (TEST_DATA / "books" / "pg11.txt").read_text(encoding="utf-8")  # Alice's first chapter, 2,180 words
    context = " ".join(book.split()[:3000]) + " The answer is Madrid ."
    window = squad.WindowSettings(max_seq_length=128, doc_stride=64, max_query_length=16)
    [madrid] = tokenizer.encode("madrid")  # one piece in the uncased vocab (excerpt), absent from the book
    [result] = question_answering.answer_questions(PointAtWord(madrid), tokenizer, ["Where?"], context, window)
    pieces = len(tokenizer.encode(context))
    assert result["windows"] >= pieces // 64  # far beyond one window (NVIDIA's would truncate)
    assert result["answer"] == "Madrid"  # found in the last window


@pytest.mark.slow
def test_cli_reads_questions_from_stdin_and_a_context_file(encoder, tmp_path):
    folder, _, _ = encoder
    (tmp_path / "context.txt").write_text(CONTEXT * 8, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(REPO / "inference.py"), "--init_checkpoint", str(folder), "--vocab_file",
         str(folder / "vocab.txt"), "--do_lower_case", "--context_file", str(tmp_path / "context.txt"),
         "--max_seq_length", "128", "--doc_stride", "64", "--n_best_size", "5"],
        input="Who won Super Bowl 50?\n\nWhich season?\n", capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["question"] for line in lines] == ["Who won Super Bowl 50?", "Which season?"]
    assert all(line["windows"] > 1 and line["answer"] in CONTEXT * 8 for line in lines)
    assert "untrained" in done.stderr  # the encoder folder has no QA head, and says so


def run_inference(*args):
    return run_command([sys.executable, REPO / "inference.py", *args], cwd=REPO)


@pytest.mark.slow
def test_cli_bad_inputs_exit_2_naming_the_file(encoder, tmp_path):
    folder, _, _ = encoder
    missing = run_inference("--init_checkpoint", tmp_path / "nothing", "--vocab_file", folder / "vocab.txt",
                            "--do_lower_case", "--question", "q", "--context", "c")
    assert missing.returncode == 2 and str(tmp_path / "nothing") in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "wrong_config.json").write_text(json.dumps({**config, "hidden_size": 768}))
    mismatch = run_inference("--init_checkpoint", folder, "--config_file", tmp_path / "wrong_config.json",
                             "--vocab_file", folder / "vocab.txt", "--do_lower_case", "--question", "q",
                             "--context", "c")
    assert mismatch.returncode == 2 and str(folder) in mismatch.stderr and "shape" in mismatch.stderr
    assert len(mismatch.stderr.strip().splitlines()) == 1


def test_context_file_and_vocab_errors_are_input_errors(encoder, tmp_path):
    folder, tokenizer, _ = encoder
    with pytest.raises(InputError, match="context file not found"):
        inference.parse_args(["--init_checkpoint", str(folder), "--vocab_file", "v", "--context_file",
                              str(tmp_path / "absent.txt")])
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        inference.parse_args(["--init_checkpoint", str(folder), "--vocab_file", "v", "--context_file",
                              str(tmp_path / "latin1.txt")])
    with pytest.raises(InputError, match="vocab file not found"):
        model_loading.load_tokenizer(tmp_path / "vocab.txt", True)
    with pytest.raises(InputError, match="max_position_embeddings"):
        question_answering.load_qa_model(folder, None, tokenizer.vocab, 1024)  # the config has 512 positions


def test_predict_logits_batches_agree_with_one_pass(encoder):
    _, tokenizer, model = encoder
    words, _ = squad.split_context(CONTEXT * 3)
    examples = [squad.SquadExample("0", "who?", words, [])]
    features = squad.convert_examples_to_features(examples, tokenizer, squad.WindowSettings(64, 32, 8))
    assert len(features) > 3
    one = question_answering.predict_logits(model, features, batch_size=len(features))
    batched = question_answering.predict_logits(model, features, batch_size=2)
    for a, b in zip(one, batched, strict=True):
        assert a.shape == features.input_ids.shape and a.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_fp16_on_cpu_answers_like_fp32(encoder):
    # --fp16 runs on a CPU as in training (fp16 autocast); the fp32 answer must survive its rounding.
    _, tokenizer, model = encoder
    [fp32] = question_answering.answer_questions(model, tokenizer, ["Who won Super Bowl 50?"], CONTEXT)
    [fp16] = question_answering.answer_questions(model, tokenizer, ["Who won Super Bowl 50?"], CONTEXT,
                                                 precision="fp16")
    assert fp16["answer"] == fp32["answer"] and fp16["answer"] in CONTEXT


@pytest.mark.parametrize("question", ["", " ", "\t \u3000", "\u200b\u200d", "\x00\x07 "])
def test_an_empty_question_is_refused(encoder, question):
    """It used to be answered: "[CLS] [SEP] context [SEP]" gives an answer to nothing."""
    folder, tokenizer, model = encoder
    refused = r"--question (is empty|holds no text .*which tokenize to nothing\)); ask a question"
    with pytest.raises(InputError, match=refused):
        inference.parse_args(["--init_checkpoint", str(folder), "--vocab_file", str(folder / "vocab.txt"),
                              "--question", question, "--context", CONTEXT])
    with pytest.raises(InputError, match="the question (is|holds)"):  # the library too (the Triton client shares it)
        question_answering.answer_questions(model, tokenizer, ["Who won?", question], CONTEXT)


@pytest.mark.slow
def test_output_sent_into_an_input_is_refused_and_the_input_kept(encoder, tmp_path):
    """`inference.py ... >> context.txt` would append the answer to the context (`>` has emptied it already)."""
    folder, _, _ = encoder
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    with open(context, "a", encoding="utf-8") as stdout:
        done = subprocess.run([sys.executable, str(REPO / "inference.py"), "--init_checkpoint", str(folder),
                               "--vocab_file", str(folder / "vocab.txt"), "--do_lower_case", "--question", "Who won?",
                               "--context_file", str(context)],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: /dev/stdout: the standard output is the same file as --context_file {context}; writing it would "
        "destroy the input: send the output (>) to another file"]
    assert context.read_text(encoding="utf-8") == CONTEXT


def test_answers_on_a_long_context_equal_those_before_the_linear_memory_change(encoder):
    """Golden values computed with the windows x pieces max-context table (before ab00c72) on 6,000 words of the
    books, 269 windows, seeded random logits: max context decides which spans may answer."""
    _, tokenizer, _ = encoder
    book = " ".join(p.read_text(encoding="utf-8") for p in sorted((TEST_DATA / "books").glob("*.txt"))).split()
    context = " ".join((book * 2)[:6000])

    def logits(features):
        rng = np.random.default_rng(7)
        shape = features.input_ids.shape
        return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)

    results = answer_about_context(logits, tokenizer, ["Who was late?", "What did Alice see?"], context,
                                   squad.WindowSettings(128, 32, 16))
    assert [(r["windows"], r["answer"], [e["text"] for e in r["nbest"][:5]]) for r in results] == [
        (269, "saying to herself, in a dreamy",
         ["saying to herself, in a dreamy", "on saying to herself, in a dreamy",
          "her lessons in the schoolroom, and though this was not a VERY good",
          "t-hole under the hedge. In another moment down went Alice after it,",
          "a large rabbit-hole under the hedge. In another moment down went Alice after it,"]),
        (269, "to bad taste. Heavy bands of astrakhan were",
         ["to bad taste. Heavy bands of astrakhan were", "good enough to chronicle one or two of my tri",
          "recent services to one of the royal houses of Europe have shown that you are one who may safely be trusted "
          "with matters which are of", "! Alice opened the door and found that it", "though this was not a"])]
    assert [round(r["nbest"][0]["probability"], 6) for r in results] == [0.108775, 0.108674]


# A command through run_cli whose output's reader goes away: `many` prints more than a pipe holds, `buffered` still
# holds its lines in Python's buffer when main() returns (after stdin closes), `other pipe` breaks a pipe of its own.
BROKEN_PIPE_COMMAND = """
import os, sys
from bertrecipe.cli.command_line import run_cli

def main():
    if sys.argv[1] == "many":
        for i in range(100_000):
            print(f"line {i}")
    elif sys.argv[1] == "buffered":
        print("one")
        print("two")
        sys.stdin.read()
    else:
        reader, writer = os.pipe()
        os.close(reader)
        os.write(writer, b"nobody reads this")

run_cli(main)
"""
SIGPIPE_STATUS = 128 + signal.SIGPIPE  # 141, what a shell shows for `yes | head -1`'s yes


def start_with_pipes(command):
    # Buffered, as a command's output into a pipe is unless PYTHONUNBUFFERED is set (it may be where tests run).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)})


def finish(process):
    """Closes stdin, returns (exit status, stderr); stdout was closed by the test (the reader went away)."""
    process.stdin.close()
    stderr = process.stderr.read()
    return process.wait(timeout=120), stderr


def test_run_cli_ends_quietly_with_141_when_the_reader_of_its_output_goes_away():
    many = start_with_pipes([sys.executable, "-c", BROKEN_PIPE_COMMAND, "many"])
    assert many.stdout.readline() == "line 0\n"
    many.stdout.close()  # as `| head -1` does
    assert finish(many) == (SIGPIPE_STATUS, "")
    # The lines were still in the buffer when main() returned: without run_cli's flush they met the closed pipe at
    # exit, in "Exception ignored ... BrokenPipeError" and exit status 120.
    buffered = start_with_pipes([sys.executable, "-c", BROKEN_PIPE_COMMAND, "buffered"])
    buffered.stdout.close()
    assert finish(buffered) == (SIGPIPE_STATUS, "")
    # A broken pipe that is not the output's (a socket, a pipe of its own) is a real error: one line, exit 2.
    other = start_with_pipes([sys.executable, "-c", BROKEN_PIPE_COMMAND, "other pipe"])
    status, stderr = finish(other)
    assert other.stdout.read() == "" and (status, stderr) == (2, "error: Broken pipe\n")


@pytest.mark.slow
def test_inference_piped_into_a_reader_that_leaves_ends_quietly_with_141(encoder):
    """`inference.py ... | head -1` with questions on stdin: the second answer meets the closed pipe."""
    folder, _, _ = encoder
    process = start_with_pipes([sys.executable, str(REPO / "inference.py"), "--init_checkpoint", str(folder),
                                "--vocab_file", str(folder / "vocab.txt"), "--do_lower_case", "--context", CONTEXT,
                                "--max_seq_length", "128", "--n_best_size", "5"])
    process.stdin.write("Who won Super Bowl 50?\n")
    process.stdin.flush()
    assert json.loads(process.stdout.readline())["question"] == "Who won Super Bowl 50?"
    process.stdout.close()
    process.stdin.write("Which season?\n")
    status, stderr = finish(process)
    assert status == SIGPIPE_STATUS
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr
    assert "untrained" in stderr  # its own warning (the encoder has no QA head) still reaches the console
