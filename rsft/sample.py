"""stage=sample: K completions per prompt from the round's policy, written as a dataset.

    python -m rsft.run stage=sample [round=0] [draft=ngram] [sample.num_samples=8]

Reads the prompt set (conf/data) and the round's policy (RunPaths.sampling_policy: round 0
conf/policy, round r the policy SFT wrote in round r - 1) and, with draft=distilled or
draft=feature, its draft (RunPaths.sampling_draft); writes runs/<run_name>/round_XX/samples/ with
one row per completion: prompt_id, prompt, sample_idx, completion, completion_ids, num_tokens,
finish_reason, seed, round, policy, sampler settings and acceptance counts, plus the prompt set's
other columns. meta.json carries the acceptance statistics and throughput.
"""

from __future__ import annotations

import json
import logging

from omegaconf import DictConfig, OmegaConf

from rsft import reward_service
from rsft.config import samples_per_prompt, uses_trained_reward
from rsft.data import duplicate_prompts, load_prompts, prompt_files
from rsft.generation import (
    TRAINED_DRAFT_KINDS,
    adaptive_k,
    build_draft,
    open_policy,
    prune_schedule,
    round_seed,
    sample_dataset,
    sampling_settings,
)
from rsft.models import resolve_device
from rsft.paths import RunPaths
from rsft.rows import save_dataset
from rsft.runner import Built, Job, Plan

log = logging.getLogger(__name__)


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """The samples read the policy and distilled draft artifacts they come from, the prompt file, and with
    pruning or adaptive K the reward model that decides them (their settings: rsft.stages)."""
    sampling_settings(cfg.sample, cfg.draft)  # bad settings stop here, before anything is loaded
    round_idx, policy, budget_reward = cfg.round, paths.sampling_policy(cfg.round), None
    inputs = [p for p in (policy,) if p is not None]
    if cfg.draft.kind in TRAINED_DRAFT_KINDS:
        inputs.append(paths.sampling_draft(round_idx))
    sources = {}
    if prune_schedule(cfg.sample) is not None or adaptive_k(cfg.sample) is not None:  # the reward decides them
        budget_reward = paths.budget_reward(round_idx) if uses_trained_reward(cfg) else None
        inputs += [budget_reward] if budget_reward is not None else []
        sources = reward_service.source_identity(cfg, resolve_device(cfg.device))
    return Plan(outputs=[paths.samples(round_idx)], inputs=inputs, user_files=prompt_files(cfg.data, "train"),
                sources=sources, given={"policy": policy, "budget_reward": budget_reward})


def build(cfg: DictConfig, job: Job) -> Built:
    round_idx, budget_reward = cfg.round, job.plan.given["budget_reward"]
    settings = sampling_settings(cfg.sample, cfg.draft)
    prompts = load_prompts(cfg.data, "train", round_idx)  # with data.rotate, round r's own slice
    device = resolve_device(cfg.device)
    seed = round_seed(cfg.seed, cfg.round)
    model, tokenizer, policy_source, engine = open_policy(cfg, job.plan.given["policy"], device,
                                                          settings, seed)
    draft = None if engine is not None else build_draft(cfg, model, tokenizer, device)
    prune, adaptive = prune_schedule(cfg.sample), adaptive_k(cfg.sample)
    scorer = None
    if prune is not None or adaptive is not None:
        scorer = reward_service.open_reward(cfg, device, budget_reward)
        spending = ([f"pruning at {list(prune.checkpoints)} tokens (share {prune.share})"] if prune else []) + (
            [f"adaptive K (k0={adaptive[0]}, mean {adaptive[1]:g} per prompt)"] if adaptive else [])
        log.info("sample: %s with the reward model at %s", " and ".join(spending),
                 budget_reward or reward_service.source_spec(cfg))
    provenance = {
        "round": round_idx,
        "policy": policy_source,
        "sampler": json.dumps({**settings.__dict__, "draft": cfg.draft.kind,
                               **({"prune": OmegaConf.to_container(cfg.sample.prune)} if prune else {}),
                               **({"adaptive_k": OmegaConf.to_container(cfg.sample.adaptive_k)} if adaptive else {}),
                               **({"backend": "vllm"} if engine is not None else {})},
                              sort_keys=True),
    }
    log.info("sampling %d x %d completions (draft=%s, gamma=%d, batch_rows=%d)", len(prompts),
             cfg.sample.num_samples, cfg.draft.kind, settings.gamma, settings.batch_rows)
    ds, summary = sample_dataset(model, tokenizer, draft, prompts, settings, samples_per_prompt(cfg.sample), seed,
                                 cfg.data.get("system_prompt"), provenance, shard_prompts=cfg.sample.shard_prompts,
                                 store=job.shards(), scorer=scorer, prune=prune, adaptive=adaptive, engine=engine)
    if engine is not None:
        engine.close()
    meta = {"stage": "sample", "round": round_idx, "policy": policy_source, "counts": {"rows": len(ds)},
            "duplicate_prompts": duplicate_prompts(prompts), "sampling": summary}
    log.info("sampled %d completions into %s (%.1f tokens/s, acceptance %s)", len(ds), job.out,
             summary["tokens_per_second"], summary.get("acceptance_rate"))
    metrics = {f"sample/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
    # ds is the folder the shards were assembled into (rsft.generation.assemble_samples): copied, not read row by row
    return Built([(meta, lambda tmp: save_dataset(ds, tmp))], metrics, step=round_idx)
