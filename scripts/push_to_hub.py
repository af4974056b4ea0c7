"""Push a finished run's trained policy and the completions it was trained on to the Hugging Face hub.

    python scripts/push_to_hub.py runs/demo --repo you/smollm2-rsft                 # policy + kept dataset
    python scripts/push_to_hub.py runs/demo --repo you/smollm2-rsft --dry-run       # say what would be pushed

The policy is the one the last round ended with: round_XX/dpo/ when that round ran DPO, else
round_XX/policy/ (a plain save_pretrained folder: LoRA is already merged). The dataset is that
round's selected/ (the kept completions SFT trained on, pooled over rounds as select.pool_rounds
said), pushed to <repo>-data as a dataset repo. Both go through transformers' and datasets' own
push_to_hub, so they need `huggingface-cli login` (or HF_TOKEN) and network access; rsft itself never
does. The pushed policy loads with AutoModelForCausalLM.from_pretrained("<repo>").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rsft.paths import RunPaths
from rsft.store import is_complete, load_dataset_artifact


def final_artifacts(run: Path) -> tuple[int, Path, Path]:
    """(last round, its policy folder, its selected/ folder) of a run; SystemExit when it has none."""
    paths = RunPaths(run)
    last = None
    r = 0
    while paths.round_dir(r).exists():
        if is_complete(paths.policy(r)):
            last = r
        r += 1
    if last is None:
        raise SystemExit(f"{run} has no complete round_XX/policy/; run `python -m rsft.run stage=loop` first")
    policy = paths.dpo_policy(last) if is_complete(paths.dpo_policy(last)) else paths.policy(last)
    return last, policy, paths.selected(last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the run directory, e.g. runs/demo")
    parser.add_argument("--repo", required=True, help="hub repo id for the policy; the dataset goes to <repo>-data")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--no-dataset", action="store_true", help="push the policy only")
    parser.add_argument("--dry-run", action="store_true", help="print what would be pushed and stop")
    args = parser.parse_args()
    last, policy, selected = final_artifacts(args.run)
    print(f"round {last}: policy {policy} -> {args.repo}")
    if not args.no_dataset:
        print(f"round {last}: kept completions {selected} -> {args.repo}-data (dataset)")
    if args.dry_run:
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(policy).push_to_hub(args.repo, private=args.private)
    AutoTokenizer.from_pretrained(policy).push_to_hub(args.repo, private=args.private)
    if not args.no_dataset:
        load_dataset_artifact(selected).push_to_hub(f"{args.repo}-data", private=args.private)


if __name__ == "__main__":
    main()
