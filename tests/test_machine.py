"""Every artifact records the machine that made it and the library versions; work from another machine is
reused, read or resumed with a warning naming both; summary.md says which machines made the run."""

from __future__ import annotations

import json
import logging

import pytest
from datasets import Dataset

import rsft.machine as machine_module
from rsft.machine import describe, machine
from rsft.paths import RunPaths
from rsft.report import Records, machine_lines
from rsft.run import run_stage
from rsft.store import ShardStore, atomic_artifact, read_meta
from tests.test_reward_stages import FUNCTION

OTHER = {"cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "cpu_id": "GenuineIntel family 6 model 106",
         "vector_flags": ["avx", "avx2", "fma", "avx512f"], "cores": 2, "gpu": None}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(machine_module, "_WARNED", set())


def _pretend_made_elsewhere(path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["machine"] = OTHER
    (path / "meta.json").write_text(json.dumps(meta))


def test_this_machine_names_its_cpu_flags_and_versions(make_cfg):
    record = machine()
    assert record["cpu"] and record["cores"] >= 1 and isinstance(record["vector_flags"], list)
    assert record["cpu"] in describe(record) and "GPU" in describe(record)
    meta = read_meta(run_stage(make_cfg("stage=sample")).path)
    assert meta["machine"] == json.loads(json.dumps(machine()))
    assert {"torch", "transformers", "trl", "datasets"} <= set(meta["versions"])


def test_reusing_or_reading_another_machines_artifact_warns_naming_both(make_cfg, caplog):
    samples = run_stage(make_cfg("stage=sample")).path
    _pretend_made_elsewhere(samples)
    with caplog.at_level(logging.WARNING, logger="rsft.machine"):
        assert run_stage(make_cfg("stage=sample")).path == samples  # reused: the fingerprint has no machine
    assert f"the artifact at {samples} was made on another machine: {describe(OTHER)}" in caplog.text
    assert f"this one is {describe(machine())}" in caplog.text
    caplog.clear()
    machine_module._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="rsft.machine"):
        run_stage(make_cfg("stage=score", *FUNCTION))  # reads the samples
    assert "Xeon" in caplog.text and "made on another machine" in caplog.text


def test_resuming_progress_made_on_another_machine_warns(tmp_path, caplog):
    ShardStore(tmp_path / "samples", {"a": 1}).save(0, [])
    record = next(tmp_path.glob(".samples.shards/*-machine-rank0.json"))
    record.write_text(json.dumps(OTHER))
    with caplog.at_level(logging.WARNING, logger="rsft.machine"):
        ShardStore(tmp_path / "samples", {"a": 1})
    assert f"resume progress at {tmp_path / '.samples.shards'} was made on another machine" in caplog.text
    assert json.loads(record.read_text()) == [OTHER, json.loads(json.dumps(machine()))]  # both, on record


def test_the_summary_lists_each_machine_and_says_when_a_run_mixes_them(tmp_path):
    paths = RunPaths(tmp_path / "run")
    for r in range(2):
        with atomic_artifact(paths.samples(r), {"stage": "sample", "round": r}) as tmp:
            Dataset.from_list([{"x": 1}]).save_to_disk(str(tmp))
    lines = machine_lines(paths, Records())
    assert len(lines) == 1 and lines[0].startswith(f"- {describe(machine())}; torch ")
    assert "2 artifact(s) (round_00/samples, round_01/samples)" in lines[0]
    _pretend_made_elsewhere(paths.samples(1))
    lines = machine_lines(paths, Records())
    assert any("Xeon" in line and "round_01/samples" in line for line in lines)
    assert lines[-1].startswith("- **More than one machine made this run**")


def test_an_artifact_resumed_from_another_machines_progress_records_that_machine(make_cfg, caplog):
    """Sampling killed after its first shard on one machine and finished on another: the samples' meta.json
    names the other machine (progress_machines) and summary.md's Machine section lists it."""
    cfg = make_cfg("stage=sample", "sample.shard_prompts=1")
    final = RunPaths.from_config(cfg).samples(0)
    store = ShardStore(final, {"other": "fingerprint"})  # progress of another key is swept; this tests the file
    record = next(final.parent.glob(".samples.shards/*-machine-rank0.json"))
    record.write_text(json.dumps([OTHER]))
    assert store.machines and ShardStore(final, {"other": "fingerprint"}).other_machines() == [OTHER]
    machine_module._WARNED.clear()
    real = ShardStore.__init__

    def with_other_machine(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.machines.insert(0, OTHER)

    ShardStore.__init__ = with_other_machine
    try:
        samples = run_stage(cfg).path
    finally:
        ShardStore.__init__ = real
    assert read_meta(samples)["progress_machines"] == [OTHER]
    lines = machine_lines(RunPaths.from_config(cfg), Records())
    assert any("Xeon" in line and "round_00/samples (in part: resumed progress)" in line for line in lines)


def test_a_machine_record_that_is_not_an_object_is_passed_over(tmp_path, make_cfg):
    samples = run_stage(make_cfg("stage=sample")).path
    meta = json.loads((samples / "meta.json").read_text())
    for garbage in ("garbage", 5, {"cpu": None, "vector_flags": "avx"}):
        meta["machine"] = garbage
        (samples / "meta.json").write_text(json.dumps(meta))
        run_stage(make_cfg("stage=sample"))  # reused: no crash
        assert describe(garbage)
