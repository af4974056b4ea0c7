"""sample.num_samples=auto: each round samples the K its previous round's best-of-N curve says is enough.

Best-of-K optimises a proxy; past some K the truth (an independent judge, or the task's gold oracle) stops
rising while the proxy goes on (Gao et al. 2022; on the demo, best-of-32 does not beat best-of-8 on gold).
Each round's evaluation records the best-of-N curve of that round's own K samples per prompt under the
proxy, gold and the judge, and the smallest N whose truth lies within the 95% interval of the best
(rsft.metrics.enough_samples). With num_samples=auto, round r samples that N from round r - 1's curve,
within [sample.auto_k.floor, sample.auto_k.cap]; a curve whose truth still rises at its last N (N = K)
says only that K was too few, so round r doubles K instead (up to the cap). Round 0 has no curve and
samples sample.auto_k.start (null: the cap).

The choice is made before any stage of the round reads the config (rsft.runner.run), so every stage of
round r sees the same integer K and fingerprints it; the auto_k settings themselves are never
fingerprinted (rsft.stages.WHILE_OFF): an artifact is what the K it was sampled with made it.

With adaptive K (sample.adaptive_k.k0 > 0, its mean left null) the choice is the round's mean completions
per prompt instead: adaptive K draws k0 per prompt, then spends the rest where another sample can change
the pick, no prompt past the cap; a round whose choice is the cap samples every prompt the cap. Pruning
works as with a fixed K: its share of each prompt's rows must stop one at the floor (rsft.config checks).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from rsft.config.sample_settings import k_schedule
from rsft.errors import MissingInput
from rsft.paths import RunPaths
from rsft.store import is_complete, read_meta

log = logging.getLogger(__name__)

AUTO = "auto"


def choose(cfg: DictConfig, paths: RunPaths, round_idx: int) -> dict:
    """Round `round_idx`'s K and why: {"k", "why", "from_round", "enough"}."""
    auto = cfg.sample.auto_k
    cap, floor = int(auto.cap), int(auto.floor)
    if round_idx <= 0:
        k = int(auto.start) if auto.start is not None else cap
        return {"k": k, "why": f"round 0 has no best-of-N curve yet: sample.auto_k.start ({k})", "from_round": None}
    previous = paths.eval(round_idx - 1)
    if not is_complete(previous):
        raise MissingInput(f"sample.num_samples=auto: round {round_idx}'s K is chosen from round {round_idx - 1}'s "
                           f"best-of-N curve, which its evaluation records, and {previous} is missing; run "
                           f"`python -m rsft.run stage=eval round={round_idx - 1}` (stage=loop with loop.eval=true does)")
    curve = (read_meta(previous).get("metrics") or {}).get("best_of_n") or {}
    enough = curve.get("enough")
    if not enough or curve.get("round") != round_idx - 1:
        raise MissingInput(f"sample.num_samples=auto: {previous} has no best-of-N curve of round {round_idx - 1}'s "
                           f"samples (it was evaluated before the samples were scored, or by an older rsft); rebuild "
                           f"it with `python -m rsft.run stage=eval round={round_idx - 1} overwrite=true`")
    if enough["n"] >= enough["k"]:
        k = min(cap, 2 * int(enough["k"]))
        why = (f"round {round_idx - 1}'s {enough['truth']} still rose at its last N={enough['k']}: twice that, "
               f"within the cap {cap}")
    else:
        k = min(cap, max(floor, int(enough["n"])))
        why = (f"round {round_idx - 1}'s {enough['truth']} stopped rising at N={enough['n']} of {enough['k']} "
               f"(within [{floor}, {cap}])")
    return {"k": k, "why": why, "from_round": round_idx - 1, "enough": enough}


def resolved(cfg: DictConfig, announce: bool = False) -> tuple[DictConfig, dict | None]:
    """`cfg` with sample.num_samples=auto replaced by the round's K, and the choice (None when K is a number):
    the runner records it in the artifacts' meta.json (`auto_k`). announce: log the choice (the stage that samples
    the round does; the others that read K resolve it alike, silently)."""
    schedule = k_schedule(cfg.sample.num_samples)
    if schedule is not None:  # a fixed K per round: the r-th, the last repeating
        round_idx = max(cfg.round, 0)
        k = int(schedule[min(round_idx, len(schedule) - 1)])
        choice = {"k": k, "why": f"sample.num_samples={schedule}: round {round_idx}'s K", "from_round": None}
        if announce:
            log.info("sample.num_samples=%s: round %s samples K=%s", schedule, cfg.round, k)
        return OmegaConf.merge(cfg, {"sample": {"num_samples": k}}), choice
    if cfg.sample.num_samples != AUTO:
        return cfg, None
    choice = choose(cfg, RunPaths.from_config(cfg), max(cfg.round, 0))
    k, cap, k0 = choice["k"], cfg.sample.auto_k.cap, cfg.sample.adaptive_k.k0
    if k0 > 0 and k < cap:  # adaptive K spends a mean of k per prompt where another sample can change the pick
        choice["adaptive_k"] = {"k0": k0, "mean": float(k)}
        resolved_sample = {"num_samples": cap, "adaptive_k": {"mean": float(k)}}
        said = f"a mean of {k} per prompt (adaptive K: k0={k0}, at most {cap})"
    else:  # plain K (with adaptive K on, a round at the cap samples every prompt the cap: adaptive K off)
        resolved_sample = {"num_samples": k, "adaptive_k": {"k0": 0, "mean": None}}
        said = f"K={k}"
    if announce:
        log.info("sample.num_samples=auto: round %s samples %s: %s", cfg.round, said, choice["why"])
    return OmegaConf.merge(cfg, {"sample": resolved_sample}), choice
