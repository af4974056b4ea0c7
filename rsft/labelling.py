"""Labelling pairs of completions, the service below stage=prefs and stage=refresh: the demo's simulated annotators (from the gold oracle), a split by prompt, and the user's own labels of a round (refresh.pairs)."""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from itertools import combinations
from pathlib import Path

from datasets import Dataset, DatasetDict
from omegaconf import DictConfig, OmegaConf

from reward.annotators import label_pair
from reward.formats import load_raw, to_preference_pairs
from reward.gold import gold_score
from rsft.errors import InputError, MissingInput
from rsft.generation import round_seed
from rsft.sampling.budget import PRUNED

log = logging.getLogger(__name__)


def label_pairs(samples: Dataset, golds: list[float], tau: float, soft: bool, rng: random.Random):
    """Every within-prompt pair of distinct completions, labelled; returns (rows, identical pairs skipped)."""
    by_prompt = defaultdict(list)
    for row, prompt_id in enumerate(samples["prompt_id"]):
        by_prompt[prompt_id].append(row)
    rows, identical = [], 0
    for prompt_id, members in by_prompt.items():
        for i, j in combinations(members, 2):
            a, b = samples[i], samples[j]
            if a["completion"] == b["completion"]:
                identical += 1
                continue
            p_i = label_pair(golds[i], golds[j], tau, rng, soft)  # P(i beats j), or its 0/1 draw
            (win, lose, g_win, g_lose, p) = (a, b, golds[i], golds[j], p_i) if p_i >= 0.5 else \
                (b, a, golds[j], golds[i], 1.0 - p_i)
            rows.append({"prompt_id": prompt_id, "prompt": a["prompt"], "chosen": win["completion"],
                         "rejected": lose["completion"], "label_prob": float(p), "gold_chosen": g_win,
                         "gold_rejected": g_lose, "chosen_sample_idx": win["sample_idx"],
                         "rejected_sample_idx": lose["sample_idx"], "chosen_finish_reason": win["finish_reason"],
                         "rejected_finish_reason": lose["finish_reason"]})
    return rows, identical


def split_by_prompt(rows: list[dict], test_fraction: float, rng: random.Random) -> DatasetDict:
    prompt_ids = sorted({r["prompt_id"] for r in rows})
    if len(prompt_ids) < 2:
        raise InputError(f"prefs: pairs from {len(prompt_ids)} prompt(s); a train/test split by prompt needs >= 2 "
                         f"(raise prefs.num_prompts, or prefs.num_samples so prompts yield distinct completions)")
    rng.shuffle(prompt_ids)
    n_test = min(max(1, round(test_fraction * len(prompt_ids))), len(prompt_ids) - 1)
    test_ids = set(prompt_ids[:n_test])
    return DatasetDict({"train": Dataset.from_list([r for r in rows if r["prompt_id"] not in test_ids]),
                        "test": Dataset.from_list([r for r in rows if r["prompt_id"] in test_ids])})


def round_pairs_path(cfg: DictConfig, round_idx: int) -> str | None:
    """The user's labelled pairs of round r (refresh.pairs/round_XX*), or None (the demo's simulated labels)."""
    folder = cfg.refresh.get("pairs")
    if folder is None:
        return None
    name = f"round_{round_idx:02d}"
    expected = f"{name}.jsonl, .json or .parquet, or a datasets folder {name}/, of pairs of round {round_idx}'s samples"
    root = Path(str(folder)).expanduser()
    if not root.is_dir():
        raise MissingInput(f"refresh.pairs={folder!r}: no such folder; expected a folder holding {expected}")
    found = sorted(p for p in root.iterdir() if p.name == name or p.name.startswith(f"{name}."))
    if len(found) != 1:
        raise MissingInput(f"refresh.pairs={folder!r}: {'no' if not found else len(found)} labelled pairs of "
                                f"round {round_idx} ({', '.join(p.name for p in found) or 'nothing named ' + name}); "
                                f"expected one entry: {expected}")
    return str(found[0])


def simulated_labels(cfg: DictConfig, samples: Dataset, round_idx: int) -> tuple[DatasetDict, dict]:
    """Pairs among the first refresh.samples_per_prompt completions per prompt (rows stopped by pruning are
    prefixes, not completions, and are passed over), labelled by the demo's annotators."""
    per_prompt = int(cfg.refresh.samples_per_prompt)
    taken: dict[str, int] = {}
    keep = []  # rows are in prompt and sample order
    for i, (prompt_id, finish_reason) in enumerate(zip(samples["prompt_id"], samples["finish_reason"])):
        if finish_reason != PRUNED and taken.get(prompt_id, 0) < per_prompt:
            taken[prompt_id] = taken.get(prompt_id, 0) + 1
            keep.append(i)
    subset = samples.select(keep)
    golds = [gold_score(t, c, f) for t, c, f in zip(subset["task"], subset["completion"], subset["finish_reason"])]
    rng = random.Random(round_seed(int(cfg.prefs.seed), round_idx))
    rows, identical = label_pairs(subset, golds, float(cfg.prefs.tau), bool(cfg.prefs.soft), rng)
    splits = split_by_prompt(rows, float(cfg.prefs.test_fraction), rng)
    counts = {"completions": len(subset), "pairs": len(rows), "identical_pairs_skipped": identical,
              "label_against_gold": sum(r["gold_chosen"] < r["gold_rejected"] for r in rows)}
    return splits, counts


def user_labels(cfg: DictConfig, path: str) -> tuple[DatasetDict, dict]:
    """The user's labelled pairs of the round, normalised by reward.formats, a held-out share by row."""
    pairs_cfg = cfg.reward.data
    raw, source = load_raw(OmegaConf.merge(pairs_cfg, {"path": path}), setting="refresh.pairs")
    pairs = to_preference_pairs(raw, pairs_cfg.format, pairs_cfg.label_column, source)
    pairs = pairs.shuffle(seed=int(cfg.reward.seed))
    if len(pairs) < 2:
        raise InputError(f"{source}: {len(pairs)} pair(s); a held-out share needs at least 2")
    n_test = min(max(1, round(float(pairs_cfg.eval_fraction) * len(pairs))), len(pairs) - 1)
    splits = DatasetDict({"train": pairs.select(range(n_test, len(pairs))), "test": pairs.select(range(n_test))})
    return splits, {"pairs": len(pairs), "source": source}


def check_round_labels(cfg: DictConfig, rounds: range) -> None:
    """Find and read every round's file of refresh.pairs that a command will train on, before it does any
    work (rsft.checks calls it): a missing round_02.jsonl must not surface after two rounds of sampling."""
    for round_idx in rounds:
        path = round_pairs_path(cfg, round_idx)
        if path is not None:
            user_labels(cfg, path)
