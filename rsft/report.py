"""The loop's report: per-round metrics read back from the artifacts, plots, summary.md.

Everything here is read from the run directory (each artifact's meta.json, the eval metrics),
never from memory, so a resumed loop reports the same numbers as one that ran straight through.
Plots (PNG under runs/<run_name>/plots/, also logged to wandb by the loop):
  best_of_n.png     expected best-of-N reward vs N for each round's samples (Llama 2, figure 7),
                    beside the expected gold score of the reward-best-of-N completion
  gold_vs_proxy.png gold and reward-model score of each policy on held-out prompts; where the
                    proxy climbs and gold does not, the reward model is being over-optimised
  acceptance.png    the draft's acceptance rate per draft position, per round (when a draft is used)
"""

from __future__ import annotations

import json
from pathlib import Path


from rsft.eval import best_of_n_curve, gold_scores, read_metrics
from rsft.paths import RunPaths, is_complete, load_dataset_artifact, read_meta


def _read_meta_if_complete(path: Path) -> dict:
    return read_meta(path) if is_complete(path) else {}


def eval_metrics(path: Path) -> dict:
    return read_metrics(path) if is_complete(path) else {}


def round_metrics(paths: RunPaths, round_idx: int) -> dict:
    """The round's headline numbers, flat, from its artifacts (missing artifacts give no keys)."""
    sampling = _read_meta_if_complete(paths.samples(round_idx)).get("sampling", {})
    scored = _read_meta_if_complete(paths.scored(round_idx)).get("stats", {})
    select = _read_meta_if_complete(paths.selected(round_idx))
    sft = _read_meta_if_complete(paths.policy(round_idx)).get("stats", {})
    evaluation = eval_metrics(paths.eval(round_idx))
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
    for key in ("reward_mean", "reward_normalised_mean", "gold_mean", "win_rate_vs_initial",
                "gold_win_rate_vs_initial", "distinct_1", "distinct_2", "mean_tokens", "mean_words", "eos_fraction"):
        out[f"eval/{key}"] = evaluation.get(key)
    return {k: v for k, v in out.items() if v is not None}


def plot_best_of_n(paths: RunPaths, rounds: int, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    curves = []
    for r in range(rounds):
        if is_complete(paths.scored(r)):
            scored = load_dataset_artifact(paths.scored(r))
            curves.append((r, best_of_n_curve(scored, gold_scores(scored))))
    if not curves:
        return None
    has_gold = any(c["expected_gold"] is not None for _, c in curves)
    fig, axes = plt.subplots(1, 2 if has_gold else 1, figsize=(10 if has_gold else 5, 4), squeeze=False)
    for r, curve in curves:
        axes[0][0].plot(curve["n"], curve["expected_max_reward"], marker="o", label=f"round {r} samples")
        if has_gold and curve["expected_gold"] is not None:
            axes[0][1].plot(curve["n"], curve["expected_gold"], marker="o", label=f"round {r} samples")
    axes[0][0].set(xlabel="N (samples per prompt)", ylabel="E[max reward of N] (reward model)",
                   title="expected best-of-N reward")
    if has_gold:
        axes[0][1].set(xlabel="N (samples per prompt)", ylabel="E[gold of the reward-best of N]",
                       title="gold score of the reward model's pick")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend()
    kl = ", ".join(f"N={n}: {k:.2f}" for n, k in zip(curves[-1][1]["n"], curves[-1][1]["kl_bound"]))
    fig.suptitle(f"best-of-N KL bound log N - (N-1)/N: {kl}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_gold_vs_proxy(paths: RunPaths, rounds: int, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    points = [("initial", eval_metrics(paths.initial_eval))] + [
        (f"round {r}", eval_metrics(paths.eval(r))) for r in range(rounds)]
    points = [(name, m) for name, m in points if m]
    if not points:
        return None
    names = [name for name, _ in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    proxy_ax = ax.twinx()
    if all("gold_mean" in m for _, m in points):
        ax.plot(names, [m["gold_mean"] for _, m in points], marker="o", color="tab:green", label="gold (oracle)")
    proxy_ax.plot(names, [m["reward_normalised_mean"] for _, m in points], marker="s", color="tab:blue",
                  label="reward model (normalised)")
    ax.set(xlabel="policy (after round r)", ylabel="mean gold score", title="held-out prompts: gold vs proxy")
    proxy_ax.set_ylabel("mean normalised reward")
    ax.grid(alpha=0.3)
    fig.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_acceptance(paths: RunPaths, rounds: int, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    series = []
    for r in range(rounds):
        rates = _read_meta_if_complete(paths.samples(r)).get("sampling", {}).get("acceptance_per_position") or []
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


def write_plots(paths: RunPaths, rounds: int) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    paths.plots.mkdir(parents=True, exist_ok=True)
    made = {
        "best_of_n": plot_best_of_n(paths, rounds, paths.plots / "best_of_n.png"),
        "gold_vs_proxy": plot_gold_vs_proxy(paths, rounds, paths.plots / "gold_vs_proxy.png"),
        "acceptance": plot_acceptance(paths, rounds, paths.plots / "acceptance.png"),
    }
    return {k: v for k, v in made.items() if v is not None}


def example_rows(paths: RunPaths, round_idx: int, count: int) -> list[dict]:
    """The first sample of the first `count` held-out prompts: initial policy beside round r's."""
    if not (is_complete(paths.eval(round_idx)) and is_complete(paths.initial_eval)):
        return []
    final = load_dataset_artifact(paths.eval(round_idx)).filter(lambda r: r["sample_idx"] == 0)
    first = {r["prompt_id"]: r for r in load_dataset_artifact(paths.initial_eval).filter(lambda r: r["sample_idx"] == 0)}
    rows = []
    for row in final.select(range(min(count, len(final)))):
        before = first[row["prompt_id"]]
        rows.append({
            "round": round_idx, "prompt": row["prompt"],
            "initial_completion": before["completion"], "initial_reward": round(before["reward"], 3),
            "initial_gold": round(before.get("gold", float("nan")), 3),
            "completion": row["completion"], "reward": round(row["reward"], 3),
            "gold": round(row.get("gold", float("nan")), 3),
        })
    return rows


def _cell(value, width: int = 160) -> str:
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


def recorded_settings(paths: RunPaths, round_idx: int) -> dict:
    """The settings round r's artifacts were made with (their fingerprints), never the current config."""
    settings = {}
    for artifact in (paths.samples(round_idx), paths.selected(round_idx), paths.policy(round_idx)):
        settings.update(_read_meta_if_complete(artifact).get("fingerprint", {}).get("config", {}))
    return settings


def write_summary(paths: RunPaths, rounds: int, plots: dict[str, Path], examples: list[dict]) -> Path:
    initial = eval_metrics(paths.initial_eval)
    table = []
    if initial:
        table.append({"policy": "initial", **{f"eval/{k}": v for k, v in initial.items() if isinstance(v, float)}})
    for r in range(rounds):
        table.append({"policy": f"round {r}", **round_metrics(paths, r)})
    columns = list(dict.fromkeys(k for row in table for k in row))
    rows = [{c: row.get(c, "") for c in columns} for row in table]
    reward_meta = _read_meta_if_complete(paths.reward)
    made = recorded_settings(paths, rounds - 1)
    text = [
        f"# rsft run `{paths.root.name}`",
        "",
        f"{rounds} round(s) of sample -> score -> select ({made.get('select.strategy')}, k={made.get('select.k')}, "
        f"pool_rounds={made.get('select.pool_rounds')}) -> sft ({made.get('sft.mode')} from the "
        f"{made.get('sft.init')} policy, lr={made.get('sft.learning_rate')}, {made.get('sft.epochs')} epochs); "
        f"policy `{made.get('policy.name_or_path')}`, K={made.get('sample.num_samples')}, {made.get('data.kind')} "
        "prompts (as recorded by the last round's artifacts). Round r samples from the policy round r-1 trained "
        "(round 0: the initial policy); the `round r` row evaluates the policy round r trained, on held-out prompts.",
        "",
        "## Round metrics",
        "",
        markdown_table(rows),
        "",
    ]
    if reward_meta:
        metrics = {k: v for k, v in reward_meta.items() if k in ("metrics", "eval", "heldout", "stats")}
        text += ["## Reward model", "", f"`{paths.reward}`: `{json.dumps(metrics, default=str)[:800]}`", ""]
    if plots:
        text += ["## Plots", ""] + [f"![{name}](plots/{p.name})" for name, p in plots.items()] + [""]
    if examples:
        text += ["## Examples (held-out prompts, first sample)", "", markdown_table(examples), ""]
    paths.summary.write_text("\n".join(text))
    return paths.summary
