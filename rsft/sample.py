"""stage=sample: K completions per prompt from the round's policy, written as a dataset.

    python -m rsft.run stage=sample [round=0] [draft=ngram] [sample.num_samples=8]

Reads the prompt set (conf/data) and the round's policy (round 0: conf/policy; round r: the policy
SFT wrote in round r - 1); writes runs/<run_name>/round_XX/samples/ with one row per completion:
prompt_id, prompt, sample_idx, completion, completion_ids, num_tokens, finish_reason, seed, round,
policy, sampler settings and acceptance counts, plus the prompt set's other columns. meta.json
carries the acceptance statistics and throughput.
"""

from __future__ import annotations

import json
import logging
import time

from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from rsft.data import chat_text, load_prompts
from rsft.models import eos_token_ids, load_policy, resolve_device
from rsft.paths import RunPaths, atomic_artifact, should_skip
from rsft.sampling.drafts import build_draft
from rsft.sampling.sampler import Sampler, SamplingSettings
from rsft.tracking import Tracker

log = logging.getLogger(__name__)


def sampling_settings(cfg: DictConfig) -> SamplingSettings:
    s, d = cfg.sample, cfg.draft
    settings = SamplingSettings(
        max_new_tokens=int(s.max_new_tokens), temperature=float(s.temperature), top_k=int(s.top_k),
        top_p=float(s.top_p), strategy=str(s.strategy), leniency=float(s.leniency),
        batch_rows=int(s.batch_rows), gamma=int(d.gamma) if d.kind != "none" else 0,
        adaptive=bool(d.get("adaptive", False)),
    )
    settings.check()
    return settings


def round_seed(seed: int, round_idx: int) -> int:
    return int(seed) * 1_000_003 + int(round_idx)


def sample_dataset(model, tokenizer, draft, prompts: Dataset, settings: SamplingSettings, num_samples: int,
                   seed: int, system_prompt: str | None, provenance: dict, progress: bool = True):
    """Sample and assemble the samples dataset; returns (dataset, sampler summary)."""
    texts = [chat_text(tokenizer, p, system_prompt) for p in prompts["prompt"]]
    prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    sampler = Sampler(model, settings, eos_token_ids(model, tokenizer), draft=draft)
    started = time.perf_counter()
    completions = sampler.generate(prompt_ids, num_samples, seed, progress=progress)
    seconds = time.perf_counter() - started
    extra_columns = [c for c in prompts.column_names if c not in ("prompt_id", "prompt")]
    rows = []
    for c in completions:
        source = prompts[c.prompt_index]
        rows.append({
            "prompt_id": source["prompt_id"],
            "prompt": source["prompt"],
            "sample_idx": c.sample_idx,
            "completion": tokenizer.decode(c.token_ids, skip_special_tokens=True),
            "completion_ids": c.token_ids,
            "num_tokens": len(c.token_ids),
            "finish_reason": c.finish_reason,
            "seed": c.seed,
            **provenance,
            "num_drafted": c.num_drafted,
            "num_accepted": c.num_accepted,
            "num_target_forwards": c.num_target_forwards,
            **{k: source[k] for k in extra_columns},
        })
    summary = sampler.summary()
    total_tokens = sum(len(c.token_ids) + (c.finish_reason == "eos") for c in completions)
    summary.update({
        "num_completions": len(completions),
        "num_prompts": len(prompts),
        "tokens": total_tokens,
        "seconds": round(seconds, 2),
        "tokens_per_second": round(total_tokens / max(seconds, 1e-9), 2),
        "eos_fraction": sum(c.finish_reason == "eos" for c in completions) / max(len(completions), 1),
        "mean_tokens": sum(len(c.token_ids) for c in completions) / max(len(completions), 1),
    })
    return Dataset.from_list(rows), summary


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths(cfg.paths.run_dir)
    out = paths.samples(cfg.round)
    if should_skip(out, cfg.overwrite, "sample"):
        return out
    settings = sampling_settings(cfg)  # bad settings stop here, before anything is loaded
    prompts = load_prompts(cfg.data, "train")
    device = resolve_device(cfg.device)
    model, tokenizer, policy_source = load_policy(cfg, cfg.round, device)
    draft = build_draft(cfg, model, tokenizer, device, cfg.round)
    provenance = {
        "round": int(cfg.round),
        "policy": policy_source,
        "sampler": json.dumps({**settings.__dict__, "draft": cfg.draft.kind}, sort_keys=True),
    }
    seed = round_seed(cfg.seed, cfg.round)
    log.info("sampling %d x %d completions (draft=%s, gamma=%d, batch_rows=%d)", len(prompts),
             cfg.sample.num_samples, cfg.draft.kind, settings.gamma, settings.batch_rows)
    ds, summary = sample_dataset(model, tokenizer, draft, prompts, settings, int(cfg.sample.num_samples), seed,
                                 cfg.data.get("system_prompt"), provenance)
    meta = {"stage": "sample", "round": int(cfg.round), "policy": policy_source, "counts": {"rows": len(ds)},
            "sampling": summary, "config": OmegaConf.to_container(cfg, resolve=True)}
    with atomic_artifact(out, meta) as tmp:
        ds.save_to_disk(str(tmp))
    log.info("wrote %d completions to %s (%.1f tokens/s, acceptance %s)", len(ds), out,
             summary["tokens_per_second"], summary.get("acceptance_rate"))
    own_tracker = tracker is None
    tracker = tracker or Tracker(cfg, "sample")
    tracker.log({f"sample/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}, step=int(cfg.round))
    if own_tracker:
        tracker.finish()
    return out
