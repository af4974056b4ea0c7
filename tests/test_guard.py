"""The collapse guard (rsft.guard): loop.guard and online.guard watch an evaluation's measure of range after
training and stop, or lower the learning rate, when it crosses its bound."""

from __future__ import annotations

import pytest

from rsft.errors import ConfigError, MissingInput
from tests.test_online import ONLINE
from tests.test_overoptimisation import LOOP

# distinct_1 is at most 1: a floor above it is crossed by every evaluation (a guard that always trips)
ALWAYS = ["loop.guard.metric=distinct_1", "loop.guard.min=1.01"]


def test_the_guard_stops_the_loop_after_the_first_round_that_crosses_it_and_says_why(make_cfg):
    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import is_complete

    cfg = make_cfg(*LOOP, "loop.rounds=3", *ALWAYS, "run_name=guarded")
    loop = run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    assert loop.meta["rounds"] == 1 and not is_complete(paths.samples(1))
    assert loop.meta["stopped"].startswith("the collapse guard stopped the loop after round 0: round 0's evaluation: "
                                           "distinct_1 = ")
    assert "fell below loop.guard.min=1.01" in loop.meta["stopped"]
    assert "**loop.guard**: the collapse guard stopped the loop after round 0" in paths.summary.read_text()
    again = run_stage(make_cfg(*LOOP, "loop.rounds=3", *ALWAYS, "run_name=guarded"))  # reused: the same decision
    assert again.meta["rounds"] == 1 and again.meta["stopped"] == loop.meta["stopped"]


def test_lower_lr_trains_the_rounds_after_a_crossing_at_the_lowered_rate(make_cfg):
    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "loop.rounds=2", *ALWAYS, "loop.guard.action=lower_lr", "loop.guard.lr_factor=0.25",
                   "run_name=lowered")
    loop = run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    rates = [read_meta(paths.policy(r))["config"]["sft"]["learning_rate"] for r in range(2)]
    assert rates == [pytest.approx(1e-3), pytest.approx(2.5e-4)]
    assert loop.meta["rounds"] == 2 and len(loop.meta["guard"]) == 2  # both rounds crossed; round 1's lowers nothing
    assert "the rounds after round 0 train at 0.25 x the learning rate" in loop.meta["guard"][0]
    assert loop.meta["guard"][1].endswith("; recorded (the last round)")


def test_raise_temperature_samples_the_rounds_after_a_crossing_hotter_and_evaluates_at_the_set_temperature(make_cfg):
    """Issue 48's temperature lever: a crossing raises the sampling temperature of the rounds after it (the samples'
    own artifacts record it, so their fingerprints differ), while every evaluation keeps sample.temperature."""
    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "loop.rounds=2", *ALWAYS, "loop.guard.action=raise_temperature",
                   "loop.guard.temperature_factor=1.5", "run_name=heated")
    loop = run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    base = cfg.sample.temperature
    sampled = [read_meta(paths.samples(r))["config"]["sample"]["temperature"] for r in range(2)]
    assert sampled == [pytest.approx(base), pytest.approx(base * 1.5)]
    evaluated = [read_meta(paths.eval(r))["config"]["sample"]["temperature"] for r in range(2)]
    assert evaluated == [pytest.approx(base)] * 2
    assert f"the rounds after round 0 sample at temperature {base * 1.5:g} (1.5 x sample.temperature)" \
        in loop.meta["guard"][0]


def test_raise_kl_trains_the_rounds_after_a_crossing_with_a_stronger_pull_towards_the_start(make_cfg):
    """Issue 48's adaptive pull: each crossing multiplies the rounds' sft.kl by loop.guard.kl_factor."""
    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "loop.rounds=2", *ALWAYS, "loop.guard.action=raise_kl", "loop.guard.kl_factor=3",
                   "sft.kl=0.1", "run_name=pulled")
    loop = run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    weights = [read_meta(paths.policy(r))["config"]["sft"]["kl"] for r in range(2)]
    assert weights == [pytest.approx(0.1), pytest.approx(0.3)]
    assert "the rounds after round 0 train with sft.kl=0.3 (3 x sft.kl)" in loop.meta["guard"][0]


def test_widen_select_keeps_several_answers_a_prompt_in_the_rounds_after_the_first_crossing(make_cfg):
    """Issue 48's schedule: one answer a prompt until the guard is crossed, then up to widen_k, a rare one weighing
    more and each prompt one row; the widened round's selected set carries the loss weights SFT reads, and a later
    crossing is only recorded."""
    from datasets import load_from_disk

    from rsft.paths import RunPaths
    from rsft.run import run_stage
    from rsft.store import read_meta

    cfg = make_cfg(*LOOP, "loop.rounds=3", *ALWAYS, "loop.guard.action=widen_select", "loop.guard.widen_k=2",
                   "run_name=widened")
    loop = run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    chosen = [read_meta(paths.selected(r))["settings"] for r in range(3)]
    assert [(c["k"], c["weight"], c["weight_scale"]) for c in chosen] == [
        (1, "none", "row"), (2, "rarity", "prompt"), (2, "rarity", "prompt")]
    assert "weight" not in load_from_disk(str(paths.selected(0))).column_names
    widened = load_from_disk(str(paths.selected(1)))
    by_prompt: dict = {}
    for prompt, weight in zip(widened["prompt_id"], widened["weight"]):
        by_prompt[prompt] = by_prompt.get(prompt, 0.0) + weight
    assert by_prompt and all(total == pytest.approx(1.0) for total in by_prompt.values())  # a prompt weighs one row
    assert "the rounds after round 0 select with select.k=2 select.weight=rarity select.weight_scale=prompt" \
        in loop.meta["guard"][0]
    assert "the selection is already widened" in loop.meta["guard"][1]
    assert loop.meta["guard"][2].endswith("; recorded (the last round)")


def test_a_measure_the_evaluation_lacks_is_named_with_what_it_measured(make_cfg):
    from rsft.run import run_stage

    with pytest.raises(MissingInput, match="loop.guard.metric=pass_at_2: the initial policy's evaluation did not measure "
                                           "it; it measured .*distinct_2"):
        run_stage(make_cfg(*LOOP, "loop.rounds=1", "loop.guard.metric=pass_at_2", "loop.guard.min=0.5",
                           "run_name=no-verifier"))


@pytest.mark.parametrize("overrides,message", [
    (["loop.guard.metric=distinct_2"], "loop.guard.min=None: expected a number"),
    (["loop.guard.min=0.5"], "loop.guard.metric=None: expected a measure to bound"),
    (["loop.guard.metric=gold_mean", "loop.guard.min=0.5"], "loop.guard.metric='gold_mean': expected null"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.eval=false"], "loop.eval=False: expected true"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.guard.lr_factor=1"], "loop.guard.lr_factor=1"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.guard.temperature_factor=1"],
     "loop.guard.temperature_factor=1"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.guard.action=raise_kl", "sft.kl=0.1",
      "loop.guard.kl_factor=0.5"], "loop.guard.kl_factor=0.5"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.guard.action=raise_kl"],
     "sft.kl=0.0: expected > 0 with loop.guard.action=raise_kl"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.guard.action=widen_select", "loop.guard.widen_k=1"],
     "loop.guard.widen_k=1"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.guard.action=widen_select", "select.k=4"],
     "loop.guard.widen_k=4: expected more than select.k=4"),
    (["loop.guard.metric=distinct_2", "loop.guard.min=0.5", "loop.guard.action=widen_select",
      "select.strategy=threshold"], "select.strategy=threshold: expected top_k with loop.guard.action=widen_select"),
    # evaluations report pass@1, 2, 4 and 8, each up to eval.num_samples (2 here): refused before any training
    (["loop.guard.metric=pass_at_3", "loop.guard.min=0.5"], "loop.guard.metric='pass_at_3': expected null"),
    (["loop.guard.metric=gold_pass_at_2", "loop.guard.min=0.5"], "loop.guard.metric='gold_pass_at_2': expected null"),
    (["loop.guard.metric=reward_pass_at_2", "loop.guard.min=0.5"], "loop.guard.metric='reward_pass_at_2': expected"),
    (["loop.guard.metric=pass_at_4", "loop.guard.min=0.5"],
     "loop.guard.metric=pass_at_4 needs 4 answers a held-out prompt, and eval.num_samples=2 gives fewer"),
])
def test_bad_guard_settings_are_refused_naming_the_key(make_cfg, overrides, message):
    from rsft.preflight import check_config

    with pytest.raises((ConfigError, ValueError), match=message):
        check_config(make_cfg(*LOOP, *overrides))


def test_the_online_guard_stops_after_the_snapshot_that_crosses_it_or_lowers_the_rate(make_cfg):
    from rsft.run import run_stage

    common = [*ONLINE, "online.minibatches=3", "online.eval_every=1", "data.eval_limit=2", "eval.num_samples=2",
              "online.guard.metric=distinct_1", "online.guard.min=1.01"]
    cfg = make_cfg(*common, "run_name=online-stop")
    stats = run_stage(cfg).meta["stats"]
    assert stats["minibatches"] == 1 and stats["stopped"].startswith("the snapshot after 1 mini-batches: distinct_1")
    assert [g["batch"] for g in stats["guard"]] == [1] and stats["guard"][0]["action"] == "stop"
    lowered = run_stage(make_cfg(*common, "online.guard.action=lower_lr", "run_name=online-lower"))
    minibatches = lowered.meta["minibatches"]
    assert len(minibatches) == 3 and [g["batch"] for g in lowered.meta["stats"]["guard"]] == [1, 2, 3]
    rates = [m["learning_rate"] for m in minibatches]
    assert rates == [pytest.approx(1e-3), pytest.approx(5e-4), pytest.approx(2.5e-4)]


def test_the_online_guard_raises_the_kl_weight_per_crossing_as_its_record_says(make_cfg):
    from rsft.guard import kl_weight
    from rsft.preflight import check_config
    from rsft.run import run_stage

    common = [*ONLINE, "online.minibatches=3", "online.eval_every=1", "data.eval_limit=2", "eval.num_samples=2",
              "online.guard.metric=distinct_1", "online.guard.min=1.01", "online.guard.action=raise_kl"]
    pulled = run_stage(make_cfg(*common, "online.kl=0.1", "run_name=online-pull"))
    assert [m["kl_weight"] for m in pulled.meta["minibatches"]] == [pytest.approx(0.1), pytest.approx(0.2),
                                                                    pytest.approx(0.4)]
    guard = pulled.meta["stats"]["guard"]
    assert [g["action"] for g in guard] == ["raise_kl", "raise_kl", "recorded (the last snapshot)"]
    # the weight is read from the recorded crossings, so a run resumed after them trains as the first one did
    online = make_cfg(*common, "online.kl=0.1").online
    assert kl_weight(online, guard[:2]) == pytest.approx(0.4) and kl_weight(online, guard) == pytest.approx(0.4)
    with pytest.raises((ConfigError, ValueError),
                       match=r"online.kl=0.0: expected > 0 with online.guard.action=raise_kl"):
        check_config(make_cfg(*common))


def test_a_run_killed_after_raise_kl_crossings_resumes_with_the_same_weights(make_cfg, monkeypatch):
    """The KL weight is read from the checkpoint's recorded crossings: killed in mini-batch 3 (index) after a
    checkpoint at 2, the rerun trains every mini-batch at the weight the uninterrupted run did, to the same policy."""
    import json

    import torch

    from rsft.run import run_stage
    from tests.test_online import _weights, _without_time, killed_in_minibatch_3

    settings = [*ONLINE, "online.minibatches=4", "online.checkpoint_every=2", "online.eval_every=1",
                "data.eval_limit=2", "eval.num_samples=2", "online.guard.metric=distinct_1", "online.guard.min=1.01",
                "online.guard.action=raise_kl", "online.kl=0.1"]
    whole = run_stage(make_cfg(*settings, "run_name=pull-whole")).path
    ran = killed_in_minibatch_3(monkeypatch)
    killed = make_cfg(*settings, "run_name=pull-killed")
    with pytest.raises(KeyboardInterrupt):
        run_stage(killed)
    torch.manual_seed(12345)
    resumed = run_stage(killed).path
    assert ran == [0, 1, 2, 3, 2, 3]
    a, b = (json.loads((p / "metrics.json").read_text())["minibatches"] for p in (whole, resumed))
    assert [m["kl_weight"] for m in a] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert _without_time(a) == _without_time(b)
    assert all(torch.equal(p, q) for p, q in zip(_weights(whole / "policy"), _weights(resumed / "policy")))


def test_online_refuses_to_widen_the_selection_naming_the_key(make_cfg):
    from rsft.preflight import check_config

    with pytest.raises((ConfigError, ValueError), match="online.guard.action='widen_select': expected stop, "
                                                         "lower_lr or raise_kl"):
        check_config(make_cfg(*ONLINE, "online.eval_every=1", "online.guard.metric=distinct_1", "online.guard.min=0.5",
                              "online.guard.action=widen_select"))


def test_online_refuses_to_raise_the_temperature_naming_the_key(make_cfg):
    from rsft.preflight import check_config

    with pytest.raises((ConfigError, ValueError), match="online.guard.action='raise_temperature': expected stop, "
                                                         "lower_lr or raise_kl"):
        check_config(make_cfg(*ONLINE, "online.eval_every=1", "online.guard.metric=distinct_1", "online.guard.min=0.5",
                              "online.guard.action=raise_temperature"))


def test_an_online_guard_on_a_pass_at_k_its_evaluations_cannot_report_is_refused_before_training(make_cfg):
    from rsft.preflight import check_config

    with pytest.raises(ConfigError, match="online.guard.metric=pass_at_8 needs 8 answers a held-out prompt"):
        check_config(make_cfg(*ONLINE, "eval.num_samples=4", "online.eval_every=1",
                              "online.guard.metric=pass_at_8", "online.guard.min=0.5"))


def test_a_measure_the_answers_collapsed_past_is_below_any_floor():
    """One-word answers have no distinct-2 and answers with no token no entropy: the evaluation leaves the measure
    out and says why, and a guard whose floor it is crosses it (a collapse, not a setting to refuse)."""
    from omegaconf import OmegaConf

    from rsft.guard import crossed
    from rsft.metrics import policy_metrics
    from tests.test_eval import _eval_rows

    metrics = policy_metrics(_eval_rows({"a": ["42", "17"], "b": ["5", "5"]}, reward=[0.0] * 4))
    floor = OmegaConf.create({"metric": "distinct_2", "min": 0.3, "max": None})
    assert crossed(floor, metrics, "loop.guard", "round 0's evaluation") == \
        "round 0's evaluation: distinct_2 is undefined (no answer has 2 words), so it is not above loop.guard.min=0.3"
    ceiling = OmegaConf.create({"metric": "distinct_2", "min": None, "max": 0.9})
    assert crossed(ceiling, metrics, "loop.guard", "x") is None
    empty = policy_metrics(_eval_rows({"a": ["", ""]}, reward=[0.0, 0.0], mean_entropy=[None, None])
                           .map(lambda r: {"num_tokens": 0}))
    assert empty["undefined"]["mean_entropy"] == "no answer has a token"
    assert "undefined" not in policy_metrics(_eval_rows({"a": ["x y", "y z"]}, reward=[0.0, 1.0]))
