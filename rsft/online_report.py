"""Held-out score against tokens sampled: stage=online's eval snapshots beside the round loop's evaluations.

    points = round_points(paths) + online_points(paths)   # each {run, point, tokens, completions, wall, eval}
    plot_against_tokens([rounds, online], ["gold", "reward"], out)

A point is one evaluation of a policy on the held-out prompts, placed at the tokens (and completions, and wall
seconds) sampled before it. The loop's points: eval_initial/ at 0, then each evaluated round at the tokens its
rounds' samples/ sampled so far; its wall seconds are the rounds' artifacts' build seconds, evaluation not
counted. An online run's points: its snapshots (online/evals/batch_XXXX/, listed in online/metrics.json), at
the tokens and wall seconds its mini-batches had taken. Every evaluation uses the same held-out prompts,
eval.num_samples and eval.seed, so completion (prompt_id, sample_idx) pairs across them (rsft.stats).

`online_record` and `online_writer` make stage=online's artifact (meta.json's record, the folder's files) from the
run's progress; `online_summary` gives rsft.report the Online section of summary.md; seconds_by_phase and
scripts/online_vs_rounds.py compare several runs. Reads and writes artifacts only (rsft.store), never a stage
module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from datasets import Dataset, load_from_disk

from rsft import stats
from rsft.errors import InputError, MissingInput
from rsft.metrics import METRICS_FILE, SCORE_TITLES, flat_metrics, keyed, read_metrics
from rsft.paths import RunPaths
from rsft.plotting import finish, interval_errorbar, pyplot
from rsft.store import is_complete, load_dataset_artifact, read_meta

TRUTH_ORDER = tuple(SCORE_TITLES)  # gold, then the judge, then the proxy: the first a point holds is its truth
FINAL_EVAL = ("reward_mean", "gold_mean", "judge_mean")  # the last snapshot's means, among the run's stats


def online_record(progress, settings: dict, source: str, stopped: str | None, world_size: int) -> tuple[dict, dict]:
    """(stats, meta) of stage=online's artifact from its progress (rsft.online.Progress): what it sampled, kept and
    trained, the first and last mini-batch losses, the refreshes, the guard's crossings, and the last snapshot's
    means; meta adds every mini-batch's, refresh's and snapshot's record (metrics flattened) and the settings."""
    losses = [m["loss"] for m in progress.minibatches if m["loss"] is not None]
    completions, tokens, wall = progress.sampled()
    stats = {"minibatches": len(progress.minibatches), "completions_sampled": completions, "tokens_sampled": tokens,
             "wall_seconds": wall, "kept": len(progress.kept), "steps": sum(m["steps"] for m in progress.minibatches),
             "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
             "world_size": world_size, "reward_refreshes": len(progress.refreshes), "stopped": stopped,
             "guard": progress.guard}
    if progress.evals:
        stats.update({f"eval_{k}": v for k, v in progress.evals[-1]["metrics"].items() if k in FINAL_EVAL and v is not None})
    meta = {"stage": "online", "policy": source, "stats": stats, "minibatches": progress.minibatches,
            "refreshes": progress.refreshes,
            "evals": [{k: v for k, v in e.items() if k != "metrics"} | {"metrics": flat_metrics(e["metrics"])}
                      for e in progress.evals],
            "settings": settings}
    return stats, meta


def online_writer(progress, write_policy, reward: Path | None):
    """What writes stage=online's artifact (the runner calls it with the folder): policy/ (write_policy), kept/ (every
    kept row), evals/batch_XXXX/ (each snapshot's scored rows), metrics.json (every mini-batch's, snapshot's and
    refresh's record) and, after refreshes, reward/ (a copy of the newest refreshed model, `reward`)."""
    def write(tmp: Path):
        write_policy(tmp / "policy")
        kept = Dataset.from_list(progress.kept) if progress.kept else Dataset.from_dict({"prompt_id": []})
        kept.save_to_disk(str(tmp / "kept"), num_shards=1)
        for batch, rows in sorted(progress.eval_rows.items()):
            Dataset.from_list(rows).save_to_disk(str(tmp / "evals" / f"batch_{batch:04d}"), num_shards=1)
        (tmp / METRICS_FILE).write_text(json.dumps({"minibatches": progress.minibatches, "evals": progress.evals,
                                                    "refreshes": progress.refreshes}, indent=2, default=str))
        if reward is not None:  # the last refreshed reward model, beside the policy it scored for
            shutil.copytree(reward, tmp / "reward")

    return write


def measured(evaluation) -> dict:
    """An evaluation's metrics.json (its means and range measures), {} for one written without it."""
    return read_metrics(evaluation) if (evaluation / METRICS_FILE).exists() else {}


def round_points(paths: RunPaths) -> list[dict]:
    """The loop's points: the initial policy at 0 tokens, then each evaluated round at the tokens sampled so far."""
    if not is_complete(paths.initial_eval):
        raise MissingInput(f"{paths.root} has no complete eval_initial/: the first run directory is a round loop's "
                           f"(python -m rsft.run stage=loop with loop.eval=true)")
    points = [{"run": str(paths.root), "point": "initial", "tokens": 0, "completions": 0, "wall": 0.0,
               "eval": load_dataset_artifact(paths.initial_eval), "metrics": measured(paths.initial_eval)}]
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
                           "eval": load_dataset_artifact(paths.eval(round_idx)),
                           "metrics": measured(paths.eval(round_idx))})
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
    return [{"run": str(paths.online), "point": f"after {e['batch']} mini-batches", "batch": e["batch"],
             "tokens": e["tokens_sampled"], "completions": e["completions_sampled"], "wall": float(e["wall_seconds"]),
             "eval": load_from_disk(str(paths.online / "evals" / f"batch_{e['batch']:04d}")),  # inside the artifact
             "metrics": e.get("metrics", {})}
            for e in evals]


def last_point(paths: RunPaths, kind: str = "auto") -> tuple[dict, bool]:
    """A run's last evaluated point and whether it is an online run's. kind: "online" (the last snapshot of its
    online/), "rounds" (the loop's last evaluated round), or "auto": whichever of the two the run has, and an
    error naming both where it has both (a run directory may hold a loop and an online run)."""
    if kind == "auto":
        online, rounds = is_complete(paths.online), is_complete(paths.initial_eval)
        if online and rounds:
            raise InputError(f"{paths.root} holds both a round loop's evaluations and an online run's: say which to "
                             f"compare (rounds or online)")
        kind = "online" if online else "rounds"
    return (online_points(paths) if kind == "online" else round_points(paths))[-1], kind == "online"


LOOP_PHASES = {"sample": "sampling", "labels": "refresh", "refresh": "refresh", "score": "scoring", "select": "scoring",
               "sft": "training", "dpo": "training", "draft": "draft", "eval": "evaluation"}  # prefs, reward: shared


def seconds_by_phase(paths: RunPaths, online: bool) -> dict[str, float]:
    """Where a method's time went, by phase, from what its artifacts recorded (writes not counted on either side).
    online=False: the loop's artifacts' build seconds by stage (LOOP_PHASES; each stage's own model load inside it),
    leaving out the initial prefs/ and reward/ that an online run copies, and online/; online=True: online/'s
    mini-batch phases (sampling, refresh, scoring with selection, training), its snapshots (evaluation) and the
    rest of its build (model load and set-up; left out after a resume, where the build's seconds are the last
    command's and the mini-batches' are every command's)."""
    seconds: dict[str, float] = {}
    if online:
        metrics = json.loads((paths.online / "metrics.json").read_text())
        for batch in metrics["minibatches"]:
            for phase, value in batch.get("phase_seconds", {}).items():
                seconds[phase] = seconds.get(phase, 0.0) + value
        seconds["evaluation"] = sum(e.get("seconds", 0.0) for e in metrics["evals"])
        rest = float(read_meta(paths.online)["build_seconds"]) - sum(seconds.values())
        if rest >= 0:
            seconds["load and set-up"] = rest
    else:
        for meta in sorted(paths.root.glob("**/meta.json")):
            record = json.loads(meta.read_text())
            phase = LOOP_PHASES.get(record.get("stage"))
            if phase is not None and not meta.is_relative_to(paths.online):
                seconds[phase] = seconds.get(phase, 0.0) + float(record.get("build_seconds") or 0.0)
    return {phase: round(value, 1) for phase, value in seconds.items()}


def common_columns(points: list[dict]) -> list[str]:
    """The score columns every point's evaluation holds, the truth first (gold, judge, reward)."""
    return [c for c in TRUTH_ORDER if all(c in p["eval"].column_names for p in points)]


def pick_column(points: list[dict], wanted: str | None) -> str:
    """`wanted`, or the truth every point holds: gold, else the judge, else the proxy reward."""
    for column in [wanted] if wanted else common_columns(points)[:1]:
        if all(column in p["eval"].column_names for p in points):
            return column
    raise InputError(f"{'--column ' + wanted + ': not a' if wanted else 'no gold, judge or reward'} column of every "
                     f"evaluation (gold needs the demo task's oracle, judge eval.judge)")


def scored_by_prompt(point: dict, column: str) -> dict[str, list[float]]:
    """The point's `column` scores grouped by prompt, unscored rows left out."""
    ds: Dataset = point["eval"]
    kept = [(p, v) for p, v in zip(ds["prompt_id"], ds[column]) if v is not None]
    return stats.by_prompt([p for p, _ in kept], [v for _, v in kept])


def mean(point: dict, column: str) -> dict:
    """The point's mean `column` score with its 95% bootstrap interval over prompts (unscored rows left out)."""
    means = point.setdefault("means", {})
    if column not in means:
        means[column] = stats.bootstrap(scored_by_prompt(point, column))
    return means[column]


def paired(mine: dict, theirs: dict, column: str) -> dict | None:
    """mine - theirs in `column` over the completions both scored, with its interval; None when they evaluated
    other completions (another data.eval_limit, eval.num_samples or eval.seed) or share no scored one."""
    if set(zip(mine["eval"]["prompt_id"], mine["eval"]["sample_idx"])) != set(
            zip(theirs["eval"]["prompt_id"], theirs["eval"]["sample_idx"])):
        return None
    a, b = keyed(mine["eval"], column), keyed(theirs["eval"], column)
    return stats.paired_difference(a, b) if stats.scored_in_both(a, b) else None


def series_name(points: list[dict]) -> str:
    """runs/<name> for the rounds, runs/<name>/online for an online run: '<name> (rounds)', '<name> (online)'."""
    run = Path(points[-1]["run"])
    return f"{run.parent.name} (online)" if run.name == "online" else f"{run.name} (rounds)"


def plot_against_tokens(series: list[list[dict]], columns: list[str], out: Path) -> Path:
    """One panel per score column: each series' means with their 95% intervals against tokens sampled."""
    fig, axes = pyplot().subplots(1, len(columns), figsize=(5.5 * len(columns), 4), squeeze=False)
    for ax, column in zip(axes[0], columns):
        for points in series:
            interval_errorbar(ax, [p["tokens"] for p in points], [mean(p, column) for p in points],
                              label=series_name(points))
        ax.set(xlabel="tokens sampled", ylabel=f"held-out {column} (95% interval over prompts)",
               title=SCORE_TITLES[column])
    return finish(fig, axes[0], out, dpi=120)


def rounds_if_evaluated(paths: RunPaths) -> list[dict]:
    """The run's own round points, [] when it has no evaluated round (an online-only run directory)."""
    try:
        return round_points(paths)
    except MissingInput:
        return []


def plot_online(paths: RunPaths, out: Path) -> Path | None:
    """plots/online.png: the online snapshots and the run's own rounds (if evaluated) against tokens sampled,
    one panel per score column every point holds. None without snapshots."""
    if not is_complete(paths.online):
        return None
    try:
        online = online_points(paths)
    except InputError:  # online.eval_every=0: nothing to draw
        return None
    series = [s for s in (rounds_if_evaluated(paths), online) if s]
    columns = common_columns([p for points in series for p in points])
    if not columns:
        return None
    return plot_against_tokens(series, columns, out)


def minibatch_line(minibatches: list[dict]) -> str:
    """The per-mini-batch metrics in one line: how many, sampled, kept, and the loss first -> last."""
    if not minibatches:
        return "No mini-batch metrics recorded."
    losses = [m["loss"] for m in minibatches if m.get("loss") is not None]
    loss = f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "none (nothing kept)"
    last = minibatches[-1]
    return (f"{len(minibatches)} mini-batch(es): {last.get('completions_sampled')} completions "
            f"({last.get('tokens_sampled')} tokens) sampled, {sum(m.get('kept', 0) for m in minibatches)} kept "
            f"({', '.join(str(m.get('kept', 0)) for m in minibatches[:12])}{', ...' if len(minibatches) > 12 else ''} "
            f"per mini-batch), training loss {loss} (online/metrics.json).")


def online_summary(paths: RunPaths) -> dict | None:
    """The Online section's parts (None without a complete online/): `minibatches` (a line), `snapshots`
    (table rows: tokens and completions sampled, wall seconds, each score's mean with its 95% interval, the
    paired difference to the first snapshot) and `versus_rounds` (a line comparing the last snapshot with the
    rounds' last evaluation in the truth column; None without an evaluated round or a snapshot)."""
    if not is_complete(paths.online):
        return None
    recorded = json.loads((paths.online / "metrics.json").read_text())
    out = {"minibatches": minibatch_line(recorded.get("minibatches", [])), "snapshots": [], "versus_rounds": None}
    if not recorded.get("evals"):
        return out
    online = online_points(paths)
    columns = common_columns(online)
    first = online[0]
    for p in online:
        row = {"after b mini-batches": p["batch"], "completions sampled": p["completions"],
               "tokens sampled": p["tokens"], "wall s": f"{p['wall']:.0f}"}
        for column in columns:
            row[f"{column} [95% CI]"] = stats.shown(mean(p, column))
        for column in columns:
            diff = paired(p, first, column) if p is not first else None
            row[f"{column} vs first"] = "" if diff is None else stats.shown(diff, True)
        out["snapshots"].append(row)
    rounds = rounds_if_evaluated(paths)
    if rounds:
        last, theirs = online[-1], rounds[-1]
        truth = common_columns([last, theirs])
        diff = paired(last, theirs, truth[0]) if truth else None
        compared = (f"paired difference in {truth[0]} (online - rounds) {stats.shown(diff, True)}" if diff else
                    "no paired score to compare (another eval.num_samples, data.eval_limit or score column)")
        out["versus_rounds"] = (
            f"Against the rounds' last evaluation ({theirs['point']}: {theirs['tokens']} tokens, "
            f"{theirs['wall']:.0f} s), the last snapshot ({last['point']}) took "
            f"{last['tokens'] / max(theirs['tokens'], 1):.2f} of the tokens and "
            f"{last['wall'] / max(theirs['wall'], 1e-9):.2f} of the wall time; {compared}.")
    return out
