"""benchmarks/downstream_vs_transformers.py's own parts, without a model: the peer's metrics written in plain Python
against numpy's, the excerpts keep the header and the rows asked for, and the verdict follows its rule. The
comparison itself (minutes of fine-tuning) is the benchmark's to report, never asserted here."""
from __future__ import annotations

import numpy as np

from benchmarks.downstream_vs_transformers import best, classification, correlations, excerpt, ranks


def numpy_ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties given the mean of the ranks they span (the Spearman convention)."""
    values = np.asarray(values)
    return np.array([np.mean(np.flatnonzero(np.sort(values) == v)) + 1 for v in values])


def test_ranks_and_correlations_match_numpy():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, 40).astype(float).tolist()  # many ties
    y = (np.asarray(x) + rng.normal(0, 2, 40)).tolist()
    assert np.allclose(ranks(x), numpy_ranks(x))
    got = correlations(x, y)
    assert np.isclose(got["Pearson"], np.corrcoef(x, y)[0, 1])
    assert np.isclose(got["Spearman"], np.corrcoef(numpy_ranks(x), numpy_ranks(y))[0, 1])


def test_accuracy_and_f1_of_class_one():
    predicted, gold = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]
    assert classification(predicted, gold) == {"acc": 4 / 6, "F1": 2 * 2 / (2 * 2 + 1 + 1)}
    assert classification([0, 0], [1, 0])["F1"] == 0.0


def test_an_excerpt_keeps_the_header_and_the_first_rows(tmp_path):
    source = tmp_path / "train.tsv"
    source.write_bytes("\ufeffQuality\t#1 ID\n1\ta\r\n0\tb\n1\tc\n".encode("utf-8"))
    excerpt("mrpc", 2, source, tmp_path / "out" / "train.tsv")
    assert (tmp_path / "out" / "train.tsv").read_bytes() == "\ufeffQuality\t#1 ID\n1\ta\r\n0\tb\n".encode("utf-8")


def test_the_best_configuration_is_the_highest_median():
    assert best({"1e-4": [70.0, 80.0, 90.0], "5e-5": [84.0, 85.0, 60.0]}) == ("5e-5", 84.0, 25.0)
