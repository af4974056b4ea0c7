"""`python -m rsft.run stage=<name> [overrides]`: the Hydra entry point (the stages: rsft.stages)."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from rsft import distributed, stages
from rsft.errors import USER_ERRORS, ConfigError
from rsft.paths import run_lock

log = logging.getLogger("rsft")


OmegaConf.register_new_resolver("rsft_stage_lines", stages.help_lines, replace=True)


def run_stage(cfg: DictConfig):
    """Check the stage and the whole config (ConfigError), hold the run directory, run the stage (also
    the entry point tests use with a composed cfg). Nothing is read, loaded or written before the checks."""
    if OmegaConf.is_missing(cfg, "stage"):
        raise SystemExit(f"no stage given: add stage=<name> to the command; valid stages: {', '.join(stages.BY_NAME)}")
    try:
        stage = stages.get(cfg.stage)
    except KeyError as error:
        raise SystemExit(error.args[0]) from None
    from rsft.checks import check_config  # imports torch and transformers: not needed for --help

    distributed.init(str(cfg.device))  # a world of one unless started by accelerate launch / torchrun
    if not distributed.is_main():  # process 0 reports; the others only warn
        logging.getLogger().setLevel(logging.WARNING)
    distributed.same_config(cfg)
    check_config(cfg)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    log.info("stage=%s run_dir=%s round=%s (process %d of %d)", cfg.stage, cfg.paths.run_dir, cfg.round,
             distributed.rank(), distributed.world_size())
    with distributed.on_main(lambda: run_lock(cfg.paths.run_dir, f"stage={cfg.stage}")):
        return importlib.import_module(stage.module).run(cfg)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Errors the user can act on end in one line (exit 1), not a traceback; Ctrl-C says how to resume.

    rsft's own messages for bad settings, files and artifacts (ValueError, KeyError, TypeError,
    FileNotFoundError and rsft's error classes) name the setting or file; RSFT_TRACEBACK=1 shows the
    traceback as well, for a bug report."""
    try:
        run_stage(cfg)
    except KeyboardInterrupt:
        raise SystemExit("interrupted; rerun the same command to resume (complete artifacts are kept)") from None
    except USER_ERRORS as error:
        if os.environ.get("RSFT_TRACEBACK"):
            raise
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise SystemExit(f"{message}\n(RSFT_TRACEBACK=1 shows the traceback)") from None


def check_command_line(argv: list[str]) -> None:
    """Hydra creates its log folder under paths.run_dir before main() runs: a run_name that would
    put it outside the runs root (`..`, absolute, empty) must stop before Hydra starts."""
    from rsft.checks import check_run_name

    for arg in argv:
        if arg.startswith(("run_name=", "+run_name=", "++run_name=")):
            try:
                check_run_name(arg.split("=", 1)[1])
            except ConfigError as error:
                raise SystemExit(str(error)) from None


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
