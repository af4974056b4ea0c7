"""stage=score: the reward's score for every sampled completion.

    python -m rsft.run stage=score [round=0] [reward_source=function reward_source.spec=tasks.py:check]

Reads runs/<run_name>/round_XX/samples/ and what scores them (reward_source, rsft.reward_service.open_reward):
by default the trained reward model of round XX (RunPaths.scoring_reward: the run's reward/, or with
loop.refresh_reward the round's own round_XX/reward/), else a pretrained model, a function, a server or
a combination. Writes round_XX/scored/: the samples (less the rows stage=sample pruned: prefixes, not
completions) with `reward` (the raw score; None where the source could not score the row),
`reward_normalised` (the trained model's (raw - mean) / std with its training statistics, so thresholds
do not depend on the scale one model happened to learn; for other sources the raw score, or with
reward_source.calibrate the round's own z-score), `reward_model` (what scored it: the trained model's
folder relative to the run directory, or the source's spec) and for a combination `reward_<name>`, each
component's raw score. The trained folder is in the fingerprint by digest, any other source by its
identity (reward.sources). Each source sees the prompt as the user wrote it and the completion text,
and frames them as its model was trained; a function also gets each row's other columns.

stage=eval scores with the run's reward/ (RunPaths.eval_reward) in every round, refreshed or not: one
fixed judge keeps the initial policy's and every round's numbers comparable.
"""

from __future__ import annotations

import logging
import statistics

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Features
from omegaconf import DictConfig

from rsft import reward_service
from rsft.config import uses_trained_reward
from rsft.errors import InputError, MissingInput
from rsft.models import resolve_device
from rsft.paths import RunPaths
from rsft.rows import ArtifactRows, RowWriter, in_tables
from rsft.runner import Built, Job, Plan
from rsft.sampling.budget import PRUNED
from rsft.store import is_complete, load_dataset_artifact

log = logging.getLogger(__name__)


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    source = paths.samples(cfg.round)
    if not is_complete(source):
        raise MissingInput(f"score needs round {cfg.round}'s samples at {source}; run "
                           f"`python -m rsft.run stage=sample round={cfg.round}` first")
    # the samples and what scores them: the trained model's folder by digest, any other source by its identity
    trained = [reward_service.reward_model(cfg, cfg.round)] if uses_trained_reward(cfg) else []
    return Plan(outputs=[paths.scored(cfg.round)], inputs=[source, *trained],
                sources=reward_service.source_identity(cfg, resolve_device(cfg.device)))


def completed(rows: ArtifactRows):
    """The samples' record batches less the rows stage=sample pruned (finish_reason "pruned")."""
    for batch in rows.batches():
        pruned = pc.fill_null(pc.equal(batch.column("finish_reason"), PRUNED), False)
        yield batch.filter(pc.invert(pruned)) if pc.any(pruned).as_py() else batch


def build(cfg: DictConfig, job: Job) -> Built:
    """The samples are read a record batch at a time and scored a shard at a time (reward.score_shard_rows): what
    is held for every row is its rewards, never its other columns."""
    source, *trained = job.plan.inputs
    samples = load_dataset_artifact(source)  # checked; memory-mapped, its rows read below through `rows`
    rows = ArtifactRows([source])
    scorer = reward_service.open_reward(cfg, resolve_device(cfg.device), trained[0] if trained else None)
    scored_by = str(trained[0].relative_to(job.paths.root)) if cfg.reward_source.kind == "trained" else (
        reward_service.source_spec(cfg) if cfg.reward_source.kind != "combination" else "combination")
    log.info("score: round %s's samples scored by %s", cfg.round, trained[0] if trained and
             cfg.reward_source.kind == "trained" else scored_by)
    # a killed scoring run resumes at its first unfinished shard of rows
    raw = reward_service.score_in_shards(scorer, in_tables(completed(rows), cfg.reward.score_shard_rows), job.shards())
    pruned = len(samples) - len(raw)
    if pruned:  # stopped rows are prefixes, not completions: nothing downstream may keep them
        log.info("score: %d rows pruned while sampling are left out (prefixes, not completions)", pruned)
    scored_values = [r for r in raw if r is not None]
    if not scored_values:
        raise InputError(f"score: {scored_by} found none of round {cfg.round}'s {len(raw)} completions scorable "
                         f"(it returned None for every one); check that it reads these completions")
    normalised, calibration = reward_service.normalised_rewards(scorer, raw, reward_service.calibrates(cfg), f"round {cfg.round}")
    # the new columns, typed as Dataset.add_column types them (one inference over the whole column)
    added = {"reward": pa.array([None if r is None else float(r) for r in raw]),
             "reward_normalised": pa.array(normalised), "reward_model": pa.repeat(scored_by, len(raw))}
    parts = reward_service.combination_parts(scorer)
    if parts:  # each component's raw score beside the total, over all rows in one call as it always was
        whole = next(in_tables(completed(rows), 0))
        prompts, completions = whole.column("prompt").to_pylist(), whole.column("completion").to_pylist()
        others = whole.drop_columns(["prompt", "completion"]).to_pylist()
        for name, part in parts.items():
            added[f"reward_{name}"] = pa.array(reward_service.score_rows(part, prompts, completions, others, progress=False))
        del whole, prompts, completions, others

    prompts_seen: dict = {}  # prompt id -> (lowest, highest) scored reward
    start = 0
    for batch in completed(rows):  # per prompt the best and the spread of its scored rewards
        for prompt_id, reward in zip(batch.column("prompt_id").to_pylist(), raw[start:start + batch.num_rows]):
            if reward is not None:
                low, high = prompts_seen.get(prompt_id, (reward, reward))
                prompts_seen[prompt_id] = (min(low, reward), max(high, reward))
        start += batch.num_rows
    best = [high for _, high in prompts_seen.values()]
    spread = [high - low for low, high in prompts_seen.values()]
    stats = {
        "reward_mean": statistics.fmean(scored_values),
        "reward_std": statistics.pstdev(scored_values),
        "best_of_k_reward_mean": statistics.fmean(best),
        "within_prompt_spread_mean": statistics.fmean(spread),
    }
    unscorable = len(raw) - len(scored_values)
    meta = {"stage": "score", "round": cfg.round, "reward_model": str(trained[0]) if trained else scored_by,
            "scorer_mean": float(scorer.mean), "scorer_std": float(scorer.std),
            "counts": {"rows": len(raw), "prompts": len(prompts_seen),
                       **({"pruned_left_out": pruned} if pruned else {}),
                       **({"unscorable": unscorable} if unscorable else {})},
            "stats": stats, **({"calibration": calibration} if calibration else {})}
    if unscorable:
        log.warning("score: %d of %d completions were not scorable by %s (reward None; select never keeps them)",
                    unscorable, len(raw), scored_by)
    log.info("scored %d completions of %d prompts into %s", len(raw), len(prompts_seen), job.out)
    features = samples.features.copy()
    features.update(Features.from_arrow_schema(pa.schema([(name, column.type) for name, column in added.items()])))

    def write(tmp):
        """The samples' batches with the new columns beside them, written as they are read."""
        writer, start = RowWriter(tmp, features=features, info=samples.info), 0
        for batch in completed(rows):
            table = pa.Table.from_batches([batch])
            for name, column in added.items():
                table = table.append_column(name, column.slice(start, batch.num_rows))
            writer.add_table(table)
            start += batch.num_rows
        writer.close()

    return Built([(meta, write)], {f"score/{k}": v for k, v in stats.items()}, step=cfg.round)
