"""Turn a log of scripts/gpu_check.sh into a record, docs/results/NAME.json, that scripts/gen_docs.py renders the
GPU tables of docs/benchmarks.md from (issue 47: results as data).

    python scripts/record_gpu_check.py runs/gpu_check/<time>.log --name gpu-h200-run2 [--commit 4f1bd63]

The log holds everything a record needs: its header (the commit, the card, the date, the versions), each part's
command, the bench's own header line (device, dtype, policy shape) and its one JSON line per measurement
(scripts/bench_sampling.py prints them as it goes). --commit names the commit when the log's own is wrong (a copy
of the tree whose .git was older than its files says "<older> + uncommitted changes").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rsft.errors import InputError, main_guard
from rsft.machine import write_record

RECORDS = ROOT / "docs" / "results"
KEPT = ("method", "batch_rows", "repeat", "seconds", "tokens_per_second", "peak_mb", "ceiling_share", "steps",
        "acceptance_set", "gamma", "acceptance_per_position", "tokens_per_target_forward",
        "theoretical_tokens_per_forward")
OPTIONAL = ("graph_capture_seconds", "tokens_per_second_past_capture")  # kept where the log has them (from 83dd691 on)


def parse_log(text: str, path: Path) -> dict:
    """{commit, card, date, versions, passed, parts: [{part, command, policy, dtype, runs}]} from a gpu_check log."""
    def header(prefix: str) -> str | None:
        found = re.search(rf"^{re.escape(prefix)}(.*)$", text, re.MULTILINE)
        return found.group(1).strip() if found else None

    date = header("# rsft GPU check, ")
    if date is None:
        raise InputError(f"{path}: not a log of scripts/gpu_check.sh (no '# rsft GPU check, <date>' line)")
    parts, current = [], None
    for line in text.splitlines():
        started = re.match(r"^## (\S+) \(timeout", line)
        if started:
            current = {"part": started.group(1), "command": None, "policy": None, "dtype": None, "runs": []}
            parts.append(current)
        elif current is not None and line.startswith("$ ") and current["command"] is None:
            current["command"] = line[2:]
        elif current is not None and line.startswith('{"device"'):
            bench = json.loads(line)
            current.update(policy=bench.get("policy"), dtype=bench.get("dtype"), device=bench.get("card"))
        elif current is not None and line.startswith('{"method"'):
            run = json.loads(line)
            current["runs"].append({key: run.get(key) for key in KEPT}
                                   | {key: run[key] for key in OPTIONAL if key in run})
    return {"commit": header("commit: "), "card": header("card: "), "date": date,
            "versions": next((line for line in text.splitlines() if line.startswith("torch ")), None),
            "passed": "all parts passed" in text, "parts": [p for p in parts if p["runs"]]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--name", required=True, help="the record's name: docs/results/NAME.json")
    parser.add_argument("--commit", default=None, help="the commit the log ran (when its own line is wrong)")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        raise InputError(f"{args.log}: no such log (scripts/gpu_check.sh writes runs/gpu_check/<time>.log)")
    record = {"record": args.name, "made_by": "scripts/record_gpu_check.py",
              "command": "python scripts/record_gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "source": args.log.name, **parse_log(args.log.read_text(), args.log)}
    if args.commit:
        record["commit_in_log"], record["commit"] = record["commit"], args.commit
    if not record["parts"]:
        raise InputError(f"{args.log}: no bench measurements in it (no part printed a {{\"method\": ...}} line)")
    out = write_record(args.name, record, RECORDS)
    print(f"recorded {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {len(record['parts'])} parts, "
          f"{sum(len(p['runs']) for p in record['parts'])} measurements")


if __name__ == "__main__":
    main_guard(main)()
