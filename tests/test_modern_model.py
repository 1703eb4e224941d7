"""The modern family (bertrecipe/model/modern.py) against its independent oracle, transformers' ModernBERT: a folder
that transformers saved loads into ours and gives its logits (MLM, classification, QA); ours exported loads into
transformers with the same logits; configs in the current and the older keys; packed rows equal each document
alone, for both families."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import ModernBertConfig as TheirConfig
from transformers import ModernBertForMaskedLM as TheirMaskedLM
from transformers import ModernBertForQuestionAnswering as TheirQuestionAnswering
from transformers import ModernBertForSequenceClassification as TheirSequenceClassification

from bertrecipe.model.bert import BertConfig, BertForPreTraining, ConfigError, attend
from bertrecipe.model.documents import document_attention_bias
from bertrecipe.model.families import config_from_json_file, pretraining_model
from bertrecipe.model.local_attention import Band, banded_attention
from bertrecipe.model.modern import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertModel,
)
from bertrecipe.model.modern_config import MODERN_KEYS, ModernBertConfig
from bertrecipe.model.weights import (
    export_huggingface,
    load_weights_into,
    model_for_weights,
    read_config,
    read_weights,
)
from helpers import REPO_ROOT

SMALL = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, num_hidden_layers=4, intermediate_size=48,
             local_attention=8, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             cls_token_id=1, sep_token_id=2)


def their_model(cls, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = cls(TheirConfig(**{**SMALL, **overrides}, attn_implementation="sdpa")).eval()
    with torch.no_grad():  # weights far from their init, so that every path changes the logits visibly
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model


def padded_batch(seed: int = 1, length: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows longer than the local window (8), two of them padded."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, SMALL["vocab_size"], (3, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 29:] = 0
    mask[2, 6:] = 0
    return ids * mask, mask


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, least_scale: float = 0.1) -> None:
    scale = theirs.abs().max().item()
    assert scale > least_scale  # never compares near-zero tensors, which any two models would match
    assert (ours - theirs).abs().max().item() <= 1e-4 * scale


def saved(model, folder) -> object:
    model.save_pretrained(folder)
    return folder


def test_a_folder_transformers_saved_gives_its_masked_lm_logits(tmp_path):
    theirs = their_model(TheirMaskedLM)
    weights = read_weights(saved(theirs, tmp_path / "hf"))
    assert isinstance(weights.config, ModernBertConfig)
    assert weights.config.layer_types == theirs.config.layer_types
    assert weights.config.layer_types.count("sliding_attention") == 2  # both kinds of layer are exercised
    ours = model_for_weights(weights, weights.config)
    assert isinstance(ours, ModernBertForMaskedLM)
    assert load_weights_into(ours, weights) == []
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        got = ours.eval()(ids, attention_mask=mask).prediction_logits
    real = mask.bool()
    assert_close(got[real], expected[real])


def test_the_local_window_and_the_rotary_bases_matter():
    """Guards the parity test: a wider window or another theta changes the logits, so equality means the same
    window and the same positions."""
    theirs = their_model(TheirMaskedLM)
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits[mask.bool()]
    values = theirs.config.to_dict()
    for change in ({"local_attention": 64}, {"rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}}):
        ours = ModernBertForMaskedLM(ModernBertConfig.from_dict({**values, **change})).eval()
        ours.load_state_dict(theirs.state_dict())
        with torch.no_grad():
            got = ours(ids, attention_mask=mask).prediction_logits[mask.bool()]
        assert (got - expected).abs().max() > 1e-2


def test_masked_lm_head_runs_on_labelled_positions_and_gives_their_loss_and_gradients():
    theirs = their_model(TheirMaskedLM)
    ours = ModernBertForMaskedLM(ModernBertConfig.from_dict(theirs.config.to_dict()))
    ours.load_state_dict(theirs.state_dict())
    ids, mask = padded_batch()
    labels = torch.full_like(ids, -100)
    labels[0, [3, 20, 35]] = ids[0, [3, 20, 35]]
    labels[1, [0, 28]] = ids[1, [0, 28]]
    labels[2, 5] = ids[2, 5]
    theirs.train()
    ours.train()
    their_loss = theirs(input_ids=ids, attention_mask=mask, labels=labels).loss
    output = ours(ids, attention_mask=mask, masked_lm_labels=labels)  # training: the chunked loss, no logits
    with torch.no_grad():
        assert ours(ids, attention_mask=mask, masked_lm_labels=labels).prediction_logits.shape == \
            (6, SMALL["vocab_size"])
    assert output.seq_relationship_logits is None and output.next_sentence_loss is None
    assert abs(output.loss.item() - their_loss.item()) <= 1e-5 * their_loss.item()
    their_loss.backward()
    output.loss.backward()
    their_grads = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        assert_close(param.grad, their_grads[name].grad, least_scale=1e-4)


def test_older_config_keys_build_the_same_model_as_transformers_reads_them(tmp_path):
    released = {**SMALL, "model_type": "modernbert", "num_hidden_layers": 5, "global_attn_every_n_layers": 2,
                "global_rope_theta": 80_000.0, "local_rope_theta": 5_000.0}
    (tmp_path / "config.json").write_text(json.dumps(released))
    ours = config_from_json_file(tmp_path / "config.json")
    theirs = TheirConfig.from_pretrained(tmp_path)
    assert ours.layer_types == theirs.layer_types
    assert ours.global_rope_theta == theirs.rope_parameters["full_attention"]["rope_theta"] == 80_000.0
    assert ours.local_rope_theta == theirs.rope_parameters["sliding_attention"]["rope_theta"] == 5_000.0
    assert ModernBertConfig.from_dict(ours.to_dict()) == ours


def test_bert_configs_still_build_bert(tmp_path):
    (tmp_path / "bert.json").write_text(json.dumps({"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
                                                    "num_attention_heads": 2, "intermediate_size": 32,
                                                    "max_position_embeddings": 64}))
    config = config_from_json_file(tmp_path / "bert.json")
    assert isinstance(config, BertConfig)
    assert isinstance(pretraining_model(config), BertForPreTraining)


# The keys of the released ModernBERT-base config.json (written by transformers 4.47), sizes shrunk to SMALL's.
RELEASED = {"architectures": ["ModernBertForMaskedLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 1, "classifier_activation": "gelu", "classifier_bias": False, "classifier_dropout": 0.0,
            "classifier_pooling": "mean", "cls_token_id": 1, "decoder_bias": True, "deterministic_flash_attn": False,
            "embedding_dropout": 0.0, "eos_token_id": 2, "global_attn_every_n_layers": 3,
            "global_rope_theta": 160000.0, "gradient_checkpointing": False, "hidden_activation": "gelu",
            "hidden_size": 32, "initializer_cutoff_factor": 2.0, "initializer_range": 0.02, "intermediate_size": 48,
            "layer_norm_eps": 1e-05, "local_attention": 8, "local_rope_theta": 10000.0,
            "max_position_embeddings": 128, "mlp_bias": False, "mlp_dropout": 0.0, "model_type": "modernbert",
            "norm_bias": False, "norm_eps": 1e-05, "num_attention_heads": 4, "num_hidden_layers": 4,
            "pad_token_id": 0, "position_embedding_type": "absolute", "sep_token_id": 2, "tie_word_embeddings": True,
            "torch_dtype": "float32", "transformers_version": "4.47.0.dev0", "vocab_size": 128}


def read_both(folder, values):
    """(ours, transformers') reading of a config.json of `values`."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))
    return config_from_json_file(folder / "config.json"), TheirConfig.from_pretrained(folder)


def assert_same_model(ours, theirs):
    assert ours.layer_types == theirs.layer_types and ours.local_attention == theirs.local_attention
    assert ours.global_rope_theta == theirs.rope_parameters["full_attention"]["rope_theta"]
    assert ours.local_rope_theta == theirs.rope_parameters["sliding_attention"]["rope_theta"]
    assert (ours.num_hidden_layers, ours.hidden_size, ours.norm_eps) == \
        (theirs.num_hidden_layers, theirs.hidden_size, theirs.norm_eps)


def test_the_accepted_keys_cover_what_transformers_writes_and_the_released_config(tmp_path):
    """Every key transformers' ModernBertConfig writes is one we accept (a future one is caught here); the
    released checkpoints' file, and each of our exports, read back as transformers reads them."""
    theirs = TheirConfig(**SMALL)
    written = set(theirs.to_dict()) | set(json.loads(theirs.to_json_string(use_diff=False)))
    assert written <= MODERN_KEYS, sorted(written - MODERN_KEYS)
    assert_same_model(*read_both(tmp_path / "current", json.loads(theirs.to_json_string(use_diff=False))))
    assert_same_model(*read_both(tmp_path / "released", RELEASED))
    config = ModernBertConfig.from_dict({**SMALL, "model_type": "modernbert", "num_hidden_layers": 5,
                                         "global_attn_every_n_layers": 2, "local_rope_theta": 5_000.0})
    for model in (ModernBertForMaskedLM(config), ModernBertForQuestionAnswering(config),
                  ModernBertForSequenceClassification(config, 1)):
        export_huggingface(model, tmp_path / type(model).__name__)
        ours = read_config(tmp_path / type(model).__name__ / "config.json")
        assert ours.layer_types == config.layer_types and ours.local_rope_theta == 5_000.0
        assert_same_model(ours, TheirConfig.from_pretrained(tmp_path / type(model).__name__))


PATTERN_EVERY_2 = ["full_attention", "sliding_attention"] * 2
ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 80_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5_000.0}}


@pytest.mark.parametrize("agreeing, contradicting, first, second", [
    ({"layer_types": PATTERN_EVERY_2, "global_attn_every_n_layers": 2},
     {"layer_types": PATTERN_EVERY_2, "global_attn_every_n_layers": 3}, "layer_types", "global_attn_every_n_layers"),
    ({"rope_parameters": ROPE, "global_rope_theta": 80_000.0, "local_rope_theta": 5_000.0},
     {"rope_parameters": ROPE, "global_rope_theta": 160_000.0},
     "rope_parameters.full_attention.rope_theta 80000.0", "global_rope_theta 160000.0"),
    ({"rope_parameters": {"full_attention": ROPE["full_attention"]}, "local_rope_theta": 5_000.0},
     {"rope_parameters": ROPE, "local_rope_theta": 10_000.0},
     "rope_parameters.sliding_attention.rope_theta 5000.0", "local_rope_theta 10000.0"),
    ({"global_rope_theta": 7_000.0, "local_rope_theta": 7_000.0, "rope_theta": 7_000.0}, {"rope_theta": 80_000.0},
     "rope_theta 80000.0", "the full_attention layers' default 160000.0"),
    ({"rope_parameters": {kind: {**params, "rope_theta": 5_000.0} for kind, params in ROPE.items()},
      "rope_theta": 5_000.0},
     {"rope_parameters": ROPE, "rope_theta": 80_000.0}, "rope_theta 80000.0",
     "rope_parameters.sliding_attention.rope_theta 5000.0"),
    ({"sliding_window": 4, "local_attention": 8}, {"sliding_window": 8}, "local_attention 8", "sliding_window 8"),
    ({"sliding_window": 16, "local_attention": None}, {"sliding_window": 8, "local_attention": 8},
     "local_attention 8", "sliding_window 8"),
], ids=["layer-pattern", "global-base", "local-base", "single-base-default", "single-base", "window",
        "window-alone"])
def test_two_keys_that_contradict_are_refused_naming_both_and_agreeing_ones_read_as_transformers_reads_them(
        tmp_path, agreeing, contradicting, first, second):
    """transformers silently takes one of two contradicting keys (layer_types, rope_parameters, sliding_window) or
    ignores one (rope_theta); we refuse them, naming both keys as the file spells them, and read two that agree
    (or one alone) as transformers does."""
    base = {**SMALL, "model_type": "modernbert"}
    values = {k: v for k, v in {**base, **agreeing}.items() if v is not None}
    assert_same_model(*read_both(tmp_path / "agreeing", values))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **contradicting}))
    with pytest.raises(ConfigError) as caught:
        config_from_json_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert f"{first} " in message and f"contradicts {second}" in message, message


@pytest.mark.parametrize("values, spelled", [
    ({"rope_parameters": {**ROPE, "full_attention": {"rope_type": "default", "rope_theta": -1}}},
     "rope_parameters.full_attention.rope_theta is -1"),
    ({"rope_parameters": {**ROPE, "sliding_attention": {"rope_type": "default", "rope_theta": "1e4"}}},
     "rope_parameters.sliding_attention.rope_theta is '1e4'"),
    ({"rope_theta": float("inf")}, "rope_theta is inf"),
], ids=["rope_parameters-global", "rope_parameters-local", "single"])
def test_a_rotary_base_error_names_the_key_as_the_file_spells_it(tmp_path, values, spelled):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, "model_type": "modernbert", **values}))
    with pytest.raises(ConfigError) as caught:
        config_from_json_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {spelled}, expected a finite number > 0"), message
    assert all(key in values or key not in message for key in ("global_rope_theta", "local_rope_theta")), message


@pytest.mark.parametrize("values, named", [
    ({"layer_types": ["full_attention", "banded"]}, "layer_types"),
    ({"local_attention": 7}, "local_attention"),
    ({"hidden_activation": "gelu_fast_new"}, "hidden_activation"),
    ({"norm_bias": "no"}, "norm_bias"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"num_attention_heads": 5}, "hidden_size"),
])
def test_a_bad_modern_config_is_one_line_naming_the_file_and_key(tmp_path, values, named):
    base = {**SMALL, "model_type": "modernbert", "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps({**base, **values}))
    with pytest.raises(ConfigError) as caught:
        config_from_json_file(tmp_path / "config.json")
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "config.json") in message and named in message


def test_our_export_loads_in_transformers_with_the_same_logits(tmp_path):
    torch.manual_seed(3)
    ours = ModernBertForMaskedLM(ModernBertConfig.from_dict({**SMALL, "model_type": "modernbert"})).eval()
    export_huggingface(ours, tmp_path / "export")
    theirs = TheirMaskedLM.from_pretrained(tmp_path / "export", attn_implementation="sdpa").eval()
    ids, mask = padded_batch(seed=4)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).prediction_logits
    assert_close(got[mask.bool()], expected[mask.bool()])


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sequence_classification_gives_their_logits(tmp_path, pooling):
    theirs = their_model(TheirSequenceClassification, num_labels=3, classifier_pooling=pooling)
    weights = read_weights(saved(theirs, tmp_path / "hf"))
    ours = model_for_weights(weights, weights.config)
    load_weights_into(ours, weights)
    ids, mask = padded_batch(seed=5)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        _, got = ours.eval()(ids, attention_mask=mask)
    assert got.shape == (3, 3)
    assert_close(got, expected)


def test_question_answering_gives_their_logits(tmp_path):
    theirs = their_model(TheirQuestionAnswering)
    weights = read_weights(saved(theirs, tmp_path / "hf"))
    ours = model_for_weights(weights, weights.config)
    load_weights_into(ours, weights)
    ids, mask = padded_batch(seed=6)
    with torch.no_grad():
        output = theirs(input_ids=ids, attention_mask=mask)
        _, start, end = ours.eval()(ids, attention_mask=mask)
    real = mask.bool()
    assert_close(start[real], output.start_logits[real])
    assert_close(end[real], output.end_logits[real])


def packed_and_alone(model, documents: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token MLM logits of the documents packed into one row (with padding after them) and of each
    document run alone."""
    row = torch.cat(documents + [torch.zeros(5, dtype=torch.long)])[None]
    document_ids = torch.cat([torch.full((len(d),), i + 1) for i, d in enumerate(documents)]
                             + [torch.zeros(5, dtype=torch.long)])[None]
    with torch.no_grad():
        packed = model(row, document_ids=document_ids).prediction_logits[0, : -5]
        alone = torch.cat([model(d[None]).prediction_logits[0] for d in documents])
    return packed, alone


def our_modern_model(seed: int) -> ModernBertForMaskedLM:
    torch.manual_seed(seed)
    model = ModernBertForMaskedLM(ModernBertConfig.from_dict({**SMALL, "model_type": "modernbert"})).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model


def test_packed_rows_equal_each_document_alone_modern():
    model = our_modern_model(7)
    documents = [torch.randint(3, 128, (n,)) for n in (13, 30, 4)]  # one longer than the local window
    packed, alone = packed_and_alone(model, documents)
    assert_close(packed, alone)


def test_packed_rows_equal_each_document_alone_bert():
    torch.manual_seed(8)
    model = BertForPreTraining(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=48,
                                          max_position_embeddings=64)).eval()
    documents = [torch.randint(3, 128, (n,)) for n in (9, 20, 6)]
    packed, alone = packed_and_alone(model, documents)
    assert_close(packed, alone)


def test_without_document_ids_documents_in_one_row_see_each_other():
    """Guards the packing tests: the same row without document ids gives other logits."""
    model = our_modern_model(7)
    documents = [torch.randint(3, 128, (n,)) for n in (13, 30)]
    packed, alone = packed_and_alone(model, documents)
    with torch.no_grad():
        unseparated = model(torch.cat(documents)[None]).prediction_logits[0]
    assert (unseparated - alone).abs().max() > 1e-3


def test_a_bare_encoder_loads_from_a_masked_lm_folder(tmp_path):
    theirs = their_model(TheirMaskedLM)
    weights = read_weights(saved(theirs, tmp_path / "hf"))
    encoder = ModernBertModel(weights.config)
    load_weights_into(encoder, weights)
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = theirs.model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = encoder.eval()(ids, mask)
    assert_close(got[mask.bool()], expected[mask.bool()])


@pytest.mark.parametrize("reach, seq", [(16, 300), (4, 13), (64, 200)])
def test_banded_local_attention_equals_dense_attention_with_the_window_bias(reach, seq):
    generator = torch.Generator().manual_seed(reach)
    q, k, v = (torch.randn(2, 3, seq, 8, generator=generator, requires_grad=True) for _ in range(3))
    document_ids = torch.zeros(2, seq, dtype=torch.long)
    document_ids[0, : seq // 3], document_ids[0, seq // 3: seq - 5] = 1, 2  # two documents, then padding
    document_ids[1] = 1
    band = Band(document_ids, reach)
    banded = banded_attention(q, k, v, band, 0.0, training=False)
    dense = attend(q, k, v, document_attention_bias(document_ids, torch.float32, reach), 0.0, training=False)
    assert torch.allclose(banded, dense, atol=1e-5)
    weights = torch.randn(banded.shape, generator=generator)
    grads = [torch.autograd.grad((out * weights).sum(), (q, k, v)) for out in (banded, dense)]
    for ours, reference in zip(*grads, strict=True):
        assert torch.allclose(ours, reference, atol=1e-5)


@pytest.mark.slow
def test_a_small_modern_model_trains_forward_and_backward_on_8192_token_rows():
    config = ModernBertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=48, max_position_embeddings=8192, local_attention=128,
                              layer_types=["full_attention", "sliding_attention"], pad_token_id=0)
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(config).train()
    ids = torch.randint(3, 128, (1, 8192))
    labels = torch.where(torch.rand(1, 8192) < 0.3, ids, torch.full_like(ids, -1))
    assert Band((ids != 0).long(), config.local_attention // 2).worth_it()  # the local layer attends by chunks
    loss = model(ids, masked_lm_labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    assert len(grads) == len(list(model.parameters())) and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", ["modernbert-base", "modernbert-base-8k", "modernbert-large", "modernbert-large-8k"])
def test_the_modernbert_presets_read_alike_here_and_in_transformers(name):
    """The presets are ModernBERT's published shapes with BERT's uncased vocab padded to a multiple of 64."""
    path = REPO_ROOT / "bert_configs" / f"{name}.json"
    ours = config_from_json_file(path)
    theirs = TheirConfig.from_pretrained(path)
    assert ours.vocab_size % 64 == 0 and ours.vocab_size >= 30522
    assert ours.layer_types == theirs.layer_types
    assert ours.global_rope_theta == theirs.rope_parameters["full_attention"]["rope_theta"]
    assert (ours.hidden_size, ours.num_hidden_layers, ours.intermediate_size) == \
        ((768, 22, 1152) if "base" in name else (1024, 28, 2624))
    assert ours.max_position_embeddings == (8192 if name.endswith("8k") else 1024)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_equals_the_textbook_rotary_formula_to_the_last_bit(dtype):
    """x * cos + rotate_half(x) * sin in fp32 (RoFormer; transformers' rotate_half), computed here by halves."""
    from bertrecipe.model.modern import RotaryPositions, rotate

    x = torch.randn(2, 3, 40, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    cos, sin = RotaryPositions(16, 160000.0)(torch.arange(40).expand(2, 40) * 7)
    assert cos.shape == (2, 1, 40, 8)
    x32 = x.float()
    rotated_half = torch.cat((-x32[..., 8:], x32[..., :8]), dim=-1)
    textbook = x32 * torch.cat((cos, cos), dim=-1) + rotated_half * torch.cat((sin, sin), dim=-1)
    assert torch.equal(rotate(x, cos, sin), textbook.to(dtype))
