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
of another experiment on the command line. Across the whole config, a key no schema has (one a `+` override
added) is refused (rsft.config.check_unknown_settings). This module adds what needs the machine, the installed
packages or the user's files: the device, the number of processes a training batch must divide over, each
trainer's lr_scheduler among transformers' schedules, every refresh.pairs round file the command will read, the
optional packages the settings need (vLLM, wandb, peft, gguf), the train prompts of a command that reads them,
and for a command that evaluates, held-out prompts that are train prompts too (rsft.data); a reward server's
URL, and every reward source opened once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rsft import config
from rsft.distributed import per_device_batch
from rsft.errors import ConfigError, MissingPackage, RsftError
from rsft.models import resolve_device
from rsft.stages import command_reads, groups_read
from rsft.store import is_complete


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for the first setting the command cannot run with. The stage itself is
    rsft.run.run_stage's to check; this reads a valid cfg.stage."""
    groups = tuple(g for g in dict.fromkeys(("policy", "loop", *groups_read(cfg.stage, cfg)))
                   if OmegaConf.is_dict(cfg.get(g)))  # the groups; top-level keys are checked with the run
    if command_reads(cfg.stage, cfg, "loop.dpo") and cfg.loop.dpo is False:  # a loop without DPO never reads dpo.*
        groups = tuple(g for g in groups if g != "dpo")
    _check_command_line()
    config.check_unknown_settings(cfg)
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
    _check_schedules(cfg, groups)
    _check_round_labels(cfg)
    _check_packages(cfg, groups)
    if not _check_held_out_prompts(cfg):
        _check_train_prompts(cfg)
    _check_reward_sources(cfg, groups)


def _check_held_out_prompts(cfg: DictConfig) -> bool:
    """A command that evaluates (stage=eval, stage=loop with loop.eval, stage=online with online.eval_every) on
    held-out prompts that are all train prompts stops now, not after prefs and the reward model; some of
    them: a warning with the counts (rsft.data.check_held_out_prompts). That reads both prompt sets, so a
    file that cannot be read stops the command too. Whether it checked (the command evaluates)."""
    reads = lambda key: command_reads(cfg.stage, cfg, key)  # noqa: E731
    if reads("loop.eval"):
        without, evaluates = "loop.eval=false", cfg.loop.eval
    elif reads("online.eval_every"):
        without, evaluates = "online.eval_every=0", cfg.online.eval_every > 0
    else:
        without, evaluates = None, reads("eval.policy")
    if evaluates:
        from rsft.data import (
            check_held_out_prompts,  # imports datasets: only for a command that evaluates
        )

        check_held_out_prompts(cfg.data, without)
    return bool(evaluates)


def _check_train_prompts(cfg: DictConfig) -> None:
    """A command that reads the train prompts and does not evaluate (stage=sample, stage=prefs, a loop with
    loop.eval=false) reads them now: a data.path that is missing, empty or malformed stops it before prefs and
    the reward model train, not at the first stage=sample (rsft.data.check_train_prompts: load_prompts' InputError)."""
    if command_reads(cfg.stage, cfg, "data.path"):
        from rsft.data import check_train_prompts  # imports datasets: only for a command that reads prompts

        check_train_prompts(cfg.data)


def _check_schedules(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """Every learning-rate schedule the command's trainers will build (sft, dpo, reward, online) is one of
    transformers' names, checked now: a misspelt sft.lr_scheduler would otherwise stop a loop at its first
    SFT, after prefs, the reward model, sampling and scoring."""
    for group in ("reward", "sft", "dpo", "online"):
        if group in groups and cfg[group].get("lr_scheduler") is not None:
            check_scheduler(cfg[group].lr_scheduler, f"{group}.lr_scheduler")


def check_scheduler(name: str, key: str) -> None:
    """`key` (a learning-rate schedule's setting) names one of transformers' schedules, else ConfigError."""
    from transformers import SchedulerType  # only for a command that trains

    try:
        SchedulerType(name)
    except ValueError:
        raise ConfigError(f"{key}={name!r}: expected one of transformers' schedules: "
                          f"{', '.join(s.value for s in SchedulerType)}") from None


def _check_command_line() -> None:
    """The command line's overrides, read for a name given twice (rsft.config.check_override_names: a
    combination's component that would vanish), when Hydra runs the command (a composed config has none)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        config.check_override_names(list(HydraConfig.get().overrides.task))


def _check_round_labels(cfg: DictConfig) -> None:
    """Every refresh.pairs round file the command will read: there, and readable as pairs."""
    reads_pairs = command_reads(cfg.stage, cfg, "refresh.pairs")  # stage=refresh, and the loop that runs it
    if not reads_pairs or cfg.refresh.pairs is None or not config.refresh_reward_on(cfg):
        return
    from rsft.pairs import (
        check_round_labels,  # loads the reward stack: only when there are files to read
    )

    rounds = cfg.loop.rounds if command_reads(cfg.stage, cfg, "loop.rounds") else cfg.round + 1
    check_round_labels(cfg, range(rounds))


def _check_reward_sources(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """A reward source other than the trained model, and a judge given as a source, are opened now (a
    function imported, a pretrained model loaded, a server asked for /health), so that a wrong spec stops
    the command before any work, not when the first round reaches stage=score. rsft.reward_service keeps what it
    opened for the stages. A server's URL that is no URL (`http://[::1`) is refused first, naming the setting
    that gives it: opened, it would only say that a reward server's url is wrong."""
    from reward.http_client import check_url
    from rsft import reward_service

    specs = []  # (setting, spec) of what the command opens; a URL names a server, as reward_source=http's spec must
    sources = cfg.reward_source if "reward_source" in groups else None
    if sources is not None and sources.kind == "http":
        specs.append(("reward_source.spec", sources.spec))
    if sources is not None and sources.kind == "combination":
        specs += [(f"reward_source.components.{name}.source", component.get("source"))
                  for name, component in sources.components.items()]
    if "eval" in groups:
        specs.append(("eval.judge", reward_service.judge_spec(cfg)))
    for setting, spec in specs:
        if setting == "reward_source.spec" or str(spec).startswith(("http://", "https://")):
            try:
                check_url(spec, setting)
            except ValueError as error:
                raise ConfigError(str(error)) from None
    device = resolve_device(cfg.device)
    try:
        if "reward_source" in groups and cfg.reward_source.kind != "trained":
            reward_service.source_identity(cfg, device)
    except RsftError as error:
        raise _named(error, f"reward_source={cfg.reward_source.kind}") from error
    try:
        if "eval" in groups and reward_service.judge_spec(cfg) is not None:
            reward_service.open_judge(cfg, device, None)
    except RsftError as error:
        raise _named(error, "eval.judge") from error


def _named(error: RsftError, setting: str) -> RsftError:
    """The same refusal, its message starting with the setting that named what was refused."""
    try:
        return type(error)(f"{setting}: {error}")
    except TypeError:  # an error class with its own constructor: its message as it is
        return error


def _installed(package: str) -> bool:
    """Whether `package` can be found (not imported: importing wandb or peft takes seconds)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def _needed_packages(cfg: DictConfig, groups: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(setting, package, the setting that does without it) for every optional package the command's
    settings need. A pypi_gguf model needs gguf only to be provisioned (once, into paths.cache_dir)."""
    needed = []
    if cfg.get("logger") is not None and cfg.logger.get("kind") == "wandb":
        needed.append(("logger=wandb", "wandb", "logger=none"))
    for group in ("sft", "dpo", "online"):
        if group in groups and cfg[group].get("mode") == "lora":
            needed.append((f"{group}.mode=lora", "peft", f"{group}.mode=full"))
    models = [("policy.kind", cfg.policy, "policy=hf policy.name_or_path=<folder or hub id>")] if "policy" in groups else []
    if "reward" in groups and OmegaConf.is_dict(cfg.reward.get("backbone")):
        models.append(("reward.backbone.kind", cfg.reward.backbone, "reward.backbone.kind=hf with a folder or hub id"))
    if "draft" in groups and cfg.draft.get("kind") == "model":
        models.append(("draft.source", OmegaConf.merge(cfg.draft, {"kind": cfg.draft.get("source", "hf")}),
                       "draft.source=hf"))
    for key, model, instead in models:
        if model.get("kind") == "pypi_gguf" and not is_complete(Path(cfg.paths.cache_dir) / "models" /
                                                                str(model.name_or_path)):
            needed.append((f"{key}=pypi_gguf", "gguf", instead))
    return needed


def _check_packages(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """The optional packages the settings need, importable before any work, not when the first model loads:
    sample.backend=vllm needs vLLM (imported: a broken install counts as missing), logger=wandb wandb, LoRA
    peft, a GGUF model still to provision gguf."""
    if "sample" in groups and cfg.sample.get("backend", "rsft") == "vllm":
        from rsft.sampling.vllm_engine import INSTALL_HINT, vllm_available

        if not vllm_available():
            raise MissingPackage(f"sample.backend=vllm: vLLM cannot be imported here. {INSTALL_HINT}")
    for setting, package, instead in _needed_packages(cfg, groups):
        if not _installed(package):
            raise MissingPackage(f"{setting} needs the {package} package, which is not installed here: "
                                 f"`pip install {package}` (or `pip install -e .`, which installs every package rsft "
                                 f"needs), or use {instead}")


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
    check_device(cfg.device)


def check_device(name: str, key: str = "device") -> torch.device:
    """The device `name` (auto, cpu, cuda, cuda:N) resolved, or ConfigError naming `key` (`device`, or a
    script's `--device`) where it is misspelt or this machine has no such device; scripts call it too."""
    sep = "=" if not key.startswith("-") else " "
    try:
        device = resolve_device(name)
    except (ValueError, RuntimeError):  # torch.device("cuda:x") raises RuntimeError
        raise ConfigError(f"{key}{sep}{name!r}: expected auto, cpu, cuda or cuda:N") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ConfigError(f"{key}{sep}{name} but this torch build/machine has no CUDA device; "
                          f"use {key}{sep}cpu or auto")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(f"{key}{sep}{name} but this machine has {count} CUDA device(s): "
                          f"cuda:0 to cuda:{count - 1}")
    return device
