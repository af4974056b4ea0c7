"""Online against rounds: held-out gold (or the judge, or the proxy) against tokens sampled, for a loop run and online runs.

    python scripts/online_vs_rounds.py runs/demo runs/demo-online [runs/demo-k4 ...] [--column gold|judge|reward]
                                       [--plot runs/demo/plots/online_vs_rounds.png]

The first run directory is the round loop's: its eval_initial/ and round_XX/eval/, and the tokens its
round_XX/samples/ sampled. Each later one holds an online/ artifact written by stage=online with
online.eval_every > 0, whose snapshots are in online/evals/batch_XXXX/. A run directory may be both: the
loop's and an online run's. Every evaluation uses the same held-out prompts, eval.num_samples and eval.seed
(the defaults), so a completion (prompt_id, sample_idx) pairs across them (common random numbers).

Printed, as markdown tables:
- per point: the tokens and completions sampled so far, the wall seconds and the mean with its 95% bootstrap
  interval over prompts. The wall seconds cover sampling, scoring, selection and training, not evaluation: a
  round's are its artifacts' build seconds less its eval's; an online run's are its snapshots' wall_seconds;
- for each online snapshot, against the loop's last round: the tokens and wall time as shares of the loop's,
  the paired difference (online - rounds) and P(online beats rounds), each with its 95% interval over prompts.
--column: gold, else the judge, else the proxy reward, the first every evaluation holds, unless given.

Over several seeds, with a margin stated before the runs:

    python scripts/online_vs_rounds.py seeds --rounds runs/r8-s0 runs/r8-s1 runs/r8-s2 \
        --online runs/o8-s0 runs/o8-s1 runs/o8-s2 --margin 0.03 [--column gold] [--record NAME]

pairs the i-th rounds run with the i-th online run (one seed each) at their last evaluations: each side's score
pooled over seeds and prompts, online - rounds with its two-level interval (rsft.stats.paired_over_seeds) and the
verdict at the margin, each seed's own difference, the tokens sampled, and each run's seconds by phase
(rsft.online_report.seconds_by_phase). --record NAME writes docs/results/NAME.json, which scripts/gen_docs.py
renders (table kind online-vs-rounds).
--plot draws the means and intervals against tokens sampled (rsft.online_report, which also gives a run's
summary.md its Online section and plots/online.png).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rsft import stats
from rsft.errors import InputError, MissingInput, main_guard
from rsft.machine import commit, describe, machine, write_record
from rsft.online_report import (
    mean,
    online_points,
    pick_column,
    plot_against_tokens,
    round_points,
    seconds_by_phase,
)
from rsft.paths import RunPaths

ROOT = Path(__file__).resolve().parents[1]


def by_prompt(point: dict, column: str) -> dict[str, list[float]]:
    ds = point["eval"]
    return stats.by_prompt([p for p, v in zip(ds["prompt_id"], ds[column]) if v is not None],
                           [v for v in ds[column] if v is not None])


def seeds(argv) -> dict:
    """Online against the rounds over seed pairs, at each side's last evaluation (the module's docstring)."""
    parser = argparse.ArgumentParser(prog="online_vs_rounds.py seeds", description=seeds.__doc__)
    parser.add_argument("--rounds", type=Path, nargs="+", required=True)
    parser.add_argument("--online", type=Path, nargs="+", required=True)
    parser.add_argument("--margin", type=float, required=True, help="m, stated before the runs")
    parser.add_argument("--column", choices=["gold", "judge", "reward"], default=None)
    parser.add_argument("--record", default=None, metavar="NAME", help="also write docs/results/NAME.json")
    args = parser.parse_args(argv)
    if len(args.rounds) != len(args.online):
        raise InputError(f"--rounds has {len(args.rounds)} runs and --online {len(args.online)}: pair them seed for "
                         f"seed, one each")
    last = {"rounds": [round_points(RunPaths(run))[-1] for run in args.rounds],
            "online": [online_points(RunPaths(run))[-1] for run in args.online]}
    column = pick_column(last["rounds"] + last["online"], args.column)
    try:
        compared = stats.paired_over_seeds([by_prompt(p, column) for p in last["online"]],
                                           [by_prompt(p, column) for p in last["rounds"]], args.margin)
    except ValueError as error:
        raise InputError(str(error)) from None
    difference = compared["a_minus_b"]
    phases = {"rounds": {str(run): seconds_by_phase(RunPaths(run), online=False) for run in args.rounds},
              "online": {str(run): seconds_by_phase(RunPaths(run), online=True) for run in args.online}}
    print(describe(machine()))
    print(f"\n| side | {column} after, pooled over {len(args.rounds)} seeds [95% CI] | tokens sampled by seed | "
          f"seconds by seed (writes not counted) |\n|---|---|---|---|")
    for side, name in (("b", "rounds"), ("a", "online")):
        runs = args.rounds if name == "rounds" else args.online
        print(f"| {name} | {stats.shown(compared[side])} | {', '.join(str(p['tokens']) for p in last[name])} | "
              f"{', '.join(f'{sum(phases[name][str(r)].values()):.0f}' for r in runs)} |")
    print(f"\nonline - rounds: {stats.shown(difference, True)}, by seed "
          f"{', '.join(f'{d:+.3f}' for d in difference['seed_means'])}: {difference['verdict']} (m = {args.margin:g})")
    record = {"record": args.record, "made_by": "scripts/online_vs_rounds.py seeds", "command": " ".join(sys.argv),
              "commit": commit(), "machine": machine(), "column": column, "margin": args.margin,
              "rounds": [str(r) for r in args.rounds], "online": [str(r) for r in args.online],
              "online_vs_rounds": compared, "tokens": {name: [p["tokens"] for p in points] for name, points in last.items()},
              "seconds_by_phase": phases}
    if args.record:
        out = write_record(args.record, record)
        print(f"\nrecord: {out.relative_to(ROOT)}")
    return record


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["seeds"]:
        seeds(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loop_run", type=Path)
    parser.add_argument("online_runs", type=Path, nargs="+")
    parser.add_argument("--column", choices=["gold", "judge", "reward"], default=None)
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG")
    args = parser.parse_args(argv)
    for run in (args.loop_run, *args.online_runs):
        if not run.is_dir():
            raise MissingInput(f"run {run}: no such folder; give run directories (runs/<run_name>)")
    series = [round_points(RunPaths(args.loop_run))] + [online_points(RunPaths(run)) for run in args.online_runs]
    column = pick_column([p for points in series for p in points], args.column)
    print(f"\n| run | point | tokens sampled | completions | wall s | {column} [95% CI] |")
    print("|---|---|---|---|---|---|")
    for points in series:
        for p in points:
            print(f"| {p['run']} | {p['point']} | {p['tokens']} | {p['completions']} | {p['wall']:.0f} | "
                  f"{stats.shown(mean(p, column))} |")
    last = series[0][-1]
    theirs = stats.keyed(last["eval"]["prompt_id"], last["eval"]["sample_idx"], last["eval"][column])
    print(f"\nagainst the rounds' last point ({last['point']}: {last['tokens']} tokens, {last['wall']:.0f} s)\n")
    print("| run | point | tokens share | wall share | online - rounds (paired) | P(online beats rounds) |")
    print("|---|---|---|---|---|---|")
    for points in series[1:]:
        for p in points:
            mine = stats.keyed(p["eval"]["prompt_id"], p["eval"]["sample_idx"], p["eval"][column])
            if mine.keys() != theirs.keys():
                raise InputError(f"{p['run']} ({p['point']}) evaluated other completions than {last['run']} "
                                 f"({last['point']}): use the same data.eval_limit, eval.num_samples and eval.seed")
            print(f"| {p['run']} | {p['point']} | {p['tokens'] / max(last['tokens'], 1):.2f} | "
                  f"{p['wall'] / max(last['wall'], 1e-9):.2f} | {stats.shown(stats.paired_difference(mine, theirs), True)} | "
                  f"{stats.shown(stats.paired_win_rate(mine, theirs))} |")
    if args.plot is not None:
        plot_against_tokens(series, [column], args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main_guard(main)()
