"""`python -m rsft.run stage=<name> [overrides]`: the Hydra entry point (the stages: rsft.stages)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf import errors as omegaconf_errors

from rsft import distributed, errors, interrupts, stages
from rsft.config import check_run_name, describe, register_configs, renamed_key
from rsft.errors import ConfigError
from rsft.lock import run_lock

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
    from rsft.preflight import (
        check_config,  # imports torch and transformers: not needed for --help
    )

    distributed.init(cfg.device)  # a world of one unless started by accelerate launch / torchrun
    if not distributed.is_main():  # process 0 reports; the others only warn
        logging.getLogger().setLevel(logging.WARNING)
    distributed.same_config(cfg)
    check_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    log.info("stage=%s run_dir=%s round=%s (process %d of %d)", cfg.stage, cfg.paths.run_dir, cfg.round,
             distributed.rank(), distributed.world_size())
    with distributed.on_main(lambda: run_lock(cfg.paths.run_dir, f"stage={cfg.stage}")):
        from rsft import runner  # imports the stage's libraries: not needed for --help

        artifact = runner.run(stage.name, cfg)
        if stage.name in REPORTED_STAGES and distributed.is_main():
            write_report(cfg)
        return artifact


# stages whose results belong in the run directory's summary.md and plots/ (stage=loop writes its own)
REPORTED_STAGES = ("online",)


def write_report(cfg: DictConfig) -> None:
    """The run directory's plots and summary.md, as the run stands (rsft.report.write_run_report), after a stage
    in REPORTED_STAGES wrote its artifact. A failure here is a warning: the artifact is complete and kept, and
    the next command that writes the report (this one again, or stage=loop) tries again."""
    from rsft import report
    from rsft.paths import RunPaths

    try:
        summary = report.write_run_report(RunPaths.from_config(cfg), cfg.loop.examples)
    except Exception as error:  # the artifact is written: a broken report must not fail the command
        log.warning("the run's summary.md and plots were not written (%s: %s); stage=%s's artifact is complete",
                    type(error).__name__, error, cfg.stage, exc_info=not isinstance(error, errors.RsftError))
        return
    log.info("stage=%s: the run's report is in %s", cfg.stage, summary)


# OmegaConf errors a stage meets while it reads the composed config: a composition problem (an
# interpolation to a key the chosen option lacks, a ??? left unset), not a bug
CONFIG_READ_ERRORS = (omegaconf_errors.InterpolationResolutionError, omegaconf_errors.MissingMandatoryValue,
                      omegaconf_errors.ConfigKeyError, omegaconf_errors.GrammarParseError)


def _chosen_option(group: str) -> str | None:
    """The option of config group `group` this command chose (data -> local), when Hydra runs it."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group)
    except ValueError:  # not inside a Hydra run (tests call run_stage with a composed cfg)
        return None


def config_read_problem(error: BaseException) -> str | None:
    """One line for an OmegaConf error raised while a stage reads the config (CONFIG_READ_ERRORS): the full
    key and a fix. None for any other exception."""
    if not isinstance(error, CONFIG_READ_ERRORS):
        return None
    key = error.full_key or error.key or "a setting"
    problem = str(error.msg or error).splitlines()[0]
    if isinstance(error, omegaconf_errors.InterpolationKeyError):
        target = problem.split("'")[1] if problem.count("'") >= 2 else "another key"
        group = target.split(".")[0]
        if (CONF_DIR / group).is_dir():
            option = _chosen_option(group)
            chosen = f"{group}={option}" if option else f"this {group}= option"
            return (f"{key} reads {target}, which {chosen} does not have: set {key}=null (or another value) on the "
                    f"command line, or choose a {group}= option that has {target}")
        return f"{key} reads {target}, which the config does not have: set {key}=<value> on the command line"
    if isinstance(error, omegaconf_errors.InterpolationToMissingValueError):
        target = problem.rpartition(": ")[2]
        return f"{key} reads {target}, which is not set (???): add {target}=... (or {key}=...) to the command"
    if isinstance(error, omegaconf_errors.MissingMandatoryValue):
        return f"{key} is not set (???): add {key}=... to the command"
    if isinstance(error, omegaconf_errors.ConfigKeyError):
        return (f"{key} is not in the composed config ({problem}): choose the config option that has it, or add it "
                f"with +{key}=<value>")
    return f"{key} cannot be resolved ({problem}): set {key}=<value> on the command line, or fix what it reads"


def report_failure(error: BaseException) -> NoReturn:
    """How a command ends on an exception from its stage (main() calls it; it always raises):
    rsft.errors.report_failure, which every entry point shares, with OmegaConf's errors while a stage reads
    the config (config_read_problem) as user errors too, and Ctrl-C saying how to resume. A user error ends
    in one line and exit 1 (RSFT_TRACEBACK=1 shows the traceback as well); anything else is a bug: its
    traceback is logged (console and the run's log file), then a line saying so, exit 1. Once a SIGINT or
    SIGTERM was received (rsft.interrupts), the command ends as interrupted, exit 130 or 143, whatever it
    raised after the signal (a library may turn a KeyboardInterrupt into its own error)."""
    signum = interrupts.received()
    if signum is not None and not isinstance(error, KeyboardInterrupt):
        log.warning("after %s: %s: %s", signal.Signals(signum).name, type(error).__name__, str(error)[:300])
        error = interrupts.Interrupted(signum)
    errors.report_failure(error, config_read_problem,
                          interrupted="interrupted; rerun the same command to resume (complete artifacts are kept)")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Run the stage; a failure ends as report_failure says: a user error in one line, a bug with its traceback.
    SIGINT and SIGTERM stop it (rsft.interrupts): the first at once or at the next safe point if a library
    swallows it, a second at once; either way the exit status is 130 or 143 and the run resumes."""
    with interrupts.handled():
        try:
            run_stage(cfg)
            interrupts.check()  # a signal swallowed after the last safe point still ends the command non-zero
        except BaseException as error:  # noqa: BLE001  (report_failure re-raises or ends the command)
            report_failure(error)


def _setting(argv: list[str], key: str) -> str | None:
    """The value the command line gives `key` (also as +key= / ++key=), unquoted; None when it gives none."""
    for arg in reversed(argv):  # Hydra takes the last of repeated overrides: so does this
        name, sep, value = arg.partition("=")
        if sep and name.lstrip("+") == key:
            return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value
    return None




def renamed_settings(argv: list[str]) -> list[str]:
    """argv with every renamed setting (rsft.config.RENAMED) spelled the new way, saying so once per setting."""
    out = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        plus, key = name[:len(name) - len(name.lstrip("+"))], name.lstrip("+")
        if sep and renamed_key(key) != key:
            print(f"rsft: {key} is now {renamed_key(key)}; the old name still works for now", file=sys.stderr)
            arg = f"{plus}{renamed_key(key)}{sep}{value}"
        out.append(arg)
    return out


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


def _unwritable(folder: Path) -> str | None:
    """Why `folder` cannot be written, found by writing (os.access says yes to root on a read-only mount)."""
    try:
        handle, probe = tempfile.mkstemp(prefix=".rsft-write-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        return f"not writable ({error.strerror or error})"
    free = shutil.disk_usage(folder).free
    if free < 2**20:  # Hydra writes its config and log there before rsft starts; without room: its traceback
        return f"on a full disk ({free // 1024} KB free; rsft and Hydra need room for logs and artifacts)"
    return None


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
    reason = "not a folder" if not existing.is_dir() else _unwritable(existing)
    if reason:
        verb = "write to" if existing == Path(run_dir).absolute() else "create"
        raise SystemExit(f"cannot {verb} the run folder {run_dir}: {existing} is {reason}; choose a writable folder "
                         f"with paths.runs_root=<folder> (or RSFT_RUNS_ROOT), or free space")


if __name__ == "__main__":
    sys.argv[1:] = quote_unicode_values(renamed_settings(sys.argv[1:]))
    check_command_line(sys.argv[1:])
    main()
