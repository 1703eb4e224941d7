"""Benchmark of embedding distillation: run_retrieval.py --teacher_model (ours: bertrecipe.distillation.embedding
through finetuning.retrieval_training's loop) against sentence-transformers' (SentenceTransformerTrainer with
MSELoss on the teacher's embeddings), both distilling the same teacher into the same student on the same pairs with
the same options, then scored the same way.

    flock /tmp/bert-bench.lock python -m benchmarks.embedding_distillation [--steps 100] [--batch 16] [--seq 256]
        [--lr 1e-4] [--student_layers 3] [--seeds 1 2 3] [--threads 2] [--test_articles 3] [--output PREFIX]

Data (nothing is downloaded), as benchmarks/retrieval_training.py makes it (squad_as_beir): SQuAD v1.1 dev split by
article, the last --test_articles articles' paragraphs the corpus and their questions the test queries, every other
article's (question, title + paragraph) pairs the training pairs. The teacher: all-MiniLM-L6-v2 ($BERT_SHARED_DATA
/minilm, mean pooling), else a seeded random 2-layer BERT (then the nDCG figures mean little). The student:
--student_layers of the teacher's layers with its embeddings (ours: EmbeddingDistillation.student_start, as
run_retrieval.py --student_layers starts it, the uniform choice, layers 2, 4, 6 of MiniLM's 6; theirs: the same
layers cut out of transformers' BertModel and saved; checked to give the same embeddings before either trains).

Both sides: --steps optimizer steps of --batch pairs, the same steps x batch pairs (a seeded draw) in the same
batches (ours' seeded shuffle; sentence-transformers given them in that order by a sequential batch sampler), the
texts distilled the pairs' queries and paragraphs, the loss the MSE of the student's unit embeddings against the
teacher's over the batch's texts and features (theirs: per column, averaged: the same value, both columns have the
batch's rows), AdamW (lr --lr, weight decay 0.01, eps 1e-6) under a linear warm-up over 10 % of the steps then linear
decay, no gradient clipping, fp32, --seq tokens at most per text, dropout as the model's config has it, --threads
torch threads, one after the other in one process (alternating which goes first over the seeds).

Measured: training pairs per second, the teacher's work included on both sides: ours from the tokenization of the
drawn pairs to the last step (its teacher runs inside the steps, once per distinct text); theirs from the teacher's
encode of each row's query and paragraph (sentence-transformers' recipe: a label column made by the teacher before
training, `teacher.encode` on every row) to the last step, its collator tokenizing the batches; its teacher seconds
and its training alone are recorded too. nDCG@10 / MRR@10 / recall@100 of the teacher, the student before training,
and each side's distilled student, all scored by our metric code on embeddings each side computes itself (ours:
encode_texts; theirs: SentenceTransformer.encode). Goals (issue 49, item 3): ours' student keeps >= 95 % of the
teacher's nDCG@10; the two sides' nDCG@10 the same within seed noise; ours >= 1.3x their pairs per second. Results
to stdout and PREFIX.json (default benchmarks/results/embedding_distillation/<date>)."""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, host_threads_line, middle, write_json
from benchmarks.retrieval_training import (
    Setup,
    build_setup,
    pair_order,
    peer_arguments,
    peer_model,
    peer_train,
    scores_of,
)

RESULTS = REPO / "benchmarks" / "results" / "embedding_distillation"
SPEED_GOAL = 1.3  # ours' pairs per second over sentence-transformers'
KEPT_GOAL = 0.95  # the distilled student's nDCG@10 over the teacher's


def our_start(setup: Setup, layers: int, seed: int) -> tuple[Any, Any, Any]:
    """(objective with its teacher loaded, the student of `layers` teacher layers, tokenizer), as run_retrieval.py
    --teacher_model --student_layers makes them."""
    from bertrecipe.distillation.embedding import EmbeddingDistillation
    from bertrecipe.finetuning.embedding import load_embedding_model
    from bertrecipe.finetuning.model_loading import load_tokenizer
    from bertrecipe.training.stepper import seed_everything

    seed_everything(seed)
    tokenizer = load_tokenizer(setup.folder / "vocab.txt", True)
    objective = EmbeddingDistillation(str(setup.folder), setup.pooling)
    config, weights, source = objective.student_start(layers)
    student = load_embedding_model(config, weights, source, tokenizer, setup.seq, setup.pooling)
    objective.check(student, tokenizer, setup.seq, False)
    return objective, student, tokenizer


def our_encode(model: Any, tokenizer: Any, setup: Setup) -> Any:
    from bertrecipe.finetuning.embedding import encode_texts
    from bertrecipe.training.stepper import Precision

    return lambda texts: encode_texts(model, tokenizer, texts, setup.seq, 64, Precision("cpu"))


def ours(setup: Setup, layers: int, seed: int, drawn: list[int]) -> dict[str, Any]:
    """run_retrieval.py --teacher_model's training on the drawn pairs: tokenized once, then --steps steps (one
    epoch, in the order pair_order gives); timed from the tokenization on."""
    import torch

    from bertrecipe.finetuning.beir_data import TrainingPairs
    from bertrecipe.finetuning.loop import LoopSettings
    from bertrecipe.finetuning.retrieval_training import train_embeddings
    from bertrecipe.training.metric_logger import MetricLogger
    from bertrecipe.training.process_group import DistributedContext
    from bertrecipe.training.stepper import Precision

    objective, student, tokenizer = our_start(setup, layers, seed)
    settings = LoopSettings(micro_batch_size=setup.batch, accumulation=1, epochs=1.0, max_steps=setup.steps,
                            learning_rate=setup.lr, warmup_proportion=0.1, seed=seed, log_freq=10 ** 9,
                            progress_bar=False)
    one = DistributedContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    start = time.perf_counter()
    pairs = TrainingPairs([setup.queries[i] for i in drawn], [setup.positives[i] for i in drawn])
    arrays = objective.arrays(tokenizer, pairs, setup.seq)
    trained = objective.trainable(student)
    result = train_embeddings(trained, arrays, settings, Precision("cpu"), one, MetricLogger(None, enabled=False),
                              objective)
    seconds = time.perf_counter() - start
    scores = scores_of(setup, our_encode(trained, tokenizer, setup))
    return {"seconds": seconds, "pairs_per_second": setup.steps * setup.batch / seconds,
            "final_loss": result["final_loss"], "distinct_texts": objective.distinct_texts, **scores}


def peer_student(setup: Setup, layers: int, work: Path) -> Path:
    """The teacher's BertModel with the layers ours' student takes, saved with the teacher's tokenizer files."""
    import shutil

    import transformers
    from torch import nn

    from bertrecipe.distillation.pairing import teacher_layers_for

    teacher = transformers.AutoModel.from_pretrained(setup.folder)
    chosen = teacher_layers_for(layers, teacher.config.num_hidden_layers)
    teacher.encoder.layer = nn.ModuleList([teacher.encoder.layer[k - 1] for k in chosen])
    teacher.config.num_hidden_layers = layers
    folder = work / f"student_{layers}_layers"
    teacher.save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (setup.folder / name).is_file():
            shutil.copyfile(setup.folder / name, folder / name)
    return folder


def theirs(setup: Setup, student: Path, seed: int, drawn: list[int], order: list[int], work: Path) -> dict[str, Any]:
    """sentence-transformers' distillation on the same pairs in the same order: the teacher's embeddings of each
    row's query and paragraph as the label column, then SentenceTransformerTrainer with MSELoss, the options of
    peer_arguments (the same as ours')."""
    import datasets
    import numpy as np
    import torch
    from sentence_transformers.sentence_transformer.losses import MSELoss

    torch.manual_seed(seed)
    teacher = peer_model(setup.folder, setup.pooling, setup.seq)
    model = peer_model(student, setup.pooling, setup.seq)
    queries, documents = ([texts[drawn[i]] for i in order] for texts in (setup.queries, setup.positives))
    start = time.perf_counter()
    labels = np.stack([teacher.encode(texts, batch_size=64, show_progress_bar=False) for texts in (queries, documents)],
                      axis=1)
    rows = datasets.Dataset.from_dict({"anchor": queries, "positive": documents, "label": labels.tolist()})
    teacher_seconds = time.perf_counter() - start
    train_seconds = peer_train(model, peer_arguments(setup, seed, work), rows, MSELoss(model))
    seconds = teacher_seconds + train_seconds
    scores = scores_of(setup, lambda texts: torch.from_numpy(model.encode(list(texts), batch_size=64)))
    return {"seconds": seconds, "pairs_per_second": setup.steps * setup.batch / seconds,
            "teacher_seconds": teacher_seconds, "train_seconds": train_seconds, **scores}


def run_seed(setup: Setup, layers: int, student: Path, seed: int, work: Path, ours_first: bool) -> dict[str, Any]:
    drawn, order = pair_order(len(setup.queries), setup.batch, setup.steps, seed)
    sides = {"ours": lambda: ours(setup, layers, seed, drawn),
             "sentence-transformers": lambda: theirs(setup, student, seed, drawn, order, work)}
    result = {name: sides[name]() for name in sorted(sides, reverse=not ours_first)}
    result["speedup"] = result["ours"]["pairs_per_second"] / result["sentence-transformers"]["pairs_per_second"]
    print(f"seed {seed}: " + "; ".join(f"{name} {r['pairs_per_second']:.2f} pairs/s, nDCG@10 {r['ndcg@10']:.4f}"
                                         for name, r in result.items() if name != "speedup")
          + f"; speedup {result['speedup']:.2f}x", flush=True)
    return result


def starting_scores(setup: Setup, layers: int, student: Path) -> dict[str, Any]:
    """The teacher's and the untrained student's scores, and how close the two sides' untrained students are (the
    lowest cosine of their embeddings of the test queries)."""
    import torch

    objective, ours_student, tokenizer = our_start(setup, layers, 0)
    theirs_student = peer_model(student, setup.pooling, setup.seq)
    queries = setup.test.query_texts
    ours_embedded = our_encode(ours_student, tokenizer, setup)(queries)
    theirs_embedded = torch.from_numpy(theirs_student.encode(queries, batch_size=64))
    return {"teacher": scores_of(setup, our_encode(objective.teacher, tokenizer, setup)),
            "student_before": scores_of(setup, our_encode(ours_student, tokenizer, setup)),
            "same_start_min_cosine": float((ours_embedded * theirs_embedded).sum(1).min())}


def report(result: dict[str, Any]) -> str:
    teacher = result["teacher"]["ndcg@10"]
    lines = [f"host: {result['host']}; {result['load']}", f"model: {result['model']}; student: "
             f"{result['options']['student_layers']} of its layers; data: {result['data']} ({result['train_pairs']} "
             f"training pairs, {result['test_queries']} test queries over {result['test_documents']} paragraphs)",
             f"options: {result['options']}", f"teacher nDCG@10 {teacher:.4f}; student before "
             f"{result['student_before']['ndcg@10']:.4f}; the two sides' students start alike (min cosine "
             f"{result['same_start_min_cosine']:.6f})",
             "| seed | side | pairs/s | nDCG@10 | kept | MRR@10 | recall@100 |", "|---|---|---|---|---|---|---|"]
    for seed, runs in result["seeds"].items():
        for side in ("ours", "sentence-transformers"):
            r = runs[side]
            lines.append(f"| {seed} | {side} | {r['pairs_per_second']:.2f} | {r['ndcg@10']:.4f} | "
                         f"{r['ndcg@10'] / teacher:.1%} | {r['mrr@10']:.4f} | {r['recall@100']:.4f} |")
    speedups = [runs["speedup"] for runs in result["seeds"].values()]
    kept = middle(runs["ours"]["ndcg@10"] for runs in result["seeds"].values()) / teacher
    lines.append(f"speedup (ours / sentence-transformers pairs per second): {', '.join(f'{x:.2f}x' for x in speedups)};"
                 f" goal >= {SPEED_GOAL}x: {'met' if min(speedups) >= SPEED_GOAL else 'NOT met'}")
    lines.append(f"ours' median student keeps {kept:.1%} of the teacher's nDCG@10; goal >= {KEPT_GOAL:.0%}: "
                 f"{'met' if kept >= KEPT_GOAL else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.embedding_distillation",
                                description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--student_layers", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--threads", type=int, default=2, help="torch threads (intra-op) of both sides")
    p.add_argument("--test_articles", type=int, default=3)
    p.add_argument("--output", type=Path, help="PREFIX of PREFIX.json (default "
                                               "benchmarks/results/embedding_distillation/<date>)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from bertrecipe.common.hardware import detect

    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        setup, described = build_setup(args, Path(tmp))
        student = peer_student(setup, args.student_layers, Path(tmp))
        starting = starting_scores(setup, args.student_layers, student)
        seeds = {seed: run_seed(setup, args.student_layers, student, seed, Path(tmp), ours_first=i % 2 == 1)
                 for i, seed in enumerate(args.seeds)}
    result = {"host": host_threads_line(detect("cpu"), "fp32"), "load": f"load average {os.getloadavg()[0]:.2f} "
              f"at the end (the machine's cores are shared)", **described,
              "options": {k: v for k, v in vars(args).items() if k != "output"},
              "versions": {name: metadata.version(name) for name in ("torch", "transformers", "sentence-transformers")},
              "started": started, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **starting,
              "seeds": seeds}
    print(report(result))
    output = args.output or RESULTS / time.strftime("%Y-%m-%d", time.gmtime())
    write_json(Path(f"{output}.json"), result)


if __name__ == "__main__":
    main()
