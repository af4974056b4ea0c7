"""stage=online: the policy learns while it samples, a mini-batch of prompts at a time.

    python -m rsft.run stage=online [online.minibatches=9 online.prompts_per_batch=8 sample.num_samples=8]

The rounds (stage=loop) sample a whole round, then fine-tune on a fixed set: an improvement reaches the
sampler a round later. Here one policy stays in memory and the same weights serve the sampler and the
trainer. For mini-batch b = 0 .. online.minibatches - 1:
  1. prompts: the stream's rows b*M .. b*M + M - 1 (M = online.prompts_per_batch, at most the stream's length,
     so that no mini-batch holds a prompt twice), wrapping once it is used up. The stream is the prompts the rounds would see: with data.rotate the whole train split in order
     (the rounds take its next data.limit rows each), without it the first data.limit rows (every round's);
  2. sample: sample.num_samples completions of each with the current weights, through rsft's exact sampler
     (rsft.generation.sample_dataset: pruning, adaptive K and an n-gram draft stay available); the
     completions' seeds are a function of (seed, b) and the prompt's place in the mini-batch, never of
     an RNG state that drifts, so a resumed run samples what an uninterrupted one samples;
  3. score: the configured reward, whatever its kind (rsft.reward_service.open_reward; a trained model: the run's
     reward/), reward_normalised as stage=score makes it (the mini-batch's own z-score with
     reward_source.calibrate);
  4. select: the select group's rule (rsft.best_of_k, the pure functions stage=select runs), per prompt;
     a mini-batch that keeps nothing takes no step (logged);
  5. train: online.steps_per_batch AdamW steps of online.batch_size examples (the kept completions, with
     online.replay of the earlier mini-batches' kept ones drawn in), walked in a seeded order. The loss is
     SFT's: the prompt and completion rendered through the policy's chat template as TRL's SFTTrainer
     renders them (rsft.policy_training.cut_examples), cross-entropy on the completion tokens only (a cut
     answer without its end of turn), the mean over the step's completion tokens. LoRA (peft, the sft
     settings' kind: online.lora) or full; the optimiser and the learning-rate schedule (over every step of
     the stage) carry across mini-batches. With online.dpo_weight > 0 every step adds that weight x a DPO
     loss on each prompt's best-vs-worst survivors (stage=select's pairs), against the initial policy
     (LoRA: the adapter off; full: a frozen copy), to learn from the worst completions too.
The training step is written by hand: TRL's SFTTrainer trains on one fixed dataset, and here the data is
new every mini-batch while the optimiser's state must carry over. Under torchrun every process samples its
share of a mini-batch (sample_dataset shards the prompts and gathers every row to every process), and
trains data-parallel: each takes every W-th example of a step's batch, its loss summed over its completion
tokens and divided by the whole batch's, and the gradients are summed over the processes (all_reduce), so
a step is the one a single process takes.

With online.refresh_every = R > 0 the reward model follows the policy, as loop.refresh_reward makes it follow
the rounds: before scoring mini-batch b where R divides b + 1, the samples of mini-batches b - R + 1 .. b are
labelled (rsft.pairs: the refresh group's choice of pairs, the demo's simulated annotators), and the
reward model is retrained on the initial labels and every refresh's so far (refresh.init: continuing the
current model for refresh.epochs, or from scratch); it scores mini-batch b and the ones after, until the next.
So when R mini-batches hold a round's prompts, the labels are the rounds' labels. Each refreshed model is
written to the resume folder (every process trains it, as stage=refresh under torchrun, and the main process
writes it); the snapshots keep scoring with the run's reward/, as stage=eval scores every round.

Every online.eval_every mini-batches (and before the first, and after the last) the policy is evaluated
as stage=eval evaluates one (rsft.metrics.policy_metrics): eval.num_samples completions of each held-out
prompt with eval.seed, scored by the reward, with gold where the task has an oracle, against the snapshot
before the first mini-batch; each snapshot records the completions and tokens sampled so far and the wall
time, which is the comparison with the rounds (gold against tokens sampled). With eval.judge the snapshots
are scored by the judge too (the comparison on a task without an oracle).

Resume: every online.checkpoint_every mini-batches a checkpoint (rsft.checkpoints.LoopCheckpoints: verified,
written last, the older one dropped) holds the trainable weights (the adapter with LoRA), the optimiser
and schedule, the python, numpy and torch RNG states, the position in the prompt stream, the kept rows
(also the replay buffer), the per-mini-batch metrics and the eval snapshots. A rerun of the same command
resumes after the newest one, so a kill redoes at most C mini-batches; on CPU the resumed run ends as an
uninterrupted one does, completion for completion and weight for weight (tests/test_online.py). Wall
seconds are the time each mini-batch took in whichever run did it.

Writes online/: policy/ (a save_pretrained folder, LoRA merged, like round_XX/policy), kept/ (every kept
completion, a dataset with its mini-batch in `round`), evals/batch_XXXX/ (each snapshot's scored
completions) and metrics.json (per mini-batch: completions and tokens sampled, cumulative too, wall
seconds, mean and kept reward, loss, gold; the snapshots' metrics).
"""

from __future__ import annotations

import copy
import json
import logging
import random
import shutil
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from reward.formats import pair_files
from reward.trained import save_reward_model
from rsft import distributed, reward_service
from rsft.config import samples_per_prompt, uses_trained_reward
from rsft.data import load_prompts, prompt_files
from rsft.errors import ConfigError, InputError
from rsft.guard import crossed as guard_crossed
from rsft.guard import watch_initial
from rsft.generation import (
    adaptive_k,
    build_draft,
    prune_schedule,
    sample_dataset,
    sampling_settings,
)
from rsft.pairs import labelled_pairs
from rsft.metrics import METRICS_FILE, flat_metrics, gold_scores, policy_metrics
from rsft.models import load_policy, resolve_device
from rsft.paths import RunPaths
from rsft.policy_training import cut_examples, lora_config, policy_writer
from rsft.bt_fit import load_pairs, pooled, refresh_training, train_and_measure
from rsft.runner import Built, Job, Plan
from rsft.sampling.budget import PRUNED
from rsft.best_of_k import select_groups, selected_rows, survivors
from rsft.store import atomic_artifact
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


# ---- the policy that trains ----


@dataclass
class Policy:
    """The policy in memory: `model` samples and trains (with LoRA, the base model with peft's adapters in its
    layers); `wrapper` is the peft model (None for full fine-tuning); the optimiser and schedule carry over."""

    model: torch.nn.Module
    wrapper: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    schedule: object
    device: torch.device
    reference: torch.nn.Module | None = None  # full training with the DPO term: a frozen copy of the initial policy

    @classmethod
    def build(cls, model, online: DictConfig, device, total_steps: int) -> Policy:
        from transformers import get_scheduler

        reference = None
        if online.dpo_weight > 0 and online.mode != "lora":  # LoRA's reference is the adapter turned off
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        wrapper = None
        if online.mode == "lora":
            from peft import get_peft_model

            wrapper = get_peft_model(model, lora_config(online))  # its A matrices are drawn from torch's RNG
            model = wrapper.get_base_model()
        trainable = [p for p in (wrapper or model).parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=online.learning_rate,
                                      weight_decay=online.weight_decay)
        schedule = get_scheduler(online.lr_scheduler, optimizer, num_warmup_steps=online.warmup_steps,
                                 num_training_steps=total_steps)
        return cls(model, wrapper, optimizer, schedule, device, reference)

    @contextmanager
    def as_reference(self):
        """The initial policy, the DPO term's reference: with LoRA the model with its adapter off."""
        if self.wrapper is None:
            yield self.reference
            return
        with self.wrapper.disable_adapter():
            yield self.model

    def trainable(self) -> dict[str, torch.Tensor]:
        """The weights that train (the adapter with LoRA, every weight otherwise), by name."""
        return {n: p.detach().clone() for n, p in (self.wrapper or self.model).named_parameters() if p.requires_grad}

    def load_trainable(self, weights: dict[str, torch.Tensor]) -> None:
        result = (self.wrapper or self.model).load_state_dict(weights, strict=False)
        if result.unexpected_keys or set(weights) != set(self.trainable()):  # a checkpoint of another model: a bug
            raise RuntimeError(f"the checkpoint's weights do not match the policy's: {result.unexpected_keys[:3]}")

    def final(self):
        """The model to save: LoRA merged into the weights."""
        model = self.wrapper.merge_and_unload() if self.wrapper is not None else self.model
        model.eval()
        return model


def padded(examples: list[dict], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, loss mask) of examples, right-padded: [rows, longest]."""
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), longest), pad_id, dtype=torch.long)  # [rows, longest]
    attention = torch.zeros((len(examples), longest), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), longest), dtype=torch.bool)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        attention[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(e["completion_mask"], dtype=torch.bool)
    return ids.to(device), attention.to(device), loss_mask.to(device)


def completion_tokens(examples: list[dict]) -> int:
    """The tokens the loss is taken on: completion tokens after the first token (each is predicted)."""
    return sum(sum(e["completion_mask"][1:]) for e in examples)


def token_nll(model, examples: list[dict], pad_id: int, device) -> torch.Tensor:
    """Each example's cross-entropy summed over its completion tokens: [rows]."""
    ids, attention, loss_mask = padded(examples, pad_id, device)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # [rows, longest - 1, vocab]
    targets = ids[:, 1:]                                                      # [rows, longest - 1]
    nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    return (nll * loss_mask[:, 1:]).sum(dim=1)


@dataclass
class Pairs:
    """A mini-batch's best-vs-worst pairs for the DPO term: the examples and the frozen reference's summed
    log-probabilities of each completion, [pairs] each."""

    chosen: list[dict]
    rejected: list[dict]
    reference_chosen: torch.Tensor
    reference_rejected: torch.Tensor
    beta: float
    weight: float


def train_step(policy: Policy, batch: list[dict], pad_id: int, max_grad_norm: float,
               pairs: Pairs | None = None) -> tuple[float, float | None]:
    """One optimiser step on `batch` (every process's examples; this one takes every W-th): the mean
    cross-entropy over the batch's completion tokens, plus with `pairs` weight x the mean DPO loss
    -log sigmoid(beta ((log pi - log ref)(chosen) - (log pi - log ref)(rejected))) over every pair. Returns
    (the SFT loss, the DPO loss or None)."""
    total = completion_tokens(batch)
    rank, world = distributed.rank(), distributed.world_size()
    mine = batch[rank::world]
    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    sums = torch.zeros(2, device=policy.device)  # [SFT loss summed over tokens, DPO loss summed over pairs]
    objective = torch.zeros((), device=policy.device)
    if mine and total:
        loss_sum = token_nll(policy.model, mine, pad_id, policy.device).sum()
        objective = objective + loss_sum / total
        sums[0] = loss_sum.detach()
    if pairs is not None and pairs.chosen[rank::world]:
        chosen = -token_nll(policy.model, pairs.chosen[rank::world], pad_id, policy.device)      # [my pairs]
        rejected = -token_nll(policy.model, pairs.rejected[rank::world], pad_id, policy.device)  # [my pairs]
        margin = (chosen - pairs.reference_chosen[rank::world]) - (rejected - pairs.reference_rejected[rank::world])
        dpo_sum = -torch.nn.functional.logsigmoid(pairs.beta * margin).sum()
        objective = objective + pairs.weight * dpo_sum / len(pairs.chosen)
        sums[1] = dpo_sum.detach()
    if objective.requires_grad:
        objective.backward()
    params = [p for p in policy.optimizer.param_groups[0]["params"]]
    if world > 1:  # data-parallel: the sum of every process's share is the batch's gradient
        for p in params:
            if p.grad is None:  # a process without examples in this step still takes part in every sum
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
        torch.distributed.all_reduce(sums)
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    policy.optimizer.step()
    policy.schedule.step()
    policy.model.eval()
    sft = float(sums[0]) / max(total, 1)  # no completion tokens (empty answers): no SFT term, loss 0
    return sft, (float(sums[1]) / len(pairs.chosen) if pairs is not None else None)


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
    policy: Policy
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


def scored(ctx: Context, ds: Dataset, calibrate: bool) -> list[dict]:
    """The completed rows (pruned prefixes left out) with reward and reward_normalised, as stage=score gives them."""
    rows = [r for r in ds.to_list() if r["finish_reason"] != PRUNED]
    if not rows:
        return []
    others = [{k: v for k, v in r.items() if k not in ("prompt", "completion")} for r in rows]
    raw = reward_service.score_rows(ctx.scorer, [r["prompt"] for r in rows], [r["completion"] for r in rows], others,
                             progress=False)
    normalised, _ = reward_service.normalised_rewards(ctx.scorer, raw, calibrate, "the mini-batch")  # as stage=score's
    return [{**r, "reward": None if v is None else float(v), "reward_normalised": n}
            for r, v, n in zip(rows, raw, normalised)]


def keep(cfg: DictConfig, candidates: list[dict], batch: int) -> list[dict]:
    """The select group's rule over the mini-batch's candidates (rsft.best_of_k); [] when it keeps nothing."""
    by_prompt: dict = {}
    for row in candidates:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    groups = lambda: iter(by_prompt.items())  # the rule reads the groups twice: decide, then take
    try:
        chosen = select_groups(groups, [r["reward"] for r in candidates if r["reward"] is not None], cfg.select,
                               cfg.seed, batch, want_pairs=False)
    except InputError as error:  # nothing kept: this mini-batch takes no step
        log.warning("online: mini-batch %d keeps nothing (%s); no optimiser step", batch, error)
        return []
    return list(selected_rows(groups, chosen, cfg.select, batch))


def best_and_worst(cfg: DictConfig, candidates: list[dict]) -> list[tuple[dict, dict]]:
    """Each prompt's best and worst survivor by the select group's ranking (rsft.best_of_k.survivors), where
    they differ in reward: stage=select's pairs."""
    by_prompt: dict = {}
    for row in candidates:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    pairs = []
    for group in by_prompt.values():
        ranked, _ = survivors(group, cfg.select)
        if len(ranked) >= 2 and ranked[0]["reward"] != ranked[-1]["reward"]:
            pairs.append((ranked[0], ranked[-1]))
    return pairs


def examples_of(ctx: Context, rows: list[dict]) -> list[dict]:
    """The SFT examples of kept rows (stage=sft's rendering), cut to online.max_length tokens."""
    if not rows:
        return []
    table = Dataset.from_dict({k: [r[k] for r in rows] for k in ("prompt", "completion", "finish_reason")})
    cut = ctx.cfg.online.max_length
    return [{"input_ids": e["input_ids"][:cut], "completion_mask": e["completion_mask"][:cut]}
            for e in cut_examples(table, ctx.tokenizer, ctx.system_prompt).to_list()]


def dpo_pairs(ctx: Context, pairs: list[tuple[dict, dict]], pad_id: int) -> Pairs | None:
    """The DPO term's pairs, with the reference's log-probabilities (computed once: it is frozen)."""
    online = ctx.cfg.online
    if not pairs or online.dpo_weight == 0:
        return None
    chosen, rejected = examples_of(ctx, [b for b, _ in pairs]), examples_of(ctx, [w for _, w in pairs])
    with torch.no_grad(), ctx.policy.as_reference() as reference:
        reference_chosen = -token_nll(reference, chosen, pad_id, ctx.policy.device)      # [pairs]
        reference_rejected = -token_nll(reference, rejected, pad_id, ctx.policy.device)  # [pairs]
    return Pairs(chosen, rejected, reference_chosen, reference_rejected, online.dpo_beta,
                 online.dpo_weight)


def train_on(ctx: Context, kept: list[dict], earlier: list[dict], batch: int,
             pairs: list[tuple[dict, dict]] = ()) -> dict:
    """online.steps_per_batch steps on the kept rows and online.replay of the earlier ones (with
    online.dpo_weight, and the DPO term on the mini-batch's best-vs-worst pairs); the losses."""
    online = ctx.cfg.online
    replayed = []
    if online.replay and earlier:
        draw = random.Random(f"{ctx.cfg.seed}/replay/{batch}")
        replayed = [earlier[i] for i in sorted(draw.sample(range(len(earlier)), min(online.replay, len(earlier))))]
    examples = examples_of(ctx, kept + replayed)
    if not examples:
        return {"steps": 0, "examples": 0, "replayed": 0, "loss": None}
    order = list(range(len(examples)))
    random.Random(f"{ctx.cfg.seed}/order/{batch}").shuffle(order)
    size, losses, dpo_losses, at = min(online.batch_size, len(examples)), [], [], 0
    pad_id = ctx.tokenizer.pad_token_id if ctx.tokenizer.pad_token_id is not None else 0
    dpo = dpo_pairs(ctx, list(pairs), pad_id)
    for _ in range(online.steps_per_batch):
        step = [examples[order[(at + j) % len(order)]] for j in range(size)]
        at += size
        loss, dpo_loss = train_step(ctx.policy, step, pad_id, online.max_grad_norm, dpo)
        losses.append(loss)
        dpo_losses += [dpo_loss] if dpo_loss is not None else []
    return {"steps": len(losses), "examples": len(examples), "replayed": len(replayed),
            "loss": statistics.fmean(losses), "loss_last": losses[-1],
            **({"dpo_pairs": len(dpo.chosen) if dpo else 0, "dpo_loss": statistics.fmean(dpo_losses) if dpo else None}
               if online.dpo_weight > 0 else {}),
            "learning_rate": float(ctx.policy.schedule.get_last_lr()[0])}


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
    candidates = scored(ctx, ds, reward_service.calibrates(cfg))
    kept = keep(cfg, candidates, batch)
    pairs = best_and_worst(cfg, candidates) if cfg.online.dpo_weight > 0 else []
    trained = train_on(ctx, kept, progress.kept, batch, pairs)
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
    initial_train, initial_test, source = load_pairs(cfg)
    train = pooled([initial_train, *(Dataset.from_list(s["train"]) for s in progress.labels if s["train"])])
    test = pooled([initial_test, *(Dataset.from_list(s["test"]) for s in progress.labels if s["test"])])
    start_from = None if cfg.refresh.init == "scratch" else current
    train_cfg = refresh_training(cfg, start_from)
    log.info("online: refresh %d before scoring mini-batch %d: %d new labelled pairs; the reward model trains on %d "
             "pairs (%s and every refresh's), %s", index + 1, batch, counts["pairs"], len(train), source,
             "from scratch" if start_from is None else f"continuing {current}")
    states = rng_states()  # the reward trainer seeds every RNG itself; the policy's training goes on from its own
    model, tokenizer, stats, metrics = train_and_measure(train_cfg, train, test, device, None, start_from)
    set_rng_states(states)
    target = ctx.refreshed.model(index + 1)
    if distributed.is_main():  # a reward model folder as stage=refresh writes one (a complete artifact)
        with atomic_artifact(target, {"stage": "online", "refresh": index + 1, "batch": batch, "metrics": metrics,
                                      "backbone": cfg.reward.backbone.name_or_path}) as tmp:
            save_reward_model(model, tokenizer, tmp, stats)
    distributed.barrier()
    del model
    ctx.scorer = reward_service.open_reward(cfg, device, target)
    record = {"refresh": index + 1, "batch": batch, "mini-batches": sorted({int(r["prompt_id"].rsplit("@", 1)[1])
                                                                          for r in progress.unlabelled}),
              "labelled_pairs": counts["pairs"], "train_pairs": len(train), "test_pairs": len(test),
              **{k: metrics[k] for k in ("heldout_accuracy", "train_accuracy", "gold_agreement") if k in metrics},
              "seconds": round(time.perf_counter() - started, 3)}
    progress.refreshes.append(record)
    progress.unlabelled = []
    log.info("online: refresh %d: held-out accuracy %.3f on %d pairs", index + 1, metrics["heldout_accuracy"],
             metrics["heldout_pairs"])


def evaluate(ctx: Context, prompts: Dataset, batch: int) -> Dataset:
    """The policy now on the held-out prompts, as stage=eval samples and scores them (its seed, its K)."""
    cfg = ctx.cfg
    provenance = {"round": batch, "policy": f"online (after {batch} mini-batches)",
                  "sampler": json.dumps({**ctx.settings.__dict__, "draft": "none"}, sort_keys=True)}
    ctx.policy.model.eval()
    with torch.no_grad():
        ds, _ = sample_dataset(ctx.policy.model, ctx.tokenizer, None, prompts, ctx.settings, cfg.eval.num_samples,
                               cfg.eval.seed, ctx.system_prompt, provenance, progress=False, entropy=True)
    return reward_service.scored_evaluation(ds, ctx.eval_scorer or ctx.scorer, ctx.judge)


def snapshot(ctx: Context, prompts: Dataset, progress: Progress, batch: int, tracker) -> None:
    """Evaluate after `batch` mini-batches; its rows and metrics join `progress`."""
    baseline = Dataset.from_list(progress.eval_rows[0]) if 0 in progress.eval_rows else None
    ds = evaluate(ctx, prompts, batch)
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
    factor = guard.lr_factor
    for group in ctx.policy.optimizer.param_groups:
        group["lr"] *= factor
    if hasattr(ctx.policy.schedule, "base_lrs"):  # the schedule multiplies its base rates: they carry the factor on
        ctx.policy.schedule.base_lrs = [rate * factor for rate in ctx.policy.schedule.base_lrs]
    log.warning("online.guard: %s; the learning rate is multiplied by %g from here", reason, factor)
    return None


# ---- resume ----


def rng_states() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def seed_everything(seed: int) -> None:
    """A fresh run starts from RNG states of its seed alone, whatever ran before it in the process."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def checkpoint_state(policy: Policy, progress: Progress) -> dict:
    return {"weights": policy.trainable(), "optimizer": policy.optimizer.state_dict(),
            "schedule": policy.schedule.state_dict(), "rng": rng_states(), "next_batch": progress.next_batch,
            "kept": progress.kept, "minibatches": progress.minibatches, "evals": progress.evals,
            "eval_rows": progress.eval_rows, "unlabelled": progress.unlabelled, "labels": progress.labels,
            "refreshes": progress.refreshes, "guard": progress.guard}


def resume(checkpoints, policy: Policy) -> Progress:
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
    policy = Policy.build(model, online, device, batches * online.steps_per_batch)
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
