"""stage=score: the reward model's score for every sampled completion.

    python -m rsft.run stage=score [round=0]

Reads runs/<run_name>/round_XX/samples/ and the trained reward model runs/<run_name>/reward/
(stage=prefs then stage=reward build it); writes round_XX/scored/: the samples with two more
columns, `reward` (the model's raw output) and `reward_normalised` ((raw - mean) / std with the
mean and std the reward stage measured on its training data, so thresholds do not depend on the
scale a particular reward model happened to learn). The scorer sees the prompt as the user wrote
it (the `prompt` column) and the completion text, as the reward model was trained.
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


def reward_model(cfg: DictConfig):
    """This run's trained reward model folder (score and eval check it before any work); a clear error when missing."""
    path = RunPaths.from_config(cfg).reward
    if not is_complete(path):
        raise FileNotFoundError(
            f"no trained reward model at {path}: stage=reward builds it from the labels stage=prefs writes; run "
            f"`python -m rsft.run stage=prefs run_name={cfg.run_name}` then `... stage=reward` (stage=loop does both)"
        )
    return path


def load_reward_scorer(cfg: DictConfig, device):
    """The trained reward model of this run, loaded for scoring (also used by stage=eval)."""
    path = reward_model(cfg)
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
    made = fingerprint(cfg, (), [source, reward_model(cfg)])  # the samples and the reward model, nothing else
    if should_skip(out, cfg.overwrite, "score", made):
        return out
    samples = load_dataset_artifact(source)
    scorer = load_reward_scorer(cfg, resolve_device(cfg.device))
    raw = score_rows(scorer, samples["prompt"], samples["completion"])
    if len(raw) != len(samples):
        raise RuntimeError(f"the scorer returned {len(raw)} rewards for {len(samples)} completions")
    scored = samples.add_column("reward", [float(r) for r in raw])
    scored = scored.add_column("reward_normalised", [float(r) for r in scorer.normalise(raw)])

    by_prompt = defaultdict(list)
    for prompt_id, reward in zip(scored["prompt_id"], scored["reward"]):
        by_prompt[prompt_id].append(reward)
    stats = {
        "reward_mean": statistics.fmean(raw),
        "reward_std": statistics.pstdev(raw),
        "best_of_k_reward_mean": statistics.fmean(max(v) for v in by_prompt.values()),
        "within_prompt_spread_mean": statistics.fmean(max(v) - min(v) for v in by_prompt.values()),
    }
    meta = {"stage": "score", "round": int(cfg.round), "reward_model": str(paths.reward),
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
