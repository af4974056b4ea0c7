"""Held-out pairwise accuracy of Bradley-Terry reward models, with 95% intervals, and paired differences.

    python scripts/reward_levers.py --model hh=runs/hh/reward --model len256=runs/hh-len256/reward
    python scripts/reward_levers.py --model one=hh \\
        --model three=runs/hh-s0/reward,runs/hh-s1/reward,runs/hh-s2/reward --baseline one --out levers.json
    python scripts/reward_levers.py --model hh=runs/hh/reward --model judge=runs/hh-judge/reward --limit 40 --threads 1

Which lever (a longer reward.max_length, more seeds in an ensemble, reward.label_smoothing, more epochs,
...) lifts held-out pairwise accuracy, and by how much beyond noise?

- Pairs: --data (default: the HH-RLHF harmless-base file of conf/experiment/hh_rlhf.yaml), read and
  split exactly as stage=reward does (reward.formats: load_raw, to_preference_pairs, partition by
  prompt with the recipe's format and label column), then part --part of --parts (seed --part-seed),
  in file order, the first --limit of them. The default, part 1 of 2 (seed 0), is the half a proxy
  trained by the recipe (part 0) has never seen. Each pair is scored as stage=reward scores its
  held-out pairs (reward.trained.score_pairs: the HH prompt keeps its "Human: ...\\n\\nAssistant:" frame).
- --model NAME=PATH: PATH is a folder stage=reward wrote (with reward_stats.json), or a run name whose
  runs/<name>/reward is one, or several of these separated by commas: an ensemble. A model's reward is
  the mean of its members' rewards, each z-scored with its own reward_stats.json mean and std
  (RewardScorer.normalise), since reward models trained apart sit on different scales; a single
  model's reward is its own z-score (the same order as its raw reward, so the same accuracy).
- Accuracy: reward.trained.pairwise_accuracy's rule, per pair: right when r(chosen) > r(rejected)
  agrees with label_prob > 0.5; a pair labelled exactly 0.5 (a tie) counts as neither and is left
  out. The 95% interval is rsft.stats.bootstrap over pairs (each pair one unit: in the HH file part
  1's 1,156 pairs have 1,155 distinct prompts, so pairs are as good as independent draws).
  --baseline (default: the first model): every other model's accuracy minus the baseline's, paired
  pair by pair (rsft.stats.paired_difference over the same pairs and the same resamples), which is
  far tighter than comparing two separate intervals. A difference whose interval excludes 0 is one
  these pairs tell from noise (with many models compared, expect one in twenty to by chance).
- Cache: each member folder's raw and z-scored rewards of the evaluated pairs are saved to
  <its parent>/reward_scores/ (or --cache-dir) in a file named by a digest of the folder's files
  (size and CRC-32 of each) and a digest of the evaluated pairs' texts, in order; a later ensemble,
  or a rerun, reuses them, and another --data / --part / --limit or a retrained model never does.
- Warned about (and recorded): a member trained on some of the evaluated pairs (its
  pair_hashes.json: the judge on part 1, say), so its accuracy is not held out; a member trained on
  prompts framed otherwise than the evaluated pairs. Refused: an ensemble whose members were trained
  with different prompt frames (they read different inputs for the same pair).

Prints a markdown table (model, pairs, accuracy [lo, hi], difference vs baseline [lo, hi]); --out
writes every number (and each model's per-pair rewards) as JSON.

Written by hand because no library measures it: TRL's RewardTrainer and reward-bench report plain
accuracy, with no interval and no pair-by-pair comparison of two models; the bootstrap is rsft.stats'
(see there why it is hand-written too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from reward.formats import load_raw, pair_hash, partition, to_preference_pairs
from reward.trained import (
    PLAIN_PROMPT,
    STATS_FILE,
    load_scorer,
    pairwise_accuracy,
    prompt_template,
    score_pairs,
)
from rsft.preflight import check_device
from rsft.config import check_run_name, register_configs
from rsft.errors import ConfigError, InputError, main_guard
from rsft.bt_fit import PAIR_HASHES_FILE
from rsft.stats import LEVEL, RESAMPLES, SEED, bootstrap, by_prompt, paired_difference
from reward.digests import user_files_digest
from rsft.store import is_complete, loading_artifact

ROOT = Path(__file__).resolve().parents[1]
register_configs()  # conf/ composes the typed schema (rsft.config)
with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
    CONFIG = compose("config", overrides=["stage=reward", "+experiment=hh_rlhf"])  # the recipe's proxy / judge pairs
PAIRS_CONF = CONFIG.reward.data  # format hh_rlhf, label column, split, part_by prompt, part_seed
RUNS_ROOT = ROOT / CONFIG.paths.runs_root  # a run name resolves to RUNS_ROOT/<name>/reward (absolute stays absolute)
DEFAULT_DATA = (ROOT / str(PAIRS_CONF.path)).resolve()
SCORES_FOLDER = "reward_scores"

log = logging.getLogger("reward_levers")


@dataclass(frozen=True)
class Member:
    """One reward-model folder: its training statistics and a digest of its files (the cache key)."""

    folder: Path
    stats: dict  # reward_stats.json: mean, std, max_length, prompt_template, ...
    digest: str

    @property
    def template(self) -> str:
        return self.stats.get("prompt_template", PLAIN_PROMPT)  # load_scorer's default for older folders


def member_folder(text: str, spec: str) -> Path:
    """A reward-model folder (one with STATS_FILE), else the run name's runs/<name>/reward."""
    folder = Path(text).expanduser()
    if (folder / STATS_FILE).is_file():
        return folder
    try:
        check_run_name(text, "run name")
        run_folder = RUNS_ROOT / text / "reward"
    except ConfigError:
        run_folder = None
    if run_folder is not None and (run_folder / STATS_FILE).is_file():
        return run_folder
    raise FileNotFoundError(f"--model {spec}: {text!r} is neither a reward-model folder (no {folder / STATS_FILE}) "
                            f"nor a run with one ({RUNS_ROOT / text / 'reward' / STATS_FILE} is missing); expected "
                            f"a folder written by `python -m rsft.run stage=reward` (e.g. runs/hh/reward) or a run name")


def load_member(folder: Path, spec: str) -> Member:
    stats_file = folder / STATS_FILE
    try:
        stats = json.loads(stats_file.read_text())
        mean, std, max_length = float(stats["mean"]), float(stats["std"]), int(stats["max_length"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--model {spec}: {stats_file} cannot be read as reward statistics ({type(error).__name__}: "
                         f"{error}); expected JSON with mean, std and max_length, as stage=reward writes") from None
    if not std > 0:
        raise ValueError(f"--model {spec}: {stats_file} has std={std}; expected a positive std to z-score with")
    files = json.dumps(user_files_digest(folder), sort_keys=True)
    return Member(folder.resolve(), {**stats, "mean": mean, "std": std, "max_length": max_length},
                  hashlib.sha256(files.encode()).hexdigest()[:12])


def parse_models(specs: list[str]) -> dict[str, list[Member]]:
    """{name: members} from the --model NAME=PATH[,PATH...] arguments, in order."""
    models: dict[str, list[Member]] = {}
    for spec in specs:
        name, sep, paths = spec.rpartition("=")  # the last "=": a name may hold one (seed=1), a path rarely does
        name, texts = name.strip(), [t.strip() for t in paths.split(",")]
        if not sep or not name or not all(texts):
            raise ValueError(f"--model {spec!r}: expected NAME=PATH or NAME=PATH,PATH,... (an ensemble), each PATH a "
                             f"reward-model folder or a run name, e.g. --model hh=runs/hh/reward")
        if name in models:
            raise ValueError(f"--model {spec!r}: the name {name!r} is given twice; give each model its own name")
        members = [load_member(member_folder(text, spec), spec) for text in texts]
        folders = [str(m.folder) for m in members]
        if len(set(folders)) < len(folders):
            raise ValueError(f"--model {spec!r}: a folder is listed twice in the ensemble ({', '.join(folders)}); "
                             f"it would count twice in the mean")
        frames = {m.template for m in members}
        if len(frames) > 1:
            found = "; ".join(f"{m.folder}: {m.template!r}" for m in members)
            raise ValueError(f"--model {spec!r}: the ensemble's members were trained with different prompt frames "
                             f"({found}); expected members trained on the same data format (reward_stats.json "
                             f"prompt_template), since they read the same pair as different inputs")
        models[name] = members
    return models


def select_pairs(data: Path, parts: int, part: int, part_seed: int, limit: int | None):
    """The evaluated pairs: read and partitioned as stage=reward does (reward.formats), the first `limit`."""
    pairs_cfg = OmegaConf.merge(PAIRS_CONF, {"path": str(data), "parts": parts, "part": part, "part_seed": part_seed})
    raw, source = load_raw(pairs_cfg, setting="--data")
    pairs = to_preference_pairs(raw, pairs_cfg.format, pairs_cfg.label_column, source)
    pairs = partition(pairs, parts, part, pairs_cfg.part_by, part_seed, source)
    if limit is not None:
        pairs = pairs.select(range(min(limit, len(pairs))))
    return pairs


def member_rewards(member: Member, pairs, hashes: list[str], selection: str, options) -> dict:
    """{raw_chosen, raw_rejected, chosen, rejected (z-scored), cache, cached}: from the cache file when the
    same folder (by content) already scored the same pairs, else scored now and saved there."""
    folder = Path(options.cache_dir) if options.cache_dir else member.folder.parent / SCORES_FOLDER
    cache = folder / f"{member.folder.name}-{member.digest}-{selection[:16]}.json"
    if cache.is_file():
        try:
            saved = json.loads(cache.read_text())
            matches = saved["selection"] == selection and saved["model_digest"] == member.digest
            if matches and len(saved["chosen"]) == len(pairs):
                log.info("%s: rewards of %d pairs from %s", member.folder, len(pairs), cache)
                return {**saved, "cache": str(cache), "cached": True}
            log.warning("%s does not match its name (another selection or model); scoring again", cache)
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("%s cannot be read (%s); scoring again", cache, error)
    if is_complete(member.folder):  # written by stage=reward: its files are checked against meta.json first
        with loading_artifact(member.folder):
            scorer = load_scorer(member.folder, options.device)
    else:
        scorer = load_scorer(member.folder, options.device)
    log.info("%s: %s, max_length %d, prompt frame %r, mean %.4f std %.4f, on %s; scoring %d pairs",
             member.folder, type(scorer.model).__name__, scorer.max_length, scorer.template, scorer.mean, scorer.std,
             scorer.device, len(pairs))
    started = time.perf_counter()
    raw_chosen, raw_rejected = score_pairs(scorer, pairs, options.batch_size, progress=True)
    saved = {"model": str(member.folder), "model_digest": member.digest, "selection": selection,
             "pair_hashes": hashes, "device": str(scorer.device), "seconds": round(time.perf_counter() - started, 2),
             "raw_chosen": raw_chosen, "raw_rejected": raw_rejected,
             "chosen": scorer.normalise(raw_chosen), "rejected": scorer.normalise(raw_rejected)}
    folder.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f".{cache.name}.tmp-{os.getpid()}")
    partial.write_text(json.dumps(saved))
    os.replace(partial, cache)  # a killed run leaves no half-written cache file under the real name
    log.info("%s: scored in %.1f s, saved to %s", member.folder, saved["seconds"], cache)
    return {**saved, "cache": str(cache), "cached": False}


def member_warnings(member: Member, hashes: list[str], data_frame: str) -> tuple[int | None, list[str]]:
    """(evaluated pairs the member was trained on, or None when unknown; warnings)."""
    warnings = []
    if member.template != data_frame:
        warnings.append(f"trained on prompts framed {member.template!r}, evaluated on pairs framed {data_frame!r}")
    hashes_file = member.folder / PAIR_HASHES_FILE
    if not hashes_file.is_file():
        return None, warnings
    seen = len(set(hashes) & set(json.loads(hashes_file.read_text())["train"]))
    if seen:
        warnings.append(f"trained on {seen} of the {len(hashes)} evaluated pairs: its accuracy here is not held out")
    return seen, warnings


def correct_by_pair(chosen: list[float], rejected: list[float], labels: list[float]) -> dict[tuple[int, int], float]:
    """{(row, 0): 1.0 or 0.0}: pairwise_accuracy's rule applied to each pair alone; ties (label 0.5) left out.
    The key is rsft.stats' (unit, sample) pairing key, one unit per pair."""
    out = {}
    for row, (c, r, p) in enumerate(zip(chosen, rejected, labels)):
        right, counted = pairwise_accuracy([c], [r], [p])
        if counted:
            out[(row, 0)] = right
    return out


def interval(numbers: dict) -> dict:
    """rsft.stats' {mean, low, high, prompts} as {value, low, high, pairs}."""
    return {"value": numbers["mean"], "low": numbers["low"], "high": numbers["high"], "pairs": numbers["prompts"]}


def measure(models: dict[str, list[Member]], baseline: str, pairs, options) -> dict:
    hashes = [pair_hash(p, c, r) for p, c, r in zip(pairs["prompt"], pairs["chosen"], pairs["rejected"])]
    selection = hashlib.sha256("\n".join(hashes).encode()).hexdigest()
    labels = [float(p) for p in pairs["label_prob"]]
    data_frame = prompt_template(PAIRS_CONF.format)
    scored: dict[Path, dict] = {}  # a folder in several models is scored (or read) once
    results = {}
    for name, members in models.items():
        member_records, rewards = [], []
        for member in members:
            if member.folder not in scored:
                scored[member.folder] = member_rewards(member, pairs, hashes, selection, options)
            seen, warnings = member_warnings(member, hashes, data_frame)
            for warning in warnings:
                log.warning("--model %s: %s: %s", name, member.folder, warning)
            record = scored[member.folder]
            rewards.append(record)
            member_records.append({"folder": str(member.folder), "files_digest": member.digest, **member.stats,
                                   "trained_on_evaluated_pairs": seen, "warnings": warnings,
                                   "scores": record["cache"], "from_cache": record["cached"],
                                   "scored_on": record["device"]})
        chosen = [sum(values) / len(values) for values in zip(*(r["chosen"] for r in rewards))]  # mean z-score
        rejected = [sum(values) / len(values) for values in zip(*(r["rejected"] for r in rewards))]
        results[name] = {"members": member_records, "chosen": chosen, "rejected": rejected,
                         "correct": correct_by_pair(chosen, rejected, labels)}
    if not results[baseline]["correct"]:
        raise InputError(f"--data {options.data}: every evaluated pair is labelled 0.5 (a tie): no pair has a direction "
                         f"to agree with")
    out = {"data": str(options.data), "parts": options.parts, "part": options.part, "part_seed": options.part_seed,
           "part_by": PAIRS_CONF.part_by, "format": PAIRS_CONF.format, "limit": options.limit, "pairs": len(pairs),
           "ties_left_out": sum(p == 0.5 for p in labels), "selection_digest": selection, "pair_hashes": hashes,
           "bootstrap": {"unit": "pair", "level": LEVEL, "resamples": RESAMPLES, "seed": SEED},
           "baseline": baseline, "device": options.device, "threads": torch.get_num_threads(), "models": {}}
    base = results[baseline]["correct"]
    for name, result in results.items():
        correct = result["correct"]
        accuracy = interval(bootstrap(by_prompt([row for row, _ in correct], correct.values())))
        difference = None if name == baseline else interval(paired_difference(correct, base))
        out["models"][name] = {"members": result["members"], "accuracy": accuracy,
                               "difference_vs_baseline": difference,
                               "rewards": {"chosen": result["chosen"], "rejected": result["rejected"]}}
    return out


def markdown_table(out: dict) -> str:
    baseline = out["baseline"]
    lines = [f"| model | members | pairs | accuracy [{out['bootstrap']['level']:.0%} CI] | vs {baseline} [CI] |",
             "|---|---|---|---|---|"]
    for name, model in out["models"].items():
        acc, diff = model["accuracy"], model["difference_vs_baseline"]
        versus = "baseline" if diff is None else f"{diff['value']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]"
        lines.append(f"| {name} | {len(model['members'])} | {acc['pairs']} | "
                     f"{acc['value']:.3f} [{acc['low']:.3f}, {acc['high']:.3f}] | {versus} |")
    return "\n".join(lines)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="NAME=PATH[,PATH...]",
                        help="a reward-model folder or run name; comma-separated: an ensemble (repeat for each model)")
    parser.add_argument("--baseline", default=None, help="the model the others are compared with (default: the first)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"HH-RLHF pairs (default: {DEFAULT_DATA})")
    parser.add_argument("--parts", type=positive_int, default=int(PAIRS_CONF.parts),
                        help="disjoint parts by prompt, as reward.data.parts (1: every pair)")
    parser.add_argument("--part", type=int, default=1, help="default 1: the half a recipe proxy (part 0) never saw")
    parser.add_argument("--part-seed", type=int, default=int(PAIRS_CONF.part_seed), help="as reward.data.part_seed")
    parser.add_argument("--limit", type=positive_int, default=None, help="only the first N pairs of the part")
    parser.add_argument("--batch-size", type=positive_int, default=int(CONFIG.reward.score_batch_size))
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, ...")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"where rewards are cached (default: {SCORES_FOLDER}/ beside each reward-model folder)")
    parser.add_argument("--out", type=Path, default=None, help="write every number as JSON here")
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(options.threads)
    check_device(options.device, "--device")  # one line where the device is misspelt or absent
    try:
        models = parse_models(options.model)
        baseline = options.baseline if options.baseline is not None else next(iter(models))
        if baseline not in models:
            raise ValueError(f"--baseline {baseline!r}: expected one of the --model names ({', '.join(models)})")
        pairs = select_pairs(options.data, options.parts, options.part, options.part_seed, options.limit)
    except (ValueError, FileNotFoundError, KeyError) as error:
        parser.error(str(error))
    for name, members in models.items():
        log.info("--model %s: %s", name, ", ".join(str(m.folder) for m in members))
    log.info("%s: part %d of %d (seed %d)%s: %d pairs", options.data, options.part, options.parts, options.part_seed,
             f", first {options.limit}" if options.limit else "", len(pairs))
    out = measure(models, baseline, pairs, options)
    print(markdown_table(out))
    if options.out:
        options.out.write_text(json.dumps(out, indent=2))
        log.info("every number: %s", options.out)
    return out


if __name__ == "__main__":
    main_guard(main)()
