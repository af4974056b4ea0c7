"""The judge against diversity across prompts: one point per evaluated policy, with intervals, as a table and a plot.

    python scripts/diversity_curve.py runs/hh-a runs/hh-a-random --out docs/img/hh_diversity.png
    python scripts/diversity_curve.py runs/hh0-full:full runs/hh0-lora:lora --rounds 0 --column reward

A collapse lever is only worth it if it buys diversity without giving up what selection gained, so
its effect is a curve, not a number: the judge's mean score on the held-out prompts (y) against
distinct-2 over all their completions pooled (x, rsft.stats.distinct_n: the share of distinct word
bigrams across prompts, which falls when every answer repeats the same phrases). Each argument is a
run directory, optionally `:label`; every evaluation it has (eval_initial/, round_XX/eval/) is a
point, `--rounds` keeps some.

Intervals, both over prompts (the independent draws; a prompt's completions are correlated):
- the judge (or --column): rsft.stats.bootstrap, the 95% percentile interval of the mean of
  per-prompt means;
- distinct-2 (all): a ratio over a pooled set, which a bootstrap resample with repeated prompts
  biases downward (a prompt drawn twice repeats every one of its bigrams), so the interval is the
  jackknife's: leave each prompt out in turn, standard error sqrt((n-1)/n sum (d_i - mean d)^2),
  +-1.96 standard errors (a normal interval).
Written by hand because the interval of a pooled n-gram ratio is not something the project's libraries
offer; the plot is matplotlib's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

from rsft.errors import InputError, MissingInput, main_guard
from rsft.paths import RunPaths
from rsft.report import evaluations
from rsft.stats import bootstrap, distinct_n, mid_sentence_share
from rsft.store import load_dataset_artifact

Z95 = 1.959964


def jackknife_distinct(by_prompt: dict[str, list[str]], n: int = 2) -> dict:
    """distinct-n over every completion, and its jackknife 95% interval over prompts."""
    texts = [t for group in by_prompt.values() for t in group]
    value = distinct_n(texts, n)
    keys = list(by_prompt)
    if value is None or len(keys) < 2:
        return {"value": value, "low": value, "high": value}
    left_out = [distinct_n([t for k in keys if k != skip for t in by_prompt[k]], n) for skip in keys]
    left_out = [d for d in left_out if d is not None]
    mean = sum(left_out) / len(left_out)
    se = math.sqrt((len(left_out) - 1) / len(left_out) * sum((d - mean) ** 2 for d in left_out))
    return {"value": value, "low": value - Z95 * se, "high": value + Z95 * se}


def point(folder: Path, column: str | None) -> dict:
    ds = load_dataset_artifact(folder)
    column = column or ("judge" if "judge" in ds.column_names else "gold" if "gold" in ds.column_names else "reward")
    if column not in ds.column_names:
        raise InputError(f"--column {column}: {folder} has no such column (columns: {ds.column_names})")
    scores, texts = defaultdict(list), defaultdict(list)
    for pid, value, text in zip(ds["prompt_id"], ds[column], ds["completion"]):
        scores[pid].append(float(value))
        texts[pid].append(text)
    return {"column": column, "score": bootstrap(dict(scores)), "distinct_2_all": jackknife_distinct(dict(texts)),
            "completions": len(ds), "eos_fraction": sum(r == "eos" for r in ds["finish_reason"]) / max(len(ds), 1),
            "eos_mid_sentence": mid_sentence_share([t for t, r in zip(ds["completion"], ds["finish_reason"]) if r == "eos"]),
            "mean_tokens": sum(ds["num_tokens"]) / max(len(ds), 1) if "num_tokens" in ds.column_names else None}


def plot(points: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    runs = list(dict.fromkeys(p["label"] for p in points))
    colours = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    for i, run in enumerate(runs):
        mine = [p for p in points if p["label"] == run]
        xs = [p["distinct_2_all"]["value"] for p in mine]
        ys = [p["score"]["mean"] for p in mine]
        xerr = [[x - p["distinct_2_all"]["low"] for x, p in zip(xs, mine)],
                [p["distinct_2_all"]["high"] - x for x, p in zip(xs, mine)]]
        yerr = [[y - p["score"]["low"] for y, p in zip(ys, mine)], [p["score"]["high"] - y for y, p in zip(ys, mine)]]
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt="o-" if len(mine) > 1 else "o", capsize=3, label=run,
                    color=colours(i))
        for x, y, p in zip(xs, ys, mine):
            ax.annotate(p["policy"].replace("round ", "r"), (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    ax.set_xlabel("distinct-2 over all held-out completions (jackknife 95% CI)")
    ax.set_ylabel(f"{points[0]['column']} mean (bootstrap 95% CI over prompts)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def check_writable(out: Path, option: str = "--out") -> None:
    """The folder `out` goes in can be made and written, probed before any evaluation is read (a plot that
    fails at the end has read every run for nothing)."""
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".{out.name}.probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise InputError(f"{option} {out}: cannot write in {folder} ({error.strerror or error}); choose a writable "
                         f"folder") from None


def run_rounds(found: list) -> list[int]:
    """The rounds a run has a complete evaluation of (its evaluations' policies `round r`)."""
    return sorted(int(policy.split()[1]) for policy, _ in found if policy != "initial")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories, each optionally RUN:LABEL")
    parser.add_argument("--rounds", type=int, nargs="*", help="keep these rounds only (the initial policy is kept "
                                                               "once, from the first run)")
    parser.add_argument("--column", help="the score column (default: judge, else gold, else reward)")
    parser.add_argument("--out", type=Path, help="write the plot here (PNG) and the numbers beside it (.json)")
    args = parser.parse_args(argv)
    if args.rounds is not None and any(r < 0 for r in args.rounds):
        raise InputError(f"--rounds {' '.join(map(str, args.rounds))}: expected round numbers >= 0 (the initial "
                         f"policy is always shown)")
    if args.out is not None:
        check_writable(args.out)
    points, initial_seen = [], False
    for spec in args.runs:  # every run's evaluations, and the rounds asked for, before any is read
        run = spec.partition(":")[0]
        if not Path(run).is_dir():
            raise MissingInput(f"{spec}: {run} is not a run directory (no such folder)")
        found = evaluations(RunPaths(run))
        if not found:
            raise MissingInput(f"{spec}: {run} has no complete evaluation (eval_initial/ or round_XX/eval/); run "
                               f"`python -m rsft.run stage=eval` (or stage=loop) first")
        missing = sorted(set(args.rounds or ()) - set(run_rounds(found)))
        if missing:
            has = ", ".join(map(str, run_rounds(found))) or "none"
            raise MissingInput(f"--rounds {' '.join(map(str, args.rounds))}: {run} has no complete evaluation of "
                               f"round(s) {', '.join(map(str, missing))} (its evaluated rounds: {has})")
    for spec in args.runs:
        run, _, label = spec.partition(":")
        found = evaluations(RunPaths(run))
        for policy, folder in found:
            if policy == "initial":
                if initial_seen:
                    continue
                initial_seen = True
            elif args.rounds is not None and int(policy.split()[1]) not in args.rounds:
                continue
            points.append({"label": "initial" if policy == "initial" else (label or Path(run).name),
                           "policy": policy, **point(folder, args.column)})
    if not points:
        raise MissingInput(f"--rounds {' '.join(map(str, args.rounds))}: no complete evaluation of these rounds in "
                           f"{', '.join(args.runs)}")
    print(f"| run | policy | {points[0]['column']} [95% CI] | distinct-2 (all) [95% CI] | ends with EOS | of those, "
          f"mid-sentence | mean tokens |")
    print("|---|---|---|---|---|---|---|")
    for p in points:
        s, d = p["score"], p["distinct_2_all"]
        print(f"| {p['label']} | {p['policy']} | {s['mean']:.2f} [{s['low']:.2f}, {s['high']:.2f}] | "
              f"{d['value']:.3f} [{d['low']:.3f}, {d['high']:.3f}] | {p['eos_fraction']:.2f} | {p['eos_mid_sentence']:.2f} | "
              f"{p['mean_tokens'] if p['mean_tokens'] is None else round(p['mean_tokens'], 1)} |")
    if args.out is not None:
        plot(points, args.out)
        args.out.with_suffix(".json").write_text(json.dumps(points, indent=2))
        print(f"wrote {args.out} and {args.out.with_suffix('.json')}", file=sys.stderr)
    return points


if __name__ == "__main__":
    main_guard(main)()
