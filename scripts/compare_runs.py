"""Compare two runs' held-out evaluations round by round, paired by prompt and sample index.

    python scripts/compare_runs.py runs/hh runs/hh-random            # best-of-K vs the random baseline
    python scripts/compare_runs.py runs/hh runs/hh-random --column gold

Both runs must evaluate the same held-out prompts with the same eval.num_samples and eval.seed (the
loop does: common random numbers), so completion (prompt_id, sample_idx) of one run is paired with
the same key of the other. For each policy both runs evaluated (the initial one, then each round's)
it prints a markdown table row: each run's mean with its 95% bootstrap interval over prompts, the
paired difference A - B and the paired win rate P(A's completion beats B's), each with its interval
(rsft.stats). The default column is the judge's score where both runs have one, else gold, else the
proxy reward.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rsft import stats
from rsft.paths import RunPaths, load_dataset_artifact
from rsft.report import evaluations


def pick_column(a, b, wanted: str | None) -> str:
    for column in ([wanted] if wanted else ["judge", "gold", "reward"]):
        if column in a.column_names and column in b.column_names:
            return column
    raise SystemExit(f"no score column {'(' + wanted + ') ' if wanted else ''}in both evaluations: A has "
                     f"{a.column_names}, B has {b.column_names}")


def fmt(d: dict, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(d['mean'])} [{f.format(d['low'])}, {f.format(d['high'])}]"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--column", choices=["judge", "gold", "reward"], default=None)
    args = parser.parse_args(argv)
    a_evals, b_evals = (dict(evaluations(RunPaths(run))) for run in (args.run_a, args.run_b))
    shared = [name for name in a_evals if name in b_evals]
    if not shared:
        raise SystemExit(f"{args.run_a} and {args.run_b} have no evaluation of the same policy stage in common")
    column = None
    print(f"A = {args.run_a}, B = {args.run_b}")
    for name in shared:
        a, b = load_dataset_artifact(a_evals[name]), load_dataset_artifact(b_evals[name])
        if column is None:
            column = pick_column(a, b, args.column)
            print(f"\n| policy | A {column} [95% CI] | B {column} [95% CI] | A - B (paired) | P(A beats B) |")
            print("|---|---|---|---|---|")
        elif column not in a.column_names or column not in b.column_names:
            print(f"| {name} | (no {column} column in both) | | | |")
            continue
        mine = stats.keyed(a["prompt_id"], a["sample_idx"], a[column])
        theirs = stats.keyed(b["prompt_id"], b["sample_idx"], b[column])
        print(f"| {name} | {fmt(stats.bootstrap(stats.by_prompt(a['prompt_id'], a[column])))} | "
              f"{fmt(stats.bootstrap(stats.by_prompt(b['prompt_id'], b[column])))} | "
              f"{fmt(stats.paired_difference(mine, theirs), signed=True)} | {fmt(stats.paired_win_rate(mine, theirs))} |")


if __name__ == "__main__":
    main()
