"""The loop's report: per-round metrics from the artifacts' records, plots, summary.md.

Every number comes from an artifact's meta.json record (an evaluation's metrics are in its record
too): the records the loop's stages returned (rsft.store.Artifact, also for the artifacts they
reused), read from the run directory only where the loop has none. Either way it is what the artifact
recorded, never the current config, so a resumed loop reports the same numbers as one that ran
straight through.
Plots (PNG under runs/<run_name>/plots/, also logged to wandb by the loop):
  best_of_n.png     expected best-of-N reward vs N for each round's samples (Llama 2, figure 7),
                    beside the expected gold score of the reward-best-of-N completion
  gold_vs_proxy.png gold, judge and proxy score of each policy on held-out prompts with 95%
                    intervals, one panel each; where the proxy climbs and gold (or the judge)
                    does not, the reward model is being over-optimised
  diversity.png     distinct-2 within and across prompts and the top opening's share per policy
  acceptance.png    the draft's acceptance rate per draft position, per round (when a draft is used)
  online.png        held-out score against tokens sampled: stage=online's eval snapshots beside the
                    rounds' evaluations, one panel per score (rsft.online_report)
A run directory with no round (stage=online alone: rounds=0) gets the sections it has data for.
"""

from __future__ import annotations

from pathlib import Path

from rsft import stats
from rsft.machine import describe, identity
from rsft.metrics import (
    SCORE_TITLES,
    best_of_n_curve,
    flat_metrics,
    gold_scores,
    score_columns,
)
from rsft.online_report import online_summary, plot_online
from rsft.paths import RunPaths
from rsft.store import Artifact, is_complete, load_dataset_artifact, read_meta


class Records:
    """The meta.json records of a run's artifacts: the ones the stages returned, each other read once."""

    def __init__(self):
        self._known: dict[Path, dict] = {}

    def add(self, artifact: Artifact) -> None:
        self._known[Path(artifact.path)] = artifact.meta

    def meta(self, path: Path) -> dict:
        """The record of a complete artifact; {} for one that does not exist (yet)."""
        path = Path(path)
        if path not in self._known:
            if not is_complete(path):
                return {}
            self._known[path] = read_meta(path)
        return self._known[path]

    def metrics(self, path: Path) -> dict:
        """An evaluation's metrics (rsft.eval writes them into its record and into metrics.json)."""
        return self.meta(path).get("metrics", {})


# the held-out numbers a round reports (with _low / _high where they have an interval)
EVAL_KEYS = ("reward_mean", "reward_normalised_mean", "gold_mean", "judge_mean", "win_rate_vs_initial",
             "gold_win_rate_vs_initial", "judge_win_rate_vs_initial", "gold_diff_vs_initial", "judge_diff_vs_initial",
             "reward_diff_vs_initial", "distinct_1", "distinct_2", "distinct_2_all", "top_opening_share",
             "mean_tokens", "mean_words", "eos_fraction")


def round_metrics(paths: RunPaths, round_idx: int, records: Records | None = None) -> dict:
    """The round's headline numbers, flat, from its artifacts (missing artifacts give no keys)."""
    records = records or Records()
    sampling = records.meta(paths.samples(round_idx)).get("sampling", {})
    scored = records.meta(paths.scored(round_idx)).get("stats", {})
    select = records.meta(paths.selected(round_idx))
    sft = records.meta(paths.policy(round_idx)).get("stats", {})
    evaluation = records.metrics(paths.eval(round_idx))
    out = {
        "sample/tokens_per_second": sampling.get("tokens_per_second"),
        "sample/acceptance_rate": sampling.get("acceptance_rate"),
        "sample/mean_tokens": sampling.get("mean_tokens"),
        "sample/eos_fraction": sampling.get("eos_fraction"),
        "score/reward_mean": scored.get("reward_mean"),
        "score/best_of_k_reward_mean": scored.get("best_of_k_reward_mean"),
        "select/selected": select.get("counts", {}).get("selected"),
        "select/pairs": select.get("counts", {}).get("pairs"),
        "select/selected_reward_mean": select.get("stats", {}).get("selected_reward_mean"),
        "sft/train_loss": sft.get("train_loss"),
        "sft/loss_last": sft.get("loss_last"),
    }
    out["select/prompts_kept"] = select.get("counts", {}).get("prompts_kept")
    out["select/dropped_truncated"] = select.get("counts", {}).get("dropped_truncated")
    out["select/top_opening_share"] = select.get("stats", {}).get("top_opening_share")
    flat = flat_metrics(evaluation)
    for key in EVAL_KEYS:
        for suffix in ("", "_low", "_high"):
            out[f"eval/{key}{suffix}"] = flat.get(f"{key}{suffix}")
    return {k: v for k, v in out.items() if v is not None}


def best_of_n_curves(paths: RunPaths, rounds: int, records: Records) -> list[tuple[int, dict]]:
    """(round, curve) for each round with scored samples: the curve its evaluation recorded (rsft.eval: proxy,
    gold and judge with intervals), else one computed from the scored samples (proxy and gold)."""
    curves = []
    for r in range(rounds):
        curve = records.metrics(paths.eval(r)).get("best_of_n")
        if curve and curve.get("round") == r and "enough" in curve:
            curves.append((r, curve))
        elif is_complete(paths.scored(r)):
            scored = load_dataset_artifact(paths.scored(r))
            curves.append((r, best_of_n_curve(scored, gold_scores(scored))))
    return curves


CURVE_PANELS = (("proxy", "expected_max_reward", "E[max proxy reward of N]", "the proxy's best of N"),
                ("gold", "expected_gold", "E[gold of the proxy's pick]", "gold of the proxy's pick"),
                ("judge", "expected_judge", "E[judge score of the proxy's pick]", "judge score of the proxy's pick"))


def plot_best_of_n(paths: RunPaths, rounds: int, out: Path, records: Records | None = None) -> Path | None:
    """Per round, the best-of-N curve under the proxy, gold and the judge (95% intervals over prompts), and
    the point past which the truth stops rising (rsft.metrics.enough_samples) marked on each panel."""
    import matplotlib.pyplot as plt

    curves = best_of_n_curves(paths, rounds, records or Records())
    if not curves:
        return None
    panels = [panel for panel in CURVE_PANELS if any(c.get(panel[1]) is not None for _, c in curves)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (name, key, ylabel, title) in zip(axes[0], panels):
        for r, curve in curves:
            if curve.get(key) is None:
                continue
            line, = ax.plot(curve["n"], curve[key], marker="o", label=f"round {r} samples")
            band = (curve.get("intervals") or {}).get(name)
            if band:
                ax.fill_between(curve["n"], band["low"], band["high"], color=line.get_color(), alpha=0.15)
            enough = curve.get("enough")
            if enough:
                ax.axvline(enough["n"], color=line.get_color(), linestyle=":", alpha=0.8)
                n_interval = (curve.get("enough_interval") or {}).get(enough["truth"])
                if n_interval:  # the 95% interval on N itself (rsft.metrics.enough_samples_interval)
                    ax.axvspan(n_interval["low"], n_interval["high"], color=line.get_color(), alpha=0.06)
        ax.set(xlabel="N (samples per prompt)", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    kl = ", ".join(f"N={n}: {k:.2f}" for n, k in zip(curves[-1][1]["n"], curves[-1][1]["kl_bound"]))
    fig.suptitle(f"dotted: N enough by the {curves[-1][1].get('enough', {}).get('truth', 'truth')} "
                 f"(rsft.metrics.enough_samples); best-of-N KL bound log N - (N-1)/N: {kl}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def best_of_n_table(paths: RunPaths, rounds: int, records: Records) -> list[dict]:
    """One row per round: how many samples were enough by the truth curve, and what the proxy did past it."""
    rows = []
    for r, curve in best_of_n_curves(paths, rounds, records):
        enough = curve.get("enough")
        if not enough:
            continue
        gain = enough["proxy_gain_after"]
        # the interval on N itself and judge's N - gold's N, paired (rsft.metrics.enough_samples_interval);
        # an evaluation recorded before it was computed has none
        spread = curve.get("enough_interval") or {}
        n_interval, diff = spread.get(enough["truth"]), spread.get("difference")
        rows.append({"round": r, "K": enough["k"], "truth": enough["truth"], "N enough": enough["n"],
                     "N enough [95% CI]": f"{enough['n']} [{n_interval['low']}, {n_interval['high']}]"
                     if n_interval else "n/a",
                     "truth at N": f"{enough['value']:.3f}", "best N": enough["best_n"],
                     "truth at best N": f"{enough['best']:.3f}",
                     "proxy gain N -> K": f"{gain['mean']:+.3f} [{gain['low']:+.3f}, {gain['high']:+.3f}]",
                     "over-optimised past N": "yes" if enough["overoptimised"] else "no",
                     "N judge - N gold [95% CI]": f"{diff['n']:+d} [{diff['low']:+d}, {diff['high']:+d}]"
                     f"{'' if diff['agree'] else ' (disagree)'}" if diff else ""})
    if not any(row["N judge - N gold [95% CI]"] for row in rows):
        for row in rows:
            del row["N judge - N gold [95% CI]"]
    return rows


def begun_rounds(paths: RunPaths) -> int:
    """How many rounds the run has begun: those with an eval or a policy folder, complete or not."""
    rounds = 0
    while paths.eval(rounds).exists() or paths.policy(rounds).exists():
        rounds += 1
    return rounds


def evaluations(paths: RunPaths, rounds: int | None = None) -> list[tuple[str, Path]]:
    """(name, folder) of every complete evaluation: the initial policy, then each round's; rounds=None:
    every round the run has begun (an eval or a policy folder), for scripts that read finished runs."""
    if rounds is None:
        rounds = begun_rounds(paths)
    points = [("initial", paths.initial_eval)] + [(f"round {r}", paths.eval(r)) for r in range(rounds)]
    return [(name, path) for name, path in points if is_complete(path)]


def plot_gold_vs_proxy(paths: RunPaths, rounds: int, out: Path, records: Records) -> Path | None:
    """One panel per score the evaluations hold (gold, judge, proxy), the mean with its 95% interval per
    policy: where the proxy climbs and gold or the judge does not, the proxy is being over-optimised.
    Panels, not a shared legend: nothing covers the axes."""
    import matplotlib.pyplot as plt

    points = [(name, records.metrics(path)) for name, path in evaluations(paths, rounds)]
    if not points:
        return None
    columns = [c for c in SCORE_TITLES if all(f"{c}_mean" in m for _, m in points)]
    if not columns:
        return None  # no score every evaluation recorded
    fig, axes = plt.subplots(1, len(columns), figsize=(4.2 * len(columns), 3.8), squeeze=False)
    names = [name for name, _ in points]
    for ax, column in zip(axes[0], columns):
        means = [m[f"{column}_mean"] for _, m in points]
        lows = [m.get("intervals", {}).get(f"{column}_mean", [v, v])[0] for v, (_, m) in zip(means, points)]
        highs = [m.get("intervals", {}).get(f"{column}_mean", [v, v])[1] for v, (_, m) in zip(means, points)]
        ax.errorbar(range(len(names)), means, yerr=[[v - lo for v, lo in zip(means, lows)],
                                                    [hi - v for v, hi in zip(means, highs)]],
                    marker="o", capsize=4, color={"gold": "tab:green", "judge": "tab:purple"}.get(column, "tab:blue"))
        ax.set_xticks(range(len(names)), names)
        ax.set(title=SCORE_TITLES[column], ylabel=f"mean {column} score (95% CI)")
        ax.grid(alpha=0.3)
    fig.suptitle("held-out prompts, policy after round r", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_collapse(paths: RunPaths, rounds: int, out: Path, records: Records) -> Path | None:
    """Diversity per policy: distinct-2 within a prompt's samples and pooled over all prompts, and the
    share of completions that open with the most common words (collapse across prompts)."""
    import matplotlib.pyplot as plt

    points = [(name, records.metrics(path)) for name, path in evaluations(paths, rounds)]
    if not points or not any("top_opening_share" in m for _, m in points):
        return None
    names = [name for name, _ in points]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key, label in (("distinct_2", "distinct-2 within a prompt"), ("distinct_2_all", "distinct-2 across prompts"),
                       ("top_opening_share", "share opening with the top 5 words"),
                       ("alike_share", "share of prompts answered alike every time")):
        # evaluations made before a measure existed lack it, and one-word answers have no distinct-2: a gap
        if any(key in m for _, m in points):
            ax.plot(range(len(names)), [m.get(key, float("nan")) for _, m in points], marker="o", label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set(ylim=(0, 1.02), ylabel="fraction", title="diversity on held-out prompts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_pass_at_k(paths: RunPaths, rounds: int, out: Path, records: Records) -> Path | None:
    """pass@k per policy for each k, with 95% intervals, where a verifier scored the evaluations: pass@1
    rising while pass@8 stays is a policy narrowing onto answers it already had (collapse)."""
    from rsft.plotting import finish, interval_errorbar, pyplot

    points = [(name, records.metrics(path)) for name, path in evaluations(paths, rounds)]
    keys = [k for k in (points[0][1] if points else {}) if "pass_at_" in k and all(k in m for _, m in points)]
    if not keys:
        return None
    fig, ax = pyplot().subplots(figsize=(5.5, 3.8))
    names = [name for name, _ in points]
    for key in sorted(keys, key=lambda k: int(k.split("pass_at_")[1])):
        shown = [{"mean": m[key], "low": m["intervals"][key][0], "high": m["intervals"][key][1]} for _, m in points]
        interval_errorbar(ax, range(len(names)), shown, label=f"{key.split('pass_at_')[0]}pass@{key.split('pass_at_')[1]}")
    ax.set_xticks(range(len(names)), names)
    ax.set(ylim=(0, 1.02), ylabel="pass@k (95% CI over prompts)", title="pass@k on held-out prompts")
    return finish(fig, [ax], out)


def paired_vs(mine: Path, theirs: Path, column: str) -> dict | None:
    """The paired difference mine - theirs in one score column, with its interval (None when either lacks it)."""
    a, b = load_dataset_artifact(mine), load_dataset_artifact(theirs)
    if column not in a.column_names or column not in b.column_names:
        return None
    try:
        return stats.paired_difference(stats.keyed(a["prompt_id"], a["sample_idx"], a[column]),
                                       stats.keyed(b["prompt_id"], b["sample_idx"], b[column]))
    except ValueError:  # not the same completions (another eval.num_samples or eval_limit): no pairing
        return None


def _interval(m: dict, key: str) -> str:
    if key not in m:
        return ""
    low, high = m.get("intervals", {}).get(key, [None, None])
    return f"{m[key]:.3f}" + ("" if low is None else f" [{low:.3f}, {high:.3f}]")


def _diff(d: dict | None) -> str:
    return "" if d is None else f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def evaluation_table(paths: RunPaths, rounds: int, records: Records | None = None) -> list[dict]:
    """Per policy: every score's mean with its 95% interval, the paired differences to the previous
    policy and to the initial one, win rates, and diversity within and across prompts."""
    records = records or Records()
    points = evaluations(paths, rounds)
    rows = []
    for i, (name, path) in enumerate(points):
        m = records.metrics(path)
        columns = score_columns(load_dataset_artifact(path))
        row = {"policy": name}
        for column in columns:
            row[f"{column} [95% CI]"] = _interval(m, f"{column}_mean")
        for column in columns:
            if column == "reward" and len(columns) > 1:
                continue  # the proxy's own differences say little; gold / the judge decide
            row[f"{column} vs previous"] = _diff(paired_vs(path, points[i - 1][1], column)) if i else ""
            row[f"{column} win rate vs initial"] = _interval(m, "win_rate_vs_initial" if column == "reward"
                                                            else f"{column}_win_rate_vs_initial")
        for key in sorted((k for k in m if "pass_at_" in k), key=lambda k: (k.split("pass_at_")[0],
                                                                          int(k.split("pass_at_")[1]))):
            row[f"{key.split('pass_at_')[0]}pass@{key.split('pass_at_')[1]} [95% CI]"] = _interval(m, key)
        row.update({"distinct-2": m.get("distinct_2"), "distinct-2 (all)": m.get("distinct_2_all"),
                    "top opening share": m.get("top_opening_share"), "all alike [95% CI]": _interval(m, "alike_share"),
                    "distinct answers": m.get("distinct_answers"), "token entropy [95% CI]": _interval(m, "mean_entropy"),
                    "mean tokens": m.get("mean_tokens")})
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))  # a judge may score only later policies
    return [{c: row.get(c, "") for c in columns} for row in rows]


def plot_acceptance(paths: RunPaths, rounds: int, out: Path, records: Records) -> Path | None:
    import matplotlib.pyplot as plt

    series = []
    for r in range(rounds):
        rates = records.meta(paths.samples(r)).get("sampling", {}).get("acceptance_per_position") or []
        if any(x is not None for x in rates):
            series.append((r, rates))
    if not series:
        return None  # no draft (draft=none): nothing was drafted
    fig, ax = plt.subplots(figsize=(5, 4))
    for r, rates in series:
        ax.plot(range(1, len(rates) + 1), [float("nan") if x is None else x for x in rates], marker="o",
                label=f"round {r}")
    ax.set(xlabel="draft position", ylabel="acceptance rate (given reached)", ylim=(0, 1),
           title="speculative acceptance per draft position")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_plots(paths: RunPaths, rounds: int, records: Records | None = None) -> dict[str, Path]:
    records = records or Records()
    import matplotlib

    matplotlib.use("Agg")
    paths.plots.mkdir(parents=True, exist_ok=True)
    plots = {
        "best_of_n": plot_best_of_n(paths, rounds, paths.plots / "best_of_n.png", records),
        "gold_vs_proxy": plot_gold_vs_proxy(paths, rounds, paths.plots / "gold_vs_proxy.png", records),
        "diversity": plot_collapse(paths, rounds, paths.plots / "diversity.png", records),
        "pass_at_k": plot_pass_at_k(paths, rounds, paths.plots / "pass_at_k.png", records),
        "acceptance": plot_acceptance(paths, rounds, paths.plots / "acceptance.png", records),
        "online": plot_online(paths, paths.plots / "online.png"),
    }
    return {k: v for k, v in plots.items() if v is not None}


def _rounded(value) -> float | str:
    """A score for the examples table: 3 decimals, or "n/a" where the reward source could not score it."""
    return "n/a" if value is None else round(value, 3)


def example_rows(paths: RunPaths, round_idx: int, count: int) -> list[dict]:
    """The first sample of the first `count` held-out prompts: initial policy beside round r's."""
    if not (is_complete(paths.eval(round_idx)) and is_complete(paths.initial_eval)):
        return []
    final = load_dataset_artifact(paths.eval(round_idx)).filter(lambda r: r["sample_idx"] == 0)
    first = {r["prompt_id"]: r for r in load_dataset_artifact(paths.initial_eval).filter(lambda r: r["sample_idx"] == 0)}
    rows = []
    for row in final.select(range(min(count, len(final)))):
        before = first[row["prompt_id"]]
        gold = "gold" in row  # the demo task's oracle; a task without one (verifiable, HH) has no gold columns
        rows.append({
            "round": round_idx, "prompt": row["prompt"],
            "initial_completion": before["completion"], "initial_reward": _rounded(before["reward"]),
            **({"initial_gold": _rounded(before["gold"])} if gold else {}),
            "completion": row["completion"], "reward": _rounded(row["reward"]),
            **({"gold": _rounded(row["gold"])} if gold else {}),
        })
    return rows


def _cell(value, width: int = 160) -> str:
    if value is None:  # a measure this evaluation could not take (distinct-2 of one-word answers)
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    text = str(value).replace("|", "\\|").replace("\n", " / ")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def recorded_settings(paths: RunPaths, round_idx: int, records: Records | None = None) -> dict:
    """The settings round r's artifacts were made with (their fingerprints), never the current config;
    {} for no round (round_idx < 0)."""
    records = records or Records()
    settings = {}
    if round_idx < 0:
        return settings
    for artifact in (paths.samples(round_idx), paths.selected(round_idx), paths.policy(round_idx)):
        settings.update(records.meta(artifact).get("fingerprint", {}).get("config", {}))
    return settings


def _formatted(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def reward_table(paths: RunPaths, rounds: int, records: Records | None = None) -> list[dict]:
    """One row per reward model of the run (reward/, then each round's refreshed one): what it was
    trained on and how well it ranks held-out pairs, from each artifact's meta.json."""
    records = records or Records()
    models = [("reward/ (judges every eval)", paths.reward)]
    models += [(f"round_{r:02d}/reward (scored round {r})", paths.round_reward(r)) for r in range(rounds)]
    rows = []
    for name, path in models:
        metrics = records.meta(path).get("metrics")
        if metrics:
            rows.append({"reward model": name, "train pairs": metrics.get("train_pairs", ""),
                         "held-out pairs": metrics.get("heldout_pairs", ""),
                         "held-out accuracy": _formatted(metrics.get("heldout_accuracy"), ".3f"),
                         "train accuracy": _formatted(metrics.get("train_accuracy"), ".3f"),
                         "gold agreement": _formatted(metrics.get("gold_agreement"), ".3f"),
                         "train loss": _formatted(metrics.get("train_loss"), ".4f")})
    return rows


def machine_lines(paths: RunPaths, records: Records) -> list[str]:
    """Which machine made the run's artifacts (rsft.machine), with its library versions: one line per machine,
    and a warning line when there is more than one (the same command rounds differently per CPU)."""
    by_machine: dict = {}
    for meta_file in sorted(paths.root.glob("**/meta.json")):
        if any(part.startswith(".") for part in meta_file.relative_to(paths.root).parts):
            continue  # resume progress and temporary folders
        meta = records.meta(meta_file.parent)
        name = str(meta_file.parent.relative_to(paths.root))
        key = identity(meta.get("machine"))
        entry = by_machine.setdefault(key, {"machine": meta.get("machine"), "artifacts": [], "versions": {}})
        entry["artifacts"].append(name)
        entry["versions"] = meta.get("versions") or entry["versions"]
        for other in meta.get("progress_machines") or []:  # part of it was resumed from another machine's progress
            entry = by_machine.setdefault(identity(other), {"machine": other, "artifacts": [], "versions": {}})
            entry["artifacts"].append(f"{name} (in part: resumed progress)")
    lines = []
    for entry in by_machine.values():
        versions = ", ".join(f"{k} {v}" for k, v in entry["versions"].items() if k in
                             ("torch", "transformers", "trl", "datasets", "peft"))
        artifacts = entry["artifacts"]
        listed = ", ".join(artifacts[:4]) + (f" and {len(artifacts) - 4} more" if len(artifacts) > 4 else "")
        lines.append(f"- {describe(entry['machine'])}; {versions or 'versions not recorded'}: "
                     f"{len(artifacts)} artifact(s) ({listed})")
    if len(by_machine) > 1:
        lines.append("- **More than one machine made this run**: their numbers differ in rounding, so compare rounds "
                     "made on one machine, or rebuild on one with overwrite=true.")
    return lines


def online_section(paths: RunPaths) -> list[str]:
    """summary.md's Online section (rsft.online_report.online_summary); [] without a complete online/."""
    online = online_summary(paths)
    if online is None:
        return []
    text = ["## Online", "",
            "stage=online (online/): the policy learned while it sampled, a mini-batch of prompts at a time. "
            + online["minibatches"], ""]
    if online["snapshots"]:
        text += [("Eval snapshots on the held-out prompts (online/evals/batch_XXXX/): means over prompts with 95% "
                  "bootstrap intervals; `vs first` is the paired difference to the first snapshot (same prompts and "
                  "sample seeds). Wall seconds cover sampling, scoring and training, not evaluation; "
                  "plots/online.png draws the snapshots against tokens sampled."), "",
                 markdown_table(online["snapshots"]), ""]
    else:
        text += ["No eval snapshot (online.eval_every=0).", ""]
    if online["versus_rounds"]:
        text += [online["versus_rounds"], ""]
    return text


def round_header(rounds: int, held_out: list[dict], rows: list[dict], recorded: dict,
                 notes: list[str] | None) -> list[str]:
    """summary.md's opening for a run with rounds: what each round did (as recorded), the held-out table,
    the round metrics."""
    return [
        f"{rounds} round(s) of sample -> score -> select ({recorded.get('select.strategy')}, k={recorded.get('select.k')}, "
        f"pool_rounds={recorded.get('select.pool_rounds')}) -> sft ({recorded.get('sft.mode')} from the "
        f"{recorded.get('sft.init')} policy, lr={recorded.get('sft.learning_rate')}, {recorded.get('sft.epochs')} epochs); "
        f"policy `{recorded.get('policy.name_or_path')}`, K={recorded.get('sample.num_samples')}, {recorded.get('data.kind')} "
        "prompts (as recorded by the last round's artifacts). Round r samples from the policy round r-1 trained "
        "(round 0: the initial policy); the `round r` row evaluates the policy round r trained, on held-out prompts.",
        "",
        *[line for note in (notes or []) for line in (note, "")],
        "## Held-out evaluation",
        "",
        "Means over held-out prompts with 95% bootstrap intervals over prompts; `vs previous` is the paired "
        "difference to the row above (same prompts and sample seeds), `win rate vs initial` the paired "
        "P(this policy's completion beats the initial policy's).",
        "",
        markdown_table(held_out),
        "",
        "## Round metrics",
        "",
        markdown_table(rows),
        "",
    ]


def write_summary(paths: RunPaths, rounds: int, plots: dict[str, Path], examples: list[dict],
                  records: Records | None = None, notes: list[str] | None = None) -> Path:
    records = records or Records()
    table = []  # the held-out numbers have their own table; this one is what each round did
    for r in range(rounds):
        metrics = round_metrics(paths, r, records)
        table.append({"round": r, **{k: v for k, v in metrics.items() if not k.startswith("eval/")}})
    columns = list(dict.fromkeys(k for row in table for k in row))
    rows = [{c: row.get(c, "") for c in columns} for row in table]
    recorded = recorded_settings(paths, rounds - 1, records)
    held_out = evaluation_table(paths, rounds, records)
    text = [f"# rsft run `{paths.root.name}`", ""]
    if rounds:
        text += round_header(rounds, held_out, rows, recorded, notes)
    else:
        there = [what for what, path in (("stage=online's artifact (online/)", paths.online),
                                         ("the initial policy's evaluation (eval_initial/)", paths.initial_eval),
                                         ("a reward model (reward/)", paths.reward)) if is_complete(path)]
        text += [f"No round: this run directory holds {', '.join(there) or 'no complete artifact yet'}.", "",
                 *[line for note in (notes or []) for line in (note, "")]]
        if held_out:
            text += ["## Held-out evaluation", "", markdown_table(held_out), ""]
    text += online_section(paths)
    curve_rows = best_of_n_table(paths, rounds, records)
    if curve_rows:
        text += ["## Best-of-N: when more samples stop paying", "",
                 "From each round's own K samples per prompt: `N enough` is the smallest N whose truth (the judge, "
                 "else gold, else the proxy) lies within the 95% interval (over prompts) of the best N's; "
                 "`proxy gain N -> K` is what the proxy still rises past it. A proxy that rises while the truth "
                 "does not is over-optimised (rsft.metrics.enough_samples; plots/best_of_n.png marks N).", "",
                 markdown_table(curve_rows), ""]
    reward_rows = reward_table(paths, rounds, records)
    if reward_rows:
        text += ["## Reward models", "",
                 "The run's reward model judges every evaluation; with loop.refresh_reward a round's own model, "
                 "retrained on every label so far, scored that round's samples.", "",
                 markdown_table(reward_rows), ""]
    judged = [records.metrics(path) for _, path in evaluations(paths, rounds)]
    judge = next((m["judge"] for m in judged if m.get("judge")), None)
    if judge:
        warnings = sorted({w for m in judged for w in m.get("judge_warnings", [])})
        text += ["## Judge", "", f"`{judge}` (eval.judge): a reward model the proxy was not trained as; "
                 f"{'warnings: ' + '; '.join(warnings) if warnings else 'no overlap with the proxy found'}.", ""]
    text += ["## Machine", "", *machine_lines(paths, records), ""]
    if plots:
        text += ["## Plots", ""] + [f"![{name}](plots/{p.name})" for name, p in plots.items()] + [""]
    if examples:
        text += ["## Examples (held-out prompts, first sample)", "", markdown_table(examples), ""]
    paths.summary.write_text("\n".join(text))
    return paths.summary


def write_run_report(paths: RunPaths, examples: int) -> Path:
    """The plots and summary.md of a run directory as it stands, for a command that is not the loop
    (stage=online): every round it has begun (begun_rounds), the Online section when online/ is complete."""
    rounds = begun_rounds(paths)
    plots = write_plots(paths, rounds)
    return write_summary(paths, rounds, plots, example_rows(paths, rounds - 1, examples) if rounds else [])
