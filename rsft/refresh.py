"""stage=refresh: the reward model follows the policy: label round r's samples, retrain on every label so far.

    python -m rsft.run stage=refresh round=1 loop.refresh_reward=true          # the demo's simulated annotators
    python -m rsft.run stage=refresh round=1 loop.refresh_reward=true refresh.pairs=labels  # your labels/round_01.jsonl

Why: a reward model trained once, on the initial policy's samples, is asked to rank what later
policies write, a distribution it never saw, and the policy learns exactly where it is wrong (the
demo's rounds stalled after round 0 without it: docs/results.md). Llama 2 (Touvron et al. 2023, section 3.2.2) retrained its reward model every round on new
comparisons of the current policy's samples. With loop.refresh_reward, stage=loop runs this stage
after round r's sampling and round r is scored by the model it writes (RunPaths.scoring_reward).

1. Labels, round_XX/prefs/ of every round up to r: stage=labels (rsft.labels), run first for each round
   whose labels are missing (and reused when made the same way).
2. Reward model, round_XX/reward/: rsft.bt_fit.train_and_measure on the pooled train pairs (the
   initial labels, prefs/ or reward.data.path's, and rounds 0 .. r), held-out accuracy on all their
   held-out pairs. refresh.init: `scratch` (the backbone with a fresh head, reward.epochs) or
   `previous` (continue training the reward model that scored round r - 1, reward/ for round 0, for
   refresh.epochs epochs: cheaper, and it keeps what it learned).

Eval keeps scoring every policy with the run's reward/ (RunPaths.eval_reward), so that rounds scored by
different reward models are still compared on one scale.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from reward.formats import pair_files
from reward.trained import save_reward_model
from rsft.errors import ConfigError, MissingInput
from rsft.models import resolve_device
from rsft.paths import RunPaths
from rsft.bt_fit import retrained_on_labels
from rsft.runner import Built, Job, Plan
from rsft.store import is_complete, load_dataset_artifact
from rsft.trl_common import check_trained

log = logging.getLogger(__name__)


def start_model(cfg: DictConfig, paths: RunPaths, round_idx: int) -> Path | None:
    """The reward model a refresh continues (refresh.init=previous): the one that scored round r - 1."""
    if cfg.refresh.init == "scratch":
        return None
    previous = paths.scoring_reward(round_idx - 1) if round_idx > 0 else paths.reward
    if not is_complete(previous):
        raise MissingInput(f"refresh.init=previous continues training the reward model at {previous}, which is "
                                f"missing; build it first (stage=loop builds every round's in order)")
    return previous


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """Every reward setting, refresh.init / epochs, the initial labels (prefs/ or the user's pair files), every
    round's labels so far (stage=labels runs first for each), and the model it continues."""
    round_idx = cfg.round
    if not paths.refresh_reward:
        raise ConfigError("stage=refresh writes round_XX/reward, which only loop.refresh_reward=true reads; add "
                          "loop.refresh_reward=true (to this command and to the loop's)")
    start_from = start_model(cfg, paths, round_idx)
    inputs = ([paths.prefs] if cfg.reward.data.path is None else []) + paths.refresh_labels(round_idx)
    return Plan(outputs=[paths.round_reward(round_idx)], inputs=inputs + ([start_from] if start_from else []),
                user_files=pair_files(cfg.reward.data),
                first=[OmegaConf.merge(cfg, {"stage": "labels", "round": r}) for r in range(round_idx + 1)],
                given={"start_from": start_from})


def build(cfg: DictConfig, job: Job) -> Built:
    paths, round_idx = job.paths, cfg.round
    start_from = job.plan.given["start_from"]
    rounds = [load_dataset_artifact(paths.round_prefs(r)) for r in range(round_idx + 1)]
    if cfg.reward_source.kind == "combination":
        others = [name for name, c in cfg.reward_source.components.items() if str(c.get("source")) != "trained"]
        log.info("refresh: retrains the trained component of reward_source=combination; %s are used as they are",
                 ", ".join(others) or "no other component")
    model, tokenizer, stats, metrics, source, _ = retrained_on_labels(
        cfg, [(split["train"], split["test"]) for split in rounds], f"rounds 0-{round_idx}", start_from,
        resolve_device(cfg.device), job.tracker, job.checkpoints())
    check_trained(model, metrics["train_loss"], cfg.reward, "reward")
    metrics.update({"round": round_idx, "initial_labels": source, "continued_from": str(start_from or "")})
    meta = {"stage": "refresh", "round": round_idx, "data": source, "metrics": metrics,
            "backbone": cfg.reward.backbone.name_or_path}

    def write(tmp):
        save_reward_model(model, tokenizer, tmp, stats)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))

    log.info("refresh: round %d's reward model: held-out accuracy %.3f on %d pairs (train %.3f), gold agreement "
             "%s; for %s", round_idx, metrics["heldout_accuracy"], metrics["heldout_pairs"],
             metrics["train_accuracy"], metrics["gold_agreement"], job.out)
    return Built([(meta, write)], {f"refresh/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
                 step=round_idx)
