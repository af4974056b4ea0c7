"""The collapse guard (issue 48): a bound on an evaluation's measure of range that the loop and online learning watch.

Training on its own best outputs narrows a policy: distinct-2 across prompts, the distinct answers per prompt,
pass@k and token entropy fall while pass@1 rises (docs/diversity.md). Every evaluation measures them
(rsft.eval's metrics; online's snapshots). `loop.guard` and `online.guard` name one of them and a floor (`min`)
or a ceiling (`max`, for alike_share or top_opening_share); when an evaluation after training crosses it:
  - action=stop: the loop stops after that round (online: after that mini-batch), with the reason in the log,
    summary.md and the artifact's record, as loop.stop stops;
  - action=lower_lr: later training takes lr_factor times the learning rate, once per crossing (the loop: the
    next rounds' sft.learning_rate and dpo.learning_rate; online: the optimiser's rate and its schedule's);
  - action=raise_kl: later training takes kl_factor times the KL weight (the pull towards the policy training
    starts from: sft.kl's reference, online.kl's initial policy), once per crossing (the loop: the next rounds'
    sft.kl; online: online.kl from the next mini-batch on). A fixed weight that keeps the range on one seed can be
    too weak on another, where training runs further (docs/diversity.md); this one grows only where the measured
    range falls.
  - action=widen_select (loop.guard only): the rounds after the first crossing select with select.k=widen_k,
    select.weight=rarity and select.weight_scale=prompt: several right answers a prompt, a rare one weighing more,
    each prompt still weighing one row (widened_select). The rounds before it keep one answer, which learns fastest;
    with sft.init=initial and pooled rounds the last round's selection alone decides what the final policy trains
    on (docs/diversity.md).
The initial policy's evaluation is not judged (nothing has trained yet); it is logged when it already lies past
the bound. Decisions are a function of recorded evaluations, so a rerun or a resumed run decides alike.
"""

from __future__ import annotations

import logging

from rsft.config import GUARD_METRIC
from rsft.errors import MissingInput

log = logging.getLogger(__name__)


def crossed(guard, metrics: dict, key: str, where: str) -> str | None:
    """None when `metrics`' guard.metric lies within the guard's bounds, else why it does not (a sentence naming the
    value, the bound and the setting `key`). A measure the answers collapsed past (`undefined` in the metrics:
    distinct-2 of one-word answers, the entropy of answers with no token) is not above any floor. A metric the
    evaluation lacks otherwise is refused (a pass@k needs a verifier's 0/1 column and eval.num_samples >= k;
    mean_entropy a sampler that records it)."""
    name = guard.metric  # set: the callers watch only a guard with a metric
    value = metrics.get(name)
    low, high = guard.get("min"), guard.get("max")
    why = metrics.get("undefined", {}).get(name)
    if why is not None:  # collapsed past what the measure can take (one-word answers have no distinct-2)
        return f"{where}: {name} is undefined ({why}), so it is not above {key}.min={low}" if low is not None else None
    if not isinstance(value, (int, float)):
        measured = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and GUARD_METRIC.match(k))
        raise MissingInput(f"{key}.metric={name}: {where} did not measure it; it measured {', '.join(measured) or 'none'}")
    if low is not None and value < float(low):
        return f"{where}: {name} = {value:.4f} fell below {key}.min={low}"
    if high is not None and value > float(high):
        return f"{where}: {name} = {value:.4f} rose above {key}.max={high}"
    return None


def watch_initial(guard, metrics: dict, key: str) -> None:
    """The initial policy's evaluation is not judged; say so when it already lies past the bound."""
    if guard.metric is None:
        return
    reason = crossed(guard, metrics, key, "the initial policy's evaluation")
    if reason:
        log.warning("%s (%s judges evaluations after training only)", reason, key)


def scale_learning_rate(optimizer, schedule, factor: float) -> None:
    """action=lower_lr in a hand-written loop (online): the optimiser's rates times `factor`, and its schedule's base
    rates too, since the schedule multiplies them at every step and would otherwise undo the change."""
    for group in optimizer.param_groups:
        group["lr"] *= factor
    if hasattr(schedule, "base_lrs"):
        schedule.base_lrs = [rate * factor for rate in schedule.base_lrs]


def widened_select(guard) -> dict:
    """action=widen_select: the select settings of the rounds after the first crossing."""
    return {"k": guard.widen_k, "weight": "rarity", "weight_scale": "prompt"}


def kl_weight(online, crossings: list[dict]) -> float:
    """online.kl in force after online.guard's recorded `crossings` (progress.guard): online.kl times
    guard.kl_factor per raise_kl crossing. A function of the record, so a resumed run trains as the first did."""
    raised = sum(1 for c in crossings if c["action"] == "raise_kl")
    return float(online.kl) * float(online.guard.kl_factor) ** raised


def watch_snapshot(guard, progress, batch: int, final: bool, optimizer, schedule) -> str | None:
    """online.guard on the snapshot just taken after `batch` mini-batches (progress.evals[-1]; a crossing joins
    progress.guard): the reason to stop, when it is crossed with action=stop; with lower_lr the optimiser's rate and
    its schedule's are scaled; with raise_kl the crossing recorded is what raises the weight (kl_weight). The
    snapshot before any training is not judged, and the last one only recorded (no training follows it)."""
    if guard.metric is None:
        return None
    metrics = progress.evals[-1]["metrics"]
    if batch == 0:
        watch_initial(guard, metrics, "online.guard")
        return None
    reason = crossed(guard, metrics, "online.guard", f"the snapshot after {batch} mini-batches")
    if reason is None:
        return None
    progress.guard.append({"batch": batch, "reason": reason,
                           "action": "recorded (the last snapshot)" if final else guard.action})
    if final or guard.action == "stop":
        log.warning("online.guard: %s; %s", reason, "recorded" if final else "the run ends here")
        return None if final else reason
    if guard.action == "raise_kl":  # kl_weight reads the crossing just recorded
        log.warning("online.guard: %s; online.kl is multiplied by %g from here", reason, guard.kl_factor)
        return None
    scale_learning_rate(optimizer, schedule, guard.lr_factor)
    log.warning("online.guard: %s; the learning rate is multiplied by %g from here", reason, guard.lr_factor)
    return None
