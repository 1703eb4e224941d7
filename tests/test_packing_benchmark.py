"""benchmarks/packing.py's weighting of a dump's articles to Wikipedia's mean length: the weighted mean is the one
asked for, and no other weighting of the same articles with that mean is closer to drawing them evenly (the
property that makes it the least change to the dump's own distribution)."""
import numpy as np
import pytest

from benchmarks.packing import article_weights

WORDS = [4, 38, 216, 480, 900, 1_300, 2_950, 6_150, 9_200, 14_000]


def divergence_from_even(weights: np.ndarray) -> float:
    """KL(weights || even), in nats."""
    return float(np.sum(weights * np.log(weights * len(weights))))


@pytest.mark.parametrize("mean", [668.0, 2_000.0, 7_000.0])
def test_the_weighted_mean_is_the_one_asked_for(mean):
    weights = article_weights(WORDS, mean)
    assert weights.min() > 0 and weights.sum() == pytest.approx(1.0)
    assert float(weights @ np.array(WORDS, dtype=float)) == pytest.approx(mean, rel=1e-9)
    order = np.diff(weights)  # below the even mean (3,524 words) short articles weigh more, above it long ones
    assert (order < 0).all() if mean < np.mean(WORDS) else (order > 0).all()


def test_no_other_weighting_with_that_mean_is_closer_to_even():
    words = np.array(WORDS, dtype=float)
    weights = article_weights(WORDS, 668.0)
    generator = np.random.default_rng(0)
    for _ in range(200):
        # a change that keeps the sum and the mean: orthogonal to both the ones vector and the word counts
        change = generator.normal(size=len(words))
        basis = np.stack([np.ones_like(words), words])
        change -= basis.T @ np.linalg.lstsq(basis.T, change, rcond=None)[0]
        other = weights + 1e-3 * weights.min() * change / np.abs(change).max()
        assert other.sum() == pytest.approx(1.0) and float(other @ words) == pytest.approx(668.0)
        assert divergence_from_even(other) > divergence_from_even(weights)


@pytest.mark.parametrize("mean", [4.0, 2.0, 14_000.0, 20_000.0])
def test_a_mean_outside_the_articles_lengths_is_refused(mean):
    with pytest.raises(ValueError, match="is not between the articles' 4 and 14000"):
        article_weights(WORDS, mean)


def test_a_mean_that_no_rate_reaches_is_refused():
    with pytest.raises(ValueError, match="too close to the articles' shortest or longest"):
        article_weights([100, 101, 5_000], 100.01)  # at rate 1 the 101-word article still weighs e^-1
