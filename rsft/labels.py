"""stage=labels: labelled pairs of round r's samples, for the reward model that follows the policy (stage=refresh).

    python -m rsft.run stage=labels round=1 loop.refresh_reward=true                       # simulated (demo)
    python -m rsft.run stage=labels round=1 loop.refresh_reward=true refresh.pairs=labels  # your labels/round_01.jsonl

Writes round_XX/prefs/, a DatasetDict train / test like prefs/ (rsft.pairs):
- demo task: every pair among the first refresh.samples_per_prompt completions of each prompt of
  round_XX/samples/, labelled by stage=prefs's simulated annotators (prefs.tau, prefs.soft) and split
  by prompt (prefs.test_fraction); with refresh.choose=random, uncertain or posterior,
  refresh.label_budget pairs of the train prompts chosen among all their pairs, at random or where the
  reward model that scored round r - 1 is least sure (rsft.pairs.chosen_labels), the held-out pairs as
  before;
- your data: refresh.pairs, a folder holding your labelled pairs of each round's samples, one entry per
  round named round_XX (round_01.jsonl, .json, .parquet, or a datasets folder round_01/), read like
  reward.data.path (reward.data.format and label_column) and held out by row (reward.data.eval_fraction).
  (A folder, not a path template: Hydra's override grammar would need `{round}` quoted twice.)
stage=refresh runs this stage for every round up to its own before it retrains; stage=loop runs it
after each round's sampling with loop.refresh_reward.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from rsft.errors import ConfigError, MissingInput
from rsft.pairs import MODEL_CHOICES, labelled_pairs, round_pairs_path, user_labels
from rsft.models import resolve_device
from rsft.paths import RunPaths
from rsft.runner import Built, Job, Plan
from rsft.store import is_complete, load_dataset_artifact

log = logging.getLogger(__name__)


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """The round's samples and how they are labelled, or the user's file of the round (rsft.stages)."""
    round_idx = cfg.round
    if not paths.refresh_reward:
        raise ConfigError("stage=labels writes round_XX/prefs, which only loop.refresh_reward=true reads; add "
                          "loop.refresh_reward=true (to this command and to the loop's)")
    user_file = round_pairs_path(cfg, round_idx)
    if user_file is not None:
        return Plan(outputs=[paths.round_prefs(round_idx)], user_files=[user_file], given={"user_file": user_file})
    if not is_complete(paths.samples(round_idx)):
        raise MissingInput(f"labels of round {round_idx} are pairs of its samples at {paths.samples(round_idx)}, which "
                           f"are missing; run `python -m rsft.run stage=sample round={round_idx}` first")
    chooser = judged_by(cfg, paths, round_idx) if cfg.refresh.choose in MODEL_CHOICES else None
    return Plan(outputs=[paths.round_prefs(round_idx)], inputs=[paths.samples(round_idx), *([chooser] if chooser else [])],
                given={"samples": paths.samples(round_idx), "chooser": chooser})


def judged_by(cfg: DictConfig, paths: RunPaths, round_idx: int):
    """refresh.choose=uncertain or posterior: the reward model whose uncertainty picks the pairs, the newest
    before round r's refresh (the one that scored round r - 1; reward/ for round 0)."""
    model = paths.budget_reward(round_idx)
    if not is_complete(model):
        raise MissingInput(f"refresh.choose={cfg.refresh.choose} picks round {round_idx}'s pairs where the reward "
                           f"model at {model} is least sure, and it is missing; build it first (stage=loop builds "
                           f"every round's in order), or use refresh.choose=random")
    return model


def build(cfg: DictConfig, job: Job) -> Built:
    round_idx = cfg.round
    user_file = job.plan.given.get("user_file")
    if user_file is None:
        chooser = job.plan.given["chooser"]
        if chooser is not None:
            log.info("labels: round %d's pairs chosen where %s is least sure (%s)", round_idx, chooser,
                     f"{cfg.refresh.dropout_passes} dropout passes" if cfg.refresh.choose == "uncertain"
                     else "its head's posterior, one pick at a time")
        splits, counts = labelled_pairs(cfg, load_dataset_artifact(job.plan.given["samples"]), round_idx, chooser,
                                        resolve_device(cfg.device))
    else:
        splits, counts = user_labels(cfg, user_file)
    counts.update({"train_pairs": len(splits["train"]), "test_pairs": len(splits["test"])})
    meta = {"stage": "labels", "round": round_idx, "labels": "simulated" if user_file is None else user_file,
            "counts": counts}
    log.info("labels: %d labelled pairs of round %d (%d train / %d held out) for %s", counts["pairs"], round_idx,
             counts["train_pairs"], counts["test_pairs"], job.out)
    return Built([(meta, lambda tmp: splits.save_to_disk(str(tmp)))],
                 {f"refresh/labels_{k}": v for k, v in counts.items() if isinstance(v, (int, float))}, step=round_idx)
