"""stage=online: the policy learns while it samples, a mini-batch of prompts at a time (docs/online.md).

    python -m rsft.run stage=online [online.minibatches=9 online.prompts_per_batch=8 sample.num_samples=8]

This module is the mini-batch schedule and its checkpoint; each step is a service the stages call too:
  1. prompts: the stream's rows b*M .. b*M + M - 1 (M = online.prompts_per_batch), the prompts the rounds see;
  2. sample with the current weights (rsft.generation.sample_dataset), seeds a function of (seed, b);
  3. score as stage=score does (rsft.reward_service.score_batch, calibrated by reward_normalised's rule);
  4. select by the select group's rules (rsft.best_of_k.kept_of_batch; best_and_worst for the DPO term);
  5. train: online.steps_per_batch steps of SFT, plus with online.dpo_weight a DPO term
     (rsft.policy_training.train_on_batch; the examples are stage=sft's, cut_examples);
  6. with online.refresh_every, label the samples as stage=labels does (rsft.pairs.labelled_pairs) and retrain
     the reward model as stage=refresh does (rsft.bt_fit.retrained_on_labels);
  7. every online.eval_every mini-batches, before the first and after the last, evaluate as stage=eval does
     (rsft.generation.sample_evaluation, rsft.reward_service.scored_evaluation, rsft.metrics.policy_metrics),
     with online.guard watching the snapshots (rsft.guard).
Under torchrun every process samples its share and trains data-parallel; a step is the one a single process takes.

Resume: every online.checkpoint_every mini-batches a verified checkpoint (rsft.checkpoints.LoopCheckpoints) holds
the trainable weights, the optimiser and schedule, the RNG states and Progress; a rerun of the same command
resumes after the newest one and, on CPU, ends as an uninterrupted run ends (tests/test_online.py).

Writes online/: policy/ (LoRA merged), kept/ (every kept completion, its mini-batch in `round`),
evals/batch_XXXX/ (each snapshot's scored completions) and metrics.json (per mini-batch and per snapshot).
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from reward.formats import pair_files
from rsft import distributed, reward_service
from rsft.config import samples_per_prompt, uses_trained_reward
from rsft.data import load_prompts, prompt_files
from rsft.errors import ConfigError
from rsft.guard import crossed as guard_crossed
from rsft.guard import scale_learning_rate, watch_initial
from rsft.generation import (
    adaptive_k,
    build_draft,
    prune_schedule,
    sample_dataset,
    sample_evaluation,
    sampling_settings,
)
from rsft.pairs import labelled_pairs
from rsft.metrics import METRICS_FILE, flat_metrics, gold_scores, policy_metrics
from rsft.models import load_policy, resolve_device
from rsft.paths import RunPaths
from rsft.checkpoints import rng_states, seed_everything, set_rng_states
from rsft.policy_training import OnlinePolicy, policy_writer, train_on_batch
from rsft.bt_fit import refreshed_reward
from rsft.runner import Built, Job, Plan
from rsft.best_of_k import best_and_worst, kept_of_batch
from rsft.trl_common import check_trained

log = logging.getLogger(__name__)


def minibatch_seed(seed: int, batch: int) -> int:
    """The sampling seed of mini-batch b: a function of (seed, b) alone, apart from every round's seed."""
    return int(seed) * 1_000_003 + 500_009 + int(batch)


def check_scheduler(name: str) -> None:
    from transformers import SchedulerType

    try:
        SchedulerType(name)
    except ValueError:
        raise ConfigError(f"online.lr_scheduler={name!r}: expected one of transformers' schedules: "
                          f"{', '.join(s.value for s in SchedulerType)}") from None


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """The reward (the run's reward/ by digest, any other source by its identity) and the prompt files."""
    check_scheduler(cfg.online.lr_scheduler)
    sampling_settings(cfg.sample, cfg.draft)
    trained = [reward_service.reward_model(cfg)] if uses_trained_reward(cfg) else []  # a missing one says how to train it
    evaluates = cfg.online.eval_every > 0
    files = prompt_files(cfg.data, "train") + (prompt_files(cfg.data, "eval") if evaluates else [])
    sources = reward_service.source_identity(cfg, resolve_device(cfg.device))
    judge = reward_service.judge_model(cfg) if evaluates else None  # a bad eval.judge stops here, before any work
    if evaluates and reward_service.judge_spec(cfg) is not None:
        sources["judge"] = reward_service.open_judge(cfg, resolve_device(cfg.device), None).identity()
    labels = []
    if cfg.online.refresh_every > 0:  # the initial labels every refresh pools with its own
        labels = [paths.prefs] if cfg.reward.data.path is None else []
        files += pair_files(cfg.reward.data)
    return Plan(outputs=[paths.online], inputs=trained + labels + ([judge] if judge is not None else []),
                user_files=files, sources=sources)


def prompt_stream(cfg: DictConfig) -> Dataset:
    """The prompts the rounds would see, in order: with data.rotate the whole train split (round r takes its
    next data.limit rows), without it the first data.limit rows (every round takes the same ones)."""
    rotate = bool(cfg.data.get("rotate", False))
    return load_prompts(OmegaConf.merge(cfg.data, {"limit": None} if rotate else {}, {"rotate": False}), "train")


def check_batch_size(stream: Dataset, size: int) -> None:
    """A mini-batch holds distinct prompts: M larger than the stream would put one prompt in a mini-batch twice,
    and its 2K completions would then compete under one prompt id (selection keeps the best K of them)."""
    if size > len(stream):
        raise ConfigError(f"online.prompts_per_batch={size}: more than the {len(stream)} train prompts the stream holds "
                          f"(data.path, data.limit, data.rotate); expected at most {len(stream)}, so that a mini-batch "
                          f"never holds a prompt twice")


def minibatch_prompts(stream: Dataset, batch: int, size: int) -> Dataset:
    """Mini-batch `batch`: the stream's rows batch*M .. batch*M + M - 1 (M = size), wrapping round the stream."""
    check_batch_size(stream, size)
    rows = [(batch * size + i) % len(stream) for i in range(size)]
    return stream.select(rows)


# ---- one mini-batch ----


@dataclass
class Progress:
    """What a checkpoint holds besides the model, optimiser, schedule and RNG states."""

    next_batch: int = 0
    kept: list[dict] = field(default_factory=list)         # every kept row so far (also the replay buffer)
    minibatches: list[dict] = field(default_factory=list)  # per mini-batch metrics
    evals: list[dict] = field(default_factory=list)        # the snapshots' metrics
    eval_rows: dict = field(default_factory=dict)          # batch -> the snapshot's scored rows
    unlabelled: list[dict] = field(default_factory=list)   # sample rows since the last reward refresh
    labels: list[dict] = field(default_factory=list)       # each refresh's labelled pairs: {"train": rows, "test": rows}
    refreshes: list[dict] = field(default_factory=list)    # each refresh's metrics
    guard: list[dict] = field(default_factory=list)        # online.guard's crossings: {batch, reason, action}

    def sampled(self) -> tuple[int, int, float]:
        """(completions, tokens, wall seconds) so far."""
        last = self.minibatches[-1] if self.minibatches else {}
        return (last.get("completions_sampled", 0), last.get("tokens_sampled", 0), last.get("wall_seconds", 0.0))


@dataclass
class Context:
    cfg: DictConfig
    policy: OnlinePolicy
    tokenizer: object
    draft: object
    scorer: object
    settings: object
    judge: object = None  # eval.judge opened, or None: scores the snapshots beside the reward
    eval_scorer: object = None  # what scores the snapshots: the run's reward/ (the sampler's scorer may be refreshed)
    refreshed: object = None    # with online.refresh_every: Refreshed, where the refreshed reward models live

    @property
    def system_prompt(self):
        return self.cfg.data.get("system_prompt")


def mean_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def run_minibatch(ctx: Context, stream: Dataset, progress: Progress, batch: int) -> dict:
    """Sample, score, select and train on mini-batch `batch`; its metrics (the kept rows join `progress`)."""
    cfg, started = ctx.cfg, time.perf_counter()
    prompts = minibatch_prompts(stream, batch, cfg.online.prompts_per_batch)
    provenance = {"round": batch, "policy": f"online (mini-batch {batch})",
                  "sampler": json.dumps({**ctx.settings.__dict__, "draft": cfg.draft.kind}, sort_keys=True)}
    prune, adaptive = prune_schedule(cfg.sample), adaptive_k(cfg.sample)
    ctx.policy.model.eval()
    with torch.no_grad():
        ds, sampling = sample_dataset(ctx.policy.model, ctx.tokenizer, ctx.draft, prompts, ctx.settings,
                                      samples_per_prompt(cfg.sample), minibatch_seed(cfg.seed, batch), ctx.system_prompt,
                                      provenance, progress=False, scorer=ctx.scorer if prune or adaptive else None,
                                      prune=prune, adaptive=adaptive)
    refresh = cfg.online.refresh_every
    if refresh:
        progress.unlabelled.extend({**r, "prompt_id": f"{r['prompt_id']}@{batch}"} for r in ds.to_list())
        if (batch + 1) % refresh == 0:
            refresh_reward(ctx, progress, batch)
    candidates = reward_service.score_batch(ctx.scorer, ds, reward_service.calibrates(cfg))
    kept = kept_of_batch(cfg, candidates, batch)
    pairs = best_and_worst(cfg, candidates) if cfg.online.dpo_weight > 0 else []
    trained = train_on_batch(ctx.policy, ctx.tokenizer, cfg.online, cfg.seed, ctx.system_prompt, kept, progress.kept,
                             batch, pairs)
    progress.kept.extend(kept)
    completions, tokens, wall = progress.sampled()
    seconds = time.perf_counter() - started
    columns = ("task", "completion", "finish_reason")  # the oracle's score is recorded, never selects
    gold = gold_scores(Dataset.from_dict({k: [r[k] for r in candidates] for k in columns})
                       ) if candidates and "task" in candidates[0] else None
    kept_keys = {(r["prompt_id"], r["sample_idx"]) for r in kept}
    return {
        "batch": batch, "prompts": len(prompts), "completions": sampling["num_completions"],
        "tokens": sampling["tokens"], "completions_sampled": completions + sampling["num_completions"],
        "tokens_sampled": tokens + sampling["tokens"], "seconds": round(seconds, 3),
        "wall_seconds": round(wall + seconds, 3), "reward_mean": mean_or_none(r["reward"] for r in candidates),
        "kept": len(kept), "kept_reward_mean": mean_or_none(r["reward"] for r in kept), **trained,
        **({"reward_model": len(progress.refreshes)} if refresh else {}),
        **({"gold_mean": mean_or_none(gold),
            "kept_gold_mean": mean_or_none(g for r, g in zip(candidates, gold)
                                           if (r["prompt_id"], r["sample_idx"]) in kept_keys)}
           if gold is not None else {}),
    }


@dataclass
class Refreshed:
    """Where the refreshed reward models live: `folder`/reward-NNN (NNN = refreshes done), in the stage's resume
    folder (rsft.store.ProgressFolder: keyed by the fingerprint, deleted once the artifact is written); the
    run's reward/ before the first refresh."""

    folder: Path
    initial: Path

    def model(self, refreshes: int) -> Path:
        return self.initial if refreshes == 0 else self.folder / f"reward-{refreshes:03d}"


def refresh_reward(ctx: Context, progress: Progress, batch: int) -> None:
    """Label the samples since the last refresh, retrain the reward model on every label so far (as stage=refresh
    retrains a round's), and score with it from now on. Every process trains (data-parallel under torchrun, as
    stage=refresh); the main process writes the model, which every process then opens."""
    cfg, device, started = ctx.cfg, ctx.policy.device, time.perf_counter()
    index, current = len(progress.refreshes), ctx.refreshed.model(len(progress.refreshes))
    samples = Dataset.from_list(progress.unlabelled)
    splits, counts = labelled_pairs(cfg, samples, index, current, device)  # as stage=labels labels a round
    progress.labels.append({"train": splits["train"].to_list(), "test": splits["test"].to_list()})
    log.info("online: refresh %d before scoring mini-batch %d: %d new labelled pairs", index + 1, batch, counts["pairs"])
    target = ctx.refreshed.model(index + 1)
    metrics, sizes = refreshed_reward(cfg, progress.labels, current, target, device,
                                      {"stage": "online", "refresh": index + 1, "batch": batch})
    ctx.scorer = reward_service.open_reward(cfg, device, target)
    record = {"refresh": index + 1, "batch": batch, "mini-batches": sorted({int(r["prompt_id"].rsplit("@", 1)[1])
                                                                          for r in progress.unlabelled}),
              "labelled_pairs": counts["pairs"], **sizes,
              **{k: metrics[k] for k in ("heldout_accuracy", "train_accuracy", "gold_agreement") if k in metrics},
              "seconds": round(time.perf_counter() - started, 3)}
    progress.refreshes.append(record)
    progress.unlabelled = []
    log.info("online: refresh %d: held-out accuracy %.3f on %d pairs", index + 1, metrics["heldout_accuracy"],
             metrics["heldout_pairs"])


def snapshot(ctx: Context, prompts: Dataset, progress: Progress, batch: int, tracker) -> None:
    """Evaluate after `batch` mini-batches; its rows and metrics join `progress`."""
    baseline = Dataset.from_list(progress.eval_rows[0]) if 0 in progress.eval_rows else None
    provenance = {"round": batch, "policy": f"online (after {batch} mini-batches)",
                  "sampler": json.dumps({**ctx.settings.__dict__, "draft": "none"}, sort_keys=True)}
    ctx.policy.model.eval()
    with torch.no_grad():  # as stage=eval samples and scores the held-out prompts (its seed, its K)
        ds, _ = sample_evaluation(ctx.policy.model, ctx.tokenizer, prompts, ctx.settings, ctx.cfg, provenance,
                                  progress=False)
    ds = reward_service.scored_evaluation(ds, ctx.eval_scorer or ctx.scorer, ctx.judge)
    metrics = policy_metrics(ds, baseline)
    if ctx.judge is not None:
        metrics["judge"] = ctx.cfg.eval.judge
    completions, tokens, wall = progress.sampled()
    record = {"batch": batch, "completions_sampled": completions, "tokens_sampled": tokens, "wall_seconds": wall,
              "metrics": metrics}
    progress.evals.append(record)
    progress.eval_rows[batch] = ds.to_list()
    log.info("online: eval after %d mini-batches (%d tokens sampled): %s", batch, tokens,
             {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)})
    tracker.log({**{f"online_eval/{k}": v for k, v in flat_metrics(metrics).items()},
                 "online_eval/tokens_sampled": tokens, "online_eval/completions_sampled": completions,
                 "online_eval/wall_seconds": wall}, step=batch)


def watch_range(ctx: Context, progress: Progress, batch: int, final: bool) -> str | None:
    """online.guard on the snapshot just taken after `batch` mini-batches (rsft.guard): the reason to stop, when it
    is crossed with action=stop; with lower_lr the optimiser's rate and its schedule's are scaled. The snapshot
    before any training is not judged, and the last one only recorded (no training follows it)."""
    guard = ctx.cfg.online.guard
    if guard.metric is None:
        return None
    metrics = progress.evals[-1]["metrics"]
    if batch == 0:
        watch_initial(guard, metrics, "online.guard")
        return None
    reason = guard_crossed(guard, metrics, "online.guard", f"the snapshot after {batch} mini-batches")
    if reason is None:
        return None
    action = "recorded (the last snapshot)" if final else guard.action
    progress.guard.append({"batch": batch, "reason": reason, "action": action})
    if final or guard.action == "stop":
        log.warning("online.guard: %s; %s", reason, "the run ends here" if not final else "recorded")
        return None if final else reason
    scale_learning_rate(ctx.policy.optimizer, ctx.policy.schedule, guard.lr_factor)
    log.warning("online.guard: %s; the learning rate is multiplied by %g from here", reason, guard.lr_factor)
    return None


# ---- resume ----


def checkpoint_state(policy: OnlinePolicy, progress: Progress) -> dict:
    return {"weights": policy.trainable(), "optimizer": policy.optimizer.state_dict(),
            "schedule": policy.schedule.state_dict(), "rng": rng_states(), "next_batch": progress.next_batch,
            "kept": progress.kept, "minibatches": progress.minibatches, "evals": progress.evals,
            "eval_rows": progress.eval_rows, "unlabelled": progress.unlabelled, "labels": progress.labels,
            "refreshes": progress.refreshes, "guard": progress.guard}


def resume(checkpoints, policy: OnlinePolicy) -> Progress:
    """The progress of the newest verified checkpoint, its states restored into `policy` and the RNGs; a fresh
    Progress when there is none. The main process passes over damaged checkpoints first (and deletes them)."""
    if checkpoints is None:
        return Progress()
    state = checkpoints.load() if distributed.is_main() else None
    distributed.barrier()
    if not distributed.is_main():
        state = checkpoints.load()
    if state is None:
        return Progress()
    policy.load_trainable(state["weights"])
    policy.optimizer.load_state_dict(state["optimizer"])
    policy.schedule.load_state_dict(state["schedule"])
    set_rng_states(state["rng"])
    progress = Progress(state["next_batch"], state["kept"], state["minibatches"], state["evals"], state["eval_rows"],
                        state["unlabelled"], state["labels"], state["refreshes"], state.get("guard", []))
    log.info("online: resuming after mini-batch %d (%d kept completions so far)", progress.next_batch - 1,
             len(progress.kept))
    return progress


# ---- the stage ----


def build(cfg: DictConfig, job: Job) -> Built:
    online, device = cfg.online, resolve_device(cfg.device)
    batches, every, eval_every = online.minibatches, online.checkpoint_every, online.eval_every
    seed_everything(cfg.seed)
    settings = sampling_settings(cfg.sample, cfg.draft)
    stream = prompt_stream(cfg)
    check_batch_size(stream, online.prompts_per_batch)  # before the policy loads
    model, tokenizer, source = load_policy(cfg, None, device)
    log.info("online: %s learns over %d mini-batches of %d prompts x %s completions (%s, %d steps each)", source,
             batches, online.prompts_per_batch, cfg.sample.num_samples, online.mode, online.steps_per_batch)
    policy = OnlinePolicy.build(model, online, device, batches * online.steps_per_batch)
    trained_folder = job.plan.inputs[0] if uses_trained_reward(cfg) else None
    scorer = reward_service.open_reward(cfg, device, trained_folder)
    log.info("online: scored by %s", trained_folder or reward_service.source_spec(cfg))
    judge = None
    if eval_every and cfg.eval.get("judge") is not None:
        folder = reward_service.judge_model(cfg)
        for warning in reward_service.judge_warnings(folder, job.paths.reward) if folder is not None else []:
            log.warning("eval.judge=%s: %s", cfg.eval.judge, warning)
        judge = reward_service.open_judge(cfg, device, folder)
        log.info("online: snapshots judged by %s", folder or reward_service.judge_spec(cfg))
    ctx = Context(cfg, policy, tokenizer, build_draft(cfg, policy.model, tokenizer, device), scorer, settings, judge,
                  eval_scorer=scorer)
    held_out = load_prompts(cfg.data, "eval") if eval_every else None
    refresh = online.refresh_every
    checkpoints = job.loop_checkpoints() if every or refresh else None  # kept by the main process, read by every one
    if refresh:
        ctx.refreshed = Refreshed(checkpoints.folder, trained_folder)
        if distributed.is_main():
            checkpoints.folder.mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    progress = resume(checkpoints if every else None, policy)
    stopped = None  # online.guard's reason to end early (action=stop)
    if progress.refreshes:  # the model the newest refresh wrote before the checkpoint
        ctx.scorer = reward_service.open_reward(cfg, device, ctx.refreshed.model(len(progress.refreshes)))
    with tqdm(total=batches, initial=progress.next_batch, desc="online", unit="mini-batch",
              disable=not online.progress or not distributed.is_main()) as bar:
        for batch in range(progress.next_batch, batches):
            if eval_every and batch % eval_every == 0:
                snapshot(ctx, held_out, progress, batch, job.tracker)
                stopped = watch_range(ctx, progress, batch, final=False)
                if stopped:
                    break
            metrics = run_minibatch(ctx, stream, progress, batch)
            progress.minibatches.append(metrics)
            progress.next_batch = batch + 1
            job.tracker.log({f"online/{k}": v for k, v in metrics.items() if v is not None}, step=batch + 1)
            if progress.refreshes and progress.refreshes[-1]["batch"] == batch:
                job.tracker.log({f"online_refresh/{k}": v for k, v in progress.refreshes[-1].items()
                                 if isinstance(v, (int, float))}, step=batch + 1)
            bar.set_postfix(kept=metrics["kept"], reward=f"{metrics['reward_mean'] or 0:.3f}",
                            loss=f"{metrics['loss'] or 0:.3f}")
            bar.update(1)
            if checkpoints is not None and (batch + 1) % every == 0 and batch + 1 < batches:
                if distributed.is_main():
                    checkpoints.save(batch + 1, checkpoint_state(policy, progress))
                distributed.barrier()
    if eval_every and not stopped:
        snapshot(ctx, held_out, progress, batches, job.tracker)
        watch_range(ctx, progress, batches, final=True)
    final = policy.final()
    losses = [m["loss"] for m in progress.minibatches if m["loss"] is not None]
    check_trained(final, losses[-1] if losses else None, online, "online")
    completions, tokens, wall = progress.sampled()
    stats = {"minibatches": len(progress.minibatches), "completions_sampled": completions, "tokens_sampled": tokens,
             "wall_seconds": wall, "kept": len(progress.kept), "steps": sum(m["steps"] for m in progress.minibatches),
             "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
             "world_size": distributed.world_size(), "reward_refreshes": len(progress.refreshes),
             "stopped": stopped, "guard": progress.guard}
    if progress.evals:
        stats.update({f"eval_{k}": v for k, v in progress.evals[-1]["metrics"].items()
                      if k in ("reward_mean", "gold_mean", "judge_mean") and v is not None})
    meta = {"stage": "online", "policy": source, "stats": stats, "minibatches": progress.minibatches,
            "refreshes": progress.refreshes,
            "evals": [{k: v for k, v in e.items() if k != "metrics"} | {"metrics": flat_metrics(e["metrics"])}
                      for e in progress.evals],
            "settings": OmegaConf.to_container(online, resolve=True)}
    log.info("online: %d mini-batches, %d completions (%d tokens) sampled, %d kept, loss %s -> %s; written to %s",
             batches, completions, tokens, len(progress.kept), stats["loss_first"], stats["loss_last"], job.out)
    write_policy = policy_writer(final, None, tokenizer)

    def write(tmp):
        write_policy(tmp / "policy")
        kept = Dataset.from_list(progress.kept) if progress.kept else Dataset.from_dict({"prompt_id": []})
        kept.save_to_disk(str(tmp / "kept"), num_shards=1)
        for batch, rows in sorted(progress.eval_rows.items()):
            Dataset.from_list(rows).save_to_disk(str(tmp / "evals" / f"batch_{batch:04d}"), num_shards=1)
        (tmp / METRICS_FILE).write_text(json.dumps({"minibatches": progress.minibatches, "evals": progress.evals,
                                                    "refreshes": progress.refreshes}, indent=2, default=str))
        if progress.refreshes:  # the last refreshed reward model, beside the policy it scored for
            shutil.copytree(ctx.refreshed.model(len(progress.refreshes)), tmp / "reward")

    return Built([(meta, write)], {f"online/final_{k}": v for k, v in stats.items() if v is not None}, step=batches)
