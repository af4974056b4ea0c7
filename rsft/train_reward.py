"""stage=reward: train the Bradley-Terry reward model, evaluate it on held-out pairs, save it.

    python -m rsft.run stage=reward                                   # on this run's prefs (stage=prefs)
    python -m rsft.run stage=reward reward.data.path=pairs.jsonl      # on your own pairs
    python -m rsft.run stage=reward reward.data.path=hh.jsonl.gz reward.data.format=hh_rlhf

1. Pairs: runs/<run_name>/prefs/ (train / test by prompt), or reward.data.path normalised by
   reward.formats, optionally one of reward.data.parts disjoint seeded parts of it (a proxy on part 0,
   an independent judge on part 1), held out: reward.data.eval_path, else eval_fraction of the
   shuffled rows.
2. Backbone with a fresh scalar head (reward.backbone); pairs tokenised by reward.encoding (prompts
   cut from the left when long, counted, never dropped); trained by reward.trainer (TRL's
   RewardTrainer with soft labels).
3. Held-out pairwise accuracy (and, for the demo task, agreement with the gold oracle's order);
   the reward mean / std over the unique training responses, stored with the model for
   normalisation (reward_stats.json); metrics.json; all logged to the Tracker.
4. runs/<run_name>/reward/: save_pretrained model + tokenizer, reward_stats.json (with the prompt
   frame the model was trained on, reward.trained.prompt_template), metrics.json, pair_hashes.json
   (so that a judge trained on overlapping pairs is detected), meta.json, written atomically. reward.trained.load_scorer reads it.
"""

from __future__ import annotations

import json
import logging

from omegaconf import DictConfig

from reward.formats import pair_files, pair_hashes
from reward.trained import save_reward_model
from rsft.errors import MissingInput
from rsft.models import resolve_device
from rsft.paths import RunPaths
from rsft.bt_fit import PAIR_HASHES_FILE, load_pairs, train_and_measure
from rsft.runner import Built, Job, Plan
from rsft.store import is_complete
from rsft.trl_common import check_trained

log = logging.getLogger(__name__)


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """Every reward setting (reward.label_smoothing only when on: rsft.stages.WHILE_OFF), this run's prefs/ or
    the user's pair files by content."""
    if cfg.reward.data.path is None and not is_complete(paths.prefs):
        raise MissingInput(f"stage=reward trains on this run's labelled pairs at {paths.prefs}, which are "
                           f"missing; run `python -m rsft.run stage=prefs run_name={cfg.run_name}` first, or "
                           f"train on your own pairs with reward.data.path=<file, folder or hub name>")
    return Plan(outputs=[paths.reward], inputs=[paths.prefs] if cfg.reward.data.path is None else [],
                user_files=pair_files(cfg.reward.data))


def build(cfg: DictConfig, job: Job) -> Built:
    train, test, source = load_pairs(cfg)
    model, tokenizer, stats, metrics = train_and_measure(cfg, train, test, resolve_device(cfg.device), job.tracker,
                                                         checkpoints=job.checkpoints())
    check_trained(model, metrics["train_loss"], cfg.reward, "reward")
    meta = {"stage": "reward", "data": source, "backbone": cfg.reward.backbone.name_or_path, "metrics": metrics}

    def write(tmp):
        save_reward_model(model, tokenizer, tmp, stats)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
        (tmp / PAIR_HASHES_FILE).write_text(json.dumps({"train": pair_hashes(train), "heldout": pair_hashes(test)}))

    log.info("reward model: held-out accuracy %.3f on %d pairs (train %.3f), gold agreement %s; for %s",
             metrics["heldout_accuracy"], metrics["heldout_pairs"], metrics["train_accuracy"],
             metrics["gold_agreement"], job.out)
    flat = {k: v for k, v in metrics.items() if v is not None and k != "truncation"}
    flat.update({f"truncation_{k}": v for k, v in metrics["truncation"]["train"].items()})
    job.tracker.summary({f"reward/{k}": v for k, v in flat.items()})
    return Built([(meta, write)], {f"reward/{k}": v for k, v in flat.items()})
