"""scripts/bench_sampling.py's speed model: the acceptance a draft needs, from measured forward costs."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("bench_sampling", REPO / "scripts" / "bench_sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_acceptance_needed_inverts_the_speedup_model():
    bench = load_script()
    plain, verify, draft = 0.100, 0.150, 0.05  # a step, a step with every row verifying one draft token
    # a draft that is never right: one token per step at 1.5 + 0.05 steps' cost
    assert bench.speculative_speedup(0.0, 1, plain, verify, draft) == pytest.approx(1 / 1.55)
    # always right at gamma 2: 3 tokens per step
    assert bench.speculative_speedup(1.0, 2, plain, 0.200, draft) == pytest.approx(3 / 2.1)
    for target in (1.0, 1.25):
        a = bench.acceptance_needed(target, 1, plain, verify, draft)
        assert 0 < a < 1 and bench.speculative_speedup(a, 1, plain, verify, draft) == pytest.approx(target, abs=1e-9)
    assert bench.acceptance_needed(1.25, 1, plain, 0.170, draft) is None  # 2 / 1.75 < 1.25 even when always right
    # free verification: any acceptance above zero pays
    assert bench.acceptance_needed(1.0, 1, plain, plain, 0.0) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("script", ["bench_sampling.py", "bench_reward.py", "replay_budget.py", "bench_budget.py", "reward_levers.py", "diversity_curve.py"])
def test_the_benchmark_scripts_compose_the_config_and_parse_their_arguments(script):
    """Each composes conf/ (with the typed schema registered) or imports the stages before it parses
    its arguments: `--help` fails when either breaks."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--help"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


# ---- the set-acceptance (oracle) draft, random-weight policies, the ceiling (issue 44) ----------------------

def tiny_config(folder, vocab_size=64):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                eos_token_id=2).save_pretrained(folder)
    return folder / "config.json"


def test_the_peaked_head_gives_its_token_probability_a_after_the_temperature():
    import torch

    from rsft.sampling.processing import probs_from_logits

    bench = load_script()
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 50)
    hidden = 3 * torch.randn(3, 5, 8)  # [batch, positions, hidden]
    for a, temperature in ((0.7, 0.7), (0.05, 1.0), (0.95, 1.3)):
        head = bench.PeakedHead(linear, token=1, acceptance=a, temperature=temperature)
        assert head.out_features == 50
        with torch.no_grad():
            probs = probs_from_logits(head(hidden), temperature)  # [3, 5, 50]
            original = probs_from_logits(linear(hidden), temperature)
        assert torch.allclose(probs[..., 1], torch.full((3, 5), a), atol=1e-6)
        # the other tokens keep their ratios: p(j) / (1 - a) is the original softmax without token 1
        others = torch.cat([original[..., :1], original[..., 2:]], -1)
        others = others / others.sum(-1, keepdim=True)
        assert torch.allclose(torch.cat([probs[..., :1], probs[..., 2:]], -1) / (1 - a), others, atol=1e-5)


def test_the_oracle_draft_is_accepted_at_the_set_rate_and_the_sampler_stays_exact(tmp_path):
    """p(c) = a after the temperature, q one-hot at c: every reached draft position is accepted with
    probability a (binomial, 4 standard errors), and the completions hold token c at rate a, as plain
    sampling from the peaked head would."""
    import math

    bench = load_script()
    config = bench.policy_config(str(tiny_config(tmp_path)))
    model = bench.random_policy(config, bench.torch.device("cpu"), bench.torch.float32, seed=0)
    prompts = bench.random_prompts(8, 6, config.vocab_size, seed=0)
    a, gamma, token, temperature = 0.7, 3, 1, 0.7
    settings = bench.SamplingSettings(max_new_tokens=32, temperature=temperature, batch_rows=32, gamma=gamma)
    with bench.peaked_head(model, token, a, temperature):
        sampler = bench.Sampler(model, settings, [], draft=bench.OracleDraft(token))
        completions = sampler.generate(prompts, 4, seed=0, progress=False)
    assert type(model.lm_head).__name__ == "Linear"  # restored
    summary = sampler.summary()
    reached = sum(sampler.stats.reached_at)
    assert reached > 500
    assert abs(summary["alpha"] - a) < 4.5 * math.sqrt(a * (1 - a) / reached), summary["alpha"]
    assert summary["tokens_per_target_forward"] == pytest.approx(summary["theoretical_tokens_per_forward"], abs=0.15)
    tokens = [t for c in completions for t in c.token_ids]
    assert len(tokens) == 32 * 32 and all(c.finish_reason == "length" for c in completions)  # no EOS
    share = tokens.count(token) / len(tokens)
    assert abs(share - a) < 4.5 * math.sqrt(a * (1 - a) / len(tokens)), share


def test_policy_config_resolves_the_built_in_shapes_a_config_file_and_a_folder(tmp_path):
    from rsft.errors import ConfigError

    bench = load_script()
    small = bench.policy_config("smollm2-135m")
    assert (small.vocab_size, small.hidden_size, small.num_hidden_layers, small.num_key_value_heads) == (49152, 576, 30, 3)
    large = bench.policy_config("llama-1.5b")
    assert (large.vocab_size, large.hidden_size, large.intermediate_size, large.num_hidden_layers,
            large.num_attention_heads, large.num_key_value_heads, large.tie_word_embeddings) == (
        151936, 1536, 8960, 28, 12, 2, True)
    file = tiny_config(tmp_path)
    for spec in (str(file), str(tmp_path)):
        config = bench.policy_config(spec)
        assert config.vocab_size == 64 and config.eos_token_id is None  # no EOS: every completion runs to the end
    with pytest.raises(ConfigError, match="--policy-config 'qwen-7b': neither a built-in shape"):
        bench.policy_config("qwen-7b")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="--policy-config .*bad.json.*not a usable model config"):
        bench.policy_config(str(tmp_path / "bad.json"))


def test_random_weights_run_hf_generate_to_max_new_tokens_and_the_ceiling_is_the_slower_bound(tmp_path):
    import torch

    bench = load_script()
    config = bench.policy_config(str(tiny_config(tmp_path)))
    model = bench.random_policy(config, torch.device("cpu"), torch.float32, seed=0)
    again = bench.random_policy(config, torch.device("cpu"), torch.float32, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))  # seeded
    prompts = bench.random_prompts(3, 5, config.vocab_size, seed=1)
    assert all(10 <= t < config.vocab_size - 10 for p in prompts for t in p)
    out = bench.hf_generate(model, None, prompts, k=2, rows=4, max_new_tokens=7, temperature=0.7, seed=0, eos_ids=[])
    assert out["tokens"] == 3 * 2 * 7

    # untied (LlamaConfig's default): the input embedding is a lookup, not a product a step pays for
    assert not config.tie_word_embeddings
    params = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    c = bench.decode_ceiling(model, rows=8, bandwidth_gbs=1.0, tflops=1.0)
    assert c["parameters"] == params and c["weight_bytes"] == 4 * params
    memory_s, compute_s = 4 * params / 1e9, 2 * params * 8 / 1e12
    assert c["tokens_per_second"] == pytest.approx(8 / max(memory_s, compute_s))


def test_the_bench_runs_oracle_hf_and_the_step_profile_on_a_tiny_config(tmp_path, capsys):
    bench = load_script()
    config = str(tiny_config(tmp_path))
    common = ["--policy-config", config, "--batch-rows", "4", "--prompts", "2", "--k", "2", "--max-new-tokens", "6",
              "--repeats", "1", "--device", "cpu"]
    bench.main([*common, "--methods", "hf", "plain", "oracle", "--acceptance", "0.7", "--gammas", "2", "--ceiling"])
    out = capsys.readouterr().out
    for row in ("| 4 | hf |", "| 4 | plain |", "| 4 | plain a=0.7 |", "| 4 | oracle a=0.7 g=2 |", "at a=0.7"):
        assert row in out, row
    assert "share of ceiling" in out and "Decode ceiling" in out
    bench.main([*common, "--step-profile"])
    assert "outside it, ms per step" in capsys.readouterr().out


@pytest.mark.parametrize("argv,expected", [
    (["--acceptance", "0.8", "1.0"], "--acceptance 0.8 1.0: expected values strictly between 0 and 1"),
    (["--dtype", "fp8"], "--dtype 'fp8': expected float32, bfloat16, float16"),
    (["--device", "tpu"], "--device 'tpu': expected cpu, cuda or cuda:N"),
    (["--policy-config", "nope"], "--policy-config 'nope': neither a built-in shape"),
    (["--policy-config", "smollm2-135m", "--methods", "vllm"], "--methods vllm: needs a policy folder"),
    (["--tflops", "0"], "--tflops 0.0: expected > 0"),
    (["--prompt-tokens", "0"], "--prompt-tokens 0: expected positive integers"),
])
def test_the_new_options_mistakes_are_config_errors_naming_them(argv, expected):
    from rsft.errors import ConfigError

    bench = load_script()
    with pytest.raises(ConfigError) as raised:
        bench.main(argv)
    assert str(raised.value).startswith(expected), str(raised.value)
