"""stage=score: the reward model's score for every sampled completion.

    python -m rsft.run stage=score [round=0]

Reads runs/<run_name>/round_XX/samples/ and the reward model that scores round XX
(RunPaths.scoring_reward: the run's reward/, built by stage=prefs then stage=reward; with
loop.refresh_reward the round's own round_XX/reward/, built by stage=refresh); writes
round_XX/scored/: the samples (less the rows stage=sample pruned: prefixes, not completions) with
three more columns, `reward` (the model's raw output), `reward_normalised` ((raw - mean) / std with the mean and std the reward stage measured on its
training data, so thresholds do not depend on the scale a particular reward model happened to
learn) and `reward_model` (which one gave the score, relative to the run directory; also in
meta.json and, by its digest, in the fingerprint). The scorer sees the prompt as the user wrote it
(the `prompt` column) and the completion text, as the reward model was trained.

stage=eval scores with the run's reward/ (RunPaths.eval_reward) in every round, refreshed or not: one
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
    ShardStore,
    atomic_artifact,
    fingerprint,
    finished,
    is_complete,
    load_dataset_artifact,
    should_skip,
)
from rsft.sampling.budget import PRUNED
from rsft import scoring
from rsft.tracking import Tracker, stage_tracker

log = logging.getLogger(__name__)














def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths.from_config(cfg)
    out, source = paths.scored(cfg.round), paths.samples(cfg.round)
    if not is_complete(source):
        raise FileNotFoundError(f"score needs round {cfg.round}'s samples at {source}; run "
                                f"`python -m rsft.run stage=sample round={cfg.round}` first")
    scorer_path = scoring.reward_model(cfg, int(cfg.round))
    wanted = fingerprint(cfg, (), [source, scorer_path])  # the samples and the reward model, nothing else
    if should_skip(out, cfg.overwrite, "score", wanted):
        return finished(out)
    samples = load_dataset_artifact(source)
    pruned = sum(f == PRUNED for f in samples["finish_reason"])
    if pruned:  # stopped rows are prefixes, not completions: nothing downstream may keep them
        samples = samples.filter(lambda f: f != PRUNED, input_columns="finish_reason")
        log.info("score: %d rows pruned while sampling are left out (prefixes, not completions)", pruned)
    scorer = scoring.load_reward_scorer(cfg, resolve_device(cfg.device), scorer_path)
    log.info("score: round %s's samples scored by the reward model at %s", cfg.round, scorer_path)
    store = ShardStore(out, wanted)  # a killed scoring run resumes at its first unfinished shard of rows
    raw = scoring.score_in_shards(scorer, samples["prompt"], samples["completion"], int(cfg.reward.score_shard_rows), store)
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
            "counts": {"rows": len(scored), "prompts": len(by_prompt), **({"pruned_left_out": pruned} if pruned else {})},
            "stats": stats}
    if distributed.is_main():
        with atomic_artifact(out, meta, wanted) as tmp:
            scored.save_to_disk(str(tmp))
    store.remove()
    log.info("scored %d completions of %d prompts into %s", len(scored), len(by_prompt), out)
    with stage_tracker(cfg, "score", tracker) as tracker:
        tracker.log({f"score/{k}": v for k, v in stats.items()}, step=int(cfg.round))
    return finished(out)
