"""Spending best-of-K's sampling budget where it can change the pick: pruning and adaptive K.

Both rules are pure functions of reward scores, shared by the sampler (which acts on them) and by
scripts/replay_budget.py (which replays them on an exhaustive sample set), so a replayed schedule
keeps exactly what sampling with it keeps: every completion has its own generator, so stopping or
never starting some rows does not change the tokens of the others.

Pruning (Speculative Rejection, Sun et al. 2024, arXiv 2410.20290, without its memory-driven
checkpoints): at checkpoints (token counts) every candidate of a prompt is scored and the lowest
ranked live rows are stopped. A candidate's score at checkpoint c:
- a row that emitted EOS within its first c tokens: the score of its finished answer;
- any other row: the score of its first c tokens read as if they were a finished answer (the prefix
  is handed to the full-answer reward model unchanged). That is the rule whatever the row did after
  token c, so the decision does not depend on which rows happened to run ahead in the batch.
Bias: the reward model never saw cut answers in training. A prefix cut mid-sentence tends to score
below a short finished answer of the same quality (the demo's gold, and any reward model that learnt
"finished answers are better", penalise the cut), so `rank_finished=True` (finished answers compete
with prefixes) favours short answers; with `rank_finished=False` the live rows rank among themselves
only (all prefixes of exactly c tokens: no length bias between them) and finished rows never take a
live row's place. scripts/replay_budget.py measures both.

Adaptive K (in the spirit of AdaBoN, arXiv 2505.12050): sample k0 per prompt, then give the rest of
the round's completions, one at a time, to the prompt where one more sample raises the expected best
score the most (`allocate`), under a normal model of each prompt's scores.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

PRUNED = "pruned"  # the finish_reason of a stopped row: a prefix, never a completion


@dataclass(frozen=True)
class PruneSchedule:
    """checkpoints: token counts at which a prompt's candidates are ranked (ascending, >= 1);
    share: the fraction stopped at each checkpoint, in (0, 1); rank_finished: see the module docstring."""

    checkpoints: tuple[int, ...]
    share: float = 0.5
    rank_finished: bool = True

    def check(self, max_new_tokens: int) -> None:
        check_checkpoints(self.checkpoints)
        check_checkpoints_below(self.checkpoints, max_new_tokens)
        check_prune_share(self.share)


# The pruning rules, here once: PruneSchedule.check applies them, and rsft.config applies them to
# sample.prune (each message names its key; the config's keys are those inside the sample group).


def check_checkpoints(checkpoints, key: str = "sample.prune.at") -> None:
    """Token counts >= 1, ascending and distinct: a checkpoint is a number of tokens every row has
    reached, and each one ranks the rows the previous one left."""
    points = list(checkpoints)
    for i, point in enumerate(points):
        if int(point) != point or point < 1:
            raise ValueError(f"{key}[{i}]={point!r}: expected an integer >= 1")
    if points != sorted(set(points)):
        raise ValueError(f"{key}={points}: expected ascending, distinct token counts")


def check_checkpoints_below(checkpoints, max_new_tokens: int, prefix: str = "sample.") -> None:
    """Every checkpoint below max_new_tokens: a row that long has finished, there is nothing to stop."""
    points = list(checkpoints)
    if points and points[-1] >= max_new_tokens:
        raise ValueError(f"{prefix}prune.at={points}: expected checkpoints below {prefix}max_new_tokens="
                         f"{max_new_tokens}")


def check_prune_share(share: float, key: str = "sample.prune.share") -> None:
    """The fraction of a prompt's rows stopped at each checkpoint, in (0, 1): 0 would stop none while the
    reward model still scores every row at every checkpoint (no checkpoints, `prune.at=[]`, is off)."""
    if not 0.0 < share < 1.0:  # `not` also catches NaN
        off = f"{key.removesuffix('share')}at=[] turns pruning off"
        raise ValueError(f"{key}={share!r}: expected a fraction in (0, 1)" + (
            f" (0 stops no row, yet every checkpoint scores every row; {off})" if share == 0 else ""))


def most_stopped(share: float, rows: int, rank_finished: bool) -> int:
    """The most rows one checkpoint can stop among a prompt's `rows` candidates (all of them live):
    rows_to_stop's own count, about floor(share x rows), at least one row kept."""
    return len(rows_to_stop([0.0] * rows, [True] * rows, share, rank_finished))


def check_prune_stops(checkpoints, share: float, rank_finished: bool, rows: int, rows_from: str,
                      prefix: str = "sample.") -> None:
    """A schedule that can stop a row: with `rows` candidates per prompt at most (rows_from says where that
    number comes from) a share below 1/rows stops none at any checkpoint, and neither does one row alone,
    yet each checkpoint still scores every row with the reward model."""
    if most_stopped(share, rows, rank_finished):
        return
    off = f"{prefix}prune.at=[] turns pruning off"
    if rows < 2:
        raise ValueError(f"{prefix}prune.at={list(checkpoints)}: expected [] with one row per prompt ({rows_from}): pruning keeps a "
                         f"prompt's last row, so it would stop none, yet every checkpoint scores every row; {off}")
    raise ValueError(f"{prefix}prune.share={share!r}: expected at least 1/{rows} = {1 / rows:.3g}: a checkpoint "
                     f"stops about share x {rows} rows of a prompt ({rows_from}), so this share stops none, yet "
                     f"every checkpoint scores every row; {off}")


def scored_tokens(token_ids: list[int], finished_by_eos: bool, checkpoint: int) -> tuple[list[int], bool]:
    """What is scored for a candidate at `checkpoint`: (tokens, whether they are a finished answer)."""
    if finished_by_eos and len(token_ids) <= checkpoint:
        return token_ids, True
    return token_ids[:checkpoint], False


def rows_to_stop(scores: list[float], live: list[bool], share: float, rank_finished: bool) -> list[int]:
    """Indices (into scores) of the live candidates to stop at a checkpoint.

    rank_finished: all candidates rank together; the top ceil((1 - share) n) stay (at least one), and
    the live ones below them stop. Otherwise the live ones rank among themselves and the lowest
    floor(share x live) stop, never all of them. Ties keep the lower index."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if rank_finished:
        keep = max(1, math.ceil((1.0 - share) * len(scores) - 1e-9))
        return sorted(i for i in order[keep:] if live[i])
    alive = [i for i in order if live[i]]
    stop = min(math.floor(share * len(alive) + 1e-9), len(alive) - 1)
    return sorted(alive[len(alive) - stop:]) if stop > 0 else []


@dataclass
class Allocation:
    """How many completions each prompt gets (`counts`) and the expected gain of each extra one."""

    counts: list[int]
    gains: list[float] = field(default_factory=list)


def keepable(finish_reason: str, text: str) -> bool:
    """Whether select (with its default filters) could keep a completion: finished by EOS, not empty."""
    return finish_reason == "eos" and bool(text.strip())


def adaptive_counts(scores: list[list[float]], keepable: list[list[bool]], k0: int, mean_budget: float,
                    max_per_prompt: int) -> list[int]:
    """Adaptive K: how many completions each prompt draws in all, having drawn k0 (scores[p] / keepable[p]
    are those of its first k0 that pruning did not stop), when the whole set may draw mean_budget per
    prompt on average and no prompt more than max_per_prompt."""
    extra = max(0, round(mean_budget * len(scores)) - k0 * len(scores))
    return allocate(scores, keepable, extra, max_per_prompt, drawn=[k0] * len(scores)).counts


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def expected_best(current: float, mean: float, sd: float, keep_rate: float, extra: int, points: int = 64) -> float:
    """E[max(current, best keepable score of `extra` new samples)] when a new sample is keepable with
    probability keep_rate and then scores N(mean, sd): current + integral over x > current of
    1 - F(x)^extra, F(x) = 1 - keep_rate + keep_rate Phi((x - mean) / sd) (trapezoid rule)."""
    if extra <= 0 or keep_rate <= 0.0:
        return current
    top = max(current, mean) + 6.0 * sd
    if top <= current:
        return current
    step = (top - current) / points
    total = 0.0
    for j in range(points + 1):
        x = current + j * step
        cdf = 1.0 - keep_rate + keep_rate * _normal_cdf((x - mean) / sd)
        weight = 0.5 if j in (0, points) else 1.0
        total += weight * (1.0 - cdf ** extra)
    return current + total * step


def allocate(scores: list[list[float]], keepable: list[list[bool]], extra: int, max_per_prompt: int,
             prior_weight: float = 2.0, drawn: list[int] | None = None) -> Allocation:
    """Give `extra` more completions to the prompts whose expected best score they raise most.

    scores[p] / keepable[p]: the scores of prompt p's first samples and whether select could keep each
    (finished, not empty); drawn[p]: how many prompt p has drawn (default len(scores[p]); more when
    pruning stopped some, which have no score), what `counts` and max_per_prompt count. Each prompt's scores are modelled as N(mean_p, sd_p), sd_p shrunk toward the
    pooled sd with `prior_weight` pseudo-samples (k0 is small), and a new sample is keepable with the
    prompt's rate, shrunk the same way toward the pooled rate. The current best is the best keepable
    score; a prompt with none counts from mean_p - 2 sd_p, so an empty prompt is filled first. Greedy:
    each extra completion goes to the prompt with the largest marginal gain (gains fall with every one
    a prompt gets), never past max_per_prompt in all. Ties go to the lower prompt index."""
    counts = [len(s) for s in scores] if drawn is None else list(drawn)
    flat = [x for s in scores for x in s]
    if not flat:
        return Allocation(counts)
    pooled_mean = sum(flat) / len(flat)
    pooled_sd = math.sqrt(sum((x - pooled_mean) ** 2 for x in flat) / max(len(flat) - 1, 1)) or 1.0
    flat_keep = [k for ks in keepable for k in ks]
    pooled_rate = sum(flat_keep) / len(flat_keep)
    models = []
    for s, ks in zip(scores, keepable):
        n = len(s)
        mean = sum(s) / n if n else pooled_mean
        var = sum((x - mean) ** 2 for x in s)
        sd = math.sqrt((var + prior_weight * pooled_sd ** 2) / (max(n - 1, 0) + prior_weight))
        rate = (sum(ks) + prior_weight * pooled_rate) / (n + prior_weight)
        kept = [x for x, k in zip(s, ks) if k]
        current = max(kept) if kept else mean - 2.0 * sd
        models.append((current, mean, sd, rate))
    added = [0] * len(scores)

    def gain(p: int) -> float:
        current, mean, sd, rate = models[p]
        return expected_best(current, mean, sd, rate, added[p] + 1) - expected_best(current, mean, sd, rate, added[p])

    # a heap of (-gain, prompt): a prompt's gain changes only when it gets a completion
    heap = [(-gain(p), p) for p in range(len(scores)) if counts[p] < max_per_prompt]
    heapq.heapify(heap)
    gains = []
    while heap and len(gains) < extra:
        negative, p = heapq.heappop(heap)
        gains.append(-negative)
        added[p] += 1
        if counts[p] + added[p] < max_per_prompt:
            heapq.heappush(heap, (-gain(p), p))
    return Allocation([c + a for c, a in zip(counts, added)], gains)
