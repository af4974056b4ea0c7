"""The over-optimisation point N of one round's best-of-N curve, with a 95% interval on N itself (issue 35).

    python scripts/overopt_point.py runs/k32 --round 0 --judge runs/k8-s1/reward
    python scripts/overopt_point.py runs/k32 --round 0                     # gold (and the proxy) only

Reads round_XX/scored (the K samples per prompt with the proxy `reward`), scores them with the judge reward
model folder given (as rsft.eval scores the round's samples with eval.judge) and with the task's gold oracle
(rsft.metrics.gold_scores), and builds the per-prompt best-of-N matrices as rsft.metrics.best_of_n_curve
does. For each truth it prints enough_samples' N (the smallest N whose truth lies within the 95% interval
of the curve's best) with the percentile interval of N over prompts resampled with replacement, the same
resamples for every truth (rsft.metrics.enough_samples_interval); with a judge and gold, the paired
difference N_judge - N_gold's interval: the two points agree when it holds 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rsft.errors import InputError, MissingInput, main_guard
from rsft.metrics import (
    DRAWS,
    DRAWS_SEED,
    best_of_n_matrices,
    enough_samples,
    enough_samples_interval,
    gold_scores,
)
from rsft.paths import RunPaths
from rsft.store import is_complete, load_dataset_artifact


def judge_scores(scored, folder: Path, device: str) -> list[float | None]:
    """The judge's raw score of every scored sample, as rsft.eval scores the round's samples."""
    from rsft import reward_service

    scorer = reward_service.trained_reward(folder, device)
    rows = scored.remove_columns([c for c in ("prompt", "completion") if c in scored.column_names]).to_list()
    return reward_service.score_rows(scorer, scored["prompt"], scored["completion"], rows, progress=False)


def report(spread: dict, enough: dict) -> list[str]:
    level = f"{spread['level']:.0%}"
    lines = [f"{spread['prompts']} prompts x K={enough['k']}; {spread['draws']} paired resamples of the prompts "
             f"(seed {spread['seed']}); enough_samples reads the {enough['truth']}"]
    for truth in spread["truths"]:
        point = spread[truth]
        lines.append(f"  N enough by {truth:<5}: {point['n']:>3}  [{level} CI {point['low']}, {point['high']}]")
    diff = spread.get("difference")
    if diff:
        a, b = diff["truths"]
        lines.append(f"  N_{a} - N_{b}: {diff['n']:+d}  [{level} CI {diff['low']:+d}, {diff['high']:+d}]  -> "
                     f"{'agree (the interval holds 0)' if diff['agree'] else 'disagree (the interval excludes 0)'}")
        lines.append(f"  {a}'s N in {b}'s interval: {'yes' if spread[f'{a}_in_{b}'] else 'no'}; "
                     f"{b}'s N in {a}'s interval: {'yes' if spread[f'{b}_in_{a}'] else 'no'}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--judge", type=Path, default=None, metavar="REWARD_MODEL",
                        help="a trained reward model's folder (runs/<run>/reward) to score the samples with")
    parser.add_argument("--draws", type=int, default=DRAWS)
    parser.add_argument("--seed", type=int, default=DRAWS_SEED)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if not args.run.is_dir():
        raise MissingInput(f"run {args.run}: no such folder; give a run directory (runs/<run_name>)")
    if args.draws < 1:
        raise InputError(f"--draws {args.draws}: expected at least 1")
    folder = RunPaths(args.run).scored(args.round)
    if not is_complete(folder):
        raise MissingInput(f"run {args.run}: no complete {folder.relative_to(args.run)}; run "
                           f"`python -m rsft.run stage=score` for round {args.round} first")
    if args.judge is not None and not args.judge.is_dir():
        raise MissingInput(f"--judge {args.judge}: no such folder; give a reward model's folder (runs/<run>/reward)")
    scored = load_dataset_artifact(folder)
    judged = None if args.judge is None else judge_scores(scored, args.judge, args.device)
    per_prompt = best_of_n_matrices(scored, gold_scores(scored), judged)
    spread = enough_samples_interval(per_prompt, draws=args.draws, seed=args.seed)
    print(f"{args.run} round {args.round}" + (f", judge {args.judge}" if args.judge else ""))
    print("\n".join(report(spread, enough_samples(per_prompt))))


if __name__ == "__main__":
    main_guard(main)()
