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

Over several seeds, with a margin stated before the runs: `python scripts/compare_runs.py seeds --a <online runs>
--b <rounds runs> --names online rounds --margin 0.03` (it takes either kind of run on either side).
--plot draws the means and intervals against tokens sampled (rsft.online_report, which also gives a run's
summary.md its Online section and plots/online.png).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rsft import stats
from rsft.errors import InputError, MissingInput, main_guard
from rsft.online_report import (
    mean,
    online_points,
    pick_column,
    plot_against_tokens,
    round_points,
)
from rsft.paths import RunPaths


def main(argv=None) -> None:
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
