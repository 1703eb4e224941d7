"""What a fine-tuning run (or an export, or inference) starts from: the tokenizer of a vocab, the model's config and
the checkpoint's weights, and the model built from them, each checked against the others."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.model.families import ModelConfig
from bertrecipe.model.weights import LoadedWeights, load_weights_into, read_config, read_weights
from bertrecipe.tokenization.bpe import BpeTokenizer, BpeVocab
from bertrecipe.tokenization.vocab_files import (
    identity_from_record,
    identity_of,
    load_vocab_file,
    refuse_other_tokenizer,
)
from bertrecipe.tokenization.wordpiece import BertTokenizer, Vocab, check_vocab_for_model


def load_tokenizer(vocab_file: str | Path, do_lower_case: bool,
                   allow_vocab_mismatch: bool = False) -> BertTokenizer | BpeTokenizer:
    """The tokenizer of a WordPiece vocab.txt or tokenizer.json (a BERT folder's); a vocab whose casing
    --do_lower_case contradicts is refused (InputError naming the file) unless allow_vocab_mismatch (then a warning):
    tokenization.wordpiece.check_vocab_for_model. A byte-level BPE tokenizer.json (a ModernBERT folder's) gives its
    BPE, to which --do_lower_case does not apply. Which kind a file is, its content says."""
    vocab = load_vocab_file(vocab_file)
    if isinstance(vocab, BpeVocab):
        if do_lower_case:
            print(f"warning: {vocab_file}: --do_lower_case does not apply to a tokenizer.json of byte-level BPE "
                  "(its own normalizer decides the casing); ignored", file=sys.stderr, flush=True)
        return BpeTokenizer(vocab)
    check_vocab_for_model(vocab, do_lower_case=do_lower_case, allow_mismatch=allow_vocab_mismatch)
    return BertTokenizer(vocab, do_lower_case)


def config_and_weights(config_file: Optional[str],
                       init_checkpoint: Optional[str]) -> tuple[ModelConfig, Optional[LoadedWeights]]:
    """The model's config (--config_file, else the checkpoint's own) and the checkpoint's weights (None without
    one). A config that does not fit the weights is reported when they are loaded."""
    weights = read_weights(init_checkpoint) if init_checkpoint else None
    if config_file:
        return read_config(config_file), weights
    if weights is None or weights.config is None:
        raise InputError(f"{init_checkpoint or '--init_checkpoint'}: no config known for this model; "
                         "pass --config_file")
    return weights.config, weights


def build_model(make: Callable[[ModelConfig], nn.Module], config: ModelConfig, weights: Optional[LoadedWeights],
                source: Optional[str], vocab: Vocab | BpeVocab, max_seq_length: int, allow_vocab_mismatch: bool = False
                ) -> nn.Module:
    """make(config) with the checkpoint's weights; the vocab (check_vocab_for_model: its size against the config's
    vocab_size) and the sequence length must fit the config."""
    check_vocab_for_model(vocab, model_vocab_size=config.vocab_size, allow_mismatch=allow_vocab_mismatch)
    if weights is not None:  # a checkpoint of ours records the tokenizer it was trained with
        refuse_other_tokenizer(identity_of(vocab), identity_from_record(weights.tokenizer, source or "checkpoint"),
                               "pass the vocab the checkpoint was trained with", allow_vocab_mismatch)
    if max_seq_length > config.max_position_embeddings:
        raise InputError(f"--max_seq_length {max_seq_length} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    model = make(config)
    if weights is not None:
        load_weights_into(model, weights, source or "checkpoint")
    return model
