"""Experiment tracking: the one place wandb is initialised; stages log through a Tracker.

`logger=wandb` (offline by default: files under runs/<run_name>/wandb/, uploaded later with
`wandb sync`) or `logger=none` (the Tracker then only writes to the Python log). `stage=loop` opens
one Tracker for all its rounds; a stage run alone opens its own.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class Tracker:
    def __init__(self, cfg: DictConfig, job_type: str):
        self.run = None
        if cfg.logger.kind == "none":
            return
        if cfg.logger.kind != "wandb":
            raise ValueError(f"logger.kind={cfg.logger.kind!r}: expected wandb or none")
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
            config=OmegaConf.to_container(cfg, resolve=True),
            reinit="finish_previous",
        )
        log.info("wandb run %s (%s mode) in %s", self.run.id, cfg.logger.mode, self.run.dir)

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        log.info("metrics%s: %s", "" if step is None else f" (step {step})",
                 ", ".join(f"{k}={v:.4g}" for k, v in scalars.items()))
        if self.run is not None:
            self.run.log(metrics, step=step)

    def log_table(self, key: str, rows: list[dict[str, Any]], step: int | None = None) -> None:
        if self.run is None or not rows:
            return
        import wandb

        columns = list(rows[0])
        self.run.log({key: wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])}, step=step)

    def log_image(self, key: str, png_path: str | Path, step: int | None = None) -> None:
        if self.run is None:
            return
        import wandb

        self.run.log({key: wandb.Image(str(png_path))}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(values)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
