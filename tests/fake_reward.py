"""A stand-in reward model for stage tests: a deterministic function of the completion text.

Loading the real Bradley-Terry model is tested in tests/reward/ and in test_loop's end-to-end
test; these tests check what the pipeline does with rewards, so they patch
rsft.reward_service.trained_reward (stage=score, stage=eval and pruning all open a trained model through it).
"""

from __future__ import annotations

from pathlib import Path

from rsft.paths import RunPaths
from reward.sources import RewardSource
from rsft.store import atomic_artifact


class FakeScorer(RewardSource):
    kind = "fake"
    mean, std = 2.0, 4.0

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        assert len(prompts) == len(completions) and shard == (0, 1)
        return [float(len(set(c))) + 0.01 * len(c) for c in completions]

    def identity(self):
        return {"kind": self.kind}


class FakeJudge(FakeScorer):
    """A second opinion that likes long completions (eval.judge in stage tests)."""

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        return [float(len(c.split())) for c in completions]


def install_fake_reward(monkeypatch, cfg) -> None:
    """A complete (empty) reward artifact, so the loop skips prefs/reward, and the fake scorer."""
    import rsft.reward_service

    with atomic_artifact(RunPaths(cfg.paths.run_dir).reward, {"stage": "reward", "fake": True}):
        pass
    def load(path, device):  # a folder outside this run is eval's judge
        judge = Path(cfg.paths.run_dir).resolve() not in Path(path).resolve().parents
        return FakeJudge() if judge else FakeScorer()

    monkeypatch.setattr(rsft.reward_service, "trained_reward", load)
