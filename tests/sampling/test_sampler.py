"""End-to-end exactness of the batched sampler on tiny random models.

Statistical tests use fixed seeds; each chi-square test has a false-alarm rate of alpha = 1e-3
(the seeds are fixed, so a pass is reproducible; the rate says how unlucky a correct sampler would
have to be to fail one of them).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from rsft.sampling.drafts import ModelDraft, NgramDraft
from rsft.sampling.processing import probs_from_logits
from rsft.sampling.sampler import Sampler, SamplingSettings

ALPHA = 1e-3


def tiny_lm(vocab: int, seed: int, layers: int = 2, hidden: int = 16) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharpen the random logits a little so distributions are not near-uniform
        model.lm_head.weight.mul_(8.0)
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


def chi_square_against(joint: dict[tuple, float], samples: list[tuple]) -> float:
    keys = sorted(joint, key=lambda k: -joint[k])
    n = len(samples)
    expected = np.array([joint[k] * n for k in keys])
    counts = {k: 0 for k in keys}
    for s in samples:
        counts[s] += 1
    observed = np.array([counts[k] for k in keys], dtype=float)
    # merge the cells with expected count < 5 into one tail cell
    big = expected >= 5
    exp = np.append(expected[big], expected[~big].sum())
    obs = np.append(observed[big], observed[~big].sum())
    if exp[-1] < 5:  # fold a small tail into the last big cell
        exp[-2] += exp[-1]
        obs[-2] += obs[-1]
        exp, obs = exp[:-1], obs[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


PROMPTS = [[1, 2, 3, 4, 1], [2, 0]]


@pytest.mark.parametrize(
    "draft_kind,gamma,temperature,top_k",
    [("none", 0, 1.0, 0), ("model", 3, 1.0, 0), ("model", 2, 0.7, 4), ("ngram", 3, 1.0, 0)],
)
def test_joint_of_first_three_tokens_matches_enumeration(draft_kind, gamma, temperature, top_k):
    vocab, length, n = 5, 3, 3000
    target = tiny_lm(vocab, seed=0)
    settings = SamplingSettings(max_new_tokens=length, temperature=temperature, top_k=top_k, batch_rows=96,
                                gamma=gamma, adaptive=False)
    draft = {"none": None, "model": lambda: ModelDraft(tiny_lm(vocab, seed=1, layers=1)),
             "ngram": lambda: NgramDraft(max_ngram=2, min_ngram=1)}[draft_kind]
    sampler = Sampler(target, settings, eos_token_ids=[], draft=draft() if draft else None)
    completions = sampler.generate(PROMPTS, num_samples=n, seed=123, progress=False)
    for p, prompt in enumerate(PROMPTS):
        samples = [tuple(c.token_ids) for c in completions if c.prompt_index == p]
        assert len(samples) == n and all(len(s) == length for s in samples)
        pvalue = chi_square_against(exact_joint(target, prompt, length, settings), samples)
        assert pvalue > ALPHA, f"prompt {p}: chi-square p-value {pvalue:.2e}"
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


def test_adaptive_gamma_stops_speculating_when_the_draft_is_useless():
    target = tiny_lm(50, seed=0)
    settings = SamplingSettings(max_new_tokens=40, temperature=1.0, batch_rows=4, gamma=4, adaptive=True)

    class SlowDraft(ModelDraft):  # an unrelated random model that also takes 20 ms per proposal
        def propose(self, *args, **kwargs):
            time.sleep(0.02)
            return super().propose(*args, **kwargs)

    sampler = Sampler(target, settings, eos_token_ids=[], draft=SlowDraft(tiny_lm(50, seed=9, layers=1)))
    sampler.generate([[1, 2, 3]], num_samples=4, seed=0, progress=False)
    history = sampler.controller.history
    assert history.count(0) > len(history) / 2


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


def test_gamma_controller_counts_only_the_draft_slots_that_were_filled():
    from rsft.sampling.sampler import GammaController

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
