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
from bertrecipe.dataprep.vocab_training import train_bpe
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.model.bert import BertConfig, BertForPreTraining, BertForQuestionAnswering
from bertrecipe.model.modern import ModernBertForMaskedLM
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.model.weights import export_huggingface, read_weights
from bertrecipe.tokenization.vocab_files import load_vocab_file
from bertrecipe.tokenization.wordpiece import SPECIAL_TOKENS
from helpers import REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, run_command

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


# --- Issue 48, item 6: a converted folder is one transformers' AutoTokenizer and fill-mask pipeline can use ----------
BOOKS = [TEST_DATA / "books" / "pg11.txt", TEST_DATA / "books" / "pg1661.txt"]
SENTENCE = "Alice said: 'Héllo, Mr. HOLMES!' and was beginning to get very tired of sitting by her sister."
MASKED = "Alice was beginning to get very {mask} of sitting by her sister on the bank."
TINY_MODERN_SIZES = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
                         local_attention=8, max_position_embeddings=96, pad_token_id=0)


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory):
    """A vocab of each kind: the uncased vocab.txt excerpt, a cased WordPiece tokenizer.json of it (as transformers
    saves a cased BERT's) and a byte-level BPE tokenizer.json trained on the books."""
    root = tmp_path_factory.mktemp("vocabs")
    (root / "source").mkdir()
    shutil.copyfile(VOCAB_EXCERPT, root / "source" / "vocab.txt")
    transformers.BertTokenizerFast.from_pretrained(root / "source", do_lower_case=False).save_pretrained(root / "cased")
    return {"vocab.txt": VOCAB_EXCERPT, "wordpiece tokenizer.json": root / "cased" / "tokenizer.json",
            "bpe tokenizer.json": train_bpe(BOOKS, root / "bpe" / "tokenizer.json", 600)}


def spread_model(family, vocab_size):
    """A tiny model of the family with weights far from their init, so that its top-5 predictions are far apart."""
    torch.manual_seed(0)
    if family == "bert":
        model = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": vocab_size, "max_position_embeddings": 96}))
    else:
        model = ModernBertForMaskedLM(ModernBertConfig(vocab_size=vocab_size, **TINY_MODERN_SIZES))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("family, kind, lower_case", [
    ("bert", "vocab.txt", True), ("bert", "wordpiece tokenizer.json", False), ("bert", "bpe tokenizer.json", None),
    ("modernbert", "bpe tokenizer.json", None), ("modernbert", "vocab.txt", True)])
def test_a_converted_folder_gives_transformers_our_tokenizer_and_our_fill_mask_top_5(tmp_path, vocab_files, family,
                                                                                       kind, lower_case):
    """A ModernBERT folder carried tokenizer.json and nothing naming its mask token: AutoTokenizer's mask_token was
    None and pipeline("fill-mask") failed. Now AutoTokenizer has our special tokens, ids, casing and length, and the
    pipeline's top 5 are our model's."""
    vocab_file = vocab_files[kind]
    vocab = load_vocab_file(vocab_file)
    model = spread_model(family, len(vocab))
    torch.save({"model": model.state_dict(), "config": model.config.to_dict()}, tmp_path / "ours.pt")
    convert_checkpoint.main([str(tmp_path / "ours.pt"), str(tmp_path / "hf"), "--vocab_file", str(vocab_file)])
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    roles = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]", "unk": "[UNK]"}
    assert {role: getattr(theirs, f"{role}_token") for role in roles} == roles
    assert {role: getattr(theirs, f"{role}_token_id") for role in roles} == {r: vocab.id(t) for r, t in roles.items()}
    assert theirs.model_max_length == 96
    ours = load_tokenizer(vocab_file, bool(lower_case))
    assert theirs(SENTENCE)["input_ids"] == [vocab.id("[CLS]"), *ours.encode_lines([SENTENCE])[0].tolist(),
                                                 vocab.id("[SEP]")]
    settings = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert settings.get("do_lower_case") is lower_case
    if kind == "vocab.txt":  # its tokenizer.json, written beside it, is the same tokenizer to the recipe
        written = load_vocab_file(tmp_path / "hf" / "tokenizer.json")
        assert (written.sha256, written.lower_case) == (vocab.sha256, lower_case)
    text = MASKED.format(mask=theirs.mask_token)
    predicted = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), top_k=5)(text)
    ids = torch.tensor([theirs(text)["input_ids"]])
    with torch.no_grad():
        logits = model(ids, torch.zeros_like(ids), torch.ones_like(ids),
                       predict_positions=ids == vocab.id("[MASK]")).prediction_logits
    assert [guess["token"] for guess in predicted] == logits[0].topk(5).indices.tolist()
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["pad_token_id"] == vocab.id("[PAD]")
    if family == "modernbert":  # transformers' defaults would be the released tokenizer's ids, outside this vocab
        assert (written["cls_token_id"], written["eos_token_id"]) == (vocab.id("[CLS]"), vocab.id("[SEP]"))


@pytest.mark.slow
def test_a_vocab_whose_tokens_do_not_tell_its_casing_needs_the_flag_and_nothing_is_written_first(tmp_path):
    source = _our_checkpoint(tmp_path / "results")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{token}\n" for token in [*SPECIAL_TOKENS, *(f"tok{i}" for i in range(96))]))
    result = convert(source, tmp_path / "hf", "--vocab_file", vocab)
    assert result.returncode == 2 and not (tmp_path / "hf").exists()
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {vocab}: ") and "--do_lower_case or --no-do_lower_case" in line
    assert convert(source, tmp_path / "hf", "--vocab_file", vocab, "--no-do_lower_case").returncode == 0
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").tokenize("Tok7") == ["[UNK]"]  # kept cased


def test_do_lower_case_with_a_bpe_tokenizer_is_a_warning_that_it_does_not_apply(tmp_path, vocab_files, capsys):
    bpe = vocab_files["bpe tokenizer.json"]
    model = spread_model("modernbert", len(load_vocab_file(bpe)))
    torch.save({"model": model.state_dict(), "config": model.config.to_dict()}, tmp_path / "ours.pt")
    convert_checkpoint.main([str(tmp_path / "ours.pt"), str(tmp_path / "hf"), "--vocab_file", str(bpe),
                             "--do_lower_case"])
    assert f"warning: {bpe}: --do_lower_case does not apply" in capsys.readouterr().err
    assert "do_lower_case" not in json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())


@pytest.mark.slow
def test_the_tokenizer_files_are_the_exports_own_kept_unless_overwrite_and_nothing_else_is_touched(tmp_path):
    (tmp_path / "results").mkdir()
    model = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": len(load_vocab_file(VOCAB_EXCERPT))}))
    source = tmp_path / "results" / "ours.pt"
    torch.save({"model": model.state_dict(), "config": model.config.to_dict()}, source)
    (tmp_path / "results" / "notes.txt").write_text("mine")
    before = _snapshot(tmp_path / "results")
    result = convert(source, tmp_path / "results", "--vocab_file", VOCAB_EXCERPT)
    assert result.returncode == 0, result.stderr
    after = _snapshot(tmp_path / "results")
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json"}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "special_tokens_map.json").write_text("{}")
    result = convert(source, tmp_path / "hf", "--vocab_file", VOCAB_EXCERPT)
    assert result.returncode == 2 and "special_tokens_map.json" in result.stderr and "--overwrite" in result.stderr
    assert _snapshot(tmp_path / "hf") == {"special_tokens_map.json": b"{}"}
    assert convert(source, tmp_path / "hf", "--vocab_file", VOCAB_EXCERPT, "--overwrite").returncode == 0
    assert json.loads((tmp_path / "hf" / "special_tokens_map.json").read_text())["mask_token"] == "[MASK]"
