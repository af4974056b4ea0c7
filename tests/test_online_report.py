"""stage=online's results in the run's summary.md and plots (issue 34; rsft.online_report, rsft.report): after
stage=online the run directory has a summary.md whose Online section shows metrics.json's snapshots and a
plots/online.png; a run with rounds and online/ compares the last snapshot with the rounds' last evaluation;
a report that cannot be written leaves the artifact and the command alone."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

import rsft.report
import rsft.run
from rsft.errors import InputError
from rsft.online_report import online_summary, pick_column, round_points
from rsft.paths import RunPaths
from rsft.report import begun_rounds, write_plots, write_summary
from rsft.run import run_stage
from rsft.store import atomic_artifact, is_complete
from tests.conftest import write_artifact
from tests.test_online import ONLINE


def test_after_stage_online_the_summary_and_plot_show_its_snapshots(make_cfg):
    cfg = make_cfg(*ONLINE, "online.minibatches=2", "online.eval_every=1", "data.eval_limit=2", "eval.num_samples=2")
    out = run_stage(cfg).path
    paths = RunPaths(cfg.paths.run_dir)
    metrics = json.loads((out / "metrics.json").read_text())
    summary = paths.summary.read_text()
    assert "No round: this run directory holds stage=online's artifact (online/)" in summary
    assert "## Round metrics" not in summary and "## Online" in summary
    online = summary.split("## Online", 1)[1]
    for e in metrics["evals"]:  # one row per snapshot: after b mini-batches, completions and tokens sampled
        assert f"| {e['batch']} | {e['completions_sampled']} | {e['tokens_sampled']} |" in online
    last = metrics["evals"][-1]
    assert last["batch"] == 2 and last["tokens_sampled"] == metrics["minibatches"][-1]["tokens_sampled"]
    assert f"{last['metrics']['reward_mean']:.3f} [" in online  # the snapshot's own mean, recomputed alike
    kept = sum(m["kept"] for m in metrics["minibatches"])
    assert f"2 mini-batch(es): {metrics['minibatches'][-1]['completions_sampled']} completions" in online
    assert f"{kept} kept" in online
    assert (paths.plots / "online.png").stat().st_size > 0 and "![online](plots/online.png)" in summary


def test_a_failed_report_is_a_warning_and_keeps_the_artifact(make_cfg, monkeypatch, caplog):
    def broken(paths, examples):
        raise OSError("disk full")

    monkeypatch.setattr(rsft.report, "write_run_report", broken)
    cfg = make_cfg(*ONLINE, "online.minibatches=1")
    assert is_complete(run_stage(cfg).path)
    assert "summary.md and plots were not written (OSError: disk full)" in caplog.text


def _evaluation(gold, judge=None):
    return [{"prompt_id": f"p{p}", "sample_idx": s, "reward": 1.0 + p, "gold": gold + 0.01 * p,
             **({"judge": judge} if judge is not None else {})} for p in range(4) for s in range(2)]


def _loop_and_online(paths: RunPaths, judge: bool = False):
    """Two evaluated rounds (1000 tokens each) and an online/ with snapshots after 0 and 2 mini-batches."""
    # every artifact states its build seconds: one left to the clock would make a sum of them depend on speed
    write_artifact(paths.initial_eval, {"stage": "eval", "build_seconds": 0.0}, _evaluation(0.5))
    for r in range(2):
        write_artifact(paths.samples(r), {"stage": "sample", "build_seconds": 10.0,
                                  "sampling": {"tokens": 1000, "num_completions": 100}})
        write_artifact(paths.policy(r), {"stage": "sft", "build_seconds": 10.0})
        write_artifact(paths.eval(r), {"stage": "eval", "build_seconds": 0.0}, _evaluation(0.6 + 0.1 * r))
    snapshots = [{"batch": b, "tokens_sampled": 500 * b, "completions_sampled": 50 * b, "wall_seconds": 10.0 * b}
                 for b in (0, 2)]
    minibatches = [{"batch": b, "kept": 3, "loss": 1.0 - 0.25 * b, "completions_sampled": 25 * (b + 1),
                    "tokens_sampled": 250 * (b + 1)} for b in range(2)]
    with atomic_artifact(paths.online, {"stage": "online", "build_seconds": 0.0}) as tmp:
        (tmp / "metrics.json").write_text(json.dumps({"minibatches": minibatches, "evals": snapshots}))
        for b, gold in ((0, 0.5), (2, 0.75)):
            rows = _evaluation(gold, judge=0.25 * b if judge else None)
            Dataset.from_list(rows).save_to_disk(str(tmp / "evals" / f"batch_{b:04d}"))


def test_the_loops_summary_compares_the_last_snapshot_with_the_rounds_last_evaluation(tmp_path):
    paths = RunPaths(tmp_path / "run")
    _loop_and_online(paths)
    assert begun_rounds(paths) == 2
    plots = write_plots(paths, 2)
    assert plots["online"] == paths.plots / "online.png" and plots["online"].stat().st_size > 0
    summary = write_summary(paths, 2, plots, []).read_text()
    assert "2 round(s) of sample" in summary and "## Round metrics" in summary  # the rounds' part as before
    online = summary.split("## Online", 1)[1].split("\n## ", 1)[0]
    assert "2 mini-batch(es): 50 completions (500 tokens) sampled, 6 kept (3, 3 per mini-batch), " \
           "training loss 1.0000 -> 0.7500" in online
    row = next(line for line in online.splitlines() if line.startswith("| 2 | 100 | 1000 | 20 | 0.765 ["))
    assert "| 2.500 [" in row  # gold, then the proxy
    assert "+0.250 [+0.250, +0.250]" in online  # gold vs the first snapshot, paired
    assert ("Against the rounds' last evaluation (round 1: 2000 tokens, 40 s), the last snapshot (after 2 "
            "mini-batches) took 0.50 of the tokens and 0.50 of the wall time; paired difference in gold "
            "(online - rounds) +0.050 [+0.050, +0.050]") in online


def test_the_truth_is_gold_then_the_judge_then_the_proxy(tmp_path):
    paths = RunPaths(tmp_path / "run")
    _loop_and_online(paths, judge=True)
    snapshots = online_summary(paths)["snapshots"]
    assert [c for c in snapshots[0] if c.endswith("[95% CI]")] == ["gold [95% CI]", "judge [95% CI]",
                                                                  "reward [95% CI]"]
    points = round_points(paths)
    assert pick_column(points, None) == "gold"
    for p in points:
        p["eval"] = p["eval"].remove_columns("gold").add_column("judge", [0.0] * len(p["eval"]))
    assert pick_column(points, None) == "judge" and pick_column(points, "reward") == "reward"


def test_online_against_the_rounds_over_seeds_pools_the_pairs_and_times_each_side_by_phase(tmp_path, capsys):
    """scripts/compare_runs.py seeds on hand-written runs: the i-th rounds run pairs with the i-th online run,
    online - rounds is pooled over the seed pairs with the rule's verdict at the stated margin, and each run's
    seconds come by phase (the loop's by stage, the shared prefs/ and reward/ left out; online's from its metrics)."""
    import importlib.util

    from rsft.online_report import seconds_by_phase
    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("compare_runs", REPO / "scripts" / "compare_runs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rounds, online = [], []
    for seed in range(3):
        loop, other = RunPaths(tmp_path / f"r{seed}"), RunPaths(tmp_path / f"o{seed}")
        _loop_and_online(loop)
        write_artifact(loop.reward, {"stage": "reward", "build_seconds": 99.0})  # shared with online: not counted
        _loop_and_online(other)
        minibatches = [{"batch": 0, "phase_seconds": {"sampling": 3.0, "training": 2.0}},
                       {"batch": 1, "phase_seconds": {"sampling": 4.0, "training": 1.0}}]
        evals = [{"batch": b, "tokens_sampled": 500 * b, "completions_sampled": 50 * b, "wall_seconds": 1.0 * b,
                  "seconds": 1.5, "metrics": {"distinct_2_all": 0.5 - 0.1 * b, "gold_mean": 0.7}} for b in (0, 2)]
        (loop.eval(1) / "metrics.json").write_text(json.dumps({"distinct_2_all": 0.6, "alike_share": 0.25}))
        (other.online / "metrics.json").write_text(json.dumps({"minibatches": minibatches, "evals": evals}))
        meta = json.loads((other.online / "meta.json").read_text())
        (other.online / "meta.json").write_text(json.dumps({**meta, "build_seconds": 20.0}))
        rounds.append(str(loop.root))
        online.append(str(other.root))
    assert seconds_by_phase(RunPaths(tmp_path / "r0"), online=False) == {"sampling": 20.0, "training": 20.0,
                                                                        "evaluation": 0.0}
    assert seconds_by_phase(RunPaths(tmp_path / "o0"), online=True) == {"sampling": 7.0, "training": 3.0, "evaluation": 3.0,
                                                          "load and set-up": 7.0}
    with pytest.raises(InputError, match="holds both a round loop's evaluations and an online run's"):
        script.seeds(["--a", *online, "--b", *rounds, "--margin", "0.03"])  # these runs hold both
    record = script.seeds(["--a", *online, "--b", *rounds, "--names", "online", "rounds", "--kinds", "online",
                           "rounds", "--margin", "0.03"])
    difference = record["compared"]["a_minus_b"]
    # online's last snapshot scores gold 0.75 + 0.01 p, the rounds' last evaluation 0.7 + 0.01 p: +0.05 everywhere
    assert difference["mean"] == pytest.approx(0.05) and difference["low"] == pytest.approx(0.05)
    assert difference["seed_means"] == pytest.approx([0.05] * 3) and difference["verdict"] == "better"
    assert record["column"] == "gold" and record["tokens"] == {"b": [2000] * 3, "a": [1000] * 3}
    # the range measures of each run's last evaluation: online's from its snapshot, the loop's from metrics.json
    assert record["range"] == {"a": [{"distinct_2_all": pytest.approx(0.3)}] * 3,
                               "b": [{"distinct_2_all": 0.6, "alike_share": 0.25}] * 3}
    # each side's seconds by its own kind: online's from its metrics, the loop's from its artifacts
    assert record["seconds_by_phase"]["a"][online[0]]["load and set-up"] == 7.0
    assert "load and set-up" not in record["seconds_by_phase"]["b"][rounds[0]]
    assert "online - rounds: +0.050" in capsys.readouterr().out
    with pytest.raises(InputError, match="pair them seed for seed"):
        script.seeds(["--a", *online[:2], "--b", *rounds, "--margin", "0.03"])
