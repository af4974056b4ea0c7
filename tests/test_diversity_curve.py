"""scripts/diversity_curve.py: the jackknife interval of distinct-2 over prompts, and a run's points."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from rsft.errors import MissingInput
from rsft.paths import RunPaths
from rsft.store import atomic_artifact
from rsft.stats import distinct_n

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "diversity_curve.py"


@pytest.fixture(scope="module")
def curve():
    spec = importlib.util.spec_from_file_location("diversity_curve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["diversity_curve"] = module
    spec.loader.exec_module(module)
    return module


def test_jackknife_is_the_pooled_value_with_a_zero_width_interval_when_prompts_are_alike(curve):
    same = {f"p{i}": ["the cat sat on the mat"] for i in range(5)}
    out = curve.jackknife_distinct(same)
    assert out["value"] == pytest.approx(distinct_n(["the cat sat on the mat"] * 5, 2))
    assert out["low"] == pytest.approx(out["value"]) and out["high"] == pytest.approx(out["value"])
    mixed = {"a": ["one two three"], "b": ["one two three"], "c": ["four five six seven"], "d": ["eight nine ten"]}
    wide = curve.jackknife_distinct(mixed)
    assert wide["low"] < wide["value"] < wide["high"]


def test_points_of_a_run_with_judge_intervals(curve, tmp_path, capsys):
    run = tmp_path / "r"
    paths = RunPaths(run)
    for folder, judge in ((paths.initial_eval, 0.0), (paths.eval(0), 1.0)):
        rows = [{"prompt_id": f"p{i}", "sample_idx": s, "completion": f"answer {i} {s} words here",
                 "finish_reason": "eos", "judge": judge + i, "reward": 0.0} for i in range(4) for s in range(2)]
        with atomic_artifact(folder, {"stage": "eval"}) as tmp:
            Dataset.from_list(rows).save_to_disk(str(tmp))
    points = curve.main([f"{run}:mine", "--out", str(tmp_path / "curve.png")])
    assert [(p["label"], p["policy"]) for p in points] == [("initial", "initial"), ("mine", "round 0")]
    assert points[1]["score"]["mean"] == pytest.approx(2.5) and points[1]["column"] == "judge"
    assert (tmp_path / "curve.png").stat().st_size > 0 and "| mine | round 0 |" in capsys.readouterr().out
    with pytest.raises(MissingInput, match="not a run directory"):
        curve.main([str(tmp_path / "missing")])
