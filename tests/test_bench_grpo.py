"""scripts/bench_grpo.py on the tiny policy (issue 37): TRL's GRPOTrainer trains at a budget of sampled completions,
each evaluation point is a run directory rsft's stage=eval wrote, and `compare` pairs the points with an rsft
loop run's evaluations, completion for completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

TINY = ["policy=tiny", "sample.max_new_tokens=8", "data.eval_limit=4", "eval.num_samples=2"]


def stdout_of(command: list[str], env: dict) -> str:
    """The command's stdout; when it fails, the assertion shows the end of its stderr (captured, so not shown else)."""
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"{command[1:3]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def test_grpo_trains_at_the_budget_is_evaluated_by_rsft_and_compares_with_a_loop_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = [sys.executable, str(REPO / "scripts" / "bench_grpo.py")]
    # 2 prompts an update, LoRA (the recipe's sft.mode), at the recipe's temperature
    subprocess.run([*script, "train", "--out", str(tmp_path / "grpo"), "--completions", "32", "--points", "2",
                    "--prompts-per-step", "2", "--threads", "1", "--device", "cpu", "--override", *TINY],
                   check=True, cwd=REPO, env=env, timeout=600)
    run = tmp_path / "grpo" / "grpo-s0-lr1e-06-lora-p2-t0.7"
    record = json.loads((run / "grpo.json").read_text())
    assert record["steps"] == 2 and record["completions_per_step"] == 16 and record["points"] == [1, 2]
    assert record["settings"]["gradient_accumulation_steps"] == "2" and record["settings"]["temperature"] == "0.7"
    assert record["tokens"] > 0 and record["settings"]["gradient_checkpointing"] == "False"
    assert all((run / f"point_{s:04d}" / "eval_initial" / "meta.json").is_file() for s in (1, 2))
    subprocess.run([sys.executable, "-m", "rsft.run", "stage=loop", "+experiment=verifiable", "logger=none", *TINY,
                    "data.limit=2", "loop.rounds=1", "select.min_reward=null", "run_name=v", "threads=1",
                    f"paths.runs_root={tmp_path}"], check=True, cwd=REPO, env=env, timeout=600)
    out = stdout_of([*script, "compare", str(tmp_path / "v"), str(run), "--override", *TINY], env)
    rows = [line for line in out.splitlines()
            if line.startswith("| grpo-s0-lr1e-06-lora-p2-t0.7 | step") and line.count("|") == 8]
    assert [r.split(" | ")[2] for r in rows] == ["16", "32"]  # completions sampled at each point
    assert "| v | round 0 |" in out and "token entropy" in out
    # several seeds, paired seed for seed (here one pair, twice over): pass@k pooled, the verdict at the stated margin
    out = stdout_of([*script, "seeds", "--a", str(tmp_path / "v"), str(tmp_path / "v"), "--b", str(run), str(run),
                     "--margin", "0.05", "--ks", "1", "2"], env)
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 16 |")]
    assert [r[1] for r in rows] == ["1", "2"]  # the one budget both sides reached (16 completions), k = 1 and 2
    assert all(r[-1].split(" (m = 0.05)")[0] in ("better", "not worse", "worse", "undecided") for r in rows)
    assert all(len(r[5].split(", ")) == 2 for r in rows)  # each seed pair's own difference
    assert "training (TRL: sampling and updates)" in out and "sample" in out
    assert "A's entropy minus B's" in out  # issue 48's entropy row, at the nearest pass@1


def test_the_demo_task_gives_grpo_the_gold_oracle_and_a_cut_completion_its_finish_reason(monkeypatch):
    from reward.gold import gold_score
    from rsft.demo_prompts import build_demo_prompts
    from tests.test_scripts import load

    bench = load("bench_grpo", monkeypatch)
    task = build_demo_prompts("train")[0]["task"]
    text = "Bees make honey."
    reward = bench.gold_reward_for({2})
    got = reward(["p", "p"], [[{"role": "assistant", "content": text}], text], [[5, 6, 2], [5, 6, 7]], [task, task])
    assert got == [gold_score(task, text, "stop"), gold_score(task, text, "length")]
    assert got[0] > got[1]  # a cut completion loses the finished criterion
    assert bench.answer(" Bees  make\nHONEY.", "demo-gold") == bench.answer("bees make honey.", "demo-gold")
    assert bench.answer("It is 12, or 13", "verifiable") == "12"


def test_a_sweep_keeps_each_sides_rate_with_the_highest_pass_at_1_at_the_full_budget_and_a_tie_the_lower_rate(
        monkeypatch, tmp_path):
    """Issue 47's rule for choosing the learning rate on a validation split, and its table."""
    import argparse

    import pytest

    from rsft.errors import InputError
    from tests.test_scripts import load

    bench = load("bench_grpo", monkeypatch)
    gen_docs = load("gen_docs", monkeypatch)
    right = {"a1": [1, 0, 0, 0], "a2": [1, 1, 0, 0], "a3": [1, 1, 0, 0], "b1": [0, 0, 0, 0], "b2": [1, 1, 1, 0],
             "b3": [1, 1, 1, 1]}  # each trial's right answers: 2 prompts x 2 samples
    rates = {"a1": 1e-4, "a2": 2e-4, "a3": 6e-4, "b1": 1e-4, "b2": 3e-4, "b3": 1e-3}

    def points(run):
        values = right[run.name]
        return [{"completions": 16, "eval": {"prompt_id": ["p", "p", "q", "q"], "reward": values}}]

    monkeypatch.setattr(bench, "points_of", points)
    monkeypatch.setattr(bench, "learning_rate_of", lambda run: rates[run.name])
    args = argparse.Namespace(a=[tmp_path / n for n in ("a3", "a1", "a2")], b=[tmp_path / n for n in ("b1", "b2", "b3")],
                              names=["recipe", "GRPO"], ks=[1, 2], task="verifiable", record=None)
    record = bench.sweep(args)
    assert record["sides"]["recipe"]["chosen"] == 2e-4  # a2 and a3 tie at 0.5: the lower rate
    assert record["sides"]["GRPO"]["chosen"] == 1e-3
    assert [t["learning_rate"] for t in record["sides"]["recipe"]["trials"]] == [1e-4, 2e-4, 6e-4]
    table = gen_docs.sweep_table(record)
    assert table[2] == "| recipe | 0.0001 | 16 | 0.250 [0.000, 0.500] | 0.500 [0.000, 1.000] |  |"
    assert table[3].endswith("| **kept** |") and table[-1].startswith("| GRPO | 0.001 |") and "**kept**" in table[-1]
    assert gen_docs.headline(record, {}) == ("recipe keeps 0.0002 of 3 (validation pass@1 0.500 [0.000, 1.000]); GRPO "
                                             "keeps 0.001 of 3 (validation pass@1 1.000 [1.000, 1.000])")
    rates["a3"] = 2e-4
    with pytest.raises(InputError, match="share a learning rate"):
        bench.sweep(args)


def test_the_entropy_row_pairs_a_last_point_with_the_other_sides_point_of_the_nearest_pass_at_1(monkeypatch):
    """Issue 48's "token entropy at equal pass@1": per seed, A's last point against B's point whose pass@1 is
    nearest; a point without a measured entropy is passed over, and the table renders from the record."""
    from tests.test_scripts import load

    bench = load("bench_grpo", monkeypatch)
    gen_docs = load("gen_docs", monkeypatch)

    def point(completions, pass_at_1, entropy):
        return {"completions": completions, "pass_at_1": pass_at_1, "mean_entropy": entropy, "alike_share": 0.5,
                "distinct_answers": 2.0}

    ranges = {"a": [[point(512, 0.4, 0.5), point(1536, 0.8, 0.2)], [point(1536, 0.3, 0.4)]],
              "b": [[point(512, 0.3, 0.6), point(1024, 0.7, 0.3), point(1536, 0.9, None)],
                    [point(512, 0.2, 0.9), point(1536, 0.5, 0.1)]]}
    equal = bench.at_equal_pass_at_1(ranges)
    assert [(e["seed"], e["a"]["completions"], e["b"]["completions"]) for e in equal] == [(0, 1536, 1024),
                                                                                        (1, 1536, 512)]
    record = {"a": ["x", "y"], "margin": 0.03, "rows": [], "seconds_by_phase": {}, "at_equal_pass_at_1": equal}
    table = gen_docs.seeds_table(record)
    assert "| 0 | 1,536, 0.800 | 0.200 | 1,024, 0.700 | 0.300 | -0.100 | 0.50 / 0.50 |" in table
