"""The whole config, checked before a command does any work: one line per mistake.

    check_config(cfg)   # the first thing every command does; raises ConfigError

A setting that is wrong stops the command before any artifact is skipped, read or written and
before any model is loaded: a loop must not run prefs, reward, eval, sample and score before it
meets `select.pairs=true` with one completion per prompt. Each message names the setting, the value
and what was expected, e.g. `sample.temperature='hot': expected a number > 0`.

Which settings: the top-level ones every command reads (stage, run_name, round, seed, threads,
device), and the config groups the stage reads, as rsft.stages lists them; stage=loop reads every
group its stages read. A group a stage does not read is not checked (stage=reward does not fail on
sample.top_p=7), so a stage can be run with any leftovers of another experiment on the command line.

One home per rule: where a module already checks a setting (the sampling settings in
rsft.sample.sampling_settings, draft.gamma in rsft.sampling.verifier, select's settings, the data
limits in rsft.data, the device names in rsft.models) that check is called here and its ValueError
becomes a ConfigError. This module adds what those checks cannot say: a value of the wrong type
named as such, instead of Python's "could not convert string to float".
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

import torch
from omegaconf import DictConfig, OmegaConf

from rsft.data import check_limit
from rsft.errors import ConfigError
from rsft.distributed import per_device_batch
from rsft.models import resolve_device
from rsft.paths import refresh_reward_on
from rsft.stages import groups_read
from rsft.sample import DRAFT_KINDS, sampling_settings
from rsft.sampling.verifier import check_gamma
from rsft.select import check_settings as check_select_settings


SAMPLING_TYPES = (("max_new_tokens", int, "an integer >= 1"), ("temperature", float, "a number > 0"),
                  ("top_k", int, "an integer >= 0 (0 = off)"), ("top_p", float, "a number in (0, 1]"),
                  ("leniency", float, "a number in (0, 1]"), ("batch_rows", int, "an integer >= 1"))


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for the first setting the command cannot run with. The stage itself is
    rsft.run.run_stage's to check (it owns the stage table); this reads a valid cfg.stage."""
    stage = cfg.stage
    _check_required(cfg, ("policy", *groups_read(stage)))
    _check_run_dir(cfg)
    _at_least(cfg, "round", -1 if stage == "draft" else 0,
              "(stage=draft: -1 = before any SFT)" if stage == "draft" else "")
    _typed(cfg, "seed", int, "an integer")
    _at_least(cfg, "threads", 0, "(0 = torch's default)")
    _check_device(cfg)
    # every stage's round table reads them (RunPaths.from_config)
    if OmegaConf.select(cfg, "loop.refresh_reward") != "auto":
        _boolean(cfg, "loop.refresh_reward", "true, false or auto")
    _boolean(cfg, "loop.dpo")
    for group in groups_read(stage):
        GROUP_CHECKS[group](cfg)


def _check_required(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """Settings a config option leaves to the user (`???`: data=local's data.path, policy=hf's
    name_or_path, data=hub's name) must be given on the command line."""
    for group in groups:
        missing = sorted(OmegaConf.missing_keys(cfg[group])) if group in cfg else []  # full keys: data.path
        if missing:
            raise ConfigError(f"{', '.join(missing)}: required by {group}.kind={cfg[group].get('kind')} and not set; "
                              f"add {missing[0]}=... to the command")


def check_run_name(name, setting: str = "run_name") -> None:
    """A run name is a folder under paths.runs_root: `..` or an absolute path would write elsewhere, and an
    empty name would write into the runs root itself. Subfolders (sweeps/k8) are fine. The entry point
    also applies it to the command line before Hydra starts (Hydra creates its log folder under
    paths.run_dir first)."""
    text = "" if name is None else str(name)
    parts = PurePosixPath(text).parts
    if not text.strip() or not parts or text.startswith("/") or ".." in parts:
        raise ConfigError(f"{setting}={name!r}: expected a non-empty relative folder name (e.g. demo or sweeps/k8) "
                          f"without '..' components, not starting with '/'")


def _check_run_dir(cfg: DictConfig) -> None:
    check_run_name(cfg.get("run_name"))
    root, run_dir = os.path.abspath(cfg.paths.runs_root), os.path.abspath(cfg.paths.run_dir)
    if run_dir == root or os.path.commonpath([root, run_dir]) != root:
        raise ConfigError(f"paths.run_dir={cfg.paths.run_dir!r}: expected a folder inside "
                          f"paths.runs_root={cfg.paths.runs_root!r}")


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


def _check_data(cfg: DictConfig) -> None:
    for key in ("limit", "eval_limit"):
        _reuse(check_limit, f"data.{key}", cfg.data.get(key))
    _boolean(cfg, "data.rotate")


def _check_sampling(cfg: DictConfig, group: str) -> None:
    """sample.* (or prefs.*, which samples the same way): the types here, then the one path from the
    config to SamplingSettings (rsft.sample.sampling_settings), which checks the ranges."""
    for key, kind, expected in SAMPLING_TYPES:
        _typed(cfg, f"{group}.{key}", kind, expected)
    _reuse(sampling_settings, cfg[group], group=group)


def _check_sample(cfg: DictConfig) -> None:
    _check_sampling(cfg, "sample")
    _at_least(cfg, "sample.num_samples", 1)


def _check_draft(cfg: DictConfig) -> None:
    if _one_of(cfg, "draft.kind", DRAFT_KINDS) != "none":
        _reuse(check_gamma, cfg.draft.gamma)
    if cfg.draft.kind == "feature":  # stage=draft's settings for it (conf/draft/feature.yaml)
        for key in ("num_layers", "epochs", "batch_size", "eval_prompts", "eval_samples", "eval_gamma"):
            _at_least(cfg, f"draft.train.{key}", 1)
        _at_least(cfg, "draft.train.head_tokens", 0, "(0 = the policy's whole output layer)")
        for key in ("feature_weight", "learning_rate", "weight_decay", "max_grad_norm", "heldout_fraction"):
            _typed(cfg, f"draft.train.{key}", float, "a number")


def _check_select(cfg: DictConfig) -> None:
    _typed(cfg, "select.k", int, "an integer >= 1")
    _typed(cfg, "select.pool_rounds", int, "an integer (-1 = all earlier rounds)")
    if cfg.select.threshold is not None:
        _typed(cfg, "select.threshold", float, "a number (a reward_normalised value) or null")
    _reuse(check_select_settings, cfg.select)
    # checked against this run's sampling settings; pairs pooled across rounds are not counted
    if cfg.select.pairs and _at_least(cfg, "sample.num_samples", 1) < 2:
        raise ConfigError(f"select.pairs=true needs sample.num_samples >= 2 (got {cfg.sample.num_samples}): "
                          f"a pair is the best and the worst completion of a prompt; or set select.pairs=false")


def _check_training(cfg: DictConfig, group: str) -> None:
    """The trainers' global batch must divide over the processes of a launch (rsft.distributed)."""
    _reuse(per_device_batch, f"{group}.batch_size", _at_least(cfg, f"{group}.batch_size", 1))


def _check_sft(cfg: DictConfig) -> None:
    _one_of(cfg, "sft.mode", ("full", "lora"))
    _one_of(cfg, "sft.init", ("initial", "previous"))
    _check_training(cfg, "sft")


def _check_reward(cfg: DictConfig) -> None:
    _check_training(cfg, "reward")


def _check_dpo(cfg: DictConfig) -> None:
    _one_of(cfg, "dpo.mode", ("full", "lora"))
    if _typed(cfg, "dpo.beta", float, "a number > 0") <= 0:
        raise ConfigError(f"dpo.beta={cfg.dpo.beta!r}: expected a number > 0")
    _typed(cfg, "dpo.min_margin", float, "a number (a gap in reward_normalised; 0 keeps every pair)")
    _check_training(cfg, "dpo")


def _check_refresh(cfg: DictConfig) -> None:
    """loop.refresh_reward and the refresh group: read by stage=refresh and, through the round table
    (RunPaths.scoring_reward), by stage=score."""
    if not refresh_reward_on(cfg):  # loop.refresh_reward: true | false | auto (checked by check_config)
        return
    _at_least(cfg, "refresh.samples_per_prompt", 2, "(pairs need two completions of a prompt)")
    _one_of(cfg, "refresh.init", ("scratch", "previous"))
    if cfg.refresh.epochs is not None:
        _at_least(cfg, "refresh.epochs", 1, "or null (= reward.epochs)")
    if cfg.data.kind != "demo" and cfg.refresh.pairs is None:
        raise ConfigError(f"loop.refresh_reward=true with data.kind={cfg.data.kind} needs your labelled pairs of each "
                          f"round: refresh.pairs=<a folder with round_00.jsonl, round_01.jsonl, ...>; the "
                          f"simulated labels need the demo task's gold oracle")


def _check_eval(cfg: DictConfig) -> None:
    _one_of(cfg, "eval.policy", ("round", "initial"))
    _at_least(cfg, "eval.num_samples", 1)


def _check_prefs(cfg: DictConfig) -> None:
    _check_sampling(cfg, "prefs")
    _at_least(cfg, "prefs.num_samples", 2, "(pairs need two completions of a prompt)")
    _reuse(check_limit, "prefs.num_prompts", cfg.prefs.num_prompts)


def _check_loop(cfg: DictConfig) -> None:
    _at_least(cfg, "loop.rounds", 1)
    if _boolean(cfg, "loop.dpo") and not cfg.select.pairs:
        raise ConfigError("loop.dpo=true trains on the pairs stage=select writes; set select.pairs=true")
    if cfg.data.kind != "demo" and cfg.reward.data.path is None and not cfg.loop.reward_from:
        raise ConfigError(f"stage=loop with data.kind={cfg.data.kind} needs a reward model: reward.data.path=<your "
                          f"pairs> (or loop.reward_from=<a run with one>); the simulated labels of stage=prefs "
                          f"need the demo task's gold oracle")
    if cfg.loop.reward_from:  # as rsft.loop reads it: empty = not set
        check_run_name(cfg.loop.reward_from, "loop.reward_from")


GROUP_CHECKS = {"reward": _check_reward, "data": _check_data, "sample": _check_sample, "draft": _check_draft, "select": _check_select,
                "sft": _check_sft, "dpo": _check_dpo, "refresh": _check_refresh, "eval": _check_eval,
                "prefs": _check_prefs, "loop": _check_loop}


def _typed(cfg: DictConfig, key: str, kind: type, expected: str):
    """The setting as int or float; any other value (a string, a bool, null) is named with what was expected."""
    value = OmegaConf.select(cfg, key)
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise ConfigError(f"{key}={value!r}: expected {expected}")
    return kind(value)


def _boolean(cfg: DictConfig, key: str, expected: str = "true or false") -> bool:
    """A switch: true or false (a missing key is false), never a string such as 'no' that Python reads as true."""
    value = OmegaConf.select(cfg, key, default=False)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: expected {expected}")
    return value


def _at_least(cfg: DictConfig, key: str, minimum: int, note: str = "") -> int:
    expected = f"an integer >= {minimum}" + (f" {note}" if note else "")
    value = _typed(cfg, key, int, expected)
    if value < minimum:
        raise ConfigError(f"{key}={value!r}: expected {expected}")
    return value


def _one_of(cfg: DictConfig, key: str, options: tuple[str, ...]) -> str:
    value = OmegaConf.select(cfg, key)
    if value not in options:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(options)}")
    return value


def _reuse(check, *args, group: str | None = None) -> None:
    """Run another module's check and turn its ValueError into a ConfigError.

    With group: the sampling checks (rsft.sampling reads no config; it serves sample.* and prefs.*)
    start their message with the field's name, a few already as `sample.<field>`; the group is put in
    front, so the message names the setting as the user wrote it.
    """
    try:
        check(*args)
    except ValueError as e:
        message = str(e)
        if group is not None:
            message = f"{group}.{message.removeprefix('sample.')}"
        raise ConfigError(message) from None
