"""stage=loop end to end on tiny models: prefs + reward, two rounds, a crash in round 1 and a resume
that ends with the same artifacts as a run that never crashed; wandb offline files; plots; summary."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from datasets import load_from_disk

import rsft.sft
from rsft.metrics import read_metrics
from rsft.models import load_saved_causal_lm
from rsft.paths import RunPaths
from rsft.store import is_complete
from rsft.run import run_stage

# wandb is a dependency; a machine that lacks it (the GPU check's, which carries no wandb wheel) runs the loop
# with logger=none and checks everything but the wandb records
HAS_WANDB = importlib.util.find_spec("wandb") is not None
LOOP = ["stage=loop", "loop.rounds=2", "reward=tiny", "prefs.num_prompts=4", "prefs.num_samples=3",
        "prefs.max_new_tokens=8", "data.eval_limit=2", "eval.num_samples=2", "sft.learning_rate=1e-3",
        "select.drop_truncated=false", "device=cpu"]  # the random tiny policy rarely stops within 8 tokens


def test_loop_killed_mid_round_resumes_to_the_same_artifacts(make_cfg, monkeypatch):
    logger = ["logger=wandb", "logger.mode=offline"] if HAS_WANDB else ["logger=none"]
    straight = RunPaths(run_stage(make_cfg(*LOOP, "run_name=straight", *logger)).path)

    real_sft = rsft.sft.build

    def crash_in_round_1(cfg, job):
        if cfg.round == 1:
            raise RuntimeError("killed")
        return real_sft(cfg, job)

    monkeypatch.setattr(rsft.sft, "build", crash_in_round_1)
    with pytest.raises(RuntimeError, match="killed"):
        run_stage(make_cfg(*LOOP, "run_name=crashed"))
    crashed = RunPaths(straight.root.parent / "crashed")
    assert is_complete(crashed.eval(0)) and is_complete(crashed.selected(1)) and not crashed.policy(1).exists()
    stamp = (crashed.samples(1) / "meta.json").stat().st_mtime
    monkeypatch.setattr(rsft.sft, "build", real_sft)
    run_stage(make_cfg(*LOOP, "run_name=crashed"))
    assert (crashed.samples(1) / "meta.json").stat().st_mtime == stamp  # resumed, not redone

    for r in (0, 1):
        for artifact in ("samples", "scored", "selected", "pairs", "eval"):
            a = load_from_disk(str(getattr(straight, artifact)(r)))
            b = load_from_disk(str(getattr(crashed, artifact)(r)))
            columns = [c for c in a.column_names if c != "policy"]  # the policy path names the run
            assert a.select_columns(columns).to_list() == b.select_columns(columns).to_list(), (r, artifact)
        policy_a, _ = load_saved_causal_lm(straight.policy(r), torch.device("cpu"))
        policy_b, _ = load_saved_causal_lm(crashed.policy(r), torch.device("cpu"))
        for (name, pa), (_, pb) in zip(policy_a.named_parameters(), policy_b.named_parameters()):
            assert torch.equal(pa, pb), (r, name)
    without_timing = [{k: v for k, v in read_metrics(run.eval(1)).items() if k != "sampling"}
                      for run in (straight, crashed)]
    assert without_timing[0] == without_timing[1]

    # round 1 sampled from round 0's policy, and round 0's eval judged it
    assert set(load_from_disk(str(straight.samples(1)))["policy"]) == {str(straight.policy(0))}
    assert set(load_from_disk(str(straight.eval(0)))["policy"]) == {str(straight.policy(0))}

    # report: plots, summary.md with a row per policy
    assert (straight.plots / "best_of_n.png").is_file() and (straight.plots / "gold_vs_proxy.png").is_file()
    summary = straight.summary.read_text()
    assert "| initial |" in summary and "| round 1 |" in summary and "gold [95% CI]" in summary
    assert "gold vs previous" in summary and (straight.plots / "diversity.png").is_file()

    if not HAS_WANDB:
        return
    # one offline wandb run for the loop, holding the per-round metrics, the summary and the plots
    runs = list(straight.wandb.glob("offline-run-*"))
    assert len(runs) == 1
    records = next(runs[0].glob("run-*.wandb")).read_bytes()  # wandb's offline record log (protobuf)
    for key in ("round/score/reward_mean", "round/select/selected", "round/eval/gold_mean", "eval_initial/gold_mean",
                "sft/train_loss", "final/eval/gold_mean", "plots/best_of_n", "examples"):
        assert key.encode() in records, key
    assert list((runs[0] / "files" / "media" / "images").glob("**/*.png"))


def test_reward_from_copies_the_judge_and_baseline_of_another_run(tmp_path):
    from rsft.loop import share_judge
    from rsft.store import atomic_artifact, read_meta

    source, target = RunPaths(tmp_path / "best"), RunPaths(tmp_path / "random")
    for name in ("prefs", "reward", "initial_eval"):
        with atomic_artifact(getattr(source, name), {"stage": name}) as tmp:
            (tmp / "weights.bin").write_bytes(name.encode())
    target.reward.mkdir(parents=True)  # an incomplete leftover is replaced
    share_judge(source, target)
    for name in ("prefs", "reward", "initial_eval"):
        assert read_meta(getattr(target, name))["stage"] == name
        assert (getattr(target, name) / "weights.bin").read_bytes() == name.encode()
    with pytest.raises(FileNotFoundError, match="loop.reward_from"):
        share_judge(RunPaths(tmp_path / "nothing"), RunPaths(tmp_path / "other"))


def test_loop_refreshes_the_distilled_draft_after_each_rounds_sft(make_cfg):
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "run_name=drafted", "draft=distilled", "loop.eval=false", "distill.num_layers=1",
                   "distill.epochs=1", "distill.eval_prompts=2", "distill.eval_samples=2")
    paths = RunPaths(run_stage(cfg).path)
    assert read_meta(paths.samples(0))["config"]["draft"]["kind"] == "ngram"  # no distilled draft before round 0
    assert read_meta(paths.round_draft(0))["metrics"]["teacher"] == str(paths.policy(0))
    assert read_meta(paths.samples(1))["sampling"]["num_drafted"] > 0  # round 1 drafted with round 0's draft
    assert read_meta(paths.samples(1))["config"]["draft"]["kind"] == "distilled"
    assert not is_complete(paths.round_draft(1))  # no round 2 to draft for


def test_reward_from_a_run_whose_reward_model_was_trained_on_user_pairs(tmp_path):
    from rsft.loop import share_judge
    from rsft.store import atomic_artifact, is_complete

    source, target = RunPaths(tmp_path / "user-pairs"), RunPaths(tmp_path / "baseline")
    with atomic_artifact(source.reward, {"stage": "reward"}) as tmp:  # no prefs/, no eval_initial/
        (tmp / "weights.bin").write_bytes(b"w")
    share_judge(source, target)
    assert is_complete(target.reward) and not target.prefs.exists() and not target.initial_eval.exists()


def test_loop_refreshes_the_feature_draft_after_each_rounds_sft(make_cfg):
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "run_name=featured", "draft=feature", "loop.eval=false", "draft.train.epochs=2",
                   "draft.train.eval_prompts=2", "draft.train.eval_samples=2")
    paths = RunPaths(run_stage(cfg).path)
    assert read_meta(paths.samples(0))["config"]["draft"]["kind"] == "ngram"  # no feature draft before round 0
    draft_meta = read_meta(paths.round_draft(0))
    assert draft_meta["kind"] == "feature" and draft_meta["metrics"]["teacher"] == str(paths.policy(0))
    assert read_meta(paths.samples(1))["config"]["draft"]["kind"] == "feature"
    assert read_meta(paths.samples(1))["sampling"]["num_drafted"] > 0  # round 1 drafted with round 0's draft
    assert "round_00/draft" in read_meta(paths.samples(1))["fingerprint"]["inputs"]
    assert not is_complete(paths.round_draft(1))  # no round 2 to draft for
