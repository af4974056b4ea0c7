"""Labels where the reward model is unsure against labels at random: held-out accuracy at a label budget.

    python scripts/bench_labels.py runs/demo runs/demo-s1 --out runs/labels   # one source run per seed
    python scripts/bench_labels.py runs/demo runs/demo-s1 --out runs/labels-scratch --init scratch \
        --shares 0.2,0.6,1.0 --plot docs/img/labels_curve.png                  # a label curve, both choices

For each source run (a demo run with prefs/, reward/ and round_00/samples/; its seed is read from its
recorded config) it refreshes the reward model on round 0's labels, as stage=loop does with
loop.refresh_reward, three ways, each in its own run directory under --out holding copies of those three
artifacts:

- `random`: refresh.choose=random at the budget B that refresh.choose=first would label (every pair
  among the first 4 completions of the train prompts);
- `uncertain`: refresh.choose=uncertain at B (the pairs where the run's reward/ disagrees most with
  itself across dropout masks, rsft.pairs.pair_uncertainty);
- `uncertain-60`: refresh.choose=uncertain at 60% of B;
- `random-60`: refresh.choose=random at 60% of B, the control: what 40% fewer labels cost without a choice.

`--choices uncertain,posterior` measures each named choice beside random (default: uncertain); posterior
picks one pair at a time where the head's Bayesian posterior is least sure (rsft.pairs.posterior_design).

With --shares the variants are instead random and each of --choices at each share of B (random at 1.0 is
the reference), and --init scratch retrains each refreshed model from the backbone (refresh.init=scratch,
reward.epochs) instead of continuing the run's reward/ for one epoch, so that the round's labels weigh as
much as the initial ones.
--init alone trains each variant's model from the backbone (stage=reward, reward.epochs) on the round's chosen
labels only, without the initial ones: the regime where every label counts (a task with few labels so far);
the pairs are still chosen by the run's reward/ (uncertain, posterior) or at random.
--plot draws the gold-order accuracy against the labels, every choice, with 95% intervals.
--margin M --record NAME (issue 47: results as data) decides, pooled over the source runs' seeds, each chosen
variant against random at the full budget B and against random at its own budget (equal labels), on the gold
order (the widest measure), with rsft.stats.paired_over_seeds at the margin m stated before the run, and writes
docs/results/NAME.json (table kind labels in scripts/gen_docs.py).

Every variant holds out the same pairs (the held-out prompts' pairs do not depend on the choice), so
their held-out accuracies are paired: the script scores those pairs with each refreshed model and
prints each accuracy with its 95% bootstrap interval over prompts, and the paired difference of each
chosen variant against random at B, on the round's held-out pairs, on the initial labels'
held-out pairs (prefs/), and, since those are few (about 120 on the demo), on every pair of round 1's
samples whose gold differs (prompts no variant saw: data.rotate; `--gold-rounds 1,2` adds round 2's,
twice the prompts), ordered as gold orders them, and on that last measure against random at the same
budget; each variant's distinct completions and pairs gold calls a tie; the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from rsft import stats
from rsft.errors import MissingInput, main_guard
from rsft.machine import describe, machine
from rsft.paths import RunPaths
from rsft.store import is_complete, load_dataset_artifact, read_meta

COPIED = ("prefs", "reward", "round_00/samples")


def run_variant(source: Path, out: Path, name: str, seed: int, choose: str, budget: int | None,
                init: str = "previous") -> Path:
    """Refresh round 0's reward model in a copy of `source`'s prefs, reward and round-0 samples; with
    init="alone", label round 0 (stage=labels) and train a reward model from the backbone on those labels alone
    (stage=reward in `<name>-alone/`, whose prefs/ is a copy of the round's)."""
    run_dir = out / name
    for rel in COPIED:
        if not (run_dir / rel).exists():
            (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(source / rel, run_dir / rel)
    stage = "labels" if init == "alone" else "refresh"
    command = [sys.executable, "-m", "rsft.run", f"stage={stage}", "round=0", "loop.refresh_reward=true",
               f"refresh.choose={choose}", f"seed={seed}", "logger=none", f"paths.runs_root={out}",
               f"run_name={name}"] + ([] if init == "alone" else [f"refresh.init={init}"]) + (
                  [f"refresh.label_budget={budget}"] if budget is not None else [])
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    if init == "alone":
        alone = out / f"{name}-alone"
        if not (alone / "prefs").exists():
            alone.mkdir(parents=True, exist_ok=True)
            shutil.copytree(RunPaths(run_dir).round_prefs(0), alone / "prefs")
        # a rerun keeps a trained model: its copied prefs/ names the run's reward/ (the chooser) as an input, which
        # the staleness check would take for this folder's newer reward/
        if not is_complete(RunPaths(alone).reward):
            command = [sys.executable, "-m", "rsft.run", "stage=reward", f"seed={seed}", "logger=none",
                       f"paths.runs_root={out}", f"run_name={alone.name}"]
            print("$", " ".join(command[1:]), flush=True)
            subprocess.run(command, check=True)
    return run_dir


def accuracy_keys(scorer, pairs) -> dict[tuple[str, int], float]:
    """{(prompt_id, pair index): 1.0 when the model ranks the labelled winner higher, else 0.0}, pairs labelled
    exactly 0.5 left out: reward.trained.pairwise_accuracy's rule (the refresh's own heldout_accuracy), per pair."""
    from reward.trained import score_pairs

    chosen, rejected = score_pairs(scorer, pairs)
    return {(prompt_id, k): float((c > r) == (p > 0.5))
            for k, (prompt_id, c, r, p) in enumerate(zip(pairs["prompt_id"], chosen, rejected, pairs["label_prob"]))
            if p != 0.5}


def gold_keys(scorer, *rounds_samples) -> dict[tuple[str, int], float]:
    """{(prompt_id, pair index): 1.0 when the model orders the pair as gold does, else 0.0} over every pair of
    a prompt's completions whose gold differs, in each round's samples given: the agreement with the truth on
    many pairs no model trained on."""
    from itertools import combinations

    from reward.gold import gold_score

    keys = {}
    for samples in rounds_samples:
        golds = [gold_score(t, c, f)
                 for t, c, f in zip(samples["task"], samples["completion"], samples["finish_reason"])]
        rewards = scorer.score(scorer.as_trained(samples["prompt"]), samples["completion"], progress=False)
        by_prompt: dict[str, list[int]] = {}
        for i, prompt_id in enumerate(samples["prompt_id"]):
            by_prompt.setdefault(prompt_id, []).append(i)
        for prompt_id, rows in by_prompt.items():
            for i, j in combinations(rows, 2):
                if golds[i] != golds[j]:
                    keys[(prompt_id, len(keys))] = float((rewards[i] - rewards[j]) * (golds[i] - golds[j]) > 0)
    return keys


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="source demo runs, one per seed")
    parser.add_argument("--out", type=Path, required=True, help="where the variants' run directories go")
    parser.add_argument("--init", choices=["previous", "scratch", "alone"], default="previous",
                        help="refresh.init of every variant (default: previous, as the loop); alone: a reward model "
                             "from the backbone on the round's chosen labels only")
    parser.add_argument("--shares", type=shares, default=None, metavar="S,S,...",
                        help="random and each choice at each share of B (1.0 included), instead of the default "
                             "variants")
    parser.add_argument("--choices", type=choices, default=["uncertain"], metavar="C,C,...",
                        help="the choices measured beside random: uncertain, posterior (default: uncertain)")
    parser.add_argument("--gold-rounds", type=rounds, default=[1], metavar="R,R,...",
                        help="whose samples the gold order is measured on (default: 1); 1,2 doubles the prompts")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG")
    parser.add_argument("--margin", type=float, default=None, help="m >= 0 on the gold-order accuracy, stated before "
                                                                   "the run: the rule's margin for --record")
    parser.add_argument("--record", default=None, metavar="NAME", help="also write docs/results/NAME.json (needs "
                                                                      "--margin)")
    args = parser.parse_args(argv)
    if args.record and (args.margin is None or not args.margin >= 0):
        parser.error(f"--record needs --margin m >= 0, stated before the run (got {args.margin})")
    gold_from = ", ".join(f"round {r}" for r in args.gold_rounds) + "'s samples"
    if args.shares is None:
        variants = (("random", "random", 1.0), *((c, c, 1.0) for c in args.choices),
                    *((f"{c}-60", c, 0.6) for c in args.choices), ("random-60", "random", 0.6))
    else:
        variants = tuple((("random" if choose == "random" and share == 1.0 else f"{choose}-{round(100 * share)}"),
                          choose, share)
                         for share in sorted(set(args.shares) | {1.0}, reverse=True)
                         for choose in ("random", *args.choices))
    curves, measured = {}, []
    from reward.trained import load_scorer

    print(describe(machine()))
    for source in args.runs:
        needed = COPIED + tuple(f"round_{r:02d}/samples" for r in args.gold_rounds)
        for rel in needed:
            if not is_complete(source / rel):
                raise MissingInput(f"{source / rel}: missing; a source run needs {', '.join(needed)} "
                                   f"(stage=loop makes them)")
        seed = int(read_meta(source / "prefs")["config"]["seed"])
        results = {}
        for name, choose, share in variants:
            budget = None
            if share != 1.0:
                full = read_meta(args.out / f"{source.name}-random" / "round_00" / "prefs")["counts"]["label_budget"]
                budget = max(1, round(share * full))
            run_dir = run_variant(source, args.out, f"{source.name}-{name}", seed, choose, budget, args.init)
            paths = RunPaths(run_dir)
            labels = load_dataset_artifact(paths.round_prefs(0))
            scorer = load_scorer(paths.round_reward(0) if args.init != "alone"
                                 else RunPaths(args.out / f"{run_dir.name}-alone").reward)
            train = labels["train"]
            results[name] = {"budget": read_meta(paths.round_prefs(0))["counts"]["label_budget"],
                             "train_pairs": len(train), "choose": choose,
                             "completions": len({(p, i) for p, a, b in zip(
                                 train["prompt_id"], train["chosen_sample_idx"], train["rejected_sample_idx"])
                                 for i in (a, b)}),
                             "gold_ties": sum(a == b for a, b in zip(train["gold_chosen"], train["gold_rejected"])),
                             "round": accuracy_keys(scorer, labels["test"]),
                             "initial": accuracy_keys(scorer, load_dataset_artifact(paths.prefs)["test"]),
                             "gold": gold_keys(scorer, *(load_dataset_artifact(RunPaths(source).samples(r))
                                                         for r in args.gold_rounds))}
        print(f"\n{source} (seed {seed}): held-out accuracy of round 0's refreshed reward model")
        print("| labels | pairs | distinct completions | gold ties | round 0 held-out | vs random (paired) | "
              f"initial held-out | vs random (paired) | gold order, {gold_from} | vs random (paired) | "
              "vs random at equal labels |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, result in results.items():
            cells = [name, str(result["train_pairs"]), str(result["completions"]), str(result["gold_ties"])]
            for part in ("round", "initial", "gold"):
                keys = result[part]
                cells.append(stats.shown(stats.bootstrap(stats.by_prompt([p for p, _ in keys], list(keys.values())))))
                cells.append("" if name == "random" else
                             stats.shown(stats.paired_difference(keys, results["random"][part]), signed=True))
            same = [r for r in results.values() if r["choose"] == "random" and r["budget"] == result["budget"]]
            cells.append("" if result["choose"] == "random" or not same else
                         stats.shown(stats.paired_difference(result["gold"], same[0]["gold"]), signed=True))
            print("| " + " | ".join(cells) + " |")
        curves[f"{source.name} (seed {seed})"] = results
        measured.append((source, seed, results))
        (args.out / f"{source.name}-results.json").write_text(json.dumps(
            {name: {"train_pairs": r["train_pairs"], "budget": r["budget"],
                    **{part: sum(r[part].values()) / len(r[part]) for part in ("round", "initial", "gold")}}
             for name, r in results.items()}, indent=2))
    if args.plot is not None:
        plot(curves, args.plot, gold_from)
        print(f"\nplot: {args.plot}")
    if args.record:
        from rsft.machine import commit, write_record

        record = {"record": args.record, "made_by": "scripts/bench_labels.py",
                  "command": "python scripts/bench_labels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "commit": commit(), "machine": machine(), "init": args.init, "margin": args.margin,
                  "measure": f"gold order, {gold_from}", "sources": [str(s) for s, _, _ in measured],
                  "seeds": [seed for _, seed, _ in measured], "rows": decided_rows(measured, args.margin)}
        print(f"\nrecorded {write_record(args.record, record)}")


def decided_rows(measured: list[tuple[Path, int, dict]], margin: float) -> list[dict]:
    """Each variant's gold-order accuracy pooled over the seeds, and each other variant against random at the full
    budget B (and a chosen one against random at its own budget), pooled over seeds and prompts with the verdict at `margin`. The
    prompts are those every seed has a pair of distinct gold on (a pooled interval draws one set of prompts)."""
    first = measured[0][2]
    shared = set.intersection(*({p for p, _ in r[name]["gold"]} for _, _, r in measured for name in r))

    def per_prompt(result: dict) -> dict[str, list[float]]:
        values = stats.by_prompt([p for p, _ in result["gold"]], list(result["gold"].values()))
        return {p: v for p, v in values.items() if p in shared}

    rows = []
    for name, result in first.items():
        row = {"variant": name, "choose": result["choose"],
               "labels": [r[name]["train_pairs"] for _, _, r in measured],
               "gold_order": stats.pooled_bootstrap([per_prompt(r[name]) for _, _, r in measured])}
        if name != "random":  # random at fewer labels too: the control for what fewer labels cost unchosen
            against = {"random at B": "random"}
            same = [n for n, r in first.items() if r["choose"] == "random" and r["budget"] == result["budget"]]
            if same and same[0] not in ("random", name):
                against["random at equal labels"] = same[0]
            row["against"] = {label: {"variant": other, **stats.paired_over_seeds(
                [per_prompt(r[name]) for _, _, r in measured], [per_prompt(r[other]) for _, _, r in measured],
                margin)["a_minus_b"]} for label, other in against.items()}
        rows.append(row)
    return rows


def shares(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or any(not 0.0 < v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected shares of the budget in (0, 1], comma-separated")
    return values


def rounds(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected rounds >= 1 (round 0 is the one labelled), "
                                         f"comma-separated")
    return values


def choices(text: str) -> list[str]:
    from rsft.pairs import MODEL_CHOICES

    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in MODEL_CHOICES for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected choices among {', '.join(MODEL_CHOICES)}, "
                                         f"comma-separated")
    return values


def plot(curves: dict[str, dict], out: Path, gold_from: str) -> None:
    """Gold-order accuracy on later rounds' samples against the labels, per choice, one panel per source run."""
    from rsft.plotting import finish, interval_errorbar, pyplot

    fig, axes = pyplot().subplots(1, len(curves), figsize=(5 * len(curves), 3.8), squeeze=False)
    for ax, (title, results) in zip(axes[0], curves.items()):
        for choose, color in (("random", "tab:gray"), ("uncertain", "tab:purple"), ("posterior", "tab:green")):
            points = sorted((r["train_pairs"], r["gold"]) for name, r in results.items()
                            if name.split("-")[0] == choose)
            if not points:
                continue
            xs = [x for x, _ in points]
            shown = [stats.bootstrap(stats.by_prompt([p for p, _ in keys], list(keys.values()))) for _, keys in points]
            interval_errorbar(ax, xs, shown, color=color, label=choose)
        ax.set(title=title, xlabel="round 0 labels (pairs)", ylabel=f"gold-order accuracy, {gold_from}")
    finish(fig, axes[0], out)


if __name__ == "__main__":
    main_guard(main)()
