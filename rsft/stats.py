"""Numbers that carry their uncertainty, and the diversity of a set of completions.

Intervals: every evaluation samples the same held-out prompts with the same seeds (common random
numbers), so completion (prompt_id, sample_idx) of one policy is paired with the same key of
another. The unit of resampling is the prompt: completions of one prompt are correlated (one
prompt is easy, another hard), prompts are the independent draws. `bootstrap` resamples prompts
with replacement and reports the percentile interval of the mean of per-prompt means. A paired
difference (or a win rate) is first formed per key, then averaged per prompt, then bootstrapped
the same way, which is far tighter than comparing two separate intervals.

Hand-written because none of the project's libraries offers it: scipy.stats.bootstrap would do the
resampling but scipy is not a dependency, and the grouping by prompt and the pairing by key are
ours anyway. numpy (a dependency of datasets and torch) does the arithmetic.

Diversity across prompts (collapse): `opening` is a completion's first OPENING_WORDS words, lower-
cased, punctuation dropped; `top_opening` finds the most common one and its share of the set (a
policy that answers every prompt "I'm sorry, but as an AI ..." has a share near 1 while its
per-prompt distinct-n can stay high). `distinct_n` over a whole set counts n-grams pooled across
prompts.
"""

from __future__ import annotations

import math
import statistics
import re
import unicodedata
from collections import Counter, defaultdict

import numpy as np

from rsft.errors import ConfigError

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0  # the bootstrap's own seed: the same scores always give the same interval
OPENING_WORDS = 5
_WORD = re.compile(r"\w+(?:'\w+)*")


def bootstrap(per_prompt: list[list[float]] | dict, resamples: int = RESAMPLES, level: float = LEVEL,
              seed: int = SEED) -> dict:
    """{mean, low, high, prompts}: the mean of per-prompt means and its percentile bootstrap interval.

    per_prompt: one list of values per prompt (or a dict of such lists). A prompt with no values is
    left out. With a single prompt the interval is the point (nothing to resample).
    """
    groups = list(per_prompt.values()) if isinstance(per_prompt, dict) else list(per_prompt)
    means = np.array([float(np.mean(g)) for g in groups if len(g)], dtype=np.float64)
    if means.size == 0:
        raise ValueError("bootstrap: no values (every prompt is empty)")
    mean = float(means.mean())
    if means.size == 1:
        return {"mean": mean, "low": mean, "high": mean, "prompts": 1}
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, means.size, size=(resamples, means.size))
    resampled = means[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(resampled, [tail, 1.0 - tail])
    return {"mean": mean, "low": float(low), "high": float(high), "prompts": int(means.size)}


def pooled_bootstrap(per_seed: list[dict[str, list[float]]], resamples: int = RESAMPLES, level: float = LEVEL,
                     seed: int = SEED) -> dict:
    """{mean, low, high, prompts, seeds, seed_means}: a mean pooled over training seeds and prompts, with a two-level
    percentile bootstrap, for claims that rest on more than one training seed.

    per_seed: for each seed (or each seed pair, for a paired difference), {prompt_id: values}, the same held-out
    prompts for every seed. Each resample draws the seeds with replacement and the prompts with replacement (one
    draw of prompts for all seeds: a hard prompt is hard for every seed) and averages the per-prompt means: the
    interval widens with the seed-to-seed spread as well as with the prompts, where bootstrap() over one seed's
    prompts sees the prompts only. seed_means (each seed's own mean) is the spread to show beside it. With 3
    seeds the seed level has few draws, so the interval is a rough one, and seed_means says how rough."""
    if not per_seed:
        raise ValueError("pooled_bootstrap: no seeds")
    prompts = sorted(per_seed[0])
    if any(sorted(d) != prompts for d in per_seed) or any(not len(d[p]) for d in per_seed for p in prompts):
        raise ValueError("pooled_bootstrap: every seed needs values for the same prompts")
    means = np.array([[float(np.mean(d[p])) for p in prompts] for d in per_seed], dtype=np.float64)  # [seeds, prompts]
    seed_means = [float(m) for m in means.mean(axis=1)]
    rng = np.random.default_rng(seed)
    seeds_drawn = rng.integers(0, means.shape[0], size=(resamples, means.shape[0]))
    prompts_drawn = rng.integers(0, means.shape[1], size=(resamples, means.shape[1]))
    resampled = np.array([means[np.ix_(seeds_drawn[r], prompts_drawn[r])].mean() for r in range(resamples)])
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(resampled, [tail, 1.0 - tail])
    return {"mean": float(means.mean()), "low": float(low), "high": float(high), "prompts": len(prompts),
            "seeds": means.shape[0], "seed_means": seed_means}


def shown(interval: dict, signed: bool = False) -> str:
    """'0.894 [0.865, 0.920]' (signed: '+0.034 [+0.009, +0.061]'): a {mean, low, high} as the tables print it."""
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(interval['mean'])} [{f.format(interval['low'])}, {f.format(interval['high'])}]"


def keyed(prompt_ids, sample_idxs, values) -> dict[tuple[str, int], float | None]:
    """{(prompt_id, sample_idx): value}: the pairing key of a completion across evaluations (None: not scorable,
    kept so that a pairing still sees the completion and leaves it out)."""
    out = {}
    for key, value in zip(zip(prompt_ids, sample_idxs), values):
        if key in out:
            raise ValueError(f"two completions share prompt_id/sample_idx {key}; evaluations pair completions by it")
        out[key] = None if value is None else float(value)
    return out


def _paired(mine: dict, theirs: dict, per_key) -> dict[str, list[float]]:
    missing = set(mine) ^ set(theirs)
    if missing:
        raise ConfigError(f"paired comparison over different completions: {len(missing)} (prompt_id, sample_idx) keys "
                          f"are in one evaluation only, e.g. {sorted(missing)[:3]}; evaluate both on the same "
                          f"prompts with the same eval.num_samples and eval.seed")
    groups = defaultdict(list)
    for key, value in mine.items():
        if value is not None and theirs[key] is not None:  # pair what both sides could score
            groups[key[0]].append(per_key(value, theirs[key]))
    return dict(groups)


def scored_in_both(mine: dict, theirs: dict) -> bool:
    """Whether any completion of two keyed evaluations was scored by both: what a pairing has to go on."""
    return any(value is not None and theirs.get(key) is not None for key, value in mine.items())


def paired_difference(mine: dict, theirs: dict, **kw) -> dict:
    """Mean of (mine - theirs) over paired completions, with its bootstrap interval over prompts."""
    return bootstrap(_paired(mine, theirs, lambda a, b: a - b), **kw)


def paired_win_rate(mine: dict, theirs: dict, **kw) -> dict:
    """P(mine > theirs) over paired completions (ties count 1/2), with its bootstrap interval over prompts."""
    return bootstrap(_paired(mine, theirs, lambda a, b: float(a > b) + 0.5 * float(a == b)), **kw)


def by_prompt(prompt_ids, values) -> dict[str, list[float]]:
    """{prompt_id: its values}, leaving out None (not scorable): a prompt none of whose answers could be scored
    has no entry."""
    groups = defaultdict(list)
    for prompt_id, value in zip(prompt_ids, values):
        if value is not None:
            groups[prompt_id].append(float(value))
    return dict(groups)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def opening(text: str, count: int = OPENING_WORDS) -> str:
    """A completion's first `count` words, lower-cased, punctuation dropped ("" for no words)."""
    return " ".join(words(text)[:count])


def top_opening(texts: list[str], count: int = OPENING_WORDS, empty: bool = True) -> tuple[str, float]:
    """The most common opening and its share of all texts. A text with no words opens with "" and, with `empty`,
    counts like any other opening: a policy that answers everything with nothing has collapsed (share 1.0), not
    spread out. empty=False counts only openings with words (select's cap, select.max_opening_share, limits those)."""
    openings = Counter(o for o in (opening(t, count) for t in texts) if empty or o)
    if not openings:
        return "", 0.0
    text, n = openings.most_common(1)[0]
    return text, n / len(texts)


def ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    """The word n-grams of a text as distinct_n counts them (lower-cased, split on whitespace)."""
    w = text.lower().split()
    return [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]


_SENTENCE_END = re.compile(r"""[.!?:;)\]"'*`]\s*$""")


def mid_sentence_share(texts: list[str]) -> float:
    """The share of texts (with visible text) that do not end on closing punctuation (. ! ? : ; ) ] quotes
    * or a code fence's backtick): a crude "stopped mid-sentence" signal, 0.0 for none."""
    visible = [t for t in texts if t.strip()]
    return sum(not _SENTENCE_END.search(t) for t in visible) / len(visible) if visible else 0.0


def distinct_n(texts: list[str], n: int) -> float | None:
    """Distinct word n-grams / all word n-grams over the texts (None when there are none)."""
    grams = [g for t in texts for g in ngrams(t, n)]
    return len(set(grams)) / len(grams) if grams else None


def pass_at_k(n: int, correct: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n, `correct` of them right, is right):
    1 - C(n - c, k) / C(n, k), the unbiased estimator of pass@k from n >= k samples (Chen et al. 2021)."""
    if not 1 <= k <= n or not 0 <= correct <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n} and 0 <= correct <= n, got correct={correct}")
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def is_verifier(values) -> bool:
    """A score column whose every scored value is 0 or 1: a checker's verdict, where pass@k means something.
    A bool is not a score (True == 1 in Python): a column of them is no verifier's."""
    scored = [v for v in values if v is not None]
    return bool(scored) and all(not isinstance(v, bool) and v in (0, 1) for v in scored)


def normalised_answer(text: str) -> str:
    """A completion's text as compared for "alike": case, surrounding and repeated whitespace ignored, and Unicode's
    canonical forms (NFC: a composed and a decomposed "café" are alike). Not its compatibility forms (NFKC), which
    would make "10²" and "102" one answer."""
    return " ".join(unicodedata.normalize("NFC", text).casefold().split())


VERDICTS = ("better", "not worse", "worse", "undecided")


def verdict(difference: dict, margin: float) -> str:
    """The one rule every comparison in rsft's docs uses, on a paired difference A - B with its 95% interval
    ({mean, low, high}, rsft.stats.paired_difference) and a margin m >= 0 stated before the run:
      better      the interval lies above zero (low > 0);
      not worse   not better, but A is not worse than B by more than m: low > -m (non-inferiority);
      worse       the interval lies below zero (high < 0) and reaches past -m;
      undecided   anything else: the interval spans both -m and 0.
    With m = 0 only better, worse and undecided can come out. "Reaches" and "matches" in the docs mean
    "not worse, within m", with m and the seeds named beside it."""
    if not margin >= 0:  # `not >=` also catches NaN
        raise ValueError(f"margin={margin!r}: expected a number >= 0, stated before the comparison is run")
    low, high = difference["low"], difference["high"]
    if low > 0:
        return "better"
    if low > -margin:
        return "not worse"
    if high < 0:
        return "worse"
    return "undecided"


def paired_over_seeds(a: list[dict[str, list[float]]], b: list[dict[str, list[float]]], margin: float) -> dict:
    """A against B over seed pairs (A's i-th run with B's i-th), each run {prompt_id: values} on the same held-out
    prompts: {"a", "b", "a_minus_b"}, each side pooled over seeds and prompts (pooled_bootstrap) and the paired
    difference of the per-prompt means with its verdict at `margin` (stated before the runs)."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} runs against {len(b)}: pair them seed for seed, one each")
    for i, (mine, theirs) in enumerate(zip(a, b)):
        if mine.keys() != theirs.keys():
            raise ValueError(f"seed pair {i}: the sides evaluated other prompts; evaluate both with the same "
                             f"data.eval_limit, eval.num_samples and eval.seed")
    differences = [{prompt: [statistics.fmean(mine[prompt]) - statistics.fmean(theirs[prompt])] for prompt in mine}
                   for mine, theirs in zip(a, b)]
    pooled = pooled_bootstrap(differences)
    return {"a": pooled_bootstrap(a), "b": pooled_bootstrap(b), "a_minus_b": {**pooled, "verdict": verdict(pooled, margin)}}


def verdict_shown(difference: dict, margin: float) -> str:
    """The verdict with its margin, as a table cell: `not worse (m = 0.03)`."""
    return f"{verdict(difference, margin)} (m = {margin:g})"
