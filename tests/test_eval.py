"""stage=eval: the best-of-N estimator against enumeration, the metrics, and the stage on tiny models."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
import torch
from datasets import load_from_disk
from fake_reward import install_fake_reward

from rsft.eval import best_of_n_kl_bound, distinct_n, expected_best_of_n, read_metrics, win_rate
from rsft.models import load_policy
from rsft.paths import RunPaths, atomic_artifact, read_meta
from rsft.run import run_stage


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_expected_best_of_n_equals_enumeration_over_subsets(n):
    rewards = [0.3, -1.0, 2.5, 0.3, 1.1]
    values = [10.0, 20.0, 30.0, 40.0, 50.0]  # e.g. gold scores of the same completions
    subsets = list(itertools.combinations(range(5), n))
    # the reward-best of a subset; ties go to the earlier index, as the estimator documents
    brute = statistics.fmean(values[max(s, key=lambda i: (rewards[i], -i))] for s in subsets)
    assert expected_best_of_n(rewards, values, n) == pytest.approx(brute)
    assert expected_best_of_n(rewards, rewards, n) == pytest.approx(statistics.fmean(max(rewards[i] for i in s)
                                                                                     for s in subsets))


def test_kl_bound_distinct_and_win_rate():
    assert best_of_n_kl_bound(1) == 0.0
    assert best_of_n_kl_bound(8) == pytest.approx(math.log(8) - 7 / 8)
    assert distinct_n(["a b a", "a b"], 1) == pytest.approx(2 / 5)
    assert distinct_n(["a b a", "a b"], 2) == pytest.approx(2 / 3)
    assert distinct_n(["", "x"], 2) is None
    assert win_rate({"p": [1.0, 3.0]}, {"p": [2.0, 1.0]}) == pytest.approx((0.5 + 0 + 1 + 1) / 4)


def save_tiny_as_round_policy(cfg, round_idx=0):
    """Round 0's 'trained' policy: the tiny policy with one weight nudged (no SFT needed here)."""
    model, tokenizer, _ = load_policy(cfg, None, torch.device("cpu"))
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    with atomic_artifact(RunPaths(cfg.paths.run_dir).policy(round_idx), {"stage": "sft"}) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def test_eval_round_builds_the_baseline_and_writes_metrics(make_cfg, monkeypatch):
    overrides = ("data.eval_limit=3", "eval.num_samples=3", "device=cpu")
    install_fake_reward(monkeypatch, make_cfg())
    run_stage(make_cfg("stage=sample", *overrides))
    run_stage(make_cfg("stage=score", *overrides))
    save_tiny_as_round_policy(make_cfg())
    out = run_stage(make_cfg("stage=eval", *overrides))
    paths = RunPaths(out.parent.parent)
    assert out == paths.eval(0)
    metrics = read_metrics(out)
    for key in ("reward_mean", "reward_normalised_mean", "gold_mean", "win_rate_vs_initial",
                "gold_win_rate_vs_initial", "distinct_1", "distinct_2", "mean_tokens", "mean_words"):
        assert isinstance(metrics[key], float), key
    assert 0 <= metrics["win_rate_vs_initial"] <= 1 and 0 <= metrics["gold_mean"] <= 1
    bon = metrics["best_of_n"]
    assert bon["n"] == [1, 2, 3] and bon["round"] == 0
    assert bon["expected_max_reward"] == sorted(bon["expected_max_reward"])  # more samples, higher max
    assert bon["kl_bound"][0] == 0.0 and len(bon["expected_gold"]) == 3

    samples = load_from_disk(str(out))
    assert len(samples) == 9 and {"reward", "reward_normalised", "gold"} <= set(samples.column_names)
    assert set(samples["policy"]) == {str(paths.policy(0))}
    assert all(pid.startswith("demo-test-") for pid in samples["prompt_id"])  # held-out prompts
    baseline = load_from_disk(str(paths.initial_eval))
    assert set(baseline["round"]) == {-1} and baseline["prompt_id"] == samples["prompt_id"]
    assert "win_rate_vs_initial" not in read_metrics(paths.initial_eval)
    assert read_meta(out)["metrics"]["gold_mean"] == metrics["gold_mean"]


def test_eval_of_a_round_without_its_policy_says_which_stage(make_cfg, monkeypatch):
    install_fake_reward(monkeypatch, make_cfg())
    with pytest.raises(FileNotFoundError, match="stage=sft round=2"):
        run_stage(make_cfg("stage=eval", "round=2"))
