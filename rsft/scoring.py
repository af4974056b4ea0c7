"""Scoring with a reward model, the service below score, eval, sample (pruning and adaptive K) and the scripts: which reward model folder a round reads, loading it, the judge (eval.judge) and its independence, and scoring rows in resumable shards."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig

from rsft import distributed
from rsft.errors import MissingInput
from rsft.paths import RunPaths
from rsft.store import ShardStore, is_complete, loading_artifact, read_meta

log = logging.getLogger(__name__)


def reward_model(cfg: DictConfig, round_idx: int | None = None):
    """The reward model folder that scores round r (RunPaths.scoring_reward), or with round_idx=None
    the run's reward/, which stage=eval uses for every policy (score and eval check it before
    any work); a clear error when missing."""
    paths = RunPaths.from_config(cfg)
    path = paths.eval_reward if round_idx is None else paths.scoring_reward(round_idx)
    if not is_complete(path):
        if path != paths.reward:
            raise MissingInput(
                f"no refreshed reward model at {path} (loop.refresh_reward=true): stage=refresh builds it from round "
                f"{round_idx}'s samples; run `python -m rsft.run stage=refresh round={round_idx} "
                f"loop.refresh_reward=true` first")
        raise MissingInput(
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
            raise MissingInput(f"eval.judge={name!r}: no such folder, and not a run name; expected a folder "
                                    f"written by stage=reward (e.g. runs/<run>/reward) or a run name") from None
        folder = paths.other_run(str(name)).reward
        if not folder.is_dir():
            raise MissingInput(f"eval.judge={name!r}: neither a folder nor a run with a reward model "
                                    f"({folder} is missing); train it with `python -m rsft.run stage=reward "
                                    f"run_name={name} ...` first")
    if not is_complete(folder) or read_meta(folder).get("stage") != "reward":
        raise ConfigError(f"eval.judge={name!r}: {folder} is not a complete reward model written by stage=reward "
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
    from rsft.reward_training import PAIR_HASHES_FILE

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
