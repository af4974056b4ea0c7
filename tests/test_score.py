"""stage=score: reward columns on every sample; a clear error without the reward model."""

from __future__ import annotations

import pytest
from datasets import load_from_disk
from fake_reward import FakeScorer, install_fake_reward

from rsft.paths import read_meta
from rsft.run import run_stage


def test_score_adds_raw_and_normalised_reward_to_every_sample(make_cfg, monkeypatch):
    run_stage(make_cfg("stage=sample"))
    cfg = make_cfg("stage=score")
    install_fake_reward(monkeypatch, cfg)
    out = run_stage(cfg).path
    scored = load_from_disk(str(out))
    samples = load_from_disk(str(out.parent / "samples"))
    assert len(scored) == len(samples) == 9
    assert set(samples.column_names) | {"reward", "reward_normalised", "reward_model"} == set(scored.column_names)
    assert set(scored["reward_model"]) == {"reward"}  # which reward model gave every score
    expected = FakeScorer().score(samples["prompt"], samples["completion"])
    assert scored["reward"] == pytest.approx(expected)
    assert scored["reward_normalised"] == pytest.approx([(r - 2.0) / 4.0 for r in expected])
    meta = read_meta(out)
    assert meta["counts"] == {"rows": 9, "prompts": 3} and meta["scorer_std"] == 4.0


def test_score_without_reward_model_names_the_stage_that_builds_it(make_cfg):
    run_stage(make_cfg("stage=sample"))
    with pytest.raises(FileNotFoundError, match="stage=reward"):
        run_stage(make_cfg("stage=score"))


def test_score_without_samples_names_the_sample_stage(make_cfg, monkeypatch):
    cfg = make_cfg("stage=score", "round=1")
    install_fake_reward(monkeypatch, cfg)
    with pytest.raises(FileNotFoundError, match="stage=sample round=1"):
        run_stage(cfg)
