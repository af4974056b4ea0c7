"""stage=reward: train the Bradley-Terry reward model, evaluate it on held-out pairs, save it.

    python -m rsft.run stage=reward                                   # on this run's prefs (stage=prefs)
    python -m rsft.run stage=reward reward.data.path=pairs.jsonl      # on your own pairs
    python -m rsft.run stage=reward reward.data.path=hh.jsonl.gz reward.data.format=hh_rlhf

1. Pairs: runs/<run_name>/prefs/ (train / test by prompt), or reward.data.path normalised by
   reward.formats, optionally one of reward.data.parts disjoint seeded parts of it (a proxy on part 0,
   an independent judge on part 1), held out: reward.data.eval_path, else eval_fraction of the
   shuffled rows.
2. Backbone with a fresh scalar head (reward.model); pairs tokenised by reward.encoding (prompts
   cut from the left when long, counted, never dropped); trained by reward.trainer (TRL's
   RewardTrainer with soft labels).
3. Held-out pairwise accuracy (and, for the demo task, agreement with the gold oracle's order);
   the reward mean / std over the unique training responses, stored with the model for
   normalisation (reward_stats.json); metrics.json; all logged to the Tracker.
4. runs/<run_name>/reward/: save_pretrained model + tokenizer, reward_stats.json (with the prompt
   frame the model was trained on, reward.scoring.prompt_template), metrics.json, pair_hashes.json
   (so that a judge trained on overlapping pairs is detected), meta.json, written atomically. reward.scoring.load_scorer reads it.
"""

from __future__ import annotations

import json
import logging

from omegaconf import DictConfig, OmegaConf

from reward.formats import (
    pair_files,
    pair_hashes,
)
from reward.scoring import (
    save_reward_model,
)
from rsft import distributed
from rsft.models import resolve_device
from rsft.paths import (
    RunPaths,
    atomic_artifact,
    fingerprint,
    finished,
    is_complete,
    omit_when_off,
    should_skip,
)
from rsft.reward_training import PAIR_HASHES_FILE, load_pairs, train_and_measure
from rsft.tracking import Tracker, stage_tracker
from rsft.training import TrainingCheckpoints, check_trained

log = logging.getLogger(__name__)

REWARD_OFF = {"reward.label_smoothing": 0.0}  # settings left out of fingerprints while off (rsft.paths.omit_when_off)










def wanted_fingerprint(cfg: DictConfig, paths: RunPaths) -> dict:
    """The reward model's fingerprint: every reward setting (not progress, logging_steps,
    score_batch_size; reward.label_smoothing only when on, so models trained before it existed still
    match), this run's prefs/ or the user's pair files by content."""
    inputs = [paths.prefs] if cfg.reward.data.path is None else []
    return omit_when_off(fingerprint(cfg, ("reward",), inputs, pair_files(cfg.reward.data)), REWARD_OFF)


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths.from_config(cfg)
    out = paths.reward
    if cfg.reward.data.path is None and not is_complete(paths.prefs):
        raise FileNotFoundError(f"stage=reward trains on this run's labelled pairs at {paths.prefs}, which are "
                                f"missing; run `python -m rsft.run stage=prefs run_name={cfg.run_name}` first, or "
                                f"train on your own pairs with reward.data.path=<file, folder or hub name>")
    wanted = wanted_fingerprint(cfg, paths)
    if should_skip(out, cfg.overwrite, "reward", wanted):
        return finished(out)
    train, test, source = load_pairs(cfg)
    device = resolve_device(cfg.device)
    with stage_tracker(cfg, "reward", tracker) as tracker:
        checkpoints = TrainingCheckpoints(out, wanted)
        model, tokenizer, stats, metrics = train_and_measure(cfg, train, test, device, tracker, checkpoints=checkpoints)
        check_trained(model, metrics["train_loss"], cfg.reward, "reward")
        meta = {"stage": "reward", "data": source, "backbone": str(cfg.reward.backbone.name_or_path),
                "metrics": metrics, "config": OmegaConf.to_container(cfg, resolve=True)}
        if distributed.is_main():  # every process trained the same (DDP) model; one saves it
            with atomic_artifact(out, meta, wanted) as tmp:
                save_reward_model(model, tokenizer, tmp, stats)
                (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
                (tmp / PAIR_HASHES_FILE).write_text(json.dumps({"train": pair_hashes(train),
                                                                "heldout": pair_hashes(test)}))
        checkpoints.remove()
        log.info("reward model: held-out accuracy %.3f on %d pairs (train %.3f), gold agreement %s; saved to %s",
                 metrics["heldout_accuracy"], metrics["heldout_pairs"], metrics["train_accuracy"],
                 metrics["gold_agreement"], out)
        flat = {k: v for k, v in metrics.items() if v is not None and k != "truncation"}
        flat.update({f"truncation_{k}": v for k, v in metrics["truncation"]["train"].items()})
        tracker.log({f"reward/{k}": v for k, v in flat.items()})
        tracker.summary({f"reward/{k}": v for k, v in flat.items()})
    return finished(out)
