"""stage=loop: rounds of best-of-K rejection sampling and fine-tuning, tracked and reported.

    python -m rsft.run stage=loop [loop.rounds=2]
    python -m rsft.run stage=loop select.strategy=random run_name=demo-random loop.reward_from=demo  # the baseline

Before round 0, when runs/<run_name>/reward/ is missing: copied from loop.reward_from's run when
set (a baseline judged by the same reward model; its prefs/ and eval_initial/ too where it has them,
so a reward model trained on user pairs serves as well), else stage=prefs (pairs of the initial
policy's samples labelled by the simulated annotators) and stage=reward (the Bradley-Terry model).
With loop.eval, the initial policy is evaluated once (eval_initial/, the baseline). Then for round
r = 0 .. loop.rounds - 1, each stage reading what the one before wrote:

    sample  K completions per train prompt (data.rotate: round r's own slice of the train split)
            from the policy round r - 1 ended with (round 0: initial)
    labels  (loop.refresh_reward) label pairs of them -> round_XX/prefs
    refresh (loop.refresh_reward) retrain the reward model on every label so far -> round_XX/reward
            (what scores round r)
    score   the reward model's score of each
    select  the best per prompt (select.*) -> selected/, pairs/
    sft     fine-tune on selected/ -> round_XX/policy (what round r + 1 samples from)
    dpo     (loop.dpo) DPO on pairs/ from round_XX/policy -> round_XX/dpo (then what round r + 1 samples from)
    draft   (draft=distilled or feature) train round_XX/draft on the round's policy for round r + 1's sampler
    eval    (loop.eval) the round's policy on held-out prompts -> round_XX/eval, scored by the run's
            reward/ in every round (one judge for all rounds, also with loop.refresh_reward)

Every stage is called with a copy of the config at round r and skips when its artifact is
complete and made from the same settings and inputs (rsft.fingerprints, from each stage's declaration; other settings stop
the loop with the keys that differ), so rerunning the same command after a crash resumes at the
first missing artifact and ends with the same artifacts (sampling is seeded per round and completion). One Tracker (one
wandb run) covers the whole loop; after each round the round's metrics are read back from the
artifacts and logged at step r, and at the end the plots and summary.md (rsft.report) are written.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf, open_dict

from rsft import distributed, report, runner, stages
from rsft.config import uses_trained_reward
from rsft.errors import MissingInput
from rsft.generation import TRAINED_DRAFT_KINDS
from rsft.guard import crossed, watch_initial, widened_select
from rsft.paths import RunPaths
from rsft.store import Artifact, copy_artifact, is_complete, load_dataset_artifact
from rsft.tracking import Tracker, stage_tracker

log = logging.getLogger(__name__)

def round_stages(cfg: DictConfig) -> list[str]:
    """This round's stages, in rsft.stages order: the round steps whose loop switch is on (RunPaths
    resolves the switches; loop.refresh_reward may be auto). With draft=distilled or feature, stage=draft
    follows them (run() below): it trains round_XX/draft on the new policy for round r + 1's sampler."""
    paths = RunPaths.from_config(cfg)
    return [step.name for step in stages.ROUND_STEPS if not step.loop_switch or getattr(paths, step.loop_switch)]


def run_named_stage(name: str, cfg: DictConfig, tracker: Tracker, records: report.Records) -> Artifact:
    """Run (or reuse) one stage's artifact through the runner; its record goes to the report."""
    log.info("loop: round %s, stage=%s", cfg.round, name)
    artifact = runner.run(name, cfg, tracker)
    records.add(artifact)
    return artifact


def share_judge(source: RunPaths, paths: RunPaths, needs_reward: bool = True) -> None:
    """Copy another run's reward model, and its labels and baseline eval where it has them (missing
    ones only), so that runs compared with each other (best-of-K vs select.strategy=random) are judged
    by the same reward model. A reward model trained on the user's own pairs has no prefs/: fine."""
    if needs_reward and not is_complete(source.reward):
        raise MissingInput(f"loop.reward_from: {source.reward} is missing or incomplete; run that loop "
                                f"(or its stage=reward) first")
    for name in ("prefs", "reward", "initial_eval"):
        src, dst = getattr(source, name), getattr(paths, name)
        if is_complete(dst) or not is_complete(src):
            continue
        copy_artifact(src, dst)
        log.info("loop: copied %s from %s", dst.name, src)


def at_round(cfg: DictConfig, round_idx: int, stage: str) -> DictConfig:
    return OmegaConf.merge(cfg, {"round": round_idx, "stage": stage})


def sampling_draft(cfg: DictConfig, paths: RunPaths, round_idx: int) -> DictConfig:
    """The sample stage's config for round r. With draft=distilled (or feature), round r uses the draft
    trained for round r - 1's policy (RunPaths.sampling_draft); before any exists (round 0 of a fresh
    run) draft.fallback stands in (conf/draft/distilled.yaml and feature.yaml compose the n-gram draft)."""
    stage_cfg = at_round(cfg, round_idx, "sample")
    if cfg.draft.kind in TRAINED_DRAFT_KINDS and not is_complete(paths.sampling_draft(round_idx)):
        log.info("loop: no %s draft yet (the first is trained after round 0's SFT); round %d uses draft=%s",
                 cfg.draft.kind, round_idx, cfg.draft.fallback.kind)
        with open_dict(stage_cfg):
            stage_cfg.draft = OmegaConf.to_container(cfg.draft.fallback, resolve=True)
    return stage_cfg


def stop_column(cfg: DictConfig, evaluation) -> str:
    """The score column loop.stop judges: loop.stop.truth, or with auto the judge when eval.judge is set, else
    gold where the task has an oracle, else the proxy reward."""
    truth = cfg.loop.stop.truth
    if truth != "auto":
        return truth
    columns = load_dataset_artifact(evaluation).column_names
    return next(c for c in ("judge", "gold", "reward") if c in columns)


def stop_decision(cfg: DictConfig, paths: RunPaths, round_idx: int, gains: list[dict]) -> str | None:
    """loop.stop's rule after round `round_idx`'s evaluation: the round's gain is the paired difference of its
    policy's scores minus the previous policy's (round 0: the initial policy's) on the same held-out prompts
    and sample seeds, with its 95% bootstrap interval over prompts (rsft.stats). A round has gained when
    that interval's low end is above loop.stop.min_gain; after loop.stop.patience rounds in a row that have
    not, the loop stops. Returns why it stops, or None. `gains` collects each round's record."""
    stop = cfg.loop.stop
    mine = paths.eval(round_idx)
    before = paths.eval(round_idx - 1) if round_idx > 0 else paths.initial_eval
    column = stop_column(cfg, mine)
    gain = report.paired_vs(mine, before, column)
    if gain is None:
        raise MissingInput(f"loop.stop: round {round_idx}'s evaluation and {before.name} have no paired '{column}' "
                           f"scores to compare (another eval.num_samples or data.eval_limit?)")
    gained = gain["low"] > stop.min_gain
    gains.append({"round": round_idx, "column": column, "mean": gain["mean"], "low": gain["low"],
                  "high": gain["high"], "gained": gained})
    log.info("loop.stop: round %d's %s gain %+.3f [%+.3f, %+.3f]: %s", round_idx, column, gain["mean"], gain["low"],
             gain["high"], "a gain" if gained else f"no gain above {stop.min_gain}")
    flat = [g for g in gains[-stop.patience:] if not g["gained"]]
    if len(gains) < stop.patience or len(flat) < stop.patience:
        return None
    shown = "; ".join(f"round {g['round']} {g['mean']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]" for g in flat)
    return (f"stopped after round {round_idx} of at most {cfg.loop.rounds}: {stop.patience} round(s) in a row without "
            f"a {column} gain whose paired 95% interval is above {stop.min_gain} ({shown})")


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths, rounds = RunPaths.from_config(cfg), cfg.loop.rounds
    if cfg.loop.refresh_reward == "auto":
        log.info("loop: loop.refresh_reward=auto -> %s (data.kind=%s, refresh.pairs=%s, select.strategy=%s)",
                 "on" if paths.refresh_reward else "off", cfg.data.kind, cfg.refresh.pairs, cfg.select.strategy)
    records = report.Records()  # every stage's record, as it returns it
    with stage_tracker(cfg, "loop", tracker) as tracker:
        if cfg.loop.reward_from:  # the other run's reward model as it is: its settings are that run's
            if distributed.is_main():
                share_judge(paths.other_run(cfg.loop.reward_from), paths, uses_trained_reward(cfg))
            distributed.barrier()
        else:  # built, reused, or stopped as stale by the stages' own fingerprints
            trained = ("prefs", "reward") if cfg.reward.data.path is None else ("reward",)
            for name in trained if uses_trained_reward(cfg) else ():  # other reward sources are used as they are
                run_named_stage(name, at_round(cfg, 0, name), tracker, records)
        if cfg.loop.eval:
            run_named_stage("eval", OmegaConf.merge(at_round(cfg, 0, "eval"), {"eval": {"policy": "initial"}}),
                            tracker, records)
        gains, stopped, done = [], None, rounds
        # loop.guard (rsft.guard): its crossings so far and the factors they set
        guard, rate_scale, heat, pull, widened, guarded = cfg.loop.guard, 1.0, 1.0, 1.0, False, []
        if guard.metric is not None and cfg.loop.eval:
            watch_initial(guard, records.metrics(paths.initial_eval), "loop.guard")
        for r in range(rounds):
            for name in round_stages(cfg):
                stage_cfg = sampling_draft(cfg, paths, r) if name == "sample" else at_round(cfg, r, name)
                if name in ("sft", "dpo") and rate_scale != 1.0:  # lowered by the guard's crossings before
                    stage_cfg = OmegaConf.merge(stage_cfg, {
                        "sft": {"learning_rate": cfg.sft.learning_rate * rate_scale},
                        "dpo": {"learning_rate": cfg.dpo.learning_rate * rate_scale}})
                if name == "sft" and pull != 1.0:  # raised by the guard's crossings before
                    stage_cfg = OmegaConf.merge(stage_cfg, {"sft": {"kl": cfg.sft.kl * pull}})
                if name == "sample" and heat != 1.0:  # raised by the guard's crossings before; evaluations keep theirs
                    stage_cfg = OmegaConf.merge(stage_cfg, {"sample": {"temperature": cfg.sample.temperature * heat}})
                if name == "select" and widened:  # widened by a crossing before
                    stage_cfg = OmegaConf.merge(stage_cfg, {"select": widened_select(guard)})
                run_named_stage(name, stage_cfg, tracker, records)
            if cfg.draft.kind in TRAINED_DRAFT_KINDS and r + 1 < rounds:  # the draft follows the policy
                run_named_stage("draft", at_round(cfg, r, "draft"), tracker, records)
            if cfg.loop.eval:
                run_named_stage("eval", OmegaConf.merge(at_round(cfg, r, "eval"), {"eval": {"policy": "round"}}),
                                tracker, records)
            if distributed.is_main():
                tracker.log({f"round/{k}": v for k, v in report.round_metrics(paths, r, records).items()}, step=r)
                tracker.log_table("examples", report.example_rows(paths, r, cfg.loop.examples), step=r)
            if guard.metric is not None:  # every process decides alike, from the same evaluation
                reason = crossed(guard, records.metrics(paths.eval(r)), "loop.guard", f"round {r}'s evaluation")
                if reason and guard.action == "stop":
                    stopped = f"the collapse guard stopped the loop after round {r}: {reason}"
                    guarded.append(stopped)
                    log.warning("loop.guard: %s", stopped)
                    done = r + 1
                    break
                if reason and r + 1 == rounds:  # no round follows: the crossing is only recorded, as online's last
                    guarded.append(f"{reason}; recorded (the last round)")
                    log.warning("loop.guard: %s", guarded[-1])
                elif reason and guard.action == "raise_temperature":
                    heat *= guard.temperature_factor
                    guarded.append(f"{reason}; the rounds after round {r} sample at temperature "
                                   f"{cfg.sample.temperature * heat:g} ({heat:g} x sample.temperature)")
                    log.warning("loop.guard: %s", guarded[-1])
                elif reason and guard.action == "raise_kl":
                    pull *= guard.kl_factor
                    guarded.append(f"{reason}; the rounds after round {r} train with sft.kl={cfg.sft.kl * pull:g} "
                                   f"({pull:g} x sft.kl)")
                    log.warning("loop.guard: %s", guarded[-1])
                elif reason and guard.action == "widen_select":
                    settings = " ".join(f"select.{k}={v}" for k, v in widened_select(guard).items())
                    guarded.append(f"{reason}; " + (f"the selection is already widened ({settings})" if widened else
                                                    f"the rounds after round {r} select with {settings}"))
                    widened = True
                    log.warning("loop.guard: %s", guarded[-1])
                elif reason:
                    rate_scale *= guard.lr_factor
                    guarded.append(f"{reason}; the rounds after round {r} train at {rate_scale:g} x the learning rate")
                    log.warning("loop.guard: %s", guarded[-1])
            if cfg.loop.stop.enabled:  # every process decides alike, from the same artifacts
                stopped = stop_decision(cfg, paths, r, gains)
                if stopped:
                    log.info("loop.stop: %s", stopped)
                    done = r + 1
                    break
        notes = [f"**loop.stop**: {stopped}." if stopped else
                 f"**loop.stop**: ran every round of loop.rounds={rounds}; each round's gain: " + "; ".join(
                     f"round {g['round']} {g['column']} {g['mean']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]"
                     for g in gains) + "."] if cfg.loop.stop.enabled else []
        notes += [f"**loop.guard**: {note}." for note in guarded]
        if distributed.is_main():  # one process writes the report
            plots = report.write_plots(paths, done, records)
            for name, png in plots.items():
                tracker.log_image(f"plots/{name}", png, step=done - 1)
            summary = report.write_summary(paths, done, plots,
                                           report.example_rows(paths, done - 1, cfg.loop.examples), records,
                                           notes)
            tracker.summary({f"final/{k}": v for k, v in report.round_metrics(paths, done - 1, records).items()}
                            | ({"loop/stopped_after_round": done - 1} if stopped else {}))
            log.info("loop: %d rounds done; %s", done, summary)
        distributed.barrier()
    return Artifact(paths.root, {"stage": "loop", "rounds": done, "stopped": stopped, "gains": gains, "guard": guarded,
                                 "summary": str(paths.summary)})
