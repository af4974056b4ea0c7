"""stage=score: the reward model's score for every sampled completion.

    python -m rsft.run stage=score [round=0]

Reads runs/<run_name>/round_XX/samples/ and the reward model that scores round XX
(RunPaths.scoring_reward: the run's reward/, built by stage=prefs then stage=reward; with
loop.refresh_reward the round's own round_XX/reward/, built by stage=refresh); writes
round_XX/scored/: the samples with three more columns, `reward` (the model's raw output),
`reward_normalised` ((raw - mean) / std with the mean and std the reward stage measured on its
training data, so thresholds do not depend on the scale a particular reward model happened to
learn) and `reward_model` (which one gave the score, relative to the run directory; also in
meta.json and, by its digest, in the fingerprint). The scorer sees the prompt as the user wrote it
(the `prompt` column) and the completion text, as the reward model was trained.

stage=eval scores with the run's reward/ (RunPaths.judge) in every round, refreshed or not: one
fixed judge keeps the initial policy's and every round's numbers comparable.
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict

from omegaconf import DictConfig

from rsft import distributed
from rsft.models import resolve_device
from rsft.paths import (
    RunPaths,
    atomic_artifact,
    fingerprint,
    is_complete,
    load_dataset_artifact,
    reading,
    should_skip,
)
from rsft.tracking import Tracker, stage_tracker

log = logging.getLogger(__name__)


def reward_model(cfg: DictConfig, round_idx: int | None = None):
    """The reward model folder that scores round r (RunPaths.scoring_reward), or with round_idx=None
    the run's judge, reward/, which stage=eval uses for every policy (score and eval check it before
    any work); a clear error when missing."""
    paths = RunPaths.from_config(cfg)
    path = paths.judge if round_idx is None else paths.scoring_reward(round_idx)
    if not is_complete(path):
        if path != paths.reward:
            raise FileNotFoundError(
                f"no refreshed reward model at {path} (loop.refresh_reward=true): stage=refresh builds it from round "
                f"{round_idx}'s samples; run `python -m rsft.run stage=refresh round={round_idx} "
                f"loop.refresh_reward=true` first")
        raise FileNotFoundError(
            f"no trained reward model at {path}: stage=reward builds it from the labels stage=prefs writes; run "
            f"`python -m rsft.run stage=prefs run_name={cfg.run_name}` then `... stage=reward` (stage=loop does both)"
        )
    return path


def load_reward_scorer(cfg: DictConfig, device, round_idx: int | None = None):
    """The reward model reward_model(cfg, round_idx) names, loaded for scoring (stage=eval: the judge)."""
    path = reward_model(cfg, round_idx)
    from reward.scoring import load_scorer

    with reading(path):
        return load_scorer(str(path), device)


def score_rows(scorer, prompts, completions, batch_size: int = 32, progress: bool = True) -> list[float]:
    """The scorer's raw rewards; under a launcher each process scores every W-th batch and all get all."""
    shards = distributed.gather_each(scorer.score(prompts, completions, batch_size, progress,
                                                  shard=(distributed.rank(), distributed.world_size())))
    return [next(part[i] for part in shards if part[i] is not None) for i in range(len(shards[0]))]


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths.from_config(cfg)
    out, source = paths.scored(cfg.round), paths.samples(cfg.round)
    if not is_complete(source):
        raise FileNotFoundError(f"score needs round {cfg.round}'s samples at {source}; run "
                                f"`python -m rsft.run stage=sample round={cfg.round}` first")
    scorer_path = reward_model(cfg, int(cfg.round))
    made = fingerprint(cfg, (), [source, scorer_path])  # the samples and the reward model, nothing else
    if should_skip(out, cfg.overwrite, "score", made):
        return out
    samples = load_dataset_artifact(source)
    scorer = load_reward_scorer(cfg, resolve_device(cfg.device), int(cfg.round))
    log.info("score: round %s's samples scored by the reward model at %s", cfg.round, scorer_path)
    raw = score_rows(scorer, samples["prompt"], samples["completion"])
    if len(raw) != len(samples):
        raise RuntimeError(f"the scorer returned {len(raw)} rewards for {len(samples)} completions")
    scored = samples.add_column("reward", [float(r) for r in raw])
    scored = scored.add_column("reward_normalised", [float(r) for r in scorer.normalise(raw)])
    scored = scored.add_column("reward_model", [str(scorer_path.relative_to(paths.root))] * len(scored))

    by_prompt = defaultdict(list)
    for prompt_id, reward in zip(scored["prompt_id"], scored["reward"]):
        by_prompt[prompt_id].append(reward)
    stats = {
        "reward_mean": statistics.fmean(raw),
        "reward_std": statistics.pstdev(raw),
        "best_of_k_reward_mean": statistics.fmean(max(v) for v in by_prompt.values()),
        "within_prompt_spread_mean": statistics.fmean(max(v) - min(v) for v in by_prompt.values()),
    }
    meta = {"stage": "score", "round": int(cfg.round), "reward_model": str(scorer_path),
            "scorer_mean": float(scorer.mean), "scorer_std": float(scorer.std),
            "counts": {"rows": len(scored), "prompts": len(by_prompt)}, "stats": stats}
    if distributed.is_main():
        with atomic_artifact(out, meta, made) as tmp:
            scored.save_to_disk(str(tmp))
    distributed.barrier()
    log.info("scored %d completions of %d prompts into %s", len(scored), len(by_prompt), out)
    with stage_tracker(cfg, "score", tracker) as tracker:
        tracker.log({f"score/{k}": v for k, v in stats.items()}, step=int(cfg.round))
    return out
