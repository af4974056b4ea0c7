"""Peak memory of the row stages against the prompt count: sample, score, select (and eval), each alone.

    python scripts/bench_memory.py --prompts 4096 16384                  # K=8, 16 new tokens, tiny models
    python scripts/bench_memory.py --prompts 256 1024 --stages sample score select eval

Why: a stage that holds every row as a Python object grows with the prompt set (issue 33: ~40 KB per
prompt at K=8); one that streams its shards through files on disk keeps a flat peak. For each N the
script writes N synthetic prompts to a JSONL file (data=local), a tiny random reward model into the
run's reward/ (the trained source every stage reads; no prefs or reward training), and runs each stage
as a user would (`python -m rsft.run stage=...`) in its own process on the tiny policy, in order, each
reading the previous one's artifact. Reported per (N, stage): the stage process's peak resident set
(ru_maxrss from os.wait4 of that process alone) and its wall time. The stages run one after the other
with one thread each (OMP_NUM_THREADS=1, threads=1), so that the numbers do not depend on what else
the machine runs; wall times still do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rsft.errors import main_guard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGES = ("sample", "score", "select", "eval")
# the tiny reward model of the tests (tests/conftest.py TINY_REWARD): a random Llama on the byte tokenizer
TINY_REWARD = {"kind": "tiny", "name_or_path": "tiny", "arch": "llama", "hidden_size": 16, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32, "seed": 0}
WORDS = ("write", "a", "short", "poem", "about", "the", "sea", "list", "three", "colours", "explain", "why",
         "rivers", "bend", "name", "two", "birds", "that", "sing", "at", "night")


def write_prompts(path: Path, count: int) -> None:
    """`count` distinct synthetic prompts (5-12 words, drawn by a fixed rule), one JSON object a line."""
    with open(path, "w") as handle:
        for i in range(count):
            words = [WORDS[(i * 7 + j * 13 + i // len(WORDS)) % len(WORDS)] for j in range(5 + i % 8)]
            handle.write(json.dumps({"prompt_id": f"p{i:06d}", "prompt": f"{' '.join(words)} #{i}"}) + "\n")


def write_tiny_reward(folder: Path) -> None:
    """A random tiny reward model saved as stage=reward saves one (meta.json last), so score reads it."""
    from omegaconf import OmegaConf

    from reward.backbone import build_tiny_reward_model
    from reward.trained import HH_PROMPT, save_reward_model
    from rsft.models import build_byte_tokenizer
    from rsft.store import atomic_artifact

    tokenizer = build_byte_tokenizer()
    model = build_tiny_reward_model(OmegaConf.create(TINY_REWARD), tokenizer).eval()
    with atomic_artifact(folder, {"stage": "reward"}) as tmp:
        save_reward_model(model, tokenizer, tmp, {"mean": 0.0, "std": 1.0, "max_length": 64,
                                                  "prompt_template": HH_PROMPT})


def run_stage(stage: str, overrides: list[str]) -> dict:
    """One stage in its own process; its peak RSS (MB) and wall seconds."""
    command = [sys.executable, "-m", "rsft.run", f"stage={stage}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this process's own rusage, not every child's so far
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        if child.returncode != 0:
            log.seek(0)
            raise SystemExit(f"`{' '.join(command)}` failed:\n{log.read().decode()[-3000:]}")
    # ru_maxrss is in KiB on Linux
    return {"peak_mb": round(usage.ru_maxrss / 1024, 1), "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--stages", nargs="+", default=["sample", "score", "select"], choices=STAGES)
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--eval-prompts", type=int, default=None,
                        help="held-out prompts for eval (default: the same N as the train set)")
    parser.add_argument("--runs-root", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every stage")
    parser.add_argument("--out", type=Path, default=None, help="also write the records as JSON here")
    args = parser.parse_args()
    runs_root = args.runs_root or Path(tempfile.mkdtemp(prefix="rsft-bench-memory-"))
    runs_root.mkdir(parents=True, exist_ok=True)
    from rsft.paths import RunPaths

    results = []
    for count in args.prompts:
        prompts = runs_root / f"prompts-{count}.jsonl"
        write_prompts(prompts, count)
        eval_prompts = runs_root / f"eval-prompts-{args.eval_prompts or count}.jsonl"
        write_prompts(eval_prompts, args.eval_prompts or count)
        run_name = f"n{count}"
        write_tiny_reward(RunPaths(runs_root / run_name, runs_root).reward)
        overrides = [f"run_name={run_name}", f"paths.runs_root={runs_root}", "policy=tiny", "reward=tiny",
                     "logger=none", "device=cpu", "threads=1", "data=local", f"data.path={prompts}",
                     f"data.eval_path={eval_prompts}", "data.id_column=prompt_id", "loop.refresh_reward=false",
                     f"sample.num_samples={args.num_samples}", f"sample.max_new_tokens={args.max_new_tokens}",
                     f"eval.num_samples={args.num_samples}", "eval.policy=initial", *args.extra]
        for stage in args.stages:
            record = {"prompts": count, "stage": stage, **run_stage(stage, overrides)}
            results.append(record)
            print(json.dumps(record), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(results: list[dict]) -> None:
    """Per stage: peak MB and seconds at each N, and the largest N's peak against the smallest's."""
    print("\n| prompts | stage | peak MB | wall s |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['prompts']:,} | {r['stage']} | {r['peak_mb']:.0f} | {r['seconds']:.1f} |")
    counts = sorted({r["prompts"] for r in results})
    if len(counts) > 1:
        for stage in dict.fromkeys(r["stage"] for r in results):
            peak = {r["prompts"]: r["peak_mb"] for r in results if r["stage"] == stage}
            print(f"{stage}: peak at {counts[-1]:,} prompts / at {counts[0]:,} = {peak[counts[-1]] / peak[counts[0]]:.3f}")


if __name__ == "__main__":
    main_guard(main)()
