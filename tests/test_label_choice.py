"""Labels where the reward model is unsure (issue 35): refresh.choose picks which pairs of a round are labelled,
at random or by the reward model's dropout disagreement, at a label budget; the held-out pairs stay the same
whatever the choice, so that choices are compared on the same pairs; scripts/pairs_to_label.py exports the
chosen pairs for a person to label."""

from __future__ import annotations

import json
import logging
import random

import pytest
from datasets import load_from_disk

from reward.trained import load_scorer
from rsft.errors import ConfigError
from rsft.pairs import (
    choose_pairs,
    model_choice,
    pair_uncertainty,
    posterior_design,
)
from rsft.paths import RunPaths
from rsft.run import run_stage
from rsft.store import read_meta

REFRESH = ["stage=refresh", "round=0", "reward=tiny", "reward.epochs=1", "prefs.num_prompts=4", "prefs.num_samples=3",
           "prefs.max_new_tokens=8", "data.limit=6", "sample.num_samples=4", "select.drop_truncated=false",
           "device=cpu", "loop.refresh_reward=true"]


def test_choose_pairs_keeps_the_budget_in_order_at_random_or_the_most_uncertain():
    pairs = [(0, 1), (0, 2), (1, 2), (3, 4), (3, 5)]
    uncertainty = [0.1, 0.5, 0.2, 0.5, 0.0]
    assert choose_pairs(pairs, "uncertain", 3, random.Random(0), uncertainty) == [(0, 2), (1, 2), (3, 4)]
    picked = choose_pairs(pairs, "random", 2, random.Random(0))
    assert len(picked) == 2 and picked == sorted(picked, key=pairs.index)
    assert choose_pairs(pairs, "random", 9, random.Random(0)) == pairs  # a budget past the candidates takes them all


class FeatureScorer:
    """A stand-in reward model whose head reads set features: completion "k" is row k of `features`."""

    def __init__(self, features):
        import torch

        self.features = torch.tensor(features, dtype=torch.float32)
        self.model = torch.nn.Module()
        self.model.score = torch.nn.Linear(self.features.shape[1], 1)

    def as_trained(self, prompts):
        return prompts

    def score(self, prompts, completions, progress=True):
        return self.model.score(self.features[[int(c) for c in completions]]).squeeze(-1).tolist()


def test_the_posterior_design_counts_each_pick_before_the_next_so_a_near_copy_of_a_pick_waits():
    # completions' head features: 2 is a near copy of 1 (same direction from 0), 3 points elsewhere, shorter
    scorer = FeatureScorer([[0.0, 0.0], [1.0, 0.0], [1.01, 0.0], [0.0, 0.8]])
    samples = [{"prompt": "p", "completion": str(k)} for k in range(4)]
    pairs = [(0, 1), (0, 2), (0, 3)]
    chosen, prior = posterior_design(scorer, samples, pairs, 2)
    assert prior[1] > prior[0] > prior[2]  # by variance alone the two near copies come first
    assert chosen == [(0, 2), (0, 3)]  # once (0, 2) is counted, (0, 1) says little more
    assert posterior_design(scorer, samples, pairs, 5) == (pairs, prior)  # a budget past the candidates: all
    assert model_choice(scorer, samples, [], "posterior", 2, passes=2, seed=0) == ([], [])  # no candidates


def test_posterior_labels_the_budget_on_the_held_out_pairs_random_has(make_cfg):
    runs = {c: refreshed(make_cfg, f"run_name={c}", f"refresh.choose={c}", "refresh.label_budget=5", "stage=labels")
            for c in ("random", "posterior")}
    random_labels, posterior_labels = (_labels(runs[c]) for c in ("random", "posterior"))
    assert len(posterior_labels["train"]) == 5
    assert random_labels["test"].to_list() == posterior_labels["test"].to_list()
    counts = read_meta(runs["posterior"].round_prefs(0))["counts"]
    assert counts["choose"] == "posterior" and counts["uncertainty_chosen_mean"] > 0.0


def refreshed(make_cfg, *overrides: str) -> RunPaths:
    """A run with its reward model and round 0's samples, then `overrides`' stage (stage=refresh by default)."""
    for stage in ("stage=prefs", "stage=reward", "stage=sample"):
        run_stage(make_cfg(*REFRESH, *overrides, stage))
    cfg = make_cfg(*REFRESH, *overrides)
    run_stage(cfg)
    return RunPaths.from_config(cfg)


def _labels(paths: RunPaths):
    return load_from_disk(str(paths.round_prefs(0)))


def test_uncertain_and_random_label_the_budget_on_the_same_held_out_pairs_and_the_refresh_trains_on_them(make_cfg):
    runs = {}
    for choose in ("random", "uncertain"):
        runs[choose] = refreshed(make_cfg, f"run_name={choose}", f"refresh.choose={choose}", "refresh.label_budget=5")
    random_labels, uncertain_labels = (_labels(runs[c]) for c in ("random", "uncertain"))
    assert len(random_labels["train"]) == len(uncertain_labels["train"]) == 5
    assert random_labels["test"].to_list() == uncertain_labels["test"].to_list()  # the same held-out pairs
    counts = read_meta(runs["uncertain"].round_prefs(0))["counts"]
    assert counts["choose"] == "uncertain" and counts["label_budget"] == 5 and counts["candidate_pairs"] > 5
    assert counts["uncertainty_chosen_mean"] >= counts["uncertainty_all_mean"]
    # a pair chosen by both carries the same label: each pair draws its label from its own seed
    key = lambda row: (row["prompt_id"], *sorted((row["chosen_sample_idx"], row["rejected_sample_idx"])))  # noqa: E731
    by_pair = {key(r): (r["chosen_sample_idx"], r["label_prob"]) for r in random_labels["train"]}
    for row in uncertain_labels["train"]:
        if key(row) in by_pair:
            assert by_pair[key(row)] == (row["chosen_sample_idx"], row["label_prob"])
    # the refreshed model trained on the initial labels and the 5 chosen
    metrics = read_meta(runs["uncertain"].round_reward(0))["metrics"]
    initial = load_from_disk(str(runs["uncertain"].prefs))
    assert metrics["train_pairs"] == len(initial["train"]) + 5
    # with no budget, as many pairs as refresh.choose=first labels on the train prompts: every pair of distinct
    # completions among each one's first refresh.samples_per_prompt (4)
    paths = refreshed(make_cfg, "run_name=equal", "refresh.choose=random", "stage=labels")
    equal, samples = _labels(paths), load_from_disk(str(paths.samples(0)))
    held_out = set(equal["test"]["prompt_id"])
    firsts = {}
    for row in samples:
        if row["prompt_id"] not in held_out:
            firsts.setdefault(row["prompt_id"], []).append(row["completion"])
    expected = sum(a != b for c in firsts.values() for i, a in enumerate(c[:4]) for b in c[i + 1:4])
    assert len(equal["train"]) == expected > 0


def test_a_changed_choice_or_budget_is_a_changed_artifact_and_first_is_todays_labels(make_cfg):
    from rsft import stages
    from rsft.runner import Plan, fingerprint_of

    def settings(*overrides):
        return fingerprint_of(stages.get("labels"), make_cfg(*REFRESH, "stage=labels", *overrides), Plan(outputs=[]))

    base = settings()
    assert not any(key.startswith("refresh.choose") or key.startswith("refresh.label") for key in base["config"])
    assert base == settings("refresh.dropout_passes=4")  # used only by choose=uncertain
    assert base != settings("refresh.choose=random")
    assert settings("refresh.choose=random", "refresh.label_budget=3") != settings("refresh.choose=random",
                                                                                   "refresh.label_budget=4")
    assert settings("refresh.choose=uncertain") != settings("refresh.choose=uncertain", "refresh.dropout_passes=4")


def test_a_budget_without_a_choice_and_a_choice_over_your_own_labels_are_refused(make_cfg, tmp_path):
    from rsft.preflight import check_config

    with pytest.raises(ConfigError, match=r"refresh\.label_budget.*refresh\.choose=random, uncertain or posterior"):
        check_config(make_cfg(*REFRESH, "refresh.label_budget=5"))
    with pytest.raises(ConfigError, match=r"refresh\.choose.*refresh\.pairs.*pairs_to_label\.py"):
        check_config(make_cfg(*REFRESH, "refresh.choose=uncertain", f"refresh.pairs={tmp_path}"))
    with pytest.raises(ConfigError, match=r"refresh\.choose='often'"):
        check_config(make_cfg(*REFRESH, "refresh.choose=often"))


def test_dropout_disagreement_is_measured_and_a_model_without_dropout_falls_back_to_p_one_minus_p(make_cfg, caplog):
    paths = refreshed(make_cfg, "run_name=u", "refresh.choose=random", "refresh.label_budget=3", "stage=labels")
    samples = load_from_disk(str(paths.samples(0)))
    pairs = [(0, 1), (0, 2), (4, 5)]
    scorer = load_scorer(paths.reward)
    with caplog.at_level(logging.WARNING, logger="rsft.pairs"):
        plain = pair_uncertainty(scorer, samples, pairs, 3, seed=0)
    assert "no dropout" in caplog.text and all(0.0 <= u <= 0.25 for u in plain)
    for module in scorer.model.modules():  # the tiny llama has attention dropout 0: give it some
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    spread = pair_uncertainty(scorer, samples, pairs, 4, seed=0)
    assert max(spread) > 0.0 and spread == pair_uncertainty(scorer, samples, pairs, 4, seed=0)  # seeded
    assert not scorer.model.training  # dropout is off again


def test_pairs_to_label_exports_the_chosen_pairs_and_refresh_pairs_reads_the_answers(make_cfg, tmp_path):
    import subprocess
    import sys

    paths = refreshed(make_cfg, "run_name=x", "stage=sample")
    out = tmp_path / "labels" / "round_00.todo.jsonl"
    subprocess.run([sys.executable, "scripts/pairs_to_label.py", str(paths.root), "--round", "0", "--budget", "4",
                    "--out", str(out), "--passes", "2"], check=True, capture_output=True, timeout=300)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["label_prob"] is None and r["chosen"] != r["rejected"] for r in rows)
    for r in rows:  # a person's answers
        r["label_prob"] = 1.0
    (tmp_path / "labels" / "round_00.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out.unlink()
    user = make_cfg(*REFRESH, "stage=labels", "run_name=x", f"refresh.pairs={tmp_path / 'labels'}")
    run_stage(user)
    labels = load_from_disk(str(RunPaths.from_config(user).round_prefs(0)))
    assert len(labels["train"]) + len(labels["test"]) == 4
    bad = subprocess.run([sys.executable, "scripts/pairs_to_label.py", str(tmp_path / "nothing"), "--round", "0",
                          "--budget", "4", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "no such folder" in bad.stderr and "Traceback" not in bad.stderr
