"""What an evaluation measures: the metric functions the eval stage computes and the report reads back.

    metrics = policy_metrics(evaluated, baseline)     # rsft.eval writes it as metrics.json
    flat_metrics(read_metrics(path))                  # rsft.report and wandb read it

The metrics themselves are listed in rsft.eval's docstring; intervals and paired statistics come
from rsft.stats. This module reads no config and no run directory layout.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict

from datasets import Dataset

from rsft import stats
from rsft.errors import InputError

METRICS_FILE = "metrics.json"
# the score columns an evaluation may hold, the truth first: the demo's oracle, a judge (eval.judge), the proxy
SCORE_TITLES = {"gold": "gold (oracle)", "judge": "judge (held-out reward model)", "reward": "proxy reward model"}


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


def rows_by_prompt(prompt_ids) -> dict[str, list[int]]:
    """{prompt_id: the indices of its rows}, the prompts in their first row's order."""
    groups = defaultdict(list)
    for i, prompt_id in enumerate(prompt_ids):
        groups[prompt_id].append(i)
    return dict(groups)


def best_of_n_matrices(scored: Dataset, gold: list[float] | None = None,
                       judge: list[float | None] | None = None) -> dict[str, list[list[float]]]:
    """{proxy, gold, judge: [prompts][K]}: per prompt, per N, the expected value of the reward-best of N of the
    prompt's K samples (the truths present only); what best_of_n_curve averages and enough_samples reads."""
    groups = rows_by_prompt(scored["prompt_id"])
    k = min(len(v) for v in groups.values())  # a prompt with fewer samples caps K for all
    rows = [v[:k] for v in groups.values()]
    all_rewards = _lowest_for_none(list(scored["reward"]))  # a row the source could not score ranks lowest
    rewards = [[all_rewards[i] for i in r] for r in rows]  # [prompts][K]
    ns = list(range(1, k + 1))
    # per prompt, per N: the expected value of the reward-best of N ([prompts][K] each)
    per_prompt = {"proxy": [[expected_best_of_n(r, r, n) for n in ns] for r in rewards]}
    for name, values in (("gold", gold), ("judge", judge)):
        if values is not None and any(v is not None for v in values):
            values = _lowest_for_none(list(values))
            per_prompt[name] = [[expected_best_of_n(r, [values[i] for i in row], n) for n in ns]
                                for r, row in zip(rewards, rows)]
    return per_prompt


def best_of_n_curve(scored: Dataset, gold: list[float] | None = None, judge: list[float | None] | None = None) -> dict:
    """Expected max reward, and the gold and judge score of the reward-best, vs N = 1..K, averaged over
    prompts, each with its 95% bootstrap interval over prompts, and the point past which more samples stop
    paying (`enough`, see enough_samples). Computed from one round's own K samples per prompt: every
    subset of N of them is weighed exactly (expected_best_of_n), nothing is resampled but the prompts.
    `enough_interval`: the 95% interval on that N itself, per truth, and judge - gold (enough_samples_interval)."""
    per_prompt = best_of_n_matrices(scored, gold, judge)
    ns = list(range(1, len(per_prompt["proxy"][0]) + 1))
    intervals = {name: [stats.bootstrap([[p[n - 1]] for p in matrix]) for n in ns]
                 for name, matrix in per_prompt.items()}
    curve = {"n": ns, "kl_bound": [best_of_n_kl_bound(n) for n in ns], "prompts": len(per_prompt["proxy"]),
             "expected_max_reward": [i["mean"] for i in intervals["proxy"]],
             "expected_gold": [i["mean"] for i in intervals["gold"]] if "gold" in intervals else None,
             "expected_judge": [i["mean"] for i in intervals["judge"]] if "judge" in intervals else None,
             "intervals": {name: {"low": [i["low"] for i in ivs], "high": [i["high"] for i in ivs]}
                           for name, ivs in intervals.items()}}
    curve["enough"] = enough_samples(per_prompt)
    curve["enough_interval"] = enough_samples_interval(per_prompt)
    return curve


def _lowest_for_none(values: list) -> list[float]:
    if None in values:
        lowest = min((v for v in values if v is not None), default=0.0)
        return [lowest if v is None else v for v in values]
    return values


# which curve stands for the truth when choosing how many samples are enough: an independent judge
# first (what the user configured to check the proxy), else the task's gold oracle, else the proxy itself
TRUTHS = ("judge", "gold", "proxy")


def enough_samples(per_prompt: dict[str, list[list[float]]]) -> dict:
    """The over-optimisation point of a best-of-N curve: the smallest N whose truth value (judge, else gold,
    else the proxy) lies within the 95% interval of the curve's best, and whether the proxy still rises past it.

    The rule, on the prompts of one round: with N* the N of the highest mean truth and [low, high] its 95%
    bootstrap interval over prompts, N is enough when mean truth(N) >= low. More samples than that buy
    no truth the prompts can show, while the proxy, which best-of-N maximises, keeps rising
    (`proxy_gain_after`: proxy(K) - proxy(N), paired over prompts): when that interval is above 0 the
    proxy is being over-optimised past N (`overoptimised`). `gap_to_best` is truth(N*) - truth(N), paired:
    a paired interval is far narrower, so it can call a gain of 0.005 "decided" that no evaluation of the
    trained policies could see; the marginal interval asks what the issue's reader asks, whether N's value
    is one the best could have had."""
    truth = next(name for name in TRUTHS if name in per_prompt)
    matrix, proxy = per_prompt[truth], per_prompt["proxy"]
    k = len(matrix[0])
    means, best, best_interval, enough = _enough_index(matrix)
    gap = stats.bootstrap([[p[best] - p[enough]] for p in matrix])
    proxy_gain = stats.bootstrap([[p[k - 1] - p[enough]] for p in proxy])
    return {"truth": truth, "n": enough + 1, "value": means[enough], "best_n": best + 1, "best": means[best],
            "best_interval": [best_interval["low"], best_interval["high"]], "gap_to_best": gap, "k": k,
            "proxy_gain_after": proxy_gain, "overoptimised": enough + 1 < k and proxy_gain["low"] > 0.0}


def _enough_index(matrix: list[list[float]]) -> tuple[list[float], int, dict, int]:
    """enough_samples' rule on one truth's [prompts][K] matrix: (mean curve, best index, its interval, enough index)."""
    k = len(matrix[0])
    means = [sum(p[j] for p in matrix) / len(matrix) for j in range(k)]
    best = max(range(k), key=lambda j: (means[j], -j))  # the smallest N of the highest mean
    best_interval = stats.bootstrap([[p[best]] for p in matrix])
    enough = next(j for j in range(best + 1) if means[j] >= best_interval["low"])
    return means, best, best_interval, enough


DRAWS = 2000
DRAWS_SEED = 1  # the outer resampling's seed; the inner one is stats.SEED, as in enough_samples


def enough_samples_interval(per_prompt: dict[str, list[list[float]]], truths: tuple[str, ...] = ("judge", "gold"),
                            draws: int = DRAWS, seed: int = DRAWS_SEED, level: float = stats.LEVEL) -> dict:
    """A 95% interval on the over-optimisation point N itself, for each truth curve, and on the paired
    difference of two truths' N (issue 35: does the judge's point agree with gold's, within the interval?).

    The bootstrap over prompts: each of `draws` resamples of the prompts (with replacement, seeded) is the
    same for every truth, so the truths are paired. On each resample every truth's N is found by
    enough_samples' rule: the mean curve, its best N* (smallest N of the highest mean), the 95% interval of
    N*'s mean and the smallest N whose mean reaches its low end. That inner interval is a nested percentile
    bootstrap exactly as enough_samples draws it (stats.bootstrap: stats.RESAMPLES resamples of the
    resampled prompts by the same stats.SEED picks), not a normal approximation: with a few dozen prompts
    and skewed gains the two differ in the tail the rule reads. numpy does it as matrix products (resample
    counts x values), so 2000 x 2000 draws over 64 prompts x K=32 take well under a second per truth.

    Returns, per truth present (of `truths`; none present: the truth enough_samples reads), {n, low, high}:
    `n` is enough_samples' N on the full prompts (the same code), [low, high] the percentile interval of
    the resampled N (low: the lower, high: the higher order statistic, so both are N values that occurred).
    With two truths a, b: `difference` {truths: [a, b], n: n_a - n_b, low, high, agree: the interval holds
    0} and `a_in_b` / `b_in_a`: whether each point lies in the other's interval.
    """
    import numpy as np

    present = [t for t in truths if t in per_prompt] or [next(t for t in TRUTHS if t in per_prompt)]
    matrices = {t: np.asarray(per_prompt[t], dtype=np.float64) for t in present}
    prompts, k = matrices[present[0]].shape
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, prompts, size=(draws, prompts))  # [draws, prompts]: one resample for every truth
    counts = np.zeros((draws, prompts))
    np.add.at(counts, (np.arange(draws)[:, None], picks), 1.0)
    # the inner bootstrap's resamples, as stats.bootstrap draws them, as counts over the (resampled) prompts
    inner_picks = np.random.default_rng(stats.SEED).integers(0, prompts, size=(stats.RESAMPLES, prompts))
    inner = np.zeros((stats.RESAMPLES, prompts))
    np.add.at(inner, (np.arange(stats.RESAMPLES)[:, None], inner_picks), 1.0)
    tail = (1.0 - level) / 2.0
    out = {"draws": draws, "seed": seed, "level": level, "prompts": prompts, "truths": present}
    resampled = {}
    for name, matrix in matrices.items():
        means = counts @ matrix / prompts  # [draws, K]
        best = means.argmax(axis=1)  # the first (smallest N) of the highest mean, as enough_samples
        column = matrix[picks, best[:, None]]  # [draws, prompts]: the best N's value of each resampled prompt
        low = np.quantile(column @ inner.T / prompts, tail, axis=1)  # [draws]: the best's interval's low end
        index = np.arange(k)[None, :]
        reaches = ((means >= low[:, None]) | (index == best[:, None])) & (index <= best[:, None])
        resampled[name] = reaches.argmax(axis=1) + 1  # [draws]: N on each resample
        point = _enough_index(per_prompt[name])[3] + 1
        out[name] = {"n": point, "low": int(np.quantile(resampled[name], tail, method="lower")),
                     "high": int(np.quantile(resampled[name], 1.0 - tail, method="higher"))}
    if len(present) >= 2:
        a, b = present[:2]
        diff = resampled[a] - resampled[b]
        low, high = (int(np.quantile(diff, tail, method="lower")), int(np.quantile(diff, 1.0 - tail, method="higher")))
        out["difference"] = {"truths": [a, b], "n": out[a]["n"] - out[b]["n"], "low": low, "high": high,
                             "agree": low <= 0 <= high}
        out[f"{a}_in_{b}"] = out[b]["low"] <= out[a]["n"] <= out[b]["high"]
        out[f"{b}_in_{a}"] = out[a]["low"] <= out[b]["n"] <= out[a]["high"]
    return out


def gold_scores(ds: Dataset) -> list[float] | None:
    """The oracle's score of every row, or None when the prompt set has no `task` column."""
    if "task" not in ds.column_names:
        return None
    from reward.gold import gold_score

    return [gold_score(t, c, f) for t, c, f in zip(ds["task"], ds["completion"], ds["finish_reason"])]


def mean_or_none(values) -> float | None:
    """The mean of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def kept_means(candidates: list[dict], kept: list[dict]) -> dict:
    """The mean reward of a batch's scored rows and of the ones kept, and with the demo's oracle (a `task` column)
    their mean gold score, recorded only: the oracle never selects (stage=online's mini-batch metrics)."""
    means = {"reward_mean": mean_or_none(r["reward"] for r in candidates),
             "kept_reward_mean": mean_or_none(r["reward"] for r in kept)}
    if not candidates or "task" not in candidates[0]:
        return means
    gold = gold_scores(Dataset.from_dict({k: [r[k] for r in candidates] for k in ("task", "completion", "finish_reason")}))
    kept_keys = {(r["prompt_id"], r["sample_idx"]) for r in kept}
    return {**means, "gold_mean": mean_or_none(gold),
            "kept_gold_mean": mean_or_none(g for r, g in zip(candidates, gold) if (r["prompt_id"], r["sample_idx"]) in kept_keys)}


def scorable(values) -> list[float]:
    """The values a reward source could score (None: it could not)."""
    return [v for v in values if v is not None]


def keyed(ds: Dataset, column: str) -> dict[tuple[str, int], float | None]:
    """{(prompt_id, sample_idx): value} of an evaluation's `column` (rsft.stats.keyed; None: not scored)."""
    return stats.keyed(ds["prompt_id"], ds["sample_idx"], ds[column])


def score_columns(ds: Dataset) -> list[str]:
    """The per-completion scores an evaluation holds: reward (the proxy), gold (demo oracle), judge."""
    return [c for c in ("reward", "gold", "judge") if c in ds.column_names]


def policy_metrics(ds: Dataset, baseline: Dataset | None = None) -> dict:
    """Every headline number of one evaluation, each mean with its 95% bootstrap interval over prompts
    (rsft.stats); with the initial policy's evaluation, paired differences and win rates against it."""
    completions = ds["completion"]
    texts = rows_by_prompt(ds["prompt_id"])
    metrics = {
        **({"reward_normalised_mean": statistics.fmean(scorable(ds["reward_normalised"]))}
           if scorable(ds["reward_normalised"]) else {}),
        "mean_tokens": statistics.fmean(ds["num_tokens"]),
        "mean_words": statistics.fmean(len(c.split()) for c in completions),
        "eos_fraction": statistics.fmean(f == "eos" for f in ds["finish_reason"]),
        # of the answers that ended on EOS, those whose text stops without closing punctuation: a policy
        # taught to stop mid-sentence (SFT on cut answers with their end of turn) shows it here
        "eos_mid_sentence": stats.mid_sentence_share([c for c, f in zip(completions, ds["finish_reason"]) if f == "eos"]),
    }
    intervals = {}
    for column in score_columns(ds):
        values = ds[column]
        bad = next((i for i, v in enumerate(values) if v is not None and not math.isfinite(v)), None)
        if bad is not None:  # a NaN would make every mean and interval NaN and count as a loss in the win rate
            raise InputError(f"evaluation's {column} column: prompt {ds['prompt_id'][bad]}'s row {bad} scored "
                             f"{values[bad]}; every score must be a finite number or None (not scorable): the "
                             f"{column} model or source gives non-finite scores")
        unscorable = sum(v is None for v in values)
        if unscorable:  # the means below are over the scored rows only (by_prompt leaves out None): say how many
            metrics[f"{column}_unscorable"] = unscorable
        if unscorable == len(values):
            continue
        interval = stats.bootstrap(stats.by_prompt(ds["prompt_id"], values))
        metrics[f"{column}_mean"] = interval["mean"]
        intervals[f"{column}_mean"] = [interval["low"], interval["high"]]
    for n in (1, 2):
        # undefined where no completion has n words (one-number answers have no bigram): left out, not 0.0,
        # which would read as a measured value; `undefined` says why (a guard's floor counts it as crossed)
        values = [v for v in (stats.distinct_n([completions[i] for i in rows], n) for rows in texts.values())
                  if v is not None]
        if values:
            metrics[f"distinct_{n}"] = statistics.fmean(values)
            metrics[f"distinct_{n}_all"] = stats.distinct_n(completions, n)
        else:  # why it is missing, for a guard whose floor it is (rsft.guard.crossed)
            undefined = metrics.setdefault("undefined", {})
            undefined[f"distinct_{n}"] = undefined[f"distinct_{n}_all"] = f"no answer has {n} words"
    metrics["top_opening"], metrics["top_opening_share"] = stats.top_opening(completions)
    range_metrics(ds, texts, metrics, intervals)
    if baseline is not None:
        metrics["vs_initial"] = {}
        for column in score_columns(ds):
            if column not in baseline.column_names:
                continue
            mine, theirs = keyed(ds, column), keyed(baseline, column)
            if not stats.scored_in_both(mine, theirs):  # the pairing leaves out what either side could not score
                continue
            win = stats.paired_win_rate(mine, theirs)
            metrics["vs_initial"][column] = stats.paired_difference(mine, theirs)
            name = "win_rate_vs_initial" if column == "reward" else f"{column}_win_rate_vs_initial"
            metrics[name] = win["mean"]
            intervals[name] = [win["low"], win["high"]]
    metrics["intervals"] = intervals
    return metrics


PASS_AT = (1, 2, 4, 8)  # the k of pass@k, where a prompt has at least k samples


def range_metrics(ds: Dataset, rows_by_prompt: dict, metrics: dict, intervals: dict) -> None:
    """How much range the policy keeps (the collapse that training on its own best answers causes), each
    with its 95% bootstrap interval over prompts:
      alike_share          share of prompts whose samples are all the same text (case and spacing aside):
                           best-of-N has nothing left to choose from there
      distinct_answers     distinct texts per prompt, averaged
      mean_entropy         where the samples carry `mean_entropy`: the policy's token entropy, per completion
      <column>_pass_at_<k> for a verifier's column (every value 0 or 1), k = 1, 2, 4, 8 up to the samples per
                           prompt: the unbiased pass@k from n samples, 1 - C(n - c, k) / C(n, k) (pass_at_<k>
                           for the reward column); pass@1 is the column's mean, pass@k > pass@1 is range"""
    completions = ds["completion"]
    if "mean_entropy" in ds.column_names:  # the policy's token entropy on these prompts, per completion
        values = ds["mean_entropy"]
        per_prompt = {p: [values[i] for i in rows if values[i] is not None] for p, rows in rows_by_prompt.items()}
        if any(per_prompt.values()):
            interval = stats.bootstrap({p: v for p, v in per_prompt.items() if v})
            metrics["mean_entropy"] = interval["mean"]
            intervals["mean_entropy"] = [interval["low"], interval["high"]]
        elif not any(ds["num_tokens"]):  # every answer ended on EOS at once: no token, so no entropy to average
            metrics.setdefault("undefined", {})["mean_entropy"] = "no answer has a token"
    answers = {p: [stats.normalised_answer(completions[i]) for i in rows] for p, rows in rows_by_prompt.items()}
    for name, per_prompt in (("alike_share", {p: [float(len(set(a)) == 1)] for p, a in answers.items() if len(a) > 1}),
                             ("distinct_answers", {p: [float(len(set(a)))] for p, a in answers.items()})):
        if per_prompt:
            interval = stats.bootstrap(per_prompt)
            metrics[name] = interval["mean"]
            intervals[name] = [interval["low"], interval["high"]]
    for column in score_columns(ds):
        values = ds[column]
        # gold is the demo's graded oracle: 0 for every empty answer, so a policy collapsed to nothing would
        # pass for a verifier's column by its values alone
        if column == "gold" or not stats.is_verifier(values):
            continue
        verdicts = {p: [values[i] for i in rows if values[i] is not None] for p, rows in rows_by_prompt.items()}
        verdicts = {p: v for p, v in verdicts.items() if v}
        for k in PASS_AT:
            # over the prompts with at least k verdicts (an unscorable answer leaves its prompt fewer), so one
            # None does not drop pass@k for every prompt; pass_k_coverage names each k that covers fewer prompts
            counted = {p: v for p, v in verdicts.items() if len(v) >= k}
            if not counted:
                break
            name = f"pass_at_{k}" if column == "reward" else f"{column}_pass_at_{k}"
            interval = stats.bootstrap({p: [stats.pass_at_k(len(v), int(sum(v)), k)] for p, v in counted.items()})
            metrics[name] = interval["mean"]
            intervals[name] = [interval["low"], interval["high"]]
            if len(counted) < len(verdicts):
                metrics.setdefault("pass_k_coverage", {})[name] = len(counted)


def flat_metrics(metrics: dict) -> dict[str, float]:
    """The scalar metrics, each interval as <name>_low / <name>_high, each paired difference to the initial
    policy as <column>_diff_vs_initial (+ _low / _high): what wandb and the round table show."""
    flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for name, (low, high) in metrics.get("intervals", {}).items():
        flat[f"{name}_low"], flat[f"{name}_high"] = low, high
    for column, diff in metrics.get("vs_initial", {}).items():
        flat[f"{column}_diff_vs_initial"] = diff["mean"]
        flat[f"{column}_diff_vs_initial_low"], flat[f"{column}_diff_vs_initial_high"] = diff["low"], diff["high"]
    return flat


def read_metrics(path) -> dict:
    return json.loads((path / METRICS_FILE).read_text())
