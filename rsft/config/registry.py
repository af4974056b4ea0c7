"""The registry: every schema by group and option (SCHEMAS), where each nested section sits (its `_AT`),
registering them in Hydra's ConfigStore, and describing them (--help, docs/config.md).
"""

import dataclasses
import typing
from typing import Any

from hydra.core.config_store import ConfigStore

from rsft.config.data_settings import (
    DataCheckableConfig,
    DataDemoConfig,
    DataHhRlhfConfig,
    DataHubConfig,
    DataLocalConfig,
)
from rsft.config.draft_settings import (
    DistillConfig,
    DraftDistilledConfig,
    DraftFeatureConfig,
    DraftModelConfig,
    DraftNgramConfig,
    DraftNoneConfig,
)
from rsft.config.eval_settings import EvalConfig
from rsft.config.logger_settings import LoggerNoneConfig, LoggerWandbConfig
from rsft.config.loop_settings import LoopConfig
from rsft.config.online_settings import OnlineConfig
from rsft.config.policy_settings import PolicyHfConfig, PolicyPypiGgufConfig, PolicyTinyConfig
from rsft.config.prefs_settings import PrefsConfig
from rsft.config.refresh_settings import RefreshConfig
from rsft.config.reward_settings import (
    BackboneHfConfig,
    BackbonePypiFolderConfig,
    BackbonePypiGgufConfig,
    BackboneTinyConfig,
    RewardConfig,
    RewardSourceConfig,
)
from rsft.config.rules import Checked, _field_check
from rsft.config.run_settings import PathsConfig, RunConfig
from rsft.config.sample_settings import SampleConfig
from rsft.config.select_settings import SelectConfig
from rsft.config.training_settings import DpoConfig, SftConfig


# group -> {option or kind: its dataclass}, in conf/config.yaml's order; "run" is the top level (no group),
# "reward.backbone" the kinds of the reward group's backbone section. docs/config.md is generated from it.
SCHEMAS: dict = {
    "run": {"default": RunConfig},
    "paths": {"default": PathsConfig},
    "policy": {"hf": PolicyHfConfig, "pypi_gguf": PolicyPypiGgufConfig, "tiny": PolicyTinyConfig},
    "draft": {"none": DraftNoneConfig, "ngram": DraftNgramConfig, "model": DraftModelConfig,
              "distilled": DraftDistilledConfig, "feature": DraftFeatureConfig},
    "distill": {"default": DistillConfig},
    "data": {"demo": DataDemoConfig, "hh_rlhf": DataHhRlhfConfig, "hub": DataHubConfig, "local": DataLocalConfig,
             "checkable": DataCheckableConfig},
    "sample": {"default": SampleConfig},
    "select": {"default": SelectConfig},
    "sft": {"default": SftConfig},
    "dpo": {"default": DpoConfig},
    "refresh": {"default": RefreshConfig},
    "eval": {"default": EvalConfig},
    "loop": {"default": LoopConfig},
    "online": {"default": OnlineConfig},
    "prefs": {"default": PrefsConfig},
    "reward": {"default": RewardConfig},
    "reward_source": {"default": RewardSourceConfig},
    "reward.backbone": {"hf": BackboneHfConfig, "pypi_folder": BackbonePypiFolderConfig,
                        "pypi_gguf": BackbonePypiGgufConfig, "tiny": BackboneTinyConfig},
    "logger": {"none": LoggerNoneConfig, "wandb": LoggerWandbConfig},
}
ROOT_SCHEMA = "rsft_schema"  # conf/config.yaml's first default


def _place_sections(cls, at: str) -> None:
    """Set the `_AT` of schema `cls` (where it sits in its group) and, down its fields, of every nested section
    (a field whose default is a Checked dataclass): the path of field names from the group, so that every check
    names the full key (loop.stop.patience, not loop.patience). The place is derived here, never declared; a
    section class placed at two different paths would name one of them wrongly, so that is refused (a bug)."""
    placed = cls.__dict__.get("_AT")
    if placed is not None and placed != at:
        raise TypeError(f"schema {cls.__name__} sits at {placed!r} and at {at!r} in its groups: its checks can name "
                        f"only one; give each place a subclass of its own")
    if at:
        cls._AT = at
    for field in dataclasses.fields(cls):
        section = field.default_factory
        if isinstance(section, type) and issubclass(section, Checked):
            _place_sections(section, at + field.name + ".")


for _group_name, _options in SCHEMAS.items():
    for _schema in _options.values():  # "reward.backbone": the kinds sit at backbone. in the reward group
        _place_sections(_schema, _group_name.partition(".")[2] + "." if "." in _group_name else "")


def schema_name(group: str, option: str) -> str:
    """The ConfigStore name under schema/ that conf/ lists (`- /schema/<name>@_here_`): <group> for a group
    with one schema, <group>_<kind> otherwise; the backbones are backbone_<kind>, and the top level's is
    rsft_schema, outside schema/ (conf/config.yaml's first default)."""
    if group == "run":
        return ROOT_SCHEMA
    group = group.removeprefix("reward.")
    return group if option == "default" else f"{group}_{option}"


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (schema/<name>, the root as rsft_schema); storing again
    replaces the same entries, so calling it twice is harmless."""
    store = ConfigStore.instance()
    for group, options in SCHEMAS.items():
        for option, cls in options.items():
            store.store(group=None if group == "run" else "schema", name=schema_name(group, option), node=cls)


# -- describing a schema (--help, docs/config.md) ---------------------------------------------------------------


def _type_name(hint, field: dataclasses.Field) -> str:
    if hint is Any:
        return field.metadata.get("type", "any")
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        return f"{_type_name(next(a for a in args if a is not type(None)), field)} or null"
    if typing.get_origin(hint) is list:
        return f"list of {_type_name(args[0], field)}"
    return hint.__name__


def _default_repr(value) -> str:
    """The default as YAML spells it: null, true, ???, ${...}, [a, b]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_default_repr(v) for v in value) + "]"
    return str(value)


def describe(cls, prefix: str = "") -> list:
    """[(dotted key, type name, default as YAML spells it, help)] for every setting of a schema, nested
    sections flattened (train.num_layers, lora.r, data.path, fallback.gamma). The type name ends with
    what the setting's own check accepts, where it says more than the type (`int, >= 1`)."""
    hints = typing.get_type_hints(cls)
    rows = []
    for field in dataclasses.fields(cls):
        key = prefix + field.name
        factory = field.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            rows.extend(describe(factory, key + "."))
            continue
        default = factory() if factory is not dataclasses.MISSING else field.default
        check = _field_check(cls, field.name)
        allowed = check.describe() if check is not None else ""
        type_name = _type_name(hints[field.name], field) + (f", {allowed}" if allowed else "")
        rows.append((key, type_name, _default_repr(default), field.metadata["help"]))
    return rows
