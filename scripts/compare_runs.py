"""Compare two runs' held-out evaluations round by round, paired by prompt and sample index.

    python scripts/compare_runs.py runs/hh runs/hh-random            # best-of-K vs the random baseline
    python scripts/compare_runs.py runs/hh runs/hh-random --column gold
    python scripts/compare_runs.py runs/hh runs/hh-random --kept runs/hh-judge/reward   # the kept sets, judged

Both runs must evaluate the same held-out prompts with the same eval.num_samples and eval.seed (the
loop does: common random numbers), so completion (prompt_id, sample_idx) of one run is paired with
the same key of the other. For each policy both runs evaluated (the initial one, then each round's)
it prints a markdown table row: each run's mean with its 95% bootstrap interval over prompts, the
paired difference A - B and the paired win rate P(A's completion beats B's), each with its interval
(rsft.stats), and the verdict of rsft.stats.verdict on the difference with --margin m (better, not worse
within m, worse, undecided). The default column is the judge's score where both runs have one, else gold, else the
proxy reward.

--record NAME also writes the comparison as a record, docs/results/NAME.json (issue 47: results as data): the
command, the commit, each run's machine, versions, seed and build seconds by stage, and for every policy each run's
mean with its interval, the paired A - B with its verdict, each run's paired change from its previous policy, and
the evaluation's other metrics. scripts/gen_docs.py renders the docs' tables from such records (the default job's:
`--record default-job`).

Over several seeds, with a margin stated before the runs (issue 47: a headline claim pools seeds):

    python scripts/compare_runs.py seeds --a runs/auto-s0 runs/auto-s1 runs/auto-s2 \
        --b runs/k8-s0 runs/k8-s1 runs/k8-s2 --names auto K=8 --margin 0.03 [--column gold] [--record NAME]
        [--kinds auto auto]   # rounds or online where a run directory holds both

pairs A's i-th run with B's i-th (one seed each) at their last evaluations (a round loop's last evaluated round,
or an online run's last snapshot): each side pooled over seeds and prompts, A - B with its two-level interval
(rsft.stats.paired_over_seeds) and the verdict at the margin, each seed's own difference, the tokens each run
sampled, and each run's seconds by phase (rsft.online_report.seconds_by_phase). --record NAME writes
docs/results/NAME.json, which scripts/gen_docs.py renders (table kind over-seeds).

--kept REWARD_MODEL judges what each run kept instead (round_XX/selected, the SFT data) with that reward
model, paired by prompt over the prompts both runs kept (a prompt's mean when k > 1). A gap between the
kept sets that the trained policies do not show is lost in SFT, not in selection: on HH best-of-8's kept
sets led random's by +0.29 to +0.44 under the judge in round 1 while the policies tied in two seeds of
three (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rsft import stats
from rsft.errors import InputError, MissingInput, main_guard
from rsft.machine import commit, write_record
from rsft.paths import RunPaths
from rsft.report import evaluations
from rsft.store import is_complete, load_dataset_artifact


def pick_column(a, b, wanted: str | None) -> str:
    for column in ([wanted] if wanted else ["judge", "gold", "reward"]):
        if column in a.column_names and column in b.column_names:
            return column
    raise InputError(f"{'--column ' + wanted + ': no such' if wanted else 'no score'} column (judge, gold or reward) in "
                     f"both evaluations: A has {a.column_names}, B has {b.column_names}")


def kept_scores(paths: RunPaths, round_idx: int, scorer) -> dict[tuple[str, int], float]:
    """{(prompt_id, 0): the scorer's mean over the completions round round_idx kept for that prompt}."""
    from rsft.reward_service import score_rows

    kept = load_dataset_artifact(paths.selected(round_idx))
    rows = kept.remove_columns(["prompt", "completion"]).to_list()
    raw = score_rows(scorer, kept["prompt"], kept["completion"], rows, progress=False)
    scored = [(p, r) for p, r in zip(kept["prompt_id"], raw) if r is not None]  # a row the source cannot score
    return {(prompt_id, 0): sum(values) / len(values)
            for prompt_id, values in stats.by_prompt([p for p, _ in scored], [r for _, r in scored]).items()}


def check_reward_folder(model: str) -> None:
    """A local folder given to --kept is a reward model: its config.json's architectures name a
    sequence-classification head. A causal LM (a policy folder, architectures ...ForCausalLM) would load
    with a fresh, random classification head whose num_labels outputs mean nothing."""
    folder = Path(model.removeprefix("pretrained:"))
    config_file = folder / "config.json"
    if not config_file.is_file():
        return  # a hub id, a function or a URL: open_source judges it
    try:
        architectures = json.loads(config_file.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return  # open_source names what is wrong with it
    heads = ("ForSequenceClassification", "RewardModel")
    if architectures and not any(a.endswith(heads) or "Reward" in a for a in architectures):
        raise InputError(f"--kept {model}: not a reward model: its config.json names architectures "
                         f"{', '.join(architectures)} (a language model, no sequence-classification head); give a "
                         f"reward model's folder (e.g. runs/<run>/reward, which stage=reward writes)")


def compare_kept(run_a: Path, run_b: Path, model: str) -> None:
    """Judge both runs' kept sets, round by round, with the reward model at `model`."""
    from reward.specs import open_source

    if not model.startswith(("pretrained:", "function:", "http://", "https://")) and not Path(model).is_dir():
        raise MissingInput(f"--kept {model}: no such folder; give a reward model's folder (e.g. runs/hh-judge/reward) "
                         f"or a reward source (pretrained:<folder or hub id>, function:<module:function>, a URL)")
    check_reward_folder(model)
    scorer = open_source(model, "cpu")
    a_paths, b_paths = RunPaths(run_a), RunPaths(run_b)
    print(f"A = {run_a}, B = {run_b}; kept completions scored by {model}")
    print("\n| kept in | prompts kept by both | A [95% CI] | B [95% CI] | A - B (paired by prompt) | P(A beats B) |")
    print("|---|---|---|---|---|---|")
    round_idx = 0
    while is_complete(a_paths.selected(round_idx)) and is_complete(b_paths.selected(round_idx)):
        mine, theirs = kept_scores(a_paths, round_idx, scorer), kept_scores(b_paths, round_idx, scorer)
        both = mine.keys() & theirs.keys()
        mine, theirs = {k: mine[k] for k in both}, {k: theirs[k] for k in both}
        if both:
            print(f"| round {round_idx} | {len(both)} | {stats.shown(stats.bootstrap({k[0]: [v] for k, v in mine.items()}))} | "
                  f"{stats.shown(stats.bootstrap({k[0]: [v] for k, v in theirs.items()}))} | "
                  f"{stats.shown(stats.paired_difference(mine, theirs), signed=True)} | {stats.shown(stats.paired_win_rate(mine, theirs))} |")
        round_idx += 1
    if round_idx == 0:
        raise MissingInput(f"{run_a} and {run_b} have no complete round_00/selected in common; --kept compares the "
                           f"kept sets of runs that ran stage=select")


RECORDS = Path(__file__).resolve().parents[1] / "docs" / "results"
RECORDED_METRICS = ("eos_fraction", "mean_tokens", "distinct_2", "distinct_2_all", "alike_share", "distinct_answers",
                    "mean_entropy")


def run_facts(run: Path, column: str) -> dict:
    """What a record says of a run: its machine, versions and seed (from its artifacts' meta.json) and the seconds
    its artifacts took to build, by stage (the phases of its wall time; model provisioning is not an artifact)."""
    metas = [json.loads(path.read_text()) for path in sorted(run.glob("**/meta.json"))]
    seconds: dict[str, float] = {}
    for meta in metas:
        seconds[meta["stage"]] = round(seconds.get(meta["stage"], 0.0) + float(meta.get("build_seconds") or 0.0), 1)
    first = metas[0] if metas else {}
    config = first.get("config") or {}
    return {"path": str(run), "machine": first.get("machine"), "versions": first.get("versions"),
            "seed": config.get("seed"), "policy": (config.get("policy") or {}).get("name_or_path"),
            "num_samples": (config.get("sample") or {}).get("num_samples"),
            "eval_samples": (config.get("eval") or {}).get("num_samples"),
            "build_seconds_by_stage": seconds, "build_seconds": round(sum(seconds.values()), 1)}


def comparison_record(name: str, argv: list[str], run_a: Path, run_b: Path, column: str, margin: float,
                      rows: list[dict]) -> dict:
    from datetime import datetime, timezone

    return {"record": name, "made_by": "scripts/compare_runs.py",
            "command": "python scripts/compare_runs.py " + " ".join(argv), "commit": commit(),
            "recorded_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "column": column,
            "margin": margin, "a": run_facts(run_a, column), "b": run_facts(run_b, column), "policies": rows}


def seeds(argv: list[str]) -> dict:
    """A against B over seed pairs, at each run's last evaluation (the module's docstring)."""
    from rsft.machine import describe, machine
    from rsft.online_report import last_point, scored_by_prompt, seconds_by_phase
    from rsft.online_report import pick_column as pick_point_column

    parser = argparse.ArgumentParser(prog="compare_runs.py seeds", description=seeds.__doc__)
    parser.add_argument("--a", type=Path, nargs="+", required=True, help="A's runs, one per seed")
    parser.add_argument("--b", type=Path, nargs="+", required=True, help="B's runs, in the same seed order")
    parser.add_argument("--names", nargs=2, default=["A", "B"], metavar=("A", "B"), help="what each side is")
    parser.add_argument("--kinds", nargs=2, choices=["auto", "rounds", "online"], default=["auto", "auto"],
                        metavar=("A", "B"), help="each side's runs: rounds (the loop's last evaluated round), online "
                                                 "(the last snapshot) or auto (whichever a run holds)")
    parser.add_argument("--margin", type=float, required=True, help="m >= 0, stated before the runs")
    parser.add_argument("--column", choices=["gold", "judge", "reward"], default=None)
    parser.add_argument("--record", default=None, metavar="NAME", help="also write docs/results/NAME.json")
    args = parser.parse_args(argv)
    if not args.margin >= 0:
        raise InputError(f"--margin {args.margin}: expected a number >= 0 (the non-inferiority margin, set before the run)")
    if len(args.a) != len(args.b):
        raise InputError(f"--a has {len(args.a)} runs and --b {len(args.b)}: pair them seed for seed, one each")
    for run in (*args.a, *args.b):
        if not run.is_dir():
            raise MissingInput(f"run {run}: no such folder; give run directories (runs/<run_name>)")
    runs = {"a": args.a, "b": args.b}
    kinds = dict(zip("ab", args.kinds))
    last = {side: [last_point(RunPaths(run), kinds[side]) for run in runs[side]] for side in runs}
    points = {side: [point for point, _ in last[side]] for side in last}
    column = pick_point_column(points["a"] + points["b"], args.column)
    try:
        compared = stats.paired_over_seeds([scored_by_prompt(p, column) for p in points["a"]],
                                           [scored_by_prompt(p, column) for p in points["b"]], args.margin)
    except ValueError as error:
        raise InputError(str(error)) from None
    phases = {side: {str(run): seconds_by_phase(RunPaths(run), online=online)
                     for run, (_, online) in zip(runs[side], last[side])} for side in runs}
    names = dict(zip("ab", args.names))
    print(describe(machine()))
    print(f"\n| side | {column} after, pooled over {len(args.a)} seeds [95% CI] | tokens sampled by seed | "
          f"seconds by seed (writes not counted) |\n|---|---|---|---|")
    for side in ("b", "a"):
        print(f"| {names[side]} | {stats.shown(compared[side])} | {', '.join(str(p['tokens']) for p in points[side])} | "
              f"{', '.join(f'{sum(phases[side][str(r)].values()):.0f}' for r in runs[side])} |")
    difference = compared["a_minus_b"]
    print(f"\n{names['a']} - {names['b']}: {stats.shown(difference, True)}, by seed "
          f"{', '.join(f'{d:+.3f}' for d in difference['seed_means'])}: {difference['verdict']} (m = {args.margin:g})")
    record = {"record": args.record, "made_by": "scripts/compare_runs.py seeds",
              "command": "python scripts/compare_runs.py seeds " + " ".join(argv), "commit": commit(),
              "machine": machine(), "column": column, "margin": args.margin, "names": names,
              "runs": {side: [str(r) for r in runs[side]] for side in runs}, "compared": compared,
              "points": {side: [p["point"] for p in points[side]] for side in points},
              "tokens": {side: [p["tokens"] for p in points[side]] for side in points},
              # the range measures of each run's last evaluation (issue 48), by seed
              "range": {side: [{k: p["metrics"][k] for k in RECORDED_METRICS if p["metrics"].get(k) is not None}
                               for p in points[side]] for side in points},
              "seconds_by_phase": phases}
    if args.record:
        print(f"\nrecorded {write_record(args.record, record, RECORDS)}")
    return record


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["seeds"]:
        seeds(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--column", choices=["judge", "gold", "reward"], default=None)
    parser.add_argument("--kept", type=str, default=None, metavar="REWARD_MODEL",
                        help="judge the runs' kept sets (round_XX/selected) with this reward model instead")
    parser.add_argument("--record", default=None, metavar="NAME",
                        help="also write the comparison to docs/results/NAME.json, a record gen_docs renders tables from")
    parser.add_argument("--margin", type=float, default=0.0,
                        help="m >= 0, stated before the comparison: A is 'not worse' than B when the paired interval's "
                             "low end is above -m (rsft.stats.verdict); 0 (the default) decides only better / worse")
    args = parser.parse_args(argv)
    if not args.margin >= 0:
        raise InputError(f"--margin {args.margin}: expected a number >= 0 (the non-inferiority margin, set before the run)")
    for run in (args.run_a, args.run_b):
        if not run.is_dir():
            raise MissingInput(f"run {run}: no such folder; give two run directories (runs/<run_name>)")
    if args.kept is not None:
        return compare_kept(args.run_a, args.run_b, args.kept)
    a_evals, b_evals = (dict(evaluations(RunPaths(run))) for run in (args.run_a, args.run_b))
    shared = [name for name in a_evals if name in b_evals]
    if not shared:
        raise MissingInput(f"{args.run_a} and {args.run_b} have no evaluation of the same policy in common (complete "
                           f"eval_initial/ or round_XX/eval/ in both); run `python -m rsft.run stage=eval` first")
    column = None
    print(f"A = {args.run_a}, B = {args.run_b}")
    rows, previous = [], None
    for name in shared:
        a, b = load_dataset_artifact(a_evals[name]), load_dataset_artifact(b_evals[name])
        if column is None:
            column = pick_column(a, b, args.column)
            print(f"\n| policy | A {column} [95% CI] | B {column} [95% CI] | A - B (paired) | P(A beats B) | A vs B |")
            print("|---|---|---|---|---|---|")
        elif column not in a.column_names or column not in b.column_names:
            print(f"| {name} | (no {column} column in both) | | | | |")
            continue
        mine = stats.keyed(a["prompt_id"], a["sample_idx"], a[column])
        theirs = stats.keyed(b["prompt_id"], b["sample_idx"], b[column])
        difference = stats.paired_difference(mine, theirs)
        a_interval = stats.bootstrap(stats.by_prompt(a["prompt_id"], a[column]))
        b_interval = stats.bootstrap(stats.by_prompt(b["prompt_id"], b[column]))
        win_rate = stats.paired_win_rate(mine, theirs)
        print(f"| {name} | {stats.shown(a_interval)} | {stats.shown(b_interval)} | "
              f"{stats.shown(difference, signed=True)} | {stats.shown(win_rate)} | "
              f"{stats.verdict_shown(difference, args.margin)} |")
        row = {"policy": name, "a": a_interval, "b": b_interval,
               "a_minus_b": {**difference, "verdict": stats.verdict(difference, args.margin)}, "a_beats_b": win_rate}
        for side, values, folder in (("a", mine, a_evals[name]), ("b", theirs, b_evals[name])):
            measured = folder / "metrics.json"
            metrics = json.loads(measured.read_text()) if measured.is_file() else {}
            row[f"{side}_metrics"] = {key: metrics.get(key) for key in RECORDED_METRICS}
            row[f"{side}_metrics"].update({key: value for key, value in metrics.items() if key.startswith("pass_at_")})
            row[f"{side}_metrics"][f"{column}_win_rate_vs_initial"] = metrics.get(f"{column}_win_rate_vs_initial")
            if previous is not None:
                change = stats.paired_difference(values, previous[side])
                row[f"{side}_vs_previous"] = {**change, "verdict": stats.verdict(change, args.margin)}
        previous = {"a": mine, "b": theirs}
        rows.append(row)
    if args.record:
        out = write_record(args.record, comparison_record(args.record, argv, args.run_a, args.run_b, column,
                                                          args.margin, rows), RECORDS)
        print(f"\nrecorded {out}")


if __name__ == "__main__":
    main_guard(main)()
