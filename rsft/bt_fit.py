"""Training a Bradley-Terry reward model, the service below stage=reward, stage=refresh and online's refreshes: the
pairs it trains on (prefs/ or the user's), label smoothing, TRL's RewardTrainer, and its held-out metrics."""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset, concatenate_datasets
from omegaconf import DictConfig, OmegaConf

from reward.encoding import tokenize_preferences
from reward.formats import (
    LABEL_COLUMN,
    check_pairs,
    load_raw,
    partition,
    to_preference_pairs,
)
from reward.backbone import load_reward_backbone, load_trained_reward_model
from reward.trained import (
    RewardScorer,
    pairwise_accuracy,
    prompt_template,
    save_reward_model,
    score_pairs,
)
from reward.trainer import train_reward_model
from rsft import distributed
from rsft.errors import ConfigError, MissingInput
from rsft.models import backbone_source
from rsft.pairs import labelled_pairs
from rsft.paths import RunPaths
from rsft.store import atomic_artifact, is_complete, load_dataset_artifact, loading_artifact
from rsft.tracking import Tracker
from rsft.checkpoints import TrainingCheckpoints, rng_states, set_rng_states
from rsft.trl_common import training_arguments

log = logging.getLogger(__name__)


PAIR_HASHES_FILE = "pair_hashes.json"  # reward.formats.pair_hash of every training / held-out pair


def load_pairs(cfg: DictConfig) -> tuple[Dataset, Dataset, str]:
    """(train pairs, held-out pairs, where they came from), each row prompt/chosen/rejected/label_prob/..."""
    pairs_cfg = cfg.reward.data
    if pairs_cfg.path is None:
        source = RunPaths.from_config(cfg).prefs
        if not is_complete(source):
            raise MissingInput(f"stage=reward trains on this run's labelled pairs at {source}, which are missing; "
                                    f"run `python -m rsft.run stage=prefs run_name={cfg.run_name}` first, or train on "
                                    f"your own pairs with reward.data.path=<file, folder or hub name>")
        splits = load_dataset_artifact(source)
        train, test = splits["train"], splits["test"]
        check_pairs(train, f"{source} (train)")
        check_pairs(test, f"{source} (test)")
        train = train.select(range(min(len(train), pairs_cfg.limit))) if pairs_cfg.limit is not None else train
        return train, test, str(source)
    raw, source = load_raw(pairs_cfg)
    pairs = to_preference_pairs(raw, pairs_cfg.format, pairs_cfg.label_column, source)
    pairs = partition(pairs, pairs_cfg.parts, pairs_cfg.part, pairs_cfg.part_by, int(pairs_cfg.part_seed), source)
    pairs = pairs.shuffle(seed=cfg.reward.seed)
    if pairs_cfg.limit is not None:
        pairs = pairs.select(range(min(len(pairs), int(pairs_cfg.limit))))
    if pairs_cfg.eval_path is not None:
        raw_test, test_source = load_raw(OmegaConf.merge(pairs_cfg, {"path": pairs_cfg.eval_path}))
        return pairs, to_preference_pairs(raw_test, pairs_cfg.format, pairs_cfg.label_column, test_source), source
    if not 0.0 < float(pairs_cfg.eval_fraction) < 1.0 or len(pairs) < 2:
        raise ConfigError(f"reward.data.eval_fraction={pairs_cfg.eval_fraction} with {len(pairs)} pairs: expected a fraction "
                         f"in (0, 1) and >= 2 pairs, or set reward.data.eval_path")
    n_test = max(1, round(float(pairs_cfg.eval_fraction) * len(pairs)))
    return pairs.select(range(n_test, len(pairs))), pairs.select(range(n_test)), source


def gold_agreement(test: Dataset, r_chosen: list[float], r_rejected: list[float]) -> float | None:
    """How often the reward orders a pair as the gold oracle does (demo prefs only; gold ties left out)."""
    if "gold_chosen" not in test.column_names:
        return None
    agree = [(rc > rr) == (gc > gr) for rc, rr, gc, gr in
             zip(r_chosen, r_rejected, test["gold_chosen"], test["gold_rejected"]) if gc != gr]
    return sum(agree) / len(agree) if agree else None


def smoothed(pairs: Dataset, epsilon: float) -> Dataset:
    """The pairs with label smoothing: hp -> (1 - epsilon) hp + epsilon / 2 (a hard label 1 becomes
    1 - epsilon / 2). Real preference labels are noisy (crowd workers disagree), and a BT model trained on
    hard labels is pushed to ever larger margins on pairs it cannot get right."""
    if epsilon == 0.0:
        return pairs
    return pairs.map(lambda row: {LABEL_COLUMN: (1.0 - epsilon) * float(row[LABEL_COLUMN]) + epsilon / 2.0})


def pooled(parts: list[Dataset]) -> Dataset:
    """One dataset of pairs from several label sets: the columns all of them have (the demo's gold
    columns too when every part has them, for the gold-agreement metric)."""
    common = [c for c in parts[0].column_names if all(c in p.column_names for p in parts)]
    return concatenate_datasets([p.select_columns(common) for p in parts])


def refresh_training(cfg: DictConfig, start_from: Path | None) -> DictConfig:
    """The config a refresh trains the reward model with (stage=refresh's rounds, online's refreshes): continuing a
    model (refresh.init=continue) trains refresh.epochs where set, instead of reward.epochs."""
    if start_from is None or cfg.refresh.epochs is None:
        return cfg
    return OmegaConf.merge(cfg, {"reward": {"epochs": cfg.refresh.epochs}})


def train_and_measure(cfg: DictConfig, train: Dataset, test: Dataset, device, tracker: Tracker,
                      start_from: Path | None = None, checkpoints: TrainingCheckpoints | None = None):
    """Train the reward model on `train`; (model, tokenizer, normalisation stats, metrics). It starts from
    the backbone with a fresh head, or from the reward model saved at `start_from` (stage=refresh)."""
    reward_cfg = cfg.reward
    if start_from is None:
        source = backbone_source(reward_cfg.backbone, cfg.paths.cache_dir)
        model, tokenizer = load_reward_backbone(reward_cfg.backbone, source, seed=int(reward_cfg.seed))
    else:
        with loading_artifact(start_from):
            model, tokenizer = load_trained_reward_model(start_from)
    train_tokens, truncation = tokenize_preferences(smoothed(train, float(reward_cfg.get("label_smoothing", 0.0))),
                                                    tokenizer, int(reward_cfg.max_length))
    _, test_truncation = tokenize_preferences(test, tokenizer, int(reward_cfg.max_length))
    log.info("truncation at max_length=%d: train %s; held out %s", reward_cfg.max_length, truncation, test_truncation)
    shared = training_arguments(reward_cfg, "reward", device)
    started = time.perf_counter()
    if checkpoints is not None:  # a killed run resumes from its last checkpoint
        train_metrics = train_reward_model(model, tokenizer, train_tokens, reward_cfg, shared, str(checkpoints.folder),
                                           tracker, checkpoints)
    else:
        with tempfile.TemporaryDirectory(prefix="rsft-reward-trainer-") as scratch:
            train_metrics = train_reward_model(model, tokenizer, train_tokens, reward_cfg, shared, scratch, tracker)
    train_seconds = time.perf_counter() - started

    scorer = RewardScorer(model, tokenizer, int(reward_cfg.max_length), device=device)
    batch, progress = int(reward_cfg.score_batch_size), bool(reward_cfg.progress)
    r_chosen, r_rejected = score_pairs(scorer, test, batch, progress)
    heldout_accuracy, heldout_pairs = pairwise_accuracy(r_chosen, r_rejected, test["label_prob"])
    # Every unique training response is scored once: the normalisation statistics and the train accuracy.
    responses = sorted({(p, r) for p, c, x in zip(train["prompt"], train["chosen"], train["rejected"]) for r in (c, x)})
    rewards = scorer.score([p for p, _ in responses], [r for _, r in responses], batch, progress)
    reward_of = dict(zip(responses, rewards))
    train_accuracy, _ = pairwise_accuracy([reward_of[p, c] for p, c in zip(train["prompt"], train["chosen"])],
                                          [reward_of[p, x] for p, x in zip(train["prompt"], train["rejected"])],
                                          train["label_prob"])
    std = statistics.pstdev(rewards) if len(rewards) > 1 else 1.0
    stats = {"mean": statistics.fmean(rewards), "std": max(std, 1e-6), "responses": len(rewards),
             "max_length": int(reward_cfg.max_length), "backbone": str(reward_cfg.backbone.name_or_path),
             "prompt_template": prompt_template(reward_cfg.data.format if reward_cfg.data.path is not None else "preference")}
    metrics = {
        "heldout_accuracy": heldout_accuracy, "heldout_pairs": heldout_pairs,
        "train_accuracy": train_accuracy, "train_pairs": len(train),
        "gold_agreement": gold_agreement(test, r_chosen, r_rejected),
        "reward_mean": stats["mean"], "reward_std": stats["std"], "train_seconds": round(train_seconds, 2),
        "train_loss": train_metrics.get("train_loss"), "world_size": distributed.world_size(),
        "truncation": {"train": truncation, "heldout": test_truncation},
    }
    return model, tokenizer, stats, metrics


def retrained_on_labels(cfg: DictConfig, splits: list[tuple[Dataset, Dataset]], labels_named: str,
                        start_from: Path | None, device, tracker: Tracker | None = None,
                        checkpoints: TrainingCheckpoints | None = None):
    """The reward model retrained on the initial pairs and the new labels (`splits`: each label set's (train, test);
    `labels_named` says which in messages), continuing `start_from` or from the backbone (None), as stage=refresh
    retrains a round's and stage=online its refreshes. (model, tokenizer, stats, metrics, where the initial pairs
    came from, {"train_pairs", "test_pairs"})."""
    initial_train, initial_test, source = load_pairs(cfg)
    train = pooled([initial_train, *(train for train, _ in splits if len(train))])
    test = pooled([initial_test, *(test for _, test in splits if len(test))])
    check_pairs(train, f"the pooled labels of {labels_named} and {source} (train)")
    log.info("the reward model trains on %d pairs (%s and %s), %s", len(train), source, labels_named,
             "from scratch" if start_from is None else f"continuing {start_from}")
    model, tokenizer, stats, metrics = train_and_measure(refresh_training(cfg, start_from), train, test, device,
                                                         tracker, start_from, checkpoints)
    return model, tokenizer, stats, metrics, source, {"train_pairs": len(train), "test_pairs": len(test)}


def refreshed_reward(cfg: DictConfig, labels: list[dict], current: Path, target: Path, device, meta: dict):
    """retrained_on_labels, written to `target` as stage=refresh writes a reward model folder (a complete artifact:
    the main process writes, every process waits); (its metrics, the pair counts). Every process trains
    (data-parallel under torchrun, as stage=refresh). The RNG states are put back after: the reward trainer seeds
    every RNG itself, and the caller's own training goes on from where it was (stage=online)."""
    states = rng_states()
    splits = [(Dataset.from_list(s["train"]), Dataset.from_list(s["test"])) for s in labels]
    start_from = None if cfg.refresh.init == "scratch" else current
    model, tokenizer, stats, metrics, _, sizes = retrained_on_labels(cfg, splits, "every refresh's", start_from, device)
    set_rng_states(states)
    if distributed.is_main():
        with atomic_artifact(target, {**meta, "metrics": metrics, "backbone": cfg.reward.backbone.name_or_path}) as tmp:
            save_reward_model(model, tokenizer, tmp, stats)
    distributed.barrier()
    return metrics, sizes


@dataclass
class RefreshedModels:
    """Where stage=online's refreshed reward models live: `folder`/reward-NNN (NNN = refreshes done), in the stage's
    resume folder (rsft.store.ProgressFolder: keyed by the fingerprint, deleted once the artifact is written); the
    run's reward/ before the first refresh."""

    folder: Path
    initial: Path

    def model(self, refreshes: int) -> Path:
        return self.initial if refreshes == 0 else self.folder / f"reward-{refreshes:03d}"


def refresh_on_samples(cfg: DictConfig, samples: list[dict], labels: list[dict], models: RefreshedModels, device,
                       batch: int) -> tuple[dict, dict]:
    """stage=online's refresh before scoring mini-batch `batch`: `samples` (the rows sampled since the last refresh,
    prompt ids `<id>@<mini-batch>`) labelled as stage=labels labels a round's (rsft.pairs.labelled_pairs), and the
    reward model retrained on the earlier `labels` and these (refreshed_reward) into models.model(refreshes + 1).
    (the new label set {"train": rows, "test": rows}, the refresh's record)."""
    started, index = time.perf_counter(), len(labels)
    current = models.model(index)
    splits, counts = labelled_pairs(cfg, Dataset.from_list(samples), index, current, device)
    new = {"train": splits["train"].to_list(), "test": splits["test"].to_list()}
    log.info("online: refresh %d before scoring mini-batch %d: %d new labelled pairs", index + 1, batch, counts["pairs"])
    metrics, sizes = refreshed_reward(cfg, [*labels, new], current, models.model(index + 1), device,
                                      {"stage": "online", "refresh": index + 1, "batch": batch})
    log.info("online: refresh %d: held-out accuracy %.3f on %d pairs", index + 1, metrics["heldout_accuracy"],
             metrics["heldout_pairs"])
    record = {"refresh": index + 1, "batch": batch,
              "mini-batches": sorted({int(r["prompt_id"].rsplit("@", 1)[1]) for r in samples}),
              "labelled_pairs": counts["pairs"], **sizes,
              **{k: metrics[k] for k in ("heldout_accuracy", "train_accuracy", "gold_agreement") if k in metrics},
              "seconds": round(time.perf_counter() - started, 3)}
    return new, record
