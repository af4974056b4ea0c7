"""Labelling pairs of completions, the service below stage=prefs and stage=refresh: the demo's simulated annotators (from the gold oracle), a split by prompt, and the user's own labels of a round (refresh.pairs)."""

from __future__ import annotations

import hashlib
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
            rows.append(labelled_pair(a, b, golds[i], golds[j], label_pair(golds[i], golds[j], tau, rng, soft)))
    return rows, identical


def labelled_pair(a: dict, b: dict, gold_a: float, gold_b: float, p_a: float) -> dict:
    """The pair row of completions a and b given P(a beats b) (or its 0/1 draw): the winner as `chosen`."""
    (win, lose, g_win, g_lose, p) = (a, b, gold_a, gold_b, p_a) if p_a >= 0.5 else (b, a, gold_b, gold_a, 1.0 - p_a)
    return {"prompt_id": a["prompt_id"], "prompt": a["prompt"], "chosen": win["completion"],
            "rejected": lose["completion"], "label_prob": float(p), "gold_chosen": g_win,
            "gold_rejected": g_lose, "chosen_sample_idx": win["sample_idx"],
            "rejected_sample_idx": lose["sample_idx"], "chosen_finish_reason": win["finish_reason"],
            "rejected_finish_reason": lose["finish_reason"]}


def test_prompt_ids(prompt_ids: list[str], test_fraction: float, rng: random.Random) -> set[str]:
    """The prompts held out (a share `test_fraction`, at least one, never all), drawn with `rng`."""
    prompt_ids = sorted(prompt_ids)
    if len(prompt_ids) < 2:
        raise InputError(f"prefs: pairs from {len(prompt_ids)} prompt(s); a train/test split by prompt needs >= 2 "
                         f"(raise prefs.num_prompts, or prefs.num_samples so prompts yield distinct completions)")
    rng.shuffle(prompt_ids)
    n_test = min(max(1, round(test_fraction * len(prompt_ids))), len(prompt_ids) - 1)
    return set(prompt_ids[:n_test])


def split_by_prompt(rows: list[dict], test_fraction: float, rng: random.Random) -> DatasetDict:
    test_ids = test_prompt_ids(list({r["prompt_id"] for r in rows}), test_fraction, rng)
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


def first_rows(samples: Dataset, per_prompt: int) -> list[int]:
    """The rows of each prompt's first `per_prompt` completions, in order; rows stopped by pruning are prefixes,
    not completions, and are passed over."""
    taken: dict[str, int] = defaultdict(int)
    rows = []
    for i, (prompt_id, finish_reason) in enumerate(zip(samples["prompt_id"], samples["finish_reason"])):
        if finish_reason != PRUNED and taken[prompt_id] < per_prompt:
            taken[prompt_id] += 1
            rows.append(i)
    return rows


def simulated_labels(cfg: DictConfig, samples: Dataset, round_idx: int) -> tuple[DatasetDict, dict]:
    """Pairs among the first refresh.samples_per_prompt completions per prompt (rows stopped by pruning are
    prefixes, not completions, and are passed over), labelled by the demo's annotators."""
    subset = samples.select(first_rows(samples, cfg.refresh.samples_per_prompt))
    golds = [gold_score(t, c, f) for t, c, f in zip(subset["task"], subset["completion"], subset["finish_reason"])]
    rng = random.Random(round_seed(cfg.prefs.seed, round_idx))
    rows, identical = label_pairs(subset, golds, cfg.prefs.tau, cfg.prefs.soft, rng)
    splits = split_by_prompt(rows, cfg.prefs.test_fraction, rng)
    counts = {"completions": len(subset), "pairs": len(rows), "identical_pairs_skipped": identical,
              "label_against_gold": sum(r["gold_chosen"] < r["gold_rejected"] for r in rows)}
    return splits, counts


# the refresh.choose values (rsft.config.RefreshConfig lists them all) that ask a reward model which pairs to label
MODEL_CHOICES = ("uncertain", "posterior")


def labelled_pairs(cfg: DictConfig, samples: Dataset, index: int, chooser: Path | None, device) -> tuple:
    """(splits, counts): the labelled pairs of round (or online refresh) `index`'s samples by refresh.choose, as
    stage=labels and online's refresh label them: first (simulated_labels), or chosen_labels with, for the
    choices that read a reward model's uncertainty (MODEL_CHOICES), the one at `chooser`."""
    if cfg.refresh.choose == "first":
        return simulated_labels(cfg, samples, index)
    scorer = None
    if cfg.refresh.choose in MODEL_CHOICES:
        from reward.trained import load_scorer

        scorer = load_scorer(chooser, device)
    return chosen_labels(cfg, samples, index, scorer)


def candidate_pairs(samples: Dataset, prompt_ids: set[str]) -> list[tuple[int, int]]:
    """Every within-prompt pair (row i, row j) of distinct completions of these prompts, rows stopped by
    pruning passed over, in prompt and sample order."""
    by_prompt = defaultdict(list)
    for i, (prompt_id, finish_reason) in enumerate(zip(samples["prompt_id"], samples["finish_reason"])):
        if prompt_id in prompt_ids and finish_reason != PRUNED:
            by_prompt[prompt_id].append(i)
    completions = samples["completion"]
    return [(i, j) for members in by_prompt.values() for i, j in combinations(members, 2)
            if completions[i] != completions[j]]


def pair_uncertainty(scorer, samples: Dataset, pairs: list[tuple[int, int]], passes: int, seed: int) -> list[float]:
    """How unsure the reward model is of each pair: the variance, over `passes` dropout masks, of its
    Bradley-Terry probability P(i beats j) = sigmoid(r_i - r_j); for a model without dropout (every
    variance 0), p(1 - p) of its probability, said in the log.

    The variance is the disagreement of an implicit ensemble (Monte Carlo dropout, Gal and Ghahramani
    2016): high where the model's weights do not pin the pair down, which a label there would. p(1 - p)
    alone would ask for pairs the model calls a coin flip, most of them pairs of near-equal answers whose
    labels are coin flips too. `scorer` is reward.trained's RewardScorer; dropout is switched on for the
    passes and off again, and each pass draws its masks from its own seed."""
    import torch

    rows = sorted({i for pair in pairs for i in pair})
    prompts = scorer.as_trained([samples[i]["prompt"] for i in rows])
    completions = [samples[i]["completion"] for i in rows]
    position = {row: k for k, row in enumerate(rows)}
    draws = []
    scorer.model.train()
    try:
        for t in range(passes):
            torch.manual_seed(seed + t)
            draws.append(torch.tensor(scorer.score(prompts, completions, progress=False), dtype=torch.float64))
    finally:
        scorer.model.eval()
    rewards = torch.stack(draws)  # [passes, rows]
    i = torch.tensor([position[a] for a, _ in pairs])
    j = torch.tensor([position[b] for _, b in pairs])
    probs = torch.sigmoid(rewards[:, i] - rewards[:, j])  # [passes, pairs]
    mean = probs.mean(dim=0)
    variance = probs.var(dim=0, unbiased=False)
    if float(variance.max()) > 0.0:
        return variance.tolist()
    log.warning("refresh.choose=uncertain: the reward model has no dropout (its %d passes agree): pairs are chosen "
                "by p(1 - p) of its probability instead, the pairs it calls a coin flip", passes)
    return (mean * (1 - mean)).tolist()


def choose_pairs(pairs: list[tuple[int, int]], how: str, budget: int, rng: random.Random,
                 uncertainty: list[float] | None = None) -> list[tuple[int, int]]:
    """`budget` of the candidate pairs, in their order: at random, or the most uncertain (ties: the earlier)."""
    if budget >= len(pairs):
        return list(pairs)
    if how == "random":
        picked = set(rng.sample(range(len(pairs)), budget))
    elif how == "uncertain":
        picked = set(sorted(range(len(pairs)), key=lambda k: (-uncertainty[k], k))[:budget])
    else:
        raise ValueError(f"choose_pairs: {how!r} is not one of random, uncertain")
    return [pair for k, pair in enumerate(pairs) if k in picked]


def head_features(scorer, samples: Dataset, rows: list[int]):
    """What the reward model's last linear layer reads for each row ([rows, features], float64): the pooled
    representation its head maps to the reward, caught by a forward pre-hook so that every head works (a
    BERT-style `classifier`, a decoder's `score`, a head with a dense layer before its output)."""
    import torch

    core = scorer.model
    head = getattr(core, "score", None) or getattr(core, "classifier", None)
    linear = [m for m in head.modules() if isinstance(m, torch.nn.Linear)] if head is not None else []
    if not linear:
        raise InputError(f"refresh.choose=posterior: the reward model ({type(core).__name__}) has no `score` or "
                         f"`classifier` head ending in a linear layer to read features from; use refresh.choose="
                         f"uncertain or random")
    caught = []
    hook = linear[-1].register_forward_pre_hook(lambda module, args: caught.append(args[0].detach()))
    try:
        scorer.score(scorer.as_trained([samples[i]["prompt"] for i in rows]), [samples[i]["completion"] for i in rows],
                     progress=False)
    finally:
        hook.remove()
    return torch.cat(caught).to("cpu", torch.float64)  # [rows, features], on the CPU whatever the model is on


def posterior_design(scorer, samples: Dataset, pairs: list[tuple[int, int]], budget: int):
    """`budget` pairs chosen one at a time where a Bayesian Bradley-Terry head is least sure of r_i - r_j, each
    choice counted as observed before the next; returns (the chosen pairs in candidate order, every candidate's
    variance before any choice).

    The reward is linear in the head's features f (head_features), r = w.f, with a Gaussian prior on w of
    precision lam * I, lam the candidates' mean squared feature difference per dimension (so the prior weighs
    as much as one average pair). A pair's reward gap has variance d' S d, d = f_i - f_j, S the posterior
    covariance; each chosen pair adds d d' to the precision (the Bradley-Terry Fisher weight p(1 - p) taken
    as equal for every pair: no label is known yet), S follows by Sherman-Morrison, and the next pick
    maximises d' S d again. This is a greedy D-optimal design: a pick shrinks the variance along its own
    direction, so the next one points elsewhere and the budget spreads over what the features tell apart,
    instead of recurring on a few ambiguous completions as dropout disagreement does (docs/when-to-stop.md).
    It needs no dropout, so it works for reward models trained without it."""
    import torch

    rows = sorted({i for pair in pairs for i in pair})
    position = {row: k for k, row in enumerate(rows)}
    features = head_features(scorer, samples, rows)
    d = features[[position[a] for a, _ in pairs]] - features[[position[b] for _, b in pairs]]  # [pairs, features]
    lam = max(float((d * d).sum(dim=1).mean()) / d.shape[1], 1e-12)
    covariance = torch.eye(d.shape[1], dtype=torch.float64) / lam  # [features, features]
    prior = ((d @ covariance) * d).sum(dim=1)  # [pairs]
    if budget >= len(pairs):
        return list(pairs), prior.tolist()
    picked = []
    variance = prior.clone()
    for _ in range(budget):
        variance[picked] = -1.0
        k = int(variance.argmax())  # ties: the earlier
        picked.append(k)
        u = covariance @ d[k]  # [features]
        scale = 1.0 + float(d[k] @ u)
        variance -= (d @ u) ** 2 / scale  # each candidate's d' S d after the rank-one update, O(pairs * features)
        covariance -= torch.outer(u, u) / scale
    keep = set(picked)
    return [pair for k, pair in enumerate(pairs) if k in keep], prior.tolist()


def model_choice(scorer, samples: Dataset, pairs: list[tuple[int, int]], how: str, budget: int, passes: int,
                 seed: int) -> tuple[list[tuple[int, int]], list[float]]:
    """refresh.choose=uncertain or posterior: (the chosen pairs, each candidate's uncertainty as that choice
    measures it: dropout variance of P(i beats j), or the head's prior variance of r_i - r_j)."""
    if not pairs:  # nothing to score; the caller says why no pair can be labelled
        return [], []
    if how == "posterior":
        return posterior_design(scorer, samples, pairs, budget)
    uncertainty = pair_uncertainty(scorer, samples, pairs, passes, seed)
    return choose_pairs(pairs, "uncertain", budget, random.Random(seed), uncertainty), uncertainty


def pair_seed(seed: int, prompt_id: str, a: int, b: int) -> int:
    """A pair's own label draw: the same pair gets the same label whichever pairs are chosen beside it."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{prompt_id}/{a}/{b}".encode()).digest()[:8], "big")


def chosen_labels(cfg: DictConfig, samples: Dataset, round_idx: int, scorer=None) -> tuple[DatasetDict, dict]:
    """refresh.choose=random | uncertain: the held-out pairs as `first` makes them (every pair among the first
    refresh.samples_per_prompt completions of the held-out prompts, which no choice changes, so that two
    choices are measured on the same pairs), and refresh.label_budget pairs of the other prompts chosen among
    all their pairs of distinct completions, at random, where the reward model that scored round r - 1
    (`scorer`) is least sure (pair_uncertainty), or by its head's posterior (posterior_design). Each pair is
    labelled from its own seed (pair_seed)."""
    refresh = cfg.refresh
    seed = round_seed(cfg.prefs.seed, round_idx)
    scorable = [p for p, f in zip(samples["prompt_id"], samples["finish_reason"]) if f != PRUNED]
    test_ids = test_prompt_ids(list(set(scorable)), cfg.prefs.test_fraction, random.Random(seed))
    train_ids = set(scorable) - test_ids
    firsts = set(first_rows(samples, refresh.samples_per_prompt))
    held_out = [pair for pair in candidate_pairs(samples, test_ids) if set(pair) <= firsts]
    candidates = candidate_pairs(samples, train_ids)
    # null: as many as refresh.choose=first labels on these prompts, so that choices compare at equal labels
    budget = refresh.label_budget if refresh.label_budget is not None else sum(
        set(pair) <= firsts for pair in candidates)
    uncertainty = None
    if refresh.choose in MODEL_CHOICES:
        chosen, uncertainty = model_choice(scorer, samples, candidates, refresh.choose, budget,
                                           refresh.dropout_passes, seed)
    else:
        chosen = choose_pairs(candidates, refresh.choose, budget, random.Random(seed + 1))
    golds = {i: gold_score(samples[i]["task"], samples[i]["completion"], samples[i]["finish_reason"])
             for pair in chosen + held_out for i in pair}
    tau, soft = cfg.prefs.tau, cfg.prefs.soft

    def labelled(pairs):
        rows = []
        for a, b in pairs:
            row_a, row_b = samples[a], samples[b]
            draw = random.Random(pair_seed(seed, row_a["prompt_id"], row_a["sample_idx"], row_b["sample_idx"]))
            rows.append(labelled_pair(row_a, row_b, golds[a], golds[b], label_pair(golds[a], golds[b], tau, draw, soft)))
        return rows

    train, test = labelled(chosen), labelled(held_out)
    if not train or not test:
        raise InputError(f"labels of round {round_idx}: {len(train)} pairs to train on and {len(test)} held out "
                         f"({len(candidates)} candidate pairs of {len(train_ids)} prompts); the round's completions "
                         f"are too few or too alike to label (raise sample.num_samples or refresh.samples_per_prompt)")
    counts = {"completions": len(scorable), "pairs": len(train) + len(test), "candidate_pairs": len(candidates),
              "choose": refresh.choose, "label_budget": budget,
              "label_against_gold": sum(r["gold_chosen"] < r["gold_rejected"] for r in train + test)}
    if uncertainty is not None:
        picked = set(chosen)
        counts["uncertainty_chosen_mean"] = sum(u for u, p in zip(uncertainty, candidates) if p in picked) / len(chosen)
        counts["uncertainty_all_mean"] = sum(uncertainty) / len(uncertainty)
    return DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(test)}), counts


def user_labels(cfg: DictConfig, path: str) -> tuple[DatasetDict, dict]:
    """The user's labelled pairs of the round, normalised by reward.formats, a held-out share by row."""
    pairs_cfg = cfg.reward.data
    raw, source = load_raw(OmegaConf.merge(pairs_cfg, {"path": path}), setting="refresh.pairs")
    pairs = to_preference_pairs(raw, pairs_cfg.format, pairs_cfg.label_column, source)
    pairs = pairs.shuffle(seed=cfg.reward.seed)
    if len(pairs) < 2:
        raise InputError(f"{source}: {len(pairs)} pair(s); a held-out share needs at least 2")
    n_test = min(max(1, round(float(pairs_cfg.eval_fraction) * len(pairs))), len(pairs) - 1)
    splits = DatasetDict({"train": pairs.select(range(n_test, len(pairs))), "test": pairs.select(range(n_test))})
    return splits, {"pairs": len(pairs), "source": source}


def check_round_labels(cfg: DictConfig, rounds: range) -> None:
    """Find and read every round's file of refresh.pairs that a command will train on, before it does any
    work (rsft.preflight calls it): a missing round_02.jsonl must not surface after two rounds of sampling."""
    for round_idx in rounds:
        path = round_pairs_path(cfg, round_idx)
        if path is not None:
            user_labels(cfg, path)
