"""`python -m rsft.run stage=<name> [overrides]`: the Hydra entry point and the table of stages."""

from __future__ import annotations

import importlib
import logging

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

# stage name -> module exposing run(cfg); imported on use so `stage=sample` does not load TRL.
STAGES = {
    "prefs": "rsft.prefs",
    "reward": "rsft.reward",
    "sample": "rsft.sample",
    "draft": "rsft.draft",
    "score": "rsft.score",
    "select": "rsft.select",
    "sft": "rsft.sft",
    "eval": "rsft.eval",
    "loop": "rsft.loop",
}

log = logging.getLogger("rsft")


def run_stage(cfg: DictConfig):
    """Validate the stage name and run it (also the entry point tests use with a composed cfg)."""
    valid = ", ".join(sorted(STAGES))
    if OmegaConf.is_missing(cfg, "stage"):
        raise SystemExit(f"no stage given: add stage=<name> to the command; valid stages: {valid}")
    if cfg.stage not in STAGES:
        raise SystemExit(f"stage={cfg.stage!r} is not a stage; valid stages: {valid}")
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    log.info("stage=%s run_dir=%s round=%s", cfg.stage, cfg.paths.run_dir, cfg.round)
    return importlib.import_module(STAGES[cfg.stage]).run(cfg)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_stage(cfg)


if __name__ == "__main__":
    main()
