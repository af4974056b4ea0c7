"""stage=prefs: simulated pairwise labels for the demo task, from the round-0 policy's own samples.

    python -m rsft.run stage=prefs [prefs.num_prompts=64] [prefs.num_samples=4] [prefs.soft=true]

1. Sample prefs.num_samples completions for each of prefs.num_prompts train prompts from the round-0
   policy (rsft.generation.sample_dataset with prefs.seed, its own seed).
2. Score each with the gold oracle (reward.gold; needs the demo task's `task` column).
3. Pair every two distinct completions of a prompt and label the pair with a simulated annotator
   (reward.annotators): P(i beats j) = sigmoid((gold_i - gold_j) / tau), hard (one draw) or soft.
   Each pair is written in TRL's preference format with the preferred side as `chosen`, so
   label_prob >= 0.5 (1.0 for hard labels); identical completions are not paired (counted).
4. Split BY PROMPT into train and test (no prompt's pairs on both sides) and write
   runs/<run_name>/prefs/ (a DatasetDict) with meta.json.

Users with their own preference data skip this stage: stage=reward reward.data.path=...
"""

from __future__ import annotations

import logging
import random

from omegaconf import DictConfig, OmegaConf

from reward.gold import gold_score
from rsft.data import load_prompts, prompt_files
from rsft.generation import open_policy, sample_dataset, sampling_settings
from rsft.pairs import label_pairs, split_by_prompt
from rsft.models import resolve_device
from rsft.paths import RunPaths
from rsft.runner import Built, Job, Plan

log = logging.getLogger(__name__)


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """The configured policy, the prompts and every prefs setting but batch_rows (rsft.stages)."""
    sampling_settings(cfg.prefs)  # bad settings stop here, before anything is loaded
    return Plan(outputs=[paths.prefs], user_files=prompt_files(cfg.data, "train"))


def build(cfg: DictConfig, job: Job) -> Built:
    p = cfg.prefs
    settings = sampling_settings(p)
    limit = p.num_prompts if p.num_prompts is not None else cfg.data.limit
    prompts = load_prompts(OmegaConf.merge(cfg.data, {"limit": limit}), "train")
    device = resolve_device(cfg.device)
    model, tokenizer, policy_source, engine = open_policy(cfg, job.paths.sampling_policy(0), device, settings,
                                                          p.seed)
    log.info("prefs: sampling %d prompts x %d completions from %s", len(prompts), p.num_samples, policy_source)
    # killed prefs sampling resumes at its first unfinished shard of prompts
    samples, summary = sample_dataset(model, tokenizer, None, prompts, settings, p.num_samples, p.seed,
                                      cfg.data.get("system_prompt"), {"round": 0, "policy": policy_source},
                                      shard_prompts=cfg.sample.shard_prompts, store=job.shards(), engine=engine)
    if engine is not None:
        engine.close()
    golds = [gold_score(t, c, f) for t, c, f in zip(samples["task"], samples["completion"], samples["finish_reason"])]
    rng = random.Random(p.seed)
    rows, identical = label_pairs(samples, golds, p.tau, bool(p.soft), rng)
    splits = split_by_prompt(rows, p.test_fraction, rng)
    counts = {"prompts": len(prompts), "completions": len(samples), "pairs": len(rows),
              "train_pairs": len(splits["train"]), "test_pairs": len(splits["test"]),
              "identical_pairs_skipped": identical,
              "gold_ties": sum(r["gold_chosen"] == r["gold_rejected"] for r in rows),
              "label_against_gold": sum(r["gold_chosen"] < r["gold_rejected"] for r in rows)}
    stats = {"gold_mean": sum(golds) / len(golds), "label_prob_mean": sum(r["label_prob"] for r in rows) / len(rows)}
    meta = {"stage": "prefs", "policy": policy_source, "seed": p.seed, "soft": bool(p.soft), "tau": p.tau,
            "counts": counts, "stats": stats, "sampling": summary}
    log.info("labelled %d pairs (%d train / %d test) for %s; %d identical pairs skipped, %d labels disagree "
             "with the gold order", len(rows), counts["train_pairs"], counts["test_pairs"], job.out, identical,
             counts["label_against_gold"])
    return Built([(meta, lambda tmp: splits.save_to_disk(str(tmp)))],
                 {f"prefs/{k}": v for k, v in {**counts, **stats}.items()})
