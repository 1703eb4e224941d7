"""Per-token activations of chosen layers, as Google's extract_features.py writes them: one JSON line per input
line, {"linex_index": i, "features": [{"token": t, "layers": [{"index": l, "values": [...]}, ...]}, ...]}, each value
rounded to 6 decimals, only the real tokens of the row ([CLS], the text's pieces, [SEP]; no padding).

An input line is one text, or two separated by " ||| " (a pair: `[CLS] a [SEP] b [SEP]`, segment 1 for b and its
[SEP]; the pair cut longest-first to the length, as Google's _truncate_seq_pair). Layer indexes are Google's: the
encoder layers' outputs numbered from 0 for the first, and -1 for the last (the embeddings are not among them), so
index i is transformers' hidden_states[i + 1] (for a negative i, hidden_states[i]).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import read_text_file
from bertrecipe.finetuning.glue import truncate_pair_lengths
from bertrecipe.model.capture import capturing, encoder_layers
from bertrecipe.model.families import is_modern_config
from bertrecipe.tokenization.bpe import BpeVocab

PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


@dataclass(frozen=True)
class ExtractionInput:
    """One input line: its index (Google's unique_id, written as linex_index) and its text or pair of texts."""

    index: int
    text_a: str
    text_b: Optional[str] = None


@dataclass
class ExtractionRows:
    """The examples laid out as the model reads them: each one's token strings, and int64 arrays [N, S]."""

    tokens: list[list[str]]
    input_ids: np.ndarray
    segment_ids: np.ndarray
    input_mask: np.ndarray


def read_extraction_inputs(path: str | Path) -> list[ExtractionInput]:
    """Every line of the file (stripped, as Google's reader), a pair where " ||| " separates two texts."""
    text = read_text_file(path, "text file of one input a line")
    inputs = []
    for index, line in enumerate(text.splitlines()):
        match = PAIR.match(line.strip())
        inputs.append(ExtractionInput(index, match.group(1), match.group(2)) if match
                      else ExtractionInput(index, line.strip()))
    return inputs


def layer_numbers(indexes: Sequence[int], layer_count: int) -> list[int]:
    """Google's layer indexes as capture's layer numbers (1 = the first layer's output); InputError for an index
    the model does not have."""
    numbers = []
    for index in indexes:
        if not -layer_count <= index < layer_count:
            raise InputError(f"--layers {index}: the model has {layer_count} layers, so an index is "
                             f"{-layer_count}..{layer_count - 1} (-1 the last layer, 0 the first)")
        numbers.append(index + 1 if index >= 0 else layer_count + index + 1)
    return numbers


def token_strings(vocab: object, ids: Sequence[int]) -> list[str]:
    if isinstance(vocab, BpeVocab):
        return [vocab.tokenizer.id_to_token(i) for i in ids]
    return [vocab.tokens[i] for i in ids]  # type: ignore[attr-defined]


def lay_out(tokenizer: object, inputs: Sequence[ExtractionInput], max_seq_length: int) -> ExtractionRows:
    """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` rows of max_seq_length, texts cut as Google cuts them."""
    vocab = tokenizer.vocab  # type: ignore[attr-defined]
    cls_id, sep_id = vocab.id("[CLS]"), vocab.id("[SEP]")
    shape = (len(inputs), max_seq_length)
    rows = ExtractionRows([], np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64))
    texts = [text for item in inputs for text in (item.text_a, item.text_b) if text is not None]
    ids, offsets = tokenizer.encode_lines([t.replace("\n", " ") for t in texts])  # type: ignore[attr-defined]
    pieces = iter(ids[offsets[k]:offsets[k + 1]].tolist() for k in range(len(texts)))
    for row, item in enumerate(inputs):
        a = next(pieces)
        b = next(pieces) if item.text_b is not None else None
        la, lb = (min(len(a), max_seq_length - 2), 0) if b is None else truncate_pair_lengths(
            len(a), len(b), max_seq_length - 3)
        row_ids = [cls_id, *a[:la], sep_id] + ([*b[:lb], sep_id] if b is not None else [])
        rows.input_ids[row, :len(row_ids)] = row_ids
        rows.segment_ids[row, la + 2:len(row_ids)] = 1
        rows.input_mask[row, :len(row_ids)] = 1
        rows.tokens.append(token_strings(vocab, row_ids))
    return rows


def check_length(max_seq_length: int, pairs: bool) -> None:
    shortest = 5 if pairs else 3  # a token of each text beside [CLS] and the [SEP]s
    if max_seq_length < shortest:
        raise InputError(f"--max_seq_length {max_seq_length}: too short to hold a token of each text with [CLS] and "
                         f"[SEP] (at least {shortest})")


def run_encoder(encoder: nn.Module, ids: torch.Tensor, segments: torch.Tensor, mask: torch.Tensor) -> None:
    if is_modern_config(encoder.config):
        encoder(ids, mask)
    else:
        encoder(ids, segments, mask)


def extracted_layers(encoder: nn.Module, rows: ExtractionRows, layers: Sequence[int], batch_size: int,
                     device: torch.device) -> Iterator[dict[int, np.ndarray]]:
    """Per example, {layer number: its real tokens' outputs [tokens, hidden] as float32}, batch by batch."""
    encoder.eval()
    for first in range(0, len(rows.tokens), batch_size):
        cut = slice(first, first + batch_size)
        length = int(rows.input_mask[cut].sum(axis=1).max())  # the batch trimmed to its longest row
        arrays = [torch.from_numpy(a[cut, :length]).to(device)
                  for a in (rows.input_ids, rows.segment_ids, rows.input_mask)]
        with torch.inference_mode(), capturing(encoder, set(layers), {"hidden"}) as captured:
            run_encoder(encoder, *arrays)
        outputs = {layer: captured.hidden[layer].float().cpu().numpy() for layer in layers}
        for offset, row in enumerate(range(first, min(first + batch_size, len(rows.tokens)))):
            count = len(rows.tokens[row])
            yield {layer: outputs[layer][offset, :count] for layer in layers}


def json_line(index: int, tokens: Sequence[str], indexes: Sequence[int], layers: Sequence[int],
              outputs: dict[int, np.ndarray]) -> str:
    """One output line, keys in Google's order, values as Python's round(float(x), 6) gives them."""
    features = [{"token": token, "layers": [{"index": google, "values": [round(x, 6) for x in
                                                                        outputs[layer][position].tolist()]}
                                            for google, layer in zip(indexes, layers, strict=True)]}
                for position, token in enumerate(tokens)]
    return json.dumps({"linex_index": index, "features": features}) + "\n"


def write_features(out: BinaryIO, encoder: nn.Module, inputs: Sequence[ExtractionInput], rows: ExtractionRows,
                   indexes: Sequence[int], batch_size: int, device: torch.device) -> None:
    """The JSON lines of every input into `out`; the indexes are checked (layer_numbers) before the first line."""
    layers = layer_numbers(indexes, encoder_layers(encoder))
    for item, tokens, outputs in zip(inputs, rows.tokens, extracted_layers(encoder, rows, layers, batch_size,
                                                                           device), strict=True):
        out.write(json_line(item.index, tokens, indexes, layers, outputs).encode("utf-8"))
