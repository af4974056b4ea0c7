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
   then by the lower sample index, so the same scored sets always give the same selection. With
   select.rarity (a collapse lever, off by default) a tie is first broken by how many of the prompt's
   candidates (every pooled round's) gave the same text, case and spacing aside, fewest first: of a
   verifier's right answers, the rarest is kept first. With select.weight=rarity (also off by default) each
   kept row carries an SFT loss weight, 1 / that count scaled to average 1 over the prompt's kept rows (or,
   with select.weight_scale=prompt, to sum to 1, so each prompt weighs one row whatever it kept), so of
   several kept right answers a rare one counts more than a common one (rsft.sft reads the `weight` column).
   With select.weight=difficulty a kept row weighs the share of its prompt's samples in its round that fall
   below select.min_reward, scaled to average 1 over the kept set: a prompt solved every time weighs 0.
3. Strategy: `top_k` keeps the first k (k=1 is best-of-K rejection sampling), `threshold` keeps
   every survivor with reward_normalised >= select.threshold, and `random` keeps k survivors drawn
   uniformly with a seed derived from (seed, round, prompt_id): the baseline at the same budget,
   same filters, that shows what the reward model adds.
   The baseline draws from the best tier present (see truncated completions below), as top_k does.
   `advantage` (a collapse lever, issue 48) keeps every survivor whose reward differs from its prompt's
   mean in its round, the worse answers too, each with an SFT loss weight (reward - mean) / samples, a
   text's copies summed, scaled so that the positive weights sum to the prompts kept: the better answers
   are pushed up, the worse ones down (a negative weight), a policy gradient with the prompt's mean for
   baseline (rsft.best_of_k.advantage_weights); k and min_reward do not apply.
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
Pairs: the best and the worst survivor of a prompt (skipped when they tie; with select.rejected=newest_round the
worst of those drawn in its newest round: rsft.best_of_k.pair_ends), in TRL's conversational preference format:
prompt = [user message], chosen / rejected = [assistant message].
The reward model decides everything here; the gold oracle is never read. The rule is rsft.best_of_k's pure
functions (stage=online selects each mini-batch with them too); this module reads and writes the artifacts.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from rsft.errors import ArtifactError, InputError, MissingInput
from rsft.paths import RunPaths
from rsft.rows import ArtifactRows, write_rows
from rsft.runner import Built, Job, Plan
from rsft.best_of_k import pair_rows, select_groups, selected_rows
from rsft.store import is_complete, load_dataset_artifact

log = logging.getLogger(__name__)


def candidate_rounds(round_idx: int, pool_rounds: int) -> list[int]:
    """This round and the earlier ones pooled with it, newest first."""
    first = 0 if pool_rounds < 0 else max(0, round_idx - pool_rounds)
    return list(range(round_idx, first - 1, -1))


def load_scored(paths: RunPaths, rounds: list[int]) -> ArtifactRows:
    """The scored sets of the pooled rounds (newest first), checked, as rows read from their files."""
    for r in rounds:
        path = paths.scored(r)
        columns = load_dataset_artifact(path).column_names
        for column in ("reward", "reward_normalised"):
            if column not in columns:
                raise ArtifactError(f"{path} has no {column!r} column (columns: {columns}); it was not written "
                                    f"by stage=score: rerun `python -m rsft.run stage=score round={r} overwrite=true`")
    return ArtifactRows([paths.scored(r) for r in rounds])


@dataclass
class PromptGroups:
    """The candidates of each prompt, prompts in the order they first appear (the newest round's first), each
    prompt's rows in the order they were read; fetched from the files a few thousand rows at a time, so that
    only those rows are Python objects at a time. Built by one pass over the rows (index): the rows' positions
    grouped by prompt (a stable sort of each row's prompt number), and the candidates' rewards in row order."""

    rows: ArtifactRows
    order: np.ndarray      # [rows] row positions, grouped by prompt
    bounds: np.ndarray     # [prompts + 1] prompt g's rows are order[bounds[g]:bounds[g + 1]]
    ids: list              # [prompts] the prompt ids
    rewards: array         # the rows' rewards that are not None, in row order (their mean sums them in this order)
    chunk_rows: int = 4096

    @classmethod
    def index(cls, rows: ArtifactRows) -> PromptGroups:
        number: dict = {}
        prompt_of, rewards = array("q"), array("d")
        for batch in rows.batches():
            for prompt_id in batch.column("prompt_id").to_pylist():
                prompt_of.append(number.setdefault(prompt_id, len(number)))
            rewards.extend(r for r in batch.column("reward").to_pylist() if r is not None)
        codes = np.frombuffer(prompt_of, dtype=np.int64) if prompt_of else np.zeros(0, dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(number)))])
        return cls(rows, np.argsort(codes, kind="stable"), bounds, list(number), rewards)

    def most_per_prompt(self) -> int:
        return int(np.diff(self.bounds).max(initial=0))

    def __call__(self) -> Iterator[tuple[Any, list[dict]]]:
        """(prompt id, its candidates) for every prompt, in order."""
        first, count = 0, len(self.ids)
        while first < count:
            last = first + 1  # a chunk of whole prompts, at most chunk_rows rows unless one prompt has more
            while last < count and self.bounds[last + 1] - self.bounds[first] <= self.chunk_rows:
                last += 1
            start = int(self.bounds[first])
            fetched = self.rows.take(self.order[start:int(self.bounds[last])].tolist())
            for g in range(first, last):
                yield self.ids[g], fetched[int(self.bounds[g]) - start:int(self.bounds[g + 1]) - start]
            first = last


def in_parts(rows: Iterable[dict], size: int = 1000) -> Iterator[list[dict]]:
    part = []
    for row in rows:
        part.append(row)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


EMPTY_PAIRS = ("prompt_id", "prompt", "chosen", "rejected", "chosen_reward", "rejected_reward",
               "chosen_reward_normalised", "rejected_reward_normalised")


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    round_idx = cfg.round
    rounds = candidate_rounds(round_idx, cfg.select.pool_rounds)
    for r in rounds:
        if not is_complete(paths.scored(r)):
            raise MissingInput(f"select needs round {r}'s scored samples at {paths.scored(r)}; run "
                               f"`python -m rsft.run stage=score round={r}` first")
    outputs, names = [paths.selected(round_idx)], ["select"]
    if cfg.select.pairs:
        outputs, names = outputs + [paths.pairs(round_idx)], names + ["select (pairs)"]
    return Plan(outputs=outputs, inputs=[paths.scored(r) for r in rounds], names=names, given={"rounds": rounds})


def build(cfg: DictConfig, job: Job) -> Built:
    """Three passes over the scored rows, none of which holds them all: one indexes them by prompt, one decides
    (select_groups), and each output's write reads them again to write what was decided (selected_rows,
    pair_rows)."""
    select_cfg, round_idx, want_pairs = cfg.select, cfg.round, cfg.select.pairs
    rounds = job.plan.given["rounds"]
    groups = PromptGroups.index(load_scored(job.paths, rounds))
    samples_per_prompt = groups.most_per_prompt()
    if want_pairs and samples_per_prompt < 2:
        raise InputError(f"select.pairs=true needs at least 2 completions per prompt, but the scored samples of "
                         f"rounds {rounds} have {samples_per_prompt} (sample.num_samples=1?); "
                         f"set select.pairs=false or sample.num_samples >= 2")
    chosen = select_groups(groups, groups.rewards, select_cfg, cfg.seed, round_idx, want_pairs)
    top, share = chosen.top_opening
    stats = {**chosen.stats, "top_opening_share": share}
    if want_pairs and job.paths.dpo:  # only the data can tell; say so before SFT runs, naming the setting
        margin = cfg.dpo.min_margin
        if chosen.largest_pair_gap is None or not chosen.largest_pair_gap >= margin:
            raise InputError(f"select: none of round {round_idx}'s {chosen.counts['pairs']} best-vs-worst pairs has a "
                             f"normalised reward gap >= dpo.min_margin={cfg.dpo.min_margin}, so loop.dpo would have "
                             f"nothing to train on; lower dpo.min_margin or set loop.dpo=false")
    meta = {"stage": "select", "round": round_idx, "rounds_pooled": rounds, "counts": chosen.counts, "stats": stats,
            "top_opening": top, "prompts_without_survivors": chosen.starved,
            "settings": OmegaConf.to_container(select_cfg, resolve=True)}
    log.info("select (%s): kept %d of %d completions over %d prompts, %d pairs", select_cfg.strategy,
             chosen.counts["selected"], chosen.counts["candidates"], chosen.counts["prompts"], chosen.counts["pairs"])
    system_prompt = cfg.data.get("system_prompt")

    def write_selected(tmp):
        write_rows(tmp, in_parts(selected_rows(groups, chosen, select_cfg, round_idx)))

    def write_pairs(tmp):
        if not chosen.counts["pairs"]:  # an empty set saved with 0 shards cannot be loaded
            Dataset.from_dict({k: [] for k in EMPTY_PAIRS}).save_to_disk(str(tmp), num_shards=1)
            return
        write_rows(tmp, in_parts(pair_rows(groups, chosen, select_cfg, system_prompt)), num_shards=1)

    outputs = [(meta, write_selected)]
    if want_pairs:
        outputs.append(({**meta, "stage": "select (pairs)"}, write_pairs))
    metrics = {**{f"select/{k}": v for k, v in chosen.counts.items()}, **{f"select/{k}": v for k, v in stats.items()}}
    return Built(outputs, metrics, step=round_idx)
