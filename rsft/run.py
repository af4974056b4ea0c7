"""`python -m rsft.run stage=<name> [overrides]`: the Hydra entry point (the stages: rsft.stages)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from rsft import distributed, stages
from rsft.config import check_run_name, describe, register_configs
from rsft.errors import USER_ERRORS, ConfigError
from rsft.paths import run_lock

log = logging.getLogger("rsft")


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def config_groups_help() -> str:
    """`--help`'s groups and their options, from conf/ (not Hydra's list, which would show the schemas)."""
    return "\n".join(f"  {folder.name}: {', '.join(sorted(p.stem for p in folder.glob('*.yaml')))}"
                     for folder in sorted(CONF_DIR.iterdir()) if folder.is_dir())


def settings_help(*, _root_) -> str:
    """`--help`'s settings: every key of the composed config with its value and its meaning, the meaning
    read from the dataclass that types its group (rsft.config); `_root_` is the composed config."""
    lines = []
    groups = [k for k in _root_ if k != "hydra" and not OmegaConf.is_missing(_root_, k) and OmegaConf.is_dict(_root_[k])]
    for section in [None, *groups]:
        node = _root_ if section is None else _root_[section]
        schema = OmegaConf.get_type(node)
        if schema is None or not dataclasses.is_dataclass(schema):
            continue
        values = OmegaConf.to_container(node, resolve=False)
        if section is not None:
            lines.append(f"  {section} ({section}=<option>: conf/{section}/)")
        for key, _, _, meaning in describe(schema):
            value = values
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if section is None and isinstance(value, dict):
                continue  # a group: listed under its own heading
            name = key if section is None else f"{section}.{key}"
            lines.append(f"    {name}={'null' if value is None else value}  # {meaning}")
    return "\n".join(lines).replace("$", "$$")  # Hydra fills the help template with string.Template


register_configs()  # conf/ names the typed schemas (rsft.config) as /schema/<name>
OmegaConf.register_new_resolver("rsft_stage_lines", stages.help_lines, replace=True)
OmegaConf.register_new_resolver("rsft_config_groups", config_groups_help, replace=True)
OmegaConf.register_new_resolver("rsft_settings", settings_help, replace=True)


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


def _setting(argv: list[str], key: str) -> str | None:
    """The value the command line gives `key` (also as +key= / ++key=), unquoted; None when it gives none."""
    for arg in argv:
        name, sep, value = arg.partition("=")
        if sep and name.lstrip("+") == key:
            return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value
    return None


def quote_unicode_values(argv: list[str]) -> list[str]:
    """Hydra's override grammar takes only ASCII in an unquoted value (`run_name=résumé` is a lexer error);
    a quoted value may hold any text, so a non-ASCII value is quoted for the user."""
    quoted = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        if sep and not name.startswith("-") and not value.isascii() and value[:1] not in ("'", '"'):
            quote = "'" if "'" not in value else '"'
            if quote not in value:
                arg = f"{name}={quote}{value}{quote}"
        quoted.append(arg)
    return quoted


def check_command_line(argv: list[str]) -> None:
    """What must stop before Hydra starts, since Hydra creates its log folder under paths.run_dir before
    main() runs: a run_name that would put it outside the runs root (`..`, absolute, empty), and a run
    folder that cannot be created (a read-only or missing runs root would end in Hydra's OSError traceback)."""
    run_name = _setting(argv, "run_name")
    if run_name is not None:
        try:
            check_run_name(run_name)
        except ConfigError as error:
            raise SystemExit(str(error)) from None
    if any(arg.startswith(("-", "hydra.")) for arg in argv) or _setting(argv, "stage") is None:
        return  # --help, --cfg, Hydra's own settings: Hydra writes no run folder, or the user steers it
    run_dir = _setting(argv, "paths.run_dir")
    if run_dir is None or "${" in run_dir:
        root = _setting(argv, "paths.runs_root") or os.environ.get("RSFT_RUNS_ROOT") or "runs"
        run_dir = None if "${" in root else os.path.join(root, run_name or "demo")
    if run_dir is None or "${" in run_dir:
        return
    existing = Path(run_dir).absolute()
    while not existing.exists():  # the nearest folder that exists: Hydra creates the rest
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        reason = "not a folder" if not existing.is_dir() else "not writable"
        raise SystemExit(f"cannot create the run folder {run_dir}: {existing} is {reason}; choose a writable folder "
                         f"with paths.runs_root=<folder> (or RSFT_RUNS_ROOT)")


if __name__ == "__main__":
    sys.argv[1:] = quote_unicode_values(sys.argv[1:])
    check_command_line(sys.argv[1:])
    main()
