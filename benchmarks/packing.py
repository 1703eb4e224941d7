#!/usr/bin/env python3
"""Packed rows against padded batches: real (non-padding) tokens per second of a modern-family training step
(forward, 30 % masked-LM, backward; no optimizer) at seq 512, on Wikipedia's document lengths.

The lengths are those of the articles of a real Wikipedia dump (--wiki, default ../shared/data's sample; the
repository's own small excerpt when that is absent), tokenized with the BERT uncased vocab and cut into rows of at
most 512 tokens as document-chunk shards are: most rows are the short tail of an article. Each micro-batch of
--samples such rows is trained three ways, in the same run and on the same samples:
  padded        [samples, 512] with every position computed (skip_padding off: what a padded batch costs)
  unpadded      the same batch, dense layers on the real tokens only (the recipe's default for padded input)
  packed        --pack_sequences: the samples best fit into fewer rows, each attending only to itself
The ratio packed / padded is the issue's measure (goal: at least 1.3x).

    python benchmarks/packing.py
    python benchmarks/packing.py --steps 6 --samples 16 --seq 512
"""
from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from bertrecipe.common.hardware import detect, host_line
from bertrecipe.dataprep.text_formatting import wiki_articles
from bertrecipe.model.modern import ModernBertForMaskedLM
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.pretraining.packing import pack_batch
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab

REPO = Path(__file__).resolve().parents[1]
SHARED_WIKI = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data")) / "wiki" / \
    "enwiki-sample-pages-articles.xml.bz2"
OWN_WIKI = REPO / "tests" / "data" / "wiki" / "enwiki-excerpt.xml.bz2"
SHARED_VOCAB = SHARED_WIKI.parents[1] / "minilm" / "vocab.txt"  # BERT's whole uncased vocab
VOCAB = SHARED_VOCAB if SHARED_VOCAB.is_file() else REPO / "tests" / "data" / "vocab-uncased-excerpt.txt"
MODEL = {"model_type": "modernbert", "vocab_size": 30528, "hidden_size": 256, "num_hidden_layers": 4,
         "num_attention_heads": 4, "intermediate_size": 384, "max_position_embeddings": 8192,
         "local_attention": 128, "pad_token_id": 0}


def row_lengths(wiki: Path, seq: int) -> list[int]:
    """Rows of at most `seq` tokens ([CLS] and [SEP] included) that the dump's articles are cut into."""
    tokenizer = BertTokenizer(load_vocab(VOCAB), do_lower_case=True)
    lengths = []
    for article in wiki_articles(wiki):
        tokens = len(tokenizer.tokenize(article))
        while tokens > 0:
            lengths.append(min(tokens, seq - 2) + 2)
            tokens -= seq - 2
    return lengths


def padded_batch(lengths: list[int], seq: int, generator: torch.Generator) -> dict[str, np.ndarray]:
    ids = torch.randint(1000, MODEL["vocab_size"], (len(lengths), seq), generator=generator).numpy()
    mask = (np.arange(seq)[None] < np.array(lengths)[:, None]).astype(np.int64)
    masked = (torch.rand(len(lengths), seq, generator=generator).numpy() < 0.3) & (mask == 1)
    return {"input_ids": ids * mask, "segment_ids": np.zeros_like(ids), "input_mask": mask,
            "masked_lm_labels": np.where(masked, ids, -1)}


def step_seconds(model: ModernBertForMaskedLM, batch: dict[str, np.ndarray], way: str) -> float:
    tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
    model.model.skip_padding = way != "padded"
    began = time.perf_counter()
    loss = model(tensors["input_ids"], attention_mask=tensors["input_mask"],
                 masked_lm_labels=tensors["masked_lm_labels"], document_ids=tensors.get("document_ids")).loss
    loss.backward()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wiki", type=Path, default=SHARED_WIKI if SHARED_WIKI.is_file() else OWN_WIKI)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = row_lengths(args.wiki, args.seq)
    print(f"# {host_line(detect('cpu'), 'fp32')}, {args.threads} threads; {args.wiki.name}:"
          f" {len(lengths)} rows, mean {np.mean(lengths):.0f} tokens of {args.seq} ({np.mean(lengths) / args.seq:.0%})")
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig.from_dict(MODEL)).train()
    rng, generator = random.Random(0), torch.Generator().manual_seed(0)
    seconds = {"padded": 0.0, "unpadded": 0.0, "packed": 0.0}
    real_tokens, packed_rows = 0, 0
    for step in range(args.steps + 1):  # the first step of each way warms up and is not counted
        batch = padded_batch(rng.sample(lengths, args.samples), args.seq, generator)
        packed = pack_batch(batch)
        for way, data in (("padded", batch), ("unpadded", batch), ("packed", packed)):
            taken = step_seconds(model, data, way)
            if step:
                seconds[way] += taken
        if step:
            real_tokens += int(batch["input_mask"].sum())
            packed_rows += len(packed["input_ids"])
    print(f"{args.samples} samples a micro-batch -> {packed_rows / args.steps:.1f} packed rows")
    print("| way | real tokens/s | vs padded |")
    print("|---|---:|---:|")
    for way, total in seconds.items():
        print(f"| {way} | {real_tokens / total:,.0f} | {seconds['padded'] / total:.2f}x |")


if __name__ == "__main__":
    main()
