"""Replay pruning and adaptive-K schedules on an exhaustive best-of-K sample set, without new sampling.

    python scripts/replay_budget.py runs/demo --rounds 0 2 --k 32
    python scripts/replay_budget.py runs/demo --rounds 0 2 --k 32 --json budget.json --markdown budget.md

For each round it needs the run's round_XX/samples (for its recorded config) and the policy that
round sampled from. It samples K completions per prompt of that round's prompts with the round's own
settings and seeds (rsft.generation.sample_dataset, so the first sample.num_samples of them are the
run's own samples, completion for completion) and caches them in runs/<run>/replay/. Then, with no
more sampling, it scores every completion's prefix at every candidate checkpoint with the reward
model pruning would use (RunPaths.budget_reward), and every completion with the one select uses
(RunPaths.scoring_reward), and replays each schedule with the sampler's own rules
(rsft.sampling.budget.rows_to_stop, adaptive_counts). Every completion has its own random stream, so a replay
keeps exactly what sampling with the schedule keeps (tests/sampling/test_budget.py checks that).

Per schedule and round, against exhaustive best-of-`sample.num_samples` (the reference):
- tokens: the policy tokens the schedule generates, as a share of the reference's (a stopped row is
  charged c + 1 tokens: the sampler decides a checkpoint once its rows are past it);
- calls: reward-model scores the schedule needs while sampling (prefixes, and adaptive K's first pass);
- recall: how often its pick is the reference's pick (same completion);
- gold (or judge) of the kept completion, and its paired difference from the reference's with a 95%
  bootstrap interval over prompts (rsft.stats); "target" is -0.1 x (best-of-K gold - best-of-1 gold),
  best-of-1 being the mean gold of a prompt's keepable completions;
- lost: prompts where the reference keeps a completion and the schedule keeps none.
Kendall tau between each checkpoint's prefix score and the final score (same reward model), averaged
over prompts, says how early the ranking is settled.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

import numpy as np
from datasets import load_from_disk
from omegaconf import OmegaConf

import rsft.reward_service
from rsft import stats
from rsft.preflight import check_device
from rsft.data import load_prompts
from rsft.errors import ConfigError, MissingInput, main_guard
from rsft.generation import round_seed, sample_dataset, sampling_settings
from rsft.models import load_policy
from rsft.paths import RunPaths
from reward.specs import open_source
from rsft.sampling.budget import (
    PruneSchedule,
    adaptive_counts,
    keepable,
    rows_to_stop,
    scored_tokens,
)
from rsft.store import is_complete, load_dataset_artifact, read_meta

log = logging.getLogger("replay_budget")

CHECKPOINTS = (4, 8, 12, 16, 24, 32)  # at sample.max_new_tokens=48; scaled with it (checkpoints_for)


def checkpoints_for(max_new_tokens: int, points=CHECKPOINTS) -> tuple[int, ...]:
    """Checkpoints at the same share of max_new_tokens as `points` are of 48 (the demo's), each below it."""
    scaled = sorted({max(1, round(p * max_new_tokens / 48)) for p in points})
    return tuple(p for p in scaled if p < max_new_tokens)


def round_config(run: Path, round_idx: int, prompts: int | None = None):
    """The config round r's samples were made with (recorded in their meta.json), pointed at `run`;
    with `prompts`, that many train prompts from the round's first (data.limit; with data.rotate the
    round's slice is then that long, so later rounds read other prompts than the run did). MissingInput
    when `run` is not a folder or round r has no complete samples."""
    if not run.is_dir():
        raise MissingInput(f"run {run}: no such folder; give a run directory (runs/<run_name>)")
    samples = RunPaths(run).samples(round_idx)
    if not is_complete(samples):
        raise MissingInput(f"run {run} has no complete round_{round_idx:02d}/samples (round {round_idx}); run "
                           f"`python -m rsft.run stage=sample round={round_idx} run_name=...` (or stage=loop) first")
    cfg = OmegaConf.create(read_meta(samples)["config"])
    cfg.paths.run_dir, cfg.paths.runs_root, cfg.round = str(run), str(run.parent), round_idx
    if prompts is not None:
        cfg.data.limit = prompts
    return cfg


def exhaustive_set(run: Path, round_idx: int, k: int, device, prompts: int | None = None):
    """K completions per prompt of round r, sampled as stage=sample would (cached under runs/<run>/replay/)."""
    out = run / "replay" / (f"round_{round_idx:02d}_k{k}" + ("" if prompts is None else f"_p{prompts}"))
    if (out / "dataset_info.json").is_file():
        return load_from_disk(str(out))
    cfg = round_config(run, round_idx, prompts)
    if prompts is None and k == int(cfg.sample.num_samples) and cfg.sample.get("backend", "rsft") == "rsft" \
            and not cfg.sample.get("prune", {}).get("at") and not cfg.sample.get("adaptive", {}).get("k0"):
        return load_dataset_artifact(RunPaths(run).samples(round_idx))  # the run's own exhaustive samples
    paths = RunPaths.from_config(cfg)
    prompts = load_prompts(cfg.data, "train", round_idx)
    model, tokenizer, source = load_policy(cfg, paths.sampling_policy(round_idx), device)
    settings = sampling_settings(cfg.sample)  # plain: a draft changes only speed
    ds, summary = sample_dataset(model, tokenizer, None, prompts, settings, k, round_seed(cfg.seed, round_idx),
                                 cfg.data.get("system_prompt"), {"round": round_idx, "policy": source, "sampler": ""})
    ds.save_to_disk(str(out))
    log.info("sampled %d x %d completions of round %d into %s (%.0f s)", len(prompts), k, round_idx, out,
             summary["seconds"])
    return ds


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau-a between two score lists (None with fewer than two items)."""
    n = len(a)
    if n < 2:
        return None
    s = sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) for i in range(n) for j in range(i + 1, n))
    return float(s) / (n * (n - 1) / 2)


class Prompt:
    """One prompt's exhaustive completions and their scores."""

    def __init__(self, rows: list[dict]):
        self.rows = sorted(rows, key=lambda r: r["sample_idx"])
        self.prefix: dict[tuple[int, int], float] = {}  # (sample index, tokens scored) -> budget model score
        self.final: list[float] = []  # select's reward model, whole completion
        self.gold: list[float] = []

    def eos(self, k: int) -> bool:
        return self.rows[k]["finish_reason"] == "eos"

    def keepable(self, k: int) -> bool:
        return keepable(self.rows[k]["finish_reason"], self.rows[k]["completion"])

    def tokens(self, k: int, stopped_at: int | None) -> int:
        full = self.rows[k]["num_tokens"] + self.eos(k)
        return full if stopped_at is None else min(full, stopped_at + 1)

    def prune(self, members: list[int], schedule: PruneSchedule | None, used: set) -> dict[int, int]:
        """The sampler's pruning of one group: sample index -> checkpoint where it is stopped."""
        stopped: dict[int, int] = {}
        if schedule is None:
            return stopped
        alive = list(members)
        for c in schedule.checkpoints:
            scored = [scored_tokens(self.rows[k]["completion_ids"], self.eos(k), c) for k in alive]
            if all(done for _, done in scored):
                continue
            keys = [(k, len(t)) for k, (t, _) in zip(alive, scored)]
            used.update(keys)
            out = rows_to_stop([self.prefix[key] for key in keys], [not d for _, d in scored], schedule.share,
                               schedule.rank_finished)
            for i in out:
                stopped[alive[i]] = c
            alive = [k for i, k in enumerate(alive) if i not in out]
        return stopped

    def pick(self, kept: list[int]) -> int | None:
        """select's top-1 among the kept completions: best final reward, ties to the lower index."""
        candidates = [k for k in kept if self.keepable(k)]
        return min(candidates, key=lambda k: (-self.final[k], k)) if candidates else None


def score_all(prompts: list[Prompt], budget_scorer, final_scorer, tokenizer, texts, checkpoints, judge=None):
    """Prefix scores at every checkpoint (budget model), final scores (select's model), gold or judge."""
    from reward.gold import gold_score

    requests = []
    for i, p in enumerate(prompts):
        for k, row in enumerate(p.rows):
            ids = row["completion_ids"]
            wanted = {len(scored_tokens(ids, p.eos(k), c)[0]) for c in checkpoints} | {len(ids)}
            requests += [(i, k, n) for n in sorted(wanted)]
    values = budget_scorer.score([texts[i] for i, _, _ in requests],
                                 [tokenizer.decode(prompts[i].rows[k]["completion_ids"][:n], skip_special_tokens=True)
                                  for i, k, n in requests], progress=True)
    for (i, k, n), v in zip(requests, values):
        prompts[i].prefix[(k, n)] = float("-inf") if v is None else float(v)  # not scorable ranks last
    flat = [(i, k) for i, p in enumerate(prompts) for k in range(len(p.rows))]
    finals = final_scorer.score([texts[i] for i, _ in flat],
                                [prompts[i].rows[k]["completion"] for i, k in flat], progress=True)
    if judge is not None:
        golds = judge.score([texts[i] for i, _ in flat],
                            [prompts[i].rows[k]["completion"] for i, k in flat], progress=True)
    else:
        golds = [gold_score(prompts[i].rows[k]["task"], prompts[i].rows[k]["completion"],
                            prompts[i].rows[k]["finish_reason"]) for i, k in flat]
    for (i, k), f, g in zip(flat, finals, golds):  # a completion a source could not score ranks last
        prompts[i].final.append(float("-inf") if f is None else float(f))
        prompts[i].gold.append(float("nan") if g is None else float(g))


def replay(prompts: list[Prompt], k: int, prune: PruneSchedule | None = None,
           adaptive: tuple[int, float] | None = None):
    """Per prompt: (kept sample indices, pick, tokens generated, reward-model calls)."""
    out = []
    extra_calls = 0
    if adaptive is None:
        groups = [[list(range(k))] for _ in prompts]
    else:
        k0, budget = adaptive
        first = []
        for p in prompts:
            used: set = set()
            stopped = p.prune(list(range(k0)), prune, used)
            done = [j for j in range(k0) if j not in stopped]
            first.append(([p.prefix[(j, len(p.rows[j]["completion_ids"]))] for j in done],
                          [p.keepable(j) for j in done]))
            extra_calls += len(done)
        counts = adaptive_counts([f[0] for f in first], [f[1] for f in first], k0, budget, max_per_prompt=k)
        groups = [[list(range(k0)), list(range(k0, count))] for count in counts]
    for p, parts in zip(prompts, groups):
        used: set = set()
        kept, tokens = [], 0
        for members in parts:
            stopped = p.prune(members, prune, used)
            kept += [j for j in members if j not in stopped]
            tokens += sum(p.tokens(j, stopped.get(j)) for j in members)
        out.append((kept, p.pick(kept), tokens, len(used)))
    return out, extra_calls


def summarise(name: str, prompts: list[Prompt], result, extra_calls: int, reference, reference_tokens: int) -> dict:
    per_prompt, lost, recall = {}, 0, []
    for i, (p, (kept, pick, _, _), (_, ref_pick, _, _)) in enumerate(zip(prompts, result, reference)):
        if ref_pick is None:
            continue
        recall.append(pick == ref_pick)
        if pick is None:
            lost += 1
            continue
        per_prompt[i] = [p.gold[pick] - p.gold[ref_pick]]
    golds = [p.gold[pick] for p, (_, pick, _, _) in zip(prompts, result) if pick is not None]
    diff = stats.bootstrap(per_prompt) if per_prompt else None
    return {"schedule": name, "tokens_share": sum(r[2] for r in result) / reference_tokens,
            "calls": sum(r[3] for r in result) + extra_calls, "recall": statistics.fmean(recall) if recall else None,
            "gold": statistics.fmean(golds) if golds else None,
            "gold_diff": diff, "lost": lost, "completions": sum(len(r[0]) for r in result)}


def schedules(k_ref: int, k: int, max_new_tokens: int = 48
              ) -> list[tuple[str, int, PruneSchedule | None, tuple[int, float] | None]]:
    """(name, K drawn from, pruning, adaptive K) to replay: the grid the docs' table comes from, its
    checkpoints given at max_new_tokens=48 and scaled to the round's (checkpoints_for)."""
    def pruned(kk: int, points: tuple[int, ...], share: float):
        points = checkpoints_for(max_new_tokens, points)
        return [(f"K={kk} prune {list(points)} x{share} {'rank' if ranked else 'apart'}", kk,
                 PruneSchedule(points, share, ranked), None) for ranked in (True, False)]

    out = [(f"best-of-{k_ref}", k_ref, None, None)]
    for points, share in (((8,), 0.5), ((16,), 0.5), ((24,), 0.5), ((32,), 0.5), ((24,), 0.75), ((8, 16), 0.5),
                          ((16, 32), 0.5), ((8, 16, 24), 0.5), ((24, 32), 0.5)):
        out += pruned(k_ref, points, share)
    for k0, budget in ((2, 3), (2, 4), (3, 4), (4, 5), (4, 6)):
        out.append((f"K<={k_ref} adaptive k0={k0} mean {budget}", k_ref, None, (k0, float(budget))))
        late = checkpoints_for(max_new_tokens, (24,))
        out.append((f"K<={k_ref} adaptive k0={k0} mean {budget} + prune {list(late)} x0.5 apart", k_ref,
                    PruneSchedule(late, 0.5, False), (k0, float(budget))))
    if k > k_ref:
        out.append((f"best-of-{k}", k, None, None))
        for points, share in (((4, 8, 16), 0.5), ((4, 8), 0.75), ((8, 16), 0.75), ((8, 16, 24), 0.5),
                              ((16, 24), 0.75)):
            out += pruned(k, points, share)
        out.append((f"K<={k} adaptive k0=4 mean {k_ref}", k, None, (4, float(k_ref))))
        mid = checkpoints_for(max_new_tokens, (16,))
        out.append((f"K<={k} adaptive k0=4 mean {k_ref} + prune {list(mid)} x0.5 apart", k,
                    PruneSchedule(mid, 0.5, False), (4, float(k_ref))))
    return out


def fmt(row: dict, target: float) -> str:
    d = row["gold_diff"]
    diff = "n/a" if d is None else f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
    ok = "" if d is None else (" yes" if d["low"] >= target else " no")
    return (f"| {row['schedule']} | {row['tokens_share']:.2f} | {row['calls']} | {row['recall']:.2f} | "
            f"{row['gold']:.3f} | {diff} |{ok} | {row['lost']} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--rounds", type=int, nargs="+", default=[0])
    parser.add_argument("--k", type=int, default=32, help="completions per prompt in the exhaustive set")
    parser.add_argument("--prompts", type=int, default=None,
                        help="train prompts per round (default: the run's own; more give tighter intervals)")
    parser.add_argument("--judge", default=None, help="a reward-model folder in place of the demo's gold")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    for option, value in (("--k", args.k), ("--prompts", args.prompts)):
        if value is not None and value < 1:
            raise ConfigError(f"{option} {value}: expected at least 1")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(levelname)s %(name)s] %(message)s")
    device = check_device(args.device, "--device")  # one line where the device is misspelt or absent
    for r in args.rounds:  # every round's samples, before any sampling
        round_config(args.run, r)
    report, lines = {}, []
    for r in args.rounds:
        cfg = round_config(args.run, r)
        paths = RunPaths.from_config(cfg)
        k_ref = int(cfg.sample.num_samples)
        ds = exhaustive_set(args.run, r, max(args.k, k_ref), device, args.prompts)
        _, tokenizer, _ = load_policy(cfg, paths.sampling_policy(r), device)
        trained = rsft.reward_service.uses_trained_reward(cfg)
        budget_scorer = rsft.reward_service.open_reward(cfg, device, paths.budget_reward(r) if trained else None)
        final_scorer = rsft.reward_service.open_reward(cfg, device, paths.scoring_reward(r) if trained else None)
        judge = open_source(args.judge, device) if args.judge else None  # a folder, or any reward source spec
        by_prompt: dict[str, list[dict]] = {}
        for row in ds:
            by_prompt.setdefault(row["prompt_id"], []).append(row)
        prompts = [Prompt(rows) for rows in by_prompt.values()]
        max_new_tokens = int(cfg.sample.max_new_tokens)
        checkpoints = checkpoints_for(max_new_tokens)
        score_all(prompts, budget_scorer, final_scorer, tokenizer, [p.rows[0]["prompt"] for p in prompts],
                  checkpoints, judge)
        reference, _ = replay(prompts, k_ref)
        reference_tokens = sum(x[2] for x in reference)
        best1 = statistics.fmean(statistics.fmean(p.gold[j] for j in range(k_ref) if p.keepable(j))
                                 for p in prompts if any(p.keepable(j) for j in range(k_ref)))
        best_k = statistics.fmean(p.gold[x[1]] for p, x in zip(prompts, reference) if x[1] is not None)
        target = -0.1 * (best_k - best1)
        taus = {c: statistics.fmean(t for p in prompts if (t := kendall_tau(
            [p.prefix[(j, len(scored_tokens(p.rows[j]["completion_ids"], p.eos(j), c)[0]))] for j in range(len(p.rows))],
            [p.prefix[(j, len(p.rows[j]["completion_ids"]))] for j in range(len(p.rows))])) is not None)
            for c in checkpoints}
        rows = []
        for name, k, prune, adaptive in schedules(k_ref, args.k, max_new_tokens):
            result, extra_calls = replay(prompts, k, prune, adaptive)
            rows.append(summarise(name, prompts, result, extra_calls, reference, reference_tokens))
        report[f"round {r}"] = {"prompts": len(prompts), "best_of_1_gold": best1, f"best_of_{k_ref}_gold": best_k,
                                "target": target, "kendall_tau": taus, "schedules": rows}
        lines += [f"### Round {r} ({len(prompts)} prompts)", "",
                  (f"best-of-1 gold {best1:.3f}, best-of-{k_ref} {best_k:.3f}: a schedule passes when its gold "
                   f"difference's lower bound is >= {target:+.3f} (10% of the gap)."), "",
                  "Kendall tau, checkpoint score vs final score: "
                  + ", ".join(f"{c} tokens {t:.2f}" for c, t in taus.items()), "",
                  "| schedule | tokens | RM calls | recall | gold | gold - best-of-K [95%] | within 10% | lost |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [fmt(row, target) for row in rows] + [""]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main_guard(main)()
