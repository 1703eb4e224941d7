"""Reading, normalizing and writing BERT weights in the formats users bring (docs/interfaces.md, section 3).

Accepted sources: our checkpoints (`ckpt_<step>.pt`, `pytorch_model.bin` = {"model": state_dict}), NVIDIA's
(`dense_act` layers, `gamma`/`beta` LayerNorms, a `module.` prefix), and Hugging Face directories (`config.json`
with `model.safetensors` or `pytorch_model.bin`, with or without the `bert.` prefix and the heads). Nothing is
unpickled beyond tensors and plain containers (`torch.load(..., weights_only=True)`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.model import sharded_checkpoint
from bertrecipe.model.bert import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)
from bertrecipe.model.families import ModelConfig, config_from_dict, config_from_json_file, is_modern_config
from bertrecipe.model.modern import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertModel,
)
from bertrecipe.model.torch_files import WeightsError, load_torch_file
from bertrecipe.tokenization.vocab_files import (
    load_vocab_file,
    transformers_tokenizer_files,
    transformers_tokenizer_names,
)

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CONFIG_FILES = ("config.json", "bert_config.json")
# Rows of these tensors follow the vocabulary, which may be padded to a multiple of 8 or not.
VOCAB_ROW_KEYS = ("embeddings.word_embeddings.weight", "cls.predictions.decoder.weight", "cls.predictions.bias")
# Our names -> NVIDIA's for the layers NVIDIA fuses with their activation.
NVIDIA_FUSED = (
    (re.compile(r"(bert\.encoder\.layer\.\d+\.intermediate)\.dense\."), r"\1.dense_act."),
    (re.compile(r"bert\.pooler\.dense\."), "bert.pooler.dense_act."),
    (re.compile(r"cls\.predictions\.transform\.dense\."), "cls.predictions.transform.dense_act."),
)
ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")
MODERN_ENCODER_PREFIXES = ("embeddings.", "layers.", "final_norm.")  # a bare ModernBertModel's names
# A distilled student's training extras (its projection to the teacher's width, distillation/student.py): saved
# with its weights, never weights of a model, so every reader and writer here leaves them out without a word.
DISTILLATION_PREFIX = "distillation."


@dataclass
class LoadedWeights:
    state_dict: dict[str, Tensor]  # in our (= Hugging Face BertForPreTraining or ModernBertForMaskedLM) names
    config: Optional[ModelConfig]  # None when the source carries no configuration (NVIDIA's checkpoints)
    source_format: str  # "ours", "nvidia" or "huggingface"
    tokenizer: Optional[dict[str, Any]] = None  # the "tokenizer" record of our checkpoints (vocab_files' identity)


def _find_config_beside(path: Path) -> Optional[ModelConfig]:
    folder = path if path.is_dir() else path.parent
    for name in CONFIG_FILES:
        if (folder / name).is_file():
            return read_config(folder / name)
    return None


def read_config(path: str | Path) -> ModelConfig:
    """A `bert_config.json` or Hugging Face `config.json` of either family (families.py); WeightsError
    "<path>: <key> is ..., expected ..." for a missing, unreadable or malformed file or a value that cannot build
    a model."""
    try:
        return config_from_json_file(path)
    except InputError as error:  # model.ConfigError: already one line naming the file, the key and the fix
        raise WeightsError(str(error)) from None


def _weight_entries(state_dict: dict[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    """The tensors of a state dict under their names without DDP's `module.` prefix (a pickle may hold int keys
    or other objects, a distilled student its training extras: not weights)."""
    for key, value in state_dict.items():
        if isinstance(value, Tensor) and isinstance(key, str):
            name = key.removeprefix("module.")
            if not name.startswith(DISTILLATION_PREFIX):
                yield name, value


def normalize_state_dict(state_dict: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    """Renames a state dict from any accepted naming to ours; returns it and the naming it came in."""
    if any(isinstance(key, str) and ".tok_embeddings." in key for key in state_dict):
        return _normalize_modern(state_dict)
    source_format = "ours"
    result: dict[str, Tensor] = {}
    for name, value in _weight_entries(state_dict):
        if name.startswith(ENCODER_PREFIXES):
            name = "bert." + name
            source_format = "huggingface"
        if ".dense_act." in name or name.endswith((".gamma", ".beta")):
            source_format = "nvidia"
        name = name.replace(".dense_act.", ".dense.")
        name = re.sub(r"\.gamma$", ".weight", name)
        name = re.sub(r"\.beta$", ".bias", name)
        if name.endswith(".position_ids") or name.endswith(".token_type_ids"):
            continue  # index buffers of other implementations, not weights
        result[name] = value
    # Some writers store the MLM bias only as the decoder's bias.
    decoder_bias = result.pop("cls.predictions.decoder.bias", None)
    if decoder_bias is not None and "cls.predictions.bias" not in result:
        result["cls.predictions.bias"] = decoder_bias
    return result, source_format


def _normalize_modern(state_dict: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    """A ModernBERT state dict in our names (= transformers' ModernBertForMaskedLM names): a bare encoder's
    names gain the `model.` prefix; the tied decoder weight, when stored, is dropped (it is the embeddings)."""
    source_format = "ours"
    result: dict[str, Tensor] = {}
    for name, value in _weight_entries(state_dict):
        if name.startswith(MODERN_ENCODER_PREFIXES):
            name = "model." + name
            source_format = "huggingface"
        if name != "decoder.weight":
            result[name] = value
    return result, source_format


def checkpoint_identity(path: str | Path) -> dict[str, Any]:
    """The checkpoint's path and the sha256 of the weights a run reads from it: the file itself, or a folder's
    weights file (the first of HF_WEIGHT_FILES it holds, as model.weights.read_weights takes it); a sharded
    checkpoint's training state (which records each shard file's size)."""
    path = Path(path)
    if sharded_checkpoint.is_sharded_checkpoint(path):
        state = path / sharded_checkpoint.TRAINING_STATE
        return {"path": str(path), "weights_file": state.name, "sha256": file_sha256(state)}
    weights = path if path.is_file() else next((path / n for n in HF_WEIGHT_FILES if (path / n).is_file()), None)
    if weights is None:
        return {"path": str(path), "weights_file": None, "sha256": None}
    return {"path": str(path), "weights_file": weights.name, "sha256": file_sha256(weights)}


def read_weights(path: str | Path) -> LoadedWeights:
    """Reads any accepted checkpoint file or Hugging Face directory into our names (config when known)."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"{path}: no such checkpoint file or directory")
    config: Optional[ModelConfig] = None
    if sharded_checkpoint.is_sharded_checkpoint(path):
        return _read_sharded_checkpoint(path)
    if path.is_dir():
        weight_file = next((path / n for n in HF_WEIGHT_FILES if (path / n).is_file()), None)
        if weight_file is None:
            raise WeightsError(f"{path}: directory holds none of {', '.join(HF_WEIGHT_FILES)}; pass a Hugging Face "
                               "model folder or a checkpoint file")
        config = _find_config_beside(path)
        if config is None:
            raise WeightsError(f"{path}: directory holds no config.json or bert_config.json; put the model's config "
                               "beside its weights")
        path = weight_file
    if path.suffix == ".safetensors":
        try:
            raw: Any = load_safetensors(str(path))
        except Exception as error:  # noqa: BLE001 - safetensors raises several types for a bad file
            raise WeightsError(f"{path}: not a readable safetensors file ({error}); use an earlier or a fresh copy"
                               ) from None
    else:
        raw = load_torch_file(path)
    tokenizer = None
    if isinstance(raw, dict) and isinstance(raw.get("model"), dict):
        if isinstance(raw.get("config"), dict):
            config = config_from_dict(raw["config"], source=f"{path} (its 'config' entry)", strict=False)
        tokenizer = raw.get("tokenizer")
        raw = raw["model"]
    if not isinstance(raw, dict) or not any(isinstance(v, Tensor) for v in raw.values()):
        raise WeightsError(f"{path}: holds no state dict (expected tensors, or a dict with a 'model' entry)")
    state_dict, source_format = normalize_state_dict(raw)
    if not state_dict:  # tensors only under int keys or as index buffers: nothing a model could load
        raise WeightsError(f"{path}: holds no weights (no tensor under a parameter name)")
    if config is None:
        config = _find_config_beside(path)
    return LoadedWeights(state_dict, config, source_format, tokenizer)


def _read_sharded_checkpoint(folder: Path) -> LoadedWeights:
    """A sharded checkpoint folder's whole weights, config and tokenizer record (model/sharded_checkpoint.py)."""
    state = sharded_checkpoint.read_training_state(folder)
    config = None
    if isinstance(state.get("config"), dict):
        config = config_from_dict(state["config"], source=f"{folder} (its 'config' entry)", strict=False)
    state_dict, source_format = normalize_state_dict(sharded_checkpoint.whole_model_state(folder))
    return LoadedWeights(state_dict, config, source_format, state.get("tokenizer"))


def _fit_vocab_rows(tensor: Tensor, rows: int) -> Tensor:
    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        return tensor[:rows]
    padded = tensor.new_zeros((rows, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    if padded.dim() == 2:  # padding embedding rows get the usual init, never zero vectors that LAMB cannot scale
        nn.init.normal_(padded[tensor.shape[0] :], std=0.02)
    return padded


def load_weights_into(model: nn.Module, weights: LoadedWeights, source: str | Path = "checkpoint") -> list[str]:
    """Copies `weights` into `model`; returns the names of model parameters the source did not provide.

    The encoder must be complete and every shape must match (apart from vocab padding); heads that the source
    lacks (e.g. `qa_outputs` when starting from a pre-training checkpoint) keep their initialization.
    """
    if is_modern_config(model.config):
        return _load_modern_into(model, weights, source)
    own = model.state_dict()
    state = _without_extras(weights.state_dict)
    if not any(name.startswith("bert.") for name in own):  # a bare encoder (BertModel) takes unprefixed names
        state = {name.removeprefix("bert."): value for name, value in state.items()}
    for name in own:
        if name.endswith(VOCAB_ROW_KEYS) and name in state:
            vocab_size = weights.config.vocab_size if weights.config else None
            if vocab_size is not None and vocab_size != model.config.vocab_size:
                raise WeightsError(
                    f"{source}: vocab_size {vocab_size} does not match the model's {model.config.vocab_size}; pass "
                    "the config the checkpoint was trained with"
                )
            if abs(state[name].shape[0] - own[name].shape[0]) < 8:  # only padding may differ
                state[name] = _fit_vocab_rows(state[name], own[name].shape[0])
    if "cls.predictions.decoder.weight" in own and "cls.predictions.decoder.weight" not in state:
        state.pop("cls.predictions.decoder.weight", None)  # tied: comes with the word embeddings
    _check_shapes(own, state, source)
    missing, _unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "cls.predictions.decoder.weight"]
    encoder_missing = [m for m in missing if m.removeprefix("bert.").startswith(("embeddings.", "encoder."))]
    if encoder_missing:
        raise WeightsError(
            f"{source}: missing {len(encoder_missing)} encoder weights (first: {encoder_missing[0]});"
            " is this a BERT checkpoint for this config?"
        )
    return missing


def _without_extras(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A copy without a distilled student's training extras (LoadedWeights made elsewhere than read_weights)."""
    return {name: value for name, value in state_dict.items() if not name.startswith(DISTILLATION_PREFIX)}


def _check_shapes(own: dict[str, Tensor], state: dict[str, Tensor], source: str | Path) -> None:
    for name, tensor in state.items():
        if name in own and own[name].shape != tensor.shape:
            raise WeightsError(
                f"{source}: {name} has shape {tuple(tensor.shape)} but the model expects {tuple(own[name].shape)}"
                " (does the checkpoint's config match --config_file?)"
            )


def _load_modern_into(model: nn.Module, weights: LoadedWeights, source: str | Path) -> list[str]:
    """load_weights_into for the modern family: same names as transformers', the decoder tied."""
    own = model.state_dict()
    state = _without_extras(weights.state_dict)
    if isinstance(model, ModernBertModel):  # a bare encoder takes unprefixed names
        state = {name.removeprefix("model."): value for name, value in state.items()}
    vocab_size = getattr(weights.config, "vocab_size", None)
    if vocab_size is not None and vocab_size != model.config.vocab_size:
        raise WeightsError(f"{source}: vocab_size {vocab_size} does not match the model's "
                           f"{model.config.vocab_size}; pass the config the checkpoint was trained with")
    _check_shapes(own, state, source)
    missing, _unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "decoder.weight"]
    encoder_missing = [m for m in missing if m.removeprefix("model.").startswith(MODERN_ENCODER_PREFIXES)]
    if encoder_missing:
        raise WeightsError(f"{source}: missing {len(encoder_missing)} encoder weights (first: {encoder_missing[0]});"
                           " is this a ModernBERT checkpoint for this config?")
    return missing


def _modern_model_for_weights(weights: LoadedWeights, config: ModelConfig) -> nn.Module:
    state = weights.state_dict
    architectures = config.extra.get("architectures") or [""]
    if "classifier.weight" in state:
        if architectures[0].endswith("QuestionAnswering"):
            return ModernBertForQuestionAnswering(config)
        return ModernBertForSequenceClassification(config, num_labels=state["classifier.weight"].shape[0])
    if any(name.startswith(("head.", "decoder.")) for name in state):
        return ModernBertForMaskedLM(config)
    return ModernBertModel(config)


def model_for_weights(weights: LoadedWeights, config: ModelConfig) -> nn.Module:
    """An untrained model of the class whose heads the weights carry (a bare encoder when they carry none)."""
    if is_modern_config(config):
        return _modern_model_for_weights(weights, config)
    state = weights.state_dict
    if "qa_outputs.weight" in state:
        return BertForQuestionAnswering(config)
    if "classifier.weight" in state:
        return BertForSequenceClassification(config, num_labels=state["classifier.weight"].shape[0])
    if any(name.startswith("cls.") for name in state):
        return BertForPreTraining(config)
    return BertModel(config, add_pooling_layer="bert.pooler.dense.weight" in state)


def export_state_dict(model: nn.Module, naming: str = "ours") -> dict[str, Tensor]:
    """The model's weights for writing: vocab rows cut to vocab_size, tied decoder left out (and a distilled
    student's training extras), NVIDIA names when `naming` is "nvidia"."""
    if is_modern_config(model.config):  # transformers' names already; the tied decoder comes with the embeddings
        prefix = "model." if isinstance(model, ModernBertModel) else ""
        return {prefix + name: tensor.detach().cpu().contiguous()
                for name, tensor in _without_extras(model.state_dict()).items() if name != "decoder.weight"}
    vocab_size = model.config.vocab_size
    result: dict[str, Tensor] = {}
    bare_encoder = isinstance(model, BertModel)
    for name, tensor in _without_extras(model.state_dict()).items():
        if name == "cls.predictions.decoder.weight":
            continue
        if bare_encoder:  # files always use the full BertForPreTraining names
            name = "bert." + name
        if name.endswith(VOCAB_ROW_KEYS):
            tensor = tensor[:vocab_size]
        if naming == "nvidia":
            for pattern, replacement in NVIDIA_FUSED:
                name = pattern.sub(replacement, name)
        result[name] = tensor.detach().cpu().contiguous()
    return result


def _modern_hf_config(model: nn.Module) -> dict[str, Any]:
    config = model.config.to_dict()
    architecture = {ModernBertForQuestionAnswering: "ModernBertForQuestionAnswering",
                    ModernBertForSequenceClassification: "ModernBertForSequenceClassification",
                    ModernBertModel: "ModernBertModel"}.get(type(model), "ModernBertForMaskedLM")
    config.update(architectures=[architecture], tie_word_embeddings=True)
    if isinstance(model, ModernBertForSequenceClassification):
        _set_labels(config, model.num_labels)
    return config


def _set_labels(config: dict[str, Any], num_labels: int) -> None:
    config["num_labels"] = num_labels
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    if num_labels == 1:
        config["problem_type"] = "regression"


def _hf_config(model: nn.Module) -> dict[str, Any]:
    if is_modern_config(model.config):
        return _modern_hf_config(model)
    config = model.config.to_dict()
    architecture = {
        BertForPreTraining: "BertForPreTraining",
        BertForQuestionAnswering: "BertForQuestionAnswering",
        BertForSequenceClassification: "BertForSequenceClassification",
    }.get(type(model), "BertModel")
    config.update(architectures=[architecture], model_type="bert", pad_token_id=0,
                  position_embedding_type="absolute")
    if isinstance(model, BertForSequenceClassification):
        _set_labels(config, model.num_labels)
    return config


def export_huggingface(model: nn.Module, out_dir: str | Path, vocab_file: Optional[str | Path] = None,
                       overwrite: bool = False, do_lower_case: Optional[bool] = None) -> Path:
    """Writes a Hugging Face directory: config.json, model.safetensors and, when given, the vocab with what
    transformers' AutoTokenizer needs besides it (vocab_files.transformers_tokenizer_files; `do_lower_case` where a
    WordPiece vocab's tokens do not tell its casing), each atomically, all made before the first is written. An
    existing directory keeps every other file; an export file already there is refused unless `overwrite`."""
    out_dir = Path(out_dir)
    check_export_target(out_dir, huggingface_export_names(vocab_file), overwrite)
    config, state, tokenizer_files = huggingface_parts(model, vocab_file, do_lower_case)
    files = {"config.json": (json.dumps(config, indent=2) + "\n").encode("utf-8"),
             "model.safetensors": safetensors_bytes(state, metadata={"format": "pt"}), **tokenizer_files}
    for name, content in files.items():
        write_atomic(out_dir / name, lambda f, content=content: f.write(content))
    return out_dir


def huggingface_parts(model: nn.Module, vocab_file: Optional[str | Path] = None, do_lower_case: Optional[bool] = None
                      ) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, bytes]]:
    """What a Hugging Face folder of `model` holds: config.json's content (architectures, labels, the vocab's special
    ids), the weights in transformers' names, and the tokenizer files of `vocab_file` (name -> bytes)."""
    config = _hf_config(model)
    tokenizer_files: dict[str, bytes] = {}
    if vocab_file is not None:
        vocab = load_vocab_file(vocab_file)
        modern = is_modern_config(model.config)
        tokenizer_files = transformers_tokenizer_files(
            vocab, model.config.max_position_embeddings, do_lower_case,
            model_input_names=["input_ids", "attention_mask"] if modern else None)  # ModernBERT has no segments
        config.update(_special_token_ids(vocab, modern))
    return config, export_state_dict(model), tokenizer_files


def huggingface_export_names(vocab_file: Optional[str | Path]) -> list[str]:
    """The files export_huggingface writes: these and no other are its own in a folder."""
    return ["config.json", "model.safetensors",
            *(transformers_tokenizer_names(vocab_file) if vocab_file is not None else [])]


def _special_token_ids(vocab: Any, modern: bool) -> dict[str, int]:
    """The tokenizer's special ids as config.json names them: transformers otherwise takes its defaults, which for
    ModernBERT are the released tokenizer's (50281-50283), outside a smaller vocab (and a padding row outside the
    embeddings stops transformers from building the model)."""
    ids = {"pad_token_id": vocab.id("[PAD]")}
    if modern:  # as the released ModernBERT's config.json: [CLS] begins a text and [SEP] ends it
        cls, sep = vocab.id("[CLS]"), vocab.id("[SEP]")
        ids.update(cls_token_id=cls, sep_token_id=sep, bos_token_id=cls, eos_token_id=sep)
    return ids


def check_export_target(out_dir: Path, names: list[str], overwrite: bool) -> None:
    """Refuses (WeightsError) a target that is a file, or a directory already holding one of the export's files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise WeightsError(f"{out_dir}: exists and is not a directory; choose a directory for the Hugging Face "
                           "export")
    taken = [name for name in names if (out_dir / name).exists()]
    if taken and not overwrite:
        raise WeightsError(f"{out_dir}: already holds {', '.join(taken)}; pass --overwrite to replace them or "
                           "choose another directory")
