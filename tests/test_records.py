"""Records of GPU checks (scripts/record_gpu_check.py) and the tables gen_docs renders from them (issue 47)."""

from __future__ import annotations

import json

import pytest

from rsft.errors import InputError
from tests.test_scripts import load

LOG = """# rsft GPU check, 2026-11-26 23:22 UTC
commit: abc1234 + uncommitted changes
card: NVIDIA H200, 143771 MiB, 580.159.04; 16 cores; python 3.12.3
torch 2.11.0+cu130 cuda 13.0 | transformers 5.17.0

## c3-llama1.5b-bfloat16 (timeout 180s, at 183s)
$ python scripts/bench_sampling.py --device cuda --k 8 --prompts 64 --policy-config llama-1.5b --batch-rows 512
{"device": "cuda", "card": "NVIDIA H200", "dtype": "bfloat16", "policy": "llama-1.5b"}
{"method": "hf", "batch_rows": 512, "repeat": 0, "tokens_per_second": 100.0, "ceiling_share": 0.01}
{"method": "plain", "batch_rows": 512, "repeat": 0, "tokens_per_second": 300.0, "ceiling_share": 0.03, "steps": 128}
{"method": "hf", "batch_rows": 512, "repeat": 1, "tokens_per_second": 200.0, "ceiling_share": 0.02}
{"method": "plain", "batch_rows": 512, "repeat": 1, "tokens_per_second": 500.0, "ceiling_share": 0.05, "steps": 128}
{"method": "plain a=0.8", "batch_rows": 512, "repeat": 0, "tokens_per_second": 400.0, "acceptance_set": 0.8}
{"method": "oracle a=0.8 g=3", "batch_rows": 512, "repeat": 0, "tokens_per_second": 600.0, "acceptance_set": 0.8,
 "acceptance_per_position": [0.8, 0.79, 0.81], "tokens_per_target_forward": 2.9, "theoretical_tokens_per_forward": 2.92, "steps": 52}
## c3-llama1.5b-bfloat16: exit 0 after 74s
all parts passed
"""


def test_a_gpu_check_log_becomes_a_record_and_its_tables(tmp_path, monkeypatch):
    log = tmp_path / "gpu_check.log"
    log.write_text(LOG.replace('"acceptance_set": 0.8,\n', '"acceptance_set": 0.8, '))
    record_script = load("record_gpu_check", monkeypatch)
    monkeypatch.setattr(record_script, "RECORDS", tmp_path / "records")
    record_script.main([str(log), "--name", "h200", "--commit", "4f1bd63"])
    record = json.loads((tmp_path / "records" / "h200.json").read_text())
    assert record["commit"] == "4f1bd63" and record["commit_in_log"] == "abc1234 + uncommitted changes"
    assert record["card"].startswith("NVIDIA H200") and record["passed"] is True
    (part,) = record["parts"]
    assert (part["policy"], part["dtype"], len(part["runs"])) == ("llama-1.5b", "bfloat16", 6)
    gen_docs = load("gen_docs", monkeypatch)
    sampling = gen_docs.gpu_sampling_table(record)[2]
    # medians 150 and 400: 2.67x; against HF's faster run (200) 2.00x; plain's share of the ceiling 4.0%
    assert "| bfloat16 | 64 x 8 = 512 | 150 (100-200) | 400 (300-500) | - | 2.67 | 2.00 | 4.0% |" in sampling
    speculation = gen_docs.gpu_speculation_table(record)[2]
    assert "| oracle a=0.8 g=3 | 400 (400-400) | 600 (600-600) | 1.50 | - | 0.80 / 0.79 / 0.81 | 2.90 (2.92) | 52 |" in speculation


def test_a_log_that_is_not_a_gpu_check_is_refused(tmp_path, monkeypatch):
    log = tmp_path / "other.log"
    log.write_text("hello\n")
    with pytest.raises(InputError, match="not a log of scripts/gpu_check.sh"):
        load("record_gpu_check", monkeypatch).main([str(log), "--name", "x"])


def test_the_summary_reads_every_margin_seed_count_and_result_from_the_records_it_names(tmp_path, monkeypatch):
    """docs/results.md's summary: a row names its records; its m, seeds and result cells come from them (here an
    over-seeds record and a label-choice record), and a row naming a missing record stops gen_docs."""
    gen_docs = load("gen_docs", monkeypatch)
    monkeypatch.setattr(gen_docs, "RECORDS", tmp_path)
    difference = {"mean": -0.01, "low": -0.05, "high": 0.02, "seed_means": [0.01, -0.04, 0.0], "verdict": "undecided"}
    (tmp_path / "auto.json").write_text(json.dumps({
        "made_by": "scripts/compare_runs.py seeds", "margin": 0.03, "names": {"a": "auto", "b": "K=8"},
        "runs": {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}, "compared": {"a_minus_b": difference},
        "tokens": {"a": [60, 70, 80], "b": [100, 100, 100]},
        "seconds_by_phase": {"a": {"a0": {"x": 5.0}, "a1": {"x": 9.0}, "a2": {"x": 10.0}},
                             "b": {"b0": {"x": 10.0}, "b1": {"x": 10.0}, "b2": {"x": 10.0}}}}))
    (tmp_path / "labels.json").write_text(json.dumps({
        "made_by": "scripts/bench_labels.py", "margin": 0.02, "seeds": [0, 1, 2],
        "rows": [{"variant": "random"}, {"variant": "posterior-60", "against": {
            "random at B": {**difference, "verdict": "not worse", "mean": 0.0, "low": -0.01}}}]}))
    spec = {"rows": [{"claim": "auto", "rule": "gold", "records": ["auto"]},
                     {"claim": "labels", "rule": "gold order", "records": ["labels"]}]}
    auto, labels = gen_docs.summary_table(spec)[2:]
    assert auto == ("| auto | gold | 0.03 | 3 a side | undecided, -0.010 [-0.050, +0.020] (by seed +0.010, -0.040, "
                    "+0.000); auto at 0.60-0.80 of the tokens and 0.50-1.00 of the seconds | [auto](results/auto.json) |")
    assert labels == ("| labels | gold order | 0.02 | 3 (0, 1, 2) | posterior-60 against random at B: not worse, "
                      "+0.000 [-0.010, +0.020] | [labels](results/labels.json) |")
    with pytest.raises(InputError, match="missing.json, which does not exist"):
        gen_docs.summary_table({"rows": [{"claim": "c", "rule": "r", "records": ["missing"]}]})


def test_a_value_in_a_sentence_is_written_again_from_its_record_and_a_wrong_path_or_record_stops_gen_docs(
        tmp_path, monkeypatch):
    gen_docs = load("gen_docs", monkeypatch)
    monkeypatch.setattr(gen_docs, "RECORDS", tmp_path)
    (tmp_path / "job.json").write_text(json.dumps({"policies": [{"a": {"mean": 0.7612}}, {"a": {"mean": 0.8914}}]}))
    page = "gold ends at <!-- value job policies.-1.a.mean .3f -->0.5<!-- /value --> (<!-- value job policies.0.a.mean +.2f -->?<!-- /value -->)"
    assert gen_docs.with_record_values(page, "p.md") == (
        "gold ends at <!-- value job policies.-1.a.mean .3f -->0.891<!-- /value --> "
        "(<!-- value job policies.0.a.mean +.2f -->+0.76<!-- /value -->)")
    with pytest.raises(InputError, match="no field 'policies.2.a.mean' \\(stopped at '2'\\)"):
        gen_docs.with_record_values("<!-- value job policies.2.a.mean .3f -->0<!-- /value -->", "p.md")
    with pytest.raises(InputError, match="gone.json, which does not exist"):
        gen_docs.with_record_values("<!-- value gone a .3f -->0<!-- /value -->", "p.md")


def test_an_over_seeds_record_with_range_measures_shows_them_by_run_and_in_the_summary(monkeypatch):
    """issue 48: a compare_runs.py seeds record's range measures (each run's last evaluation) get their own table
    by run, and a summary row asking for one (show.range) gives each side's mean over seeds after the verdict."""
    gen_docs = load("gen_docs", monkeypatch)
    difference = {"mean": -0.149, "low": -0.303, "high": -0.009, "seed_means": [-0.149], "verdict": "worse"}
    record = {"made_by": "scripts/compare_runs.py seeds", "margin": 0.1, "column": "judge",
              "names": {"a": "kl", "b": "online"}, "runs": {"a": ["runs/kl-s0"], "b": ["runs/on-s0"]},
              "compared": {"a": {**difference, "mean": 0.6}, "b": {**difference, "mean": 0.75}, "a_minus_b": difference},
              "tokens": {"a": [100], "b": [100]}, "seconds_by_phase": {"a": {"runs/kl-s0": {"x": 1.0}},
                                                                       "b": {"runs/on-s0": {"x": 1.0}}},
              "range": {"a": [{"distinct_2_all": 0.6033, "mean_entropy": 0.98}], "b": [{"distinct_2_all": 0.2069}]}}
    lines = gen_docs.over_seeds_table(record)
    at = lines.index("| side | run | distinct-2 (all) | token entropy |")
    assert lines[at + 2:at + 4] == ["| online | on-s0 | 0.207 | - |", "| kl | kl-s0 | 0.603 | 0.980 |"]
    assert gen_docs.headline(record, {"range": "distinct_2_all"}).endswith("; distinct-2 (all) 0.60 against 0.21")
