"""scripts/bench_sampling.py's speed model: the acceptance a draft needs, from measured forward costs."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("bench_sampling", REPO / "scripts" / "bench_sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_acceptance_needed_inverts_the_speedup_model():
    bench = load_script()
    plain, verify, draft = 0.100, 0.150, 0.05  # a step, a step with every row verifying one draft token
    # a draft that is never right: one token per step at 1.5 + 0.05 steps' cost
    assert bench.speculative_speedup(0.0, 1, plain, verify, draft) == pytest.approx(1 / 1.55)
    # always right at gamma 2: 3 tokens per step
    assert bench.speculative_speedup(1.0, 2, plain, 0.200, draft) == pytest.approx(3 / 2.1)
    for target in (1.0, 1.25):
        a = bench.acceptance_needed(target, 1, plain, verify, draft)
        assert 0 < a < 1 and bench.speculative_speedup(a, 1, plain, verify, draft) == pytest.approx(target, abs=1e-9)
    assert bench.acceptance_needed(1.25, 1, plain, 0.170, draft) is None  # 2 / 1.75 < 1.25 even when always right
    # free verification: any acceptance above zero pays
    assert bench.acceptance_needed(1.0, 1, plain, plain, 0.0) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("script", ["bench_sampling.py", "bench_reward.py", "replay_budget.py", "bench_budget.py", "reward_levers.py", "diversity_curve.py"])
def test_the_benchmark_scripts_compose_the_config_and_parse_their_arguments(script):
    """Each composes conf/ (with the typed schema registered) or imports the stages before it parses
    its arguments: `--help` fails when either breaks."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--help"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
