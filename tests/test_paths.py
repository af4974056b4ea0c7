"""The run directory: atomic artifacts, skip and resume, a kill mid-write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rsft.errors import StaleArtifact
from rsft.fingerprints import check_reuse
from rsft.paths import RunPaths
from rsft.store import atomic_artifact, is_complete, read_meta
from tests.pipe_lines import PipeLines


def test_artifact_appears_only_complete(tmp_path):
    final = tmp_path / "round_00" / "samples"
    with atomic_artifact(final, {"counts": 1}) as tmp:
        (tmp / "data.txt").write_text("x")
        assert not final.exists() and not is_complete(final)
    assert is_complete(final) and (final / "data.txt").read_text() == "x"
    meta = read_meta(final)
    assert meta["counts"] == 1 and "versions" in meta and "build_seconds" in meta


def test_an_exception_leaves_nothing_behind(tmp_path):
    final = tmp_path / "samples"
    with pytest.raises(RuntimeError):
        with atomic_artifact(final, {}) as tmp:
            (tmp / "part").write_text("half")
            raise RuntimeError("boom")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_incomplete_folder_is_not_trusted_and_is_rebuilt(tmp_path):
    final = tmp_path / "samples"
    final.mkdir()
    (final / "junk").write_text("from a killed run")
    assert not check_reuse(final, overwrite=False, what="test", wanted={})
    with atomic_artifact(final, {}) as tmp:
        (tmp / "good").write_text("ok")
    assert sorted(p.name for p in final.iterdir()) == ["good", "meta.json"]
    assert check_reuse(final, overwrite=False, what="test", wanted={})
    assert not check_reuse(final, overwrite=True, what="test", wanted={})


def test_kill_minus_nine_mid_write_leaves_no_trusted_artifact(tmp_path):
    final = tmp_path / "samples"
    script = (
        "import time, sys\n"
        "from rsft.store import atomic_artifact\n"
        f"with atomic_artifact({str(final)!r}, {{}}) as tmp:\n"
        "    (tmp / 'part').write_text('half')\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    PipeLines(proc.stdout).until("writing", timeout=120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert not is_complete(final) and not final.exists()
    assert any(p.name.startswith(".samples.tmp-") for p in tmp_path.iterdir())  # the debris of the kill
    with atomic_artifact(final, {}) as tmp:  # the next write sweeps it
        (tmp / "ok").write_text("ok")
    assert [p.name for p in tmp_path.iterdir()] == ["samples"]


def test_layout_is_stable():
    paths = RunPaths("runs/x")
    assert str(paths.samples(0)) == "runs/x/round_00/samples"
    assert str(paths.policy(2)) == "runs/x/round_02/policy"
    assert str(paths.reward) == "runs/x/reward"


def test_round_table(tmp_path):
    """Which artifact each round reads, in one place (rsft.paths.RunPaths)."""
    paths = RunPaths(tmp_path / "runs" / "x", tmp_path / "runs")
    configured = None
    assert paths.sampling_policy(0) is configured
    assert paths.sampling_policy(1) == paths.policy(0)
    assert paths.sampling_policy(3) == paths.policy(2)
    assert paths.sft_init_policy(0, "initial") is configured and paths.sft_init_policy(2, "initial") is configured
    assert paths.sft_init_policy(0, "previous") is configured
    assert paths.sft_init_policy(2, "previous") == paths.policy(1)
    with pytest.raises(ValueError, match="sft.init"):
        paths.sft_init_policy(0, "latest")
    assert paths.eval_policy(0) == paths.policy(0) and paths.eval_policy(2) == paths.policy(2)
    # before round r's policy exists, stage=draft distils the configured policy into draft/
    assert paths.draft_teacher(0) is configured and paths.draft_output(0) == paths.draft
    assert paths.draft_teacher(-1) is configured and paths.draft_output(-1) == paths.draft
    assert paths.sampling_draft(0) == paths.draft and paths.sampling_draft(1) == paths.draft
    with atomic_artifact(paths.policy(0), {}):
        pass
    assert paths.draft_teacher(0) == paths.policy(0) and paths.draft_output(0) == paths.round_draft(0)
    with atomic_artifact(paths.round_draft(0), {}):
        pass
    assert paths.sampling_draft(1) == paths.round_draft(0)  # the draft distilled after round 0 serves round 1
    assert paths.sampling_draft(0) == paths.draft and paths.sampling_draft(2) == paths.draft
    assert paths.other_run("y").root == tmp_path / "runs" / "y"


def test_round_table_with_dpo_and_refreshed_reward_models(tmp_path):
    """loop.dpo: a round ends with its DPO policy; loop.refresh_reward: a round is scored by its own
    reward model; eval always judges with the run's reward/."""
    plain = RunPaths(tmp_path / "runs" / "x", tmp_path / "runs")
    paths = RunPaths(tmp_path / "runs" / "x", tmp_path / "runs", refresh_reward=True, dpo=True)
    assert plain.round_policy(1) == plain.policy(1) and plain.scoring_reward(2) == plain.reward
    assert paths.round_policy(1) == paths.dpo_policy(1) == tmp_path / "runs" / "x" / "round_01" / "dpo"
    assert paths.sampling_policy(0) is None and paths.sampling_policy(2) == paths.dpo_policy(1)
    assert paths.dpo_init_policy(1) == paths.policy(1)  # DPO starts from (and is anchored to) the round's SFT policy
    assert paths.eval_policy(1) == paths.dpo_policy(1)
    assert paths.sft_init_policy(2, "previous") == paths.dpo_policy(1)
    assert paths.scoring_reward(2) == paths.round_reward(2) == tmp_path / "runs" / "x" / "round_02" / "reward"
    assert paths.refresh_labels(1) == [paths.round_prefs(0), paths.round_prefs(1)]
    # pruning and adaptive K score while the round samples: with the newest model that exists by then
    assert paths.budget_reward(0) == paths.reward and paths.budget_reward(2) == paths.round_reward(1)
    assert plain.budget_reward(0) == plain.budget_reward(2) == plain.reward
    assert paths.eval_reward == paths.reward == plain.eval_reward
    assert paths.other_run("y").dpo and paths.other_run("y").refresh_reward



def test_an_artifact_recorded_under_a_renamed_settings_old_name_still_matches(tmp_path):
    """rsft.config.RENAMED: draft_model.* is distill.*, sample.adaptive.budget is sample.adaptive_k.mean."""
    final = tmp_path / "draft"
    old = {"config": {"draft_model.epochs": 1, "sample.adaptive.budget": 3.0}, "inputs": {}, "user_files": {}}
    with atomic_artifact(final, {"stage": "draft"}, old):
        pass
    new = {"config": {"distill.epochs": 1, "sample.adaptive_k.mean": 3.0}, "inputs": {}, "user_files": {}}
    assert check_reuse(final, overwrite=False, what="draft", wanted=new)
    with pytest.raises(StaleArtifact, match="distill.epochs: 1 -> 2"):
        check_reuse(final, overwrite=False, what="draft", wanted={**new, "config": {**new["config"], "distill.epochs": 2}})
