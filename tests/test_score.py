"""stage=score: reward columns on every sample; a clear error without the reward model."""

from __future__ import annotations

import pytest
from datasets import load_from_disk
from fake_reward import FakeScorer, install_fake_reward

from rsft.store import read_meta
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


def test_scoring_killed_mid_way_resumes_at_its_first_unfinished_shard(make_cfg, monkeypatch):
    """9 completions in shards of 4: a kill in the second shard rescores only it and the third; the scores
    equal an uninterrupted run's."""
    import rsft.reward_service

    run_stage(make_cfg("stage=sample"))
    cfg = make_cfg("stage=score", "reward.score_shard_rows=4")
    install_fake_reward(monkeypatch, cfg)
    real, scored = rsft.reward_service.score_rows, []

    def counting(scorer, prompts, completions, *args, **kwargs):
        scored.append(len(completions))
        if len(scored) == kill_at:
            raise KeyboardInterrupt("killed")
        return real(scorer, prompts, completions, *args, **kwargs)

    monkeypatch.setattr(rsft.reward_service, "score_rows", counting)
    kill_at = 2
    with pytest.raises(KeyboardInterrupt):
        run_stage(cfg)
    kill_at = 0
    resumed = load_from_disk(str(run_stage(cfg).path))
    assert scored == [4, 4, 4, 1]  # shard 0 once, the killed shard 1 again, shard 2 once
    straight_cfg = make_cfg("stage=score", "overwrite=true")
    straight = load_from_disk(str(run_stage(straight_cfg).path))
    assert resumed["reward"] == straight["reward"]
