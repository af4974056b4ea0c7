"""Scale-out benchmark: one stage at 1 process x 1 thread, 1 x 2 threads and 2 processes x 1 thread.

    python scripts/bench_scaling.py                       # sample, reward, sft on the default model
    python scripts/bench_scaling.py --stages sample --repeats 2

Each stage runs as a user would run it (`python -m rsft.run stage=...` or `torchrun --nproc-per-node 2
-m rsft.run stage=...`, gloo on CPU), in its own run under a scratch runs root, on the same inputs:
a base run (1 process x 2 threads) builds what the stage reads (prefs for reward; samples, scores and
the selection for sft) and each measured run gets a copy. Reported per setup: stage=sample tokens/s
(the samples' meta.json: tokens over the slowest process's seconds) and whether its rows equal the
1 x 1 run's; stage=reward and stage=sft training steps/s and final loss (their meta.json), with the
global batch the same at every world size. Scaling efficiency is 2 x 1 against 1 x 1. The reward
model trains `--reward-epochs` epochs (default 1, to keep the benchmark short).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from datasets import load_from_disk

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rsft.errors import ConfigError, main_guard
from rsft.paths import RunPaths
from rsft.store import copy_artifact, read_meta

SETUPS = {"1x1": (1, 1), "1x2": (1, 2), "2x1": (2, 1)}  # name -> (processes, threads per process)


def run(stage: str, run_name: str, runs_root: Path, processes: int, threads: int, extra: list[str]) -> None:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
                if processes > 1 else [sys.executable])
    command = [*launcher, "-m", "rsft.run", f"stage={stage}", f"run_name={run_name}", f"paths.runs_root={runs_root}",
               f"threads={threads}", "logger=none", "device=cpu", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(command)}` failed:\n{done.stderr[-3000:]}")


def prepare(stage: str, base: RunPaths, runs_root: Path, extra: list[str]) -> list[str]:
    """Build (once) what `stage` reads in the base run; return the artifact names to copy."""
    needs = {"sample": [], "reward": ["prefs"], "sft": ["prefs", "reward", "samples", "scored", "selected"]}[stage]
    steps = {"prefs": "prefs", "reward": "reward", "samples": "sample", "scored": "score", "selected": "select"}
    for name in needs:
        artifact = getattr(base, name) if name in ("prefs", "reward") else getattr(base, name)(0)
        if not (artifact / "meta.json").exists():
            run(steps[name], base.root.name, runs_root, 1, 2, extra)
    return needs


def copy_inputs(needs: list[str], base: RunPaths, target: RunPaths) -> None:
    for name in needs:
        if name in ("prefs", "reward"):
            copy_artifact(getattr(base, name), getattr(target, name))
        else:
            copy_artifact(getattr(base, name)(0), getattr(target, name)(0))
            if name == "selected":
                copy_artifact(base.pairs(0), target.pairs(0))


def measure(stage: str, paths: RunPaths) -> dict:
    if stage == "sample":
        sampling = read_meta(paths.samples(0))["sampling"]
        return {"tokens_per_second": round(sampling["tokens"] / max(sampling["seconds"], 1e-9), 1),
                "seconds": sampling["seconds"], "tokens": sampling["tokens"]}
    if stage == "reward":
        meta = read_meta(paths.reward)
        metrics, config = meta["metrics"], meta["fingerprint"]["config"]
        steps = math.ceil(metrics["train_pairs"] / config["reward.batch_size"]) * config["reward.epochs"]
        return {"steps": steps, "seconds": metrics["train_seconds"],
                "steps_per_second": round(steps / metrics["train_seconds"], 3), "final_loss": metrics["train_loss"],
                "heldout_accuracy": metrics["heldout_accuracy"]}
    stats = read_meta(paths.policy(0))["stats"]
    return {"steps": stats["steps"], "seconds": round(stats["seconds"], 2),
            "steps_per_second": round(stats["steps"] / stats["seconds"], 3), "final_loss": stats["train_loss"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", default=["sample", "reward", "sft"], choices=["sample", "reward", "sft"])
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--repeats", type=int, default=1, help="round-robin repetitions; medians are reported")
    parser.add_argument("--reward-epochs", type=int, default=1)
    parser.add_argument("--runs-root", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    for option, value in (("--repeats", args.repeats), ("--reward-epochs", args.reward_epochs)):
        if value < 1:
            raise ConfigError(f"{option} {value}: expected at least 1")
    runs_root = args.runs_root or Path(tempfile.mkdtemp(prefix="rsft-bench-scaling-"))
    extra = [f"reward.epochs={args.reward_epochs}"]
    base = RunPaths(runs_root / "base", runs_root)
    results = []
    for stage in args.stages:
        needs = prepare(stage, base, runs_root, extra)
        for repeat in range(args.repeats):
            for setup in args.setups:
                processes, threads = SETUPS[setup]
                paths = RunPaths(runs_root / f"{stage}-{setup}-{repeat}", runs_root)
                copy_inputs(needs, base, paths)
                run(stage, paths.root.name, runs_root, processes, threads, extra)
                record = {"stage": stage, "setup": setup, "repeat": repeat, **measure(stage, paths)}
                if stage == "sample":
                    reference = RunPaths(runs_root / f"sample-1x1-{repeat}", runs_root).samples(0)
                    mine = load_from_disk(str(paths.samples(0)))
                    record["rows_equal_1x1"] = (mine["completion_ids"] == load_from_disk(str(reference))["completion_ids"]
                                                if (reference / "meta.json").exists() else None)
                results.append(record)
                print(json.dumps(record), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(results: list[dict]) -> None:
    """Median per (stage, setup); speed-up and efficiency of 2 x 1 against 1 x 1."""
    print("\n| stage | setup (processes x threads) | speed, median | vs 1 x 1 | final loss | rows equal to 1 x 1 |")
    print("|---|---|---|---|---|---|")
    for stage in dict.fromkeys(r["stage"] for r in results):
        key = "tokens_per_second" if stage == "sample" else "steps_per_second"
        unit = "tokens/s" if stage == "sample" else "steps/s"
        median = {s: statistics.median(r[key] for r in results if r["stage"] == stage and r["setup"] == s)
                  for s in dict.fromkeys(r["setup"] for r in results if r["stage"] == stage)}
        for setup, value in median.items():
            runs = [r for r in results if r["stage"] == stage and r["setup"] == setup]
            ratio = f"{value / median['1x1']:.2f}x" if "1x1" in median else "-"
            loss = "-" if stage == "sample" else f"{runs[0]['final_loss']:.4f}"
            equal = str(all(r.get("rows_equal_1x1") for r in runs)) if stage == "sample" else "-"
            print(f"| {stage} | {setup.replace('x', ' x ')} | {value:.2f} {unit} | {ratio} | {loss} | {equal} |")


if __name__ == "__main__":
    main_guard(main)()
