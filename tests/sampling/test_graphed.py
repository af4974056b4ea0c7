"""The fixed-shape plain step (rsft.sampling.graphed): on a CPU it runs uncaptured (sample.cuda_graphs=eager), the
same arithmetic a CUDA graph replays; here it is checked against the packed step and against enumeration.
(tests/test_gpu.py checks the captured graph against this step on CUDA.)"""

from __future__ import annotations

import pytest
import torch

from rsft.sampling.graphed import FixedShapeStep, graphs_apply
from rsft.sampling.proposers import ModelDraft, NgramDraft
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.batched import Sampler, SamplingSettings
from tests.sampling.test_sampler import (
    ALPHA,
    PROMPTS,
    assert_a_wrong_temperature_is_caught,
    chi_square_against,
    exact_joint,
    tiny_lm,
)


def make_draft(kind: str, vocab: int):
    """none, a model draft (its own probabilities) or the n-gram draft (one-hot): each verification width is
    its own graph, with or without the draft's probabilities."""
    return {"none": None, "model": ModelDraft(tiny_lm(vocab, seed=5, layers=1)) if kind == "model" else None,
            "ngram": NgramDraft(max_ngram=2, min_ngram=1)}[kind]


def ragged_prompts(count: int, vocab: int, seed: int = 5) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (count,), generator=g)]


@pytest.mark.parametrize("top_k,top_p,strategy,draft", [(0, 1.0, "exact", "none"), (5, 0.9, "exact", "none"),
                                                        (0, 1.0, "greedy", "none"), (0, 1.0, "exact", "model"),
                                                        (5, 0.9, "exact", "ngram")])
def test_the_fixed_shape_step_gives_the_packed_steps_completions(top_k, top_p, strategy, draft):
    """160 completions, 64 rows at a time, rows leaving at EOS or the budget and others taking their cache rows:
    every buffer row computed each step (free ones included; with a draft, every row at the step's widest
    [1 + gamma]) changes no running row's tokens or entropy."""
    target = tiny_lm(17, seed=0)
    prompts = ragged_prompts(40, 17)
    runs = {}
    for mode in ("off", "eager"):
        settings = SamplingSettings(max_new_tokens=24, temperature=0.9, top_k=top_k, top_p=top_p, strategy=strategy,
                                    batch_rows=64, cuda_graphs=mode, gamma=0 if draft == "none" else 3)
        sampler = Sampler(target, settings, eos_token_ids=[3], record_entropy=True, draft=make_draft(draft, 17))
        done = sampler.generate(prompts, num_samples=4, seed=9, progress=False)
        runs[mode] = [(c.token_ids, c.finish_reason, c.num_target_forwards, c.num_drafted, c.num_accepted)
                      for c in done]
        entropy = [c.entropy_sum for c in done]
        runs[mode + " entropy"] = entropy
        assert (sampler._fixed is not None) == (mode == "eager")
        if mode == "eager":
            assert sampler._fixed.replays == sampler.summary()["num_verify_calls"] > 0
    if strategy != "greedy":  # (greedy decoding of this policy never meets the EOS)
        assert {run[1] for run in runs["off"]} == {"eos", "length"}
    assert runs["off"] == runs["eager"]
    assert runs["eager entropy"] == pytest.approx(runs["off entropy"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("temperature,top_k,draft", [(1.0, 0, "none"), (0.7, 4, "none"), (0.7, 4, "model"),
                                                      (1.0, 0, "ngram")])
def test_the_fixed_shape_step_samples_the_policys_joint_distribution(temperature, top_k, draft):
    vocab, length, n = 5, 3, 3000
    target = tiny_lm(vocab, seed=0)
    settings = SamplingSettings(max_new_tokens=length, temperature=temperature, top_k=top_k, batch_rows=96,
                                cuda_graphs="eager", gamma=0 if draft == "none" else 3)
    sampler = Sampler(target, settings, eos_token_ids=[], draft=make_draft(draft, vocab))
    completions = sampler.generate(PROMPTS, num_samples=n, seed=123, progress=False)
    assert draft == "none" or sampler.summary()["num_drafted"] > 0
    for p, prompt in enumerate(PROMPTS):
        samples = [tuple(c.token_ids) for c in completions if c.prompt_index == p]
        assert len(samples) == n
        right = exact_joint(target, prompt, length, settings)
        pvalue = chi_square_against(right, samples)
        assert pvalue > ALPHA, f"prompt {p}: chi-square p-value {pvalue:.2e}"
        # the control: the same samples against the policy at another temperature are rejected
        assert_a_wrong_temperature_is_caught(target, prompt, length, settings, right, samples)


@pytest.mark.parametrize("draft", ["none", "model"])
def test_a_completion_alone_equals_itself_in_a_refilling_fixed_shape_batch(draft):
    """Batch invariance through the fixed-shape step: its forward runs every buffer row of a 64-row cache, and a
    completion sampled alone (a 1-row cache) gives the same tokens; with a model draft at a fixed gamma too."""
    target = tiny_lm(17, seed=0)
    prompts = ragged_prompts(40, 17)

    def sampler(batch_rows):
        settings = SamplingSettings(max_new_tokens=24, temperature=1.0, batch_rows=batch_rows, cuda_graphs="eager",
                                    gamma=0 if draft == "none" else 3)
        return Sampler(target, settings, eos_token_ids=[3], draft=make_draft(draft, 17))

    together = sampler(64).generate(prompts, num_samples=4, seed=9, progress=False)
    for c in together[::7]:
        alone = sampler(1).generate([prompts[c.prompt_index]], num_samples=1, seed=9, progress=False,
                                    prompt_indices=[c.prompt_index], sample_ranges=[range(c.sample_idx, c.sample_idx + 1)])
        assert (alone[0].token_ids, alone[0].finish_reason) == (c.token_ids, c.finish_reason), (c.prompt_index, c.sample_idx)


def test_nan_logits_name_the_row_in_the_fixed_shape_step():
    target = tiny_lm(5, seed=0)
    with torch.no_grad():
        target.lm_head.weight[2, 0] = float("nan")
    settings = SamplingSettings(max_new_tokens=3, temperature=1.0, batch_rows=16, cuda_graphs="eager")
    with pytest.raises(ValueError, match="NaN or inf for 1 of 1 rows \\(prompt 0 sample 0\\)"):
        Sampler(target, settings, eos_token_ids=[]).generate([[1, 2]], num_samples=1, seed=0, progress=False)


def test_which_step_runs_where():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert graphs_apply("auto", cpu, False) == (False, False)  # a CPU packs only the real tokens
    assert graphs_apply("auto", cuda, False) == (True, True)
    assert graphs_apply("eager", cpu, False) == (True, False)
    assert graphs_apply("auto", cuda, True) == (False, False)  # a feature draft's batch records features
    assert graphs_apply("off", cuda, False) == (False, False)
    with pytest.raises(ValueError, match="sample.cuda_graphs='always': expected one of auto, eager, off"):
        graphs_apply("always", cpu, False)
    with pytest.raises(ValueError, match="sample.cuda_graphs"):
        SamplingSettings(max_new_tokens=4, temperature=1.0, batch_rows=2, cuda_graphs="on").check()


def test_a_step_is_bound_to_the_cache_it_was_made_for():
    """A graph records the cache buffers' addresses: once an admission grows the cache, the step no longer fits
    and the sampler makes a new one."""
    batch = KVBatch(tiny_lm(7, seed=0))
    batch.reserve(2, 16)
    step = FixedShapeStep(batch, 1.0, 0, 1.0, "exact", 1.0, record_entropy=False, capture=False)
    assert step.fits()
    batch.admit([[1, 2], [3]], [1, 2])  # three rows for a cache of two: it grows
    assert batch.buffer_rows == 3 and not step.fits()
