"""The selection rule, a service below stage=select and stage=online: which of a prompt's scored candidates are
kept (best-of-K), and each prompt's best-vs-worst pair. Pure functions over rows (dicts with prompt_id, prompt,
completion, finish_reason, reward, reward_normalised, round, sample_idx), tested without a run directory; the
rule itself, step by step, is told in rsft.select's docstring. The reward decides everything here; the gold
oracle is never read.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import statistics
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from rsft.data import chat_messages
from rsft.errors import InputError
from rsft.stats import ngrams, normalised_answer, opening, top_opening

log = logging.getLogger(__name__)


def scored_by(row: dict) -> str:
    """Which reward model scored a row: the `reward_model` column stage=score writes (relative to the run
    directory); a scored set written before that column existed was scored by the run's reward/."""
    return row.get("reward_model") or "reward"


def is_cut(row: dict) -> bool:
    return row["finish_reason"] == "length"


def tier(row: dict, select_cfg: DictConfig) -> int:
    """1 for a truncated completion that ranks after every complete one (drop_truncated=false,
    truncated_penalty=null, prefer_complete=true), else 0: a lower tier always ranks first."""
    cut_last = (not select_cfg.drop_truncated and select_cfg.get("truncated_penalty") is None
                and bool(select_cfg.get("prefer_complete", True)))
    return int(cut_last and is_cut(row))


def penalised(row: dict, select_cfg: DictConfig) -> float:
    """reward_normalised less select.truncated_penalty for a truncated completion (in the reward model's
    std units), when that penalty applies (drop_truncated=false)."""
    penalty = select_cfg.get("truncated_penalty")
    cut = penalty is not None and not select_cfg.drop_truncated and is_cut(row)
    return row["reward_normalised"] - (float(penalty) if cut else 0.0)


def value(row: dict, select_cfg: DictConfig) -> float:
    """What ranks a prompt's candidates within a tier: the raw reward, or with a truncation penalty that
    applies, `penalised`."""
    if select_cfg.get("truncated_penalty") is None or select_cfg.drop_truncated:
        return row["reward"]
    return penalised(row, select_cfg)


def comparable(candidates: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """The candidates of one prompt that compete (scored, by the reward model of its newest round), and what was
    dropped for it."""
    newest_model = scored_by(max(candidates, key=lambda c: c["round"]))
    same_model = [c for c in candidates if scored_by(c) == newest_model]
    dropped = {"empty": 0, "truncated": 0, "duplicate": 0, "other_reward_model": len(candidates) - len(same_model)}
    scorable = [c for c in same_model if c["reward"] is not None]  # None: the reward source could not score it
    if len(scorable) < len(same_model):
        dropped["unscorable"] = len(same_model) - len(scorable)
    return scorable, dropped


def answer_counts(rows: list[dict]) -> Counter:
    """How many of `rows` gave each text, case and spacing aside (rsft.stats.normalised_answer)."""
    return Counter(normalised_answer(c["completion"]) for c in rows)


def rarity_weights(kept: list[dict], counts: Counter, scale: str = "row") -> list[float]:
    """select.weight=rarity: each kept row's weight 1 / how many candidates gave its text; within a prompt a rare
    answer counts more than a common one. select.weight_scale says what the prompt's kept rows weigh together:
    `row`, they average 1 (a prompt with n kept rows weighs n, as without the lever); `prompt`, they sum to 1
    (every prompt weighs one row, as with k=1, so one with many right answers does not outweigh a hard one)."""
    inverse = [1.0 / counts[normalised_answer(c["completion"])] for c in kept]
    total = sum(inverse) / (len(inverse) if scale == "row" else 1)
    return [w / total for w in inverse]


def difficulty_weights(group: list[dict], kept: list[dict], min_reward: float) -> list[float]:
    """select.weight=difficulty, before scaling: each kept row's share of its prompt's candidates from the same
    round (the samples it was drawn among) whose reward_normalised is below min_reward, or has none."""
    by_round: dict[Any, list[bool]] = {}
    for c in group:
        value = c.get("reward_normalised")
        by_round.setdefault(c.get("round"), []).append(value is None or value < min_reward)
    return [sum(by_round[row.get("round")]) / len(by_round[row.get("round")]) for row in kept]


def advantage_weights(group: list[dict], kept: list[dict], select_cfg: DictConfig) -> list[float]:
    """select.strategy=advantage, before scaling: each kept row's reward less the mean reward of its prompt's scored
    candidates from the same round (the samples it was drawn among: the baseline of a policy gradient), divided by
    their number. With select.dedupe a kept text stands for each of its copies, so its weight is the sum over the
    copies: the gradient of one row weighted so is the gradient of the copies. Over a round's candidates the
    weights sum to 0: what the right answers gain, the wrong ones lose, and a token every answer shares is left
    alone, where SFT on the right answers alone sharpens it too. 0 for a prompt whose candidates all tie. With
    select.advantage_scale=std each difference is also divided by the standard deviation of those rewards (Bessel's,
    as GRPO's scale_rewards=group), so every prompt that is not tied pushes alike."""
    scored, _ = comparable(group)
    by_round: dict[Any, list[float]] = {}
    for c in scored:
        by_round.setdefault(c.get("round"), []).append(float(c["reward"]))
    by_std = select_cfg.get("advantage_scale", "none") == "std"
    baseline = {r: (sum(v) / len(v), len(v), spread(v) if by_std else 1.0) for r, v in by_round.items()}

    def own(c: dict) -> float:
        mean, n, scale = baseline[c.get("round")]
        return (float(c["reward"]) - mean) / n / scale if scale > 0 else 0.0

    if not select_cfg.dedupe:
        return [own(c) for c in kept]
    copies: dict[str, float] = {}
    for c in scored:  # every copy of a kept text, the dropped ones too
        copies[c["completion"].strip()] = copies.get(c["completion"].strip(), 0.0) + own(c)
    return [copies[c["completion"].strip()] for c in kept]


def spread(values: list[float]) -> float:
    """The sample standard deviation (Bessel's), 0 for fewer than two values or a tie."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def moves(weight: float) -> bool:
    """An advantage weight that is not 0 up to rounding (a prompt whose candidates tie gives 0)."""
    return abs(weight) > 1e-12


def survivors(candidates: list[dict], select_cfg: DictConfig) -> tuple[list[dict], dict[str, int]]:
    """The filtered, de-duplicated candidates of one prompt in rank order, and what was dropped."""
    comparable_rows, dropped = comparable(candidates)
    alike = answer_counts(comparable_rows) if select_cfg.get("rarity") else None
    ranked = sorted(comparable_rows, key=lambda c: (tier(c, select_cfg), -value(c, select_cfg),
                                               alike[normalised_answer(c["completion"])] if alike else 0, -c["round"],
                                               c["sample_idx"]))
    kept, seen = [], set()
    for c in ranked:
        text = c["completion"].strip()
        if select_cfg.drop_empty and not text:
            dropped["empty"] += 1
        elif select_cfg.drop_truncated and c["finish_reason"] == "length":
            dropped["truncated"] += 1
        elif select_cfg.dedupe and text in seen:
            dropped["duplicate"] += 1
        else:
            seen.add(text)
            kept.append(c)
    return kept, dropped


def opening_cap(select_cfg: DictConfig, keepable: int) -> int | None:
    """How many kept completions may share an opening (rsft.stats.opening): select.max_opening_share of
    what the strategy would keep without a cap, at least 1; None = no cap."""
    share = select_cfg.get("max_opening_share")
    if share is None:
        return None
    return max(1, math.floor(float(share) * keepable))


def claim(openings: Counter, key: str, cap: int) -> bool:
    """Count one more kept completion with this opening, unless `cap` already have it ("" never counts)."""
    if key and openings[key] >= cap:
        return False
    if key:
        openings[key] += 1
    return True


def prompt_rng(seed: int, round_idx: int, prompt_id: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}/{round_idx}/{prompt_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def passes(row: dict, select_cfg: DictConfig) -> bool:
    """select.min_reward as a hard filter of the reward's strategies: reward_normalised at least it (a
    verifier's pass: 1.0 keeps only answers it passes, RFT / STaR style); every row when it is unset."""
    floor = select_cfg.get("min_reward")
    return floor is None or row["reward_normalised"] >= float(floor)


def choose(ranked: list[dict], select_cfg: DictConfig, seed: int, round_idx: int, prompt_id: str) -> list[dict]:
    if select_cfg.strategy == "top_k":
        return [c for c in ranked if passes(c, select_cfg)][: int(select_cfg.k)]
    if select_cfg.strategy == "threshold":
        return [c for c in ranked if c["reward_normalised"] >= float(select_cfg.threshold) and passes(c, select_cfg)]
    # the baseline draws from the best tier present, as top_k does: only the reward's part of the ranking is left out
    pool = [c for c in ranked if tier(c, select_cfg) == tier(ranked[0], select_cfg)]
    picked = prompt_rng(seed, round_idx, prompt_id).sample(range(len(pool)), min(int(select_cfg.k), len(pool)))
    return [pool[i] for i in sorted(picked)]


def diverse_choice(ranked: list[dict], select_cfg: DictConfig, kept_grams: set) -> list[dict]:
    """top_k with select.diversity = lam > 0: pick k one at a time, each time the candidate of the best
    tier with the highest reward_normalised (less the truncation penalty) - lam x the share of its
    distinct word bigrams that the kept set (kept_grams: its bigrams) or this prompt's earlier picks
    already have. Maximal marginal relevance (Carbonell & Goldstein 1998) over the whole kept set, so a
    prompt whose best answer repeats what other prompts kept gives way to its next-best one."""
    lam = float(select_cfg.diversity)
    remaining, picked, seen = [c for c in ranked if passes(c, select_cfg)], [], set(kept_grams)
    while remaining and len(picked) < int(select_cfg.k):
        def score(c):
            grams = set(ngrams(c["completion"], 2))
            overlap = len(grams & seen) / len(grams) if grams else 1.0
            return penalised(c, select_cfg) - lam * overlap
        best_tier = min(tier(c, select_cfg) for c in remaining)
        c = max((c for c in remaining if tier(c, select_cfg) == best_tier), key=score)  # ties: the higher rank
        remaining.remove(c)
        picked.append(c)
        seen.update(ngrams(c["completion"], 2))
    return picked


def pair_ends(ranked: list[dict], select_cfg: DictConfig) -> tuple[dict, dict] | None:
    """A prompt's preference pair from its ranked survivors (`survivors`): the best of them against the last in
    rank (select.rejected=pool), or against the last in rank of those drawn in the prompt's newest round
    (select.rejected=newest_round); None when fewer than two survive or the two tie in reward. newest_round is for
    pooled rounds (select.pool_rounds): there the pool's last is most often an earlier policy's answer (a
    verifier's wrong answers all tie, older rounds rank after newer ones, and a cut answer ranks after every whole
    one: on the verifiable task 60 of 89 rejected answers were the initial policy's cut rambles), while iterative
    DPO pairs each round's own samples, the mistakes the policy still makes. Measured on the verifiable task
    (docs/diversity.md, GEM then DPO) it did not raise pass@1 over the pool rule, so pool stays the default.
    Without pooling the two are the same."""
    if len(ranked) < 2:
        return None
    if select_cfg.get("rejected", "pool") == "newest_round":
        newest = max(c["round"] for c in ranked)
        worst = [c for c in ranked if c["round"] == newest][-1]
    else:
        worst = ranked[-1]
    if worst["reward"] == ranked[0]["reward"]:  # ranked[0] itself too
        return None
    return ranked[0], worst


def preference_pair(ranked: list[dict], select_cfg: DictConfig, system_prompt: str | None) -> dict | None:
    ends = pair_ends(ranked, select_cfg)
    if ends is None:
        return None
    best, worst = ends
    return {
        "prompt_id": best["prompt_id"],
        "prompt": chat_messages(best["prompt"], system_prompt),
        "chosen": [{"role": "assistant", "content": best["completion"]}],
        "rejected": [{"role": "assistant", "content": worst["completion"]}],
        "chosen_reward": best["reward"],
        "rejected_reward": worst["reward"],
        "chosen_reward_normalised": best["reward_normalised"],  # for the DPO stage's margin filter
        "rejected_reward_normalised": worst["reward_normalised"],
    }


@dataclass
class Selection:
    """What the selection rule keeps of a round's candidates (which of each prompt's ranked survivors), and its
    counts for meta.json; the rows themselves are read again when they are written (selected_rows, pair_rows)."""

    kept: dict[Any, list[int]]  # prompt id -> the indices of its kept survivors in its ranked survivors, in order
    counts: dict
    stats: dict
    starved: list[str]     # prompts with no survivor
    top_opening: tuple[str, float]
    largest_pair_gap: float | None  # the largest reward_normalised gap of a pair (dpo.min_margin's check)


SLIM = ("prompt_id", "reward", "reward_normalised", "finish_reason", "completion", "round")  # what decides, and pairs


def _with_levers(select_cfg: DictConfig) -> tuple[bool, bool]:
    """(an opening cap, diversity): the levers that make one prompt's choice depend on the other prompts'."""
    cap = select_cfg.get("max_opening_share") is not None
    return cap, select_cfg.strategy == "top_k" and float(select_cfg.get("diversity", 0.0)) > 0


def pair_gap(ranked: list[dict], select_cfg: DictConfig) -> float | None:
    """The reward_normalised gap of the prompt's preference pair (pair_ends), None when it has none."""
    ends = pair_ends(ranked, select_cfg)
    return None if ends is None else ends[0]["reward_normalised"] - ends[1]["reward_normalised"]


class _Tally:
    """The counts and statistics of what is kept, added a prompt at a time in the order of the output."""

    def __init__(self):
        self.rewards, self.texts = array("d"), []
        self.truncated = self.prompts = 0
        self.pairs, self.largest_gap = 0, None

    def keep(self, rows: list[dict]) -> None:
        self.rewards.extend(c["reward"] for c in rows)
        self.texts += [c["completion"] for c in rows]
        self.truncated += sum(c["finish_reason"] == "length" for c in rows)
        self.prompts += bool(rows)

    def pair(self, ranked: list[dict], select_cfg: DictConfig) -> None:
        gap = pair_gap(ranked, select_cfg)
        if gap is not None:
            self.pairs += 1
            self.largest_gap = gap if self.largest_gap is None else max(self.largest_gap, gap)


def select_groups(groups: Callable[[], Iterable[tuple[Any, list[dict]]]], candidate_rewards: Sequence[float],
                  select_cfg: DictConfig, seed: int, round_idx: int, want_pairs: bool) -> Selection:
    """The selection rule over each prompt's candidates (steps 1-4 of the module docstring): a pure function of
    the groups (`groups()`: (prompt id, candidates) of every prompt, in order) and the select settings, tested
    without a run directory. candidate_rewards: every candidate's reward that is not None, in row order.
    Without the levers each prompt is decided as it is read and only its choice is kept; with them every
    prompt's ranked survivors (the fields that decide, SLIM) are kept until all are read. Raises InputError
    when nothing is kept (SFT would have nothing to train on)."""
    cap_on, diverse = _with_levers(select_cfg)
    starved, kept, ranked_by_prompt, tally = [], {}, {}, _Tally()
    dropped_total = {"empty": 0, "truncated": 0, "duplicate": 0, "other_reward_model": 0, "opening_cap": 0}
    candidates = prompts = survivors_left = would_keep = 0
    best_left = float("-inf")
    for prompt_id, group in groups():
        candidates, prompts = candidates + len(group), prompts + 1
        ranked, dropped = survivors(group, select_cfg)
        for key, n in dropped.items():
            dropped_total[key] = dropped_total.get(key, 0) + n
        if not ranked:
            starved.append(prompt_id)
            log.warning("select: every completion of prompt %s (%r) was filtered out (%s); no example for it",
                        prompt_id, group[0]["prompt"][:80], dropped)
            continue
        survivors_left += len(ranked)
        best_left = max(best_left, *(c["reward_normalised"] for c in ranked))
        if select_cfg.strategy == "advantage":
            picked = [c for c, w in zip(ranked, advantage_weights(group, ranked, select_cfg)) if moves(w)]
        else:
            picked = choose(ranked, select_cfg, seed, round_idx, prompt_id)
        if cap_on or diverse:
            ranked_by_prompt[prompt_id] = [{**{k: c[k] for k in SLIM}, "index": i} for i, c in enumerate(ranked)]
            would_keep += len(picked)
            continue
        where = {id(c): i for i, c in enumerate(ranked)}
        kept[prompt_id] = [where[id(c)] for c in picked]
        tally.keep(picked)
        if want_pairs:
            tally.pair(ranked, select_cfg)
    capped = []
    if cap_on or diverse:
        kept, capped = _choose_with_levers(ranked_by_prompt, select_cfg, seed, round_idx, would_keep, dropped_total)
        for prompt_id, ranked in ranked_by_prompt.items():  # the output's order: the prompts' own
            if prompt_id in kept:
                tally.keep([ranked[i] for i in kept[prompt_id]])
                if want_pairs:
                    tally.pair(ranked, select_cfg)
    if not tally.rewards and select_cfg.strategy == "threshold" and survivors_left:
        raise InputError(f"select kept no completion in round {round_idx}: select.threshold={select_cfg.threshold} is "
                         f"above every surviving completion's reward_normalised (the highest of {survivors_left} "
                         f"is {best_left:.3f}); SFT would have nothing to train on. Lower select.threshold")
    if not tally.rewards and select_cfg.strategy == "advantage" and survivors_left:
        raise InputError(f"select kept no completion in round {round_idx}: with select.strategy=advantage a row is "
                         f"kept when its reward differs from its prompt's mean, and every one of the {prompts} "
                         f"prompts' {survivors_left} surviving completions ties with its prompt's others (all right "
                         f"or all wrong); SFT would have nothing to train on. Sample more (sample.num_samples) or "
                         f"use select.strategy=top_k")
    if not tally.rewards and select_cfg.get("min_reward") is not None and survivors_left:
        raise InputError(f"select kept no completion in round {round_idx}: none of the {survivors_left} surviving "
                         f"completions reaches select.min_reward={select_cfg.min_reward} (the highest "
                         f"reward_normalised is {best_left:.3f}); SFT would have nothing to train on. Lower "
                         f"select.min_reward or sample more (sample.num_samples)")
    if not tally.rewards:
        raise InputError(f"select kept no completion in round {round_idx}: all {candidates} candidates of "
                         f"{prompts} prompts were filtered out ({dropped_total}); SFT would have nothing "
                         f"to train on. Try select.drop_truncated=false or a larger sample.max_new_tokens")
    selected = len(tally.rewards)
    counts = {
        "candidates": candidates, "prompts": prompts, "selected": selected, "pairs": tally.pairs,
        "prompts_without_survivors": len(starved), "prompts_capped": len(capped),
        "prompts_kept": tally.prompts,
        "survivors_per_prompt_mean": survivors_left / max(prompts, 1),
        "selected_truncated": tally.truncated,
        **{f"dropped_{k}": v for k, v in dropped_total.items()},
    }
    stats = {
        "selected_reward_mean": sum(tally.rewards) / selected,
        "candidate_reward_mean": sum(candidate_rewards) / max(len(candidate_rewards), 1),
        "acceptance_fraction": selected / candidates,
    }
    return Selection(kept, counts, stats, starved, top_opening(tally.texts, empty=False), tally.largest_gap)


def _choose_with_levers(ranked_by_prompt: dict[Any, list[dict]], select_cfg: DictConfig, seed: int, round_idx: int,
                        would_keep: int, dropped_total: dict) -> tuple[dict[Any, list[int]], list]:
    """Step 4 (the opening cap, diversity) over every prompt's ranked survivors: prompts whose best survivor the
    reward model likes most choose first. Returns (prompt id -> its kept survivors' indices, the prompts capped)."""
    cap = opening_cap(select_cfg, would_keep)
    openings: Counter = Counter()
    capped, kept_grams, kept = [], set(), {}
    _, diverse = _with_levers(select_cfg)
    order = sorted(ranked_by_prompt, key=lambda pid: (-ranked_by_prompt[pid][0]["reward"], pid))
    for prompt_id in order:
        ranked = ranked_by_prompt[prompt_id]
        allowed = ranked if cap is None else [c for c in ranked if not opening(c["completion"])
                                               or openings[opening(c["completion"])] < cap]
        dropped_total["opening_cap"] += len(ranked) - len(allowed)
        if not allowed:
            capped.append(prompt_id)
            continue
        picked = (diverse_choice(allowed, select_cfg, kept_grams) if diverse
                  else choose(allowed, select_cfg, seed, round_idx, prompt_id))
        chosen = [c for c in picked if cap is None or claim(openings, opening(c["completion"]), cap)]
        for c in chosen:
            kept_grams.update(ngrams(c["completion"], 2))
        dropped_total["opening_cap"] += len(picked) - len(chosen)  # a prompt's own k picks count too
        kept[prompt_id] = [c["index"] for c in chosen]
    if capped:
        log.info("select: %d prompt(s) kept nothing because every survivor opens like %d kept completions already "
                 "(select.max_opening_share=%s)", len(capped), cap, select_cfg.max_opening_share)
    return kept, capped


def selected_rows(groups: Callable[[], Iterable[tuple[Any, list[dict]]]], selection: Selection,
                  select_cfg: DictConfig, round_idx: int) -> Iterator[dict]:
    """The kept rows, every column of the scored set and the selection's own (rank among what the prompt kept,
    its number of survivors, the round), prompt by prompt in the prompts' order: the survivors are ranked again
    from the candidates (the same rule, the same order) and the kept ones taken by their index. With
    select.weight each row also carries its SFT loss weight (`weight`: rarity_weights, or difficulty_weights scaled
    so that every kept row averages 1, which takes a first pass over the groups; when every kept prompt was solved
    every time, every row weighs 1: nothing tells them apart). With select.strategy=advantage the weight is
    advantage_weights times one scale for the whole set, such that the positive weights sum to the number of prompts
    kept: each prompt pushes its better answers up by one row's worth on average, as top_k with k=1 does, and its
    worse ones down by as much (negative weights); select.advantage_positive then multiplies the positive weights
    alone (W-REINFORCE's lambda), leaving the push down as it was."""
    kind = "advantage" if select_cfg.strategy == "advantage" else select_cfg.get("weight", "none")

    def kept_of(prompt_id, group) -> tuple[list[dict], list[dict]]:  # (its ranked survivors, the kept ones)
        ranked, _ = survivors(group, select_cfg)
        return ranked, [ranked[i] for i in selection.kept[prompt_id]]

    difficulty, scale = {}, 1.0
    if kind == "difficulty":  # the raw weights of every kept row first: their mean scales them all
        difficulty = {prompt_id: difficulty_weights(group, kept_of(prompt_id, group)[1], select_cfg.min_reward)
                      for prompt_id, group in groups() if prompt_id in selection.kept}
        raw = [w for weights in difficulty.values() for w in weights]
        scale = len(raw) / sum(raw) if sum(raw) > 0 else None
        if scale is None:
            log.info("select: every kept row's prompt passed every sample of its round: select.weight=difficulty "
                     "weighs every row 1")
    if kind == "advantage":  # one scale for every row: the right answers' weights sum to the prompts kept
        advantage = {prompt_id: advantage_weights(group, kept_of(prompt_id, group)[1], select_cfg)
                     for prompt_id, group in groups() if prompt_id in selection.kept}
        pushed_up = sum(w for weights in advantage.values() for w in weights if w > 0)
        if pushed_up <= 0:  # the filters (drop_truncated, drop_empty) dropped every answer above its prompt's mean
            raise InputError(f"select.strategy=advantage in round {round_idx}: every kept row's reward is below its "
                             f"prompt's mean, so SFT would only push answers down; the better answers were dropped "
                             f"by select.drop_truncated={select_cfg.drop_truncated} or select.drop_empty="
                             f"{select_cfg.drop_empty}: keep them (e.g. select.drop_truncated=false)")
        scale = sum(1 for weights in advantage.values() if weights) / pushed_up
    for prompt_id, group in groups():
        if prompt_id in selection.kept:
            ranked, kept = kept_of(prompt_id, group)
            weights = None
            if kind == "advantage" and kept:  # select.advantage_positive cuts the push up, after the scale
                positive = float(select_cfg.get("advantage_positive", 1.0))
                weights = [w * scale * (positive if w > 0 else 1.0) for w in advantage[prompt_id]]
            elif kind == "rarity" and kept:
                weights = rarity_weights(kept, answer_counts(comparable(group)[0]),
                                         select_cfg.get("weight_scale", "row"))
            elif kind == "difficulty" and kept:
                weights = [w * scale if scale is not None else 1.0 for w in difficulty[prompt_id]]
            for rank, row in enumerate(kept):
                yield {**row, "rank": rank, "num_survivors": len(ranked), "selected_in_round": round_idx,
                       **({"weight": weights[rank]} if weights else {})}


def pair_rows(groups: Callable[[], Iterable[tuple[Any, list[dict]]]], selection: Selection, select_cfg: DictConfig,
              system_prompt: str | None) -> Iterator[dict]:
    """The preference pairs of the prompts that kept a choice (a starved or capped prompt gives none), in order."""
    for prompt_id, group in groups():
        if prompt_id in selection.kept:
            pair = preference_pair(survivors(group, select_cfg)[0], select_cfg, system_prompt)
            if pair is not None:
                yield pair


def kept_of_batch(cfg: DictConfig, candidates: list[dict], batch: int) -> list[dict]:
    """The select group's rule over a mini-batch's scored candidates (stage=online), each row with its `weight` where
    select.weight or select.strategy=advantage gives one (selected_rows); [] when it keeps nothing."""
    by_prompt: dict = {}
    for row in candidates:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    groups = lambda: iter(by_prompt.items())  # the rule reads the groups twice: decide, then take
    try:
        chosen = select_groups(groups, [r["reward"] for r in candidates if r["reward"] is not None], cfg.select,
                               cfg.seed, batch, want_pairs=False)
        return list(selected_rows(groups, chosen, cfg.select, batch))
    except InputError as error:  # nothing kept (or, with strategy=advantage, nothing to push up): no step
        log.warning("online: mini-batch %d keeps nothing (%s); no optimiser step", batch, error)
        return []


def best_and_worst(cfg: DictConfig, candidates: list[dict]) -> list[tuple[dict, dict]]:
    """Each prompt's preference pair by the select group's ranking (pair_ends of `survivors`), where best and
    worst differ in reward: stage=select's pairs, of a mini-batch (stage=online)."""
    by_prompt: dict = {}
    for row in candidates:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    ends = (pair_ends(survivors(group, cfg.select)[0], cfg.select) for group in by_prompt.values())
    return [pair for pair in ends if pair is not None]
