"""scripts/compare_runs.py: two runs' evaluations compared per policy, paired by prompt and sample index."""

from __future__ import annotations

import importlib.util

from datasets import Dataset

from rsft.paths import RunPaths, atomic_artifact
from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("compare_runs", REPO / "scripts" / "compare_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_eval(folder, judge_offset):
    rows = [{"prompt_id": f"p{p}", "sample_idx": s, "judge": p + s + judge_offset, "gold": 0.5}
            for p in range(6) for s in range(2)]
    with atomic_artifact(folder, {"stage": "eval"}) as tmp:
        Dataset.from_list(rows).save_to_disk(str(tmp))


def test_compare_runs_prints_paired_differences_per_policy(tmp_path, capsys):
    a, b = RunPaths(tmp_path / "a"), RunPaths(tmp_path / "b")
    for paths, offset in ((a, 0.0), (b, 0.0)):
        write_eval(paths.initial_eval, offset)
    write_eval(a.eval(0), 1.0)
    write_eval(b.eval(0), 0.0)
    load_script().main([str(a.root), str(b.root)])
    out = capsys.readouterr().out
    assert "A judge [95% CI]" in out  # the judge's column is preferred over gold
    lines = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| ")}
    assert "+0.000 [+0.000, +0.000]" in lines["| initial"]
    assert "+1.000 [+1.000, +1.000]" in lines["| round 0"] and "1.000 [1.000, 1.000] |" in lines["| round 0"]
