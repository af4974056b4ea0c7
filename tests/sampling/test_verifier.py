"""The speculative verifier: analytic identities (no randomness), Monte-Carlo tests, exact equalities.

Statistical tests use fixed seeds, so they are deterministic; the seeds were not tuned. Each
chi-square test uses alpha = 1e-3, and there are at most 30 of them in this file (counting every
position checked), so under a correct verifier the chance that some seed choice fails one is at most
30 * 1e-3 = 3%. Total-variation thresholds use the bound P(TV(empirical, P) >= eps) <= 2^V exp(-2 N eps^2)
(Bretagnolle-Huber-Carol); their false-alarm rates are stated where they are used.
"""

import json
import math

import pytest
import torch
from scipy.stats import chisquare

from rsft.sampling.processing import probs_from_logits, sample_from_probs
from rsft.sampling.verifier import (
    ACCEPTED,
    BONUS,
    PAD,
    RECOVERED,
    AcceptanceStats,
    StreamingVerifier,
    VerifyResult,
    acceptance_probs,
    check_gamma,
    replacement_distribution,
    residual_distribution,
    residual_distribution_one_hot,
    verify,
)

ALPHA = 1e-3  # per chi-square test


# ----------------------------------------------------------------------------- helpers


def random_probs(generator, vocab, scale=2.0, top_k=0, temperature=1.0):
    logits = torch.randn(vocab, generator=generator) * scale  # [vocab]
    return probs_from_logits(logits, temperature, top_k=top_k)  # [vocab]


def one_hot(token, vocab):
    q = torch.zeros(vocab)
    q[token] = 1.0
    return q


def emitted_distribution(p, q, strategy="exact", leniency=1.0):
    """P(the token emitted at one position = x), from the verifier's own pieces; no randomness.

    p [vocab]; q [vocab], or an int: a deterministic draft that always proposes that token.
    """
    if isinstance(q, int):
        drafted = torch.tensor(q)
        accepted_mass = torch.zeros_like(p)  # [vocab]
        accepted_mass[q] = acceptance_probs(p[q], torch.tensor(1.0), leniency)
        replacement = replacement_distribution(p, None, drafted, strategy)  # [vocab]
    else:
        accepted_mass = q * acceptance_probs(p, q, leniency)  # [vocab] propose x, then accept it
        replacement = replacement_distribution(p, q, torch.tensor(0), strategy)  # [vocab]
    return accepted_mass + (1 - accepted_mass.sum()) * replacement  # [vocab]


def total_variation(a, b):
    return 0.5 * float((a.double() - b.double()).abs().sum())


def chisquare_pvalue(counts, probs):
    """Chi-square goodness of fit of counts [vocab] to probs [vocab], merging the smallest bins until each
    merged bin expects >= 5. Tokens with probability 0 must never occur (checked exactly)."""
    counts, probs = counts.double(), probs.double()
    assert counts[probs == 0].sum() == 0, "a zero-probability token was emitted"
    expected = probs / probs.sum() * counts.sum()
    groups, group_obs, group_exp = [], 0.0, 0.0
    for i in expected.argsort().tolist():
        if probs[i] == 0:
            continue
        group_obs, group_exp = group_obs + float(counts[i]), group_exp + float(expected[i])
        if group_exp >= 5:
            groups.append((group_obs, group_exp))
            group_obs, group_exp = 0.0, 0.0
    if group_exp > 0:  # leftover small bins join the last group
        last_obs, last_exp = groups.pop()
        groups.append((last_obs + group_obs, last_exp + group_exp))
    assert len(groups) >= 2, "too few samples for a chi-square test"
    observed, expected = zip(*groups)
    return chisquare(observed, expected).pvalue


def run_verify(target, draft, n, seed, *, num_drafts=None, strategy="exact", leniency=1.0):
    """One verify call on n independent rows sharing the same distributions.

    target [gamma + 1, vocab]; draft [gamma, vocab] (drafts sampled from it) or a list of gamma tokens
    (a deterministic draft). num_drafts: None, or a callable generator -> [n] long.
    """
    generator = torch.Generator().manual_seed(seed)
    gamma = target.shape[0] - 1
    if isinstance(draft, torch.Tensor):
        draft_tokens = torch.stack(
            [sample_from_probs(draft[j].expand(n, -1), torch.rand(n, generator=generator, dtype=torch.float64))
             for j in range(gamma)], dim=1)  # [n, gamma]
        draft_probs = draft.expand(n, -1, -1)  # [n, gamma, vocab]
    else:
        draft_tokens = torch.tensor(draft).expand(n, -1)  # [n, gamma]
        draft_probs = None
    accept_uniforms = torch.rand(n, gamma, generator=generator, dtype=torch.float64)  # [n, gamma]
    sample_uniforms = torch.rand(n, generator=generator, dtype=torch.float64)  # [n]
    rows_num_drafts = num_drafts(generator) if num_drafts is not None else None
    return verify(draft_tokens, draft_probs, target.expand(n, -1, -1), accept_uniforms, sample_uniforms,
                  num_drafts=rows_num_drafts, strategy=strategy, leniency=leniency)


def analytic_cases():
    """(name, p [vocab], q [vocab] or int) covering the corner cases of the identity."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for vocab in (3, 10, 50):
        cases.append((f"random V={vocab}", random_probs(g, vocab), random_probs(g, vocab)))
    p = random_probs(g, 10)
    cases.append(("p == q", p, p.clone()))
    cases.append(("disjoint supports", torch.tensor([0.5, 0.5, 0, 0]), torch.tensor([0, 0, 0.3, 0.7])))
    cases.append(("q = 0 where p > 0", random_probs(g, 10), random_probs(g, 10, top_k=3)))
    cases.append(("one-hot q tensor", random_probs(g, 10), one_hot(4, 10)))
    cases.append(("one-hot q (deterministic draft)", random_probs(g, 10), 4))
    sparse = random_probs(g, 10, top_k=3)
    cases.append(("deterministic draft of a p = 0 token", sparse, int(sparse.argmin())))
    cases.append(("sparse p (top-k)", random_probs(g, 50, top_k=5), random_probs(g, 50)))
    cases.append(("sparse p, sparse q (top-p)", random_probs(g, 50, top_k=8),
                  probs_from_logits(torch.randn(50, generator=g) * 2, 0.8, top_p=0.7)))
    cases.append(("one-hot p", one_hot(2, 10), random_probs(g, 10)))
    cases.append(("one-hot p, deterministic draft of it", one_hot(2, 10), 2))
    return cases


# ----------------------------------------------------------------------------- analytic identities


@pytest.mark.parametrize("name,p,q", analytic_cases(), ids=[c[0] for c in analytic_cases()])
def test_exact_emits_p_analytically(name, p, q):
    emitted = emitted_distribution(p, q)
    assert torch.isfinite(emitted).all()
    torch.testing.assert_close(emitted, p, atol=1e-6, rtol=0)


def test_acceptance_is_zero_not_nan_where_q_is_zero():
    p = torch.tensor([0.2, 0.0, 0.8])
    q = torch.tensor([0.0, 0.0, 1.0])
    torch.testing.assert_close(acceptance_probs(p, q), torch.tensor([0.0, 0.0, 0.8]))


def test_residual_guards_and_one_hot_form():
    p = torch.tensor([0.1, 0.6, 0.3])
    # p == q: no residual mass; falls back to p (never sampled: everything is accepted)
    torch.testing.assert_close(residual_distribution(p, p.clone()), p)
    # one-hot residual: p without the drafted token, renormalised; same values as the general form
    torch.testing.assert_close(residual_distribution_one_hot(p, torch.tensor(1)), torch.tensor([0.25, 0.0, 0.75]))
    torch.testing.assert_close(residual_distribution_one_hot(p, torch.tensor(1)),
                               residual_distribution(p, one_hot(1, 3)))
    # batched shapes [batch, gamma, vocab]
    pb = p.expand(2, 4, 3)
    assert residual_distribution_one_hot(pb, torch.zeros(2, 4, dtype=torch.long)).shape == (2, 4, 3)


def test_lossy_options_bias_matches_closed_forms():
    """The docstring's total-variation formulas for lenient and skip_adjustment, against the verifier's own pieces,
    on random (p, q) pairs: the bias is > 0 for typical pairs and lenient(1.0) is exact."""
    g = torch.Generator().manual_seed(1)
    biases = {"lenient 0.5": [], "lenient 0.8": [], "skip_adjustment": []}
    for _ in range(20):
        p, q = random_probs(g, 12), random_probs(g, 12)
        for leniency in (0.5, 0.8):
            expected_tv = float((torch.minimum(q, p / leniency) - p).clamp(min=0).sum())
            measured_tv = total_variation(emitted_distribution(p, q, "lenient", leniency), p)
            assert measured_tv == pytest.approx(expected_tv, abs=1e-6)
            biases[f"lenient {leniency}"].append(measured_tv)
        overlap = torch.minimum(p, q)  # [vocab]
        expected_tv = 0.5 * float((overlap - p * overlap.sum()).abs().sum())
        measured_tv = total_variation(emitted_distribution(p, q, "skip_adjustment"), p)
        assert measured_tv == pytest.approx(expected_tv, abs=1e-6)
        biases["skip_adjustment"].append(measured_tv)
        assert total_variation(emitted_distribution(p, q, "lenient", 1.0), p) < 1e-6
    # every pair is biased (the smallest bias here is ~0.002), and on average by several percent
    for name, values in biases.items():
        assert min(values) > 1e-3, name
        assert sum(values) / len(values) > 0.02, name


# ----------------------------------------------------------------------------- Monte-Carlo, one call


def monte_carlo_cases():
    g = torch.Generator().manual_seed(2)
    gamma = 3
    cases = []
    # (name, target [gamma + 1, vocab], draft [gamma, vocab] or tokens, num_drafts callable or None)
    cases.append(("V=3 random", torch.stack([random_probs(g, 3) for _ in range(gamma + 1)]),
                  torch.stack([random_probs(g, 3) for _ in range(gamma)]), None))
    cases.append(("V=10 sparse p", torch.stack([random_probs(g, 10, top_k=4) for _ in range(gamma + 1)]),
                  torch.stack([random_probs(g, 10) for _ in range(gamma)]), None))
    cases.append(("V=50 peaked q", torch.stack([random_probs(g, 50) for _ in range(gamma + 1)]),
                  torch.stack([random_probs(g, 50, temperature=0.5) for _ in range(gamma)]), None))
    cases.append(("V=10 q zero where p > 0", torch.stack([random_probs(g, 10) for _ in range(gamma + 1)]),
                  torch.stack([random_probs(g, 10, top_k=3) for _ in range(gamma)]), None))
    target = torch.stack([random_probs(g, 10, scale=3.0) for _ in range(gamma + 1)])
    cases.append(("V=10 deterministic draft", target, [int(target[0].argmax()), 3, int(target[2].argmax())], None))
    cases.append(("V=10 per-row num_drafts", torch.stack([random_probs(g, 10) for _ in range(gamma + 1)]),
                  torch.stack([random_probs(g, 10) for _ in range(gamma)]),
                  lambda generator: torch.randint(0, gamma + 1, (20_000,), generator=generator)))
    return cases


@pytest.mark.parametrize("case", range(6), ids=[c[0] for c in monte_carlo_cases()])
def test_every_emitted_position_is_distributed_as_p(case):
    """Slot j's token, among rows that reached slot j (every earlier draft accepted), is a draw from p_j.

    Valid because reaching slot j depends only on the draws at slots < j, and slot j's token only on
    draft j, its accept uniform and the sample uniform (used once, where the row stops). The *pair* of
    tokens at slots 0 and 1 is not p_0 x p_1 (slot 0 is conditioned on acceptance): the sequence-level
    test below checks the joint the right way, across verify calls.
    """
    name, target, draft, num_drafts = monte_carlo_cases()[case]
    n = 20_000
    result = run_verify(target, draft, n, seed=100 + case, num_drafts=num_drafts)
    for slot in range(target.shape[0]):
        reached = result.num_emitted > slot  # [n]
        if slot > 0 and reached.sum() < 500:
            continue  # too few rows get this far for a meaningful test
        counts = torch.bincount(result.tokens[reached, slot], minlength=target.shape[1])
        assert chisquare_pvalue(counts, target[slot]) > ALPHA, f"{name}: slot {slot}"


def test_monte_carlo_disjoint_supports_always_rejects():
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    draft = torch.tensor([[0.0, 0.0, 0.4, 0.6]])
    result = run_verify(target, draft, 20_000, seed=7)
    assert (result.num_accepted == 0).all() and (result.kinds[:, 0] == RECOVERED).all()
    assert chisquare_pvalue(torch.bincount(result.tokens[:, 0], minlength=4), target[0]) > ALPHA


def speculative_first_two_tokens(transitions, draft_transitions, start, gamma, n, seed):
    """Generate the first two tokens of n sequences from a Markov-chain "model" with speculative sampling.

    transitions [vocab, vocab]: target p(next | previous); draft_transitions [vocab, vocab] (drafts
    sampled from it), or None: a deterministic draft proposing (previous + 1) % vocab. A row that got
    only one token from the first verify call gets its second from a second call on the longer prefix,
    as a real sampler does.
    """
    generator = torch.Generator().manual_seed(seed)
    vocab = transitions.shape[0]

    def one_call(previous):  # previous [n]: the last token of each row's prefix
        drafts, draft_probs, targets = [], [], []  # gamma x [n], gamma x [n, vocab], gamma + 1 x [n, vocab]
        context = previous
        for _ in range(gamma):
            targets.append(transitions[context])
            if draft_transitions is None:
                token = (context + 1) % vocab
            else:
                draft_probs.append(draft_transitions[context])
                token = sample_from_probs(draft_probs[-1], torch.rand(n, generator=generator, dtype=torch.float64))
            drafts.append(token)
            context = token
        targets.append(transitions[context])
        return verify(
            torch.stack(drafts, 1),  # [n, gamma]
            torch.stack(draft_probs, 1) if draft_transitions is not None else None,  # [n, gamma, vocab]
            torch.stack(targets, 1),  # [n, gamma + 1, vocab]
            torch.rand(n, gamma, generator=generator, dtype=torch.float64),
            torch.rand(n, generator=generator, dtype=torch.float64),
        )

    first_call = one_call(torch.full((n,), start))
    first = first_call.tokens[:, 0]  # [n]
    second_call = one_call(first)
    second = torch.where(first_call.num_emitted >= 2, first_call.tokens[:, 1], second_call.tokens[:, 0])  # [n]
    return first, second


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_sequence_joint_of_first_two_tokens_matches_the_target(deterministic_draft):
    g = torch.Generator().manual_seed(3)
    vocab = 4
    transitions = torch.stack([random_probs(g, vocab) for _ in range(vocab)])  # [vocab, vocab]
    draft_transitions = None if deterministic_draft else torch.stack([random_probs(g, vocab) for _ in range(vocab)])
    start, n = 1, 40_000
    first, second = speculative_first_two_tokens(transitions, draft_transitions, start, gamma=3, n=n, seed=4)
    counts = torch.bincount(first * vocab + second, minlength=vocab * vocab)  # [vocab * vocab]
    joint = (transitions[start][:, None] * transitions).flatten()  # [vocab * vocab] p(a) p(b | a)
    assert chisquare_pvalue(counts, joint) > ALPHA


def test_deterministic_draft_is_accepted_with_probability_p_x():
    p = torch.tensor([0.1, 0.7, 0.2])
    torch.testing.assert_close(acceptance_probs(p, torch.ones(3)), p)
    n = 20_000
    result = run_verify(torch.stack([p, p]), [1], n, seed=5)
    rate = float((result.num_accepted == 1).double().mean())
    assert abs(rate - 0.7) < 5 * math.sqrt(0.7 * 0.3 / n)  # 5 sigma: false alarm < 1e-6


# ----------------------------------------------------------------------------- lossy options, measured bias


def test_lossy_options_measured_bias():
    """p and q with a known bias: lenient(0.5) has TV 0.2, skip_adjustment TV 0.15 (closed forms in the
    verifier docstring); exact's empirical TV to p is noise only. With N = 100k and V = 4, the chance that
    the empirical TV is off its expectation by >= 0.01 is <= 2^4 exp(-2 N 0.01^2) = 3e-8."""
    p = torch.tensor([0.5, 0.3, 0.1, 0.1])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    target, draft = torch.stack([p, p]), q[None]
    n = 100_000
    for strategy, leniency, bias in (("exact", 1.0, 0.0), ("lenient", 0.5, 0.2), ("skip_adjustment", 1.0, 0.15)):
        analytic = emitted_distribution(p, q, strategy, leniency)
        assert total_variation(analytic, p) == pytest.approx(bias, abs=1e-6)
        result = run_verify(target, draft, n, seed=6, strategy=strategy, leniency=leniency)
        counts = torch.bincount(result.tokens[:, 0], minlength=4)
        assert chisquare_pvalue(counts, analytic) > ALPHA, strategy
        assert abs(total_variation(counts / n, p) - bias) < 0.01, strategy


def test_lenient_with_leniency_one_is_exact():
    target, draft = random_inputs(seed=8, batch=64, gamma=3, vocab=7)[:2]
    exact = run_verify(target[0], draft[0], 64, seed=9)
    lenient = run_verify(target[0], draft[0], 64, seed=9, strategy="lenient", leniency=1.0)
    assert torch.equal(exact.tokens, lenient.tokens) and torch.equal(exact.kinds, lenient.kinds)


# ----------------------------------------------------------------------------- exact equalities


def random_inputs(seed, batch, gamma, vocab):
    """Per-row random target [batch, gamma + 1, vocab] (some rows sparse), draft probs, drafts, uniforms and
    num_drafts."""
    g = torch.Generator().manual_seed(seed)
    target = probs_from_logits(torch.randn(batch, gamma + 1, vocab, generator=g) * 2, 1.0)
    target[::3] = probs_from_logits(torch.randn(batch, gamma + 1, vocab, generator=g)[::3] * 2, 1.0, top_k=2)
    draft = probs_from_logits(torch.randn(batch, gamma, vocab, generator=g) * 2, 1.0, top_k=vocab - 2)
    u = torch.rand(batch, gamma, generator=g, dtype=torch.float64)
    tokens = sample_from_probs(draft.reshape(-1, vocab), u.flatten()).reshape(batch, gamma)
    tokens[::4] = torch.randint(0, vocab, (batch, gamma), generator=g)[::4]  # some drafts with q(x) = 0
    accept_uniforms = torch.rand(batch, gamma, generator=g, dtype=torch.float64)
    sample_uniforms = torch.rand(batch, generator=g, dtype=torch.float64)
    num_drafts = torch.randint(0, gamma + 1, (batch,), generator=g)
    num_drafts[: batch // 2] = gamma
    return target, draft, tokens, accept_uniforms, sample_uniforms, num_drafts


@pytest.mark.parametrize(
    "strategy,leniency", [("exact", 1.0), ("greedy", 1.0), ("lenient", 0.6), ("skip_adjustment", 1.0)]
)
@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_streaming_equals_batched(strategy, leniency, deterministic_draft):
    batch, gamma, vocab = 60, 4, 6
    target, draft, tokens, accept_uniforms, sample_uniforms, num_drafts = random_inputs(11, batch, gamma, vocab)
    draft = None if deterministic_draft else draft
    result = verify(tokens, draft, target, accept_uniforms, sample_uniforms,
                    num_drafts=num_drafts, strategy=strategy, leniency=leniency)
    for i in range(batch):
        row_target = target[i] if i % 2 else (lambda position, i=i: target[i, position])  # tensor or callable
        streaming = StreamingVerifier(row_target, accept_uniforms[i], sample_uniforms[i],
                                      strategy=strategy, leniency=leniency)
        for j in range(int(num_drafts[i])):
            if not streaming.offer(int(tokens[i, j]), None if draft is None else draft[i, j]):
                break
        emitted, kinds = streaming.finish()
        k = int(result.num_emitted[i])
        assert emitted == result.tokens[i, :k].tolist(), f"row {i}"
        assert kinds == result.kinds[i, :k].tolist(), f"row {i}"
        assert (result.tokens[i, k:] == PAD).all() and (result.kinds[i, k:] == PAD).all()


def test_deterministic_draft_equals_explicit_one_hot_draft():
    batch, gamma, vocab = 200, 4, 9
    target, _, tokens, accept_uniforms, sample_uniforms, num_drafts = random_inputs(12, batch, gamma, vocab)
    one_hots = torch.nn.functional.one_hot(tokens, vocab).float()  # [batch, gamma, vocab]
    implicit = verify(tokens, None, target, accept_uniforms, sample_uniforms, num_drafts=num_drafts)
    explicit = verify(tokens, one_hots, target, accept_uniforms, sample_uniforms, num_drafts=num_drafts)
    assert torch.equal(implicit.tokens, explicit.tokens) and torch.equal(implicit.kinds, explicit.kinds)


def test_result_layout_and_num_drafts_per_row():
    vocab, gamma = 5, 3
    # the target puts all its mass on the drafted tokens 1, 2, 3 and on token 4 at the bonus slot,
    # so every real draft is accepted and each row's extra token shows where it was taken from
    target = torch.stack([one_hot(token, vocab) for token in (1, 2, 3, 4)]).expand(4, -1, -1)  # [4, gamma + 1, vocab]
    drafts = torch.tensor([[-1, -1, -1], [1, 2, -1], [1, 2, 3], [1, 0, 3]])  # slots past num_drafts: anything
    num_drafts = torch.tensor([0, 2, 3, 3])
    uniforms = torch.full((4, gamma), 0.5, dtype=torch.float64)
    result = verify(drafts, None, target, uniforms, torch.full((4,), 0.5, dtype=torch.float64), num_drafts=num_drafts)
    assert isinstance(result, VerifyResult)
    assert result.num_accepted.tolist() == [0, 2, 3, 1]
    assert result.num_emitted.tolist() == [1, 3, 4, 2]
    assert result.tokens.tolist() == [[1, PAD, PAD, PAD], [1, 2, 3, PAD], [1, 2, 3, 4], [1, 2, PAD, PAD]]
    assert result.kinds.tolist() == [
        [BONUS, PAD, PAD, PAD],  # num_drafts = 0: plain sampling from p_0
        [ACCEPTED, ACCEPTED, BONUS, PAD],  # bonus from p at slot num_drafts = 2
        [ACCEPTED, ACCEPTED, ACCEPTED, BONUS],
        [ACCEPTED, RECOVERED, PAD, PAD],  # draft 1 (token 0) has p = 0: rejected, replaced from the residual
    ]


def test_num_drafts_zero_is_plain_sampling():
    batch, vocab = 300, 8
    target, *_ = random_inputs(13, batch, 2, vocab)
    sample_uniforms = torch.rand(batch, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    result = verify(torch.zeros(batch, 2, dtype=torch.long), None, target, torch.zeros(batch, 2, dtype=torch.float64),
                    sample_uniforms, num_drafts=torch.zeros(batch, dtype=torch.long))
    assert torch.equal(result.tokens[:, 0], sample_from_probs(target[:, 0], sample_uniforms))
    # gamma = 0 is the same thing
    no_drafts = torch.zeros(batch, 0, dtype=torch.long)
    empty = verify(no_drafts, None, target[:, :1], torch.zeros(batch, 0), sample_uniforms)
    assert torch.equal(empty.tokens[:, 0], result.tokens[:, 0]) and (empty.kinds == BONUS).all()


def test_draft_with_zero_q_at_the_drafted_token_is_rejected_without_nan():
    target = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])
    draft = torch.tensor([[[0.0, 1.0, 0.0]]])  # q(0) = 0 but token 0 is drafted
    result = verify(torch.tensor([[0]]), draft, target, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([0.99]))
    assert result.num_accepted.tolist() == [0] and result.kinds[0, 0] == RECOVERED
    assert result.tokens[0, 0] == 0  # the residual max(0, p - q) = [0.5, 0, 0] puts everything on token 0


# ----------------------------------------------------------------------------- greedy


def test_greedy_accepts_the_argmax_path():
    target = torch.tensor([[[0.1, 0.9, 0.0], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.0, 0.0, 1.0]]]).expand(3, -1, -1)
    drafts = torch.tensor([[1, 0, 2], [1, 1, 2], [0, 0, 2]])
    result = verify(drafts, None, target, None, None, strategy="greedy")
    assert result.tokens.tolist() == [[1, 0, 2, 2], [1, 0, PAD, PAD], [1, PAD, PAD, PAD]]
    assert result.kinds.tolist() == [
        [ACCEPTED, ACCEPTED, ACCEPTED, BONUS], [ACCEPTED, RECOVERED, PAD, PAD], [RECOVERED, PAD, PAD, PAD]
    ]


def test_greedy_speculative_decoding_equals_greedy_decoding():
    """A toy deterministic "model" (next-token logits from a table on the last two tokens), a draft that
    agrees with it part of the time; speculative greedy decoding reproduces greedy decoding token for token."""
    g = torch.Generator().manual_seed(14)
    vocab, gamma, length = 8, 3, 40
    target_table = torch.randn(vocab, vocab, vocab, generator=g)  # [prev2, prev1, vocab] logits
    draft_table = target_table + 0.7 * torch.randn(vocab, vocab, vocab, generator=g)

    def greedy_decode(prompt):
        sequence = list(prompt)
        while len(sequence) < len(prompt) + length:
            sequence.append(int(target_table[sequence[-2], sequence[-1]].argmax()))
        return sequence[len(prompt):]

    accepted_total, rejected_total = 0, 0
    for prompt in ([0, 1], [3, 3], [7, 2], [5, 0]):
        sequence = list(prompt)
        while len(sequence) < len(prompt) + length:
            drafted = list(sequence)
            for _ in range(gamma):
                drafted.append(int(draft_table[drafted[-2], drafted[-1]].argmax()))
            contexts = [drafted[len(sequence) + j - 2: len(sequence) + j] for j in range(gamma + 1)]
            target = torch.stack([probs_from_logits(target_table[a, b], 1.0) for a, b in contexts])  # [gamma+1, vocab]
            drafts = torch.tensor([drafted[len(sequence):]])  # [1, gamma]
            result = verify(drafts, None, target[None], None, None, strategy="greedy")
            accepted_total += int(result.num_accepted[0])
            rejected_total += int((result.kinds == RECOVERED).sum())
            sequence += result.tokens[0, : int(result.num_emitted[0])].tolist()
        assert sequence[len(prompt): len(prompt) + length] == greedy_decode(prompt)
    assert accepted_total > 0 and rejected_total > 0  # both paths were exercised


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_clear_errors():
    target, draft, tokens, au, su, _ = random_inputs(15, 4, 3, 5)
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        check_gamma(0)
    check_gamma(4)
    with pytest.raises(ValueError, match="strategy must be one of"):
        verify(tokens, draft, target, au, su, strategy="typical")
    with pytest.raises(ValueError, match=r"leniency must be in \(0, 1\]"):
        verify(tokens, draft, target, au, su, strategy="lenient", leniency=0.0)
    with pytest.raises(ValueError, match="only applies to strategy=lenient"):
        verify(tokens, draft, target, au, su, leniency=0.5)
    with pytest.raises(ValueError, match=r"target_probs must be \[batch, gamma \+ 1, vocab\]"):
        verify(tokens, draft, target[:, :3], au, su)
    with pytest.raises(ValueError, match="draft_probs must be"):
        verify(tokens, draft[:, :, :4], target, au, su)
    with pytest.raises(ValueError, match="accept_uniforms must be"):
        verify(tokens, draft, target, None, su)
    with pytest.raises(ValueError, match="num_drafts must be in"):
        verify(tokens, draft, target, au, su, num_drafts=torch.tensor([0, 1, 4, 2]))
    bad_tokens = tokens.clone()
    bad_tokens[2, 1] = 5
    with pytest.raises(ValueError, match=r"draft token 5 \(row 2, slot 1\)"):
        verify(bad_tokens, draft, target, au, su)


# ----------------------------------------------------------------------------- acceptance statistics


def test_acceptance_stats_counts():
    gamma = 3
    result = VerifyResult(
        num_accepted=torch.tensor([0, 2, 3]),
        tokens=torch.zeros(3, gamma + 1, dtype=torch.long),
        kinds=torch.zeros(3, gamma + 1, dtype=torch.long),
        num_emitted=torch.tensor([1, 3, 4]),
    )
    stats = AcceptanceStats()
    stats.update(result, gamma)
    summary = json.loads(json.dumps(stats.summary()))
    # draft 0 reached by 3 rows (2 accepted), draft 1 by 2 (2), draft 2 by 2 (1)
    assert summary["acceptance_per_position"] == pytest.approx([2 / 3, 1.0, 1 / 2])
    assert summary["alpha"] == pytest.approx(5 / 7)
    assert summary["acceptance_rate"] == pytest.approx(5 / 9)
    assert summary["mean_accepted_length"] == pytest.approx(5 / 3)
    assert summary["tokens_per_target_forward"] == pytest.approx(8 / 3)
    a = 5 / 7
    assert summary["theoretical_tokens_per_forward"] == pytest.approx((1 - a ** (gamma + 1)) / (1 - a))
    counts = [summary[k] for k in ("gamma", "num_target_forwards", "num_drafted", "num_accepted")]
    assert counts == [3, 3, 9, 5]

    merged = AcceptanceStats()
    merged.update(result, gamma)
    merged.merge(stats)
    twice = AcceptanceStats()
    twice.update(result, gamma)
    twice.update(result, torch.full((3,), gamma))
    assert merged.summary() == twice.summary() and twice.summary()["num_verify_calls"] == 2

    all_accepted = AcceptanceStats()
    all_accepted.update(VerifyResult(torch.tensor([3]), torch.zeros(1, 4), torch.zeros(1, 4), torch.tensor([4])), 3)
    assert all_accepted.summary()["theoretical_tokens_per_forward"] == 4.0  # a = 1 -> gamma + 1

    empty = AcceptanceStats().summary()
    assert empty["acceptance_rate"] is None and empty["theoretical_tokens_per_forward"] is None
    json.dumps(empty)


def test_acceptance_stats_theory_matches_measurement():
    """With i.i.d. acceptance (a deterministic draft whose token has p = 0.7 at every slot) the measured tokens
    per forward agrees with (1 - a^(gamma+1)) / (1 - a) = 2.77 (standard error ~0.01 for 20k rows)."""
    gamma, n = 4, 20_000
    p = torch.tensor([0.2, 0.7, 0.1])
    result = run_verify(p.expand(gamma + 1, -1), [1] * gamma, n, seed=16)
    stats = AcceptanceStats()
    stats.update(result, gamma)
    summary = stats.summary()
    assert summary["alpha"] == pytest.approx(0.7, abs=0.02)
    assert summary["acceptance_per_position"] == pytest.approx([0.7] * gamma, abs=0.04)
    assert summary["tokens_per_target_forward"] == pytest.approx(summary["theoretical_tokens_per_forward"], abs=0.06)
    assert summary["tokens_per_target_forward"] == pytest.approx((1 - 0.7**5) / 0.3, abs=0.06)
