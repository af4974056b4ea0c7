"""Knowing when more samples stop paying (issue 35): the best-of-N curve under the proxy, gold and the judge,
with intervals over prompts, and the over-optimisation point (rsft.metrics.enough_samples)."""

from __future__ import annotations

import math
import random

import pytest
from datasets import Dataset

from rsft.metrics import (
    best_of_n_curve,
    enough_samples,
    enough_samples_interval,
    expected_best_of_n,
)


def _scored(prompts: int, k: int, truth_of, seed: int = 0) -> tuple[Dataset, list[float]]:
    rng = random.Random(seed)
    rows, truth = [], []
    for p in range(prompts):
        for s in range(k):
            reward = rng.gauss(0.0, 1.0)
            rows.append({"prompt_id": f"p{p}", "sample_idx": s, "reward": reward})
            truth.append(truth_of(reward, rng))
    return Dataset.from_list(rows), truth


def test_a_truth_that_ignores_the_proxy_is_enough_at_one_sample_and_the_proxy_is_over_optimised():
    # the truth does not follow the proxy: the same for every answer, so every N has exactly the same truth (a
    # truth drawn at random per answer fails the gap check in about 3% of data seeds: a noisy curve's best N is
    # biased up)
    scored, truth = _scored(64, 8, lambda reward, rng: 0.5)
    curve = best_of_n_curve(scored, gold=truth)
    enough = curve["enough"]
    assert enough["truth"] == "gold" and enough["k"] == 8
    assert enough["n"] == 1 and enough["gap_to_best"]["low"] <= 0.0
    assert enough["proxy_gain_after"]["low"] > 0.5 and enough["overoptimised"]
    assert curve["expected_max_reward"] == sorted(curve["expected_max_reward"])
    low, high = curve["intervals"]["gold"]["low"], curve["intervals"]["gold"]["high"]
    assert all(lo <= m <= hi for lo, m, hi in zip(low, curve["expected_gold"], high))


def test_a_truth_that_is_the_proxy_keeps_paying_to_the_last_sample():
    scored, truth = _scored(64, 8, lambda reward, rng: reward)
    enough = best_of_n_curve(scored, gold=truth)["enough"]
    # N=7 lies within N=8's interval; the paired gap still shows the truth rising with the proxy
    assert enough["n"] >= 6 and enough["best_n"] == 8 and enough["gap_to_best"]["low"] > 0.0


def test_a_judge_stands_for_the_truth_before_gold_and_unscored_rows_rank_lowest():
    scored, truth = _scored(32, 4, lambda reward, rng: reward)
    judge = [None if i % 5 == 0 else -v for i, v in enumerate(truth)]  # the judge disagrees with gold
    curve = best_of_n_curve(scored, gold=truth, judge=judge)
    assert curve["enough"]["truth"] == "judge" and curve["expected_judge"] is not None
    assert curve["expected_judge"][0] > curve["expected_judge"][-1]  # the proxy's pick is worse by the judge
    assert curve["enough"]["n"] == 1 and curve["enough"]["overoptimised"]


def test_the_rule_on_a_hand_made_curve():
    # 3 prompts x N=1..4, truth rises to N=2 then barely: N=2 lies within the best (N=4) interval, N=1 below it
    truth = [[0.0, 1.0, 1.0, 1.0], [0.1, 1.1, 1.1, 1.2], [0.0, 0.9, 1.0, 1.0]]
    proxy = [[0.0, 1.0, 2.0, 3.0]] * 3
    enough = enough_samples({"proxy": proxy, "gold": truth})
    assert enough["best_n"] == 4 and enough["n"] == 2 and enough["overoptimised"]
    assert enough["proxy_gain_after"]["mean"] == pytest.approx(2.0)
    # with the proxy alone the rule still answers, and says which curve it read
    assert enough_samples({"proxy": proxy})["truth"] == "proxy"
    assert expected_best_of_n([3.0, 1.0, 2.0], [30.0, 10.0, 20.0], 3) == 30.0


def _truth(prompts: int, k: int, seed: int, noise: float = 0.3) -> list[list[float]]:
    """[prompts][K]: a truth that rises with N and flattens, with a per-prompt level and noise."""
    rng = random.Random(seed)
    return [[level + 0.1 * math.log(n) + rng.gauss(0.0, noise * 0.1) for n in range(1, k + 1)]
            for level in (rng.gauss(0.0, noise) for _ in range(prompts))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_interval_on_n_holds_enough_samples_point_on_the_full_prompts(seed):
    proxy = [[float(n) for n in range(1, 17)]] * 24
    per_prompt = {"proxy": proxy, "gold": _truth(24, 16, seed), "judge": _truth(24, 16, seed + 10)}
    spread = enough_samples_interval(per_prompt, draws=300)
    assert spread["truths"] == ["judge", "gold"]
    for truth in ("judge", "gold"):
        alone = enough_samples({"proxy": proxy, truth: per_prompt[truth]})
        assert alone["truth"] == truth and spread[truth]["n"] == alone["n"]
        assert 1 <= spread[truth]["low"] <= spread[truth]["high"] <= 16
    diff = spread["difference"]
    assert diff["n"] == spread["judge"]["n"] - spread["gold"]["n"] and diff["low"] <= diff["high"]
    assert diff["agree"] == (diff["low"] <= 0 <= diff["high"])
    # the same seed gives the same intervals; the default seed is what best_of_n_curve records
    assert enough_samples_interval(per_prompt, draws=300) == spread
    assert enough_samples_interval(per_prompt, draws=300, seed=7)["gold"]["n"] == spread["gold"]["n"]


def test_two_identical_truths_differ_by_exactly_zero_on_every_resample():
    truth = _truth(32, 12, 3)
    spread = enough_samples_interval({"proxy": truth, "gold": truth, "judge": [list(p) for p in truth]}, draws=500)
    assert spread["judge"] == spread["gold"]
    assert spread["difference"] == {"truths": ["judge", "gold"], "n": 0, "low": 0, "high": 0, "agree": True}
    assert spread["judge_in_gold"] and spread["gold_in_judge"]


def test_a_truth_that_plateaus_at_two_samples_gives_a_narrow_interval_at_two():
    rng = random.Random(5)
    # one sample is far worse; from two on a prompt's truth barely rises (0.001 per sample) beside the spread
    # between prompts (0.3): N* = 8 with an interval far wider than 0.006, N = 2 on every resample
    truth = [[0.0] + [level + 0.001 * n for n in range(7)] for level in (rng.gauss(1.0, 0.3) for _ in range(40))]
    spread = enough_samples_interval({"proxy": [[float(n) for n in range(8)]] * 40, "gold": truth}, draws=500)
    assert spread["truths"] == ["gold"] and "difference" not in spread
    assert spread["gold"] == {"n": 2, "low": 2, "high": 2}


def test_the_curve_records_the_interval_and_the_table_shows_it(monkeypatch):
    from rsft import report

    scored, truth = _scored(32, 8, lambda reward, rng: reward + rng.gauss(0.0, 1.0))
    curve = best_of_n_curve(scored, gold=truth)
    spread = curve["enough_interval"]
    assert spread["truths"] == ["gold"] and spread["gold"]["n"] == curve["enough"]["n"]
    monkeypatch.setattr(report, "best_of_n_curves", lambda paths, rounds, records: [(0, curve)])
    row, = report.best_of_n_table(None, 1, None)
    assert row["N enough"] == curve["enough"]["n"]
    assert row["N enough [95% CI]"] == f"{spread['gold']['n']} [{spread['gold']['low']}, {spread['gold']['high']}]"
    assert "N judge - N gold [95% CI]" not in row  # no judge: no paired difference column
    del curve["enough_interval"]  # an evaluation recorded before the interval existed
    row, = report.best_of_n_table(None, 1, None)
    assert row["N enough [95% CI]"] == "n/a" and row["N enough"] == curve["enough"]["n"]


# ---- sample.num_samples=auto (rsft.auto_k) and loop.stop (rsft.loop.stop_decision) on tiny loops ----

LOOP = ["stage=loop", "reward=tiny", "prefs.num_prompts=4", "prefs.num_samples=3", "prefs.max_new_tokens=8",
        "data.eval_limit=4", "eval.num_samples=2", "sft.learning_rate=1e-3", "select.drop_truncated=false",
        "device=cpu"]


def _eval_with_curve(paths, round_idx: int, n: int, k: int) -> None:
    from rsft.store import atomic_artifact

    enough = {"truth": "gold", "n": n, "k": k, "value": 0.5, "best_n": n, "best": 0.5, "overoptimised": n < k}
    with atomic_artifact(paths.eval(round_idx), {"stage": "eval", "round": round_idx,
                                                 "metrics": {"best_of_n": {"round": round_idx, "enough": enough}}}):
        pass


def test_auto_k_takes_the_previous_curves_point_within_floor_and_cap_and_doubles_a_curve_still_rising(make_cfg):
    from rsft.auto_k import choose
    from rsft.errors import MissingInput
    from rsft.paths import RunPaths

    cfg = make_cfg("stage=sample", "sample.num_samples=auto", "sample.auto_k.cap=8", "sample.auto_k.floor=3")
    paths = RunPaths.from_config(cfg)
    assert choose(cfg, paths, 0)["k"] == 8  # round 0: no curve, start = cap
    with pytest.raises(MissingInput, match=r"round 0's best-of-N curve.*stage=eval round=0"):
        choose(cfg, paths, 1)
    _eval_with_curve(paths, 0, n=2, k=8)
    assert choose(cfg, paths, 1)["k"] == 3  # N=2 is enough, the floor is 3
    _eval_with_curve(paths, 1, n=5, k=8)
    assert choose(cfg, paths, 2)["k"] == 5
    _eval_with_curve(paths, 2, n=3, k=3)  # still rising at its last N: twice K
    assert choose(cfg, paths, 3)["k"] == 6
    _eval_with_curve(paths, 3, n=6, k=6)
    assert choose(cfg, paths, 4)["k"] == 8  # within the cap


def test_auto_k_with_adaptive_k_sets_the_rounds_mean_and_a_round_at_the_cap_samples_it_plainly(make_cfg):
    from rsft.auto_k import resolved
    from rsft.paths import RunPaths

    cfg = make_cfg("stage=sample", "round=1", "sample.num_samples=auto", "sample.auto_k.cap=8",
                   "sample.auto_k.floor=3", "sample.adaptive_k.k0=2")
    paths = RunPaths.from_config(cfg)
    _eval_with_curve(paths, 0, n=5, k=8)
    round_cfg, choice = resolved(cfg)
    assert round_cfg.sample.num_samples == 8 and round_cfg.sample.adaptive_k.mean == 5.0
    assert round_cfg.sample.adaptive_k.k0 == 2 and choice["adaptive_k"] == {"k0": 2, "mean": 5.0}
    _eval_with_curve(paths, 1, n=8, k=8)  # still rising at the cap: the cap, every prompt, adaptive K off
    round_cfg, choice = resolved(make_cfg("stage=sample", "round=2", "sample.num_samples=auto", "sample.auto_k.cap=8",
                                          "sample.auto_k.floor=3", "sample.adaptive_k.k0=2"))
    assert round_cfg.sample.num_samples == 8 and round_cfg.sample.adaptive_k.k0 == 0 and "adaptive_k" not in choice
    plain, _ = resolved(make_cfg("stage=sample", "round=1", "sample.num_samples=auto", "sample.auto_k.cap=8",
                                 "sample.auto_k.floor=3"))
    assert plain.sample.num_samples == 5 and plain.sample.adaptive_k.k0 == 0


def test_a_loop_with_auto_k_samples_each_round_the_k_its_last_curve_chose(make_cfg):
    from datasets import load_from_disk

    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "loop.rounds=2", "sample.num_samples=auto", "sample.auto_k.cap=4", "sample.auto_k.floor=2")
    run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    for r, expected in ((0, 4), (1, None)):
        meta = read_meta(paths.samples(r))
        chosen = meta["auto_k"]
        k = meta["config"]["sample"]["num_samples"]
        assert chosen["k"] == k
        if expected is not None:
            assert k == expected
        else:
            enough = read_meta(paths.eval(0))["metrics"]["best_of_n"]["enough"]
            assert k == (min(4, 2 * enough["k"]) if enough["n"] >= enough["k"] else max(2, enough["n"]))
        counts = {}
        for prompt_id in load_from_disk(str(paths.samples(r)))["prompt_id"]:
            counts[prompt_id] = counts.get(prompt_id, 0) + 1
        assert set(counts.values()) == {k}
        assert read_meta(paths.samples(r))["fingerprint"]["config"]["sample.num_samples"] == k


def test_a_fixed_schedule_of_the_ks_auto_chose_samples_the_same_completions_as_auto(make_cfg):
    """auto K's baseline: its own chosen schedule fixed (sample.num_samples=[k0, k1, ...]). Where the schedule is
    what auto chose, every round's completions are the same, so a comparison against it isolates the choosing."""
    from datasets import load_from_disk

    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import read_meta

    auto = make_cfg(*LOOP, "loop.rounds=3", "sample.num_samples=auto", "sample.auto_k.cap=4", "sample.auto_k.floor=2",
                    "run_name=auto")
    run_stage(auto)
    auto_paths = RunPaths.from_config(auto)
    chosen = [read_meta(auto_paths.samples(r))["auto_k"]["k"] for r in range(3)]
    fixed = make_cfg(*LOOP, "loop.rounds=3", f"sample.num_samples=[{','.join(map(str, chosen))}]", "run_name=fixed")
    run_stage(fixed)
    fixed_paths = RunPaths.from_config(fixed)
    for r, k in enumerate(chosen):
        meta = read_meta(fixed_paths.samples(r))
        assert meta["config"]["sample"]["num_samples"] == k and meta["auto_k"]["from_round"] is None
        assert meta["fingerprint"]["config"]["sample.num_samples"] == k
        mine, theirs = (load_from_disk(str(p.samples(r))) for p in (fixed_paths, auto_paths))
        assert mine["completion"] == theirs["completion"] and mine["prompt_id"] == theirs["prompt_id"]
    # a schedule shorter than the rounds repeats its last K
    short = make_cfg(*LOOP, "loop.rounds=3", "sample.num_samples=[4,2]", "run_name=short")
    run_stage(short)
    assert [read_meta(RunPaths.from_config(short).samples(r))["config"]["sample"]["num_samples"]
            for r in range(3)] == [4, 2, 2]


def test_a_k_schedule_is_checked_at_every_k_it_holds(make_cfg):
    from rsft.errors import ConfigError
    from rsft.preflight import check_config

    check_config(make_cfg(*LOOP, "sample.num_samples=[8,4,3]"))
    for value, message in (("[]", r"num_samples=\[\]: expected a non-empty list"),
                           ("[8,0]", r"num_samples\[1\]=0: expected an integer >= 1 \(round 1's K\)"),
                           ("[8,2.5]", r"num_samples\[1\]=2.5")):
        with pytest.raises(ValueError, match=message):
            check_config(make_cfg(*LOOP, f"sample.num_samples={value}"))
    # pruning and adaptive K must make sense at every round's K, the smallest included
    with pytest.raises(ValueError, match=r"adaptive_k\.k0=3: expected an integer below num_samples=3"):
        check_config(make_cfg(*LOOP, "sample.num_samples=[8,3]", "sample.adaptive_k.k0=3",
                              "sample.adaptive_k.mean=5"))
    # pairs need two completions in every round
    with pytest.raises(ConfigError, match=r"select.pairs=true needs sample.num_samples >= 2 in every round "
                                          r"\(got \[4, 1\], whose fewest is 1\)"):
        check_config(make_cfg(*LOOP, "sample.num_samples=[4,1]", "select.pairs=true"))
    with pytest.raises(ConfigError, match=r"is a K per round, and stage=online has no rounds"):
        check_config(make_cfg("stage=online", "sample.num_samples=[4,2]"))


def test_the_stop_rule_stops_after_patience_rounds_without_a_decided_gain_and_says_why(make_cfg):
    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import is_complete

    # a tiny random policy gains nothing decided: with patience 2 the loop stops after round 1 of at most 4
    cfg = make_cfg(*LOOP, "loop.rounds=4", "loop.stop.enabled=true", "loop.stop.patience=2", "run_name=stop")
    loop = run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    assert loop.meta["rounds"] == 2 and not is_complete(paths.samples(2))
    assert [g["round"] for g in loop.meta["gains"]] == [0, 1] and not any(g["gained"] for g in loop.meta["gains"])
    assert loop.meta["gains"][0]["column"] == "gold"
    summary = paths.summary.read_text()
    assert "**loop.stop**: stopped after round 1 of at most 4: 2 round(s) in a row without a gold gain" in summary
    assert "## Best-of-N: when more samples stop paying" in summary
    # the same command again: every artifact reused, the same decision
    again = run_stage(make_cfg(*LOOP, "loop.rounds=4", "loop.stop.enabled=true", "loop.stop.patience=2",
                               "run_name=stop"))
    assert again.meta["rounds"] == 2 and again.meta["stopped"] == loop.meta["stopped"]


def test_auto_k_and_the_stop_rule_need_the_evaluations_and_a_fixed_k_for_pruning(make_cfg):
    from rsft.preflight import check_config
    from rsft.errors import ConfigError

    with pytest.raises(ConfigError, match="sample.num_samples=auto chooses each round's K.*loop.eval=true"):
        check_config(make_cfg(*LOOP, "sample.num_samples=auto", "loop.eval=false"))
    with pytest.raises(ConfigError, match="loop.stop.enabled=true stops on the rounds' gains"):
        check_config(make_cfg(*LOOP, "loop.stop.enabled=true", "loop.eval=false"))
    # pruning: its share must stop a row of the smallest round auto can sample (the floor)
    check_config(make_cfg(*LOOP, "sample.num_samples=auto", "sample.prune.at=[4]", "sample.prune.share=0.5"))
    with pytest.raises(ValueError, match=r"prune\.share=0\.3: expected at least 1/3 .*auto_k\.floor=3"):
        check_config(make_cfg(*LOOP, "sample.num_samples=auto", "sample.prune.at=[4]", "sample.prune.share=0.3"))
    # adaptive K: auto sets its mean; its first pass must leave the floor something to allocate
    check_config(make_cfg(*LOOP, "sample.num_samples=auto", "sample.adaptive_k.k0=1"))
    with pytest.raises(ValueError, match=r"adaptive_k\.mean=3\.0: expected null with num_samples=auto"):
        check_config(make_cfg(*LOOP, "sample.num_samples=auto", "sample.adaptive_k.k0=1", "sample.adaptive_k.mean=3"))
    with pytest.raises(ValueError, match=r"adaptive_k\.k0=3: expected below sample\.auto_k\.floor=3"):
        check_config(make_cfg(*LOOP, "sample.num_samples=auto", "sample.adaptive_k.k0=3"))
    for value in ("2.5", "many", "0"):  # an integer or auto (num_samples is typed Any, so checked here)
        with pytest.raises(ValueError, match=rf"num_samples={value!s}|num_samples='{value}'"):
            check_config(make_cfg(*LOOP, f"sample.num_samples={value}"))
    with pytest.raises(ValueError, match="auto_k.floor=9: expected at most auto_k.cap=8"):
        check_config(make_cfg(*LOOP, "sample.num_samples=auto", "sample.auto_k.floor=9"))


def test_a_loop_with_auto_k_runs_with_adaptive_k_and_pruning(make_cfg):
    from datasets import load_from_disk

    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "loop.rounds=2", "sample.num_samples=auto", "sample.auto_k.cap=4", "sample.auto_k.floor=2",
                   "sample.adaptive_k.k0=1", "sample.prune.at=[4]", "sample.prune.share=0.5", "run_name=levers")
    run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    for r in (0, 1):
        meta = read_meta(paths.samples(r))
        sample = meta["config"]["sample"]
        assert sample["num_samples"] == 4 and meta["auto_k"]["from_round"] == (r - 1 if r else None)
        mean = meta["auto_k"].get("adaptive_k", {}).get("mean")
        assert (sample["adaptive_k"]["k0"], sample["adaptive_k"]["mean"]) == ((1, mean) if mean else (0, None))
        rows = load_from_disk(str(paths.samples(r)))
        per_prompt = {}
        for prompt_id in rows["prompt_id"]:
            per_prompt[prompt_id] = per_prompt.get(prompt_id, 0) + 1
        assert max(per_prompt.values()) <= 4 and sample["prune"]["at"] == [4]  # pruning on in every round
        if mean:  # adaptive K spent its mean over the prompts
            assert sum(per_prompt.values()) <= round(mean * len(per_prompt))
