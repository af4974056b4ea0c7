"""On a GPU: the sampler and its cache on CUDA agree with the CPU (`pytest -m gpu`; scripts/gpu_check.sh).

Every test here is marked `gpu` and skips where CUDA is absent (CI has none). RSFT_GPU_TEST_DEVICE=cpu runs
them on the CPU instead, to check the tests themselves without a GPU (then they compare the CPU with itself).

Tokens are compared token for token: a completion's uniforms are keyed counter-based draws computed
alike on any device (rsft.sampling.keyed_random), so CPU and CUDA draw the same uniforms, and only float
rounding differs (CUDA's matmul and attention kernels sum in another order). A draw that falls within
rounding of a boundary between two tokens can flip, and the completion goes its own way from there
(the caveat of rsft.sampling.batched's docstring): at most one completion in the comparisons below may
differ, at fp32 with ~1e-7 boundaries that is about a 1e-3 chance per test.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rsft.models import seeded
from rsft.sampling.proposers import ModelDraft
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.batched import Sampler, SamplingSettings
from tests.test_bench_sampling import load_script

DEVICE = torch.device(os.environ.get("RSFT_GPU_TEST_DEVICE", "cuda"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def tiny_llama(vocab: int = 96, seed: int = 0, layers: int = 2, sharpen: float = 1.0) -> LlamaForCausalLM:
    """A random Llama on the CPU, fp32; sharpen scales the head so its distributions are peaked (logits of a
    few units instead of ~0.1: samples that follow the model rather than noise)."""
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with seeded(seed):
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model.eval()


def prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (count,), generator=generator).tolist()  # ragged: rows of different lengths
    return [torch.randint(4, vocab, (n,), generator=generator).tolist() for n in lengths]


def sample(model, settings: SamplingSettings, eos: list[int], draft=None, k: int = 3, seed: int = 0):
    sampler = Sampler(model, settings, eos, draft=draft)
    done = sampler.generate(prompts(5, model.config.vocab_size), k, seed, progress=False)
    return [c.token_ids for c in done], [c.finish_reason for c in done], sampler.summary()


def differing(a: list[list[int]], b: list[list[int]]) -> int:
    assert len(a) == len(b)
    return sum(x != y for x, y in zip(a, b))


def test_plain_sampling_on_cuda_gives_the_cpus_tokens():
    cpu = tiny_llama(sharpen=40.0)
    gpu = copy.deepcopy(cpu).to(DEVICE)
    # 6 rows for 15 completions: rows finish (EOS 3 or the budget) and the next take their cache rows
    settings = SamplingSettings(max_new_tokens=24, temperature=0.8, batch_rows=6)
    free, _, _ = sample(cpu, settings, eos=[])
    # the EOS: a token that about half the completions sample, so that some end on it and some run out
    eos = min(range(4, cpu.config.vocab_size), key=lambda t: abs(sum(t in c for c in free) - len(free) / 2))
    tokens_cpu, reasons_cpu, _ = sample(cpu, settings, eos=[eos])
    tokens_gpu, reasons_gpu, _ = sample(gpu, settings, eos=[eos])
    assert differing(tokens_cpu, tokens_gpu) <= 1, (tokens_cpu, tokens_gpu)
    assert sum(a == b for a, b in zip(reasons_cpu, reasons_gpu)) >= len(reasons_cpu) - 1
    assert "eos" in reasons_gpu and "length" in reasons_gpu  # both ends exercised


@pytest.mark.parametrize("top_k,top_p,dtype,draft", [(0, 1.0, torch.float32, None), (5, 0.9, torch.float32, None),
                                                     (0, 1.0, torch.bfloat16, None), (0, 1.0, torch.float32, "model"),
                                                     (5, 0.9, torch.bfloat16, "oracle")])
def test_the_cuda_graph_replays_the_fixed_shape_steps_tokens(top_k, top_p, dtype, draft):
    """sample.cuda_graphs=auto (on CUDA: each step width captured once, replayed every step) against eager (the
    same fixed-shape steps run op by op): the same kernels, so the same tokens and entropies; rows refill (6 rows
    for 15 completions, EOS and the budget both end rows); with a model draft (its probabilities go into the
    graph) and the oracle draft (one-hot) at gamma 3, whose widths narrow as rows near their budget."""
    model = tiny_llama(sharpen=20.0).to(DEVICE, dtype)
    runs, replays = {}, {}
    captured = "auto" if DEVICE.type == "cuda" else "eager"  # (a CPU, checking the test itself: eager twice)
    for mode in (captured, "eager"):
        settings = SamplingSettings(max_new_tokens=24, temperature=0.8, top_k=top_k, top_p=top_p, batch_rows=6,
                                    cuda_graphs=mode, gamma=3 if draft else 0)
        proposer = None
        if draft == "model":
            proposer = ModelDraft(tiny_llama(seed=1, layers=1, sharpen=20.0).to(DEVICE, dtype))
        elif draft == "oracle":
            proposer = load_script().OracleDraft(5)
        sampler = Sampler(model, settings, [3], record_entropy=True, draft=proposer)
        done = sampler.generate(prompts(5, model.config.vocab_size), 3, 0, progress=False)
        runs[mode] = [(c.token_ids, c.finish_reason) for c in done]
        runs[mode + " entropy"] = [c.entropy_sum for c in done]
        replays[mode] = (sampler._fixed.captured > 0, sampler._fixed.replays)
        assert sampler._fixed.graphs == {}  # released when generate() returned
        assert draft is None or sampler.summary()["num_drafted"] > 0
    assert differing(runs[captured], runs["eager"]) <= 1, runs
    if differing(runs[captured], runs["eager"]) == 0:
        assert runs[captured + " entropy"] == pytest.approx(runs["eager entropy"], rel=1e-4, abs=1e-5)
    assert replays[captured][0] == (DEVICE.type == "cuda") and replays[captured][1] > 10  # captured, and replayed
    assert replays["eager"][0] is False


def test_speculative_sampling_with_a_model_draft_on_cuda_gives_the_cpus_tokens():
    """A model draft at a fixed gamma is batch-invariant: on CUDA the verification runs the fixed
    [rows, 1 + gamma] shape, padding included, on the CPU only the real tokens; same tokens either way."""
    policy, draft = tiny_llama(sharpen=20.0), tiny_llama(seed=1, layers=1, sharpen=20.0)
    settings = SamplingSettings(max_new_tokens=20, temperature=0.8, batch_rows=6, gamma=3)
    cpu_tokens, _, cpu_summary = sample(policy, settings, [3], draft=ModelDraft(draft))
    gpu_policy, gpu_draft = copy.deepcopy(policy).to(DEVICE), copy.deepcopy(draft).to(DEVICE)
    gpu_tokens, _, gpu_summary = sample(gpu_policy, settings, [3], draft=ModelDraft(gpu_draft))
    assert differing(cpu_tokens, gpu_tokens) <= 1, (cpu_tokens, gpu_tokens)
    assert gpu_summary["num_drafted"] > 0 and 0 <= gpu_summary["alpha"] <= 1
    if differing(cpu_tokens, gpu_tokens) == 0:
        assert gpu_summary["num_accepted"] == cpu_summary["num_accepted"]


def test_the_oracle_draft_on_cuda_is_accepted_at_the_set_rate():
    bench = load_script()
    model = tiny_llama(sharpen=5.0).to(DEVICE)
    a, gamma, token, temperature = 0.8, 3, 1, 0.7
    settings = SamplingSettings(max_new_tokens=32, temperature=temperature, batch_rows=16, gamma=gamma)
    with bench.peaked_head(model, token, a, temperature):
        sampler = Sampler(model, settings, [], draft=bench.OracleDraft(token))
        done = sampler.generate(prompts(8, model.config.vocab_size), 4, 0, progress=False)
    reached = sum(sampler.stats.reached_at)
    alpha = sampler.summary()["alpha"]
    assert reached > 300 and abs(alpha - a) < 4 * math.sqrt(a * (1 - a) / reached), (alpha, reached)
    assert all(len(c.token_ids) == 32 for c in done)


@torch.no_grad()
def test_kv_batch_on_cuda_gives_the_logits_of_a_full_forward():
    model = tiny_llama().to(DEVICE)
    vocab = model.config.vocab_size
    batch = KVBatch(model)
    given = prompts(3, vocab, seed=2)
    batch.admit([p[:-1] for p in given], [2, 1, 2])  # 5 rows: two prompts shared by two rows each
    histories = [given[0][:-1]] * 2 + [given[1][:-1]] + [given[2][:-1]] * 2
    generator = torch.Generator().manual_seed(3)
    checked = 0
    for step in range(6):
        n = 1 if step % 2 == 0 else 3  # a plain step (every slot real, nothing read back), then a masked one
        ids = torch.randint(4, vocab, (5, n), generator=generator)
        valid = None if n == 1 else torch.arange(n)[None, :] < torch.tensor([1, 3, 2, 3, 1])[:, None]
        logits = batch.forward(ids.to(DEVICE), None if valid is None else valid.to(DEVICE))  # [5, n, vocab]
        width = [n] * 5 if valid is None else valid.sum(1).tolist()
        for r in range(5):
            fed = ids[r, :width[r]].tolist()
            expected = model(torch.tensor([histories[r] + fed], device=DEVICE)).logits[0, -len(fed):]
            torch.testing.assert_close(logits[r, :len(fed)], expected.float(), atol=1e-4, rtol=1e-4)
            checked += 1
        keep = torch.tensor([max(1, w - 1) for w in width])  # a rejected draft dropped where there was one
        batch.commit(keep.to(DEVICE))
        histories = [h + ids[r, :int(keep[r])].tolist() for r, h in enumerate(histories)]
    assert checked == 30


def test_bfloat16_plain_sampling_runs_on_cuda():
    bench = load_script()
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    model = bench.random_policy(config, DEVICE, torch.bfloat16, seed=0)
    settings = SamplingSettings(max_new_tokens=16, temperature=0.7, batch_rows=8)
    tokens, reasons, _ = sample(model, settings, [])
    assert all(len(t) == 16 and all(0 <= x < 96 for x in t) for t in tokens) and set(reasons) == {"length"}


def test_the_sampling_bench_runs_on_the_device(tmp_path, capsys):
    bench = load_script()
    LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256).save_pretrained(tmp_path)
    common = ["--policy-config", str(tmp_path), "--device", str(DEVICE), "--batch-rows", "8", "--prompts", "4",
              "--k", "2", "--max-new-tokens", "8", "--repeats", "1", "--temperature", "0.7"]
    bench.main([*common, "--methods", "hf", "plain", "packed", "oracle", "--acceptance", "0.8", "--gammas", "3",
                "--ceiling"])
    out = capsys.readouterr().out
    assert "| 8 | oracle a=0.8 g=3 |" in out and "| 8 | packed |" in out and "share of ceiling" in out
    if DEVICE.type == "cuda":
        assert "CUDA max allocated" in out
    bench.main([*common, "--step-profile"])
    assert "outside it, ms per step" in capsys.readouterr().out
