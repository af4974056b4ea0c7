"""End-to-end exactness of the batched sampler on tiny random models.

Statistical tests use fixed seeds; each chi-square test has a false-alarm rate of alpha = 1e-3
(the seeds are fixed, so a pass is reproducible; the rate says how unlucky a correct sampler would
have to be to fail one of them). Each chi-square test also checks its control's power: the same
samples against the policy at twice the temperature must be rejected, and before that the chance that
they would not be (from exact enumeration, detection_power) must be below MISS_RATE.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chi2, chisquare, ncx2
from transformers import LlamaConfig, LlamaForCausalLM

from rsft.sampling.proposers import FeatureDraft, ModelDraft, NgramDraft
from rsft.sampling.feature_model import FeatureDraftModel, feature_draft_config
from rsft.sampling.processing import probs_from_logits
from rsft.sampling.batched import GammaController, Sampler, SamplingSettings

ALPHA = 1e-3
MISS_RATE = 1e-6  # the most a control check may miss a wrong distribution by, by its computed power
WRONG_TEMPERATURE = 2.0  # the controls' wrong distribution: the policy at this factor on the temperature


def tiny_lm(vocab: int, seed: int, layers: int = 2, hidden: int = 16) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharpen the random logits a little so distributions are not near-uniform
        model.lm_head.weight.mul_(8.0)
    return model


def feature_draft(target, seed: int = 1, head_token_ids: list[int] | None = None) -> FeatureDraft:
    """An untrained feature draft for `target` (random layer; the target's embeddings and head)."""
    torch.manual_seed(seed)
    model = FeatureDraftModel(feature_draft_config(target.config, 1), target.get_input_embeddings().weight,
                              target.get_output_embeddings().weight, head_token_ids).eval()
    return FeatureDraft(model)


class SimulatedClock:
    """A clock that only moves when a model runs: each forward of a charged model costs
    base + per_token x (its packed tokens) simulated seconds. Costs are injected, never measured,
    so the controller's decisions do not depend on how busy the machine is."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charge(self, model, base: float, per_token: float):
        def advance(module, args, kwargs):
            self.now += base + per_token * kwargs["input_ids"].shape[-1]

        model.register_forward_pre_hook(advance, with_kwargs=True)
        return model


@torch.no_grad()
def exact_joint(model, prompt: list[int], length: int, settings: SamplingSettings) -> dict[tuple, float]:
    """P(first `length` tokens) by enumeration with full forward passes (no cache)."""
    vocab = model.config.vocab_size
    joint = {}
    for seq in itertools.product(range(vocab), repeat=length):
        ids = torch.tensor([prompt + list(seq)])
        logits = model(ids).logits[0, len(prompt) - 1:len(prompt) - 1 + length]  # [length, vocab]
        p = probs_from_logits(logits, settings.temperature, settings.top_k, settings.top_p)
        joint[seq] = float(torch.prod(p[torch.arange(length), torch.tensor(seq)]))
    return joint


def chi_square_cells(joint: dict[tuple, float], n: int) -> list[list[tuple]]:
    """chi_square_against's cells for n samples: each outcome with expected count >= 5 alone, the rest pooled into a
    tail cell, and a tail expected under 5 folded into the last cell before it."""
    keys = sorted(joint, key=lambda k: -joint[k])
    cells = [[k] for k in keys if joint[k] * n >= 5]
    tail = [k for k in keys if joint[k] * n < 5]
    if sum(joint[k] for k in tail) * n < 5:
        cells[-1] += tail
    else:
        cells.append(tail)
    return cells


def chi_square_against(joint: dict[tuple, float], samples: list[tuple]) -> float:
    n = len(samples)
    counts = {k: 0 for k in joint}
    for s in samples:
        counts[s] += 1  # a sample outside the enumeration is a KeyError: it cannot be an outcome
    cells = chi_square_cells(joint, n)
    obs = np.array([sum(counts[k] for k in cell) for cell in cells], dtype=float)
    exp = np.array([sum(joint[k] for k in cell) * n for cell in cells])
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def chi_square_power(expected: list[float], true: list[float], n: int, alpha: float) -> float:
    """P(Pearson's test of n samples against the cell probabilities `expected` rejects at `alpha`) when the samples
    come from the cell probabilities `true`: the statistic then follows about a noncentral chi-square with
    noncentrality n * sum((q - p)^2 / p)."""
    df = len(expected) - 1
    noncentrality = n * sum((q - p) ** 2 / p for p, q in zip(expected, true))
    return float(ncx2.sf(chi2.isf(alpha, df), df, noncentrality))


def detection_power(expected: dict[tuple, float], true: dict[tuple, float], n: int) -> float:
    """The power of chi_square_against(expected, n samples drawn from `true`) at ALPHA, over its own cells."""
    cells = chi_square_cells(expected, n)
    return chi_square_power([sum(expected[k] for k in c) for c in cells],
                            [sum(true.get(k, 0.0) for k in c) for c in cells], n, ALPHA)


def assert_a_wrong_temperature_is_caught(model, prompt: list[int], length: int, settings: SamplingSettings,
                                         right: dict[tuple, float], samples: list[tuple]) -> None:
    """The control: `samples` (drawn at `settings`, whose exact joint is `right`) tested against the policy at
    WRONG_TEMPERATURE x its temperature must be rejected, and the test must have the power to: a miss rate under
    MISS_RATE, computed from exact enumeration by the noncentral chi-square approximation."""
    wrong = exact_joint(model, prompt, length, dataclasses.replace(
        settings, temperature=settings.temperature * WRONG_TEMPERATURE))
    assert detection_power(wrong, right, len(samples)) > 1 - MISS_RATE
    assert chi_square_against(wrong, samples) < ALPHA


PROMPTS = [[1, 2, 3, 4, 1], [2, 0]]


@pytest.mark.parametrize(
    "draft_kind,gamma,temperature,top_k,top_p",
    [("none", 0, 1.0, 0, 1.0), ("model", 3, 1.0, 0, 1.0), ("model", 2, 0.7, 4, 1.0), ("ngram", 3, 1.0, 0, 1.0),
     ("feature", 3, 1.0, 0, 1.0), ("feature-head", 2, 0.7, 4, 1.0),
     # nucleus sampling: the draft's q and the policy's p both truncated to their own nucleus
     ("none", 0, 0.9, 0, 0.8), ("model", 3, 0.9, 0, 0.8), ("model", 2, 1.2, 3, 0.7)],
)
def test_joint_of_first_three_tokens_matches_enumeration(draft_kind, gamma, temperature, top_k, top_p):
    vocab, length, n = 5, 3, 3000
    target = tiny_lm(vocab, seed=0)
    settings = SamplingSettings(max_new_tokens=length, temperature=temperature, top_k=top_k, top_p=top_p,
                                batch_rows=96, gamma=gamma, adaptive=False)
    draft = {"none": None, "model": lambda: ModelDraft(tiny_lm(vocab, seed=1, layers=1)),
             "ngram": lambda: NgramDraft(max_ngram=2, min_ngram=1),
             "feature": lambda: feature_draft(target),
             # a head over 3 of the 5 tokens: q = 0 on the others, which are still emitted as often as p says
             "feature-head": lambda: feature_draft(target, head_token_ids=[0, 2, 3])}[draft_kind]
    sampler = Sampler(target, settings, eos_token_ids=[], draft=draft() if draft else None)
    completions = sampler.generate(PROMPTS, num_samples=n, seed=123, progress=False)
    for p, prompt in enumerate(PROMPTS):
        samples = [tuple(c.token_ids) for c in completions if c.prompt_index == p]
        assert len(samples) == n and all(len(s) == length for s in samples)
        right = exact_joint(target, prompt, length, settings)
        pvalue = chi_square_against(right, samples)
        assert pvalue > ALPHA, f"prompt {p}: chi-square p-value {pvalue:.2e}"
        assert_a_wrong_temperature_is_caught(target, prompt, length, settings, right, samples)
    if draft_kind != "none":
        assert sampler.stats.summary()["num_drafted"] > 0


EOS = 0  # the end-of-sequence token of the EOS cases: the tiny policy ends 22-50% of its 4-token completions with it


@torch.no_grad()
def exact_outcomes(model, prompt: list[int], length: int, settings: SamplingSettings) -> dict[tuple, float]:
    """P(how a completion of at most `length` tokens ends) by enumeration with full forward passes: (the tokens
    before EOS, "eos") for every place EOS can come, (the `length` tokens, "length") for the rest. Outcomes of
    probability 0 (outside top-k or top-p) are left out, so a sample of one is a KeyError in chi_square_against."""
    outcomes: dict[tuple, float] = {}

    def walk(prefix: list[int], prob: float) -> None:
        logits = model(torch.tensor([prompt + prefix])).logits[0, -1:]  # [1, vocab]
        p = probs_from_logits(logits, settings.temperature, settings.top_k, settings.top_p)[0]
        for token, q in enumerate(p.tolist()):
            if q == 0:
                continue
            if token == EOS:
                outcomes[(tuple(prefix), "eos")] = prob * q
            elif len(prefix) + 1 == length:
                outcomes[(tuple(prefix + [token]), "length")] = prob * q
            else:
                walk(prefix + [token], prob * q)

    walk([], 1.0)
    return outcomes


@pytest.mark.parametrize(
    "draft_kind,gamma,batch_rows,temperature,top_k,top_p,scripted",
    [("none", 0, 96, 0.9, 0, 1.0, False), ("model", 3, 7, 1.0, 0, 0.9, False), ("ngram", 3, 16, 0.6, 4, 1.0, False),
     ("feature", 3, 96, 0.8, 0, 1.0, False),
     # the adaptive controller's choices (0 = a plain step, catching the draft up later), scripted: every gamma it
     # may choose, in turn, with EOS and refills
     ("model", 3, 16, 0.9, 0, 1.0, True), ("ngram", 3, 8, 0.7, 0, 0.8, True)],
)
def test_completions_ending_at_eos_match_enumeration(draft_kind, gamma, batch_rows, temperature, top_k, top_p,
                                                     scripted):
    """Where EOS comes, and what comes before it, is distributed as plain sampling's: an accepted draft EOS ends the
    row and the drafts after it are dropped, a bonus or recovered EOS likewise, and the budget cuts no step. Each
    outcome (tokens before EOS, or all 4 tokens when none came) against its enumerated probability, with the same
    power-checked wrong-temperature control as the joint test. 4 tokens, so that a first step can draft all 3."""
    vocab, length, n = 5, 4, 3000
    target = tiny_lm(vocab, seed=0)
    settings = SamplingSettings(max_new_tokens=length, temperature=temperature, top_k=top_k, top_p=top_p,
                                batch_rows=batch_rows, gamma=gamma, adaptive=scripted)
    draft = {"none": lambda: None, "model": lambda: ModelDraft(tiny_lm(vocab, seed=1, layers=1)),
             "ngram": lambda: NgramDraft(max_ngram=2, min_ngram=1),
             "feature": lambda: feature_draft(target)}[draft_kind]
    sampler = Sampler(target, settings, eos_token_ids=[EOS], draft=draft())
    assert sampler.controller.gamma_max == gamma  # the budget lets a step draft every one of them
    if scripted:
        choices = itertools.cycle(range(gamma + 1))
        sampler.controller.choose = lambda: next(choices)
    completions = sampler.generate(PROMPTS, num_samples=n, seed=321, progress=False)
    for p, prompt in enumerate(PROMPTS):
        samples = [(tuple(c.token_ids), c.finish_reason) for c in completions if c.prompt_index == p]
        assert len(samples) == n
        right = exact_outcomes(target, prompt, length, settings)
        assert sum(q for (_, why), q in right.items() if why == "eos") > 0.1  # EOS is common enough to test
        pvalue = chi_square_against(right, samples)
        assert pvalue > ALPHA, f"prompt {p}: chi-square p-value {pvalue:.2e}"
        wrong = exact_outcomes(target, prompt, length, dataclasses.replace(
            settings, temperature=temperature * WRONG_TEMPERATURE))
        assert detection_power(wrong, right, n) > 1 - MISS_RATE
        assert chi_square_against(wrong, samples) < ALPHA
    if draft_kind != "none":
        assert sampler.stats.summary()["num_drafted"] > 0


def test_speculation_emits_more_than_one_token_per_forward_with_a_good_draft():
    target = tiny_lm(7, seed=0)
    settings = SamplingSettings(max_new_tokens=24, batch_rows=8, gamma=4, temperature=1.0)
    sampler = Sampler(target, settings, eos_token_ids=[], draft=ModelDraft(target))  # the target drafts for itself
    sampler.generate(PROMPTS, num_samples=4, seed=0, progress=False)
    summary = sampler.stats.summary()
    assert summary["acceptance_rate"] > 0.99  # p == q: every draft accepted
    assert summary["tokens_per_target_forward"] > 3


@torch.no_grad()
def greedy_reference(model, prompt: list[int], steps: int, eos: int | None) -> list[int]:
    ids = list(prompt)
    out = []
    for _ in range(steps):
        token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        if token == eos:
            break
        out.append(token)
        ids.append(token)
    return out


@pytest.mark.parametrize("draft_kind", ["none", "model", "ngram"])
def test_greedy_equals_greedy_decoding_with_continuous_batching(draft_kind):
    vocab = 11
    target = tiny_lm(vocab, seed=3)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 1, 2], [3], [2, 2, 2, 2, 2], [7, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
    # batch_rows=3 < 5 prompts x 2 samples: rows leave and join mid-way; eos=10 ends some early
    settings = SamplingSettings(max_new_tokens=20, temperature=1.0, strategy="greedy", batch_rows=3,
                                gamma=0 if draft_kind == "none" else 3)
    draft = {"none": None, "model": ModelDraft(tiny_lm(vocab, seed=4, layers=1)), "ngram": NgramDraft()}[draft_kind]
    completions = Sampler(target, settings, eos_token_ids=[10], draft=draft).generate(
        prompts, num_samples=2, seed=0, progress=False)
    for c in completions:
        expected = greedy_reference(target, prompts[c.prompt_index], 20, eos=10)
        assert c.token_ids == expected, f"prompt {c.prompt_index} sample {c.sample_idx}"
        assert c.finish_reason == ("length" if len(expected) == 20 else "eos")


def test_same_seed_same_output_and_different_seed_differs():
    target = tiny_lm(9, seed=0)
    settings = SamplingSettings(max_new_tokens=12, temperature=1.0, batch_rows=4, gamma=2)

    def run(seed):
        sampler = Sampler(target, settings, eos_token_ids=[0], draft=ModelDraft(tiny_lm(9, seed=5, layers=1)))
        return [c.token_ids for c in sampler.generate(PROMPTS, num_samples=3, seed=seed, progress=False)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_a_rows_randomness_does_not_depend_on_its_batch():
    target = tiny_lm(9, seed=0)
    outputs = []
    for batch_rows in (1, 6):
        settings = SamplingSettings(max_new_tokens=10, temperature=1.0, batch_rows=batch_rows)
        sampler = Sampler(target, settings, eos_token_ids=[0])
        outputs.append([c.token_ids for c in sampler.generate(PROMPTS, num_samples=3, seed=1, progress=False)])
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("draft_kind", ["model", "feature"])
def test_a_fixed_gamma_model_or_feature_draft_gives_the_same_completions_at_any_batch_rows(draft_kind):
    """EOS ends rows early, so rows near their own budget share batches with fresh ones: each row's
    gamma is capped by its own remaining budget, and it draws 2 gamma_r + 1 uniforms per step."""
    target = tiny_lm(9, seed=0)
    prompts = [[1, 2, 3, 4, 1], [2, 0], [5, 5, 6], [7]]
    outputs = []
    for batch_rows in (1, 3, 8):
        draft = ModelDraft(tiny_lm(9, seed=5, layers=1)) if draft_kind == "model" else feature_draft(target)
        settings = SamplingSettings(max_new_tokens=11, temperature=1.0, batch_rows=batch_rows, gamma=3)
        sampler = Sampler(target, settings, eos_token_ids=[2], draft=draft)
        completions = sampler.generate(prompts, num_samples=3, seed=4, progress=False)
        outputs.append([(c.token_ids, c.finish_reason) for c in completions])
        assert sampler.stats.summary()["num_drafted"] > 0
    assert {reason for _, reason in outputs[0]} == {"eos", "length"}  # both ways of ending occur
    assert outputs[0] == outputs[1] == outputs[2]


@pytest.mark.parametrize("draft_kind", ["none", "model"])
def test_a_completion_sampled_alone_equals_itself_inside_a_refilling_batch_of_64(draft_kind):
    """Batch invariance, the keyed uniforms' point: 160 completions run 64 at a time, rows leaving at EOS
    or at the budget and waiting ones taking their places mid-way; each of a spread of them, sampled
    again alone (batch_rows=1, only that prompt and sample index), gives the same tokens. (The packed
    forward's float rounding depends on the batch's shape; on this tiny sharpened model no draw falls
    within rounding of a boundary: docs/sampler.md.)"""
    target = tiny_lm(17, seed=0)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 17, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (40,), generator=g)]

    def sampler(batch_rows):
        draft = ModelDraft(tiny_lm(17, seed=5, layers=1)) if draft_kind == "model" else None
        settings = SamplingSettings(max_new_tokens=24, temperature=1.0, batch_rows=batch_rows, gamma=3 if draft else 0)
        return Sampler(target, settings, eos_token_ids=[3], draft=draft)

    together = sampler(64).generate(prompts, num_samples=4, seed=9, progress=False)
    assert {c.finish_reason for c in together} == {"eos", "length"}  # rows leave at both, so others refill
    for c in together[::7]:
        alone = sampler(1).generate([prompts[c.prompt_index]], num_samples=1, seed=9, progress=False,
                                    prompt_indices=[c.prompt_index], sample_ranges=[range(c.sample_idx, c.sample_idx + 1)])
        assert (alone[0].token_ids, alone[0].finish_reason) == (c.token_ids, c.finish_reason), (c.prompt_index, c.sample_idx)


@pytest.mark.parametrize("draft_kind", ["none", "model"])
def test_recorded_entropy_is_the_entropy_of_each_kept_tokens_distribution(draft_kind):
    """record_entropy sums, over the tokens a completion keeps (not its EOS), the entropy of the processed
    distribution each was drawn from: a full forward of the completion's context gives the same, plain or
    speculative (an accepted draft is distributed as p at its position)."""
    target = tiny_lm(9, seed=0)
    draft = ModelDraft(tiny_lm(9, seed=5, layers=1)) if draft_kind == "model" else None
    settings = SamplingSettings(max_new_tokens=7, temperature=0.8, top_k=5, batch_rows=4, gamma=2 if draft else 0)
    completions = Sampler(target, settings, eos_token_ids=[2], draft=draft, record_entropy=True).generate(
        PROMPTS, num_samples=3, seed=1, progress=False)
    for c in completions:
        context = PROMPTS[c.prompt_index] + c.token_ids
        with torch.no_grad():
            logits = target(torch.tensor([context])).logits[0, len(PROMPTS[c.prompt_index]) - 1:len(context) - 1]
        p = probs_from_logits(logits, 0.8, 5)  # [kept tokens, vocab]
        assert c.entropy_sum == pytest.approx(float(-torch.special.xlogy(p, p).sum()), rel=1e-4, abs=1e-5)
    assert Sampler(target, settings, eos_token_ids=[2], draft=draft).generate(
        PROMPTS, num_samples=1, seed=1, progress=False)[0].entropy_sum is None  # not recorded unless asked


def test_ngram_proposals_depend_on_the_batch_but_the_distribution_does_not():
    """The n-gram draft looks up the sibling completions sampled so far, and how far a sibling has
    got depends on which rows ran together: the same seed gives other proposals (hence other
    acceptance draws, other completions) at another batch_rows. Each completion is still an exact
    sample (test_joint_of_first_three_tokens_matches_enumeration, with batch_rows=96)."""
    target = tiny_lm(9, seed=0)
    drafted = []
    for batch_rows in (1, 8):
        settings = SamplingSettings(max_new_tokens=16, temperature=1.0, batch_rows=batch_rows, gamma=2)
        sampler = Sampler(target, settings, eos_token_ids=[], draft=NgramDraft(max_ngram=2, min_ngram=1))
        completions = sampler.generate([[1, 2, 3, 1, 2, 3]], num_samples=4, seed=2, progress=False)
        drafted.append([c.num_drafted for c in completions])
    # batch_rows=1: each completion runs alone, after its siblings finished: it finds more matches
    assert drafted[0] != drafted[1]


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_a_call_starts_from_a_fresh_draft_so_the_second_shard_is_the_one_a_fresh_sampler_draws(kind):
    """Each generate() call numbers its prompts from 0 (one shard of a run, or adaptive K's second pass): a draft
    that kept an earlier call's rows (the n-gram draft kept every call's; a model draft keeps those of a call that
    was interrupted) would draft the new prompt 0 from the old one's text or cache. The second call's completions
    and drafts must be those of a sampler that never ran the first."""
    target = tiny_lm(9, seed=0)
    settings = SamplingSettings(max_new_tokens=12, temperature=1.0, batch_rows=8, gamma=2)
    build = {"ngram": lambda: NgramDraft(max_ngram=2, min_ngram=1),
             "model": lambda: ModelDraft(tiny_lm(9, seed=5, layers=1))}
    first, second = [[1, 2, 3, 1, 2, 3]], [[4, 5, 6, 4, 5, 6, 4]]

    def drawn(sampler):
        out = sampler.generate(second, num_samples=4, seed=3, progress=False, prompt_indices=[1])
        return [(c.token_ids, c.num_drafted, c.num_accepted) for c in out]

    for interrupted in (False, True):
        reused = Sampler(target, settings, eos_token_ids=[], draft=build[kind]())
        if interrupted:  # the first call stops mid-way, its rows still in the draft
            propose, calls = reused.draft.propose, []

            def failing(*args):
                calls.append(1)
                if len(calls) == 3:
                    raise KeyboardInterrupt
                return propose(*args)

            reused.draft.propose = failing
            with pytest.raises(KeyboardInterrupt):
                reused.generate(first, num_samples=4, seed=3, progress=False, prompt_indices=[0])
            reused.draft.propose = propose
        else:
            reused.generate(first, num_samples=4, seed=3, progress=False, prompt_indices=[0])
        fresh = Sampler(target, settings, eos_token_ids=[], draft=build[kind]())
        assert drawn(reused) == drawn(fresh), f"interrupted={interrupted}"
    assert any(drafted for _, drafted, _ in drawn(fresh))  # the draft did propose


def test_a_gamma_past_the_token_budget_drafts_what_the_budget_allows_and_sizes_nothing_for_the_rest():
    """A step drafts at most a row's tokens left less one, so gamma 64 with 3 new tokens samples as gamma 2 does,
    token for token, and the sampler's buffers and fixed-shape step are sized for 2, not 64."""
    target = tiny_lm(9, seed=0)
    out = {}
    for gamma in (2, 64):
        settings = SamplingSettings(max_new_tokens=3, temperature=1.0, batch_rows=8, gamma=gamma)
        sampler = Sampler(target, settings, eos_token_ids=[], draft=ModelDraft(tiny_lm(9, seed=5, layers=1)))
        assert sampler.controller.gamma_max == 2
        out[gamma] = [(c.token_ids, c.num_drafted) for c in sampler.generate(PROMPTS, 4, seed=7, progress=False)]
    assert out[2] == out[64]


def test_adaptive_gamma_depends_on_the_measured_costs_so_completions_do_too():
    """With draft.adaptive, gamma follows measured time: the same seed under other costs chooses
    other gammas (and draws other uniforms). Costs are injected here; on a real machine they are the
    wall clock, so adaptive runs are reproducible in distribution, not token for token."""
    target = tiny_lm(9, seed=0)
    histories = []
    for draft_cost in (0.001, 0.2):
        clock = SimulatedClock()
        clock.charge(target, base=0.01, per_token=0.001)
        draft_model = clock.charge(tiny_lm(9, seed=5, layers=1), base=draft_cost, per_token=0.0)
        settings = SamplingSettings(max_new_tokens=24, temperature=1.0, batch_rows=4, gamma=3, adaptive=True)
        sampler = Sampler(target, settings, eos_token_ids=[], draft=ModelDraft(draft_model), clock=clock)
        sampler.generate(PROMPTS, num_samples=2, seed=0, progress=False)
        histories.append(sampler.controller.history)
    assert histories[0] != histories[1]


def test_adaptive_gamma_stops_speculating_when_the_draft_is_useless():
    target = tiny_lm(50, seed=0)
    clock = SimulatedClock()
    clock.charge(target, base=0.010, per_token=0.001)
    # an unrelated random model (rarely accepted) whose every forward costs 20 ms
    slow = clock.charge(tiny_lm(50, seed=9, layers=1), base=0.020, per_token=0.0)
    settings = SamplingSettings(max_new_tokens=40, temperature=1.0, batch_rows=4, gamma=4, adaptive=True)
    sampler = Sampler(target, settings, eos_token_ids=[], draft=ModelDraft(slow), clock=clock)
    sampler.generate([[1, 2, 3]], num_samples=4, seed=0, progress=False)
    history = sampler.controller.history
    assert history.count(0) > len(history) / 2


def test_adaptive_gamma_speculates_when_the_draft_pays():
    target = tiny_lm(9, seed=0)
    clock = SimulatedClock()
    clock.charge(target, base=0.010, per_token=0.001)
    # the target drafting for itself (every draft accepted) at a tenth of its cost per forward
    twin = clock.charge(tiny_lm(9, seed=0), base=0.001, per_token=0.0)
    settings = SamplingSettings(max_new_tokens=40, temperature=1.0, batch_rows=4, gamma=3, adaptive=True)
    sampler = Sampler(target, settings, eos_token_ids=[], draft=ModelDraft(twin), clock=clock)
    sampler.generate(PROMPTS, num_samples=2, seed=0, progress=False)
    history = sampler.controller.history
    assert sum(history) / len(history) > 2
    assert sampler.stats.summary()["tokens_per_target_forward"] > 2.5


def test_the_catch_up_after_plain_steps_is_not_charged_to_the_draft_tokens():
    """After plain steps the draft has the policy's tokens to catch up on (a model draft: one forward
    over all of them). That is the price of switching back, paid once; it used to be measured as
    part of the next proposal, so a probe at gamma=1 after 16 plain steps looked 16x too costly
    per draft token and kept gamma at 0."""
    target = tiny_lm(9, seed=0)
    clock = SimulatedClock()
    clock.charge(target, base=0.010, per_token=0.001)
    # the draft's forward costs 1 ms plus 10 ms per token fed: a catch-up over many tokens is dear
    draft_model = clock.charge(tiny_lm(9, seed=5, layers=1), base=0.001, per_token=0.010)
    settings = SamplingSettings(max_new_tokens=30, temperature=1.0, batch_rows=2, gamma=1, adaptive=True)
    sampler = Sampler(target, settings, eos_token_ids=[], draft=ModelDraft(draft_model), clock=clock)
    script = iter([0] * 12 + [1] * 100)  # 12 plain steps, then drafting at gamma=1
    sampler.controller.choose = lambda: next(script)
    sampler.generate([[1, 2, 3]], num_samples=2, seed=0, progress=False)
    # one catch-up over the 12 tokens each row emitted meanwhile (2 rows): 1 ms + 24 x 10 ms
    assert sampler.timings["draft_catch_up_seconds"] == pytest.approx(0.001 + 0.24)
    # a proposal at gamma=1 feeds 1 or 2 tokens per row (last, and the previous draft when it was
    # accepted): 1 ms + 2-4 x 10 ms per draft token, nothing of the catch-up's 241 ms
    assert 0.021 - 1e-9 <= sampler.controller.draft_seconds <= 0.041 + 1e-9


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=0.0), "top_p"),
        (dict(gamma=0), "gamma"),
    ],
)
def test_bad_settings_are_named(settings, message):
    target = tiny_lm(5, seed=0)
    with pytest.raises(ValueError, match=message):
        Sampler(target, SamplingSettings(**{"max_new_tokens": 48, "temperature": 1.0, "batch_rows": 16, "gamma": 2, **settings}), eos_token_ids=[], draft=NgramDraft())


def test_nan_logits_name_the_row():
    target = tiny_lm(5, seed=0)
    with torch.no_grad():
        target.lm_head.weight[2, 0] = float("nan")
    sampler = Sampler(target, SamplingSettings(max_new_tokens=3, temperature=1.0, batch_rows=16), eos_token_ids=[])
    with pytest.raises(ValueError, match="prompt 0"):
        sampler.generate([[1, 2]], num_samples=1, seed=0, progress=False)


def test_gamma_controller_measures_a_plain_step_first_and_judges_drafts_against_it():
    """At 64 rows on a CPU a verified position costs about half a plain step; the prior slope (0.3)
    said less, so before a plain step was measured a 0.43-accepted draft looked worth it and the
    controller speculated until its first probe. Now its first step is plain; with both costs
    measured it stops where verification eats the gain and keeps going where it does not."""
    for cost_of_one_more_position, speculates in ((1.5, False), (1.05, True)):  # compute- / latency-bound
        controller = GammaController(gamma_max=2, adaptive=True)
        assert controller.choose() == 0
        controller.observe(0, 0, 0, target_s=1.0, draft_s=0.0, rows=64)
        gamma = controller.choose()
        assert gamma == 1  # the prior acceptance (0.5) against the measured plain cost: try drafting
        # every row drafted 1, 43% were accepted; the draft costs 3% of a plain step per token
        controller.observe(1, drafted=64, accepted=27, target_s=cost_of_one_more_position, draft_s=0.03, rows=64)
        assert (controller.choose() > 0) == speculates


def test_gamma_controller_counts_only_the_draft_slots_that_were_filled():
    sparse = GammaController(gamma_max=2, adaptive=True)
    sparse.observe(0, 0, 0, target_s=1.0, draft_s=0.0, rows=16)
    # 3 of 16 x 2 slots filled, 2 accepted; the packed forward cost 5% more than a plain one
    sparse.observe(2, drafted=3, accepted=2, target_s=1.05, draft_s=0.0, rows=16)
    assert abs(sparse.coverage - 3 / 32) < 1e-9
    assert sparse.expected_rate(2) > sparse.expected_rate(0)  # 1 + (3/32)(2/3 + 4/9) tokens for 1.05x
    # asked for drafts, none found: an empty step lowers the coverage, the draft's time still counts
    sparse.observe(0, 0, 0, target_s=1.0, draft_s=0.2, rows=16, asked=2)
    assert sparse.coverage < 3 / 32 and sparse.draft_seconds > 0

    dense = GammaController(gamma_max=2, adaptive=True)
    dense.observe(0, 0, 0, target_s=1.0, draft_s=0.0, rows=16)
    dense.observe(2, drafted=32, accepted=3, target_s=1.5, draft_s=0.0, rows=16)  # full, rarely accepted
    assert max(range(3), key=dense.expected_rate) == 0
