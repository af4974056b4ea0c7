"""Wall time of stage=sample's sampling with pruning or adaptive K against exhaustive best-of-K.

    python scripts/bench_budget.py runs/demo --round 0 --schedule "prune=8,16 share=0.5 apart" --repeats 2

Samples the round's prompts from the policy that round sampled from, with the round's recorded
settings (as scripts/replay_budget.py does), once exhaustively and once per schedule, alternating,
`--repeats` times; reports the median seconds (reward-model calls included: they run inside the
sampling loop), the policy tokens generated and the reward-model seconds. A schedule is a few
words: `prune=8,16` (checkpoints), `share=0.5`, `apart` (rank_finished=false), `k0=4 mean=6`
(adaptive K), `k=32` (K drawn from, default sample.num_samples).
Run it alone: two heavy processes on two cores slow each other several-fold.
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path

from replay_budget import round_config

import rsft.reward_service
from rsft.preflight import check_device
from rsft.data import load_prompts
from rsft.errors import ConfigError, main_guard
from rsft.generation import round_seed, sample_dataset, sampling_settings
from rsft.models import load_policy
from rsft.paths import RunPaths
from rsft.sampling.budget import PruneSchedule

SCHEDULE_WORDS = ("prune", "share", "apart", "k0", "mean", "k")


def parse_schedule(text: str, k_ref: int, max_new_tokens: int | None = None
                   ) -> tuple[int, PruneSchedule | None, tuple[int, float] | None]:
    """A --schedule's words (the module docstring); ConfigError naming the schedule for one that does not
    parse, or (given max_new_tokens) whose pruning the sampler would refuse."""
    words = dict(w.split("=", 1) if "=" in w else (w, "") for w in text.split())
    unknown = sorted(set(words) - set(SCHEDULE_WORDS))
    expected = "expected words like `prune=8,16 share=0.5 apart`, `k0=4 mean=6`, `k=32`"
    if unknown:
        raise ConfigError(f"--schedule {text!r}: unknown word(s) {', '.join(unknown)}; {expected}")
    try:
        k = int(words.get("k", k_ref))
        prune = None
        if "prune" in words:
            prune = PruneSchedule(tuple(int(c) for c in words["prune"].split(",")), float(words.get("share", 0.5)),
                                  "apart" not in words)
            if max_new_tokens is not None:
                prune.check(max_new_tokens)
        adaptive = (int(words["k0"]), float(words.get("mean", k_ref))) if "k0" in words else None
    except ValueError as error:
        raise ConfigError(f"--schedule {text!r}: {error}; {expected}") from None
    return k, prune, adaptive


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--schedule", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats}: expected at least 1")
    logging.basicConfig(level=logging.WARNING)
    device = check_device(args.device, "--device")  # one line where the device is misspelt or absent
    cfg = round_config(args.run, args.round)  # MissingInput for a missing run or round
    k_ref = int(cfg.sample.num_samples)
    schedules = [(s, parse_schedule(s, k_ref, int(cfg.sample.max_new_tokens))) for s in args.schedule]  # before any loading
    paths = RunPaths.from_config(cfg)
    prompts = load_prompts(cfg.data, "train", args.round)
    model, tokenizer, source = load_policy(cfg, paths.sampling_policy(args.round), device)
    scorer = rsft.reward_service.open_reward(cfg, device, paths.budget_reward(args.round)
                                      if rsft.reward_service.uses_trained_reward(cfg) else None)
    settings = sampling_settings(cfg.sample)
    runs = [("exhaustive", (k_ref, None, None)), *schedules]
    results = {name: [] for name, _ in runs}
    for repeat in range(args.repeats):
        for name, (k, prune, adaptive) in runs:
            ds, summary = sample_dataset(model, tokenizer, None, prompts, settings, k,
                                         round_seed(cfg.seed, args.round), cfg.data.get("system_prompt"),
                                         {"round": args.round, "policy": source, "sampler": ""}, progress=False,
                                         scorer=scorer if prune or adaptive else None, prune=prune, adaptive=adaptive)
            results[name].append((summary["seconds"], summary["tokens"], summary.get("budget_reward_seconds", 0.0),
                                  summary.get("prune_prefixes_scored", 0), len(ds)))
    base_seconds = statistics.median(r[0] for r in results["exhaustive"])
    base_tokens = results["exhaustive"][0][1]
    print(f"round {args.round}, {len(prompts)} prompts, K={k_ref}, {settings.batch_rows} rows, "
          f"{args.repeats} repeat(s), median seconds")
    print("| schedule | seconds | vs exhaustive | policy tokens | vs exhaustive | reward-model seconds | prefixes "
          "scored | rows |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in runs:
        seconds = statistics.median(r[0] for r in results[name])
        tokens, reward_seconds, scored, rows = results[name][0][1], statistics.median(
            r[2] for r in results[name]), results[name][0][3], results[name][0][4]
        print(f"| {name} | {seconds:.1f} | {seconds / base_seconds:.2f} | {tokens} | {tokens / base_tokens:.2f} | "
              f"{reward_seconds:.1f} | {scored} | {rows} |")


if __name__ == "__main__":
    main_guard(main)()
