"""Benchmark of dense-retrieval fine-tuning: run_retrieval.py's training (ours: bertrecipe.finetuning
.retrieval_training) against sentence-transformers' (SentenceTransformerTrainer with MultipleNegativesRankingLoss),
both fine-tuning the same encoder on the same pairs with the same options, then scored the same way.

    flock /tmp/bert-bench.lock python -m benchmarks.retrieval_training [--steps 20] [--batch 16] [--seq 128]
        [--lr 5e-5] [--seeds 1 2] [--threads 2] [--test_articles 8] [--output PREFIX]

Data (nothing is downloaded): SQuAD v1.1 dev ($BERT_SHARED_DATA/squad/dev-v1.1.json, else tests/data/squad's
excerpt) made into a BEIR folder split by article (squad_as_beir): the last --test_articles articles' paragraphs are
the corpus and their questions the test queries (qrels/test.tsv, each question's own paragraph relevant); every
other article's (question, title + paragraph) pairs are the training pairs (pairs.jsonl, and qrels/train.tsv over a
corpus of all paragraphs in the `train` folder). The model: all-MiniLM-L6-v2 ($BERT_SHARED_DATA/minilm, mean
pooling), else a seeded random 2-layer BERT over tests/data's vocab excerpt (then the nDCG figures mean little).
Both sides: --steps optimizer steps of --batch pairs, the same steps x batch pairs (a seeded draw) in the same
batches (ours' seeded shuffle; sentence-transformers given them in that order by a sequential batch sampler), --seq
tokens at most per text, AdamW (lr --lr, weight decay 0.01, eps 1e-6; fused) under a linear warm-up over 10 % of the
steps then linear decay, no gradient clipping (ours has none: the trainer's max_grad_norm is set to 0), fp32,
scale-20 query->document cross-entropy, dropout as the model's config has it, --threads torch threads, one after the
other in one process (alternating which goes first over the seeds). Measured: training pairs per second, from the
tokenization of the drawn pairs to the last step (ours tokenizes them once before its loop, sentence-transformers in
its data collator at each step, both counted), and nDCG@10 / MRR@10 / recall@100 of each side's trained model, both
scored by our metric code on embeddings each side computes itself (ours: encode_texts; theirs:
SentenceTransformer.encode); and the untrained model's scores. The goal (issue 40): ours >= 1.3x its pairs per
second, nDCG@10 the same within seed noise. Results to stdout, PREFIX.json (default
benchmarks/results/retrieval_training/<date>)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.common import REPO, SHARED, VOCAB_EXCERPT, host_threads_line, write_json

RESULTS = REPO / "benchmarks" / "results" / "retrieval_training"
GOAL = 1.3  # ours' pairs per second over sentence-transformers'


def squad_as_beir(squad_file: Path, out: Path, test_articles: int) -> dict[str, int]:
    """A BEIR folder out/test (corpus: the paragraphs of the last `test_articles` articles; their questions as
    queries; qrels/test.tsv) and out/train (all paragraphs; the other articles' questions; qrels/train.tsv), and
    out/pairs.jsonl (query, positive) of the training articles. Document ids are <article>-<paragraph>, titles
    the article's, underscores as spaces. Returns the counts."""
    articles = json.loads(squad_file.read_text(encoding="utf-8"))["data"]
    if not 0 < test_articles < len(articles):
        raise ValueError(f"{squad_file}: {len(articles)} articles; --test_articles must leave some for training")
    first_test = len(articles) - test_articles
    corpus: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    queries: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    qrels: dict[str, list[str]] = {"train": [], "test": []}
    pairs = []
    for a, article in enumerate(articles):
        split, title = ("test" if a >= first_test else "train"), article["title"].replace("_", " ")
        for p, paragraph in enumerate(article["paragraphs"]):
            document = {"_id": f"{a}-{p}", "title": title, "text": paragraph["context"]}
            corpus["train"].append(document)
            if split == "test":
                corpus["test"].append(document)
            for qa in paragraph["qas"]:
                queries[split].append({"_id": qa["id"], "text": qa["question"]})
                qrels[split].append(f"{qa['id']}\t{a}-{p}\t1\n")
                if split == "train":
                    pairs.append({"query": qa["question"], "positive": f"{title} {paragraph['context']}"})
    for split in ("train", "test"):
        folder = out / split
        (folder / "qrels").mkdir(parents=True, exist_ok=True)
        (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus[split]), encoding="utf-8")
        (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries[split]),
                                              encoding="utf-8")
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(qrels[split]),
                                                       encoding="utf-8")
    (out / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    return {"train_pairs": len(pairs), "test_queries": len(queries["test"]), "test_documents": len(corpus["test"])}


@dataclass
class Setup:
    """What both sides are given: the encoder folder, its pooling, the pairs in the order they are taken, the test
    split, and the options."""

    folder: Path
    pooling: str
    queries: list[str]
    positives: list[str]
    test: Any  # beir_data.BeirSplit
    steps: int
    batch: int
    seq: int
    lr: float


def model_folder(work: Path) -> tuple[Path, str]:
    """all-MiniLM-L6-v2 from the shared data (mean pooling), else a seeded random 2-layer BERT over the vocab
    excerpt, each with the BERT tokenizer files sentence-transformers loads."""
    import torch
    import transformers

    folder = work / "model"
    if (SHARED / "minilm" / "config.json").is_file():
        shutil.copytree(SHARED / "minilm", folder)
        return folder, "all-MiniLM-L6-v2 (shared data)"
    folder.mkdir()
    torch.manual_seed(0)
    vocab_size = sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8"))
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=512)
    transformers.BertModel(config).save_pretrained(folder)
    shutil.copyfile(VOCAB_EXCERPT, folder / "vocab.txt")
    transformers.BertTokenizerFast.from_pretrained(folder, do_lower_case=True).save_pretrained(folder)
    return folder, "a random 2-layer BERT (hidden 128; no shared data)"


def pair_order(n: int, batch: int, steps: int, seed: int) -> tuple[list[int], list[int]]:
    """The steps x batch training pairs of this seed (a seeded draw from the n pairs) and the order, within them,
    in which ours takes them (finetuning.loop.epoch_micro_batches, one process: one epoch of exactly `steps`
    batches); sentence-transformers is given them in that order."""
    import numpy as np
    import torch

    from bertrecipe.finetuning.loop import epoch_micro_batches
    from bertrecipe.training.process_group import DistributedContext

    if steps * batch > n:
        raise SystemExit(f"--steps {steps} x --batch {batch} exceeds the {n} training pairs")
    drawn = np.random.default_rng(seed).permutation(n)[: steps * batch].tolist()
    one = DistributedContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    return drawn, np.concatenate(epoch_micro_batches(len(drawn), batch, seed, 0, one)).tolist()


def scores_of(setup: Setup, encode: Callable[[Sequence[str]], Any]) -> dict[str, float]:
    """nDCG@10, MRR@10 and recall@100 on the test split of the embeddings `encode` gives (our metric code)."""
    from bertrecipe.finetuning.retrieval_metrics import exact_search, retrieval_scores

    corpus, queries = encode(setup.test.corpus_texts), encode(setup.test.query_texts)
    ranking = exact_search(queries, corpus, setup.test.query_ids, setup.test.corpus_ids, 100)
    return retrieval_scores(setup.test.qrels, ranking)


def our_encoder(setup: Setup, seed: int) -> tuple[Any, Any]:
    from bertrecipe.finetuning.embedding import load_embedding_model
    from bertrecipe.finetuning.model_loading import config_and_weights, load_tokenizer
    from bertrecipe.training.stepper import seed_everything

    seed_everything(seed)
    tokenizer = load_tokenizer(setup.folder / "vocab.txt", True)
    config, weights = config_and_weights(None, str(setup.folder))
    return load_embedding_model(config, weights, str(setup.folder), tokenizer, setup.seq, setup.pooling), tokenizer


def ours(setup: Setup, seed: int, drawn: list[int]) -> dict[str, Any]:
    """run_retrieval.py's training on the drawn pairs: tokenized once, then --steps steps (one epoch, in the
    order pair_order gives); timed from the tokenization on."""
    import torch

    from bertrecipe.finetuning.beir_data import TrainingPairs
    from bertrecipe.finetuning.embedding import encode_texts
    from bertrecipe.finetuning.loop import LoopSettings
    from bertrecipe.finetuning.retrieval_training import pair_arrays, train_embeddings
    from bertrecipe.training.metric_logger import MetricLogger
    from bertrecipe.training.process_group import DistributedContext
    from bertrecipe.training.stepper import Precision

    model, tokenizer = our_encoder(setup, seed)
    settings = LoopSettings(micro_batch_size=setup.batch, accumulation=1, epochs=1.0, max_steps=setup.steps,
                            learning_rate=setup.lr, warmup_proportion=0.1, seed=seed, log_freq=10 ** 9,
                            progress_bar=False)
    one = DistributedContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    start = time.perf_counter()
    pairs = TrainingPairs([setup.queries[i] for i in drawn], [setup.positives[i] for i in drawn])
    arrays = pair_arrays(tokenizer, pairs, setup.seq)
    train_embeddings(model, arrays, settings, Precision("cpu"), one, MetricLogger(None, enabled=False))
    seconds = time.perf_counter() - start
    scores = scores_of(setup, lambda texts: encode_texts(model, tokenizer, texts, setup.seq, 64, Precision("cpu")))
    return {"seconds": seconds, "pairs_per_second": setup.steps * setup.batch / seconds, **scores}


def peer_model(folder: Path, pooling: str, seq: int) -> Any:
    """sentence-transformers' model of the folder's encoder: at most `seq` tokens a text, `pooling`, normalised."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    encoder = Transformer(str(folder), max_seq_length=seq)
    return SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension(), pooling), Normalize()],
                               device="cpu")


def peer_arguments(setup: Setup, seed: int, work: Path) -> Any:
    """The trainer's arguments with ours' options: the rows in the order given (a sequential batch sampler), the
    same schedule and optimizer settings, no gradient clipping (ours has none), fp32 on the CPU."""
    import torch
    from sentence_transformers import SentenceTransformerTrainingArguments as Arguments
    from sentence_transformers.base.sampler import DefaultBatchSampler

    def in_order(dataset: Any, batch_size: int, drop_last: bool, **_: Any) -> DefaultBatchSampler:
        return DefaultBatchSampler(torch.utils.data.SequentialSampler(dataset), batch_size=batch_size,
                                   drop_last=drop_last)

    return Arguments(output_dir=str(work / "st"), per_device_train_batch_size=setup.batch, max_steps=setup.steps,
                     learning_rate=setup.lr, warmup_steps=round(0.1 * setup.steps), lr_scheduler_type="linear",
                     weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=0.0, seed=seed, data_seed=seed,
                     batch_sampler=in_order, save_strategy="no", report_to="none", logging_strategy="no",
                     use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)


def peer_train(model: Any, arguments: Any, rows: Any, loss: Any) -> float:
    """SentenceTransformerTrainer.train on the rows; the seconds from its first to its last event (the batches'
    tokenization, in the collator, is in)."""
    import transformers
    from sentence_transformers import SentenceTransformerTrainer

    class Clock(transformers.TrainerCallback):
        start = end = 0.0

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            self.end = time.perf_counter()

    clock = Clock()
    SentenceTransformerTrainer(model=model, args=arguments, train_dataset=rows, loss=loss, callbacks=[clock]).train()
    return clock.end - clock.start


def theirs(setup: Setup, seed: int, drawn: list[int], order: list[int], work: Path) -> dict[str, Any]:
    """SentenceTransformerTrainer with MultipleNegativesRankingLoss on the same pairs in the same order (a
    sequential batch sampler), the same schedule and optimizer settings, no gradient clipping (ours has none)."""
    import datasets
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.manual_seed(seed)
    model = peer_model(setup.folder, setup.pooling, setup.seq)
    rows = datasets.Dataset.from_dict({"anchor": [setup.queries[drawn[i]] for i in order],
                                       "positive": [setup.positives[drawn[i]] for i in order]})
    seconds = peer_train(model, peer_arguments(setup, seed, work), rows, MultipleNegativesRankingLoss(model))
    scores = scores_of(setup, lambda texts: torch.from_numpy(model.encode(list(texts), batch_size=64)))
    return {"seconds": seconds, "pairs_per_second": setup.steps * setup.batch / seconds, **scores}


def run_seed(setup: Setup, seed: int, work: Path, ours_first: bool) -> dict[str, Any]:
    """Both sides on one seed, ours first or second (alternated: sentence-transformers first on the first seed
    given, ours on the second, ...)."""
    drawn, order = pair_order(len(setup.queries), setup.batch, setup.steps, seed)
    sides = {"ours": lambda: ours(setup, seed, drawn),
             "sentence-transformers": lambda: theirs(setup, seed, drawn, order, work)}
    names = sorted(sides, reverse=not ours_first)
    result = {name: sides[name]() for name in names}
    result["speedup"] = result["ours"]["pairs_per_second"] / result["sentence-transformers"]["pairs_per_second"]
    print(f"seed {seed}: " + "; ".join(f"{name} {r['pairs_per_second']:.1f} pairs/s, nDCG@10 {r['ndcg@10']:.4f}"
                                         for name, r in result.items() if name != "speedup")
          + f"; speedup {result['speedup']:.2f}x", flush=True)
    return result


def build_setup(args: argparse.Namespace, work: Path) -> tuple[Setup, dict[str, Any]]:
    from bertrecipe.finetuning.beir_data import read_beir, read_pair_file

    squad_file = SHARED / "squad" / "dev-v1.1.json"
    if not squad_file.is_file():
        squad_file = REPO / "tests" / "data" / "squad" / "dev-v1.1.json"
    counts = squad_as_beir(squad_file, work / "beir", args.test_articles)
    pairs = read_pair_file(work / "beir" / "pairs.jsonl")
    folder, model_name = model_folder(work)
    setup = Setup(folder, "mean", pairs.queries, pairs.positives, read_beir(work / "beir" / "test"), args.steps,
                  args.batch, args.seq, args.lr)
    return setup, {"data": str(squad_file), **counts, "model": model_name}


def report(result: dict[str, Any]) -> str:
    seeds = result["seeds"]
    lines = [f"host: {result['host']}; {result['load']}", f"model: {result['model']}; data: {result['data']} "
             f"({result['train_pairs']} training pairs, {result['test_queries']} test queries over "
             f"{result['test_documents']} paragraphs)", f"options: {result['options']}",
             f"untrained: nDCG@10 {result['untrained']['ndcg@10']:.4f}, MRR@10 {result['untrained']['mrr@10']:.4f}, "
             f"recall@100 {result['untrained']['recall@100']:.4f}",
             "| seed | side | pairs/s | nDCG@10 | MRR@10 | recall@100 |", "|---|---|---|---|---|---|"]
    for seed, runs in seeds.items():
        for side in ("ours", "sentence-transformers"):
            r = runs[side]
            lines.append(f"| {seed} | {side} | {r['pairs_per_second']:.1f} | {r['ndcg@10']:.4f} | {r['mrr@10']:.4f} "
                         f"| {r['recall@100']:.4f} |")
    speedups = [runs["speedup"] for runs in seeds.values()]
    lines.append(f"speedup (ours / sentence-transformers pairs per second): "
                 f"{', '.join(f'{x:.2f}x' for x in speedups)}; goal >= {GOAL}x: "
                 f"{'met' if min(speedups) >= GOAL else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.retrieval_training", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--threads", type=int, default=2, help="torch threads (intra-op) of both sides")
    p.add_argument("--test_articles", type=int, default=8)
    p.add_argument("--output", type=Path, help="PREFIX of PREFIX.json (default "
                                               "benchmarks/results/retrieval_training/<date>)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from bertrecipe.common.hardware import detect

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        setup, described = build_setup(args, Path(tmp))
        model, tokenizer = our_encoder(setup, 0)
        from bertrecipe.finetuning.embedding import encode_texts
        from bertrecipe.training.stepper import Precision

        untrained = scores_of(setup, lambda texts: encode_texts(model, tokenizer, texts, setup.seq, 64,
                                                                Precision("cpu")))
        seeds = {seed: run_seed(setup, seed, Path(tmp), ours_first=i % 2 == 1) for i, seed in enumerate(args.seeds)}
    result = {"host": host_threads_line(detect("cpu"), "fp32"), "load": f"load average {os.getloadavg()[0]:.2f} "
              f"at the end (the machine's cores are shared)", **described,
              "options": {k: v for k, v in vars(args).items() if k != "output"},
              "versions": {name: metadata.version(name) for name in ("torch", "transformers", "sentence-transformers")},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "untrained": untrained, "seeds": seeds}
    text = report(result)
    print(text)
    output = args.output or RESULTS / time.strftime("%Y-%m-%d", time.gmtime())
    write_json(Path(f"{output}.json"), result)


if __name__ == "__main__":
    main()
