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

import json
import logging
import statistics
from collections import defaultdict
from pathlib import Path

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
    loading_artifact,
    read_meta,
    should_skip,
)
from rsft.sampling.budget import PRUNED
from rsft.tracking import Tracker, stage_tracker

log = logging.getLogger(__name__)


def reward_model(cfg: DictConfig, round_idx: int | None = None):
    """The reward model folder that scores round r (RunPaths.scoring_reward), or with round_idx=None
    the run's reward/, which stage=eval uses for every policy (score and eval check it before
    any work); a clear error when missing."""
    paths = RunPaths.from_config(cfg)
    path = paths.eval_reward if round_idx is None else paths.scoring_reward(round_idx)
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


def load_reward_scorer(cfg: DictConfig, device, path: Path | None = None):
    """A trained reward model loaded for scoring: `path` (the round's scorer, eval's judge), by default the
    run's reward/ (reward_model(cfg))."""
    path = reward_model(cfg) if path is None else path
    from reward.scoring import load_scorer

    with loading_artifact(path):
        return load_scorer(str(path), device)


def judge_model(cfg: DictConfig) -> Path | None:
    """eval.judge as a reward-model folder, or None when unset.

    eval.judge names a folder that stage=reward wrote (e.g. runs/<other>/reward) or a run name whose
    reward/ is the judge. Refused: a path or run that holds no complete reward model. Warned about
    (the judge then shares the proxy's taste and cannot stand in for an oracle): the proxy's own
    folder, a copy of its weights, or a judge trained on pairs the proxy was also trained on (both
    reward models record their pairs' hashes, rsft.reward.PAIR_HASHES_FILE).
    """
    name = cfg.eval.get("judge")
    if name is None:
        return None
    paths = RunPaths.from_config(cfg)
    folder = Path(str(name)).expanduser()
    if not folder.is_dir():
        from rsft.config import check_run_name
        from rsft.errors import ConfigError

        try:
            check_run_name(str(name), "eval.judge")
        except ConfigError:
            raise FileNotFoundError(f"eval.judge={name!r}: no such folder, and not a run name; expected a folder "
                                    f"written by stage=reward (e.g. runs/<run>/reward) or a run name") from None
        folder = paths.other_run(str(name)).reward
        if not folder.is_dir():
            raise FileNotFoundError(f"eval.judge={name!r}: neither a folder nor a run with a reward model "
                                    f"({folder} is missing); train it with `python -m rsft.run stage=reward "
                                    f"run_name={name} ...` first")
    if not is_complete(folder) or read_meta(folder).get("stage") != "reward":
        raise ValueError(f"eval.judge={name!r}: {folder} is not a complete reward model written by stage=reward "
                         f"(its meta.json is missing, incomplete or names another stage)")
    for warning in judge_warnings(folder, paths.reward):
        log.warning("eval.judge=%s: %s", name, warning)
    return folder


def judge_warnings(judge: Path, proxy: Path) -> list[str]:
    """Why a judge may not be independent of the proxy (empty when nothing is found)."""
    if not is_complete(proxy):
        return []
    if judge.resolve() == proxy.resolve():
        return ["the judge is the proxy reward model itself (the same folder): not an independent judge"]
    weights = [{k: v for k, v in read_meta(p).get("files", {}).items() if k.endswith(".safetensors")}
               for p in (judge, proxy)]
    if weights[0] and weights[0] == weights[1]:
        return ["the judge has the same weights as the proxy reward model (a copy): not an independent judge"]
    from rsft.reward import PAIR_HASHES_FILE

    hashes = [p / PAIR_HASHES_FILE for p in (judge, proxy)]
    missing = [str(h.parent) for h in hashes if not h.is_file()]
    if missing:
        return [f"overlap of training pairs not checked: {' and '.join(missing)} has no {PAIR_HASHES_FILE} "
                f"(trained before rsft recorded it)"]
    judge_pairs, proxy_pairs = (set(json.loads(h.read_text())["train"]) for h in hashes)
    shared = len(judge_pairs & proxy_pairs)
    if shared:
        return [f"{shared} of the judge's {len(judge_pairs)} training pairs are also training pairs of the proxy "
                f"reward model: the judge is not independent (train them on disjoint parts: "
                f"reward.data.parts=2, reward.data.part=0 / 1)"]
    return []


def score_rows(scorer, prompts, completions, batch_size: int = 32, progress: bool = True) -> list[float]:
    """The scorer's raw rewards of policy samples (prompts framed as the scorer was trained,
    RewardScorer.as_trained); under a launcher each process scores every W-th batch and all get all."""
    shards = distributed.gather_each(scorer.score(scorer.as_trained(prompts), completions, batch_size, progress,
                                                  shard=(distributed.rank(), distributed.world_size())))
    return [next(part[i] for part in shards if part[i] is not None) for i in range(len(shards[0]))]


def score_in_shards(scorer, prompts, completions, shard_rows: int, store: ShardStore) -> list[float]:
    """score_rows, `shard_rows` completions at a time (0: all at once): each finished shard's rewards are
    saved to `store` (rank 0 writes; every process holds them) and a rerun reuses the ones found there."""
    size = shard_rows if shard_rows > 0 else max(len(completions), 1)
    raw: list[float] = []
    for index, start in enumerate(range(0, len(completions), size)):
        found = store.load(index)
        if found is None:
            found = score_rows(scorer, prompts[start:start + size], completions[start:start + size])
            if distributed.is_main():
                store.save(index, found)
        raw += found
    return raw


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths.from_config(cfg)
    out, source = paths.scored(cfg.round), paths.samples(cfg.round)
    if not is_complete(source):
        raise FileNotFoundError(f"score needs round {cfg.round}'s samples at {source}; run "
                                f"`python -m rsft.run stage=sample round={cfg.round}` first")
    scorer_path = reward_model(cfg, int(cfg.round))
    wanted = fingerprint(cfg, (), [source, scorer_path])  # the samples and the reward model, nothing else
    if should_skip(out, cfg.overwrite, "score", wanted):
        return finished(out)
    samples = load_dataset_artifact(source)
    pruned = sum(f == PRUNED for f in samples["finish_reason"])
    if pruned:  # stopped rows are prefixes, not completions: nothing downstream may keep them
        samples = samples.filter(lambda f: f != PRUNED, input_columns="finish_reason")
        log.info("score: %d rows pruned while sampling are left out (prefixes, not completions)", pruned)
    scorer = load_reward_scorer(cfg, resolve_device(cfg.device), scorer_path)
    log.info("score: round %s's samples scored by the reward model at %s", cfg.round, scorer_path)
    store = ShardStore(out, wanted)  # a killed scoring run resumes at its first unfinished shard of rows
    raw = score_in_shards(scorer, samples["prompt"], samples["completion"], int(cfg.reward.score_shard_rows), store)
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
