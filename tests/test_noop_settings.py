"""A setting that makes a stage's work a no-op, while it still pays for it, is refused before any work
(issue 33): 0 epochs or a 0 learning rate for a stage that saves its model as trained, a pruning share
that stops no row while every checkpoint scores every row, adaptive K that cannot change what is sampled,
a 0 weight on a combination's component. Each message is one line naming the key, the value, what is
expected and what to set instead. A 0 that documents "off" or "none" stays allowed.

Config validation only (rsft.preflight.check_config on a composed config): no model is loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rsft.preflight import check_config
from rsft.errors import ConfigError
from tests.conftest import REPO

# (command's overrides, how the message starts, what it offers instead); the tests' config has
# sample.num_samples=3 (tests/conftest.py TINY)
REFUSED = [
    # training stages that would save an untrained model as trained
    ("stage=draft draft=distilled distill.epochs=0", "distill.epochs=0: expected an integer >= 1", "draft=ngram"),
    ("stage=draft draft=distilled distill.learning_rate=0", "distill.learning_rate=0.0: expected a number > 0",
     "draft=ngram"),
    ("stage=draft draft=feature draft.train.epochs=0", "draft.train.epochs=0: expected", "draft=ngram"),
    ("stage=draft draft=feature draft.train.learning_rate=0", "draft.train.learning_rate=0.0: expected",
     "draft=ngram"),
    ("stage=sft sft.epochs=0", "sft.epochs=0: expected an integer >= 1", "eval.policy=initial"),
    ("stage=sft sft.learning_rate=0", "sft.learning_rate=0.0: expected a number > 0", "eval.policy=initial"),
    ("stage=loop loop.dpo=true dpo.epochs=0", "dpo.epochs=0: expected", "loop.dpo=false"),
    ("stage=loop loop.dpo=true dpo.learning_rate=0", "dpo.learning_rate=0.0: expected", "loop.dpo=false"),
    ("stage=reward reward.epochs=0", "reward.epochs=0: expected", "reward_source=pretrained"),
    ("stage=reward reward.learning_rate=0", "reward.learning_rate=0.0: expected", "reward_source=pretrained"),
    ("stage=refresh loop.refresh_reward=true refresh.epochs=0", "refresh.epochs=0: expected",
     "loop.refresh_reward=false"),
    # pruning that stops nothing, yet scores every row at every checkpoint
    ("stage=sample sample.prune.at=[4] sample.prune.share=0", "sample.prune.share=0.0: expected a fraction in (0, 1)",
     "prune.at=[]"),
    ("stage=sample sample.prune.share=0", "sample.prune.share=0.0: expected", "prune.at=[]"),  # the off switch is at
    ("stage=sample sample.prune.at=[4] sample.prune.share=0.2", "sample.prune.share=0.2: expected at least 1/3",
     "prune.at=[]"),
    ("stage=sample sample.prune.at=[4] sample.prune.share=0.3 sample.prune.rank_finished=false",
     "sample.prune.share=0.3: expected at least 1/3", "prune.at=[]"),
    ("stage=sample sample.prune.at=[4] sample.num_samples=1", "sample.prune.at=[4]: expected [] with one row per prompt",
     "prune.at=[]"),
    (("stage=sample sample.num_samples=8 sample.adaptive_k.k0=2 sample.adaptive_k.mean=4 sample.prune.at=[4] "
      "sample.prune.share=0.15"), "sample.prune.share=0.15: expected at least 1/6", "num_samples - k0=6"),
    # adaptive K that cannot change what is sampled, yet scores the first pass
    ("stage=sample sample.adaptive_k.k0=3", "sample.adaptive_k.k0=3: expected an integer below num_samples=3",
     "0 (off)"),
    ("stage=sample sample.adaptive_k.k0=2", ("sample.adaptive_k.mean=None: expected a mean completions per prompt "
                                            "above k0=2 and below num_samples=3"), "adaptive_k.k0=0"),
    ("stage=sample sample.adaptive_k.k0=2 sample.adaptive_k.mean=3", "sample.adaptive_k.mean=3.0: expected",
     "adaptive_k.k0=0"),
    ("stage=sample sample.adaptive_k.k0=2 sample.adaptive_k.mean=2", ("sample.adaptive_k.mean=2.0: expected a mean "
                                                                      "completions per prompt above k0=2"),
     "adaptive_k.k0=0"),
    ("stage=sample sample.adaptive_k.mean=2.5", "sample.adaptive_k.mean=2.5: expected null while adaptive_k.k0=0",
     "set adaptive_k.k0"),
    # a refresh with nothing to pair, a combination component that adds nothing
    ("stage=loop loop.refresh_reward=true sample.num_samples=1 select.pairs=false",
     "loop.refresh_reward=true labels pairs", "loop.refresh_reward=false"),
    (("stage=score reward_source=combination +reward_source.components.a.source=trained "
      "+reward_source.components.a.weight=0"), "reward_source.components.a.weight=0: expected a nonzero number",
     "remove the component"),
    # counts that leave a stage nothing to do (rules that were there already; the audit keeps them)
    ("stage=sample sample.num_samples=0", "sample.num_samples=0: expected", None),
    ("stage=sample sample.max_new_tokens=0", "sample.max_new_tokens=0: expected", None),
    ("stage=sample data.limit=0", "data.limit=0: expected", None),
    ("stage=loop loop.rounds=0", "loop.rounds=0: expected", None),
    ("stage=eval eval.num_samples=0", "eval.num_samples=0: expected", None),
    ("stage=prefs prefs.num_samples=1", "prefs.num_samples=1: expected", None),
    ("stage=prefs prefs.num_prompts=0", "prefs.num_prompts=0: expected", None),
    ("stage=loop loop.refresh_reward=true refresh.samples_per_prompt=1", "refresh.samples_per_prompt=1: expected",
     None),
    ("stage=select select.k=0", "select.k=0: expected", None),
    ("stage=sample draft=ngram draft.gamma=0", "draft.gamma", None),
    # impossible sizes: they failed only when the model was built, after the stage had begun
    ("stage=sample policy.hidden_size=30", "policy.num_attention_heads=4: expected a divisor of hidden_size=30",
     None),
    ("stage=sample policy.num_key_value_heads=3", ("policy.num_key_value_heads=3: expected a divisor of "
                                                  "num_attention_heads=4"), None),
]

# values outside what the code can take: seeds numpy refuses, numbers that are not finite, a thread pool
# that cannot start, rows cut to nothing (each failed only after work had been done)
OUT_OF_RANGE = [
    ("stage=sample seed=-1", "seed=-1: expected an integer in [0, 4294967295]"),
    ("stage=sample seed=4294967296", "seed=4294967296: expected an integer in [0, 4294967295]"),
    ("stage=reward reward.seed=-1", "reward.seed=-1: expected an integer in [0, 4294967295]"),
    ("stage=prefs prefs.seed=-5", "prefs.seed=-5: expected an integer in [0"),
    ("stage=eval eval.seed=-1", "eval.seed=-1: expected an integer in [0"),
    ("stage=sample data.split_seed=-1 data=hh_rlhf", "data.split_seed=-1: expected an integer in [0"),
    ("stage=reward reward.data.part_seed=-1", "reward.data.part_seed=-1: expected an integer in [0"),
    ("stage=draft draft=distilled distill.eval_seed=-1", "distill.eval_seed=-1: expected an integer in [0"),
    ("stage=sample policy.seed=-1", "policy.seed=-1: expected an integer in [0"),
    ("stage=sample threads=100000", "threads=100000: expected an integer in [0, "),
    ("stage=sample threads=-1", "threads=-1: expected an integer in [0, "),
    ("stage=reward reward.learning_rate=inf", "reward.learning_rate=inf: expected a finite number > 0"),
    ("stage=sft sft.learning_rate=inf", "sft.learning_rate=inf: expected a finite number > 0"),
    ("stage=sft sft.learning_rate=nan", "sft.learning_rate=nan: expected a finite number > 0"),
    ("stage=loop loop.dpo=true dpo.learning_rate=inf", "dpo.learning_rate=inf: expected a finite number > 0"),
    ("stage=draft draft=distilled distill.learning_rate=inf", "distill.learning_rate=inf: expected a finite"),
    ("stage=prefs prefs.tau=inf", "prefs.tau=inf: expected a finite number > 0"),
    ("stage=sample sample.temperature=inf", "sample.temperature=inf: expected a finite number > 0 and <= 100"),
    ("stage=sample sample.temperature=1e300", "sample.temperature=1e+300: expected a number > 0 and <= 100"),
    ("stage=sample sample.temperature=-inf", "sample.temperature=-inf: expected a finite number"),
    ("stage=prefs prefs.temperature=500", "prefs.temperature=500.0: expected a number > 0 and <= 100"),
    ("stage=select select.threshold=nan select.strategy=threshold", "select.threshold=nan: expected a finite number"),
    ("stage=select select.min_reward=nan", "select.min_reward=nan: expected a finite number"),
    ("stage=select select.min_reward=-inf", "select.min_reward=-inf: expected a finite number"),
    ("stage=loop loop.dpo=true dpo.min_margin=nan", "dpo.min_margin=nan: expected a finite number"),
    ("stage=sft sft.max_grad_norm=inf", "sft.max_grad_norm=inf: expected a finite number > 0"),
    (("stage=score reward_source=combination +reward_source.components.a.source=trained "
      "+reward_source.components.a.weight=inf"), "reward_source.components.a.weight=inf: expected a finite number"),
    ("stage=sft sft.max_length=1", "sft.max_length=1: expected an integer >= 16"),
    ("stage=reward reward.max_length=1", "reward.max_length=1: expected an integer >= 16"),
    ("stage=loop loop.dpo=true dpo.max_length=8", "dpo.max_length=8: expected an integer >= 16"),
]


@pytest.mark.parametrize("overrides,starts", OUT_OF_RANGE, ids=[case[0] for case in OUT_OF_RANGE])
def test_a_value_the_code_cannot_take_is_refused_up_front(make_cfg, overrides, starts):
    with pytest.raises(ConfigError) as caught:
        check_config(make_cfg(*overrides.split()))
    message = str(caught.value)
    assert "\n" not in message, "a config error is one line"
    assert message.startswith(starts), message


@pytest.mark.parametrize("overrides", ["stage=sample seed=4294967295 threads=1", "stage=sample sample.temperature=100",
                                       "stage=sft sft.max_length=16", "stage=select select.min_reward=-3.5"])
def test_the_edges_of_those_ranges_are_kept(make_cfg, overrides):
    check_config(make_cfg(*overrides.split()))


# a 0 (or other edge) that documents "off", "none" or "all": allowed
KEPT = [
    "stage=sample sample.prune.at=[4] sample.prune.share=0.34",  # stops 1 of 3
    "stage=sample sample.prune.at=[4] sample.prune.share=0.34 sample.prune.rank_finished=false",
    "stage=sample sample.adaptive_k.k0=2 sample.adaptive_k.mean=2.5",
    "stage=sample sample.adaptive_k.k0=0",
    "stage=sample sample.top_k=0 sample.shard_prompts=0 threads=0",
    "stage=sft sft.checkpoint_steps=0 sft.warmup_steps=0 sft.weight_decay=0",
    "stage=select select.pool_rounds=0 select.diversity=0 select.max_opening_share=1.0",
    "stage=loop loop.examples=0",
    "stage=reward reward.label_smoothing=0 reward.score_shard_rows=0",
    "stage=draft draft=feature draft.train.head_tokens=0 draft.train.feature_weight=0",
    "stage=sample draft=none",  # gamma 0: plain sampling
    ("stage=score reward_source=combination reward_source.combine=min +reward_source.components.a.source=trained "
     "+reward_source.components.a.weight=0"),  # min ignores the weights
]


@pytest.mark.parametrize("overrides,starts,instead", REFUSED, ids=[case[0] for case in REFUSED])
def test_a_no_op_setting_is_refused_naming_the_key(make_cfg, overrides, starts, instead):
    with pytest.raises(ConfigError) as caught:
        check_config(make_cfg(*overrides.split()))
    message = str(caught.value)
    assert "\n" not in message, "a config error is one line"
    assert message.startswith(starts), message
    assert instead is None or instead in message, message


@pytest.mark.parametrize("overrides", KEPT)
def test_a_value_that_documents_off_is_kept(make_cfg, overrides):
    check_config(make_cfg(*overrides.split()))


@pytest.mark.parametrize("overrides,key", [("stage=draft draft=distilled distill.epochs=0", "distill.epochs=0"),
                                           ("stage=sample sample.prune.at=[16] sample.prune.share=0",
                                            "sample.prune.share=0.0")])
def test_the_command_says_it_in_one_line_before_any_work(tmp_path, overrides, key):
    done = subprocess.run([sys.executable, "-m", "rsft.run", *overrides.split(), "policy=tiny", "logger=none",
                           f"paths.runs_root={tmp_path}"],
                          check=False, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "RSFT_TRACEBACK" not in line]
    assert len(lines) == 1 and lines[0].startswith(key), done.stderr
    assert not list(tmp_path.glob("*/round_*")) and not list(tmp_path.glob("*/draft"))  # no artifact begun


@pytest.mark.parametrize("rank_finished", [True, False])
def test_a_share_stops_a_row_exactly_from_one_over_the_rows(rank_finished):
    """The rule the pruning check states (rsft.sampling.budget.check_prune_stops): a checkpoint can stop one
    of a prompt's n rows exactly when share >= 1/n, with either ranking."""
    from rsft.sampling.budget import most_stopped

    for rows in range(1, 17):
        for share in (0.01, 0.05, 0.1, 0.125, 0.15, 1 / 6, 0.2, 0.25, 0.3, 1 / 3, 0.34, 0.5, 0.75, 0.99):
            assert (most_stopped(share, rows, rank_finished) > 0) == (rows > 1 and share >= 1 / rows - 1e-12), \
                (share, rows)
