"""A vocab that cannot belong to the model, or whose casing --do_lower_case contradicts, is one line naming the vocab
file (exit 2, nothing written) in every command that takes a vocab with a model: run_squad.py, run_glue.py,
inference.py (checkpoint or ONNX), triton/deployer.py, scripts/convert_checkpoint.py and the Triton clients (casing:
the model is the server's). --allow_vocab_mismatch turns the refusals a run survives into a warning. The rule
(tokenization.wordpiece.check_vocab_for_model) is checked against a plain statement of it first."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertrecipe.cli import inference, run_glue, run_squad
from bertrecipe.cli import triton_deployer as deployer
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning.staged_outputs import save_finetuned
from bertrecipe.model.bert import BertConfig, BertForQuestionAnswering
from bertrecipe.tokenization.wordpiece import SPECIAL_TOKENS, check_vocab_for_model, load_vocab, vocab_casing
from helpers import (
    QUESTIONS,
    REPO_ROOT,
    VOCAB_EXCERPT,
    WORDS,
    run_command,
    snapshot,
    tiny_args,
    tiny_squad_args,
    tiny_squad_file,
    tiny_sst2,
)


# ---------------------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------------------
def write_vocab(path: Path, tokens: int, capitalised: int = 0) -> Path:
    """The special tokens, the tiny GLUE/SQuAD words, then lower-case fillers up to `tokens` tokens; the last
    `capitalised` fillers capitalised."""
    fillers = [f"filler{i}" for i in range(tokens - len(SPECIAL_TOKENS) - len(WORDS))]
    for i in range(len(fillers) - capitalised, len(fillers)):
        fillers[i] = fillers[i].capitalize()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*SPECIAL_TOKENS, *WORDS, *fillers]) + "\n", encoding="utf-8")
    return path


def plain_size_verdict(tokens: int, embeddings: int) -> str:
    """The size rule as the issue states it: ids past the embeddings are refused; so are embeddings beyond the
    vocab padded up to a multiple of 8 (NVIDIA's 30,522 -> 30,528)."""
    if tokens > embeddings:
        return "more"
    return "fewer" if embeddings > math.ceil(tokens / 8) * 8 else "fits"


@pytest.mark.parametrize("tokens, embeddings", [
    (30522, 30522), (30522, 30528), (30522, 30529), (30522, 30521), (8960, 30522), (8960, 8960), (8960, 8961),
    (8961, 8968), (8961, 8969), (8961, 8960), (21, 21), (21, 24), (21, 25)])
def test_size_rule_equals_the_plain_statement(tmp_path, tokens, embeddings):
    vocab = load_vocab(write_vocab(tmp_path / "vocab.txt", tokens))
    verdict = plain_size_verdict(tokens, embeddings)
    if verdict == "fits":
        assert check_vocab_for_model(vocab, model_vocab_size=embeddings) == []
        return
    with pytest.raises(InputError) as refused:
        check_vocab_for_model(vocab, model_vocab_size=embeddings)
    line = str(refused.value)
    assert line.startswith(f"{vocab.path}: the vocab has {tokens:,} tokens but the model embeds ")
    assert f"{embeddings:,}" in line and "\n" not in line
    assert ("--allow_vocab_mismatch" in line) == (verdict == "fewer")  # ids without an embedding: no way on
    if verdict == "fewer":
        [warning] = check_vocab_for_model(vocab, model_vocab_size=embeddings, allow_mismatch=True)
        assert warning.startswith(f"warning: {vocab.path}: the vocab has {tokens:,} tokens")
    else:
        with pytest.raises(InputError):
            check_vocab_for_model(vocab, model_vocab_size=embeddings, allow_mismatch=True)


def excerpt_with_capitals(path: Path, every: int, limit: int = 10**9) -> Path:
    """The uncased vocab excerpt with every `every`-th word token capitalised (at most `limit` of them)."""
    tokens = VOCAB_EXCERPT.read_text(encoding="utf-8").splitlines()
    changed = 0
    for i, token in enumerate(tokens):
        if i % every == 0 and changed < limit and token.isalpha() and token.islower():
            tokens[i] = token.capitalize()
            changed += 1
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("case, expected", [
    ("Google's uncased excerpt", "uncased"),  # 6,000 tokens with letters, not one capital (its ℝ has no lower case)
    ("5 % capitalised", "cased"),
    ("2 stray capitals", "uncased"),
    ("0.5 % capitalised", None),  # neither clearly: no refusal either way
    ("21 tokens", None),  # a toy vocab says nothing
])
def test_casing_is_read_from_the_tokens(tmp_path, case, expected):
    path = {"Google's uncased excerpt": lambda: VOCAB_EXCERPT,
            "5 % capitalised": lambda: excerpt_with_capitals(tmp_path / "v.txt", 20),
            "2 stray capitals": lambda: excerpt_with_capitals(tmp_path / "v.txt", 7, limit=2),
            "0.5 % capitalised": lambda: excerpt_with_capitals(tmp_path / "v.txt", 7, limit=30),
            "21 tokens": lambda: write_vocab(tmp_path / "v.txt", 21)}[case]()
    assert vocab_casing(load_vocab(path)) == expected


# ---------------------------------------------------------------------------------------------------------
# The commands
# ---------------------------------------------------------------------------------------------------------
# name: (vocab tokens, model embeddings, capitalised fillers, --do_lower_case, message)
REFUSALS = {
    "far fewer tokens": (1021, 2048, 0, True, "the vocab has 1,021 tokens but the model embeds 2,048"),
    "more tokens": (1021, 1000, 0, True, "the vocab has 1,021 tokens but the model embeds only 1,000"),
    "uncased without --do_lower_case": (1021, 1021, 0, False, "the vocab is uncased .* add --do_lower_case"),
    "cased with --do_lower_case": (1021, 1021, 1000, True, "the vocab is cased .* remove --do_lower_case"),
}


def model_folder(root: Path, case: str) -> Path:
    """root/model: vocab.txt and a seeded tiny QA checkpoint (pytorch_model.bin, bert_config.json) of the case."""
    tokens, embeddings, capitalised, _, _ = REFUSALS[case]
    write_vocab(root / "model" / "vocab.txt", tokens, capitalised)
    config = BertConfig.from_dict({"vocab_size": embeddings, "hidden_size": 16, "num_hidden_layers": 1,
                                   "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 64})
    torch.manual_seed(0)
    save_finetuned(BertForQuestionAnswering(config), config, root / "model")
    return root / "model"


def lower_flag(case: str) -> list[str]:
    return ["--do_lower_case"] if REFUSALS[case][3] else []


def squad_argv(root: Path, case: str, *extra: str) -> list[str]:
    tiny_squad_file(root / "train.json", QUESTIONS)
    return tiny_squad_args(root, "--do_train", "--train_file", str(root / "train.json"), *lower_flag(case), *extra)


def glue_argv(root: Path, case: str, *extra: str) -> list[str]:
    tiny_sst2(root / "SST-2")
    return tiny_args(root, "--do_train", "--do_eval", *lower_flag(case), *extra)


def inference_argv(root: Path, case: str, *extra: str) -> list[str]:
    model = root / "model"
    return ["--init_checkpoint", str(model / "pytorch_model.bin"), "--vocab_file", str(model / "vocab.txt"),
            "--question", "which movie?", "--context", "the movie was good", "--max_seq_length", "32",
            *lower_flag(case), *extra]


def deployer_argv(root: Path, case: str, *extra: str) -> list[str]:
    return [*inference_argv(root, case)[:4], *lower_flag(case), "--model_repository", str(root / "repository"),
            "--max_seq_length", "32", "--doc_stride", "8", "--max_query_length", "8", *extra]


COMMANDS = {"run_squad.py": (run_squad.main, squad_argv), "run_glue.py": (run_glue.main, glue_argv),
            "inference.py": (inference.main, inference_argv), "triton/deployer.py": (deployer.main, deployer_argv)}


@pytest.mark.parametrize("case", REFUSALS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_vocab_that_is_not_the_models_is_refused_before_anything_is_written(tmp_path, command, case):
    main, argv = COMMANDS[command]
    model_folder(tmp_path, case)
    args = argv(tmp_path, case)
    before = snapshot(tmp_path)
    with pytest.raises(InputError, match=REFUSALS[case][4]) as refused:
        main(args)
    line = str(refused.value)
    assert line.startswith(f"{tmp_path / 'model' / 'vocab.txt'}: ") and "\n" not in line
    assert ("--allow_vocab_mismatch" in line) == (case != "more tokens")
    assert snapshot(tmp_path) == before  # no log, output folder, cache or model repository


@pytest.mark.parametrize("case", ["far fewer tokens", "uncased without --do_lower_case", "cased with --do_lower_case"])
@pytest.mark.parametrize("command", COMMANDS)
def test_allow_vocab_mismatch_goes_on_with_a_warning(tmp_path, capsys, command, case):
    main, argv = COMMANDS[command]
    model_folder(tmp_path, case)
    main(argv(tmp_path, case, "--allow_vocab_mismatch"))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warnings == [line for line in warnings if str(tmp_path / "model" / "vocab.txt") in line] != []
    assert all(line.endswith("going on (--allow_vocab_mismatch)") for line in warnings)


def test_a_vocab_padded_like_nvidias_config_runs_without_warning(tmp_path, capsys):
    """1,021 tokens, a model of 1,024 embeddings (the vocab padded to a multiple of 8): the model's own vocab."""
    write_vocab(tmp_path / "model" / "vocab.txt", 1021)
    config = BertConfig.from_dict({"vocab_size": 1024, "hidden_size": 16, "num_hidden_layers": 1,
                                   "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 64})
    save_finetuned(BertForQuestionAnswering(config), config, tmp_path / "model")
    inference.main(inference_argv(tmp_path, "far fewer tokens"))  # the one with --do_lower_case
    printed = capsys.readouterr()
    assert json.loads(printed.out)["windows"] == 1 and "warning" not in printed.err


def run_script(script: str, *args) -> subprocess.CompletedProcess:
    return run_command([sys.executable, REPO_ROOT / script, *args], cwd=REPO_ROOT)


@pytest.mark.slow
def test_command_lines_say_it_in_one_line_with_exit_2(tmp_path):
    """inference.py, convert_checkpoint.py (the vocab it would place beside the model) and the Triton client (casing:
    refused before the server is asked anything)."""
    model = model_folder(tmp_path, "far fewer tokens")
    vocab = model / "vocab.txt"
    for script, args in (
            ("inference.py", inference_argv(tmp_path, "far fewer tokens")),
            ("scripts/convert_checkpoint.py", [model / "pytorch_model.bin", tmp_path / "hf", "--vocab_file", vocab]),
            ("triton/client.py", ["--vocab_file", vocab, "--question", "who?", "--context", "the movie",
                                  "--url", "127.0.0.1:9"])):
        done = run_script(script, *args)
        assert done.returncode == 2, (script, done.stderr[-2000:])
        [line] = done.stderr.splitlines()
        assert line.startswith(f"error: {vocab}: the vocab ") and "--allow_vocab_mismatch" in line, (script, line)
    assert not (tmp_path / "hf").exists()
