"""Token entropy against pass@1, one panel per seed: where each collapse lever ends, beside GRPO's path.

    python scripts/entropy_frontier.py docs/results/recipe-vs-grpo3072-3-seeds.json \
        docs/results/lever-gem-3-seeds.json:"GEM" --out docs/img/entropy_frontier.png

Issue 48's entropy row compares a policy's token entropy with GRPO's at equal pass@1, so a lever is a point and
GRPO is a path: each argument is a record of `scripts/bench_grpo.py seeds` (docs/results/*.json), optionally
`:label`. Its A side's last evaluation on each seed is a point; where its B side is GRPO (runs named grpo-..., whose
evaluations are at completion counts, `range.b`), that path is drawn once per distinct set of GRPO runs. A point
above a seed's GRPO path at its pass@1 keeps more range than GRPO did there. The table beside it prints the same
numbers. Only recorded numbers are read, never a run directory, so the plot is remade from the records alone. The
plot is matplotlib's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rsft.errors import InputError, main_guard


def read_record(arg: str) -> tuple[str, dict]:
    path, _, label = arg.partition(":")
    try:
        record = json.loads(Path(path).read_text())
    except OSError as error:
        raise InputError(f"{path}: cannot read the record ({error.strerror})") from None
    except ValueError as error:
        raise InputError(f"{path}: not JSON ({error})") from None
    ranges = record.get("range") if isinstance(record, dict) else None
    if not isinstance(ranges, dict) or not isinstance(ranges.get("a"), list) or not ranges["a"]:
        raise InputError(f"{path}: expected a record of `scripts/bench_grpo.py seeds` with a `range.a` list (one "
                         f"list of evaluations per seed)")
    for side in ("a", "b"):
        for seed, points in enumerate(ranges.get(side) or []):
            if not isinstance(points, list) or not points or not all(
                    isinstance(p, dict) and {"pass_at_1", "mean_entropy"} <= set(p) for p in points):
                raise InputError(f"{path}: range.{side}[{seed}] should list evaluations with pass_at_1 and "
                                 f"mean_entropy")
    return label or Path(path).stem, record


def is_grpo(runs) -> bool:
    """B is GRPO when every B run is named as `scripts/bench_grpo.py train` names its runs (grpo-s<seed>-...)."""
    return bool(runs) and all(Path(r).name.startswith("grpo-") for r in runs)


def collect(args: list[str]):
    """(lever points: [(label, seed, pass@1, entropy)], GRPO paths: {name: [[(completions, pass@1, entropy)] a
    seed]})."""
    points, paths = [], {}
    for arg in args:
        label, record = read_record(arg)
        for seed, evaluations in enumerate(record["range"]["a"]):
            last = evaluations[-1]
            points.append((label, seed, last["pass_at_1"], last["mean_entropy"]))
        runs_b = record.get("b") or []
        if is_grpo(runs_b):
            name = Path(runs_b[0]).parent.name  # the folder of GRPO runs (grpo, grpo3072)
            paths.setdefault(name, [[(p.get("completions"), p["pass_at_1"], p["mean_entropy"]) for p in seed]
                                    for seed in record["range"]["b"]])
    return points, paths


def table(points, paths) -> str:
    lines = ["| lever | seed | pass@1 | token entropy | " + " | ".join(f"GRPO ({n}/): entropy at the nearest pass@1"
                                                                     for n in paths) + " |",
             "|---|---|---|---|" + "---|" * len(paths)]
    for label, seed, p1, entropy in points:
        nearest = []
        for seeds in paths.values():
            if seed < len(seeds):
                c, q, e = min(seeds[seed], key=lambda t: abs(t[1] - p1))
                nearest.append(f"{e:.3f} (pass@1 {q:.3f}, {c:,} completions)" if c is not None else f"{e:.3f}")
            else:
                nearest.append("-")
        lines.append(f"| {label} | {seed} | {p1:.3f} | {entropy:.3f} | " + " | ".join(nearest) + " |")
    return "\n".join(lines)


def plot(points, paths, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({s for _, s, _, _ in points})
    labels = list(dict.fromkeys(label for label, _, _, _ in points))
    markers = "osD^v<>PX*hd"
    tab20 = plt.get_cmap("tab20").colors  # one colour per policy (the default cycle repeats after ten): dark ones first
    colours = tab20[0::2] + tab20[1::2]
    # the legend sits beside the panels: as wide as its longest name, and the figure as tall as its entries (7 pt)
    names = [*labels, *(f"GRPO ({name}/)" for name in paths)]
    legend_width = 0.7 + 0.055 * max(map(len, names))
    height = max(4.0, 0.8 + 0.16 * len(names))
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.2 * len(seeds) + legend_width, height), sharey=True,
                             squeeze=False)
    handles = {}
    for ax, seed in zip(axes[0], seeds):
        for style, (name, by_seed) in zip(("-", "--", ":"), paths.items()):
            if seed < len(by_seed):
                path = by_seed[seed]
                (line,) = ax.plot([p for _, p, _ in path], [e for _, _, e in path], style, color="black",
                                  marker=".")
                handles.setdefault(f"GRPO ({name}/)", line)
        for i, label in enumerate(labels):
            mine = [(p, e) for lab, s, p, e in points if lab == label and s == seed]
            if mine:
                handles.setdefault(label, ax.scatter(*zip(*mine), marker=markers[i % len(markers)], s=45, zorder=3,
                                                     color=colours[i % len(colours)]))
        ax.set_title(f"seed {seed}")
        ax.set_xlabel("pass@1 (held-out)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean token entropy (nats)")
    # beside the panels, not over them: a legend inside an axis hides the points it names
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="center right")
    fig.suptitle("Where each policy ends: token entropy against pass@1 (GRPO: its path over completions)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - legend_width / fig.get_figwidth(), 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", help="bench_grpo seeds records (docs/results/*.json), each "
                                                   "optionally :label")
    parser.add_argument("--out", type=Path, help="the plot's file (PNG); none = the table only")
    args = parser.parse_args(argv)
    points, paths = collect(args.records)
    print(table(points, paths))
    if args.out:
        plot(points, paths, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    main_guard(main)()
