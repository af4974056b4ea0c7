"""Knowing when more samples stop paying (issue 35): the best-of-N curve under the proxy, gold and the judge,
with intervals over prompts, and the over-optimisation point (rsft.metrics.enough_samples)."""

from __future__ import annotations

import random

import pytest
from datasets import Dataset

from rsft.metrics import best_of_n_curve, enough_samples, expected_best_of_n


def _scored(prompts: int, k: int, truth_of, seed: int = 0) -> tuple[Dataset, list[float]]:
    rng = random.Random(seed)
    rows, truth = [], []
    for p in range(prompts):
        for s in range(k):
            reward = rng.gauss(0.0, 1.0)
            rows.append({"prompt_id": f"p{p}", "sample_idx": s, "reward": reward})
            truth.append(truth_of(reward, rng))
    return Dataset.from_list(rows), truth


def test_a_truth_that_ignores_the_proxy_is_enough_at_one_sample_and_the_proxy_is_over_optimised():
    scored, truth = _scored(64, 8, lambda reward, rng: rng.random())  # the truth does not follow the proxy
    curve = best_of_n_curve(scored, gold=truth)
    enough = curve["enough"]
    assert enough["truth"] == "gold" and enough["k"] == 8
    assert enough["n"] <= 2 and enough["gap_to_best"]["low"] <= 0.0
    assert enough["proxy_gain_after"]["low"] > 0.5 and enough["overoptimised"]
    assert curve["expected_max_reward"] == sorted(curve["expected_max_reward"])
    low, high = curve["intervals"]["gold"]["low"], curve["intervals"]["gold"]["high"]
    assert all(lo <= m <= hi for lo, m, hi in zip(low, curve["expected_gold"], high))


def test_a_truth_that_is_the_proxy_keeps_paying_to_the_last_sample():
    scored, truth = _scored(64, 8, lambda reward, rng: reward)
    enough = best_of_n_curve(scored, gold=truth)["enough"]
    assert enough["n"] >= 6 and enough["best_n"] == 8 and not enough["overoptimised"]


def test_a_judge_stands_for_the_truth_before_gold_and_unscored_rows_rank_lowest():
    scored, truth = _scored(32, 4, lambda reward, rng: reward)
    judge = [None if i % 5 == 0 else -v for i, v in enumerate(truth)]  # the judge disagrees with gold
    curve = best_of_n_curve(scored, gold=truth, judge=judge)
    assert curve["enough"]["truth"] == "judge" and curve["expected_judge"] is not None
    assert curve["expected_judge"][0] > curve["expected_judge"][-1]  # the proxy's pick is worse by the judge
    assert curve["enough"]["n"] == 1 and curve["enough"]["overoptimised"]


def test_the_rule_on_a_hand_made_curve():
    # 3 prompts x N=1..4, truth rises to N=2 then stays: N=2 is enough once N=1 is decidedly below the best
    truth = [[0.0, 1.0, 1.0, 1.0], [0.1, 1.1, 1.1, 1.2], [0.0, 0.9, 1.0, 1.0]]
    proxy = [[0.0, 1.0, 2.0, 3.0]] * 3
    enough = enough_samples({"proxy": proxy, "gold": truth})
    assert enough["best_n"] == 4 and enough["n"] == 2 and enough["overoptimised"]
    assert enough["proxy_gain_after"]["mean"] == pytest.approx(2.0)
    # with the proxy alone the rule still answers, and says which curve it read
    assert enough_samples({"proxy": proxy})["truth"] == "proxy"
    assert expected_best_of_n([3.0, 1.0, 2.0], [30.0, 10.0, 20.0], 3) == 30.0
