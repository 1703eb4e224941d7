"""scripts/convert_checkpoint.py: every direction, checked through transformers' own loading."""
import json
import os
import re
import shutil
import sys

import pytest
import safetensors.torch
import torch
import transformers

from bertrecipe.cli import convert_checkpoint
from bertrecipe.common.errors import InputError
from bertrecipe.model.bert import BertConfig, BertForPreTraining, BertForQuestionAnswering
from bertrecipe.model.weights import export_huggingface, read_weights
from helpers import REPO_ROOT, run_command

SCRIPT = REPO_ROOT / "scripts" / "convert_checkpoint.py"
TINY = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)


def convert(*args):
    return run_command([sys.executable, SCRIPT, *args])


@pytest.mark.slow
def test_round_trip_through_nvidia_and_ours_gives_the_same_transformers_model(tmp_path):
    torch.manual_seed(0)
    original = BertForPreTraining(BertConfig(**TINY)).eval()
    export_huggingface(original, tmp_path / "hf")
    steps = [("hf", "nvidia.pt", "(nvidia)"), ("nvidia.pt", "ours.pt", "(ours)"), ("ours.pt", "hf2", "(huggingface)")]
    for src, dst, kind in steps:
        result = convert(tmp_path / src, tmp_path / dst)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().endswith(kind)
    assert read_weights(tmp_path / "nvidia.pt").source_format == "nvidia"
    assert read_weights(tmp_path / "ours.pt").source_format == "ours"
    a = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    b = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf2").eval()
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids).prediction_logits, b(input_ids=ids).prediction_logits)


@pytest.mark.slow
def test_question_answering_checkpoint_exports_with_its_head(tmp_path):
    torch.manual_seed(0)
    qa = BertForQuestionAnswering(BertConfig(**TINY)).eval()
    torch.save({"model": qa.state_dict(), "config": qa.config.to_dict()}, tmp_path / "pytorch_model.bin")
    result = convert(tmp_path / "pytorch_model.bin", tmp_path / "hf_qa")
    assert result.returncode == 0, result.stderr
    loaded = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "hf_qa").eval()
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).start_logits, qa(ids)[1], atol=1e-5)


@pytest.mark.slow
def test_huggingface_encoder_converts_to_nvidia_names(tiny_bert, tmp_path):
    """A Hugging Face encoder folder (BertModel names, no heads, as MiniLM's is), with the position_ids buffer
    that transformers 4.x saved beside the weights (MiniLM's file holds it): an index, not a weight, so dropped."""
    source = tmp_path / "encoder"
    shutil.copytree(tiny_bert, source)
    weights = safetensors.torch.load_file(source / "model.safetensors")
    safetensors.torch.save_file({**weights, "embeddings.position_ids": torch.arange(512)[None]},
                                source / "model.safetensors", metadata={"format": "pt"})
    result = convert(source, tmp_path / "encoder_nvidia.pt")
    assert result.returncode == 0, result.stderr
    state = torch.load(tmp_path / "encoder_nvidia.pt", weights_only=True)["model"]
    assert "bert.pooler.dense_act.weight" in state and "bert.encoder.layer.1.intermediate.dense_act.weight" in state
    assert state["bert.embeddings.word_embeddings.weight"].shape == (8960, 32)
    # NVIDIA's modeling.py names its Linear+activation layers dense_act (the intermediate and the pooler here).
    nvidia_names = {"bert." + re.sub(r"(intermediate|pooler)\.dense\.", r"\1.dense_act.", name): tensor
                    for name, tensor in weights.items()}
    assert sorted(state) == sorted(nvidia_names)
    assert all(torch.equal(state[name], tensor) for name, tensor in nvidia_names.items())


@pytest.mark.slow
def test_source_of_no_known_kind_is_refused_with_one_line(tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello")
    result = convert(bogus, tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "notes.txt" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_nvidia_checkpoint_without_config_asks_for_one(tmp_path):
    model = BertForPreTraining(BertConfig(**TINY))
    torch.save({"model": model.state_dict()}, tmp_path / "ckpt_1.pt")
    result = convert(tmp_path / "ckpt_1.pt", tmp_path / "hf")
    assert result.returncode == 2 and "--config_file" in result.stderr
    BertConfig(**TINY).to_json_file(tmp_path / "cfg.json")
    result = convert(tmp_path / "ckpt_1.pt", tmp_path / "hf", "--config_file", tmp_path / "cfg.json")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_help_explains_the_directions():
    result = convert("--help")
    assert result.returncode == 0 and "Hugging Face directory" in result.stdout and "NVIDIA" in result.stdout


# --- Nothing lost (issue 13, item 1) --------------------------------------------------------------------------
def _our_checkpoint(folder):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY))
    folder.mkdir(exist_ok=True)
    torch.save({"model": model.state_dict(), "config": model.config.to_dict()}, folder / "ours.pt")
    return folder / "ours.pt"


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.slow
def test_export_into_an_existing_folder_writes_only_its_files_and_keeps_the_rest(tmp_path):
    source = _our_checkpoint(tmp_path / "results")
    (tmp_path / "results" / "notes.txt").write_text("mine")
    before = _snapshot(tmp_path / "results")
    result = convert(source, tmp_path / "results")
    assert result.returncode == 0, result.stderr
    after = _snapshot(tmp_path / "results")
    assert {k: after[k] for k in before} == before  # the source and the user's file untouched
    assert set(after) - set(before) == {"config.json", "model.safetensors"}
    transformers.BertForPreTraining.from_pretrained(tmp_path / "results")


@pytest.mark.slow
def test_export_refuses_to_replace_its_files_without_overwrite(tmp_path):
    source = _our_checkpoint(tmp_path / "results")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    result = convert(source, tmp_path / "hf")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--overwrite" in result.stderr
    assert (tmp_path / "hf" / "config.json").read_text() == "{}" and len(list((tmp_path / "hf").iterdir())) == 1
    result = convert(source, tmp_path / "hf", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert '"model_type": "bert"' in (tmp_path / "hf" / "config.json").read_text()


@pytest.mark.slow
def test_an_existing_destination_file_is_kept_unless_overwrite(tmp_path):
    source = _our_checkpoint(tmp_path / "results")
    (tmp_path / "nvidia.pt").write_bytes(b"precious")
    result = convert(source, tmp_path / "nvidia.pt")
    assert result.returncode == 2 and "--overwrite" in result.stderr
    assert (tmp_path / "nvidia.pt").read_bytes() == b"precious"
    assert convert(source, tmp_path / "nvidia.pt", "--overwrite").returncode == 0
    assert read_weights(tmp_path / "nvidia.pt").source_format == "nvidia"


@pytest.mark.slow
def test_destination_equal_to_the_source_is_refused(tmp_path):
    source = _our_checkpoint(tmp_path / "results")
    before = source.read_bytes()
    for dst, extra in ((source, ["--overwrite"]), (tmp_path / "results" / "." / "ours.pt", ["--overwrite"])):
        result = convert(source, dst, *extra)
        assert result.returncode == 2 and "source" in result.stderr, result.stderr
    assert source.read_bytes() == before
    export_huggingface(BertForPreTraining(BertConfig(**TINY)), tmp_path / "hf")
    weights = (tmp_path / "hf" / "model.safetensors").read_bytes()
    result = convert(tmp_path / "hf", tmp_path / "hf", "--overwrite")
    assert result.returncode == 2 and "source" in result.stderr
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == weights


@pytest.mark.slow
def test_missing_vocab_file_is_one_line_before_anything_is_written(tmp_path):
    source = _our_checkpoint(tmp_path / "results")
    result = convert(source, tmp_path / "hf", "--vocab_file", tmp_path / "nope.txt")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "nope.txt" in result.stderr
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_exported_and_converted_files_are_readable_like_any_new_file(tmp_path):
    # tempfile creates 0600 files; a model written through it must still be readable by the user's group.
    source = _our_checkpoint(tmp_path / "results")
    old = os.umask(0o022)
    try:
        assert convert(source, tmp_path / "hf").returncode == 0
        assert convert(source, tmp_path / "nvidia.pt").returncode == 0
    finally:
        os.umask(old)
    for path in (tmp_path / "hf" / "model.safetensors", tmp_path / "hf" / "config.json", tmp_path / "nvidia.pt"):
        assert path.stat().st_mode & 0o777 == 0o644, path


@pytest.mark.parametrize("flag, name", [("--vocab_file", "vocab.txt"), ("--config_file", "config.json")])
def test_an_export_file_onto_an_input_is_refused_even_with_overwrite(tmp_path, flag, name):
    """--overwrite replaces earlier exports, never the files the export reads: here the vocab or config that
    --vocab_file/--config_file take from the destination folder itself."""
    source = _our_checkpoint(tmp_path / "results")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) + "\n")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(TINY))
    before = _snapshot(tmp_path / "hf")
    with pytest.raises(InputError, match=f"DST is the same file as {flag} {re.escape(str(tmp_path / 'hf' / name))}"):
        convert_checkpoint.main([str(source), str(tmp_path / "hf"), "--overwrite", flag,
                                                          str(tmp_path / "hf" / name)])
    assert _snapshot(tmp_path / "hf") == before
