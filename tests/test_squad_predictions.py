"""SQuAD answer extraction against a plain reference of the original post-processing written here (n-best
spans, get-final-text alignment with transformers' BasicTokenizer as an independent basic tokenizer, v2 null
score and threshold), and the atomic prediction files."""
import json
import math
import unicodedata

import numpy as np
import pytest
from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer

from bertrecipe.finetuning import squad, squad_answers
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from helpers import TEST_DATA

EXCERPT = TEST_DATA / "squad"  # 90 dev-v1.1 and 92 dev-v2.0 questions of a few real articles


@pytest.fixture(scope="module")
def tokenizer(vocab_file):
    return BertTokenizer(load_vocab(vocab_file), do_lower_case=True)


# ---------------------------------------------------------------------------------------------------------
# Plain reference
# ---------------------------------------------------------------------------------------------------------
def reference_final_text(pred_text, orig_text, do_lower_case):
    tok_text = " ".join(BasicTokenizer(do_lower_case=do_lower_case).tokenize(orig_text))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1

    def strip(text):
        chars, mapping = [], {}
        for i, c in enumerate(text):
            if c == " ":
                continue
            mapping[len(chars)] = i
            chars.append(c)
        return "".join(chars), mapping

    orig_ns, orig_map = strip(orig_text)
    tok_ns, tok_map = strip(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_to_ns = {v: k for k, v in tok_map.items()}
    if start not in tok_to_ns or end not in tok_to_ns:
        return orig_text
    return orig_text[orig_map[tok_to_ns[start]] : orig_map[tok_to_ns[end]] + 1]


def reference_predictions(examples, features, start_logits, end_logits, vocab, n_best, max_len, lower, v2, threshold):
    answers, nbests, odds = {}, {}, {}
    for i, example in enumerate(examples):
        prelim = []
        null = None
        for row in range(len(features)):
            if features.example_index[row] != i:
                continue
            n_tokens = int(features.input_mask[row].sum())
            to_orig = {p: int(w) for p, w in enumerate(features.token_to_orig[row]) if w >= 0}
            is_max = {p: bool(features.token_is_max_context[row, p]) for p in to_orig}
            s_log = [float(x) for x in start_logits[row]]
            e_log = [float(x) for x in end_logits[row]]
            # The original ranks every position; ours leaves padding out (a dense model's padded logits are low,
            # so it ranks them last anyway; with padding skipped they are not computed).
            best_s = [k for k, _ in sorted(enumerate(s_log[:n_tokens]), key=lambda x: x[1], reverse=True)][:n_best]
            best_e = [k for k, _ in sorted(enumerate(e_log[:n_tokens]), key=lambda x: x[1], reverse=True)][:n_best]
            if v2 and (null is None or s_log[0] + e_log[0] < null[0]):
                null = (s_log[0] + e_log[0], row, 0, 0, s_log[0], e_log[0])
            for s in best_s:
                for e in best_e:
                    if s >= n_tokens or e >= n_tokens or s not in to_orig or e not in to_orig:
                        continue
                    if not is_max.get(s, False) or e < s or e - s + 1 > max_len:
                        continue
                    prelim.append((s_log[s] + e_log[e], row, s, e, s_log[s], e_log[e]))
        if v2:
            prelim.append(null)
        prelim = sorted(prelim, key=lambda p: p[4] + p[5], reverse=True)
        nbest, seen = [], set()
        for _, row, s, e, sl, el in prelim:
            if len(nbest) >= n_best:
                break
            if s > 0:
                pieces = " ".join(vocab.tokens[t] for t in features.input_ids[row, s : e + 1])
                pred = " ".join(pieces.replace(" ##", "").replace("##", "").strip().split())
                w0, w1 = int(features.token_to_orig[row, s]), int(features.token_to_orig[row, e])
                text = reference_final_text(pred, " ".join(example.doc_tokens[w0 : w1 + 1]), lower)
            else:
                text = ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append((text, sl, el))
        if v2 and "" not in seen:
            nbest.append(("", null[4], null[5]))
        if not any(t for t, _, _ in nbest):
            nbest.insert(0, ("empty", 0.0, 0.0))
        scores = [s + e for _, s, e in nbest]
        exps = [math.exp(x - max(scores)) for x in scores]
        entries = [
            {"text": t, "probability": x / sum(exps), "start_logit": s, "end_logit": e}
            for (t, s, e), x in zip(nbest, exps, strict=True)
        ]
        nbests[example.qas_id] = entries
        if v2:
            best = next(x for x in entries if x["text"])
            odds[example.qas_id] = null[0] - best["start_logit"] - best["end_logit"]
            answers[example.qas_id] = "" if odds[example.qas_id] > threshold else best["text"]
        else:
            answers[example.qas_id] = entries[0]["text"]
    return answers, nbests, odds


def random_logits(features, seed):
    """Noise plus a few strong positions per window, so that real spans and the null answer compete."""
    rng = np.random.default_rng(seed)
    start = rng.normal(size=features.input_ids.shape).astype(np.float32)
    end = rng.normal(size=features.input_ids.shape).astype(np.float32)
    rows = np.arange(len(features))
    for _ in range(3):
        s = rng.integers(0, features.input_ids.shape[1], len(features))
        start[rows, s] += 4
        end[rows, np.minimum(s + rng.integers(0, 6, len(features)), features.input_ids.shape[1] - 1)] += 4
    return start, end


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_extract_answers_equals_reference(tokenizer, version):
    v2 = version == "2.0"
    examples = squad.read_squad_examples(EXCERPT / f"dev-v{version}.json", False, v2)
    settings = squad.WindowSettings(max_seq_length=96, doc_stride=32, max_query_length=24)
    features = squad.convert_examples_to_features(examples, tokenizer, settings)
    start, end = random_logits(features, seed=len(version))
    # [CLS] strong for some questions in all of their windows, so that the null answer sometimes wins.
    boost = np.random.default_rng(1).uniform(0, 8, len(examples))[features.example_index]
    start[:, 0] += boost
    end[:, 0] += boost
    answer_settings = squad_answers.AnswerSettings(n_best_size=20, max_answer_length=30, version_2_with_negative=v2,
                                           null_score_diff_threshold=0.5)
    got = squad_answers.extract_answers(examples, features, start, end, tokenizer.vocab, answer_settings)
    answers, nbests, odds = reference_predictions(
        examples, features, start, end, tokenizer.vocab, 20, 30, True, v2, 0.5
    )
    assert got.answers == answers
    assert got.nbest == nbests
    assert got.null_odds == odds
    assert len(set(answers.values())) > len(examples) / 3  # as > 100 of the 300 questions read before
    if v2:
        # The threshold decides both ways (10 % to 90 % empty, as 30 to 270 of the 300 questions before).
        assert 0.1 * len(examples) < sum(a == "" for a in answers.values()) < 0.9 * len(examples)


def test_padded_positions_never_take_an_nbest_slot(tokenizer):
    examples = squad.read_squad_examples(EXCERPT / "dev-v1.1.json", False, False)
    features = squad.convert_examples_to_features(examples, tokenizer, squad.WindowSettings(max_seq_length=256))
    padded = features.input_mask == 0
    assert padded.mean() > 0.2
    start, end = random_logits(features, seed=3)
    low = squad_answers.extract_answers(examples, features, np.where(padded, -50, start), np.where(padded, -50, end),
                                        tokenizer.vocab)
    high = squad_answers.extract_answers(examples, features, np.where(padded, 50, start), np.where(padded, 50, end),
                                         tokenizer.vocab)
    assert high.answers == low.answers and high.nbest == low.nbest
    assert all(len(entries) == 20 for entries in high.nbest.values())


def test_extract_answers_finds_a_planted_span_and_maps_it_to_the_original_text(tokenizer):
    context = "The Broncos' defense, led by Von Miller, beat the Panthers (24–10) in Santa Clara."
    words, _ = squad.split_context(context)
    example = squad.SquadExample("q1", "Who led the defense?", words, [])
    features = squad.convert_examples_to_features([example], tokenizer)
    tokens = [tokenizer.vocab.tokens[t] for t in features.input_ids[0]]
    start_logits = np.zeros_like(features.input_ids, dtype=np.float32)
    end_logits = np.zeros_like(start_logits)
    start_logits[0, tokens.index("von")] = 10
    end_logits[0, tokens.index("miller")] = 10
    result = squad_answers.extract_answers([example], features, start_logits, end_logits, tokenizer.vocab)
    assert result.answers == {"q1": "Von Miller"}  # original case, without the comma of "Miller,"
    assert result.nbest["q1"][0]["text"] == "Von Miller"
    assert abs(sum(entry["probability"] for entry in result.nbest["q1"]) - 1) < 1e-9
    assert len(result.nbest["q1"]) == 20


def test_v2_threshold_rule_and_null_odds(tokenizer):
    words, _ = squad.split_context("Paris is the capital of France.")
    example = squad.SquadExample("q", "What is the capital?", words, [])
    features = squad.convert_examples_to_features([example], tokenizer)
    tokens = [tokenizer.vocab.tokens[t] for t in features.input_ids[0]]
    start = np.zeros_like(features.input_ids, dtype=np.float32)
    end = np.zeros_like(start)
    start[0, tokens.index("paris")], end[0, tokens.index("paris")] = 3.0, 2.0
    start[0, 0], end[0, 0] = 4.0, 2.5  # null score 6.5 against 5.0: odds 1.5
    for threshold, expected in ((1.0, ""), (1.5, "Paris"), (2.0, "Paris")):
        settings = squad_answers.AnswerSettings(version_2_with_negative=True, null_score_diff_threshold=threshold)
        result = squad_answers.extract_answers([example], features, start, end, tokenizer.vocab, settings)
        assert result.answers["q"] == expected
        assert result.null_odds["q"] == pytest.approx(1.5)
        assert "" in [entry["text"] for entry in result.nbest["q"]]


def test_null_score_is_the_minimum_over_windows(tokenizer):
    words = ("alpha beta gamma delta " * 30).split()
    example = squad.SquadExample("q", "which?", words, [])
    features = squad.convert_examples_to_features([example], tokenizer, squad.WindowSettings(64, 16, 8))
    assert len(features) >= 3
    start = np.zeros_like(features.input_ids, dtype=np.float32)
    end = np.zeros_like(start)
    start[:, 0] = np.arange(len(features)) + 5.0
    start[1, 0] = 1.0  # the smallest null score is in the second window
    settings = squad_answers.AnswerSettings(version_2_with_negative=True)
    result = squad_answers.extract_answers([example], features, start, end, tokenizer.vocab, settings)
    assert result.null_odds["q"] == pytest.approx(1.0)  # best span scores 0 + 0


@pytest.mark.parametrize("lower", [True, False])
def test_basic_tokenize_equals_transformers_basic_tokenizer(lower):
    texts = []
    for version in ("1.1", "2.0"):  # every context, question and answer of the excerpts
        data = json.loads((EXCERPT / f"dev-v{version}.json").read_text(encoding="utf-8"))
        for paragraph in (p for article in data["data"] for p in article["paragraphs"]):
            texts.append(paragraph["context"])
            texts += [qa["question"] for qa in paragraph["qas"]]
            texts += [a["text"] for qa in paragraph["qas"] for a in qa["answers"]]
    texts += ["Café naïve — “quoted” 東京 (1895s) $5^2 a\u00a0b \u200bx\tY\u3000z ÉCOLE"]
    # transformers normalizes to NFC first, BERT does not: compare on NFC text only.
    texts = [t for t in texts if unicodedata.normalize("NFC", t) == t]
    reference = BasicTokenizer(do_lower_case=lower)
    for text in texts:
        assert squad_answers.basic_tokenize(text, lower) == reference.tokenize(text)


@pytest.mark.parametrize(
    "pred, orig, lower, expected",
    [
        ("steve smith", "Steve Smith's", True, "Steve Smith"),
        ("cafe", "Café,", True, "Café"),
        ("1895", "(1895)", True, "1895"),
        ("24 – 10", "(24–10)", True, "24–10"),
        ("Von", "Von Miller", False, "Von"),
        ("miller", "Von Miller", False, "Von Miller"),  # cased model, case differs: whole original
        ("xyz", "abc", True, "abc"),
    ],
)
def test_get_final_text(pred, orig, lower, expected):
    assert squad_answers.get_final_text(pred, orig, lower) == expected
    assert reference_final_text(pred, orig, lower) == expected


def test_write_predictions_is_atomic_and_complete(tmp_path):
    predictions = squad_answers.SquadPredictions(
        {"a": "Paris", "b": ""},
        {"a": [{"text": "Paris", "probability": 1.0, "start_logit": 1.0, "end_logit": 2.0}], "b": []},
        {"a": -3.0, "b": 2.0},
    )
    paths = squad_answers.write_predictions(tmp_path, predictions, version_2_with_negative=True)
    assert sorted(p.name for p in paths) == ["nbest_predictions.json", "null_odds.json", "predictions.json"]
    assert json.loads((tmp_path / "predictions.json").read_text()) == predictions.answers
    assert json.loads((tmp_path / "nbest_predictions.json").read_text()) == predictions.nbest
    assert json.loads((tmp_path / "null_odds.json").read_text()) == predictions.null_odds
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)  # no temporary left
    v1_dir = tmp_path / "v1"
    assert [p.name for p in squad_answers.write_predictions(v1_dir, predictions, False)] == [
        "predictions.json", "nbest_predictions.json"
    ]


def test_failed_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "predictions.json"
    squad_answers.write_json_atomic(target, {"a": "old"})
    with pytest.raises(TypeError):
        squad_answers.write_json_atomic(target, {"a": object()})  # not serializable
    assert json.loads(target.read_text()) == {"a": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["predictions.json"]
