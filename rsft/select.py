"""stage=select: which scored completions SFT trains on (best-of-K), and best-vs-worst pairs for DPO.

    python -m rsft.run stage=select [round=0] [select.strategy=top_k select.k=1]

Reads round_XX/scored/ (and, with select.pool_rounds, the scored sets of earlier rounds: Llama 2
pooled the best samples of every earlier round); writes round_XX/selected/ and round_XX/pairs/.

Per prompt, in this order:
1. Filters: drop completions with no visible text (drop_empty), cut at max_new_tokens
   (drop_truncated: finish_reason == "length"; teaching the policy to stop mid-sentence is the
   opposite of what we want), identical completions after the first (dedupe, text after strip), and
   completions the reward source could not score (reward None, e.g. a verifier that cannot parse the
   answer: never kept). A prompt with no survivor is logged by id and text and skipped; the stage goes on.
   With loop.refresh_reward each round is scored by its own reward model, whose rewards are on
   another scale: a prompt's candidates compete only with those scored by the same reward model as
   its newest round's (the `reward_model` column), the older ones are dropped (other_reward_model).
2. Ranking: reward (raw; normalising is monotone) high to low; ties are broken by the newer round,
   then by the lower sample index, so the same scored sets always give the same selection.
3. Strategy: `top_k` keeps the first k (k=1 is best-of-K rejection sampling), `threshold` keeps
   every survivor with reward_normalised >= select.threshold, and `random` keeps k survivors drawn
   uniformly with a seed derived from (seed, round, prompt_id): the baseline at the same budget,
   same filters, that shows what the reward model adds.
   The baseline draws from the best tier present (see truncated completions below), as top_k does.
   select.min_reward (off by default) is a hard floor for top_k and threshold: a prompt keeps only
   completions whose reward_normalised reaches it (a verifier's 1.0: only answers it passes), and
   nothing when none does. The random baseline ignores it: the floor is the reward's doing.
4. Collapse levers, off by default. Prompts are visited from the highest best reward down.
   - select.max_opening_share: at most that share of the kept set may open with the same words
     (rsft.stats.opening); a prompt picks among its survivors whose opening is still under the cap,
     and keeps nothing when none is (counted in meta.json: prompts_capped, dropped_opening_cap).
   - select.diversity (top_k only): maximal marginal relevance over the kept set, diverse_choice.
Truncated completions with select.drop_truncated=false stay candidates. By default they rank after
every complete one (select.prefer_complete: a prompt falls back to a cut answer only when it has no
whole one); with select.truncated_penalty they rank by reward_normalised less that penalty. SFT
trains a cut answer without the end of turn (rsft.sft), so it never learns to stop mid-sentence.
meta.json counts the survivors per prompt and the truncated completions kept.
Pairs: the best and the worst survivor of a prompt (skipped when they tie), in TRL's conversational
preference format: prompt = [user message], chosen / rejected = [assistant message].
The reward model decides everything here; the gold oracle is never read.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass

from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from rsft.data import chat_messages
from rsft.errors import ArtifactError, InputError, MissingInput
from rsft.paths import RunPaths
from rsft.runner import Built, Job, Plan
from rsft.stats import ngrams, opening, top_opening
from rsft.store import is_complete, load_dataset_artifact

log = logging.getLogger(__name__)


def candidate_rounds(round_idx: int, pool_rounds: int) -> list[int]:
    """This round and the earlier ones pooled with it, newest first."""
    first = 0 if pool_rounds < 0 else max(0, round_idx - pool_rounds)
    return list(range(round_idx, first - 1, -1))


def load_scored(paths: RunPaths, rounds: list[int]) -> list[dict]:
    rows = []
    for r in rounds:
        path = paths.scored(r)
        ds = load_dataset_artifact(path)
        for column in ("reward", "reward_normalised"):
            if column not in ds.column_names:
                raise ArtifactError(f"{path} has no {column!r} column (columns: {ds.column_names}); it was not written "
                               f"by stage=score: rerun `python -m rsft.run stage=score round={r} overwrite=true`")
        rows.extend(ds.to_list())
    return rows


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


def survivors(candidates: list[dict], select_cfg: DictConfig) -> tuple[list[dict], dict[str, int]]:
    """The filtered, de-duplicated candidates of one prompt in rank order, and what was dropped."""
    newest_model = scored_by(max(candidates, key=lambda c: c["round"]))
    comparable = [c for c in candidates if scored_by(c) == newest_model]
    dropped = {"empty": 0, "truncated": 0, "duplicate": 0, "other_reward_model": len(candidates) - len(comparable)}
    scorable = [c for c in comparable if c["reward"] is not None]  # None: the reward source could not score it
    if len(scorable) < len(comparable):
        dropped["unscorable"] = len(comparable) - len(scorable)
    comparable = scorable
    ranked = sorted(comparable, key=lambda c: (tier(c, select_cfg), -value(c, select_cfg), -c["round"],
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


def preference_pair(ranked: list[dict], system_prompt: str | None) -> dict | None:
    if len(ranked) < 2 or ranked[0]["reward"] == ranked[-1]["reward"]:
        return None
    best, worst = ranked[0], ranked[-1]
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
    """What the selection rule keeps of a round's candidates, and its counts for meta.json."""

    selected: list[dict]
    pairs: list[dict]
    counts: dict
    stats: dict
    starved: list[str]     # prompts with no survivor


def select_rows(rows: list[dict], select_cfg: DictConfig, seed: int, round_idx: int, want_pairs: bool,
                system_prompt: str | None) -> Selection:
    """The selection rule over the scored rows of the pooled rounds (steps 1-4 of the module docstring): a pure
    function of the rows and the select settings, tested without a run directory. Raises InputError when
    nothing is kept (SFT would have nothing to train on)."""
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_prompt[row["prompt_id"]].append(row)
    selected, pairs, starved = [], [], []
    dropped_total = {"empty": 0, "truncated": 0, "duplicate": 0, "other_reward_model": 0, "opening_cap": 0}
    ranked_by_prompt = {}
    for prompt_id, candidates in by_prompt.items():
        ranked, dropped = survivors(candidates, select_cfg)
        for key, n in dropped.items():
            dropped_total[key] = dropped_total.get(key, 0) + n
        if not ranked:
            starved.append(prompt_id)
            log.warning("select: every completion of prompt %s (%r) was filtered out (%s); no example for it",
                        prompt_id, candidates[0]["prompt"][:80], dropped)
            continue
        ranked_by_prompt[prompt_id] = ranked
    cap = opening_cap(select_cfg, sum(len(choose(ranked, select_cfg, seed, round_idx, prompt_id))
                                      for prompt_id, ranked in ranked_by_prompt.items()))
    openings: Counter = Counter()
    capped, kept_grams = [], set()
    diverse = select_cfg.strategy == "top_k" and float(select_cfg.get("diversity", 0.0)) > 0
    # with a cap or diversity, the prompts whose best survivor the reward model likes most choose first
    order = sorted(ranked_by_prompt, key=lambda pid: (-ranked_by_prompt[pid][0]["reward"], pid)) if (
        cap or diverse) else list(ranked_by_prompt)
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
        kept = [c for c in picked if cap is None or claim(openings, opening(c["completion"]), cap)]
        for c in kept:
            kept_grams.update(ngrams(c["completion"], 2))
        dropped_total["opening_cap"] += len(picked) - len(kept)  # a prompt's own k picks count too
        for rank, c in enumerate(kept):
            selected.append({**c, "rank": rank, "num_survivors": len(ranked), "selected_in_round": round_idx})
        pair = preference_pair(ranked, system_prompt) if want_pairs else None
        if pair is not None:
            pairs.append(pair)
    if capped:
        log.info("select: %d prompt(s) kept nothing because every survivor opens like %d kept completions already "
                 "(select.max_opening_share=%s)", len(capped), cap, select_cfg.max_opening_share)

    if cap is not None or diverse:  # the visiting order decides who keeps what, not the order of the output
        position = {prompt_id: i for i, prompt_id in enumerate(by_prompt)}
        selected.sort(key=lambda c: position[c["prompt_id"]])  # stable: ranks stay in order within a prompt
        pairs.sort(key=lambda p: position[p["prompt_id"]])

    survivors_left = [c["reward_normalised"] for ranked in ranked_by_prompt.values() for c in ranked]
    if not selected and select_cfg.strategy == "threshold" and survivors_left:
        raise InputError(f"select kept no completion in round {round_idx}: select.threshold={select_cfg.threshold} is "
                         f"above every surviving completion's reward_normalised (the highest of {len(survivors_left)} "
                         f"is {max(survivors_left):.3f}); SFT would have nothing to train on. Lower select.threshold")
    if not selected and select_cfg.get("min_reward") is not None and survivors_left:
        raise InputError(f"select kept no completion in round {round_idx}: none of the {len(survivors_left)} surviving "
                         f"completions reaches select.min_reward={select_cfg.min_reward} (the highest "
                         f"reward_normalised is {max(survivors_left):.3f}); SFT would have nothing to train on. Lower "
                         f"select.min_reward or sample more (sample.num_samples)")
    if not selected:
        raise InputError(f"select kept no completion in round {round_idx}: all {len(rows)} candidates of "
                         f"{len(by_prompt)} prompts were filtered out ({dropped_total}); SFT would have nothing "
                         f"to train on. Try select.drop_truncated=false or a larger sample.max_new_tokens")
    survivor_counts = [len(v) for v in ranked_by_prompt.values()] + [0] * len(starved)
    counts = {
        "candidates": len(rows), "prompts": len(by_prompt), "selected": len(selected), "pairs": len(pairs),
        "prompts_without_survivors": len(starved), "prompts_capped": len(capped),
        "prompts_kept": len({c["prompt_id"] for c in selected}),
        "survivors_per_prompt_mean": sum(survivor_counts) / max(len(survivor_counts), 1),
        "selected_truncated": sum(c["finish_reason"] == "length" for c in selected),
        **{f"dropped_{k}": v for k, v in dropped_total.items()},
    }
    scored = [c["reward"] for c in rows if c["reward"] is not None]
    stats = {
        "selected_reward_mean": sum(c["reward"] for c in selected) / len(selected),
        "candidate_reward_mean": sum(scored) / max(len(scored), 1),
        "acceptance_fraction": len(selected) / len(rows),
    }
    return Selection(selected, pairs, counts, stats, starved)


EMPTY_PAIRS = ("prompt_id", "prompt", "chosen", "rejected", "chosen_reward", "rejected_reward",
               "chosen_reward_normalised", "rejected_reward_normalised")


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    round_idx = int(cfg.round)
    rounds = candidate_rounds(round_idx, int(cfg.select.pool_rounds))
    for r in rounds:
        if not is_complete(paths.scored(r)):
            raise MissingInput(f"select needs round {r}'s scored samples at {paths.scored(r)}; run "
                               f"`python -m rsft.run stage=score round={r}` first")
    outputs, names = [paths.selected(round_idx)], ["select"]
    if cfg.select.pairs:
        outputs, names = outputs + [paths.pairs(round_idx)], names + ["select (pairs)"]
    return Plan(outputs=outputs, inputs=[paths.scored(r) for r in rounds], names=names)


def build(cfg: DictConfig, job: Job) -> Built:
    select_cfg, round_idx, want_pairs = cfg.select, int(cfg.round), bool(cfg.select.pairs)
    rounds = candidate_rounds(round_idx, int(select_cfg.pool_rounds))
    rows = load_scored(job.paths, rounds)
    samples_per_prompt = max(Counter(row["prompt_id"] for row in rows).values(), default=0)
    if want_pairs and samples_per_prompt < 2:
        raise InputError(f"select.pairs=true needs at least 2 completions per prompt, but the scored samples of "
                         f"rounds {rounds} have {samples_per_prompt} (sample.num_samples=1?); "
                         f"set select.pairs=false or sample.num_samples >= 2")
    chosen = select_rows(rows, select_cfg, int(cfg.seed), round_idx, want_pairs, cfg.data.get("system_prompt"))
    top, share = top_opening([c["completion"] for c in chosen.selected])
    stats = {**chosen.stats, "top_opening_share": share}
    if want_pairs and job.paths.dpo:  # only the data can tell; say so before SFT runs, naming the setting
        margin = float(cfg.dpo.min_margin)
        if not any(p["chosen_reward_normalised"] - p["rejected_reward_normalised"] >= margin for p in chosen.pairs):
            raise InputError(f"select: none of round {round_idx}'s {len(chosen.pairs)} best-vs-worst pairs has a "
                             f"normalised reward gap >= dpo.min_margin={cfg.dpo.min_margin}, so loop.dpo would have "
                             f"nothing to train on; lower dpo.min_margin or set loop.dpo=false")
    meta = {"stage": "select", "round": round_idx, "rounds_pooled": rounds, "counts": chosen.counts, "stats": stats,
            "top_opening": top, "prompts_without_survivors": chosen.starved,
            "settings": OmegaConf.to_container(select_cfg, resolve=True)}
    log.info("select (%s): kept %d of %d completions over %d prompts, %d pairs", select_cfg.strategy,
             len(chosen.selected), len(rows), chosen.counts["prompts"], len(chosen.pairs))
    outputs = [(meta, lambda tmp: Dataset.from_list(chosen.selected).save_to_disk(str(tmp)))]
    if want_pairs:
        pairs = Dataset.from_list(chosen.pairs) if chosen.pairs else Dataset.from_dict({k: [] for k in EMPTY_PAIRS})
        # an empty set saved with 0 shards cannot be loaded
        outputs.append(({**meta, "stage": "select (pairs)"}, lambda tmp: pairs.save_to_disk(str(tmp), num_shards=1)))
    metrics = {**{f"select/{k}": v for k, v in chosen.counts.items()}, **{f"select/{k}": v for k, v in stats.items()}}
    return Built(outputs, metrics, step=round_idx)
