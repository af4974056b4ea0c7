"""Simulated annotators: symmetric Bradley-Terry probabilities, honest hard labels, reproducible."""

import math
import random

import pytest
from scipy.stats import binomtest

from reward.annotators import label_pair, preference_probability

GOLD_PAIRS = [(0.9, 0.1), (0.7, 0.4), (0.55, 0.5), (0.3, 0.8), (0.0, 1.0), (0.5, 0.5)]
TEMPERATURES = [0.05, 0.2, 1.0]


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("gold_i, gold_j", GOLD_PAIRS)
def test_symmetric(gold_i, gold_j, temperature):
    p_ij = preference_probability(gold_i, gold_j, temperature)
    assert 0.0 <= p_ij <= 1.0
    assert p_ij + preference_probability(gold_j, gold_i, temperature) == pytest.approx(1.0, abs=1e-12)


def test_values():
    assert preference_probability(0.4, 0.4, 0.1) == 0.5
    assert preference_probability(0.7, 0.5, 0.1) == pytest.approx(1.0 / (1.0 + math.exp(-2.0)))
    # Large gaps over a small temperature saturate without overflowing.
    assert preference_probability(1.0, 0.0, 1e-4) == 1.0
    assert preference_probability(0.0, 1.0, 1e-4) == 0.0


def test_monotone_in_gap_and_temperature():
    ps = [preference_probability(g, 0.5, 0.1) for g in (0.0, 0.2, 0.4, 0.5, 0.6, 0.8, 1.0)]
    assert all(a < b for a, b in zip(ps, ps[1:]))
    sharper = [preference_probability(0.7, 0.5, t) for t in (1.0, 0.3, 0.1, 0.03)]
    assert all(a < b for a, b in zip(sharper, sharper[1:]))


@pytest.mark.parametrize("temperature", [0.0, -0.1])
def test_temperature_must_be_positive(temperature):
    with pytest.raises(ValueError, match="temperature"):
        preference_probability(0.5, 0.4, temperature)


def test_soft_label_is_the_probability_and_draws_nothing():
    rng = random.Random(3)
    state = rng.getstate()
    assert label_pair(0.7, 0.4, 0.2, rng, soft=True) == preference_probability(0.7, 0.4, 0.2)
    assert rng.getstate() == state


@pytest.mark.parametrize("gold_i, gold_j", GOLD_PAIRS)
def test_hard_label_frequency_matches_probability(gold_i, gold_j):
    """Exact two-sided binomial test per pair at a 1e-3 false-alarm rate (6 tests: at most ~0.6% of
    seeds would fail a correct annotator; the seed is fixed, so the outcome is deterministic)."""
    temperature, n = 0.2, 5000
    p = preference_probability(gold_i, gold_j, temperature)
    rng = random.Random(1234)
    labels = [label_pair(gold_i, gold_j, temperature, rng, soft=False) for _ in range(n)]
    assert set(labels) <= {0.0, 1.0}
    assert binomtest(int(sum(labels)), n, p).pvalue > 1e-3


def test_hard_labels_detect_a_wrong_probability():
    """The binomial test above has power: labels drawn at p are rejected against p + 0.05."""
    p, n = preference_probability(0.7, 0.4, 0.2), 5000
    rng = random.Random(1234)
    ones = sum(label_pair(0.7, 0.4, 0.2, rng, soft=False) for _ in range(n))
    assert binomtest(int(ones), n, p + 0.05).pvalue < 1e-3


def test_hard_labels_deterministic_given_seed():
    def labels(seed):
        rng = random.Random(seed)
        return [label_pair(0.6, 0.5, 0.1, rng, soft=False) for _ in range(200)]

    assert labels(7) == labels(7)
    assert labels(7) != labels(8)
