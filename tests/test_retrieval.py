"""Dense retrieval (run_retrieval.py, finetuning/{beir_data,embedding,retrieval_metrics,retrieval_training}.py,
deploy/embedding_export.py): the metrics against a plain reference on hand-made rankings; the embeddings against
sentence-transformers' for the same weights and pooling (a tiny random BERT and ModernBERT, and in the integration
tier all-MiniLM-L6-v2); the in-batch-negatives loss against sentence-transformers' MultipleNegativesRankingLoss on
the same embeddings; the ONNX and safetensors exports; bad input refused in one line with nothing written; and a
BEIR folder made of SQuAD articles (questions -> their paragraph), trained on some articles, scored on others."""
from __future__ import annotations

import itertools
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from benchmarks.retrieval_training import squad_as_beir
from bertrecipe.common.errors import InputError
from bertrecipe.deploy.embedding_export import onnx_bytes, onnx_embeddings, open_embedding_session
from bertrecipe.finetuning import beir_data
from bertrecipe.finetuning.embedding import encode_texts, load_embedding_model, tokenize_texts
from bertrecipe.finetuning.model_loading import config_and_weights, load_tokenizer
from bertrecipe.finetuning.retrieval_metrics import exact_search, retrieval_scores
from bertrecipe.finetuning.retrieval_training import (
    contrastive_loss,
    embed_by_length,
    in_batch_negatives_loss,
    length_groups,
)
from bertrecipe.training.stepper import Precision
from helpers import REPO_ROOT, TINY_MODERN, run_command, snapshot

FP32 = Precision("cpu")
TEXTS = ["the movie was good", "Who won Super Bowl 50?",
         "Packet switching is a method of grouping data that is transmitted over a digital network into packets.",
         "a"]


# --- metrics -----------------------------------------------------------------------------------------------------

def reference_scores(qrels: dict[str, dict[str, int]], ranking: dict[str, list[str]]) -> dict[str, float]:
    """trec_eval's ndcg_cut_10 and recall_100 and BEIR's MRR@10 written out the slow way, one query at a time."""
    ndcg, mrr, recall = [], [], []
    for query, judged in qrels.items():
        ranked = ranking.get(query, [])
        gains = [judged.get(doc, 0) if judged.get(doc, 0) > 0 else 0 for doc in ranked[:10]]
        actual = 0.0
        for position in range(len(gains)):
            actual += gains[position] * math.log(2) / math.log(position + 2)
        ideal_gains = sorted([g for g in judged.values() if g > 0], reverse=True)[:10]
        ideal = 0.0
        for position in range(len(ideal_gains)):
            ideal += ideal_gains[position] * math.log(2) / math.log(position + 2)
        ndcg.append(actual / ideal if ideal > 0 else 0.0)
        reciprocal = 0.0
        for position in range(min(10, len(ranked))):
            if judged.get(ranked[position], 0) > 0:
                reciprocal = 1.0 / (position + 1)
                break
        mrr.append(reciprocal)
        relevant = [doc for doc, g in judged.items() if g > 0]
        found = [doc for doc in relevant if doc in ranked[:100]]
        recall.append(len(found) / len(relevant) if relevant else 0.0)
    return {"ndcg@10": sum(ndcg) / len(ndcg), "mrr@10": sum(mrr) / len(mrr), "recall@100": sum(recall) / len(recall)}


def test_the_metrics_on_hand_made_rankings_match_the_reference_and_hand_computed_values():
    qrels = {"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"x": 1}, "q3": {"z": 0}, "q4": {"m": 1}}
    ranking = {"q1": ["c", "b", "d", "a"], "q2": [f"n{i}" for i in range(12)] + ["x"], "q3": ["z"],
               "q4": [f"n{i}" for i in range(100)] + ["m"]}
    ours = retrieval_scores(qrels, ranking)
    assert ours == pytest.approx(reference_scores(qrels, ranking), abs=1e-12)
    # q1 by hand: DCG = 1/log2(3) + 2/log2(5); ideal 2 + 1/log2(3); MRR 1/2; q2: x at rank 13 (recall only);
    # q3 has nothing relevant (0 everywhere); q4: m at rank 101, past every cut-off.
    q1 = (1 / math.log2(3) + 2 / math.log2(5)) / (2 + 1 / math.log2(3))
    assert ours["ndcg@10"] == pytest.approx(q1 / 4)
    assert ours["mrr@10"] == pytest.approx(0.5 / 4)
    assert ours["recall@100"] == pytest.approx((1 + 1 + 0 + 0) / 4)


@pytest.mark.parametrize("seed", range(5))
def test_random_rankings_with_graded_judgments_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(150)]
    qrels, ranking = {}, {}
    for q in range(20):
        judged = rng.choice(150, size=int(rng.integers(1, 15)), replace=False)
        qrels[f"q{q}"] = {docs[i]: int(rng.integers(0, 4)) for i in judged}
        ranking[f"q{q}"] = [docs[i] for i in rng.permutation(150)[:120]]
    assert retrieval_scores(qrels, ranking) == pytest.approx(reference_scores(qrels, ranking), abs=1e-12)


def test_exact_search_ranks_by_dot_product_and_leaves_out_the_query_s_own_id():
    rng = np.random.default_rng(0)
    queries, corpus = torch.tensor(rng.normal(size=(5, 8))), torch.tensor(rng.normal(size=(40, 8)))
    corpus_ids = [f"d{i}" for i in range(40)]
    query_ids = ["q0", "q1", "d3", "q3", "q4"]  # BEIR drops a hit whose id is the query's (ArguAna, Quora)
    ranking = exact_search(queries, corpus, query_ids, corpus_ids, top_k=10, chunk=2)
    for row, query_id in enumerate(query_ids):
        order = [corpus_ids[i] for i in np.argsort(-(queries[row] @ corpus.T).numpy())]
        assert ranking[query_id] == [doc for doc in order if doc != query_id][:10]


# --- the BEIR folder and the pairs -----------------------------------------------------------------------------

def write_beir(folder: Path, corpus: str, queries: str, qrels: str) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    (folder / "queries.jsonl").write_text(queries, encoding="utf-8")
    (folder / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    return folder


GOOD_CORPUS = '{"_id": "d1", "title": "T", "text": "one"}\n{"_id": 2, "text": "two"}\n'
GOOD_QUERIES = '{"_id": "q1", "text": "first"}\n'
GOOD_QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\t2\t0\n"


def test_a_beir_folder_reads_as_beir_does(tmp_path):
    split = beir_data.read_beir(write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES + '{"_id": "q2", "text": "x"}\n',
                                           GOOD_QRELS))
    assert split.corpus_ids == ["d1", "2"] and split.corpus_texts == ["T one", "two"]
    assert split.query_ids == ["q1"] and split.query_texts == ["first"]  # only the judged queries
    assert split.qrels == {"q1": {"d1": 2, "2": 0}}


BAD_FILES = {
    "corpus: malformed JSON": ("corpus.jsonl", GOOD_CORPUS + "{oops\n", "corpus.jsonl:3: malformed JSON"),
    "corpus: no text": ("corpus.jsonl", '{"_id": "d1", "title": "t"}\n', "corpus.jsonl:1: field 'text' is missing"),
    "corpus: id twice": ("corpus.jsonl", GOOD_CORPUS + '{"_id": "d1", "text": "x"}\n', "corpus.jsonl:3: _id 'd1'"),
    "queries: not an object": ("queries.jsonl", "[1, 2]\n", "queries.jsonl:1: a JSON object was expected"),
    "qrels: no header": ("qrels/test.tsv", "q1\td1\t1\n", "test.tsv:1: the header"),
    "qrels: score": ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\thigh\n", "test.tsv:2: score 'high'"),
    "qrels: fields": ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1 d1 1\n", "test.tsv:2: expected 3"),
    "qrels: unknown document": ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\tnone\t1\n", "corpus-id 'none'"),
    "qrels: unknown query": ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq9\td1\t1\n", "query-id 'q9'"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_beir_file_is_named_with_its_line(tmp_path, case):
    name, text, expected = BAD_FILES[case]
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    (folder / name).write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as error:
        beir_data.read_beir(folder)
    message = str(error.value)
    assert message.startswith(str(folder / name)) and expected in message and "\n" not in message


def test_training_pairs_read_from_json_lines_or_a_qrels_train_split(tmp_path):
    lines = tmp_path / "pairs.jsonl"
    lines.write_text('{"query": "q", "positive": "p", "negative": "n"}\n\n{"query": "r", "positive": "s", '
                     '"negative": "t"}\n', encoding="utf-8")
    pairs = beir_data.read_training_pairs(lines)
    assert (pairs.queries, pairs.positives, pairs.negatives) == (["q", "r"], ["p", "s"], ["n", "t"])
    lines.write_text('{"query": "q", "positive": "p", "negative": "n"}\n{"query": "r", "positive": "s"}\n')
    with pytest.raises(InputError, match=r"pairs.jsonl:2: 'negative' is given on some rows only"):
        beir_data.read_training_pairs(lines)
    folder = write_beir(tmp_path / "beir", GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    (folder / "qrels" / "train.tsv").write_text(GOOD_QRELS, encoding="utf-8")
    pairs = beir_data.read_training_pairs(folder / "qrels" / "train.tsv")
    assert (pairs.queries, pairs.positives, pairs.negatives) == (["first"], ["T one"], None)  # score 0 left out


# Issue 48, item 10: a query that tokenizes to nothing was embedded as [CLS] [SEP] and scored (SQuAD refuses the
# same question); records that contradict each other were refused naming one line, or not at all (qrels).
BLANKS = {"empty": "", "spaces": "  \t ", "zero-width": "\u200b\u200d", "control": "\x00\x07"}


@pytest.mark.parametrize("blank", sorted(BLANKS))
def test_a_query_that_tokenizes_to_nothing_is_refused_naming_the_queries_file_line_and_id(tmp_path, blank):
    text = BLANKS[blank]
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES + json.dumps({"_id": "q2", "text": text}) + "\n",
                        GOOD_QRELS)
    with pytest.raises(InputError) as refused:
        beir_data.read_beir(folder)
    assert str(refused.value).startswith(f"{folder / 'queries.jsonl'}:2: query 'q2' is {text!r}, which tokenizes "
                                         "to nothing;")


@pytest.mark.parametrize("side", ["query", "positive", "negative"])
@pytest.mark.parametrize("blank", ["empty", "zero-width"])
def test_a_training_pair_with_an_empty_side_is_refused_naming_the_line_and_the_side(tmp_path, side, blank):
    rows = [{"query": "q", "positive": "p", "negative": "n"}, {"query": "r", "positive": "s", "negative": "t"}]
    rows[1][side] = BLANKS[blank]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    with pytest.raises(InputError, match=f"^{re.escape(str(path))}:2: field '{side}' is .*, which tokenizes to "
                                         "nothing;"):
        beir_data.read_training_pairs(path)


def test_a_judged_relevant_document_without_text_is_no_training_pair_and_a_title_alone_is_one(tmp_path):
    corpus = (GOOD_CORPUS + '{"_id": "d3", "title": "", "text": " "}\n'
              '{"_id": "d4", "title": "Only a title", "text": ""}\n')
    folder = write_beir(tmp_path / "beir", corpus, GOOD_QUERIES, GOOD_QRELS)
    (folder / "qrels" / "train.tsv").write_text(GOOD_QRELS + "q1\td4\t1\n", encoding="utf-8")
    assert beir_data.read_training_pairs(folder / "qrels" / "train.tsv").positives == ["T one", "Only a title"]
    (folder / "qrels" / "train.tsv").write_text(GOOD_QRELS + "q1\td3\t1\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"^{re.escape(str(folder / 'corpus.jsonl'))}:3: document 'd3', judged "
                                         "relevant to query 'q1' in .*train.tsv, has no text"):
        beir_data.read_training_pairs(folder / "qrels" / "train.tsv")


def test_a_document_without_text_is_kept_as_beir_keeps_it_with_one_warning(tmp_path, capsys):
    """Decision: BEIR corpora carry empty documents now and then, and BEIR scores with them in the corpus; refusing
    would make such a corpus unusable and dropping them would change every score against BEIR's, so they are kept,
    with one warning naming the file, their count and the first."""
    corpus = GOOD_CORPUS + '{"_id": "d3", "text": ""}\n{"_id": "d4", "title": "\u200b", "text": " "}\n'
    split = beir_data.read_beir(write_beir(tmp_path, corpus, GOOD_QUERIES, GOOD_QRELS))
    assert split.corpus_ids == ["d1", "2", "d3", "d4"]
    [warning] = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"warning: {tmp_path / 'corpus.jsonl'}: 2 documents have no text (first: 'd3', line 3)")
    beir_data.read_beir(write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS))
    assert capsys.readouterr().err == ""


CONTRADICTIONS = {
    "corpus id": ("corpus.jsonl", GOOD_CORPUS + '{"_id": "d1", "title": "T", "text": "other"}\n',
                  "corpus.jsonl:3: _id 'd1' is given on line 1 with other contents"),
    "numeric corpus id": ("corpus.jsonl", GOOD_CORPUS + '{"_id": "2", "text": "other"}\n',
                          "corpus.jsonl:3: _id '2' is given on line 2 with other contents"),
    "query id": ("queries.jsonl", GOOD_QUERIES + '{"_id": "q1", "text": "second"}\n',
                 "queries.jsonl:2: _id 'q1' is given on line 1 with other contents"),
    "qrels pair": ("qrels/test.tsv", GOOD_QRELS + "q1\td1\t1\n",
                   "test.tsv:4: query-id 'q1' corpus-id 'd1' is given on line 2 with score 2, here 1"),
}


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_records_that_contradict_each_other_are_refused_naming_both_lines(tmp_path, case):
    name, text, expected = CONTRADICTIONS[case]
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    (folder / name).write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as refused:
        beir_data.read_beir(folder)
    message = str(refused.value)
    assert message.startswith(str(folder / name)) and expected in message and "\n" not in message


def test_a_record_given_twice_alike_is_read_once(tmp_path):
    """Decision: the same record twice (a file concatenated with an overlapping one) says nothing new, as BEIR's
    own loader, which keeps the last, reads it: read once, never refused."""
    folder = write_beir(tmp_path, GOOD_CORPUS + GOOD_CORPUS.splitlines()[0] + "\n", GOOD_QUERIES * 2,
                        GOOD_QRELS + "q1\td1\t2\n")
    assert beir_data.read_beir(folder) == beir_data.read_beir(write_beir(tmp_path / "once", GOOD_CORPUS,
                                                                          GOOD_QUERIES, GOOD_QRELS))


# --- embeddings against sentence-transformers ---------------------------------------------------------------------

def sentence_transformer(folder: Path, pooling: str, max_seq_length: int):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    encoder = Transformer(str(folder), max_seq_length=max_seq_length)
    pool = Pooling(encoder.get_embedding_dimension(), pooling_mode=pooling)
    return SentenceTransformer(modules=[encoder, pool, Normalize()], device="cpu")


def with_bert_tokenizer(folder: Path, lower_case: bool = True) -> Path:
    """The folder's vocab.txt saved as transformers' BERT tokenizer files, which sentence-transformers loads."""
    import transformers

    transformers.BertTokenizerFast.from_pretrained(folder, do_lower_case=lower_case).save_pretrained(folder)
    return folder


def ours(folder: Path, pooling: str, max_seq_length: int, vocab: Path | None = None):
    tokenizer = load_tokenizer(vocab or folder / "vocab.txt", True)
    config, weights = config_and_weights(None, str(folder))
    return load_embedding_model(config, weights, str(folder), tokenizer, max_seq_length, pooling), tokenizer


def assert_same_embeddings(folder: Path, pooling: str, texts: list[str], max_seq_length: int = 64) -> None:
    model, tokenizer = ours(folder, pooling, max_seq_length)
    mine = encode_texts(model, tokenizer, texts, max_seq_length, 3, FP32)
    theirs = torch.from_numpy(sentence_transformer(folder, pooling, max_seq_length).encode(texts, batch_size=3))
    cosine = (mine * theirs).sum(1)
    assert cosine.min() >= 0.9999, cosine
    assert mine.norm(dim=1) == pytest.approx(torch.ones(len(texts)), abs=1e-5)


@pytest.fixture(scope="module")
def bert_folder(tiny_bert, tmp_path_factory):
    folder = tmp_path_factory.mktemp("retrieval_bert")
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        (folder / name).write_bytes((tiny_bert / name).read_bytes())
    return with_bert_tokenizer(folder)


@pytest.fixture(scope="module")
def modern_encoder(tiny_bert, tmp_path_factory):
    """A seeded 3-layer ModernBERT (one global, two local layers) saved as a bare encoder by transformers, with the
    tiny BERT's WordPiece vocab as BERT tokenizer files."""
    import transformers

    vocab = (tiny_bert / "vocab.txt").read_text(encoding="utf-8")
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=len(vocab.splitlines()), bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102,
        **TINY_MODERN)
    folder = tmp_path_factory.mktemp("retrieval_modern")
    transformers.ModernBertModel(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text(vocab, encoding="utf-8")
    return with_bert_tokenizer(folder)


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_bert_folder_embeds_as_sentence_transformers_does(bert_folder, pooling):
    # the long text is cut at 16 tokens by both
    assert_same_embeddings(bert_folder, pooling, TEXTS + [" ".join(["word"] * 40)], max_seq_length=16)


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_modern_folder_embeds_as_sentence_transformers_does(modern_encoder, pooling):
    assert_same_embeddings(modern_encoder, pooling, TEXTS + [" ".join(["word"] * 40)])


@pytest.mark.slow  # importing sentence-transformers takes seconds
def test_the_loss_is_multiple_negatives_ranking_loss_on_the_same_embeddings():
    """Ours on given unit vectors against sentence-transformers' loss on the same vectors, with hard negatives and
    without; the symmetric form against the two directions written out."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    generator = torch.Generator().manual_seed(0)
    vectors = {c: torch.nn.functional.normalize(torch.randn(6, 8, generator=generator), dim=1)
               for c in ("query", "positive", "negative")}
    mnrl = MultipleNegativesRankingLoss(model=torch.nn.Identity())  # scale 20, query -> documents
    for columns in (("query", "positive"), ("query", "positive", "negative")):
        theirs = mnrl.compute_loss_from_embeddings([vectors[c] for c in columns], None)
        documents = torch.cat([vectors[c] for c in columns[1:]])
        assert float(contrastive_loss(vectors["query"], documents)) == pytest.approx(float(theirs), rel=1e-6)
    logits = 20 * vectors["query"] @ vectors["positive"].T
    targets = torch.arange(6)
    both = (torch.nn.functional.cross_entropy(logits, targets) + torch.nn.functional.cross_entropy(logits.T, targets))
    symmetric = contrastive_loss(vectors["query"], vectors["positive"], symmetric=True)
    assert float(symmetric) == pytest.approx(float(both) / 2, rel=1e-6)


def reference_groups_cost(lengths: list[int], most: int) -> int:
    """Plain Python: the fewest padded positions over every way to cut the rows sorted by length into at most
    `most` runs, each padded to its longest."""
    ordered = sorted(lengths, reverse=True)
    best = sum(ordered[0] for _ in ordered)
    for groups in range(2, min(most, len(ordered)) + 1):
        for cuts in itertools.combinations(range(1, len(ordered)), groups - 1):
            bounds = [0, *cuts, len(ordered)]
            best = min(best, sum((bounds[g + 1] - bounds[g]) * ordered[bounds[g]] for g in range(groups)))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_length_groups_pad_least_and_keep_every_row_once(seed):
    generator = np.random.default_rng(seed)
    lengths = [int(x) for x in generator.integers(3, 60, size=int(generator.integers(1, 12)))]
    for most in (1, 2, 3, 4):
        groups = length_groups(lengths, most)
        assert sorted(row for group in groups for row in group) == list(range(len(lengths)))
        assert 1 <= len(groups) <= most
        assert all(lengths[group[0]] == max(lengths[row] for row in group) for group in groups)
        cost = sum(len(group) * lengths[group[0]] for group in groups)
        assert cost == reference_groups_cost(lengths, most)
        fewer = reference_groups_cost(lengths, len(groups) - 1) if len(groups) > 1 else None
        assert fewer is None or fewer > cost  # no group more than the least padding needs
    assert length_groups([7] * 9) == [list(range(9))]  # one length: one pass


def test_embedding_by_length_gives_one_pass_s_embeddings_and_gradients(bert_folder):
    """A batch of very different lengths encoded in length groups against one padded pass of the same model: the
    same embeddings and the same gradients of a loss on them (up to float rounding)."""
    model, tokenizer = ours(bert_folder, "mean", 64)
    model.eval()  # no dropout: the two passes must see the same function
    texts = [" ".join(["word"] * n) for n in (40, 2, 17, 3, 60, 9, 1, 33)]
    ids, mask = (torch.from_numpy(a).long() for a in tokenize_texts(tokenizer, texts, 64))
    weights = torch.randn(8, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    outputs, gradients = [], []
    for embed in (embed_by_length, lambda m, i, k: m(i, k)):
        model.zero_grad()
        embedded = embed(model, ids, mask)
        (embedded * weights).sum().backward()
        outputs.append(embedded.detach())
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert len(length_groups(mask.sum(1).tolist())) == 4
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gradients[0], gradients[1], rtol=1e-4, atol=1e-6)
    # the loss on a batch whose columns have their own widths, against each column in one pass of its own
    batch = {"query_ids": ids[:4, :20], "query_mask": mask[:4, :20], "positive_ids": ids[4:], "positive_mask": mask[4:],
             "negative_ids": ids[:4, :45], "negative_mask": mask[:4, :45]}
    documents = torch.cat([model(ids[4:], mask[4:]), model(ids[:4, :45], mask[:4, :45])])
    expected = contrastive_loss(model(ids[:4, :20], mask[:4, :20]), documents)
    assert float(in_batch_negatives_loss(model, batch)) == pytest.approx(float(expected), rel=1e-5)


# --- exports --------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "modern"])
def test_the_onnx_export_gives_the_model_s_embeddings_on_onnx_runtime(bert_folder, modern_encoder, family,
                                                                      tmp_path):
    folder = bert_folder if family == "bert" else modern_encoder
    model, tokenizer = ours(folder, "mean", 64)
    path = tmp_path / "model.onnx"
    path.write_bytes(onnx_bytes(model, 64))
    ids, mask = tokenize_texts(tokenizer, TEXTS, 64)
    exported = onnx_embeddings(open_embedding_session(path), ids, mask, batch_size=2)
    assert np.abs(exported - encode_texts(model, tokenizer, TEXTS, 64, 4, FP32).numpy()).max() < 1e-5


# --- the command ------------------------------------------------------------------------------------------------

def command(*flags) -> list:
    return [sys.executable, REPO_ROOT / "run_retrieval.py", *flags]


@pytest.mark.slow
def test_the_command_trains_scores_and_exports(bert_folder, squad_beir, tmp_path):
    out = tmp_path / "out"
    result = run_command(command(
        "--init_checkpoint", bert_folder, "--vocab_file", bert_folder / "vocab.txt", "--do_lower_case", "--data_dir",
        squad_beir / "test", "--do_train", "--train_file", squad_beir / "train" / "qrels" / "train.tsv",
        "--max_steps", "2", "--train_batch_size", "4", "--max_seq_length", "32", "--do_eval", "--export_embeddings",
        "--export_onnx", "--output_dir", out, "--disable_progress_bar", "--json-summary", tmp_path / "log.json"))
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert {"ndcg@10", "mrr@10", "recall@100", "queries", "corpus_documents", "pooling", "checkpoint",
            "training_pairs_per_second"} <= set(results)
    assert results["queries"] == 24 and results["corpus_documents"] == 5 and results["train_steps"] == 2
    assert 0 < results["ndcg@10"] <= 1 and results["recall@100"] == 1.0  # 5 documents: all retrieved
    ids = json.loads((out / "corpus_ids.json").read_text())
    embeddings = load_file(str(out / "corpus_embeddings.safetensors"))["embeddings"]
    assert len(ids) == 5 and embeddings.shape == (5, 32)
    # The saved encoder reloads to the exported embeddings, the ONNX graph gives them too.
    model, tokenizer = ours(out, "mean", 32, vocab=bert_folder / "vocab.txt")
    corpus = beir_data.read_beir(squad_beir / "test")
    again = encode_texts(model, tokenizer, corpus.corpus_texts, 32, 8, FP32)
    assert (again - embeddings).abs().max() < 1e-5
    onnx = onnx_embeddings(open_embedding_session(out / "model.onnx"), *tokenize_texts(tokenizer,
                                                                                        corpus.corpus_texts, 32))
    assert np.abs(onnx - embeddings.numpy()).max() < 1e-5
    again_scores = run_command(command("--init_checkpoint", out / "pytorch_model.bin", "--vocab_file",
                                       bert_folder / "vocab.txt", "--do_lower_case", "--data_dir", squad_beir / "test",
                                       "--max_seq_length", "32", "--do_eval", "--output_dir", tmp_path / "again"))
    assert again_scores.returncode == 0, again_scores.stderr
    assert json.loads((tmp_path / "again" / "results.json").read_text())["ndcg@10"] == results["ndcg@10"]


@pytest.mark.parametrize("case", ["bad corpus line", "bad pairs line", "output is the data", "zero-width query"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(bert_folder, tmp_path, case):
    folder = write_beir(tmp_path / "beir", GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n', encoding="utf-8")
    out, expected = tmp_path / "out", {"bad corpus line": "corpus.jsonl:2: malformed JSON",
                                       "bad pairs line": "pairs.jsonl:1: field 'positive' is not a string (int)",
                                       "output is the data": "--output_dir",
                                       "zero-width query": "queries.jsonl:1: query 'q1' is '\\u200b'"}[case]
    if case == "zero-width query":
        (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "\\u200b"}\n', encoding="utf-8")
    elif case == "bad corpus line":
        (folder / "corpus.jsonl").write_text(GOOD_CORPUS.splitlines()[0] + "\n{\n", encoding="utf-8")
    elif case == "bad pairs line":
        pairs.write_text('{"query": "q", "positive": 3}\n', encoding="utf-8")
    else:
        out = folder
    before = snapshot(tmp_path)
    result = run_command(command("--init_checkpoint", bert_folder, "--vocab_file", bert_folder / "vocab.txt",
                                 "--do_lower_case", "--data_dir", folder, "--do_train", "--train_file", pairs,
                                 "--do_eval", "--output_dir", out, "--max_seq_length", "16"))
    assert result.returncode == 2 and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert snapshot(tmp_path) == before and (case == "output is the data" or not out.exists())


# --- integration: all-MiniLM-L6-v2 on SQuAD's dev set ------------------------------------------------------------

@pytest.mark.slow
def test_minilm_embeds_as_sentence_transformers_and_retrieves_squad_paragraphs_alike(shared_data, tmp_path):
    """all-MiniLM-L6-v2 (mean pooling) as it is: the same embeddings as sentence-transformers' on the questions
    and paragraphs of SQuAD's last 4 dev articles, a high nDCG@10 there, and the same scores as its own encode
    gives through our metric code."""
    minilm = shared_data / "minilm"
    squad_as_beir(shared_data / "squad" / "dev-v1.1.json", tmp_path, test_articles=4)
    split = beir_data.read_beir(tmp_path / "test")
    model, tokenizer = ours(minilm, "mean", 256)
    theirs = sentence_transformer(minilm, "mean", 256)
    scores = {}
    for name, encode in (("ours", lambda texts: encode_texts(model, tokenizer, texts, 256, 32, FP32)),
                         ("theirs", lambda texts: torch.from_numpy(theirs.encode(texts, batch_size=32)))):
        corpus, queries = encode(split.corpus_texts), encode(split.query_texts)
        ranking = exact_search(queries, corpus, split.query_ids, split.corpus_ids, 100)
        scores[name] = (retrieval_scores(split.qrels, ranking), corpus, queries)
    cosine = torch.cat([(scores["ours"][i] * scores["theirs"][i]).sum(1) for i in (1, 2)])
    assert cosine.min() >= 0.9999
    assert scores["ours"][0]["ndcg@10"] > 0.8, scores["ours"][0]
    assert scores["ours"][0] == pytest.approx(scores["theirs"][0], abs=2e-3)


def test_squad_becomes_beir_folders_split_by_article(squad_beir):
    """Trained on questions of the first 4 articles, scored on those of the last 2: no test question or paragraph
    among the training pairs; every judged id exists (read_beir checks it)."""
    test = beir_data.read_beir(squad_beir / "test")
    train = beir_data.read_beir(squad_beir / "train", split="train")
    pairs = beir_data.read_training_pairs(squad_beir / "pairs.jsonl")
    assert {doc.split("-")[0] for doc in test.corpus_ids} == {"4", "5"}
    assert len(train.corpus_ids) == 14 and len(test.query_ids) == 24 and len(pairs.queries) == 90 - 24
    assert not set(test.query_texts) & set(pairs.queries) and not set(test.corpus_texts) & set(pairs.positives)
    assert pairs.queries == train.query_texts


def test_the_command_trains_on_json_lines_pairs_with_hard_negatives(bert_folder, squad_beir, tmp_path):
    train = beir_data.read_training_pairs(squad_beir / "pairs.jsonl")
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"query": q, "positive": p, "negative": train.positives[(i + 7) % len(train.positives)]}
            for i, (q, p) in enumerate(zip(train.queries, train.positives, strict=True))]
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows[:8]), encoding="utf-8")
    result = run_command(command(
        "--init_checkpoint", bert_folder, "--vocab_file", bert_folder / "vocab.txt", "--do_lower_case", "--data_dir",
        squad_beir / "test", "--do_train", "--train_file", pairs, "--num_train_epochs", "1", "--train_batch_size",
        "4", "--max_seq_length", "32", "--pooling", "cls", "--symmetric_loss", "--do_eval", "--output_dir",
        tmp_path / "out", "--disable_progress_bar"))
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["hard_negatives"] is True and results["train_steps"] == 2 and results["train_pairs"] == 8
    assert results["pooling"] == "cls" and math.isfinite(results["final_loss"])
