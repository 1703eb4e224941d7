"""SQuAD metrics against a plain reference written here (crafted cases and real leaderboard predictions on an
excerpt of the dev sets kept in tests/data/squad), the official scripts' scores on that excerpt, the published
full dev-set scores of those systems (integration), and the drop-in command line."""
import errno
import functools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bertrecipe.cli import evaluate_squad
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import squad_metrics as ev
from helpers import TEST_DATA, run_command

REPO = Path(__file__).resolve().parents[1]
EXCERPT = TEST_DATA / "squad"  # a few dev articles of each version and three systems' predictions on them
# What the official evaluate-v1.1.py / evaluate-v2.0.py print for each of those prediction files (README.md there).
OFFICIAL = json.loads((EXCERPT / "official_scores.json").read_text(encoding="utf-8"))
ASCII_PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


# ---------------------------------------------------------------------------------------------------------
# Plain reference: no regular expressions, word boundaries checked by hand.
# ---------------------------------------------------------------------------------------------------------
def is_word_char(char):
    return char.isalnum() or char == "_"


@functools.lru_cache(maxsize=None)  # gold answers repeat across the systems compared
def ref_normalize(text):
    text = "".join(c for c in text.lower() if c not in ASCII_PUNCTUATION)
    out, i = [], 0
    while i < len(text):
        for article in ("the", "an", "a"):
            end = i + len(article)
            if (
                text.startswith(article, i)
                and (i == 0 or not is_word_char(text[i - 1]))
                and (end == len(text) or not is_word_char(text[end]))
            ):
                out.append(" ")
                i = end
                break
        else:
            out.append(text[i])
            i += 1
    return " ".join("".join(out).split())


def ref_f1(pred, gold, v2):
    p, g = ref_normalize(pred).split(), ref_normalize(gold).split()
    if v2 and (not p or not g):
        return 1.0 if p == g else 0.0
    common = sum(min(n, Counter(g)[w]) for w, n in Counter(p).items())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def ref_evaluate(questions, preds, v2, na_probs=None, thresh=1.0):
    """questions: list of (id, [gold texts]); returns the official summary. A question without a prediction
    counts 0 in v1.1 (evaluate-v1.1.py divides by every question) and is left out in v2.0 (evaluate-v2.0.py
    scores the predicted questions; its breakdown, which crashes there, is taken over them too)."""
    rows = []
    for qid, golds in questions:
        has = bool(golds)
        if qid not in preds:
            if not v2:
                rows.append((qid, has, 0.0, 0.0))
            continue
        if v2:
            golds = [g for g in golds if ref_normalize(g)] or [""]
        pred = preds[qid]
        em = max(float(ref_normalize(pred) == ref_normalize(g)) for g in golds)
        f1 = max(ref_f1(pred, g, v2) for g in golds)
        rows.append((qid, has, em, f1))
    if not v2:
        n = len(rows)
        return {"exact_match": 100 * sum(r[2] for r in rows) / n, "f1": 100 * sum(r[3] for r in rows) / n}
    probs = na_probs or {qid: 0.0 for qid in preds}
    scored = [(qid, has, float(not has) if probs[qid] > thresh else em, float(not has) if probs[qid] > thresh else f1)
              for qid, has, em, f1 in rows]
    out = {}
    groups = (("", scored), ("HasAns_", [r for r in scored if r[1]]), ("NoAns_", [r for r in scored if not r[1]]))
    for prefix, subset in groups:
        if subset:
            out[prefix + "exact"] = 100 * sum(r[2] for r in subset) / len(subset)
            out[prefix + "f1"] = 100 * sum(r[3] for r in subset) / len(subset)
            out[prefix + "total"] = len(subset)
    if na_probs is not None:
        for name, column in (("exact", 2), ("f1", 3)):
            # Every cut of the na-prob order: questions up to the cut answered, the others "no answer"; an
            # answered no-answer question counts 1 only when its prediction is the empty string.
            order = sorted(rows, key=lambda r: probs[r[0]])
            best, best_t = sum(not r[1] for r in rows), 0.0
            for cut in range(1, len(order) + 1):
                answered = order[:cut]
                score = sum((r[column] if r[1] else float(preds[r[0]] == "")) for r in answered)
                score += sum(not r[1] for r in order[cut:])
                if score > best:
                    best, best_t = score, probs[order[cut - 1][0]]
            out[f"best_{name}"] = 100 * best / len(rows)
            out[f"best_{name}_thresh"] = best_t
    return out


def as_dataset(questions):
    qas = [{"id": qid, "question": "?", "answers": [{"text": g, "answer_start": 0} for g in golds]}
           for qid, golds in questions]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def as_articles(questions, per_paragraph=2, paragraphs_per_article=2):
    """The questions spread over several articles of several paragraphs, in order."""
    paragraphs = [as_dataset(questions[i : i + per_paragraph])[0]["paragraphs"][0]
                  for i in range(0, len(questions), per_paragraph)]
    return [{"title": f"t{i}", "paragraphs": paragraphs[i : i + paragraphs_per_article]}
            for i in range(0, len(paragraphs), paragraphs_per_article)]


def ref_messages(questions, preds, v2):
    """The lines the official scripts print for missing predictions, in data order (v1.1 on stderr, v2.0 on
    stdout)."""
    form = "Missing prediction for {}" if v2 else "Unanswered question {} will receive score 0."
    return [form.format(qid) for qid, _ in questions if qid not in preds]


CRAFTED = [  # (gold answers, prediction)
    (["The Eiffel Tower"], "eiffel tower"),
    (["U.S.A."], "USA"),
    (["an apple a day"], "Apple day"),
    (["theater"], "the ater"),
    (["the€"], "€"),
    (["Café"], "café"),
    (["naïve"], "naive"),
    (["“quoted”"], "quoted"),
    (["l'été"], "lété"),
    (["9 a.m."], "9 am"),
    (["Denver Broncos", "The Broncos", "Broncos"], "the Denver Broncos team"),
    (["two", "2 years", "two years"], "2"),
    (["cat"], "the cat cat"),
    (["  spaced\tout  "], "spaced out"),
    (["A"], "an"),
    (["über_cool"], "über cool"),
    (["東京"], "東京"),
    (["1,000"], "1000"),
    (["Nothing"], ""),
]


@pytest.mark.parametrize("golds, pred", CRAFTED)
def test_single_scores_equal_reference(golds, pred):
    assert ev.normalize_answer(golds[0]) == ref_normalize(golds[0])
    expected_em = max(float(ref_normalize(pred) == ref_normalize(g)) for g in golds)
    assert max(ev.exact_match_score(pred, g) for g in golds) == expected_em
    for v2, f1 in ((False, ev.f1_score_v1), (True, ev.f1_score_v2)):
        assert max(f1(pred, g) for g in golds) == pytest.approx(max(ref_f1(pred, g, v2) for g in golds), abs=1e-15)


def test_known_values():
    assert ev.normalize_answer("The  Eiffel, Tower!") == "eiffel tower"
    assert ev.f1_score_v1("the cat sat", "a cat sat down") == pytest.approx(2 * (2 / 2) * (2 / 3) / (2 / 2 + 2 / 3))
    assert ev.f1_score_v1("", "") == 0.0 and ev.f1_score_v2("", "") == 1.0
    assert ev.f1_score_v2("the", "") == 1.0 and ev.exact_match_score("the", "") == 1.0
    assert ev.f1_score_v2("Paris", "") == 0.0


def test_several_gold_answers_take_the_best_of_each_metric_separately():
    questions = [("q", ["Denver Broncos", "the Broncos team of Denver"])]
    result = ev.evaluate_v1(as_dataset(questions), {"q": "Broncos team"})
    assert result == ref_evaluate(questions, {"q": "Broncos team"}, v2=False)
    assert result["exact_match"] == 0.0 and result["f1"] == pytest.approx(100 * 2 * 1 * 0.5 / 1.5)


def test_crafted_data_set_v1_and_v2_with_na_probs():
    questions = [(f"q{i}", golds) for i, (golds, _) in enumerate(CRAFTED)]
    questions += [("n1", []), ("n2", []), ("n3", [])]
    preds = {f"q{i}": pred for i, (_, pred) in enumerate(CRAFTED)}
    preds.update({"n1": "", "n2": "something", "n3": "the"})
    data = as_dataset(questions)
    only_answerable = [q for q in questions if q[1]]
    expected = ref_evaluate(only_answerable, preds, False)
    assert ev.evaluate_v1(as_dataset(only_answerable), preds) == pytest.approx(expected)
    assert ev.evaluate_v2(data, preds) == pytest.approx(ref_evaluate(questions, preds, True))
    na = {qid: p for qid, p in zip(preds, np.random.default_rng(0).uniform(size=len(preds)).tolist(), strict=True)}
    for thresh in (1.0, 0.5):
        got = ev.evaluate_v2(data, preds, na, thresh)
        assert got == pytest.approx(ref_evaluate(questions, preds, True, na, thresh))
        assert list(got)[:3] == ["exact", "f1", "total"]


@functools.lru_cache(maxsize=None)
def load_dev(squad_dir: Path, version: str) -> tuple[list, list]:
    """The articles of dev-v{version}.json in squad_dir and its questions as (id, [gold texts])."""
    data = json.loads((squad_dir / f"dev-v{version}.json").read_text(encoding="utf-8"))["data"]
    qas = [qa for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    questions = [(qa["id"], [a["text"] for a in qa["answers"]]) for qa in qas]
    return data, questions


def load_preds(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# Published dev-set scores of leaderboard systems (EM, F1), rounded to one decimal as published.
PUBLISHED_V1 = {
    "BERT_ensemble_Google_AI_Language.json": (86.2, 92.2),  # BERT paper, Table 2 (Ensemble + TriviaQA)
    "Match-LSTM_with_Ans-Ptr_Boundary_Ensemble_Singapore_Management_University.json": (67.6, 76.8),
}


def check_leaderboard_v1(squad_dir: Path, capsys) -> tuple[dict, dict]:
    """Each system's v1.1 scores and missing-prediction messages, checked against the reference."""
    data, questions = load_dev(squad_dir, "1.1")
    scores, messages = {}, {}
    for path in sorted((squad_dir / "predictions-v1.1").glob("*.json")):
        preds = load_preds(path)
        scores[path.name] = ev.evaluate_v1(data, preds)
        assert scores[path.name] == pytest.approx(ref_evaluate(questions, preds, False), abs=1e-9), path.name
        messages[path.name] = capsys.readouterr().err.splitlines()
        assert messages[path.name] == ref_messages(questions, preds, False), path.name
    return scores, messages


def test_leaderboard_predictions_v1_on_the_excerpt(capsys):
    scores, messages = check_leaderboard_v1(EXCERPT, capsys)
    assert list(scores) == list(OFFICIAL["v1.1"])  # the three files scored by the official script
    for name, official in OFFICIAL["v1.1"].items():
        assert scores[name] == pytest.approx(official, abs=1e-9), name
    # The baseline has no prediction for three of the excerpt's questions, as on the full set (13 there).
    assert len(messages["Logistic_Regression_Baseline_Stanford_University.json"]) == 3
    assert min(s["exact_match"] for s in scores.values()) < 30  # not a trivially perfect system


@pytest.mark.shared_data
def test_leaderboard_predictions_v1_on_the_full_dev_set(shared_data, capsys):
    scores, _ = check_leaderboard_v1(shared_data / "squad", capsys)
    assert len(scores) == 5
    for name, published in PUBLISHED_V1.items():
        assert (round(scores[name]["exact_match"], 1), round(scores[name]["f1"], 1)) == published


def check_leaderboard_v2(squad_dir: Path) -> dict:
    """Each system's v2.0 scores, checked against the reference."""
    data, questions = load_dev(squad_dir, "2.0")
    scores = {}
    for path in sorted((squad_dir / "predictions-v2.0").glob("*.json")):
        preds = load_preds(path)
        scores[path.name] = ev.evaluate_v2(data, preds)
        assert scores[path.name] == pytest.approx(ref_evaluate(questions, preds, True), abs=1e-9), path.name
    return scores


def test_leaderboard_predictions_v2_on_the_excerpt():
    scores = check_leaderboard_v2(EXCERPT)
    assert list(scores) == list(OFFICIAL["v2.0"])
    for name, got in scores.items():
        assert got == pytest.approx(OFFICIAL["v2.0"][name], abs=1e-9) and list(got) == list(OFFICIAL["v2.0"][name])
        assert (got["total"], got["HasAns_total"], got["NoAns_total"]) == (92, 30, 62)


@pytest.mark.shared_data
def test_leaderboard_predictions_v2_on_the_full_dev_set(shared_data):
    scores = check_leaderboard_v2(shared_data / "squad")
    assert len(scores) == 3
    for got in scores.values():
        assert (got["total"], got["HasAns_total"], got["NoAns_total"]) == (11873, 5928, 5945)
    # BERT paper, Table 3: dev EM of BERT-large (single)
    assert round(scores["BERT_single_model_Google_AI_Language.json"]["exact"], 1) == 78.7


@pytest.mark.parametrize("path", sorted((EXCERPT / "predictions-v2.0").glob("*.json")), ids=lambda p: p.name[:12])
def test_best_thresholds_on_real_predictions_equal_reference(path):
    _, questions = load_dev(EXCERPT, "2.0")
    preds = load_preds(path)
    rng = np.random.default_rng(3)
    # A na-prob that mostly agrees with the empty predictions, with noise, as a real model's would.
    na = {qid: float(0.6 * (preds[qid] == "") + 0.4 * rng.uniform()) for qid, _ in questions}
    got = ev.evaluate_v2(as_dataset(questions), preds, na)
    expected = ref_evaluate(questions, preds, True, na)
    assert got == pytest.approx(expected, abs=1e-9)
    assert got["best_exact"] >= got["exact"] - 1e-9


# Missing predictions: the official scripts' handling by default, refusal with strict.
MIXED = [(f"q{i}", golds) for i, (golds, _) in enumerate(CRAFTED)] + [("n1", []), ("n2", []), ("n3", [])]
MIXED_PREDS = {**{f"q{i}": pred for i, (_, pred) in enumerate(CRAFTED)}, "n1": "", "n2": "something", "n3": "the"}
DROPPED = ("q0", "q4", "q5", "q11", "n2")  # answerable and unanswerable, right and wrong predictions


def test_missing_predictions_v1_score_zero_over_every_question_with_one_message_each(capsys):
    questions = [q for q in MIXED if q[1]]
    preds = {qid: text for qid, text in MIXED_PREDS.items() if qid not in DROPPED}
    got = ev.evaluate_v1(as_articles(questions), preds)
    assert got == pytest.approx(ref_evaluate(questions, preds, False), abs=1e-12)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ref_messages(questions, preds, False)
    assert err.splitlines()[0] == "Unanswered question q0 will receive score 0."
    # Every question counts: the same predictions minus one question score lower.
    assert got["f1"] < ev.evaluate_v1(as_articles(questions), MIXED_PREDS)["f1"]


@pytest.mark.parametrize("with_na_probs", [False, True])
def test_missing_predictions_v2_are_left_out_with_one_message_each(capsys, with_na_probs):
    preds = {qid: text for qid, text in MIXED_PREDS.items() if qid not in DROPPED}
    na = None
    if with_na_probs:
        na = dict(zip(MIXED_PREDS, np.random.default_rng(1).uniform(size=len(MIXED_PREDS)).tolist(), strict=True))
    got = ev.evaluate_v2(as_articles(MIXED), preds, na)
    assert got == pytest.approx(ref_evaluate(MIXED, preds, True, na), abs=1e-12)
    assert (got["total"], got["HasAns_total"], got["NoAns_total"]) == (len(MIXED) - 5, len(CRAFTED) - 4, 2)
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == ref_messages(MIXED, preds, True) == [f"Missing prediction for {q}" for q in DROPPED]


def test_v2_group_without_predicted_questions_is_left_out(capsys):
    questions = [("a", ["Paris"]), ("b", ["two"]), ("n", [])]
    got = ev.evaluate_v2(as_articles(questions), {"a": "Paris", "b": "three"})
    assert got == pytest.approx(ref_evaluate(questions, {"a": "Paris", "b": "three"}, True))
    assert "NoAns_total" not in got and got["HasAns_total"] == 2 and got["exact"] == 50.0
    assert capsys.readouterr().out == "Missing prediction for n\n"


def test_strict_refuses_missing_predictions_and_other_bad_predictions_are_errors():
    data = as_dataset([("a", ["x"]), ("b", ["y"])])
    for evaluate in (ev.evaluate_v1, ev.evaluate_v2):
        with pytest.raises(InputError, match="preds.json: no prediction for 1 of 2 questions .first: b.; without --st"):
            evaluate(data, {"a": "x"}, pred_file="preds.json", strict=True)
    with pytest.raises(InputError, match="not a string"):
        ev.evaluate_v1(data, {"a": "x", "b": 3})
    # Where the official v2.0 script divides by zero, and an empty data set.
    with pytest.raises(InputError, match="preds.json: no prediction for any of the 2 questions"):
        ev.evaluate_v2(data, {"c": "x"}, pred_file="preds.json")
    assert ev.evaluate_v1(data, {}) == {"exact_match": 0.0, "f1": 0.0}  # as evaluate-v1.1.py
    with pytest.raises(InputError, match="no questions"):
        ev.evaluate_v1([], {})


def test_leaderboard_predictions_v2_with_missing_questions(capsys):
    data, questions = load_dev(EXCERPT, "2.0")
    dropped = {qid for qid, _ in questions[::7]}
    assert {bool(golds) for qid, golds in questions if qid in dropped} == {True, False}  # both kinds left out
    for path in sorted((EXCERPT / "predictions-v2.0").glob("*.json")):
        preds = load_preds(path)
        kept = {qid: text for qid, text in preds.items() if qid not in dropped}
        got = ev.evaluate_v2(data, kept)
        assert got == pytest.approx(ref_evaluate(questions, kept, True), abs=1e-9), path.name
        assert got["total"] == 92 - len(dropped) == got["HasAns_total"] + got["NoAns_total"]
        lines = capsys.readouterr().out.splitlines()
        assert lines == ref_messages(questions, kept, True) and len(lines) == len(dropped) == 14, path.name


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------
def run_cli(*args):
    return run_command([sys.executable, REPO / "evaluate_squad.py", *args], cwd=REPO)


def test_cli_v1_prints_the_official_json():
    pred = EXCERPT / "predictions-v1.1" / "BERT_ensemble_Google_AI_Language.json"
    done = run_cli(EXCERPT / "dev-v1.1.json", pred)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1
    printed = json.loads(done.stdout)
    assert list(printed) == ["exact_match", "f1"]
    assert printed == ev.evaluate_files(EXCERPT / "dev-v1.1.json", pred)
    assert printed == pytest.approx(OFFICIAL["v1.1"][pred.name], abs=1e-12)


def test_cli_v2_with_na_probs_and_out_file(tmp_path):
    data = {"version": "v2.0", "data": as_dataset([("a", ["Paris"]), ("b", []), ("c", ["two"])])}
    (tmp_path / "data.json").write_text(json.dumps(data))
    (tmp_path / "pred.json").write_text(json.dumps({"a": "Paris", "b": "Lyon", "c": "2"}))
    (tmp_path / "na.json").write_text(json.dumps({"a": 0.1, "b": 0.9, "c": 0.4}))
    done = run_cli(tmp_path / "data.json", tmp_path / "pred.json", "--na-prob-file", tmp_path / "na.json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert list(printed) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                             "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    assert printed["best_exact"] == pytest.approx(200 / 3) and printed["best_exact_thresh"] == 0.1
    out = run_cli(tmp_path / "data.json", tmp_path / "pred.json", "--out-file", tmp_path / "eval.json")
    assert out.returncode == 0 and out.stdout == ""  # the official v2.0 script writes the file instead
    assert json.loads((tmp_path / "eval.json").read_text())["total"] == 3


@pytest.mark.parametrize(
    "case", ["malformed data", "malformed predictions", "missing id with --strict", "missing file",
             "predictions are a directory", "--strict with --allow-missing"])
def test_cli_bad_input_exits_2_with_one_line_naming_the_file(tmp_path, case):
    data, pred = tmp_path / "data.json", tmp_path / "pred.json"
    data.write_text(json.dumps({"version": "1.1", "data": as_dataset([("a", ["x"]), ("b", ["y"])])}))
    pred.write_text(json.dumps({"a": "x", "b": "y"}))
    named, flags = pred, []
    if case.startswith("malformed"):
        named = data if case == "malformed data" else pred
        named.write_text('{"a": "x",')
    elif case == "missing id with --strict":
        pred.write_text(json.dumps({"a": "x"}))
        flags = ["--strict"]
    elif case == "missing file":
        pred.unlink()
    elif case == "predictions are a directory":
        pred.unlink()
        pred.mkdir()
    else:
        named, flags = "--allow-missing", ["--strict", "--allow-missing"]
    done = run_cli(data, pred, *flags)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(named) in lines[0], done.stderr


def write_v2_fixture(tmp_path, preds):
    questions = [("a", ["Paris"]), ("b", []), ("c", ["two"]), ("d", ["x y"]), ("e", [])]
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"version": "v2.0", "data": as_articles(questions)}))
    (tmp_path / "pred.json").write_text(json.dumps(preds))
    return questions, data, tmp_path / "pred.json"


def test_cli_missing_predictions_print_what_the_official_scripts_print(tmp_path):
    # v1.1: the scores on stdout as one line, a message per missing question on stderr.
    questions = [("a", ["x"]), ("b", ["y"]), ("c", ["z w"]), ("d", ["v"])]
    preds = {"a": "x", "c": "z"}
    (tmp_path / "v1.json").write_text(json.dumps({"version": "1.1", "data": as_articles(questions)}))
    (tmp_path / "p1.json").write_text(json.dumps(preds))
    outputs = [run_cli(tmp_path / "v1.json", tmp_path / "p1.json", *flags) for flags in ([], ["--allow-missing"])]
    for done in outputs:
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == pytest.approx(ref_evaluate(questions, preds, False))
        assert len(done.stdout.splitlines()) == 1
        assert done.stderr.splitlines() == ref_messages(questions, preds, False)
    assert outputs[0].stdout == outputs[1].stdout  # --allow-missing changes nothing
    # v2.0: the messages on stdout, then the indented scores.
    questions, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "c": "three", "e": ""})
    done = run_cli(data, pred)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["Missing prediction for b", "Missing prediction for d"]
    printed = json.loads("\n".join(lines[2:]))
    assert printed == pytest.approx(ref_evaluate(questions, {"a": "Paris", "c": "three", "e": ""}, True))
    assert printed["total"] == 3 and lines[2:] == json.dumps(printed, indent=2).splitlines()


def test_cli_v2_refused_na_prob_file_prints_only_the_error_line(tmp_path):
    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "c": "three", "e": ""})
    na = tmp_path / "na.json"
    na.write_text(json.dumps({"a": 0.1, "e": 0.9}))  # none for the predicted question c
    done = run_cli(data, pred, "--na-prob-file", na)
    assert done.returncode == 2 and done.stdout == ""  # no "Missing prediction" lines before the error
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"error: {na}: no probability for question c", done.stderr


# Issue 48, item 11: a na-prob that is a string, null or list blamed the good data file ("not a SQuAD file
# (TypeError: '>' not supported ...)"); NaN and true were taken as numbers.
@pytest.mark.parametrize("question, value", [
    ("c", "0.4"), ("c", None), ("c", [0.4]), ("c", True), ("c", float("nan")), ("c", float("inf")),
    ("not-in-the-data", "x")], ids=["string", "null", "list", "bool", "nan", "inf", "unused-question"])
def test_a_na_prob_that_is_not_a_finite_number_is_one_line_naming_the_na_prob_file_and_the_question(
        tmp_path, question, value):
    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "c": "three", "e": ""})
    na = tmp_path / "na.json"
    na.write_text(json.dumps({"a": 0.1, "c": 0.4, "e": 0.9, question: value}))
    with pytest.raises(InputError) as refused:
        ev.evaluate_files(data, pred, na)
    message = str(refused.value)
    assert message.startswith(f"{na}: ") and f"question {question} " in message and str(data) not in message
    assert "\n" not in message and "finite number" in message
    with pytest.raises(InputError, match=f"^na-prob file: .*question {question} "):  # in process, as run_squad calls
        ev.evaluate_predictions(data, json.loads(pred.read_text()), json.loads(na.read_text()))


def test_the_na_prob_file_is_checked_for_a_v1_1_data_file_too_and_the_command_exits_2(tmp_path):
    (tmp_path / "v1.json").write_text(json.dumps({"version": "1.1", "data": as_articles([("a", ["x"])])}))
    (tmp_path / "pred.json").write_text(json.dumps({"a": "x"}))
    (tmp_path / "na.json").write_text(json.dumps({"a": None}))
    done = run_cli(tmp_path / "v1.json", tmp_path / "pred.json", "-n", tmp_path / "na.json")
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: {tmp_path / 'na.json'}: the no-answer probability of question a is null")


@pytest.mark.parametrize("version", ["1.1", "v2.0"])
@pytest.mark.parametrize("answer", [None, ["three"], 3, {"text": "three"}], ids=["null", "list", "number", "object"])
def test_a_prediction_that_is_not_a_string_is_one_line_naming_the_predictions_and_the_question(tmp_path, version,
                                                                                               answer):
    questions = [("a", ["Paris"]), ("c", ["two"])]
    (tmp_path / "data.json").write_text(json.dumps({"version": version, "data": as_articles(questions)}))
    (tmp_path / "pred.json").write_text(json.dumps({"a": "Paris", "c": answer}))
    with pytest.raises(InputError) as refused:
        ev.evaluate_files(tmp_path / "data.json", tmp_path / "pred.json")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'pred.json'}: the prediction for c is {json.dumps(answer)}, not a string")


def test_cli_logistic_regression_baseline_like_evaluate_v1_1():
    _, questions = load_dev(EXCERPT, "1.1")
    [pred] = (EXCERPT / "predictions-v1.1").glob("Logistic_Regression_Baseline_*.json")
    preds = load_preds(pred)
    done = run_cli(EXCERPT / "dev-v1.1.json", pred)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == pytest.approx(ref_evaluate(questions, preds, False), abs=1e-9)
    assert json.loads(done.stdout) == pytest.approx(OFFICIAL["v1.1"][pred.name], abs=1e-12)
    messages = done.stderr.splitlines()
    assert messages == ref_messages(questions, preds, False) and len(messages) == 3
    assert all(line.startswith("Unanswered question ") for line in messages)


@pytest.mark.parametrize("case", ["missing folder", "a directory", "folder is a file", "name too long"])
def test_cli_unusable_out_file_is_one_line_before_any_work(tmp_path, case):
    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "b": "", "c": "2", "d": "x", "e": ""})
    out = {"missing folder": tmp_path / "no" / "such" / "eval.json", "a directory": tmp_path,
           "folder is a file": pred / "eval.json", "name too long": tmp_path / ("e" * 300)}[case]
    data.write_text("{")  # would be reported first if the data were read before the out-file is checked
    done = run_cli(data, pred, "--out-file", out)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and "--out-file" in lines[0], done.stderr
    if case == "missing folder":
        assert str(out.parent) in lines[0] and "does not exist" in lines[0]
        assert not (tmp_path / "no").exists()  # nothing created


def test_cli_out_file_is_written_whole_and_nothing_else(tmp_path):
    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "b": "", "c": "2", "d": "x", "e": ""})
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "eval.json"
    out.write_text("old scores")
    done = run_cli(data, pred, "-o", out)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert json.loads(out.read_text()) == ev.evaluate_files(data, pred)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["eval.json"]  # no temporary left behind


@pytest.mark.parametrize("name", OFFICIAL["v2.0 --na-prob-file"], ids=lambda name: name[:12])
def test_in_process_evaluation_equals_the_file_evaluation_and_the_official_script(tmp_path, name):
    pred_file = EXCERPT / "predictions-v2.0" / name
    preds = load_preds(pred_file)
    # As official_scores.json was made: probability 1 of no answer where the system predicts none.
    na = {qid: float(text == "") for qid, text in preds.items()}
    (tmp_path / "na.json").write_text(json.dumps(na))
    data_file = EXCERPT / "dev-v2.0.json"
    in_process = ev.evaluate_predictions(data_file, preds, na)
    assert in_process == ev.evaluate_files(data_file, pred_file, tmp_path / "na.json")
    assert in_process == pytest.approx(OFFICIAL["v2.0 --na-prob-file"][name], abs=1e-12)
    assert list(in_process) == list(OFFICIAL["v2.0 --na-prob-file"][name])
    assert in_process["best_exact"] >= in_process["exact"]


def test_failed_out_file_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "b": "", "c": "2", "d": "x", "e": ""})
    out = tmp_path / "eval.json"
    out.write_text("old scores")
    before = sorted(p.name for p in tmp_path.iterdir())

    def full_disk(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full_disk)  # wherever the write happens (atomic_files)
    with pytest.raises(InputError, match=f"{out}: cannot write the scores .No space left on device."):
        evaluate_squad.main([str(data), str(pred), "--out-file", str(out)])
    assert out.read_text() == "old scores" and sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_reads_the_data_file_once(tmp_path, monkeypatch, capsys):
    """Its check and its scoring see one read of the file (one squad.SquadFile passed on), as run_squad.py's do."""
    import builtins

    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "b": "", "c": "2", "d": "x", "e": ""})
    real_open, opened = builtins.open, []

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).resolve() == data.resolve():
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    evaluate_squad.main([str(data), str(pred)])
    assert len(opened) == 1


@pytest.mark.parametrize("target", ["pred.json", "data.json", "na.json"])
def test_cli_out_file_onto_an_input_is_one_line_and_the_input_is_kept(tmp_path, target):
    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "b": "", "c": "2", "d": "x", "e": ""})
    na = tmp_path / "na.json"
    na.write_text(json.dumps({qid: 0.5 for qid in "abcde"}))
    flags = {"pred.json": "pred.json", "data.json": "data.json", "na.json": "--na-prob-file"}
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    done = run_cli(data, pred, "--na-prob-file", na, "--out-file", tmp_path / "." / target)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert f"--out-file is the same file as {flags[target]} {tmp_path / target}" in line, line
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_cli_output_sent_into_the_predictions_is_one_line_and_they_are_kept(tmp_path):
    """`evaluate_squad.py data.json pred.json >> pred.json` would append the scores to the predictions (and `>`
    empties them first, which otherwise reads as "malformed JSON")."""
    _, data, pred = write_v2_fixture(tmp_path, {"a": "Paris", "b": "", "c": "2", "d": "x", "e": ""})
    before = pred.read_bytes()
    with open(pred, "a") as stdout:
        done = subprocess.run([sys.executable, str(REPO / "evaluate_squad.py"), str(data), str(pred)],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: /dev/stdout: the standard output is the same file as pred.json {pred}; writing it would destroy "
        "the input: send the output (>) to another file"]
    assert pred.read_bytes() == before
