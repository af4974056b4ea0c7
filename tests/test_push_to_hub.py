"""scripts/push_to_hub.py picks the policy the last round ended with and that round's kept set (no network)."""

from __future__ import annotations

import importlib.util

import pytest

from rsft.paths import RunPaths
from rsft.store import atomic_artifact
from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("push_to_hub", REPO / "scripts" / "push_to_hub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def complete(path):
    with atomic_artifact(path, {"stage": "test"}):
        pass


def test_the_last_complete_round_and_its_dpo_policy_when_there_is_one(tmp_path):
    script, paths = load_script(), RunPaths(tmp_path / "run")
    for r in (0, 1):
        complete(paths.policy(r))
        complete(paths.selected(r))
    paths.round_dir(2).mkdir()  # a round that started but trained nothing
    assert script.final_artifacts(paths.root) == (1, paths.policy(1), paths.selected(1))
    complete(paths.dpo_policy(1))
    assert script.final_artifacts(paths.root)[1] == paths.dpo_policy(1)


def test_a_run_without_a_trained_policy_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="stage=loop"):
        load_script().final_artifacts(tmp_path / "empty")
