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

from rsft import distributed
from rsft.data import (
    duplicate_prompts,
    load_prompts,
    prompt_files,
    prompt_keys,
)
from rsft.generation import (
    TRAINED_DRAFT_KINDS,
    adaptive_k,
    build_draft,
    engine_keys,
    open_policy,
    prune_schedule,
    round_seed,
    sample_dataset,
    sampling_settings,
)
from rsft.models import (
    resolve_device,
)
from rsft.paths import (
    RunPaths,
    ShardStore,
    atomic_artifact,
    fingerprint,
    finished,
    should_skip,
)
from rsft import scoring
from rsft.tracking import Tracker, stage_tracker

log = logging.getLogger(__name__)





































def wanted_fingerprint(cfg: DictConfig, paths: RunPaths) -> dict:
    """The samples' fingerprint (rsft.paths): the seed, round, policy, prompt, sampling and draft
    settings, the policy and distilled draft artifacts they came from, the prompt file, and with
    pruning or adaptive K the reward model that decides them. Not in it: sample.batch_rows when
    sampling plainly (each completion has its own generator, and the packed forward gives every row a
    plain forward's logits), sample.prune / sample.adaptive while they are off (so samples made before
    they existed still match), threads, device, logger, progress."""
    round_idx = int(cfg.round)
    inputs = [p for p in (paths.sampling_policy(round_idx),) if p is not None]
    if cfg.draft.kind in TRAINED_DRAFT_KINDS:
        inputs.append(paths.sampling_draft(round_idx))
    prune, adaptive = prune_schedule(cfg.sample), adaptive_k(cfg.sample)
    if prune is not None or adaptive is not None:
        inputs.append(paths.budget_reward(round_idx))
    keys = ("seed", "round", "policy", *prompt_keys("train", cfg.data.kind), "sample", "draft")
    wanted = fingerprint(cfg, keys, inputs, prompt_files(cfg.data, "train"))
    if cfg.draft.kind == "none":
        wanted["config"].pop("sample.batch_rows")
    off = [prefix for prefix, on in (("sample.prune.", prune), ("sample.adaptive.", adaptive),
                                     ("sample.backend", engine_keys(cfg)), ("sample.vllm.", engine_keys(cfg))) if not on]
    for key in list(wanted["config"]):
        if key.startswith(tuple(off)):
            wanted["config"].pop(key)
    return wanted


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths.from_config(cfg)
    out = paths.samples(cfg.round)
    settings = sampling_settings(cfg.sample, cfg.draft)  # bad settings stop here, before anything is loaded
    wanted = wanted_fingerprint(cfg, paths)
    if should_skip(out, cfg.overwrite, "sample", wanted):
        return finished(out)
    prompts = load_prompts(cfg.data, "train", int(cfg.round))  # with data.rotate, round r's own slice
    device = resolve_device(cfg.device)
    seed = round_seed(cfg.seed, cfg.round)
    model, tokenizer, policy_source, engine = open_policy(cfg, paths.sampling_policy(int(cfg.round)), device,
                                                          settings, seed)
    draft = None if engine is not None else build_draft(cfg, model, tokenizer, device)
    prune, adaptive = prune_schedule(cfg.sample), adaptive_k(cfg.sample)
    scorer = None
    if prune is not None or adaptive is not None:
        budget_reward = paths.budget_reward(int(cfg.round))
        scorer = scoring.load_reward_scorer(cfg, device, budget_reward)
        spending = ([f"pruning at {list(prune.checkpoints)} tokens (share {prune.share})"] if prune else []) + (
            [f"adaptive K (k0={adaptive[0]}, mean {adaptive[1]:g} per prompt)"] if adaptive else [])
        log.info("sample: %s with the reward model at %s", " and ".join(spending), budget_reward)
    provenance = {
        "round": int(cfg.round),
        "policy": policy_source,
        "sampler": json.dumps({**settings.__dict__, "draft": cfg.draft.kind,
                               **({"prune": OmegaConf.to_container(cfg.sample.prune)} if prune else {}),
                               **({"adaptive": OmegaConf.to_container(cfg.sample.adaptive)} if adaptive else {}),
                               **({"backend": "vllm"} if engine is not None else {})},
                              sort_keys=True),
    }
    log.info("sampling %d x %d completions (draft=%s, gamma=%d, batch_rows=%d)", len(prompts),
             cfg.sample.num_samples, cfg.draft.kind, settings.gamma, settings.batch_rows)
    store = ShardStore(out, wanted)
    ds, summary = sample_dataset(model, tokenizer, draft, prompts, settings, int(cfg.sample.num_samples), seed,
                                 cfg.data.get("system_prompt"), provenance, shard_prompts=int(cfg.sample.shard_prompts),
                                 store=store, scorer=scorer, prune=prune, adaptive=adaptive, engine=engine)
    if engine is not None:
        engine.close()
    meta = {"stage": "sample", "round": int(cfg.round), "policy": policy_source, "counts": {"rows": len(ds)},
            "duplicate_prompts": duplicate_prompts(prompts), "sampling": summary,
            "config": OmegaConf.to_container(cfg, resolve=True)}
    if distributed.is_main():  # the other processes hold the same rows; one writes them
        with atomic_artifact(out, meta, wanted) as tmp:
            ds.save_to_disk(str(tmp))
    store.remove()
    log.info("wrote %d completions to %s (%.1f tokens/s, acceptance %s)", len(ds), out,
             summary["tokens_per_second"], summary.get("acceptance_rate"))
    with stage_tracker(cfg, "sample", tracker) as tracker:
        tracker.log({f"sample/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}, step=int(cfg.round))
    return finished(out)
