"""The runner: the one place the artifact protocol is spelled, for every stage.

    artifact = runner.run("select", cfg)      # what rsft.run and stage=loop call

A stage module exposes two functions; the runner does the rest, in this order:
  plan(cfg, paths) -> Plan     where it writes, which artifacts and user files it reads, and the stages
                               that must run first (eval's baseline, refresh's labels); it refuses what
                               it cannot build (a missing input), before any work
  build(cfg, job) -> Built     the computation: loads, computes, and returns each output's meta.json
                               entries and a function that writes its files into a folder
The runner: runs the stages the plan names first, fingerprints the artifact from the keys the stage
declares (rsft.stages: reads, less UNCOUNTED and WHILE_OFF) and the inputs' digests, reuses a
complete artifact made from the same, refuses one made from anything else (StaleArtifact), opens
the tracker, builds, writes each output atomically on the main process, waits for every process,
drops the build's resume progress (shards, checkpoints), logs its metrics, and returns the record.
Before a stage and after its artifact is written, a SIGINT or SIGTERM that a library swallowed stops the
command (rsft.interrupts.check).
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from rsft import auto_k, distributed, interrupts, stages
from rsft.errors import RsftError
from rsft.fingerprints import check_reuse, fingerprint
from rsft.machine import warn_if_other_machine
from rsft.paths import RunPaths
from rsft.store import (
    Artifact,
    ShardStore,
    atomic_artifact,
    finished,
    is_complete,
    raise_if_write_failed,
    read_meta,
)
from rsft.tracking import Tracker, stage_tracker
from rsft.checkpoints import LoopCheckpoints, TrainingCheckpoints

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """What a stage will read and write, decided from the config and the run directory before any work."""

    outputs: list[Path]                     # the first is the stage's result; each gets its own meta.json
    inputs: list[Path] = field(default_factory=list)        # artifacts it reads (their digests are fingerprinted)
    user_files: list = field(default_factory=list)          # the user's files it reads (by content)
    first: list[DictConfig] = field(default_factory=list)   # stage configs to run before this one
    sources: dict = field(default_factory=dict)             # reward sources' identity (rsft.reward_service.source_identity)
    names: list[str] = field(default_factory=list)          # each output's name in messages (default: the stage)
    given: dict = field(default_factory=dict)               # what plan() decided that build() uses (job.plan.given)


@dataclass
class Built:
    """What a build returns: per output (in Plan order) its meta.json entries and what writes its files."""

    outputs: list[tuple[dict, Callable[[Path], None]]]
    metrics: dict[str, Any] = field(default_factory=dict)   # logged to the tracker as they are (<stage>/<name>)
    step: int | None = None                                 # the metrics' x value (the round)


@dataclass
class Job:
    """What a build gets from the runner: where things are, the fingerprint, the tracker, resume progress."""

    paths: RunPaths
    plan: Plan
    wanted: dict
    tracker: Tracker
    one_process: bool = False
    _progress: list = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.plan.outputs[0]

    def _check_every_process_builds(self) -> None:
        if self.one_process:  # its barriers would wait for processes that do not build: a bug in the stage
            raise RuntimeError("a one-process build cannot keep resume progress (its barriers need every process)")

    def shards(self) -> ShardStore:
        """The finished shards of this artifact's rows (sampling, scoring), to resume from."""
        self._check_every_process_builds()
        store = ShardStore(self.out, self.wanted)
        self._progress.append(store)
        return store

    def checkpoints(self) -> TrainingCheckpoints:
        """The trainer's checkpoints of this artifact, to resume from."""
        self._check_every_process_builds()
        folder = TrainingCheckpoints(self.out, self.wanted)
        self._progress.append(folder)
        return folder

    def loop_checkpoints(self) -> LoopCheckpoints:
        """The checkpoints of a hand-written training loop (a one-process build's), to resume from."""
        folder = LoopCheckpoints(self.out, self.wanted)
        self._progress.append(folder)
        return folder


def module(stage: stages.Stage):
    return importlib.import_module(stage.module)


def fingerprint_of(stage: stages.Stage, cfg: DictConfig, plan: Plan) -> dict:
    """The artifact's fingerprint: the declared keys (rsft.stages.counted_keys) with the settings that are
    off left out (rsft.stages.WHILE_OFF), the inputs' digests and the user files' checksums."""
    wanted = fingerprint(cfg, stages.counted_keys(stage, cfg), plan.inputs, plan.user_files, plan.sources)
    off = tuple(prefix for prefix, is_off in stages.WHILE_OFF.items() if is_off(cfg))
    for key in [k for k in wanted["config"] if k.startswith(off)]:
        del wanted["config"][key]
    return wanted


def wanted_fingerprint(cfg: DictConfig) -> dict:
    """The fingerprint stage `cfg.stage` would record now (its inputs must exist)."""
    stage = stages.get(cfg.stage)
    return fingerprint_of(stage, cfg, module(stage).plan(cfg, RunPaths.from_config(cfg)))


def run(name: str, cfg: DictConfig, tracker: Tracker | None = None) -> Artifact:
    """Build (or reuse) stage `name`'s artifact for `cfg`; its record (path and meta.json)."""
    stage = stages.get(name)
    interrupts.check()  # a safe point: a SIGINT or SIGTERM a library swallowed stops the command before the next stage
    if not stage.artifact:
        return module(stage).run(cfg, tracker)
    chosen = None
    if stages.reads_num_samples(stage, cfg):  # sample.num_samples=auto: the round's K, before anything reads it
        cfg, chosen = auto_k.resolved(cfg, announce=stage.name == "sample")
    paths = RunPaths.from_config(cfg)
    plan = module(stage).plan(cfg, paths)
    recorded = {"auto_k": chosen} if chosen else {}
    if plan.first:  # the stages run first share this stage's tracker (one wandb run for the command)
        with stage_tracker(cfg, name, tracker) as shared:
            for first in plan.first:
                run(first.stage, first, shared)
            return _build(stage, cfg, paths, plan, shared, recorded)
    return _build(stage, cfg, paths, plan, tracker, recorded)


def _warn_other_machines(plan: Plan) -> None:
    """Say when this command reads or reuses artifacts another machine made (rsft.machine): allowed, not silent."""
    for path in [*plan.inputs, *plan.outputs]:
        if is_complete(path):
            warn_if_other_machine("the artifact", path, read_meta(path).get("machine"))


def _build(stage: stages.Stage, cfg: DictConfig, paths: RunPaths, plan: Plan, tracker: Tracker | None,
           recorded: dict | None = None) -> Artifact:
    """The protocol from the fingerprint on (run's second half); `recorded`: entries for every output's meta.json."""
    name = stage.name
    wanted = fingerprint_of(stage, cfg, plan)
    names = plan.names or [name] * len(plan.outputs)
    _warn_other_machines(plan)
    if all(check_reuse(out, cfg.overwrite, what, wanted) for out, what in zip(plan.outputs, names)):
        return finished(plan.outputs[0])
    config = OmegaConf.to_container(cfg, resolve=True)  # every artifact records the whole config it was made with
    with stage_tracker(cfg, name, tracker) as tracker:
        job = Job(paths, plan, wanted, tracker, one_process=stage.one_process)
        built = None
        started = time.time()
        if distributed.is_main() or not stage.one_process:
            try:
                built = module(stage).build(cfg, job)
            except Exception as error:  # a full disk mid-build (a datasets cache, a shard) is one line
                if not isinstance(error, RsftError):
                    raise_if_write_failed(error, job.out, during="build")
                raise
        if distributed.is_main():
            if len(built.outputs) != len(plan.outputs):
                raise RuntimeError(f"stage={name} built {len(built.outputs)} outputs for {len(plan.outputs)} planned")
            for out, (meta, write) in zip(plan.outputs, built.outputs):
                others = [m for progress in job._progress for m in getattr(progress, "other_machines", list)()]
                extra = {"progress_machines": others} if others else {}  # resumed from another machine's work
                with atomic_artifact(out, {**meta, **(recorded or {}), **extra, "config": config,
                                           "build_seconds": round(time.time() - started, 3)}, wanted) as tmp:
                    write(tmp)
        for progress in job._progress:
            progress.remove()  # a barrier first: every process is done with its own
        distributed.barrier()
        if built is not None and built.metrics:
            tracker.log(built.metrics, step=built.step)
    interrupts.check()  # a safe point: the artifact is complete, a signal received while it was built stops here
    return finished(plan.outputs[0])
