"""The command's pre-flight: every setting it reads, checked before any work; one line per mistake.

    check_config(cfg)   # the first thing every command does (rsft.run.run_stage); raises ConfigError

A setting that is wrong stops the command before any artifact is skipped, read or written and
before any model is loaded: a loop must not run prefs, reward, eval, sample and score before it
meets `select.pairs=true` with one completion per prompt. Each message names the setting, the value
and what was expected, e.g. `sample.top_p=7.0: ...`.

The rules live with the typed config (rsft.config): a value of the wrong type never gets this far
(Hydra refuses `sample.temperature=hot` while composing, naming the key); each group's ranges are its
dataclass's __post_init__, run here by turning the group into its object; the rules across groups are
rsft.config.check_across_groups. Which groups: the top-level settings every command reads, `loop`
(every stage's round table reads loop.refresh_reward and loop.dpo), the policy, and the groups the
stage reads (rsft.stages; stage=loop: those of every stage it runs). A group a stage does not read is
not checked (stage=reward does not fail on sample.top_p=7), so a stage can be run with any leftovers
of another experiment on the command line. This module adds what needs the machine or the user's files: the
device, the number of processes a training batch must divide over, and every refresh.pairs round
file the command will read.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from rsft import config
from rsft.distributed import per_device_batch
from rsft.errors import ConfigError, RsftError
from rsft.models import resolve_device
from rsft.stages import groups_read


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for the first setting the command cannot run with. The stage itself is
    rsft.run.run_stage's to check; this reads a valid cfg.stage."""
    groups = tuple(g for g in dict.fromkeys(("policy", "loop", *groups_read(cfg.stage, cfg)))
                   if OmegaConf.is_dict(cfg.get(g)))  # the groups; top-level keys are checked with the run
    if cfg.stage == "loop" and cfg.loop.dpo is False:  # a loop without DPO never reads dpo.*
        groups = tuple(g for g in groups if g != "dpo")
    _check_required(cfg, groups)
    config.check_run_dir(cfg)
    _as_config_error("", config.check_top_level, cfg)
    _check_device(cfg)
    for group in groups:
        _as_config_error(f"{group}.", OmegaConf.to_object, cfg[group])  # its dataclass's __post_init__
    config.check_across_groups(cfg, groups)
    for group in ("reward", "sft", "dpo"):  # the global batch must divide over the processes of a launch
        if group in groups:
            _as_config_error("", per_device_batch, f"{group}.batch_size", cfg[group].batch_size)
    _check_round_labels(cfg)
    _check_backend(cfg, groups)
    _check_reward_sources(cfg, groups)


def _check_round_labels(cfg: DictConfig) -> None:
    """Every refresh.pairs round file the command will read: there, and readable as pairs."""
    if cfg.stage not in ("loop", "refresh") or cfg.refresh.pairs is None or not config.refresh_reward_on(cfg):
        return
    from rsft.labelling import (
        check_round_labels,  # loads the reward stack: only when there are files to read
    )

    check_round_labels(cfg, range(int(cfg.loop.rounds)) if cfg.stage == "loop" else range(int(cfg.round) + 1))


def _check_reward_sources(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """A reward source other than the trained model, and a judge given as a source, are opened now (a
    function imported, a pretrained model loaded, a server asked for /health), so that a wrong spec stops
    the command before any work, not when the first round reaches stage=score. rsft.scoring keeps what it
    opened for the stages."""
    from rsft import scoring

    device = resolve_device(str(cfg.device))
    try:
        if "reward_source" in groups and cfg.reward_source.kind != "trained":
            scoring.source_identity(cfg, device)
    except RsftError as error:
        raise _named(error, f"reward_source={cfg.reward_source.kind}") from error
    try:
        if "eval" in groups and scoring.judge_spec(cfg) is not None:
            scoring.open_judge(cfg, device, None)
    except RsftError as error:
        raise _named(error, "eval.judge") from error


def _named(error: RsftError, setting: str) -> RsftError:
    """The same refusal, its message starting with the setting that named what was refused."""
    try:
        return type(error)(f"{setting}: {error}")
    except TypeError:  # an error class with its own constructor: its message as it is
        return error


def _check_backend(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """sample.backend=vllm needs an importable vLLM: say so before any work, not when the engine starts."""
    if "sample" not in groups or cfg.sample.get("backend", "rsft") != "vllm":
        return
    from rsft.sampling.vllm_engine import INSTALL_HINT, vllm_available

    if not vllm_available():
        raise ConfigError(f"sample.backend=vllm: vLLM cannot be imported here. {INSTALL_HINT}")


def _as_config_error(prefix: str, check, *args) -> None:
    """A dataclass rule names the key inside its group (`temperature=...`): put the group in front."""
    try:
        check(*args)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"{prefix}{str(error).splitlines()[0]}") from None


def _check_required(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """Settings a config option leaves to the user (`???`: data=local's data.path, policy=hf's
    name_or_path, data=hub's name) must be given on the command line."""
    for group in groups:
        missing = sorted(OmegaConf.missing_keys(cfg[group])) if group in cfg else []  # full keys: data.path
        if missing:
            raise ConfigError(f"{', '.join(missing)}: required by {group}.kind={cfg[group].get('kind')} and not set; "
                              f"add {missing[0]}=... to the command")


def _check_device(cfg: DictConfig) -> None:
    try:
        device = resolve_device(str(cfg.device))
    except (ValueError, RuntimeError):  # torch.device("cuda:x") raises RuntimeError
        raise ConfigError(f"device={cfg.device!r}: expected auto, cpu, cuda or cuda:N") from None
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ConfigError(f"device={cfg.device} but this torch build/machine has no CUDA device; "
                          f"use device=cpu or auto")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(f"device={cfg.device} but this machine has {count} CUDA device(s): "
                          f"cuda:0 to cuda:{count - 1}")
