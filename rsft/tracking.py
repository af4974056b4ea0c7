"""Experiment tracking: the one place wandb is initialised; stages log through a Tracker.

`logger=wandb` (offline by default: files under runs/<run_name>/wandb/, uploaded later with
`wandb sync`) or `logger=none` (the Tracker then only writes to the Python log). `stage=loop` opens
one Tracker for all its rounds; a stage run alone opens its own. Every stage gets it the same way,
`with stage_tracker(cfg, "<stage>", tracker) as tracker:`, which closes what it opened.

`step` is an x-axis value of the metric group, not wandb's global step: stages log at step=round,
the reward trainer at step=its training step, and wandb drops any log whose step is below the
largest seen so far, so passing `step` through would silently lose every round metric logged after
a training loop. Instead each top-level group (`sample/...`, `reward/...`) gets its own step
metric `step/<group>` (wandb.define_metric), and wandb's own step just counts log calls.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from rsft import distributed
from rsft.errors import ConfigError
from rsft.machine import machine
from rsft.store import library_versions

log = logging.getLogger(__name__)


class PhaseClock:
    """Wall seconds per named phase of a piece of work: `lap(name)` ends the phase running since the last lap (or the
    clock's start) and adds its seconds to `name`; `seconds` is every phase's, `total` their sum."""

    def __init__(self):
        self.started = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self.last, 3)
        self.last = now

    @property
    def total(self) -> float:
        return self.last - self.started


class Tracker:
    def __init__(self, cfg: DictConfig, job_type: str):
        self.run = None
        self._step_metrics: set[str] = set()
        if cfg.logger.kind == "none" or not distributed.is_main():  # one process of a launch logs
            return
        if cfg.logger.kind != "wandb":
            raise ConfigError(f"logger.kind={cfg.logger.kind!r}: expected wandb or none")
        import wandb

        wandb_dir = Path(cfg.paths.run_dir)
        (wandb_dir / "wandb").mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=cfg.logger.project,
            entity=cfg.logger.get("entity"),
            group=cfg.logger.get("group") or cfg.run_name,
            name=f"{cfg.run_name}-{job_type}",
            job_type=job_type,
            tags=list(cfg.logger.get("tags") or []),
            mode=cfg.logger.mode,
            dir=str(wandb_dir),
            config={**OmegaConf.to_container(cfg, resolve=True), "machine": machine(), "versions": library_versions()},
            reinit="finish_previous",
        )
        log.info("wandb run %s (%s mode) in %s", self.run.id, cfg.logger.mode, self.run.dir)

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        log.info("metrics%s: %s", "" if step is None else f" (step {step})",
                 ", ".join(f"{k}={v:.4g}" for k, v in scalars.items()))
        if self.run is not None:
            self.run.log(self._with_step(metrics, step))

    def _with_step(self, metrics: dict[str, Any], step: int | None) -> dict[str, Any]:
        """Add step/<group> = step for each top-level group of the keys (see the module docstring)."""
        if step is None:
            return metrics
        out = dict(metrics)
        for key in metrics:
            group = key.split("/", 1)[0]
            step_key = f"step/{group}"
            if step_key not in self._step_metrics:
                self.run.define_metric(step_key)
                self.run.define_metric(f"{group}/*" if "/" in key else key, step_metric=step_key)
                self._step_metrics.add(step_key)
            out[step_key] = step
        return out

    def log_table(self, key: str, rows: list[dict[str, Any]], step: int | None = None) -> None:
        if self.run is None or not rows:
            return
        import wandb

        columns = list(rows[0])
        self.run.log(self._with_step({key: wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])},
                                     step))

    def log_image(self, key: str, png_path: str | Path, step: int | None = None) -> None:
        if self.run is None:
            return
        import wandb

        self.run.log(self._with_step({key: wandb.Image(str(png_path))}, step))

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(values)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None


@contextmanager
def stage_tracker(cfg: DictConfig, job_type: str, tracker: Tracker | None = None) -> Iterator[Tracker]:
    """The one way a stage gets its Tracker: the caller's (stage=loop passes one to every stage it
    runs), or its own, opened here and finished when the block ends, also when it raises (the wandb
    run is then marked failed instead of being left open)."""
    if tracker is not None:
        yield tracker
        return
    own = Tracker(cfg, job_type)
    try:
        yield own
    except BaseException:
        own.finish(exit_code=1)
        raise
    own.finish()
