"""stage=refresh: the reward model follows the policy: label round r's samples, retrain on every label so far.

    python -m rsft.run stage=refresh round=1 loop.refresh_reward=true          # the demo's simulated annotators
    python -m rsft.run stage=refresh round=1 loop.refresh_reward=true refresh.pairs=labels  # your labels/round_01.jsonl

Why: a reward model trained once, on the initial policy's samples, is asked to rank what later
policies write, a distribution it never saw, and the policy learns exactly where it is wrong (the
rounds of the demo stalled after round 0: gold +0.005, -0.040, +0.056 in round 1 across three reward
models). Llama 2 (Touvron et al. 2023, section 3.2.2) retrained its reward model every round on new
comparisons of the current policy's samples. With loop.refresh_reward, stage=loop runs this stage
after round r's sampling and round r is scored by the model it writes (RunPaths.scoring_reward).

1. Labels, round_XX/prefs/ (a DatasetDict train / test, like prefs/):
   - demo task: every pair among the first refresh.samples_per_prompt completions of each prompt of
     round_XX/samples/, labelled by stage=prefs's simulated annotators (prefs.tau, prefs.soft) and
     split by prompt (prefs.test_fraction): rsft.prefs.label_pairs and split_by_prompt;
   - your data: refresh.pairs, a folder holding your labelled pairs of each round's samples, one
     entry per round named round_XX (round_01.jsonl, .json, .parquet, or a datasets folder round_01/),
     read like reward.data.path (reward.data.format and label_column) and held out by row
     (reward.data.eval_fraction). (A folder, not a path template: Hydra's override grammar would
     need `{round}` quoted twice on a command line.)
2. Reward model, round_XX/reward/: rsft.reward.train_and_measure on the pooled train pairs (the
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

from datasets import Dataset, concatenate_datasets
from omegaconf import DictConfig, OmegaConf

from reward.formats import check_pairs
from reward.scoring import save_reward_model
from rsft import distributed
from rsft.labelling import round_pairs_path, simulated_labels, user_labels
from rsft.models import resolve_device
from rsft.paths import (
    RunPaths,
    atomic_artifact,
    fingerprint,
    finished,
    is_complete,
    load_dataset_artifact,
    omit_when_off,
    should_skip,
)
from rsft.reward import REWARD_OFF
from rsft.reward import wanted_fingerprint as initial_reward_fingerprint
from rsft.reward_training import load_pairs, train_and_measure
from rsft.tracking import Tracker, stage_tracker
from rsft.training import TrainingCheckpoints, check_trained

log = logging.getLogger(__name__)

INIT = ("scratch", "previous")




def labels_fingerprint(cfg: DictConfig, paths: RunPaths, round_idx: int) -> dict:
    """round_XX/prefs/'s fingerprint: the round's samples and how they were labelled (or the user's file)."""
    user_file = round_pairs_path(cfg, round_idx)
    if user_file is None:
        keys = ("round", "refresh.samples_per_prompt", "prefs.tau", "prefs.soft", "prefs.test_fraction", "prefs.seed")
        return fingerprint(cfg, keys, [paths.samples(round_idx)])
    keys = ("round", "refresh.pairs", "reward.data.format", "reward.data.label_column", "reward.data.eval_fraction",
            "reward.seed")
    return fingerprint(cfg, keys, [], [user_file])








def pooled(parts: list[Dataset]) -> Dataset:
    """One dataset of pairs from several label sets: the columns all of them have (the demo's gold
    columns too when every part has them, for the gold-agreement metric)."""
    common = [c for c in parts[0].column_names if all(c in p.column_names for p in parts)]
    return concatenate_datasets([p.select_columns(common) for p in parts])


def reward_fingerprint(cfg: DictConfig, paths: RunPaths, round_idx: int, start_from: Path | None) -> dict:
    """round_XX/reward/'s fingerprint: every reward setting, refresh.init / epochs, the initial labels
    (prefs/ or the user's pair files), every round's labels so far, and the model it continues."""
    initial = initial_reward_fingerprint(cfg, paths)
    inputs = ([paths.prefs] if cfg.reward.data.path is None else []) + paths.refresh_labels(round_idx)
    inputs += [start_from] if start_from is not None else []
    wanted = omit_when_off(fingerprint(cfg, ("round", "reward", "refresh.init", "refresh.epochs"), inputs), REWARD_OFF)
    wanted["user_files"] = initial["user_files"]
    return wanted


def start_model(cfg: DictConfig, paths: RunPaths, round_idx: int) -> Path | None:
    """The reward model a refresh continues (refresh.init=previous): the one that scored round r - 1."""
    if cfg.refresh.init == "scratch":
        return None
    previous = paths.scoring_reward(round_idx - 1) if round_idx > 0 else paths.reward
    if not is_complete(previous):
        raise FileNotFoundError(f"refresh.init=previous continues training the reward model at {previous}, which is "
                                f"missing; build it first (stage=loop builds every round's in order)")
    return previous


def write_labels(cfg: DictConfig, paths: RunPaths, round_idx: int, tracker: Tracker) -> Path:
    out = paths.round_prefs(round_idx)
    wanted = labels_fingerprint(cfg, paths, round_idx)
    if should_skip(out, cfg.overwrite, "refresh (labels)", wanted):
        return out
    user_file = round_pairs_path(cfg, round_idx)
    if user_file is None:
        if not is_complete(paths.samples(round_idx)):
            raise FileNotFoundError(f"refresh labels round {round_idx}'s samples at {paths.samples(round_idx)}, which "
                                    f"are missing; run `python -m rsft.run stage=sample round={round_idx}` first")
        splits, counts = simulated_labels(cfg, load_dataset_artifact(paths.samples(round_idx)), round_idx)
    else:
        splits, counts = user_labels(cfg, user_file)
    counts.update({"train_pairs": len(splits["train"]), "test_pairs": len(splits["test"])})
    meta = {"stage": "refresh", "round": round_idx, "labels": "simulated" if user_file is None else user_file,
            "counts": counts}
    if distributed.is_main():
        with atomic_artifact(out, meta, wanted) as tmp:
            splits.save_to_disk(str(tmp))
    distributed.barrier()
    log.info("refresh: %d labelled pairs of round %d (%d train / %d held out) in %s", counts["pairs"], round_idx,
             counts["train_pairs"], counts["test_pairs"], out)
    tracker.log({f"refresh/labels_{k}": v for k, v in counts.items() if isinstance(v, (int, float))}, step=round_idx)
    return out


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths, round_idx = RunPaths.from_config(cfg), int(cfg.round)
    if not paths.refresh_reward:
        raise ValueError("stage=refresh writes round_XX/reward, which only loop.refresh_reward=true reads; add "
                         "loop.refresh_reward=true (to this command and to the loop's)")
    out = paths.round_reward(round_idx)
    with stage_tracker(cfg, "refresh", tracker) as tracker:
        for r in range(round_idx + 1):  # every round's labels so far: built, or reused when made the same way
            write_labels(OmegaConf.merge(cfg, {"round": r}), paths, r, tracker)
        start_from = start_model(cfg, paths, round_idx)
        wanted = reward_fingerprint(cfg, paths, round_idx, start_from)
        if should_skip(out, cfg.overwrite, "refresh (reward)", wanted):
            return finished(out)
        initial_train, initial_test, source = load_pairs(cfg)
        rounds = [load_dataset_artifact(paths.round_prefs(r)) for r in range(round_idx + 1)]
        train = pooled([initial_train, *(split["train"] for split in rounds)])
        test = pooled([initial_test, *(split["test"] for split in rounds)])
        check_pairs(train, f"the pooled labels of rounds 0-{round_idx} and {source} (train)")
        train_cfg = cfg if start_from is None or cfg.refresh.epochs is None else OmegaConf.merge(
            cfg, {"reward": {"epochs": cfg.refresh.epochs}})
        log.info("refresh: round %d's reward model trains on %d pairs (%s and rounds 0-%d), %s", round_idx, len(train),
                 source, round_idx, "from scratch" if start_from is None else f"continuing {start_from}")
        checkpoints = TrainingCheckpoints(out, wanted)  # a killed run resumes from its last checkpoint
        model, tokenizer, stats, metrics = train_and_measure(train_cfg, train, test, resolve_device(cfg.device),
                                                             tracker, start_from, checkpoints)
        check_trained(model, metrics["train_loss"], cfg.reward, "reward")
        metrics.update({"round": round_idx, "initial_labels": source, "continued_from": str(start_from or "")})
        meta = {"stage": "refresh", "round": round_idx, "data": source, "metrics": metrics,
                "backbone": str(cfg.reward.backbone.name_or_path), "config": OmegaConf.to_container(cfg, resolve=True)}
        if distributed.is_main():  # every process trained the same (DDP) model; one saves it
            with atomic_artifact(out, meta, wanted) as tmp:
                save_reward_model(model, tokenizer, tmp, stats)
                (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
        checkpoints.remove()
        log.info("refresh: round %d's reward model: held-out accuracy %.3f on %d pairs (train %.3f), gold agreement "
                 "%s; saved to %s", round_idx, metrics["heldout_accuracy"], metrics["heldout_pairs"],
                 metrics["train_accuracy"], metrics["gold_agreement"], out)
        tracker.log({f"refresh/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step=round_idx)
    return finished(out)
