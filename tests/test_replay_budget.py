"""scripts/replay_budget.py: a schedule replayed on the exhaustive set keeps what stage=sample keeps with it."""

from __future__ import annotations

import importlib.util

import pytest
from datasets import load_from_disk

from rsft.models import load_policy, resolve_device
from rsft.run import run_stage
from rsft.sampling.budget import PruneSchedule
from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("replay_budget", REPO / "scripts" / "replay_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("prune,adaptive,overrides", [
    (PruneSchedule((2, 4), 0.5, False), None, ["sample.prune.at=[2,4]", "sample.prune.rank_finished=false"]),
    (PruneSchedule((3,), 0.75, True), (2, 3.0), ["sample.prune.at=[3]", "sample.prune.share=0.75",
                                                 "sample.adaptive_k.k0=2", "sample.adaptive_k.mean=3"]),
])
def test_replay_keeps_what_sampling_with_the_schedule_keeps(make_cfg, monkeypatch, tmp_path, prune, adaptive,
                                                            overrides):
    from fake_reward import FakeScorer, install_fake_reward

    replay = load_script()
    base = ["stage=sample", "data.limit=5", "sample.num_samples=4", "sample.max_new_tokens=8"]
    ref_cfg = make_cfg(*base, "run_name=ref")
    install_fake_reward(monkeypatch, ref_cfg)
    run_stage(ref_cfg)
    run = tmp_path / "runs" / "ref"
    exhaustive = replay.exhaustive_set(run, 0, 6, resolve_device("cpu"))
    own = load_from_disk(str(run / "round_00" / "samples"))
    first_four = exhaustive.filter(lambda k: k < 4, input_columns="sample_idx")
    assert first_four["completion_ids"] == own["completion_ids"]  # the run's own samples, completion for completion

    by_prompt = {}
    for row in exhaustive:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    prompts = [replay.Prompt(rows) for rows in by_prompt.values()]
    _, tokenizer, _ = load_policy(ref_cfg, None, resolve_device("cpu"))
    replay.score_all(prompts, FakeScorer(), FakeScorer(), tokenizer, [p.rows[0]["prompt"] for p in prompts],
                     replay.CHECKPOINTS + (2, 3))
    result, _ = replay.replay(prompts, 4, prune, adaptive)

    cfg = make_cfg(*base, "run_name=pruned", *overrides)
    install_fake_reward(monkeypatch, cfg)
    sampled = load_from_disk(str(run_stage(cfg).path))
    for p, (kept, _, tokens, _) in zip(prompts, result):
        rows = [r for r in sampled if r["prompt_id"] == p.rows[0]["prompt_id"]]
        assert sorted(r["sample_idx"] for r in rows if r["finish_reason"] != "pruned") == sorted(kept)
        assert len(rows) == len(kept) + sum(r["finish_reason"] == "pruned" for r in rows)
    assert any(r["finish_reason"] == "pruned" for r in sampled)
