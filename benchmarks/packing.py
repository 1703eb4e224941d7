"""Packed rows against padded batches: real (non-padding) tokens per second of a modern-family training step
(forward, 30 % masked-LM, backward; no optimizer) at seq 512, on Wikipedia's document lengths.

The lengths are those of the articles of a real Wikipedia dump (--wiki, default ../shared/data's sample; the
repository's own small excerpt when that is absent), tokenized with the BERT uncased vocab and cut into rows of at
most 512 tokens as document-chunk shards are. A dump's first pages are long articles (the sample's mean is about
3,900 words), while English Wikipedia's articles average 668 words (WIKIPEDIA_MEAN_WORDS); --mean_words weighs the
dump's articles so that their mean is that (default) or another figure: of the weightings of these very articles
with that mean, the one closest to drawing them evenly (exponential tilting: weight exp(-rate * words)); 0 draws
them evenly, the dump as it is. An article's rows are drawn with its weight, as a stream of whole articles gives
them. Each micro-batch of --samples such rows is trained three ways, in the same run and on the same samples:
  padded        [samples, 512] with every position computed (skip_padding off: what a padded batch costs)
  unpadded      the same batch, dense layers on the real tokens only (the recipe's default for padded input)
  packed        --pack_sequences: the samples best fit into fewer rows, each attending only to itself
The ratio packed / padded is the issue's measure (goal: at least 1.3x).

    python -m benchmarks.packing
    python -m benchmarks.packing --steps 6 --samples 16 --seq 512 --mean_words 0
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import REPO, SHARED, SHARED_VOCAB, VOCAB_EXCERPT
from bertrecipe.common.hardware import detect, host_line
from bertrecipe.dataprep.text_formatting import wiki_articles
from bertrecipe.model.modern import ModernBertForMaskedLM
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.pretraining.packing import pack_batch
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab

SHARED_WIKI = SHARED / "wiki" / "enwiki-sample-pages-articles.xml.bz2"
OWN_WIKI = REPO / "tests" / "data" / "wiki" / "enwiki-excerpt.xml.bz2"
VOCAB = SHARED_VOCAB if SHARED_VOCAB.is_file() else VOCAB_EXCERPT
MODEL = {"model_type": "modernbert", "vocab_size": 30528, "hidden_size": 256, "num_hidden_layers": 4,
         "num_attention_heads": 4, "intermediate_size": 384, "max_position_embeddings": 8192,
         "local_attention": 128, "pad_token_id": 0}
# English Wikipedia on 23 April 2024: 6,815,688 articles, over 4.5 billion words (Wikipedia:Size of Wikipedia).
WIKIPEDIA_MEAN_WORDS = 668


def article_weights(words: list[int], mean_words: float) -> np.ndarray:
    """Weights (summing to 1) of articles of these word counts whose weighted mean is `mean_words`: proportional to
    exp(-rate * words), the rate found by bisection. ValueError when no rate reaches it (the mean must lie between
    the shortest and the longest article)."""
    counts = np.asarray(words, dtype=np.float64)
    if not counts.min() < mean_words < counts.max():
        raise ValueError(f"a mean of {mean_words} words is not between the articles' {counts.min():.0f} and "
                         f"{counts.max():.0f}")

    def weighted(rate: float) -> tuple[np.ndarray, float]:
        exponents = -rate * counts
        weights = np.exp(exponents - exponents.max())  # shifted: the heaviest article's is 1, none overflows
        weights /= weights.sum()
        return weights, float(weights @ counts)

    low, high = -1.0, 1.0  # a negative rate favours long articles, for a mean above the sample's
    for _ in range(200):
        rate = (low + high) / 2
        low, high = (rate, high) if weighted(rate)[1] > mean_words else (low, rate)
    weights, reached = weighted((low + high) / 2)
    if abs(reached - mean_words) > 1e-6 * mean_words:  # so close to an end that a rate within +-1 cannot reach it
        raise ValueError(f"a mean of {mean_words} words is too close to the articles' shortest or longest")
    return weights


def row_lengths(wiki: Path, seq: int, mean_words: float) -> tuple[list[int], list[float]]:
    """Rows of at most `seq` tokens ([CLS] and [SEP] included) that the dump's articles are cut into, and each
    row's weight: its article's (article_weights; even when `mean_words` is 0)."""
    tokenizer = BertTokenizer(load_vocab(VOCAB), do_lower_case=True)
    articles = list(wiki_articles(wiki))
    weights = (article_weights([len(a.split()) for a in articles], mean_words) if mean_words
               else np.full(len(articles), 1 / len(articles)))
    lengths, row_weights = [], []
    for article, weight in zip(articles, weights, strict=True):
        tokens = len(tokenizer.tokenize(article))
        while tokens > 0:
            lengths.append(min(tokens, seq - 2) + 2)
            row_weights.append(float(weight))
            tokens -= seq - 2
    return lengths, row_weights


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
    parser.add_argument("--mean_words", type=float, default=WIKIPEDIA_MEAN_WORDS,
                        help="the articles' weighted mean word count (default: English Wikipedia's, "
                             f"{WIKIPEDIA_MEAN_WORDS}); 0: the dump's articles drawn evenly")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        lengths, weights = row_lengths(args.wiki, args.seq, args.mean_words)
    except ValueError as error:
        parser.error(f"--mean_words with {args.wiki}: {error}")
    fill = np.average(lengths, weights=weights)
    drawn = f"articles weighted to a mean of {args.mean_words:.0f} words" if args.mean_words else "articles as drawn"
    print(f"# {host_line(detect('cpu'), 'fp32')}, {args.threads} threads; {args.wiki.name}, {drawn}:"
          f" {len(lengths)} rows, mean {fill:.0f} tokens of {args.seq} ({fill / args.seq:.0%})")
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig.from_dict(MODEL)).train()
    rng, generator = random.Random(0), torch.Generator().manual_seed(0)
    seconds = {"padded": 0.0, "unpadded": 0.0, "packed": 0.0}
    real_tokens, packed_rows = 0, 0
    for step in range(args.steps + 1):  # the first step of each way warms up and is not counted
        batch = padded_batch(rng.choices(lengths, weights, k=args.samples), args.seq, generator)
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
