"""model.py and model_weights.py against Hugging Face transformers, the independent reference."""
import copy
import dataclasses
import inspect
import json
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers

from bertrecipe.model.bert import (
    BERT_KEYS,
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
    Linear,
    TokenPacking,
    accepts_config_key,
    attend,
)
from bertrecipe.model.modern_config import MODERN_KEYS
from bertrecipe.model.torch_files import WeightsError, save_torch_atomic
from bertrecipe.model.weights import export_huggingface, export_state_dict, load_weights_into, read_config, read_weights

TOL = 1e-5
# vocab 101 is not a multiple of 8, so the padded embedding rows are exercised.
TINY = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)


def hf_config(config: BertConfig, **extra) -> transformers.BertConfig:
    fields = {k: v for k, v in config.to_dict().items() if k in TINY or k in (
        "hidden_act", "type_vocab_size", "layer_norm_eps", "initializer_range", "hidden_dropout_prob",
        "attention_probs_dropout_prob")}
    return transformers.BertConfig(**fields, attn_implementation="eager", **extra)


def make_batch(config: BertConfig, batch=3, seq=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, config.vocab_size, (batch, seq), generator=g)
    lengths = torch.tensor([seq, seq - 5, seq - 9])[:batch]
    attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    token_type_ids = (torch.arange(seq)[None, :] >= (lengths[:, None] // 2)).long() * attention_mask
    labels = torch.full((batch, seq), -1)
    for row, length in enumerate(lengths.tolist()):
        positions = torch.randperm(length - 1, generator=g)[:3] + 1
        labels[row, positions] = torch.randint(0, config.vocab_size, (3,), generator=g)
    nsp = torch.randint(0, 2, (batch,), generator=g)
    return input_ids, token_type_ids, attention_mask, labels, nsp


def make_pair(**overrides):
    """Our BertForPreTraining and transformers' with the same weights, both in eval mode."""
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, **overrides})
    ours = BertForPreTraining(config).eval()
    with torch.no_grad():  # non-zero biases and LayerNorm parameters, so that every path is checked
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    theirs = transformers.BertForPreTraining(hf_config(config)).eval()
    missing, unexpected = theirs.load_state_dict(export_state_dict(ours), strict=False)
    assert set(missing) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"} and not unexpected
    theirs.tie_weights()
    return ours, theirs


@pytest.fixture()
def pair():
    return make_pair()


def assert_close(a, b, tol=TOL):
    assert a.shape == b.shape
    diff = (a - b).abs().max().item()
    assert diff < tol, f"max abs difference {diff}"


def test_config_keeps_the_keys_of_other_readers_and_pads_vocab(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**TINY, "hidden_act": "gelu", "transformers_version": "4.8.2"}))
    config = BertConfig.from_json_file(path)
    assert config.padded_vocab_size == 104 and config.layer_norm_eps == 1e-12
    config.to_json_file(tmp_path / "out.json")
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["transformers_version"] == "4.8.2" and written["vocab_size"] == 101
    assert BertConfig(vocab_size=30522).padded_vocab_size == 30528


def test_the_accepted_keys_cover_what_transformers_and_our_exports_write(tmp_path):
    """Every key transformers writes into a BERT config (BertConfig and its PretrainedConfig base, and the
    generation settings it drops on reading) is one we accept, so that a future one is caught here; its file and
    each of our exports read back with the same model."""
    theirs = transformers.BertConfig(**TINY, hidden_act="gelu_new", type_vocab_size=3)
    written = set(theirs.to_dict()) | set(json.loads(theirs.to_json_string(use_diff=False)))
    written |= set(transformers.PretrainedConfig().to_dict())
    written |= set(transformers.GenerationConfig._get_default_generation_params())
    assert written <= BERT_KEYS, sorted(written - BERT_KEYS)
    (tmp_path / "config.json").write_text(theirs.to_json_string(use_diff=False))
    ours = read_config(tmp_path / "config.json")
    assert (ours.hidden_act, ours.type_vocab_size, ours.vocab_size) == ("gelu_new", 3, 101)
    config = BertConfig(**TINY)
    for model in (BertForPreTraining(config), BertForQuestionAnswering(config),
                  BertForSequenceClassification(config, 1), BertForSequenceClassification(config, 3)):
        folder = tmp_path / f"{type(model).__name__}{getattr(model, 'num_labels', '')}"
        export_huggingface(model, folder)
        back = read_config(folder / "config.json")
        assert {k: v for k, v in back.to_dict().items() if k not in back.extra} == config.to_dict()


# rope_scaling and rope_theta are read by PretrainedConfig only for the rotary models that declare them: the modern
# family takes them (modern_config.SPELLINGS), a BERT with absolute positions has nothing they could set.
ROTARY_KEYS = {"rope_scaling", "rope_theta"}


def keys_transformers_configs_take() -> set[str]:
    """What transformers.PretrainedConfig itself writes (to_dict), declares (its fields), reads from its keyword
    arguments (__post_init__) or lets be set (public properties with a setter), and the generation settings it drops
    on reading: the keys a config.json of any model may carry."""
    base = transformers.PretrainedConfig
    keys = set(base().to_dict()) | {field.name for field in dataclasses.fields(base)}
    keys |= set(re.findall(r'kwargs\.(?:pop|get)\(\s*"(\w+)"', inspect.getsource(base.__post_init__)))
    keys |= {name for klass in base.__mro__ for name, attribute in vars(klass).items()
             if isinstance(attribute, property) and attribute.fset is not None and not name.startswith("_")}
    keys |= set(transformers.GenerationConfig._get_default_generation_params())
    assert {"mask_token_id", "cls_token_id"} & keys == set()  # token ids go by their suffix (tested below)
    return keys


@pytest.mark.parametrize("family_keys", [BERT_KEYS, MODERN_KEYS], ids=["bert", "modernbert"])
def test_the_generic_keys_are_written_by_us_and_cover_every_key_transformers_configs_take(family_keys):
    """Our list of transformers' generic keys (bert.TRANSFORMERS_COMMON_KEYS, written out: the package never imports
    transformers) against the installed PretrainedConfig, so that a key it gains is caught here; every *_token_id,
    which transformers validates as a token id by that suffix, is accepted by the suffix too."""
    theirs = keys_transformers_configs_take() - (ROTARY_KEYS if family_keys is BERT_KEYS else set())
    assert {key for key in theirs if not accepts_config_key(key, family_keys)} == set()
    assert '.endswith("_token_id")' in inspect.getsource(transformers.PretrainedConfig.validate_token_ids)
    for key in ("mask_token_id", "cls_token_id", "unk_token_id", "image_token_id"):
        assert accepts_config_key(key, family_keys)
    for misspelt in ("num_hidden_layer", "mask_token", "mask_token_idx", "token_id_mask"):
        assert not accepts_config_key(misspelt, family_keys)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_config_transformers_saved_with_every_special_token_id_loads_and_keeps_them(tmp_path, family):
    """Issue 48, item 14: a ModernBERT config.json with mask_token_id (passed to ModernBertConfig like any token id)
    was refused as "unknown ModernBERT config key mask_token_id (did you mean pad_token_id?)"."""
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, mask_token_id=4,
               unk_token_id=3)
    if family == "bert":
        theirs = transformers.BertConfig(**TINY, **ids, problem_type="regression", output_hidden_states=True)
    else:
        theirs = transformers.ModernBertConfig(**TINY, **ids, local_attention=8, problem_type="regression")
    theirs.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written["mask_token_id"] == 4 and written["unk_token_id"] == 3
    ours = read_config(tmp_path / "saved" / "config.json")
    assert {key: ours.to_dict()[key] for key in ids} == ids
    (tmp_path / "saved" / "config.json").write_text(json.dumps({**written, "num_hidden_layer": 2}))
    with pytest.raises(WeightsError, match="unknown .* config key num_hidden_layer "
                                           r"\(did you mean num_hidden_layers\?\)"):
        read_config(tmp_path / "saved" / "config.json")


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_per_layer_config_is_refused_naming_the_key_and_an_empty_one_loads(tmp_path, family):
    """per_layer_config, which PretrainedConfig takes, overrides settings layer by layer; our models build every
    layer from the one config, so a config with overrides is refused rather than read as if it had none."""
    base = {**TINY, "model_type": family} | ({"local_attention": 8} if family == "modernbert" else {})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "per_layer_config": {}}))
    assert read_config(path).num_hidden_layers == TINY["num_hidden_layers"]
    path.write_text(json.dumps({**base, "per_layer_config": {"1": {"intermediate_size": 32}}}))
    with pytest.raises(WeightsError, match=f"^{re.escape(str(path))}: per_layer_config is .*, expected null or "
                                           r"\{\}"):
        read_config(path)


def test_pretraining_outputs_equal_transformers_on_padded_batch(pair):
    ours, theirs = pair
    input_ids, token_type_ids, attention_mask, labels, nsp = make_batch(ours.config)
    with torch.no_grad():
        out = ours(input_ids, token_type_ids, attention_mask, masked_lm_labels=labels, next_sentence_labels=nsp)
        ref = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                     labels=labels.masked_fill(labels < 0, -100), next_sentence_label=nsp, output_hidden_states=True)
        hidden, _ = ours.bert(input_ids, token_type_ids, attention_mask)
    real = attention_mask.bool()
    assert_close(hidden[real], ref.hidden_states[-1][real])
    assert_close(out.prediction_logits, ref.prediction_logits[labels >= 0])
    assert_close(out.seq_relationship_logits, ref.seq_relationship_logits)
    assert_close(out.loss, ref.loss)
    assert out.prediction_logits.shape == (int((labels >= 0).sum()), ours.config.vocab_size)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_gradients_equal_transformers(mode):
    # In train mode (dropout 0 so that both are deterministic) our CPU attention takes its explicit path.
    ours, theirs = make_pair(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours.train(mode == "train")
    theirs.train(mode == "train")
    input_ids, token_type_ids, attention_mask, labels, nsp = make_batch(ours.config, seed=1)
    ours(input_ids, token_type_ids, attention_mask, masked_lm_labels=labels, next_sentence_labels=nsp).loss.backward()
    theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
           labels=labels.masked_fill(labels < 0, -100), next_sentence_label=nsp).loss.backward()
    their_grads = dict(theirs.named_parameters())
    vocab = ours.config.vocab_size
    for name, param in ours.named_parameters():
        assert_close(param.grad[:vocab] if param.shape[0] == 104 else param.grad, their_grads[name].grad)


def test_predicts_every_position_without_labels(pair):
    ours, theirs = pair
    input_ids, token_type_ids, attention_mask, _, _ = make_batch(ours.config)
    with torch.no_grad():
        out = ours(input_ids, token_type_ids, attention_mask)
        ref = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    assert out.loss is None
    real = attention_mask.bool()  # padded positions are skipped (BertModel.skip_padding)
    assert_close(out.prediction_logits[real], ref.prediction_logits[real])


def test_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(BertConfig(**TINY))
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    names = [n for n, _ in model.named_parameters()]
    assert "cls.predictions.decoder.weight" not in names  # listed once, under the embeddings
    assert "cls.predictions.decoder.weight" in model.state_dict()


def test_google_initialization():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**{**TINY, "hidden_size": 256, "intermediate_size": 512,
                                             "initializer_range": 0.05}))
    for name, param in model.named_parameters():
        if "LayerNorm.weight" in name:
            assert torch.all(param == 1), name
        elif name.endswith("bias"):
            assert torch.all(param == 0), name
        else:
            assert abs(param.mean().item()) < 0.01 and abs(param.std().item() - 0.05) < 0.005, name


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    model = BertForPreTraining(config).train()
    batch = make_batch(config)
    grads = []
    for enabled in (False, True):
        model.zero_grad()
        model.set_checkpoint_activations(enabled)
        loss = model(*batch[:3], masked_lm_labels=batch[3], next_sentence_labels=batch[4]).loss
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_bf16_autocast_stays_close_to_fp32(pair):
    ours, _ = pair
    batch = make_batch(ours.config)
    with torch.no_grad():
        fp32 = ours(*batch[:3], masked_lm_labels=batch[3], next_sentence_labels=batch[4]).loss
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = ours(*batch[:3], masked_lm_labels=batch[3], next_sentence_labels=batch[4]).loss
    assert bf16.dtype == torch.float32 and abs(bf16 - fp32).item() < 0.05


def test_question_answering_equals_transformers():
    torch.manual_seed(0)
    config = BertConfig(**TINY)
    ours = BertForQuestionAnswering(config).eval()
    theirs = transformers.BertForQuestionAnswering(hf_config(config)).eval()
    theirs.load_state_dict(export_state_dict(ours))
    input_ids, token_type_ids, attention_mask, _, _ = make_batch(config)
    start, end = torch.tensor([3, 20, 0]), torch.tensor([5, 30, 0])  # 20 and 30 lie outside the window
    with torch.no_grad():
        loss, start_logits, end_logits = ours(input_ids, token_type_ids, attention_mask, start, end)
        ref = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                     start_positions=start, end_positions=end)
    assert_close(start_logits, ref.start_logits)  # with positions every position is computed, as the loss needs
    assert_close(end_logits, ref.end_logits)
    assert_close(loss, ref.loss)
    with torch.no_grad():  # prediction skips padding: the real positions are unchanged
        _, start_only, end_only = ours(input_ids, token_type_ids, attention_mask)
    real = attention_mask.bool()
    assert_close(start_only[real], ref.start_logits[real])
    assert_close(end_only[real], ref.end_logits[real])
    assert not torch.equal(start_only, start_logits)  # the padded positions really were skipped


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("rows", [[0, 1, 2], [1, 2]])  # without row 0 every row ends in padding (trimmed)
def test_skipping_padding_changes_no_real_position_nor_gradient(mode, rows):
    """Packed (real tokens only) and dense encoders: same outputs at real positions, padded ones zero, same
    gradients; a batch without padding takes the dense path."""
    torch.manual_seed(0)
    packed = BertForPreTraining(BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    dense = copy.deepcopy(packed)
    dense.bert.skip_padding = False
    input_ids, token_type_ids, attention_mask, labels, nsp = (t[rows] for t in make_batch(packed.config, seed=3))
    results = []
    for model in (packed, dense):
        model.train(mode == "train")
        hidden, _ = model.bert(input_ids, token_type_ids, attention_mask)
        loss = model(input_ids, token_type_ids, attention_mask, masked_lm_labels=labels, next_sentence_labels=nsp).loss
        loss.backward()
        results.append((hidden, loss, {n: p.grad for n, p in model.named_parameters()}))
    real = attention_mask.bool()
    assert_close(results[0][0][real], results[1][0][real])
    assert torch.count_nonzero(results[0][0][~real]) == 0 and torch.count_nonzero(results[1][0][~real]) > 0
    assert_close(results[0][1], results[1][1])
    for name, grad in results[0][2].items():
        assert_close(grad, results[1][2][name])
    assert TokenPacking.of(torch.ones_like(attention_mask)) is None
    assert TokenPacking.of(torch.zeros_like(attention_mask)) is None
    packing = TokenPacking.of(attention_mask)
    assert packing.index.numel() == int(attention_mask.sum())
    assert packing.seq == int(attention_mask.sum(1).max())  # trailing all-padding columns are not attended


@pytest.mark.parametrize("num_labels", [1, 3])
def test_sequence_classification_equals_transformers(num_labels):
    torch.manual_seed(0)
    config = BertConfig(**TINY)
    ours = BertForSequenceClassification(config, num_labels).eval()
    extra = {"problem_type": "regression"} if num_labels == 1 else {}
    theirs = transformers.BertForSequenceClassification(hf_config(config, num_labels=num_labels, **extra)).eval()
    theirs.load_state_dict(export_state_dict(ours))
    input_ids, token_type_ids, attention_mask, _, _ = make_batch(config)
    labels = torch.tensor([0.5, 1.0, 2.5]) if num_labels == 1 else torch.tensor([0, 2, 1])
    with torch.no_grad():
        loss, logits = ours(input_ids, token_type_ids, attention_mask, labels)
        ref = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels)
    assert_close(logits, ref.logits)
    assert_close(loss, ref.loss)


def test_export_loads_in_transformers_with_the_same_outputs(pair, tmp_path):
    ours, _ = pair
    vocab = tmp_path / "vocab.txt"
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab.write_text("\n".join(special + [f"tok{i}" for i in range(ours.config.vocab_size - 5)]) + "\n")
    export_huggingface(ours, tmp_path / "hf", vocab_file=vocab, do_lower_case=True)  # its tokens cannot tell
    assert (tmp_path / "hf" / "vocab.txt").read_text() == vocab.read_text()
    loaded, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    loaded.eval()
    input_ids, token_type_ids, attention_mask, labels, nsp = make_batch(ours.config, seed=2)
    with torch.no_grad():
        out = ours(input_ids, token_type_ids, attention_mask, masked_lm_labels=labels, next_sentence_labels=nsp)
        ref = loaded(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                     labels=labels.masked_fill(labels < 0, -100), next_sentence_label=nsp)
    assert_close(out.loss, ref.loss)
    assert_close(out.prediction_logits, ref.prediction_logits[labels >= 0])


def test_export_then_read_back_gives_identical_weights(pair, tmp_path):
    ours, _ = pair
    export_huggingface(ours, tmp_path / "hf")
    weights = read_weights(tmp_path / "hf")
    assert weights.source_format == "ours" and weights.config.vocab_size == ours.config.vocab_size
    fresh = BertForPreTraining(weights.config)
    assert load_weights_into(fresh, weights) == []
    for (name, a), b in zip(ours.state_dict().items(), fresh.state_dict().values(), strict=True):
        if name.startswith(("bert.embeddings.word", "cls.predictions.decoder", "cls.predictions.bias")):
            a, b = a[: ours.config.vocab_size], b[: ours.config.vocab_size]
        assert torch.equal(a, b), name


def test_nvidia_checkpoint_names_load(pair, tmp_path):
    ours, _ = pair
    nvidia = export_state_dict(ours, naming="nvidia")
    assert "bert.encoder.layer.0.intermediate.dense_act.weight" in nvidia
    assert "cls.predictions.transform.dense_act.weight" in nvidia and "bert.pooler.dense_act.bias" in nvidia
    # Older NVIDIA checkpoints name LayerNorm parameters gamma/beta and carry a DDP "module." prefix.
    legacy = {"module." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"):
              v for k, v in nvidia.items()}
    save_torch_atomic({"model": legacy, "epoch": 3, "files": ["a.hdf5"]}, tmp_path / "ckpt_100.pt")
    weights = read_weights(tmp_path / "ckpt_100.pt")
    assert weights.source_format == "nvidia" and weights.config is None
    fresh = BertForPreTraining(ours.config).eval()
    load_weights_into(fresh, weights)
    batch = make_batch(ours.config)
    with torch.no_grad():
        assert torch.equal(fresh(*batch[:3]).prediction_logits, ours(*batch[:3]).prediction_logits)


def test_pretraining_weights_start_a_question_answering_model(pair, tmp_path):
    ours, _ = pair
    save_torch_atomic({"model": ours.state_dict(), "config": ours.config.to_dict()}, tmp_path / "ckpt_5.pt")
    qa = BertForQuestionAnswering(ours.config)
    missing = load_weights_into(qa, read_weights(tmp_path / "ckpt_5.pt"))
    assert sorted(missing) == ["qa_outputs.bias", "qa_outputs.weight"]
    assert torch.equal(qa.bert.encoder.layer[1].output.dense.weight, ours.bert.encoder.layer[1].output.dense.weight)


@pytest.fixture()
def varied_tiny_bert(tiny_bert, tmp_path):
    """conftest's tiny Hugging Face BERT folder with noise of 0.2 added to every tensor: transformers' init leaves
    biases at 0 and LayerNorm at 1, and its weights of std 0.02 make attention nearly uniform; with the noise every
    parameter counts and attention is peaked, as in pretrained weights. Saved as transformers saves it."""
    folder = tmp_path / "tiny_bert_varied"
    shutil.copytree(tiny_bert, folder)
    state = safetensors.torch.load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    varied = {name: t + torch.randn(t.shape, generator=generator) * 0.2 if t.is_floating_point() else t
              for name, t in state.items()}
    safetensors.torch.save_file(varied, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def check_encoder_equals_transformers(folder: Path, hidden_size: int) -> None:
    """A Hugging Face BertModel folder (no pre-training heads) read by read_weights into our BertForPreTraining:
    the encoder's outputs equal transformers' own loading of the folder."""
    weights = read_weights(folder)
    assert weights.source_format == "huggingface" and weights.config.hidden_size == hidden_size
    ours = BertForPreTraining(weights.config).eval()
    missing = load_weights_into(ours, weights)
    assert all(name.startswith("cls.") for name in missing) and missing
    theirs = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    input_ids, token_type_ids, attention_mask, _, _ = make_batch(weights.config, batch=3, seq=40)
    input_ids[:, 0] = 101  # [CLS]
    with torch.no_grad():
        hidden, pooled = ours.bert(input_ids, token_type_ids, attention_mask)
        ref = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    assert_close(hidden[real], ref.last_hidden_state[real])
    assert_close(pooled, ref.pooler_output)


def test_huggingface_encoder_equals_transformers(varied_tiny_bert):
    check_encoder_equals_transformers(varied_tiny_bert, hidden_size=32)


def test_minilm_encoder_equals_transformers(shared_data):
    """The same on real pretrained weights (MiniLM), whose scales random ones do not reproduce."""
    check_encoder_equals_transformers(shared_data / "minilm", hidden_size=384)


def test_encoder_only_model_loads_a_huggingface_encoder_without_heads(tiny_bert):
    weights = read_weights(tiny_bert)
    encoder = BertModel(weights.config)
    state = {k.removeprefix("bert."): v for k, v in weights.state_dict.items()}
    embeddings = state["embeddings.word_embeddings.weight"]
    padding = weights.config.padded_vocab_size - weights.config.vocab_size  # rows our embedding adds
    zeros = embeddings.new_zeros(padding, weights.config.hidden_size)
    state["embeddings.word_embeddings.weight"] = torch.cat([embeddings, zeros])
    result = encoder.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def test_unreadable_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "ckpt_7.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(WeightsError, match="ckpt_7.pt"):
        read_weights(bad)
    with pytest.raises(WeightsError, match="no such checkpoint"):
        read_weights(tmp_path / "missing.pt")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(WeightsError, match="holds none of"):
        read_weights(tmp_path / "empty_dir")


def test_checkpoint_of_another_size_is_refused_with_the_key(pair, tmp_path):
    ours, _ = pair
    save_torch_atomic({"model": ours.state_dict()}, tmp_path / "pytorch_model.bin")
    bigger = BertForQuestionAnswering(BertConfig(**{**TINY, "hidden_size": 48, "intermediate_size": 96}))
    with pytest.raises(WeightsError, match=r"pytorch_model.bin: .* has shape"):
        load_weights_into(bigger, read_weights(tmp_path / "pytorch_model.bin"), tmp_path / "pytorch_model.bin")


class Payload:
    """Stands for any pickled Python object, such as the data loader NVIDIA's checkpoints may hold."""


def test_pickled_objects_are_never_unpickled(tmp_path):
    import pickle

    path = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "loader": Payload()}, path, pickle_module=pickle)
    with pytest.raises(WeightsError, match="never unpickles"):
        read_weights(path)


def test_inference_rebuilds_the_stacked_qkv_weights_when_a_parameter_changes(pair):
    ours, theirs = pair
    input_ids, token_type_ids, attention_mask, _, _ = make_batch(ours.config)
    real = attention_mask.bool()
    for autocast in (False, True):
        for _ in range(2):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                hidden, _ = ours.bert(input_ids, token_type_ids, attention_mask)
                ref = theirs.bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
            assert_close(hidden[real].float(), ref.last_hidden_state[real].float(), 2e-2 if autocast else TOL)
            with torch.no_grad():  # as an optimizer step would: in place, on both models
                ours.bert.encoder.layer[0].attention.self.key.weight.mul_(1.5)
                theirs.bert.encoder.layer[0].attention.self.key.weight.mul_(1.5)


def test_linear_reuses_its_cast_weight_only_while_the_weight_is_unchanged():
    torch.manual_seed(0)
    layer, x = Linear(16, 8), torch.randn(4, 16)

    def plain() -> torch.Tensor:  # autocast's own cast, every call
        return torch.nn.functional.linear(x, layer.weight, layer.bias)

    def bf16():  # a fresh autocast region: autocast's own cast cache lives only as long as one region
        return torch.autocast("cpu", dtype=torch.bfloat16)

    with torch.no_grad():
        with bf16():
            first = layer(x)
            assert layer._cast is not None and first.dtype == torch.bfloat16
            assert torch.equal(layer(x), first)
        with bf16():
            assert torch.equal(plain(), first)
        layer.weight.mul_(2)  # in place, as an optimizer step or load_state_dict does
        with bf16():
            second = layer(x)
        with bf16():
            assert torch.equal(plain(), second) and not torch.equal(second, first)
    layer.train()
    assert layer._cast is None  # no stale copy kept during training
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)  # with autograd: autocast's path, gradients reach the fp32 weight
    out.float().sum().backward()
    assert layer.weight.grad is not None and layer._cast is None


def test_attention_written_out_for_cpu_training_is_softmax_of_scaled_scores_plus_bias_times_values():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    bias = torch.zeros(2, 1, 1, 5)
    bias[1, ..., 3:] = -10000.0  # the second row's last two keys are padding
    by_hand = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + bias, dim=-1) @ v
    steps = attend(q, k, v, bias, 0.0, training=True)  # grad enabled on a CPU: the step-by-step path
    assert torch.allclose(steps, by_hand, atol=1e-6)
    assert torch.allclose(steps, attend(q, k, v, bias, 0.0, training=False), atol=1e-6)  # SDPA's
