"""The two model families a config file can choose: BERT (Google's and NVIDIA's) and the modern encoder
(ModernBERT). A config with `"model_type": "modernbert"`, or with no model_type and a key only ModernBERT has,
builds the modern family; every other config builds BERT, as before. The builders give each task's model of the
config's family."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.model.bert import (
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
    read_config_json,
)
from bertrecipe.model.modern import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
)
from bertrecipe.model.modern_config import MODERN_SETTINGS, ModernBertConfig, is_modern

ModelConfig = Union[BertConfig, ModernBertConfig]


def config_from_dict(values: Any, source: str | Path = "config", strict: bool = True) -> ModelConfig:
    """The config of the family `values` (parsed JSON) describes; ConfigError "<source>: <problem>; <fix>" else.
    `strict=False` reads a checkpoint's own record: keys older versions kept there unused are dropped."""
    if isinstance(values, dict) and is_modern(values):
        return ModernBertConfig.from_dict(values, source=source, strict=strict)
    return BertConfig.from_dict(values, source=source, strict=strict, modern_keys=MODERN_SETTINGS)


def recorded_config(values: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's config record as this version writes it: without the keys older versions kept unused (a
    resume compares it with the config file's, where such keys are now refused). A record that does not read is
    returned as it is, for the comparison to name its keys."""
    try:
        return config_from_dict(values, strict=False).to_dict()
    except InputError:
        return values


def config_from_json_file(path: str | Path) -> ModelConfig:
    """A `bert_config.json` or a Hugging Face `config.json` of either family; ConfigError naming the file."""
    return config_from_dict(read_config_json(path), source=path)


def config_record(model: nn.Module, config: ModelConfig) -> dict[str, Any]:
    """The config to write beside a task model's weights. A modern one names the model's class (transformers'
    name) in `architectures`: its QA and two-label classification heads have the same parameters."""
    record = config.to_dict()
    if is_modern_config(config):
        # a distillation student (distillation/student.py) names the model it wraps: readers pick the head by it
        record["architectures"] = [type(getattr(model, "student", model)).__name__]
    return record


def is_modern_config(config: ModelConfig) -> bool:
    return isinstance(config, ModernBertConfig)


def pretraining_model(config: ModelConfig) -> nn.Module:
    """BertForPreTraining (MLM + NSP heads) or ModernBertForMaskedLM (MLM head only)."""
    return ModernBertForMaskedLM(config) if is_modern_config(config) else BertForPreTraining(config)


def question_answering_model(config: ModelConfig) -> nn.Module:
    if is_modern_config(config):
        return ModernBertForQuestionAnswering(config)
    return BertForQuestionAnswering(config)


def sequence_classification_model(config: ModelConfig, num_labels: int) -> nn.Module:
    if is_modern_config(config):
        return ModernBertForSequenceClassification(config, num_labels)
    return BertForSequenceClassification(config, num_labels)


def encoder_of(model: nn.Module) -> nn.Module:
    """The encoder inside a task model of either family (`bert` or `model`)."""
    return model.model if hasattr(model, "model") and isinstance(model.config, ModernBertConfig) else model.bert


def layers_of(encoder: nn.Module) -> nn.ModuleList:
    """The transformer layers of an encoder of either family: BERT's `encoder.layer`, ModernBERT's `layers`."""
    return encoder.encoder.layer if isinstance(encoder, BertModel) else encoder.layers
