"""stage=eval: how good a policy is on held-out prompts, and the round's best-of-K statistics.

    python -m rsft.run stage=eval round=1          # the policy round 1 trained (round_01/policy)
    python -m rsft.run stage=eval eval.policy=initial   # the configured policy, before any round

Round semantics (rsft.paths.RunPaths.eval_policy): `eval round=r` judges the policy round r
trained (round_XX/policy). The initial policy's
evaluation (eval_initial/) is the baseline: a round's eval builds it first when it is missing.

Every policy is sampled with the same seed (eval.seed) on the same held-out prompts
(load_prompts(cfg.data, "eval")), eval.num_samples completions each, with the plain sampler (the
speculative one is exact, so a draft would change nothing but speed). Metrics (metrics.json):
  reward_mean, reward_normalised_mean   the reward model's view
  gold_mean                             the demo task's oracle (only when the prompts have `task`)
  win_rate_vs_initial                   P(reward of this policy's completion > the initial policy's)
                                        over all sample pairs of the same prompt, ties count 1/2;
                                        gold_win_rate_vs_initial the same under the oracle
  distinct_1, distinct_2                distinct word n-grams / all word n-grams across a prompt's
                                        samples, averaged over prompts (diversity; it falls as SFT
                                        sharpens the policy)
  mean_tokens, mean_words, eos_fraction
  best_of_n                             from round r's scored samples (the K completions per train
                                        prompt that this policy was trained from): for N = 1..K the
                                        expected max reward of N of them drawn without replacement,
                                        by the unbiased order-statistics estimator
                                        sum_i C(i-1, N-1) / C(K, N) * r_(i) (r_(i) the i-th smallest),
                                        the expected gold score of that reward-best-of-N completion
                                        (where the two curves part, the reward model is being
                                        over-optimised), and the best-of-N KL bound log N - (N-1)/N
                                        (Stiennon et al. 2020; Beirami et al. 2024 show it is an upper bound).
The gold oracle is read here, for evaluation only; selection never sees it.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections import defaultdict

from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from rsft import distributed, score
from rsft.data import load_prompts, prompt_files, prompt_keys
from rsft.models import load_policy, resolve_device
from rsft.paths import RunPaths, atomic_artifact, fingerprint, is_complete, load_dataset_artifact, should_skip
from rsft.sample import sample_dataset, sampling_settings
from rsft.tracking import Tracker, stage_tracker

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"


def expected_best_of_n(rewards: list[float], values: list[float], n: int) -> float:
    """E[value of the highest-reward item among n drawn without replacement from these K]: unbiased.

    Item of reward rank i (1 = lowest) is the best of a random n-subset with probability
    C(i-1, n-1) / C(K, n). Ties in reward are ranked by position (the earlier item counts as higher),
    matching a deterministic tie-break.
    """
    k = len(rewards)
    if not 1 <= n <= k:
        raise ValueError(f"best-of-{n} needs 1 <= N <= K={k}")
    order = sorted(range(k), key=lambda i: (rewards[i], -i))  # ascending reward
    total = math.comb(k, n)
    return sum(math.comb(i, n - 1) / total * values[order[i]] for i in range(n - 1, k))


def best_of_n_kl_bound(n: int) -> float:
    return math.log(n) - (n - 1) / n


def best_of_n_curve(scored: Dataset, gold: list[float] | None = None) -> dict:
    """Expected max reward (and gold of the reward-best) vs N = 1..K, averaged over prompts."""
    groups = defaultdict(list)
    for i, prompt_id in enumerate(scored["prompt_id"]):
        groups[prompt_id].append(i)
    k = min(len(v) for v in groups.values())  # a prompt with fewer samples caps K for all
    rows = [v[:k] for v in groups.values()]
    all_rewards = list(scored["reward"])
    rewards = [[all_rewards[i] for i in r] for r in rows]  # [prompts][K]
    golds = None if gold is None else [[gold[i] for i in r] for r in rows]  # [prompts][K]
    ns = list(range(1, k + 1))
    curve = {"n": ns, "kl_bound": [best_of_n_kl_bound(n) for n in ns],
             "expected_max_reward": [statistics.fmean(expected_best_of_n(r, r, n) for r in rewards) for n in ns],
             "expected_gold": None}
    if golds is not None:
        curve["expected_gold"] = [statistics.fmean(expected_best_of_n(r, g, n) for r, g in zip(rewards, golds))
                                  for n in ns]
    return curve


def gold_scores(ds: Dataset) -> list[float] | None:
    """The oracle's score of every row, or None when the prompt set has no `task` column."""
    if "task" not in ds.column_names:
        return None
    from reward.gold import gold_score

    return [gold_score(t, c, f) for t, c, f in zip(ds["task"], ds["completion"], ds["finish_reason"])]


def distinct_n(texts: list[str], n: int) -> float | None:
    grams = [tuple(words[i:i + n]) for words in (t.lower().split() for t in texts) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def win_rate(mine: dict[str, list[float]], theirs: dict[str, list[float]]) -> float:
    """P(mine > theirs) over all sample pairs of the same prompt, ties 1/2, averaged over prompts."""
    rates = []
    for prompt_id, a in mine.items():
        b = theirs[prompt_id]
        rates.append(sum((x > y) + 0.5 * (x == y) for x in a for y in b) / (len(a) * len(b)))
    return statistics.fmean(rates)


def by_prompt(ds: Dataset, column: str) -> dict[str, list]:
    out = defaultdict(list)
    for prompt_id, value in zip(ds["prompt_id"], ds[column]):
        out[prompt_id].append(value)
    return dict(out)


def policy_metrics(ds: Dataset) -> dict:
    texts = by_prompt(ds, "completion")
    metrics = {
        "reward_mean": statistics.fmean(ds["reward"]),
        "reward_normalised_mean": statistics.fmean(ds["reward_normalised"]),
        "mean_tokens": statistics.fmean(ds["num_tokens"]),
        "mean_words": statistics.fmean(len(c.split()) for c in ds["completion"]),
        "eos_fraction": statistics.fmean(f == "eos" for f in ds["finish_reason"]),
    }
    for n in (1, 2):
        values = [v for v in (distinct_n(t, n) for t in texts.values()) if v is not None]
        metrics[f"distinct_{n}"] = statistics.fmean(values) if values else 0.0
    if "gold" in ds.column_names:
        metrics["gold_mean"] = statistics.fmean(ds["gold"])
    return metrics


# the sample settings that shape a completion (not num_samples: eval.num_samples; not batch_rows)
SAMPLING_KEYS = ("sample.max_new_tokens", "sample.temperature", "sample.top_k", "sample.top_p", "sample.strategy",
                 "sample.leniency")


def made_from(cfg: DictConfig, paths: RunPaths, policy_path, scored) -> dict:
    """An evaluation's fingerprint: eval and sampling settings, held-out prompts, the policy (configured
    or an artifact), the reward model; a round's also the baseline and the round's scored samples
    (best-of-N). The initial evaluation's best-of-N curve is a snapshot of round 0's scored samples
    if they existed when it ran; they are not part of its fingerprint."""
    inputs = [paths.reward]
    if policy_path is not None:
        inputs += [policy_path, paths.initial_eval] + ([scored] if is_complete(scored) else [])
    return fingerprint(cfg, ("eval", "policy", *SAMPLING_KEYS, *prompt_keys("eval")), inputs,
                       prompt_files(cfg.data, "eval"))


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths, round_idx = RunPaths.from_config(cfg), int(cfg.round)
    initial = cfg.eval.policy == "initial"
    out = paths.initial_eval if initial else paths.eval(round_idx)
    settings = sampling_settings(cfg.sample)  # plain: a draft would change nothing but speed
    policy_path = None if initial else paths.eval_policy(round_idx)
    if policy_path is not None and not is_complete(policy_path):
        raise FileNotFoundError(f"eval round={round_idx} judges the policy round {round_idx} trained, but "
                                f"{policy_path} is missing; run `python -m rsft.run stage=sft "
                                f"round={round_idx}` first (or eval.policy=initial for the configured policy)")
    score.reward_model(cfg)  # a missing reward model stops here, before any work
    if not initial:  # the baseline: built when missing, reused when it matches, else stale (never silently old)
        run(OmegaConf.merge(cfg, {"eval": {"policy": "initial"}}), tracker)
    curve_round = 0 if initial else round_idx
    made = made_from(cfg, paths, policy_path, None if initial else paths.scored(curve_round))
    if should_skip(out, cfg.overwrite, "eval", made):
        return out
    prompts = load_prompts(cfg.data, "eval")
    device = resolve_device(cfg.device)

    model, tokenizer, source = load_policy(cfg, policy_path, device)
    provenance = {"round": -1 if initial else round_idx, "policy": source,
                  "sampler": json.dumps({**settings.__dict__, "draft": "none"}, sort_keys=True)}
    ds, sampling = sample_dataset(model, tokenizer, None, prompts, settings, int(cfg.eval.num_samples),
                                  int(cfg.eval.seed), cfg.data.get("system_prompt"), provenance)
    del model
    scorer = score.load_reward_scorer(cfg, device)
    raw = score.score_rows(scorer, ds["prompt"], ds["completion"], progress=False)
    ds = ds.add_column("reward", [float(r) for r in raw])
    ds = ds.add_column("reward_normalised", [float(r) for r in scorer.normalise(raw)])
    gold = gold_scores(ds)
    if gold is not None:
        ds = ds.add_column("gold", gold)

    metrics = policy_metrics(ds)
    if not initial:
        baseline = load_dataset_artifact(paths.initial_eval)
        metrics["win_rate_vs_initial"] = win_rate(by_prompt(ds, "reward"), by_prompt(baseline, "reward"))
        if gold is not None:
            metrics["gold_win_rate_vs_initial"] = win_rate(by_prompt(ds, "gold"), by_prompt(baseline, "gold"))
    if is_complete(paths.scored(curve_round)):
        scored = load_dataset_artifact(paths.scored(curve_round))
        metrics["best_of_n"] = {"round": curve_round, **best_of_n_curve(scored, gold_scores(scored))}
    metrics["sampling"] = {k: sampling[k] for k in ("tokens_per_second", "seconds", "num_completions")}

    meta = {"stage": "eval", "policy": source, "round": provenance["round"], "num_prompts": len(prompts),
            "metrics": metrics}
    if distributed.is_main():
        with atomic_artifact(out, meta, made) as tmp:
            ds.save_to_disk(str(tmp))
            (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2))
    distributed.barrier()
    log.info("eval %s: %s", "initial policy" if initial else f"round {round_idx}",
             {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)})
    with stage_tracker(cfg, "eval", tracker) as tracker:
        prefix = "eval_initial" if initial else "eval"
        tracker.log({f"{prefix}/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
                    step=0 if initial else round_idx)
    return out


def read_metrics(path) -> dict:
    return json.loads((path / METRICS_FILE).read_text())
