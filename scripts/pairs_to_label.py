"""Export the pairs of a round's samples a person should label: those the reward model is least sure of.

    python scripts/pairs_to_label.py runs/mine --round 1 --budget 200 --out labels/round_01.todo.jsonl
    # label each row (label_prob: 1 if `chosen` is the better answer, 0 if `rejected` is, or a probability),
    # save the file as labels/round_01.jsonl, then go on with refresh.pairs=labels:
    python -m rsft.run stage=loop loop.refresh_reward=true refresh.pairs=labels

With your own labeller (refresh.pairs), stage=labels reads your labels of a round as they are; this picks
which pairs you label. Candidates: every pair of distinct completions of one prompt in
round_XX/samples/ (rows stopped by pruning passed over). `--choose posterior` (the default) picks the
`--budget` pairs one at a time where the reward model's head, as a Bayesian Bradley-Terry model, is least
sure, each pick counted before the next, so they spread over what the model tells apart
(rsft.pairs.posterior_design); `--choose uncertain` keeps the pairs where the model disagrees most
with itself across dropout masks (rsft.pairs.pair_uncertainty), which on the demo spent labels worse
than chance (docs/when-to-stop.md#labels-where-the-reward-model-is-unsure); `--choose random` keeps a
random `--budget` of them, to compare. The reward model is `--reward`, else the newest one before the
round's refresh (round r - 1's round_XX/reward/, else the run's reward/).

Each row is a pair in reward.data.format=preference (`prompt`, `chosen`, `rejected`) with `label_prob`
left empty for you: `chosen` and `rejected` are only the two answers, A and B, until you label them.
The rows also say which samples they are (`prompt_id`, `chosen_sample_idx`, `rejected_sample_idx`) and
how unsure the model was (`uncertainty`: the variance its choice ranks by). On the demo task, where the
simulated annotators stand in for you, stage=labels makes the same choice itself (refresh.choose,
docs/when-to-stop.md#labels-where-the-reward-model-is-unsure).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from rsft.errors import InputError, MissingInput, main_guard
from rsft.pairs import MODEL_CHOICES, candidate_pairs, choose_pairs, model_choice
from rsft.paths import RunPaths
from rsft.store import is_complete, load_dataset_artifact


def default_reward(paths: RunPaths, round_idx: int) -> Path:
    """Round r - 1's refreshed reward model where it exists, else the run's reward/."""
    if round_idx > 0 and is_complete(paths.round_reward(round_idx - 1)):
        return paths.round_reward(round_idx - 1)
    return paths.reward


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the run directory (runs/<run_name>)")
    parser.add_argument("--round", type=int, required=True)
    parser.add_argument("--budget", type=int, required=True, help="pairs to export")
    parser.add_argument("--out", type=Path, required=True, help="a .jsonl file to write")
    parser.add_argument("--choose", choices=["posterior", "uncertain", "random"], default="posterior")
    parser.add_argument("--reward", type=Path, default=None, help="the reward model whose uncertainty chooses")
    parser.add_argument("--passes", type=int, default=8, help="dropout masks per completion (uncertain)")
    parser.add_argument("--seed", type=int, default=0, help="the dropout masks' and the random choice's seed")
    args = parser.parse_args(argv)
    if args.budget < 1 or args.passes < 2:
        raise InputError(f"--budget {args.budget} --passes {args.passes}: expected a budget >= 1 and >= 2 passes")
    if not args.run.is_dir():
        raise MissingInput(f"run {args.run}: no such folder; give a run directory (runs/<run_name>)")
    paths = RunPaths(args.run)
    samples_dir = paths.samples(args.round)
    if not is_complete(samples_dir):
        raise MissingInput(f"{samples_dir}: no complete samples of round {args.round}; run "
                           f"`python -m rsft.run stage=sample round={args.round}` first")
    samples = load_dataset_artifact(samples_dir)
    pairs = candidate_pairs(samples, set(samples["prompt_id"]))
    if not pairs:
        raise InputError(f"{samples_dir}: no two distinct completions of one prompt; nothing to label")
    uncertainty = None
    if args.choose in MODEL_CHOICES:
        from reward.trained import STATS_FILE, load_scorer

        reward = args.reward or default_reward(paths, args.round)
        if not (reward / STATS_FILE).is_file():
            raise MissingInput(f"--reward {reward}: no trained reward model there; give one with --reward")
        chosen, uncertainty = model_choice(load_scorer(reward), samples, pairs, args.choose, args.budget, args.passes,
                                           args.seed)
        measure = f"{args.passes} dropout masks" if args.choose == "uncertain" else "its head's posterior"
        print(f"uncertainty from {reward} ({measure})")
    else:
        chosen = choose_pairs(pairs, args.choose, args.budget, random.Random(args.seed))
    of_pair = dict(zip(pairs, uncertainty)) if uncertainty is not None else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    with tmp.open("w") as f:
        for a, b in chosen:
            row_a, row_b = samples[a], samples[b]
            f.write(json.dumps({"prompt": row_a["prompt"], "chosen": row_a["completion"], "rejected": row_b["completion"],
                                "label_prob": None, "prompt_id": row_a["prompt_id"],
                                "chosen_sample_idx": row_a["sample_idx"], "rejected_sample_idx": row_b["sample_idx"],
                                **({"uncertainty": of_pair[(a, b)]} if of_pair else {})}) + "\n")
    tmp.replace(args.out)
    print(f"{len(chosen)} of {len(pairs)} candidate pairs of round {args.round} ({args.choose}) -> {args.out}; fill in "
          f"label_prob (1: chosen is better, 0: rejected is) and save it as <refresh.pairs>/round_{args.round:02d}.jsonl")


if __name__ == "__main__":
    main_guard(main)()
