"""stage=eval: how good a policy is on held-out prompts, and the round's best-of-K statistics.

    python -m rsft.run stage=eval round=1          # the policy round 1 trained (round_01/policy)
    python -m rsft.run stage=eval eval.policy=initial   # the configured policy, before any round

Round semantics (rsft.paths.RunPaths.eval_policy): `eval round=r` judges the policy round r
trained (round_XX/policy). The initial policy's
evaluation (eval_initial/) is the baseline: a round's eval builds it first when it is missing.

Every policy is sampled with the same seed (eval.seed) on the same held-out prompts
(load_prompts(cfg.data, "eval")), eval.num_samples completions each, with the plain sampler (the
speculative one is exact, so a draft would change nothing but speed). Metrics (metrics.json):
  reward_mean, reward_normalised_mean   the proxy reward model's view (the model selection optimised)
  gold_mean                             the demo task's oracle (only when the prompts have `task`)
  judge_mean                            eval.judge's raw score: a reward model the proxy never was
                                        (trained on other pairs; Gao et al. 2022), the stand-in for
                                        gold where there is no oracle (rsft.reward_service.judge_model)
  intervals                             95% bootstrap interval over prompts of every *_mean and win
                                        rate (rsft.stats: prompts are the independent draws)
  win_rate_vs_initial                   P(this policy's completion scores above the initial policy's
                                        completion with the same prompt and sample index), ties 1/2,
                                        under the proxy; gold_ and judge_win_rate_vs_initial likewise
  vs_initial                            paired differences to the initial policy per score column
                                        ({mean, low, high}); common random numbers make them tight
  distinct_1, distinct_2                distinct word n-grams / all word n-grams across a prompt's
                                        samples, averaged over prompts (diversity within a prompt)
  distinct_1_all, distinct_2_all        the same over the whole eval set pooled (across prompts); each
                                        distinct-n is left out when no completion has n words (one-number
                                        answers have no bigram), never written as 0; `undefined`
                                        {name: why} says so, and a guard's floor counts it as crossed
  top_opening, top_opening_share        the most common first words (rsft.stats.opening) and the share
                                        of completions that open with them: collapse across prompts
                                        ("I'm sorry, but as an AI ..." to everything) that per-prompt
                                        distinct-n cannot see; an empty answer opens with "" and counts
  alike_share, distinct_answers         the share of prompts whose samples are all the same text, and the
                                        distinct texts per prompt (rsft.metrics.range_metrics), with intervals
  pass_at_<k>, <column>_pass_at_<k>     for a verifier's column (every value 0 or 1; never gold, the demo's
                                        graded oracle): the unbiased pass@k, k = 1, 2, 4, 8 up to
                                        eval.num_samples (Chen et al. 2021), each over the prompts with at least
                                        k scored answers; pass_k_coverage {name: prompts} where that is fewer
  <column>_unscorable                   answers the column could not score (None), where there are any: its
                                        means, intervals and pass@k are over the scored ones
  mean_entropy                          the entropy (nats) of the distribution each token was drawn from
                                        (after temperature, top-k, top-p), per completion, averaged; with
                                        its interval (rsft's sampler; absent with sample.backend=vllm)
  mean_tokens, mean_words, eos_fraction
  best_of_n                             from round r's scored samples (the K completions per train
                                        prompt that this policy was trained from): for N = 1..K the
                                        expected max reward of N of them drawn without replacement,
                                        by the unbiased order-statistics estimator
                                        sum_i C(i-1, N-1) / C(K, N) * r_(i) (r_(i) the i-th smallest),
                                        the expected gold score of that reward-best-of-N completion
                                        (where the two curves part, the reward model is being
                                        over-optimised), and the best-of-N KL bound log N - (N-1)/N
                                        (Stiennon et al. 2020; Beirami et al. 2024 show it is an upper bound).
The gold oracle is read here, for evaluation only; selection never sees it.
"""

from __future__ import annotations

import json
import logging

from omegaconf import DictConfig, OmegaConf

from rsft import reward_service
from rsft.config import uses_trained_reward
from rsft.data import load_prompts, prompt_files
from rsft.errors import MissingInput
from rsft.generation import open_policy, sample_evaluation, sampling_settings
from rsft.metrics import (
    METRICS_FILE,
    SCORE_TITLES,
    best_of_n_curve,
    flat_metrics,
    gold_scores,
)
from rsft.models import resolve_device
from rsft.paths import RunPaths
from rsft.runner import Built, Job, Plan
from rsft.store import is_complete, load_dataset_artifact

log = logging.getLogger(__name__)


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """An evaluation reads the policy (configured or an artifact), the reward model and the judge (eval.judge);
    a round's also the baseline, which it builds first when missing, and the round's scored samples
    (best-of-N). The initial evaluation's best-of-N curve is a snapshot of round 0's scored samples if they
    existed when it ran; they are not part of its fingerprint."""
    round_idx, initial = cfg.round, cfg.eval.policy == "initial"
    sampling_settings(cfg.sample)  # plain: a draft would change nothing but speed
    policy_path = None if initial else paths.eval_policy(round_idx)
    if policy_path is not None and not is_complete(policy_path):
        raise MissingInput(f"eval round={round_idx} judges the policy round {round_idx} trained, but "
                           f"{policy_path} is missing; run `python -m rsft.run stage=sft "
                           f"round={round_idx}` first (or eval.policy=initial for the configured policy)")
    trained = uses_trained_reward(cfg)
    if trained:
        reward_service.reward_model(cfg)  # a missing reward model or a bad judge stops here, before any work
    judge = reward_service.judge_model(cfg)
    inputs = ([paths.eval_reward] if trained else []) + [p for p in (judge,) if p is not None]
    device = resolve_device(cfg.device)
    sources = reward_service.source_identity(cfg, device)
    if reward_service.judge_spec(cfg) is not None:
        sources["judge"] = reward_service.open_judge(cfg, device, None).identity()
    if policy_path is not None:
        scored = paths.scored(round_idx)
        inputs += [policy_path, paths.initial_eval] + ([scored] if is_complete(scored) else [])
    return Plan(outputs=[paths.initial_eval if initial else paths.eval(round_idx)], inputs=inputs,
                user_files=prompt_files(cfg.data, "eval"), sources=sources,
                first=[] if initial else [OmegaConf.merge(cfg, {"eval": {"policy": "initial"}})],
                given={"policy": policy_path, "judge": judge, "reward": paths.eval_reward if trained else None,
                       "proxy": paths.reward, "baseline": None if initial else paths.initial_eval,
                       "scored": paths.scored(0 if initial else round_idx)})


def build(cfg: DictConfig, job: Job) -> Built:
    round_idx, initial, given = cfg.round, cfg.eval.policy == "initial", job.plan.given
    settings = sampling_settings(cfg.sample)
    policy_path, judge, scored_path = given["policy"], given["judge"], given["scored"]
    curve_round = 0 if initial else round_idx
    prompts = load_prompts(cfg.data, "eval")
    device = resolve_device(cfg.device)

    model, tokenizer, source, engine = open_policy(cfg, policy_path, device, settings, cfg.eval.seed)
    provenance = {"round": -1 if initial else round_idx, "policy": source,
                  "sampler": json.dumps({**settings.__dict__, "draft": "none",
                                         **({"backend": "vllm"} if engine is not None else {})}, sort_keys=True)}
    # a killed evaluation resumes at its first unfinished shard of prompts
    ds, sampling = sample_evaluation(model, tokenizer, prompts, settings, cfg, provenance,
                                     shard_prompts=cfg.sample.shard_prompts, store=job.shards(), engine=engine)
    if engine is not None:
        engine.close()
    del model
    scorer = reward_service.open_reward(cfg, device, given["reward"])
    judge_scorer, judge_name, warnings = reward_service.judge_for(cfg, device, judge, given["proxy"])
    ds, metrics = reward_service.evaluated(ds, scorer, judge_scorer, judge_name,
                                           given["baseline"] and load_dataset_artifact(given["baseline"]))
    if judge_scorer is not None:
        metrics["judge_warnings"] = warnings
    if is_complete(scored_path):  # the initial evaluation's: a snapshot of round 0's, if they exist by now
        scored = load_dataset_artifact(scored_path)
        # the judge scores the round's K samples too: its curve is the truth the over-optimisation point reads
        judged = None if judge_scorer is None else reward_service.score_rows(
            judge_scorer, scored["prompt"], scored["completion"],
            scored.remove_columns([c for c in ("prompt", "completion") if c in scored.column_names]).to_list(),
            progress=False)
        metrics["best_of_n"] = {"round": curve_round, **best_of_n_curve(scored, gold_scores(scored), judged)}
    metrics["sampling"] = {k: sampling[k] for k in ("tokens_per_second", "seconds", "num_completions",
                                                     "shards_resumed")}

    meta = {"stage": "eval", "policy": source, "round": provenance["round"], "num_prompts": len(prompts),
            "metrics": metrics}

    def write(tmp):
        ds.save_to_disk(str(tmp))
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2))

    log.info("eval %s: %s", "initial policy" if initial else f"round {round_idx}",
             {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)})
    for name, covered in metrics.get("pass_k_coverage", {}).items():  # what a pass@k table would not say
        log.warning("eval: %s is over %d of %d prompts (the others have fewer scored answers than its k)", name,
                    covered, len(prompts))
    for column in (c for c in SCORE_TITLES if metrics.get(f"{c}_unscorable")):
        log.warning("eval: %d answers could not be scored by %s; its means are over the others",
                    metrics[f"{column}_unscorable"], column)
    prefix = "eval_initial" if initial else "eval"
    return Built([(meta, write)], {f"{prefix}/{k}": v for k, v in flat_metrics(metrics).items()},
                 step=0 if initial else round_idx)
