"""rsft.stats: bootstrap intervals cover the truth at about the stated rate; pairing; collapse measures."""

from __future__ import annotations

import numpy as np
import pytest

from rsft import stats


def test_bootstrap_interval_covers_the_true_mean_at_about_95_percent():
    rng = np.random.default_rng(1)
    trials, covered = 3000, 0
    for t in range(trials):
        # 40 prompts with their own difficulty, 4 correlated samples each; true mean 0.5
        difficulty = rng.normal(0.5, 0.2, size=40)
        groups = [list(d + rng.normal(0, 0.3, size=4)) for d in difficulty]
        ci = stats.bootstrap(groups, resamples=1000, seed=t)
        covered += ci["low"] <= 0.5 <= ci["high"]
    # the interval's true coverage here is about 0.935 (a percentile bootstrap over 40 prompts runs a little short);
    # at 3,000 trials the binomial sd is 0.0044, so each bound is 7 sd or more away from it
    assert 0.90 <= covered / trials <= 0.97, covered / trials


def test_bootstrap_is_seeded_and_handles_one_prompt():
    groups = {"a": [1.0, 2.0], "b": [3.0], "c": [0.0, 0.0, 6.0]}
    assert stats.bootstrap(groups) == stats.bootstrap(groups)
    ci = stats.bootstrap(groups)
    assert ci["mean"] == pytest.approx((1.5 + 3.0 + 2.0) / 3) and ci["low"] < ci["mean"] < ci["high"]
    assert stats.bootstrap([[4.0, 6.0]]) == {"mean": 5.0, "low": 5.0, "high": 5.0, "prompts": 1}
    with pytest.raises(ValueError, match="no values"):
        stats.bootstrap([[]])


def test_paired_difference_is_tighter_than_the_two_intervals_and_win_rate_counts_ties_half():
    rng = np.random.default_rng(0)
    prompts, samples = [f"p{i}" for i in range(30)], range(4)
    base = {(p, s): float(rng.normal(i * 0.1, 1.0)) for i, p in enumerate(prompts) for s in samples}
    # common random numbers; the noise is 10 sd short of the gain, so every pair wins (a loss needs a 10-sd draw)
    better = {k: v + 0.2 + float(rng.normal(0, 0.02)) for k, v in base.items()}
    diff = stats.paired_difference(better, base)
    assert diff["low"] > 0.1 and diff["high"] < 0.3
    separate = [stats.bootstrap(stats.by_prompt([k[0] for k in d], d.values())) for d in (better, base)]
    assert separate[0]["low"] < separate[1]["high"]  # unpaired, the two intervals overlap
    assert stats.paired_win_rate(better, base)["mean"] == 1.0
    assert stats.paired_win_rate(base, base)["mean"] == 0.5
    with pytest.raises(ValueError, match="keys are in one evaluation only"):
        stats.paired_difference(better, {k: v for k, v in base.items() if k[0] != "p0"})
    with pytest.raises(ValueError, match="share prompt_id/sample_idx"):
        stats.keyed(["a", "a"], [0, 0], [1.0, 2.0])


def test_openings_and_distinct_n_across_prompts():
    assert stats.opening("I'm sorry, but as an AI designed to help") == "i'm sorry but as an"
    assert stats.opening("  ") == ""
    texts = ["I'm sorry, but as an AI I can't.", "i'm SORRY but as an ai, no", "Sure! Here is a poem", ""]
    top, share = stats.top_opening(texts)
    assert top == "i'm sorry but as an" and share == 0.5
    assert stats.top_opening([]) == ("", 0.0)
    assert stats.distinct_n(["a b a", "a b"], 1) == pytest.approx(2 / 5)
    assert stats.distinct_n(["a b a", "a b"], 2) == pytest.approx(2 / 3)
    assert stats.distinct_n(["", "x"], 2) is None


def test_mid_sentence_share_counts_visible_texts_that_stop_without_closing_punctuation():
    from rsft.stats import mid_sentence_share

    assert mid_sentence_share(["Hello.", "I am", "ok!\n", "", 'He said "hi"', "list:"]) == pytest.approx(1 / 5)
    assert mid_sentence_share([]) == 0.0 and mid_sentence_share(["  "]) == 0.0


def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_answer():
    """The unbiased estimator against brute force over every k-subset of n samples."""
    from itertools import combinations

    from rsft.stats import pass_at_k

    for n, correct in ((8, 0), (8, 1), (8, 3), (6, 6), (5, 2)):
        verdicts = [1] * correct + [0] * (n - correct)
        for k in range(1, n + 1):
            subsets = list(combinations(verdicts, k))
            assert pass_at_k(n, correct, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError, match="pass@9 needs"):
        pass_at_k(8, 1, 9)


def test_only_zero_one_columns_count_as_a_verifier():
    from rsft.stats import is_verifier

    assert is_verifier([1.0, 0.0, None, 1])
    assert not is_verifier([1.0, 0.5]) and not is_verifier([None, None]) and not is_verifier([])


@pytest.mark.parametrize("low,high,margin,word", [
    (0.01, 0.05, 0.0, "better"), (-0.02, 0.03, 0.03, "not worse"), (-0.02, 0.03, 0.0, "undecided"),
    (-0.05, 0.01, 0.03, "undecided"), (-0.08, -0.01, 0.03, "worse"), (-0.02, -0.01, 0.03, "not worse"),
    (0.0, 0.02, 0.01, "not worse")])
def test_one_rule_decides_every_comparison(low, high, margin, word):
    """better above zero; not worse when the low end clears -m; worse below zero past -m; else undecided."""
    from rsft.stats import verdict

    assert verdict({"mean": (low + high) / 2, "low": low, "high": high}, margin) == word


def test_a_margin_must_be_stated_and_non_negative():
    from rsft.stats import verdict

    with pytest.raises(ValueError, match="margin=-0.1: expected a number >= 0"):
        verdict({"low": 0.0, "high": 0.1}, -0.1)


def test_the_pooled_interval_widens_with_the_seed_to_seed_spread():
    from rsft.stats import bootstrap, pooled_bootstrap

    rng = np.random.default_rng(1)
    prompts = {f"p{i}": list(rng.normal(0.0, 1.0, size=4)) for i in range(64)}
    one = bootstrap(prompts)
    alike = pooled_bootstrap([prompts, prompts, prompts])  # three seeds that agree: one seed's interval
    assert alike["seeds"] == 3 and alike["prompts"] == 64 and alike["mean"] == pytest.approx(one["mean"])
    assert alike["high"] - alike["low"] == pytest.approx(one["high"] - one["low"], rel=0.15)
    apart = pooled_bootstrap([{k: [v + shift for v in g] for k, g in prompts.items()} for shift in (-0.5, 0.0, 0.5)])
    assert apart["seed_means"] == pytest.approx([one["mean"] - 0.5, one["mean"], one["mean"] + 0.5])
    assert apart["mean"] == pytest.approx(one["mean"])
    assert apart["high"] - apart["low"] > 2 * (alike["high"] - alike["low"])
    with pytest.raises(ValueError, match="the same prompts"):
        pooled_bootstrap([prompts, {"p0": [1.0]}])


def test_answers_alike_up_to_case_spacing_and_unicode_forms():
    from rsft.stats import normalised_answer

    assert normalised_answer("  Caf\u00e9\n au  lait ") == normalised_answer("cafe\u0301 au lait") == "caf\u00e9 au lait"
    assert normalised_answer("10\u00b2") != normalised_answer("102") and normalised_answer("STRASSE") == "strasse"
    assert normalised_answer("a b") != normalised_answer("ab")


def test_top_opening_counts_the_empty_opening_unless_told_not_to():
    """An evaluation counts an empty answer as an opening (collapse to nothing shows); select's recorded share
    counts only the openings its cap (select.max_opening_share) limits, those with words."""
    from rsft.stats import top_opening

    texts = ["", "...", "Sure thing.", "Sure thing!"]
    assert top_opening(texts) == ("", 0.5) and top_opening(texts, empty=False) == ("sure thing", 0.5)
    assert top_opening(["", "?"], empty=False) == ("", 0.0) and top_opening([]) == ("", 0.0)


def test_a_pairing_leaves_out_what_either_side_could_not_score():
    """A reward that returns None for some answers (not scorable) still pairs the evaluations: over the completions
    both sides scored, and a different set of completions is still refused."""
    from rsft.errors import ConfigError

    mine = stats.keyed(["a", "a", "b"], [0, 1, 0], [1.0, None, 0.5])
    theirs = stats.keyed(["a", "a", "b"], [0, 1, 0], [0.0, 1.0, None])
    assert mine[("a", 1)] is None
    difference = stats.paired_difference(mine, theirs)
    assert difference["mean"] == 1.0 and difference["prompts"] == 1
    with pytest.raises(ConfigError, match="different completions"):
        stats.paired_difference(mine, stats.keyed(["a"], [0], [1.0]))
    assert stats.by_prompt(["a", "a", "b"], [1.0, None, None]) == {"a": [1.0]}  # each side's own interval too
