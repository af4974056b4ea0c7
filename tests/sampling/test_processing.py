"""Logits processing and inverse-CDF sampling: hand computations, no statistics."""

import math

import pytest
import torch

from rsft.sampling.processing import (
    check_finite,
    check_sampling_settings,
    greedy_probs,
    probs_from_logits,
    sample_from_probs,
)


def reference_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Hugging Face's TopPLogitsWarper rule, written independently: sort ascending, drop the tokens
    whose cumulative mass (from the least probable up) is <= 1 - top_p, keep the most probable one."""
    ascending, order = logits.sort(dim=-1)
    cumulative = ascending.softmax(-1).cumsum(-1)
    drop_sorted = cumulative <= 1 - top_p
    drop_sorted[..., -1] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf")).softmax(-1)


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    for temperature in (0.3, 1.0, 2.5):
        expected = torch.softmax(logits / temperature, -1)
        torch.testing.assert_close(probs_from_logits(logits, temperature), expected)


def test_top_k_hand_computation():
    logits = torch.tensor([1.0, 4.0, 2.0, 3.0])
    probs = probs_from_logits(logits, 1.0, top_k=2)
    e3, e4 = math.exp(3.0), math.exp(4.0)
    expected = torch.tensor([0.0, e4 / (e3 + e4), 0.0, e3 / (e3 + e4)])
    torch.testing.assert_close(probs, expected)
    # top_k >= vocab and top_k = 0 are both "off"
    torch.testing.assert_close(probs_from_logits(logits, 1.0, top_k=4), logits.softmax(-1))
    torch.testing.assert_close(probs_from_logits(logits, 1.0, top_k=0), logits.softmax(-1))


def test_top_k_keeps_ties_with_the_kth():
    probs = probs_from_logits(torch.tensor([2.0, 1.0, 2.0, 0.0]), 1.0, top_k=1)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.0, 0.5, 0.0]))


def test_top_p_hand_computation():
    target = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = target.log()
    # the smallest set with mass >= top_p, taken from the most probable token down
    for top_p, kept in ((0.4, [0]), (0.7, [0, 1]), (0.85, [0, 1, 2]), (0.97, [0, 1, 2, 3]), (1e-6, [0])):
        expected = torch.zeros(4)
        expected[kept] = target[kept] / target[kept].sum()
        torch.testing.assert_close(probs_from_logits(logits, 1.0, top_p=top_p), expected, msg=f"top_p={top_p}")


def test_top_p_keeps_every_token_tied_with_the_last_one_kept_whatever_their_order():
    """Scores 2, 1, 1, 0: the nucleus at 0.6 needs the top token and one of the two tied ones. Which one a sort
    puts first is not the logits' to say (it may differ between the plain step's shapes and the verification's),
    so both stay, in any vocabulary order, and p is a function of the logits alone."""
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0])
    e = math.exp(1.0)
    expected = torch.tensor([e * e, e, e, 0.0]) / (e * e + 2 * e)
    torch.testing.assert_close(probs_from_logits(logits, 1.0, top_p=0.6), expected)
    for order in ([1, 2, 0, 3], [3, 2, 1, 0], [2, 3, 1, 0]):
        index = torch.tensor(order)
        torch.testing.assert_close(probs_from_logits(logits[index], 1.0, top_p=0.6), expected[index])
    # in bf16, where ties are common, over a batch: any permutation of the vocabulary permutes p
    generator = torch.Generator().manual_seed(3)
    coarse = (torch.randn(32, 40, generator=generator) * 2).to(torch.bfloat16).round()  # many exact ties
    shuffle = torch.randperm(40, generator=generator)
    for top_p in (0.3, 0.7, 0.95):
        torch.testing.assert_close(probs_from_logits(coarse[:, shuffle], 1.0, top_p=top_p),
                                   probs_from_logits(coarse, 1.0, top_p=top_p)[:, shuffle])


def test_top_p_matches_the_reference_rule_on_random_logits():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 30, generator=generator) * 2
    for top_p in (0.1, 0.5, 0.9, 0.99):
        torch.testing.assert_close(probs_from_logits(logits, 1.0, top_p=top_p), reference_top_p(logits, top_p))


def test_top_k_then_top_p_and_temperature_together():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0, -1.0])
    scaled = logits / 0.5  # temperature first
    # top-k=3 keeps tokens 1, 3, 2; their probabilities are ~[0.867, 0.117, 0.016]: top_p=0.9 keeps 1 and 3
    kept = torch.tensor([1, 3])
    expected = torch.zeros(5)
    expected[kept] = scaled[kept].softmax(-1)
    torch.testing.assert_close(probs_from_logits(logits, 0.5, top_k=3, top_p=0.9), expected)


def test_probs_are_float32_sum_to_one_any_leading_dims():
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 3, 50, generator=generator) * 3).to(torch.bfloat16)
    probs = probs_from_logits(logits, 0.7, top_k=10, top_p=0.8)
    assert probs.dtype == torch.float32 and probs.shape == (2, 3, 50)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))
    assert ((probs > 0).sum(-1) <= 10).all() and ((probs > 0).sum(-1) >= 1).all()
    # computed in float32 from the bf16 values, not in bf16
    torch.testing.assert_close(probs_from_logits(logits, 1.0), logits.float().softmax(-1))


def test_masked_minus_inf_logits_are_fine():
    logits = torch.tensor([[0.0, float("-inf"), 1.0]])
    probs = probs_from_logits(logits, 1.0, top_p=0.9)
    assert probs[0, 1] == 0 and torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(1))


def test_greedy_probs_is_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 5.0, 1.0]]).to(torch.bfloat16)
    probs = greedy_probs(logits)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_check_sampling_settings():
    check_sampling_settings(1.0, 0, 1.0, "exact")
    check_sampling_settings(0.0, 0, 1.0, "greedy")  # greedy ignores temperature
    with pytest.raises(ValueError, match=r"temperature must be > 0 for strategy=exact.*sample.strategy=greedy"):
        check_sampling_settings(0.0, 0, 1.0, "exact")
    with pytest.raises(ValueError, match="temperature"):
        check_sampling_settings(-1.0, 0, 1.0, "lenient")
    with pytest.raises(ValueError, match="temperature"):
        check_sampling_settings(float("nan"), 0, 1.0, "exact")
    # so cold that logits divided by it overflow float32 (NaN probabilities): refused, pointing to greedy
    with pytest.raises(ValueError, match=r"temperature must be at least 1e-06 .*got 1e-40.*sample.strategy=greedy"):
        check_sampling_settings(1e-40, 0, 1.0, "exact")
    assert not torch.isnan(probs_from_logits(torch.tensor([30.0, -30.0, 0.0]), 1e-6)).any()  # the floor is safe
    check_sampling_settings(1e-6, 0, 1.0, "exact")
    for top_p in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="top_p"):
            check_sampling_settings(1.0, 0, top_p, "exact")
    with pytest.raises(ValueError, match="top_k"):
        check_sampling_settings(1.0, -1, 1.0, "exact")
    with pytest.raises(ValueError, match="temperature must be > 0"):
        probs_from_logits(torch.zeros(3), 0.0)


def test_check_finite_names_the_first_bad_row():
    logits = torch.zeros(4, 2, 5)
    logits[:, :, 0] = float("-inf")  # a masked token is legitimate
    check_finite(logits, where="target logits")
    bad = logits.clone()
    bad[2, 1, 3] = float("nan")
    bad[3, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"target logits: row 2 \(batch index 2\) has NaN or \+inf"):
        check_finite(bad, where="target logits")
    with pytest.raises(ValueError, match="row prompt-c"):
        check_finite(bad, row_ids=["prompt-a", "prompt-b", "prompt-c", "prompt-d"])
    plus_inf = logits.clone()
    plus_inf[1, 0, 4] = float("inf")
    with pytest.raises(ValueError, match="row 1"):
        check_finite(plus_inf)
    all_masked = logits.clone()
    all_masked[3, 1, :] = float("-inf")
    with pytest.raises(ValueError, match=r"draft logits: row 3 .*every token at -inf"):
        check_finite(all_masked, where="draft logits")


def test_check_finite_fast_path_agrees_with_the_full_check():
    check_finite(torch.randn(3, 2, 7))  # all finite: one reduction decides
    huge = torch.full((2, 1, 4), 3e38)  # finite, but their sum overflows: the full check must still pass them
    check_finite(huge)
    for bad_value in (float("nan"), float("inf"), float("-inf")):
        bad = torch.randn(3, 1, 6)
        bad[1, 0] = bad_value  # a whole position: -inf everywhere is as bad as NaN
        with pytest.raises(ValueError, match="row 1"):
            check_finite(bad)


def test_inverse_cdf_boundaries():
    probs = torch.tensor([[0.25, 0.25, 0.5]] * 6)
    uniforms = torch.tensor([0.0, 0.2499, 0.25, 0.4999, 0.5, 0.9999])
    assert sample_from_probs(probs, uniforms).tolist() == [0, 0, 1, 1, 2, 2]


def test_inverse_cdf_never_returns_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.0, 0.6, 0.0, 0.4, 0.0, 0.0]] * 4)
    below_one = 1.0 - 2.0**-53  # the largest float64 below 1
    uniforms = torch.tensor([0.0, 0.5999, 0.6001, below_one], dtype=torch.float64)  # 0.6 is not exact in float32
    assert sample_from_probs(probs, uniforms).tolist() == [2, 2, 4, 4]
    # a row whose float32 sum rounded below 1: u close to 1 must still land on the last nonzero token
    short = torch.tensor([[0.3, 0.3, 0.3999999, 0.0]])
    assert sample_from_probs(short, torch.tensor([below_one], dtype=torch.float64)).tolist() == [2]


def test_inverse_cdf_on_a_uniform_grid_reproduces_the_distribution():
    probs = probs_from_logits(torch.randn(40, generator=torch.Generator().manual_seed(2)), 1.0, top_k=12)
    n = 100_000
    grid = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # evenly spread u, no randomness
    tokens = sample_from_probs(probs.expand(n, -1), grid)
    frequencies = torch.bincount(tokens, minlength=40).double() / n
    torch.testing.assert_close(frequencies, probs.double(), atol=2.0 / n, rtol=0)


def test_inverse_cdf_agrees_with_a_float64_running_sum_over_a_large_vocabulary():
    """The two-level search (float32 block sums of 64, float64 across and inside blocks) returns the
    token a float64 running sum over the whole vocabulary returns, a short tail block included, except
    where a uniform falls within float32 rounding (1e-6 of the mass) of a boundary: then a neighbour."""
    g = torch.Generator().manual_seed(3)
    probs = (torch.randn(64, 49_157, generator=g) * 3).softmax(-1)  # 49157 = 768 blocks of 64 and a tail of 5
    probs[:, 1000:3000] = 0.0  # whole blocks without mass are skipped
    cdf = probs.double().cumsum(-1)
    differ = 0
    for _ in range(64):
        u = torch.rand(64, generator=g, dtype=torch.float64)
        threshold = u * cdf[:, -1]
        reference = torch.searchsorted(cdf, threshold[:, None], right=True).squeeze(-1)
        tokens = sample_from_probs(probs, u)
        for row in (tokens != reference).nonzero().flatten().tolist():
            differ += 1
            low, high = sorted((int(tokens[row]), int(reference[row])))
            boundary = cdf[row, high - 1]  # between the two tokens (zero-mass tokens between them add nothing)
            assert abs(float(boundary - threshold[row])) < 1e-6 * float(cdf[row, -1]), (row, low, high)
    assert differ <= 8  # of 4096 draws


def test_inverse_cdf_past_the_end_takes_the_last_token_with_mass():
    """u * total can round up to the total: the last token with nonzero probability, whatever its block."""
    probs = torch.zeros(2, 200)
    probs[0, 5], probs[0, 70] = 0.5, 0.5  # mass in blocks 0 and 1 only; blocks 2 and 3 (the tail) are empty
    probs[1, 199] = 1.0  # mass only in the short tail block
    u = torch.full((2,), 1.0, dtype=torch.float64)  # beyond [0, 1): the worst rounding can do
    assert sample_from_probs(probs, u).tolist() == [70, 199]


def test_in_place_probabilities_equal_the_allocating_ones():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 2, 50, generator=g) * 4
    logits[0, 0, :10] = float("-inf")
    expected = probs_from_logits(logits, 0.7)
    torch.testing.assert_close(probs_from_logits(logits.clone(), 0.7, in_place=True), expected, rtol=1e-6, atol=1e-7)

