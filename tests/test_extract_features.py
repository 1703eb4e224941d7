"""extract_features.py against its oracles: transformers' hidden states of the same weights (BERT and ModernBERT),
transformers' tokenizer for the tokens and the pair truncation, and Google's JSON-lines layout (keys in its order,
values as Python's round(x, 6)). Bad input: one line, exit 2, nothing written."""
import json
import sys

import pytest
import torch

from helpers import REPO_ROOT, run_command, tiny_modern_folder

INPUT_LINES = ["The quick brown fox jumped over the lazy dog.",
               "who was the first president ||| george washington was the first president of the united states",
               "Hello, world!"]


def extract(tmp_path, model, *extra, lines=INPUT_LINES, name="out.jsonl"):
    source = tmp_path / "input.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / name
    result = run_command([sys.executable, REPO_ROOT / "extract_features.py", "--input_file", source, "--output_file",
                          out, "--init_checkpoint", model, "--vocab_file", model / "vocab.txt", "--no_cuda", *extra])
    return result, out


def oracle(folder, model_class, lines, max_length, uncased=True):
    """transformers' tokens and hidden states of every line (a pair where ' ||| ' splits it)."""
    import transformers

    tokenizer = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=uncased)
    model = model_class.from_pretrained(folder).eval()
    found = []
    for line in lines:
        texts = line.split(" ||| ")
        encoded = tokenizer(*texts, truncation="longest_first", max_length=max_length, return_tensors="pt")
        if "ModernBert" in model_class.__name__:
            encoded.pop("token_type_ids")
        with torch.no_grad():
            hidden = model(**encoded, output_hidden_states=True).hidden_states
        found.append((tokenizer.convert_ids_to_tokens(encoded["input_ids"][0]), hidden))
    return found


def test_the_lines_are_google_s_and_the_values_transformers_hidden_states(tiny_bert, tmp_path):
    import transformers

    result, out = extract(tmp_path, tiny_bert, "--layers", "-1,-2,0", "--max_seq_length", "16")
    assert result.returncode == 0, result.stderr
    text = out.read_text(encoding="utf-8")
    assert text.startswith('{"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [')
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1, 2]
    expected = oracle(tiny_bert, transformers.BertModel, INPUT_LINES, 16)
    for record, (tokens, hidden) in zip(records, expected, strict=True):
        assert [f["token"] for f in record["features"]] == tokens  # the pair cut longest-first to 16
        for position, feature in enumerate(record["features"]):
            assert [layer["index"] for layer in feature["layers"]] == [-1, -2, 0]
            # Google's index i is hidden_states[i + 1] (0 the first layer), a negative one hidden_states[i]
            for layer, states in zip(feature["layers"], (hidden[-1], hidden[-2], hidden[1]), strict=True):
                reference = states[0, position].tolist()
                assert layer["values"] == pytest.approx(reference, abs=2e-6)
                assert all(value == round(value, 6) for value in layer["values"])
    assert len(records[1]["features"]) == 16


def test_the_modern_family_gives_transformers_hidden_states_too(tiny_bert, tmp_path):
    import transformers

    folder = tiny_modern_folder(tmp_path / "modern", tiny_bert / "vocab.txt")
    result, out = extract(tmp_path, folder, "--layers", "-1,1", "--do_lower_case")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    expected = oracle(folder, transformers.ModernBertModel, INPUT_LINES, 128)
    for record, (tokens, hidden) in zip(records, expected, strict=True):
        assert [f["token"] for f in record["features"]] == tokens
        for position, feature in enumerate(record["features"]):
            last, second = feature["layers"]
            assert last["values"] == pytest.approx(hidden[-1][0, position].tolist(), abs=2e-6)
            assert second["values"] == pytest.approx(hidden[2][0, position].tolist(), abs=2e-6)


@pytest.mark.parametrize("flags, problem", [
    (["--layers", "2"], "--layers 2: the model has 2 layers, so an index is -2..1"),
    (["--layers", "-3"], "--layers -3: the model has 2 layers"),
    (["--layers", "-1,x"], "--layers '-1,x': comma-separated whole numbers"),
    (["--max_seq_length", "4"], "--max_seq_length 4: too short to hold a token of each text"),
    (["--no-do_lower_case"], "vocab"),
])
def test_bad_input_is_one_line_and_writes_nothing(tiny_bert, tmp_path, flags, problem):
    result, out = extract(tmp_path, tiny_bert, *flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and problem in lines[0], result.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["input.txt"]


def test_the_output_may_not_be_the_input(tiny_bert, tmp_path):
    result, _ = extract(tmp_path, tiny_bert, name="input.txt")
    assert result.returncode == 2 and "--output_file" in result.stderr and "--input_file" in result.stderr
    assert (tmp_path / "input.txt").read_text(encoding="utf-8") == "\n".join(INPUT_LINES) + "\n"
