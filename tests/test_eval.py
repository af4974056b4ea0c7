"""stage=eval: the best-of-N estimator against enumeration, the metrics, and the stage on tiny models."""

from __future__ import annotations

import itertools
import json
import math
import statistics

import pytest
import torch
from datasets import load_from_disk
from fake_reward import install_fake_reward

from rsft.metrics import best_of_n_kl_bound, expected_best_of_n, read_metrics
from rsft.models import load_policy
from rsft.paths import RunPaths
from rsft.run import run_stage
from rsft.store import atomic_artifact, read_meta


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_expected_best_of_n_equals_enumeration_over_subsets(n):
    rewards = [0.3, -1.0, 2.5, 0.3, 1.1]
    values = [10.0, 20.0, 30.0, 40.0, 50.0]  # e.g. gold scores of the same completions
    subsets = list(itertools.combinations(range(5), n))
    # the reward-best of a subset; ties go to the earlier index, as the estimator documents
    brute = statistics.fmean(values[max(s, key=lambda i: (rewards[i], -i))] for s in subsets)
    assert expected_best_of_n(rewards, values, n) == pytest.approx(brute)
    assert expected_best_of_n(rewards, rewards, n) == pytest.approx(statistics.fmean(max(rewards[i] for i in s)
                                                                                     for s in subsets))


def test_kl_bound():
    assert best_of_n_kl_bound(1) == 0.0
    assert best_of_n_kl_bound(8) == pytest.approx(math.log(8) - 7 / 8)


def save_tiny_as_round_policy(cfg, round_idx=0):
    """Round 0's 'trained' policy: the tiny policy with one weight nudged (no SFT needed here)."""
    model, tokenizer, _ = load_policy(cfg, None, torch.device("cpu"))
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    with atomic_artifact(RunPaths(cfg.paths.run_dir).policy(round_idx), {"stage": "sft"}) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def test_eval_round_builds_the_baseline_and_writes_metrics(make_cfg, monkeypatch):
    overrides = ("data.eval_limit=3", "eval.num_samples=3", "device=cpu")
    install_fake_reward(monkeypatch, make_cfg())
    run_stage(make_cfg("stage=sample", *overrides))
    run_stage(make_cfg("stage=score", *overrides))
    save_tiny_as_round_policy(make_cfg())
    out = run_stage(make_cfg("stage=eval", *overrides)).path
    paths = RunPaths(out.parent.parent)
    assert out == paths.eval(0)
    metrics = read_metrics(out)
    for key in ("reward_mean", "reward_normalised_mean", "gold_mean", "win_rate_vs_initial",
                "gold_win_rate_vs_initial", "distinct_1", "distinct_2", "distinct_2_all", "top_opening_share",
                "mean_tokens", "mean_words"):
        assert isinstance(metrics[key], float), key
    assert 0 <= metrics["win_rate_vs_initial"] <= 1 and 0 <= metrics["gold_mean"] <= 1
    for key in ("reward_mean", "gold_mean", "win_rate_vs_initial", "gold_win_rate_vs_initial"):
        low, high = metrics["intervals"][key]
        assert low <= metrics[key] <= high, key
    diff = metrics["vs_initial"]["gold"]
    assert diff["low"] <= diff["mean"] <= diff["high"] and "judge_mean" not in metrics
    bon = metrics["best_of_n"]
    assert bon["n"] == [1, 2, 3] and bon["round"] == 0
    assert bon["expected_max_reward"] == sorted(bon["expected_max_reward"])  # more samples, higher max
    assert bon["kl_bound"][0] == 0.0 and len(bon["expected_gold"]) == 3

    samples = load_from_disk(str(out))
    assert len(samples) == 9 and {"reward", "reward_normalised", "gold"} <= set(samples.column_names)
    assert set(samples["policy"]) == {str(paths.policy(0))}
    assert all(pid.startswith("demo-test-") for pid in samples["prompt_id"])  # held-out prompts
    baseline = load_from_disk(str(paths.initial_eval))
    assert set(baseline["round"]) == {-1} and baseline["prompt_id"] == samples["prompt_id"]
    assert "win_rate_vs_initial" not in read_metrics(paths.initial_eval)
    assert read_meta(out)["metrics"]["gold_mean"] == metrics["gold_mean"]


def test_eval_of_a_round_without_its_policy_says_which_stage(make_cfg, monkeypatch):
    install_fake_reward(monkeypatch, make_cfg())
    with pytest.raises(FileNotFoundError, match="stage=sft round=2"):
        run_stage(make_cfg("stage=eval", "round=2"))


def make_reward_folder(cfg, run_name, weights=b"w1", train_pairs=("h1", "h2")):
    """A complete reward-model artifact (fake weights, recorded pair hashes) in another run."""
    from rsft.bt_fit import PAIR_HASHES_FILE

    folder = RunPaths(cfg.paths.run_dir).other_run(run_name).reward
    with atomic_artifact(folder, {"stage": "reward"}) as tmp:
        (tmp / "model.safetensors").write_bytes(weights)
        (tmp / PAIR_HASHES_FILE).write_text(json.dumps({"train": list(train_pairs), "heldout": []}))
    return folder


def test_eval_judge_scores_every_policy_with_intervals_and_win_rates(make_cfg, monkeypatch):
    overrides = ("data.eval_limit=3", "eval.num_samples=3", "device=cpu", "eval.judge=judge-run")
    install_fake_reward(monkeypatch, make_cfg())
    make_reward_folder(make_cfg(), "judge-run")
    run_stage(make_cfg("stage=sample", *overrides))
    run_stage(make_cfg("stage=score", *overrides))
    save_tiny_as_round_policy(make_cfg())
    out = run_stage(make_cfg("stage=eval", *overrides)).path
    paths = RunPaths(out.parent.parent)
    for folder in (paths.initial_eval, out):
        ds = load_from_disk(str(folder))
        metrics = read_metrics(folder)
        assert ds["judge"] == [float(len(c.split())) for c in ds["completion"]]  # the judge's scores, not the proxy's
        low, high = metrics["intervals"]["judge_mean"]
        assert low <= metrics["judge_mean"] <= high
        assert metrics["judge"].endswith("judge-run/reward")
        assert ["not checked" in w for w in metrics["judge_warnings"]] == [True]  # the fake proxy records no pairs
    metrics = read_metrics(out)
    assert 0 <= metrics["judge_win_rate_vs_initial"] <= 1 and "judge" in metrics["vs_initial"]
    # the round's own K samples are judged too: the best-of-N curve under the judge, which `enough` reads
    curve = metrics["best_of_n"]
    assert len(curve["expected_judge"]) == len(curve["n"]) and curve["enough"]["truth"] == "judge"
    assert curve["enough_interval"]["judge"]["n"] == curve["enough"]["n"]  # the interval on N, written as JSON
    scored = load_from_disk(str(paths.scored(0)))
    assert curve["expected_judge"][0] == pytest.approx(
        sum(len(c.split()) for c in scored["completion"]) / len(scored), rel=1e-6)  # N=1: the mean judge score
    # a different judge makes the evaluations stale, never silently reused
    from rsft.errors import StaleArtifact

    make_reward_folder(make_cfg(), "judge-two", weights=b"w2")
    with pytest.raises(StaleArtifact, match="eval.judge"):
        run_stage(make_cfg("stage=eval", *overrides[:-1], "eval.judge=judge-two"))


def test_judge_must_be_a_reward_model_and_independent(make_cfg, monkeypatch, tmp_path):
    from rsft.reward_service import judge_model, judge_warnings

    install_fake_reward(monkeypatch, make_cfg())
    with pytest.raises(FileNotFoundError, match="eval.judge='nowhere'"):
        judge_model(make_cfg("eval.judge=nowhere"))
    with pytest.raises(FileNotFoundError, match="eval.judge='../x'"):
        judge_model(make_cfg("eval.judge=../x"))
    not_reward = tmp_path / "samples"
    with atomic_artifact(not_reward, {"stage": "sample"}):
        pass
    with pytest.raises(ValueError, match="not a complete reward model"):
        judge_model(make_cfg(f"eval.judge={not_reward}"))

    proxy = make_reward_folder(make_cfg(), "demo", weights=b"same", train_pairs=("a", "b", "c"))
    assert "the same folder" in judge_warnings(proxy, proxy)[0]
    copy = make_reward_folder(make_cfg(), "copy", weights=b"same", train_pairs=("x",))
    assert "same weights" in judge_warnings(copy, proxy)[0]
    overlapping = make_reward_folder(make_cfg(), "overlap", weights=b"other", train_pairs=("c", "d"))
    assert "1 of the judge's 2 training pairs" in judge_warnings(overlapping, proxy)[0]
    disjoint = make_reward_folder(make_cfg(), "disjoint", weights=b"other2", train_pairs=("d", "e"))
    assert judge_warnings(disjoint, proxy) == [] and judge_model(make_cfg("eval.judge=disjoint")) == disjoint


def test_range_metrics_pass_at_k_alike_share_and_distinct_answers_with_intervals():
    """A verifier's 0/1 column gets pass@k for k up to the samples per prompt; texts alike up to case and
    spacing count as one answer; a continuous column gets no pass@k."""
    from datasets import Dataset

    from rsft.metrics import policy_metrics

    ds = Dataset.from_dict({
        "prompt_id": ["a"] * 4 + ["b"] * 4, "sample_idx": [0, 1, 2, 3] * 2,
        "completion": ["x", "x", " X ", "x", "1", "2", "3", "3"], "reward": [1, 0, 0, 0, 1, 1, 0, 1],
        "gold": [0.5] * 8, "reward_normalised": [0.0] * 8, "num_tokens": [1] * 8, "finish_reason": ["eos"] * 8})
    m = policy_metrics(ds)
    # prompt a: 1 right of 4 (pass@2 = 1 - C(3,2)/C(4,2) = 0.5); prompt b: 3 of 4 (pass@2 = 1)
    assert (m["pass_at_1"], m["pass_at_2"], m["pass_at_4"]) == pytest.approx((0.5, 0.75, 1.0))
    assert "pass_at_8" not in m and not any(k.startswith("gold_pass_at") for k in m)
    assert m["alike_share"] == 0.5 and m["distinct_answers"] == 2.0
    assert m["intervals"]["pass_at_1"] == pytest.approx([0.25, 0.75]) and "alike_share" in m["intervals"]


def _eval_rows(completions: dict[str, list[str]], **columns) -> "Dataset":
    """An evaluation's rows: prompt -> its samples' texts, and any score columns (one value a row)."""
    from datasets import Dataset

    prompt_ids = [p for p, texts in completions.items() for _ in texts]
    texts = [t for ts in completions.values() for t in ts]
    n = len(texts)
    sample_idx = [i for ts in completions.values() for i in range(len(ts))]
    return Dataset.from_dict({"prompt_id": prompt_ids, "sample_idx": sample_idx, "completion": texts,
                              "reward_normalised": [0.0] * n, "num_tokens": [1] * n, "finish_reason": ["eos"] * n,
                              **columns})


def test_one_unscorable_verdict_keeps_pass_at_k_and_is_counted():
    """An answer the verifier could not score leaves its prompt one verdict short: pass@8 is still measured,
    over the prompts with 8 verdicts (pass_k_coverage says how many), and the unscorable answer is counted."""
    from rsft.metrics import policy_metrics

    rewards = [1.0, 0.0] * 4 + [0.0] * 8 + [1.0] * 7 + [None]
    m = policy_metrics(_eval_rows({p: [f"answer {i}" for i in range(8)] for p in "abc"}, reward=rewards))
    assert m["reward_unscorable"] == 1
    assert m["pass_at_8"] == pytest.approx((1.0 + 0.0) / 2) and m["pass_k_coverage"] == {"pass_at_8": 2}
    # pass@4 covers all three prompts; c's 7 of 7 scored answers are right
    assert m["pass_at_4"] == pytest.approx((1 - 1 / 70 + 0.0 + 1.0) / 3) and "pass_at_4" not in m["pass_k_coverage"]
    assert "reward_unscorable" not in policy_metrics(_eval_rows({"a": ["x y", "y z"]}, reward=[1.0, 0.0]))


def test_gold_and_bools_are_no_verifier_and_non_finite_scores_are_refused():
    """The demo's gold is graded (0 for every empty answer), so a collapsed policy gets no gold pass@k; a column
    of bools is no verifier's; a NaN score stops the evaluation, naming the column and the prompt."""
    from rsft.errors import InputError
    from rsft.metrics import policy_metrics
    from rsft.stats import is_verifier

    m = policy_metrics(_eval_rows({"a": ["", ""], "b": ["", ""]}, gold=[0.0] * 4, reward=[0.2, 0.1, 0.3, 0.4]))
    assert not any("pass_at" in k for k in m)
    assert not is_verifier([True, False]) and is_verifier([0.0, 1]) and not is_verifier([0.0, 1.0000001])
    with pytest.raises(InputError, match=r"reward column: prompt b's row 2 scored nan"):
        policy_metrics(_eval_rows({"a": ["x y", "y z"], "b": ["x y", "y z"]}, reward=[0.1, 0.2, float("nan"), 0.3]))


def test_distinct_n_is_left_out_when_undefined_and_an_empty_answer_is_an_opening():
    """One-number answers have no bigram: distinct-2 is not measured (left out, not 0.0, which reads as
    collapse), distinct-1 still is; answers that are all empty open alike (top opening share 1.0)."""
    from rsft.metrics import policy_metrics

    m = policy_metrics(_eval_rows({"a": ["42", "17", "3"], "b": ["5", "6", "7"]}, reward=[0.0] * 6))
    assert "distinct_2" not in m and "distinct_2_all" not in m and m["distinct_1"] == 1.0
    empty = policy_metrics(_eval_rows({"a": ["", " "], "b": ["", ""]}, reward=[0.0] * 4))
    assert (empty["top_opening"], empty["top_opening_share"]) == ("", 1.0)
    mixed = policy_metrics(_eval_rows({"a": ["Sure thing.", "Sure thing!"], "b": ["", "No."]}, reward=[0.0] * 4))
    assert (mixed["top_opening"], mixed["top_opening_share"]) == ("sure thing", 0.5)


def test_summary_cells_and_the_collapse_plot_take_a_measure_an_evaluation_lacks(tmp_path, monkeypatch):
    """A measure an evaluation could not take is "-" in summary.md's tables, and the diversity plot keeps the
    measures it has (a round of one-word answers has no distinct-2, yet its opening share is drawn)."""
    from rsft.report import markdown_table, plot_collapse

    assert "| - |" in markdown_table([{"distinct-2": None, "gold": 0.5}])

    class Records:
        def metrics(self, path):
            return {"initial": {"distinct_2": 0.9, "distinct_2_all": 0.7, "top_opening_share": 0.1},
                    "round 0": {"top_opening_share": 0.6, "undefined": {"distinct_2": "no answer has 2 words"}}}[path]

    points = [("initial", "initial"), ("round 0", "round 0")]
    monkeypatch.setattr("rsft.report.evaluations", lambda paths, rounds: points)
    assert plot_collapse(None, 1, tmp_path / "collapse.png", Records()) == tmp_path / "collapse.png"
    assert (tmp_path / "collapse.png").stat().st_size > 0
