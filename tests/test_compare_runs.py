"""scripts/compare_runs.py: two runs' evaluations compared per policy, paired by prompt and sample index."""

from __future__ import annotations

import importlib.util

from datasets import Dataset

from rsft.paths import RunPaths
from rsft.store import atomic_artifact
from tests.conftest import REPO, TINY_REWARD


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


def write_kept(folder, rows):
    with atomic_artifact(folder, {"stage": "select"}) as tmp:
        Dataset.from_list(rows).save_to_disk(str(tmp))


def test_kept_sets_are_judged_per_prompt_over_the_prompts_both_kept(tmp_path, capsys):
    """--kept scores each run's round_XX/selected with a reward model: per prompt the mean of what it kept,
    paired over the prompts both runs kept, and the difference equals the hand-scored one."""
    import torch
    from omegaconf import OmegaConf

    from reward.backbone import build_tiny_reward_model
    from reward.trained import HH_PROMPT, load_scorer, save_reward_model
    from rsft.models import build_byte_tokenizer

    torch.set_num_threads(1)
    tokenizer = build_byte_tokenizer()
    model = build_tiny_reward_model(OmegaConf.create({**TINY_REWARD, "seed": 0}), tokenizer).eval()
    judge = tmp_path / "judge"
    with atomic_artifact(judge, {"stage": "reward"}) as tmp:
        save_reward_model(model, tokenizer, tmp, {"mean": 0.0, "std": 1.0, "max_length": 64, "prompt_template": HH_PROMPT})
    a, b = RunPaths(tmp_path / "a"), RunPaths(tmp_path / "b")
    prompts = {"p0": "how do I bake bread", "p1": "what is the sun", "p2": "name a river"}
    a_rows = [{"prompt_id": "p0", "prompt": prompts["p0"], "completion": "mix flour and water"},
              {"prompt_id": "p0", "prompt": prompts["p0"], "completion": "knead it"},  # k=2: the mean counts
              {"prompt_id": "p1", "prompt": prompts["p1"], "completion": "a star"},
              {"prompt_id": "p2", "prompt": prompts["p2"], "completion": "the Nile"}]  # p2: only A kept it
    b_rows = [{"prompt_id": "p0", "prompt": prompts["p0"], "completion": "no"},
              {"prompt_id": "p1", "prompt": prompts["p1"], "completion": "a lamp in the sky"}]
    write_kept(a.selected(0), a_rows)
    write_kept(b.selected(0), b_rows)
    load_script().main([str(a.root), str(b.root), "--kept", str(judge)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| round 0"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2"  # p2 is left out: B kept nothing for it
    scorer = load_scorer(str(judge), torch.device("cpu"))  # the plain reward model, framed as it was trained

    def score(rows):
        return scorer.score(scorer.as_trained([r["prompt"] for r in rows]), [r["completion"] for r in rows],
                            progress=False)

    sa, sb = score(a_rows), score(b_rows)
    expected = ((sa[0] + sa[1]) / 2 - sb[0] + sa[2] - sb[1]) / 2
    assert cells[4].startswith(f"{expected:+.3f}")
    assert "round 1" not in out  # no round_01/selected in either run


def test_kept_names_a_missing_reward_model(tmp_path):
    import pytest

    from rsft.errors import MissingInput

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(MissingInput, match="--kept .*nope: no such folder"):
        load_script().main([str(tmp_path / "a"), str(tmp_path / "b"), "--kept", str(tmp_path / "nope")])


def test_a_comparison_is_recorded_and_the_docs_tables_are_rendered_from_the_record(tmp_path, monkeypatch, capsys):
    """--record NAME writes docs/results/NAME.json (here a temporary folder): each policy's intervals, the paired
    A - B and each run's change from its previous policy with their verdicts; gen_docs renders the README's table
    from it, and a table whose record is missing is refused, naming the file (issue 47: results as data)."""
    import pytest

    from rsft.errors import InputError
    from tests.test_scripts import load

    a, b = RunPaths(tmp_path / "a"), RunPaths(tmp_path / "b")
    for paths in (a, b):
        write_eval(paths.initial_eval, 0.0)
    write_eval(a.eval(0), 1.0)
    write_eval(b.eval(0), 0.0)
    script = load_script()
    monkeypatch.setattr(script, "RECORDS", tmp_path / "records")
    script.main([str(a.root), str(b.root), "--column", "judge", "--record", "demo"])
    import json

    record = json.loads((tmp_path / "records" / "demo.json").read_text())
    assert record["command"].endswith("--column judge --record demo") and record["column"] == "judge"
    initial, round_0 = record["policies"]
    assert initial["policy"] == "initial" and "a_vs_previous" not in initial
    assert round_0["a_minus_b"]["mean"] == 1.0 and round_0["a_minus_b"]["verdict"] == "better"
    assert round_0["a_vs_previous"]["mean"] == 1.0 and round_0["b_vs_previous"]["verdict"] == "undecided"
    gen_docs = load("gen_docs", monkeypatch)
    monkeypatch.setattr(gen_docs, "RECORDS", tmp_path / "records")
    marker = "<!-- table default-job from docs/results/demo.json, rendered by scripts/gen_docs.py -->"
    page = f"before\n{marker}\n| stale |\n<!-- end of table -->\nafter"
    rendered = gen_docs.with_record_tables(page, "README.md")
    assert "| stale |" not in rendered and "| after round 0 |" in rendered and "**+1.000 [+1.000, +1.000]**" in rendered
    assert rendered.startswith("before\n") and rendered.endswith("\nafter")
    comparison = gen_docs.comparison_table(record)  # no range measures recorded here: no extra columns
    assert comparison[0] == "| policy | A judge [95% CI] | B judge [95% CI] | A - B (paired) | verdict |"
    assert comparison[3].startswith("| round 0 | 4.000 [") and comparison[3].endswith(
        "| **+1.000 [+1.000, +1.000]** | better (m = 0) |")
    (tmp_path / "records" / "demo.json").unlink()
    with pytest.raises(InputError, match="demo.json, which does not exist"):
        gen_docs.with_record_tables(page, "README.md")
