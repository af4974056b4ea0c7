"""Online against rounds: held-out gold (or the proxy) against tokens sampled, for a loop run and online runs.

    python scripts/online_vs_rounds.py runs/demo runs/demo-online [runs/demo-k4 ...] [--column gold]
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
--plot draws the means and intervals against tokens sampled (rsft.stats, as scripts/compare_runs.py pairs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from datasets import load_from_disk

from rsft import stats
from rsft.errors import InputError, MissingInput, main_guard
from rsft.paths import RunPaths
from rsft.store import is_complete, load_dataset_artifact, read_meta


def round_points(paths: RunPaths) -> list[dict]:
    """The loop's points: the initial policy at 0 tokens, then each evaluated round at the tokens sampled so far."""
    if not is_complete(paths.initial_eval):
        raise MissingInput(f"{paths.root} has no complete eval_initial/: the first run directory is a round loop's "
                           f"(python -m rsft.run stage=loop with loop.eval=true)")
    points = [{"run": str(paths.root), "point": "initial", "tokens": 0, "completions": 0, "wall": 0.0,
               "eval": load_dataset_artifact(paths.initial_eval)}]
    tokens = completions = 0
    wall = 0.0
    round_idx = 0
    while is_complete(paths.samples(round_idx)):
        sampling = read_meta(paths.samples(round_idx))["sampling"]
        tokens, completions = tokens + int(sampling["tokens"]), completions + int(sampling["num_completions"])
        built = (paths.samples(round_idx), paths.round_prefs(round_idx), paths.round_reward(round_idx),
                 paths.scored(round_idx), paths.selected(round_idx), paths.policy(round_idx),
                 paths.dpo_policy(round_idx), paths.round_draft(round_idx))  # pairs/ is select's build: not again
        wall += sum(float(read_meta(p).get("build_seconds", 0.0)) for p in built if is_complete(p))
        if is_complete(paths.eval(round_idx)):
            points.append({"run": str(paths.root), "point": f"round {round_idx}", "tokens": tokens,
                           "completions": completions, "wall": wall,
                           "eval": load_dataset_artifact(paths.eval(round_idx))})
        round_idx += 1
    if len(points) == 1:
        raise MissingInput(f"{paths.root} has no evaluated round (round_XX/eval/): run the loop with loop.eval=true")
    return points


def online_points(paths: RunPaths) -> list[dict]:
    """An online run's snapshots: after b mini-batches, at the tokens sampled so far."""
    if not is_complete(paths.online):
        raise MissingInput(f"{paths.root} has no complete online/: run `python -m rsft.run stage=online "
                           f"run_name={paths.root.name}` first")
    evals = json.loads((paths.online / "metrics.json").read_text())["evals"]
    if not evals:
        raise InputError(f"{paths.online} has no evaluation snapshot: it was run with online.eval_every=0")
    return [{"run": str(paths.online), "point": f"after {e['batch']} mini-batches", "tokens": e["tokens_sampled"],
             "completions": e["completions_sampled"], "wall": float(e["wall_seconds"]),
             "eval": load_from_disk(str(paths.online / "evals" / f"batch_{e['batch']:04d}"))}  # inside the artifact
            for e in evals]


def pick_column(points: list[dict], wanted: str | None) -> str:
    for column in ([wanted] if wanted else ["gold", "reward"]):
        if all(column in p["eval"].column_names for p in points):
            return column
    raise InputError(f"{'--column ' + wanted + ': not a' if wanted else 'no gold or reward'} column of every "
                     f"evaluation (gold needs the demo task's oracle)")


def plot(series: list[list[dict]], column: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for points in series:
        xs = [p["tokens"] for p in points]
        means = [p["mean"]["mean"] for p in points]
        errors = [[m - p["mean"]["low"] for m, p in zip(means, points)],
                  [p["mean"]["high"] - m for m, p in zip(means, points)]]
        run = Path(points[-1]["run"])  # runs/<name> for the rounds, runs/<name>/online for an online run
        name = f"{run.parent.name} (online)" if run.name == "online" else f"{run.name} (rounds)"
        ax.errorbar(xs, means, yerr=errors, marker="o", capsize=3, label=name)
    ax.set_xlabel("tokens sampled")
    ax.set_ylabel(f"held-out {column} (95% interval over prompts)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loop_run", type=Path)
    parser.add_argument("online_runs", type=Path, nargs="+")
    parser.add_argument("--column", choices=["gold", "reward"], default=None)
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG")
    args = parser.parse_args(argv)
    for run in (args.loop_run, *args.online_runs):
        if not run.is_dir():
            raise MissingInput(f"run {run}: no such folder; give run directories (runs/<run_name>)")
    series = [round_points(RunPaths(args.loop_run))] + [online_points(RunPaths(run)) for run in args.online_runs]
    column = pick_column([p for points in series for p in points], args.column)
    for points in series:
        for p in points:
            p["mean"] = stats.bootstrap(stats.by_prompt(p["eval"]["prompt_id"], p["eval"][column]))
    print(f"\n| run | point | tokens sampled | completions | wall s | {column} [95% CI] |")
    print("|---|---|---|---|---|---|")
    for points in series:
        for p in points:
            print(f"| {p['run']} | {p['point']} | {p['tokens']} | {p['completions']} | {p['wall']:.0f} | "
                  f"{stats.shown(p['mean'])} |")
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
        plot(series, column, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main_guard(main)()
