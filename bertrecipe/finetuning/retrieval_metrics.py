"""Exact dense search and the scores BEIR reports, computed as BEIR computes them (pytrec_eval's ndcg_cut and
recall, BEIR's own MRR):
- nDCG@k: DCG = sum over the top k of rel_i / log2(i + 1) (rank i from 1, the gain the graded score itself, as
  trec_eval's), over the DCG of the ideal order of the query's judged scores; 0 when no score is above 0;
- MRR@k: 1 / rank of the first document in the top k with a score above 0, else 0;
- recall@k: documents in the top k with a score above 0, over all such documents of the query (0 when none).
Each is the mean over the queries of the qrels. A document whose id is the query's own is left out of the
results, as BEIR's evaluation does by default (ignore_identical_ids)."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from bertrecipe.finetuning.beir_data import Qrels

Ranking = dict[str, list[str]]  # query id -> corpus ids, best first
CUTOFFS = {"ndcg": 10, "mrr": 10, "recall": 100}


def exact_search(queries: torch.Tensor, corpus: torch.Tensor, query_ids: Sequence[str], corpus_ids: Sequence[str],
                 top_k: int, chunk: int = 1024) -> Ranking:
    """The top_k documents of each query by dot product (cosine for normalised embeddings), queries a chunk at a
    time so that the score matrix stays small."""
    position = {doc_id: i for i, doc_id in enumerate(corpus_ids)}
    k = min(top_k + 1, len(corpus_ids))  # one more: the query's own id may be dropped below
    ranking: Ranking = {}
    for start in range(0, len(query_ids), chunk):
        ids = query_ids[start : start + chunk]
        scores = queries[start : start + chunk].float() @ corpus.float().T
        for row, query_id in enumerate(ids):
            if query_id in position:
                scores[row, position[query_id]] = -math.inf
        top = torch.topk(scores, k, dim=1).indices.tolist()
        for query_id, hits in zip(ids, top, strict=True):
            ranking[query_id] = [corpus_ids[i] for i in hits if corpus_ids[i] != query_id][:top_k]
    return ranking


def dcg(gains: Sequence[float]) -> float:
    return sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))


def ndcg_at(judged: dict[str, int], ranked: Sequence[str], k: int) -> float:
    ideal = dcg(sorted((s for s in judged.values() if s > 0), reverse=True)[:k])
    if ideal == 0:
        return 0.0
    return dcg([max(judged.get(doc, 0), 0) for doc in ranked[:k]]) / ideal


def mrr_at(judged: dict[str, int], ranked: Sequence[str], k: int) -> float:
    for rank, doc in enumerate(ranked[:k], start=1):
        if judged.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


def recall_at(judged: dict[str, int], ranked: Sequence[str], k: int) -> float:
    relevant = {doc for doc, score in judged.items() if score > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def retrieval_scores(qrels: Qrels, ranking: Ranking) -> dict[str, float]:
    """ndcg@10, mrr@10 and recall@100, each the mean over the queries of the qrels (a query without results
    scores 0)."""
    functions = {"ndcg": ndcg_at, "mrr": mrr_at, "recall": recall_at}
    scores = {}
    for name, k in CUTOFFS.items():
        total = sum(functions[name](judged, ranking.get(query_id, []), k) for query_id, judged in qrels.items())
        scores[f"{name}@{k}"] = total / len(qrels)
    return scores
