"""Every script in scripts/ (and `python -m rsft.serve_reward`) ends a user's mistake as rsft.run does: one
line naming the path or argument and what was expected, then how to see the traceback; never a traceback."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import subprocess
import sys

import pytest

from rsft.errors import TRACEBACK_HINT, ConfigError, InputError, main_guard
from tests.conftest import REPO

SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))


def load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))  # bench_budget imports replay_budget, as `python scripts/x.py`
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_line(main, argv, caplog) -> str:
    """What the command prints when it stops: the line, checked to be one line plus the hint, and no bug."""
    with caplog.at_level(logging.ERROR, logger="rsft"), pytest.raises(SystemExit) as stop:
        main_guard(main)(argv)
    assert isinstance(stop.value.code, str), stop.value.code
    line, hint = stop.value.code.split("\n")
    assert hint == TRACEBACK_HINT and not caplog.records  # a bug would have logged its traceback
    return line


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_ends_through_main_guard(script):
    assert (REPO / "scripts" / script).read_text().rstrip().endswith(
        'if __name__ == "__main__":\n    main_guard(main)()'), f"scripts/{script}: end it with main_guard(main)()"


# scripts that read a run directory: argv for a run at `run`
ON_A_RUN = {
    "replay_budget": lambda run: [run, "--rounds", "0"],
    "bench_budget": lambda run: [run],
    "diversity_curve": lambda run: [run],
    "compare_runs": lambda run: [run, run],
    "online_vs_rounds": lambda run: [run, run],
    "push_to_hub": lambda run: [run, "--repo", "you/model", "--dry-run"],
    "overopt_point": lambda run: [run, "--round", "0"],
    "bench_grpo": lambda run: ["compare", run],
}


@pytest.mark.parametrize("folder", ["missing", "empty"])
@pytest.mark.parametrize("script", sorted(ON_A_RUN))
def test_a_missing_or_empty_run_directory_is_one_line_naming_it(script, folder, tmp_path, monkeypatch, caplog,
                                                                 capsys):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    run = tmp_path / folder
    if folder == "empty":
        run.mkdir()
    line = one_line(load(script, monkeypatch).main, ON_A_RUN[script](str(run)), caplog)
    assert str(run) in line and ("no such folder" in line if folder == "missing" else "stage=" in line), line
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("script,argv,expected", [
    ("bench_reward", ["--data", "{tmp}/nope.jsonl.gz"], "--data='{tmp}/nope.jsonl.gz': no such file"),
    ("bench_sampling", ["--methods", "plain", "fast"], "--methods: unknown method(s) 'fast'"),
    ("bench_sampling", ["--methods", "model-adaptive"], "--methods model: needs --draft PATH"),
    ("bench_sampling", ["--batch-rows", "0"], "--batch-rows 0: expected positive integers"),
    ("bench_scaling", ["--repeats", "0"], "--repeats 0: expected at least 1"),
    ("replay_budget", ["{tmp}", "--k", "0"], "--k 0: expected at least 1"),
    ("bench_grpo", ["train", "--out", "{tmp}", "--learning-rate", "0"], "--learning-rate 0.0: expected > 0"),
    ("push_to_hub", ["{tmp}", "--repo", "a/b/c", "--dry-run"], "--repo a/b/c: Repo id must be in the form"),
])
def test_bad_arguments_are_one_line_naming_the_argument(script, argv, expected, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    line = one_line(load(script, monkeypatch).main, [a.format(tmp=tmp_path) for a in argv], caplog)
    assert line.startswith(expected.format(tmp=tmp_path)), line


@pytest.mark.parametrize("script", ["replay_budget", "bench_budget"])
@pytest.mark.parametrize("device", ["gpu", "cuda:99", "cuda"])
def test_a_device_this_machine_lacks_is_one_line_naming_device(script, device, tmp_path, monkeypatch, caplog):
    """--device is checked as rsft.run checks device= (rsft.preflight.check_device), before the run is read."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    line = one_line(load(script, monkeypatch).main, [str(tmp_path), "--device", device], caplog)
    assert line.startswith(f"--device {device!r}: expected" if device == "gpu" else f"--device {device} but"), line


def test_diversity_curve_probes_its_out_folder_before_any_work(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = one_line(load("diversity_curve", monkeypatch).main,
                    [str(tmp_path / "missing-run"), "--out", str(blocker / "x.png")], caplog)
    assert line.startswith(f"--out {blocker / 'x.png'}: cannot write in {blocker}"), line


@pytest.mark.parametrize("rounds,expected", [(["5"], "--rounds 5: {run} has no complete evaluation of round(s) 5 "
                                                     "(its evaluated rounds: 0, 1)"),
                                             (["-1"], "--rounds -1: expected round numbers >= 0")])
def test_diversity_curve_names_rounds_the_run_lacks(rounds, expected, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    module = load("diversity_curve", monkeypatch)
    monkeypatch.setattr(module, "evaluations", lambda paths: [("initial", tmp_path), ("round 0", tmp_path),
                                                              ("round 1", tmp_path)])
    line = one_line(module.main, [str(tmp_path), "--rounds", *rounds], caplog)
    assert line.startswith(expected.format(run=tmp_path)), line


def test_compare_runs_kept_refuses_a_language_model_folder(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_labels": 2}')
    line = one_line(load("compare_runs", monkeypatch).main, [str(tmp_path), str(tmp_path), "--kept", str(policy)],
                    caplog)
    assert line.startswith(f"--kept {policy}: not a reward model") and "LlamaForCausalLM" in line, line


def test_a_schedule_that_does_not_parse_names_it(monkeypatch):
    parse = load("bench_budget", monkeypatch).parse_schedule
    assert parse("prune=8,16 share=0.5 apart", 8, 48)[1].checkpoints == (8, 16)
    for text, message in (("prune=8,x", "invalid literal"), ("prune=8 cut=2", "unknown word(s) cut"),
                          ("prune=64", "expected checkpoints below"), ("prune=8 share=1.5", "expected a fraction")):
        with pytest.raises(ConfigError, match=rf"^--schedule '{re.escape(text)}': .*{re.escape(message)}"):
            parse(text, 8, 48)


def test_gen_docs_names_a_page_without_its_markers(monkeypatch):
    with pytest.raises(InputError, match="README.md lacks the markers"):
        load("gen_docs", monkeypatch).with_block("no markers", "<!-- a -->", "<!-- b -->", "", "README.md")


def test_argparse_usage_errors_pass_as_they_are(monkeypatch, capsys):
    with pytest.raises(SystemExit) as stop:
        main_guard(load("compare_runs", monkeypatch).main)(["only-one-run"])
    assert stop.value.code == 2 and "usage:" in capsys.readouterr().err


def test_serve_reward_names_a_spec_it_cannot_open(tmp_path, caplog, monkeypatch):
    from reward import server as serve_reward

    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    line = one_line(serve_reward.main, [str(tmp_path / "nope")], caplog)
    assert line.startswith(f"reward source '{tmp_path / 'nope'}': not a folder here"), line


def test_serve_reward_names_a_port_it_cannot_listen_on(caplog, monkeypatch):
    import socket

    import reward.specs
    from reward import server as serve_reward

    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    monkeypatch.setattr(reward.specs, "open_source", lambda spec, device, **options: object())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(serve_reward.main, ["toy:spec", "--port", str(port), "--revision", "r1"], caplog)
    assert line.startswith(f"--host 127.0.0.1 --port {port}: cannot listen there"), line


@pytest.mark.parametrize("command", [
    ["scripts/replay_budget.py", "{run}", "--rounds", "0"],  # the example: was a FileNotFoundError traceback
    ["scripts/push_to_hub.py", "{run}", "--repo", "you/model", "--dry-run"],
])
def test_the_command_prints_one_line_and_no_traceback(command, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RSFT_TRACEBACK"}
    run = tmp_path / "missing"
    done = subprocess.run([sys.executable, *[c.format(run=run) for c in command]], capture_output=True, text=True,
                          cwd=REPO, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr
    line, hint = done.stderr.strip().splitlines()[-2:]
    assert str(run) in line and "no such folder" in line and hint == TRACEBACK_HINT


def test_bench_labels_decides_each_variant_against_random_pooled_over_seeds(monkeypatch):
    """scripts/bench_labels.py --record: each variant against random at the full budget, and a chosen one against
    random at its own budget, pooled over seeds on the prompts every seed has; random-60 is the control."""
    from pathlib import Path

    script = load("bench_labels", monkeypatch)

    def result(choose, budget, right):  # gold-order keys: 4 pairs on each of prompts a, b (c on seed 0 only)
        keys = {(p, i): float(i < right) for p in "ab" for i in range(4)}
        return {"choose": choose, "budget": budget, "train_pairs": budget, "gold": keys}

    measured = []
    for seed in range(3):
        results = {"random": result("random", 100, 2), "posterior": result("posterior", 100, 3),
                   "posterior-60": result("posterior", 60, 2), "random-60": result("random", 60, 1)}
        if seed == 0:
            results["random"]["gold"][("c", 9)] = 1.0
        measured.append((Path(f"s{seed}"), seed, results))
    rows = {row["variant"]: row for row in script.decided_rows(measured, 0.05)}
    assert "against" not in rows["random"] and rows["random"]["gold_order"]["mean"] == 0.5  # c left out
    assert rows["posterior"]["against"]["random at B"]["mean"] == 0.25
    assert rows["posterior"]["against"]["random at B"]["verdict"] == "better"
    assert set(rows["posterior"]["against"]) == {"random at B"}  # at B random at equal labels is random itself
    assert rows["posterior-60"]["against"]["random at B"]["verdict"] == "not worse"
    assert rows["posterior-60"]["against"]["random at equal labels"] == {
        **rows["posterior-60"]["against"]["random at equal labels"], "variant": "random-60", "mean": 0.25}
    assert rows["random-60"]["against"]["random at B"]["verdict"] == "worse"
    assert set(rows["random-60"]["against"]) == {"random at B"}


def frontier_record(path, a_runs, b_runs, a_points, b_points):
    import json

    path.write_text(json.dumps({"a": a_runs, "b": b_runs, "range": {"a": a_points, "b": b_points}}))
    return str(path)


def test_entropy_frontier_tables_each_levers_last_point_against_grpos_nearest_and_draws_the_plot(tmp_path, monkeypatch,
                                                                                                  capsys):
    """scripts/entropy_frontier.py: a lever's point is its last evaluation on each seed; where its B side is GRPO,
    the table reads GRPO's evaluation of the nearest pass@1 on that seed."""
    pt = lambda c, p, e: {"completions": c, "pass_at_1": p, "mean_entropy": e}  # noqa: E731
    grpo = [[pt(512, 0.4, 0.5), pt(1024, 0.8, 0.2)], [pt(512, 0.5, 0.4), pt(1024, 0.7, 0.3)]]
    lever = frontier_record(tmp_path / "lever.json", ["runs/x-s0", "runs/x-s1"],
                            ["runs/grpo/grpo-s0-lr0.0003", "runs/grpo/grpo-s1-lr0.0003"],
                            [[pt(512, 0.3, 0.6), pt(1536, 0.75, 0.25)], [pt(1536, 0.45, 0.1)]], grpo)
    out = tmp_path / "img" / "frontier.png"
    load("entropy_frontier", monkeypatch).main([f"{lever}:lever", "--out", str(out)])
    table = capsys.readouterr().out
    assert "| lever | 0 | 0.750 | 0.250 | 0.200 (pass@1 0.800, 1,024 completions) |" in table
    assert "| lever | 1 | 0.450 | 0.100 | 0.400 (pass@1 0.500, 512 completions) |" in table
    assert out.stat().st_size > 0


@pytest.mark.parametrize("content,expected", [("not json", "not JSON"), ('{"range": {}}', "range.a"),
                                              ('{"range": {"a": [[{"pass_at_1": 0.5}]]}}', "range.a[0]")])
def test_entropy_frontier_names_a_bad_record_and_what_it_expected(content, expected, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    record = tmp_path / "r.json"
    record.write_text(content)
    line = one_line(load("entropy_frontier", monkeypatch).main, [str(record)], caplog)
    assert str(record) in line and expected in line, line
