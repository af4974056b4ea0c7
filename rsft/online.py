"""stage=online: the policy learns while it samples, a mini-batch of prompts at a time (docs/online.md).

    python -m rsft.run stage=online [online.minibatches=9 online.prompts_per_batch=8 sample.num_samples=8]

This module is the mini-batch schedule and its checkpoint; each step is a service the stages call too:
  1. prompts: the stream's rows b*M .. b*M + M - 1 (M = online.prompts_per_batch), the prompts the rounds see;
  2. sample with the current weights (rsft.generation.sample_dataset), seeds a function of (seed, b);
  3. score as stage=score does (rsft.reward_service.score_batch, calibrated by reward_normalised's rule);
  4. select by the select group's rules (rsft.best_of_k.kept_of_batch; best_and_worst for the DPO term);
  5. train: online.steps_per_batch steps of SFT (online.loss=gem: GEM's loss in place of the cross-entropy), plus
     with online.kl a KL(initial || policy) term and with
     online.dpo_weight a DPO term (rsft.policy_training.train_on_batch; the examples are stage=sft's, cut_examples);
  6. with online.refresh_every, label the samples as stage=labels does and retrain the reward model as stage=refresh
     does (rsft.bt_fit.refresh_on_samples: rsft.pairs.labelled_pairs, rsft.bt_fit.retrained_on_labels);
  7. every online.eval_every mini-batches, before the first and after the last, evaluate as stage=eval does
     (rsft.generation.sample_evaluation, rsft.reward_service.evaluated), online.guard watching (rsft.guard).
Under torchrun every process samples its share and trains data-parallel; a step is the one a single process takes.

Resume: every online.checkpoint_every mini-batches a verified checkpoint (rsft.checkpoints.LoopCheckpoints) holds
the trainable weights, the optimiser and schedule, the RNG states and Progress; a rerun of the same command
resumes after the newest one and, on CPU, ends as an uninterrupted run ends (tests/test_online.py).

Writes online/ (rsft.online_report.online_writer): policy/ (LoRA merged), kept/ (every kept completion, its
mini-batch in `round`), evals/batch_XXXX/ (each snapshot's scored completions) and metrics.json (per mini-batch and
per snapshot).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, fields

import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from reward.formats import pair_files
from rsft import distributed, reward_service
from rsft.config import samples_per_prompt, uses_trained_reward
from rsft.data import load_prompts, minibatch_prompts, prompt_files, prompt_stream, check_batch_size
from rsft.guard import kl_weight, watch_snapshot
from rsft.generation import adaptive_k, build_draft, prune_schedule, sample_dataset, sample_evaluation, sampling_settings
from rsft.metrics import flat_metrics, kept_means
from rsft.models import load_policy, resolve_device
from rsft.online_report import online_record, online_writer
from rsft.paths import RunPaths
from rsft.checkpoints import rng_states, seed_everything, set_rng_states
from rsft.policy_training import OnlinePolicy, loss_temperature, policy_writer, train_on_batch
from rsft.bt_fit import RefreshedModels, refresh_on_samples
from rsft.runner import Built, Job, Plan
from rsft.tracking import PhaseClock
from rsft.best_of_k import best_and_worst, kept_of_batch
from rsft.trl_common import check_trained

log = logging.getLogger(__name__)


def minibatch_seed(seed: int, batch: int) -> int:
    """The sampling seed of mini-batch b: a function of (seed, b) alone, apart from every round's seed."""
    return int(seed) * 1_000_003 + 500_009 + int(batch)


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """The reward (the run's reward/ by digest, any other source by its identity) and the prompt files."""
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
                user_files=files, sources=sources, given={"reward": trained[0] if trained else None, "judge": judge})


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
    judge_name: str | None = None
    eval_scorer: object = None  # what scores the snapshots: the run's reward/ (the sampler's scorer may be refreshed)
    refreshed: object = None    # with online.refresh_every: RefreshedModels, where the refreshed reward models live

    @property
    def system_prompt(self):
        return self.cfg.data.get("system_prompt")


def run_minibatch(ctx: Context, stream: Dataset, progress: Progress, batch: int) -> dict:
    """Sample, score, select and train on mini-batch `batch`; its metrics (the kept rows join `progress`)."""
    cfg, clock = ctx.cfg, PhaseClock()
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
    clock.lap("sampling")
    refresh = cfg.online.refresh_every
    if refresh:
        progress.unlabelled.extend({**r, "prompt_id": f"{r['prompt_id']}@{batch}"} for r in ds.to_list())
        if (batch + 1) % refresh == 0:
            refresh_reward(ctx, progress, batch)
    clock.lap("refresh")
    candidates = reward_service.score_batch(ctx.scorer, ds, reward_service.calibrates(cfg))
    kept = kept_of_batch(cfg, candidates, batch)
    if cfg.online.advantage_share and kept:
        kept = shared_weights(kept, len(prompts))
    pairs = best_and_worst(cfg, candidates) if cfg.online.dpo_weight > 0 else []
    clock.lap("scoring")
    trained = train_on_batch(ctx.policy, ctx.tokenizer, cfg.online, cfg.seed, ctx.system_prompt, kept, progress.kept,
                             batch, pairs, kl_weight(cfg.online, progress.guard), loss_temperature(cfg, "online"))
    progress.kept.extend(kept)
    clock.lap("training")
    completions, tokens, wall = progress.sampled()
    seconds = clock.total
    return {
        "batch": batch, "prompts": len(prompts), "completions": sampling["num_completions"],
        "tokens": sampling["tokens"], "completions_sampled": completions + sampling["num_completions"],
        "tokens_sampled": tokens + sampling["tokens"], "seconds": round(seconds, 3),
        "wall_seconds": round(wall + seconds, 3), "phase_seconds": clock.seconds, "kept": len(kept), **kept_means(candidates, kept), **trained,
        **({"reward_model": len(progress.refreshes)} if refresh else {}),
    }


def shared_weights(kept: list[dict], prompts: int) -> list[dict]:
    """online.advantage_share: the kept rows' weights times the share of the mini-batch's `prompts` that kept any (a
    prompt whose answers all tie keeps none), as GRPO's loss, averaged over every sampled completion, counts a tied
    group's completions and adds nothing from them."""
    share = len({r["prompt_id"] for r in kept}) / prompts
    return [{**r, "weight": r["weight"] * share} for r in kept]


def refresh_reward(ctx: Context, progress: Progress, batch: int) -> None:
    """Label the samples since the last refresh and retrain the reward model on every label so far
    (rsft.bt_fit.refresh_on_samples); it scores from now on."""
    labels, record = refresh_on_samples(ctx.cfg, progress.unlabelled, progress.labels, ctx.refreshed,
                                        ctx.policy.device, batch)
    progress.labels.append(labels)
    progress.refreshes.append(record)
    progress.unlabelled = []
    ctx.scorer = reward_service.open_reward(ctx.cfg, ctx.policy.device, ctx.refreshed.model(record["refresh"]))


def snapshot(ctx: Context, prompts: Dataset, progress: Progress, batch: int, tracker) -> None:
    """Evaluate after `batch` mini-batches; its rows and metrics (and its seconds) join `progress`."""
    started = time.perf_counter()
    baseline = Dataset.from_list(progress.eval_rows[0]) if 0 in progress.eval_rows else None
    provenance = {"round": batch, "policy": f"online (after {batch} mini-batches)",
                  "sampler": json.dumps({**ctx.settings.__dict__, "draft": "none"}, sort_keys=True)}
    ctx.policy.model.eval()
    with torch.no_grad():  # as stage=eval samples and scores the held-out prompts (its seed, its K)
        ds, _ = sample_evaluation(ctx.policy.model, ctx.tokenizer, prompts, ctx.settings, ctx.cfg, provenance,
                                  progress=False)
    ds, metrics = reward_service.evaluated(ds, ctx.eval_scorer or ctx.scorer, ctx.judge, ctx.judge_name, baseline)
    completions, tokens, wall = progress.sampled()
    record = {"batch": batch, "completions_sampled": completions, "tokens_sampled": tokens, "wall_seconds": wall,
              "seconds": round(time.perf_counter() - started, 3), "metrics": metrics}
    progress.evals.append(record)
    progress.eval_rows[batch] = ds.to_list()
    log.info("online: eval after %d mini-batches (%d tokens sampled): %s", batch, tokens,
             {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)})
    tracker.log({**{f"online_eval/{k}": v for k, v in flat_metrics(metrics).items()},
                 "online_eval/tokens_sampled": tokens, "online_eval/completions_sampled": completions,
                 "online_eval/wall_seconds": wall}, step=batch)


# ---- resume ----


def checkpoint_state(policy: OnlinePolicy, progress: Progress) -> dict:
    """The trainable weights, the optimiser, schedule and RNG states, and every field of Progress."""
    return {"weights": policy.trainable(), "optimizer": policy.optimizer.state_dict(),
            "schedule": policy.schedule.state_dict(), "rng": rng_states(), **vars(progress)}


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
    progress = Progress(**{f.name: state[f.name] for f in fields(Progress) if f.name in state})  # older: no guard
    log.info("online: resuming after mini-batch %d (%d kept completions so far)", progress.next_batch - 1,
             len(progress.kept))
    return progress


# ---- the stage ----


def build(cfg: DictConfig, job: Job) -> Built:
    online, device = cfg.online, resolve_device(cfg.device)
    batches, every, eval_every = online.minibatches, online.checkpoint_every, online.eval_every
    seed_everything(cfg.seed)
    settings = sampling_settings(cfg.sample, cfg.draft)
    stream = prompt_stream(cfg.data)
    check_batch_size(stream, online.prompts_per_batch)  # before the policy loads
    model, tokenizer, source = load_policy(cfg, None, device)
    log.info("online: %s learns over %d mini-batches of %d prompts x %s completions (%s, %d steps each)", source,
             batches, online.prompts_per_batch, cfg.sample.num_samples, online.mode, online.steps_per_batch)
    policy = OnlinePolicy.build(model, online, device, batches * online.steps_per_batch)
    trained_folder = job.plan.given["reward"]
    scorer = reward_service.open_reward(cfg, device, trained_folder)
    log.info("online: scored by %s", trained_folder or reward_service.source_spec(cfg))
    judge, judge_name = None, None
    if eval_every:
        judge, judge_name, _ = reward_service.judge_for(cfg, device, job.plan.given["judge"], job.paths.reward)
    ctx = Context(cfg, policy, tokenizer, build_draft(cfg, policy.model, tokenizer, device), scorer, settings, judge,
                  judge_name, eval_scorer=scorer)
    held_out = load_prompts(cfg.data, "eval") if eval_every else None
    refresh = online.refresh_every
    checkpoints = job.loop_checkpoints() if every or refresh else None  # kept by the main process, read by every one
    if refresh:
        ctx.refreshed = RefreshedModels(checkpoints.folder, trained_folder)
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
                stopped = watch_snapshot(online.guard, progress, batch, False, policy.optimizer, policy.schedule)
                if stopped:
                    break
            metrics = run_minibatch(ctx, stream, progress, batch)
            progress.minibatches.append(metrics)
            progress.next_batch = batch + 1
            logged = {**flat_metrics(metrics), **{f"{k}_seconds": v for k, v in metrics["phase_seconds"].items()}}
            job.tracker.log({f"online/{k}": v for k, v in logged.items()}, step=batch + 1)
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
        watch_snapshot(online.guard, progress, batches, True, policy.optimizer, policy.schedule)
    final = policy.final()
    stats, meta = online_record(progress, OmegaConf.to_container(online, resolve=True), source, stopped,
                                distributed.world_size())
    check_trained(final, stats["loss_last"], online, "online")
    log.info("online: %d mini-batches, %d completions (%d tokens) sampled, %d kept, loss %s -> %s; written to %s",
             batches, stats["completions_sampled"], stats["tokens_sampled"], stats["kept"], stats["loss_first"],
             stats["loss_last"], job.out)
    write = online_writer(progress, policy_writer(final, None, tokenizer),
                          ctx.refreshed.model(len(progress.refreshes)) if progress.refreshes else None)
    return Built([(meta, write)], {f"online/final_{k}": v for k, v in stats.items() if v is not None}, step=batches)
