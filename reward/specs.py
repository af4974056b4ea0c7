"""Reward source specs: the one parser from a spec string to a reward source (reward.sources), for the config (rsft.reward_service), eval.judge, rsft.serve_reward and the scripts.

    trained:<folder>                      a folder written by stage=reward (reward_stats.json in it)
    pretrained:<folder or hub id>         any AutoModelForSequenceClassification, used as it is
                                          (options: head=<index> for a multi-head model, max_length)
    function:<module>:<function>          a Python callable, importable as module.function
    function:<path/to/file.py>:<function> a callable in a file (relative to the current directory)
    <folder>                              reward_stats.json in it: trained; config.json and no
                                          reward_stats.json: pretrained
    http://... or https://...             a reward server (reward.http_client)

A combination of sources is built by reward.sources.combine, not by a spec. This module sits above
every kind's module, so it imports each directly."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from reward.refusals import ConfigError
from reward.http_client import HttpReward
from reward.sources import SOURCES, FunctionReward, PretrainedReward, RewardSource, TrainedReward


log = logging.getLogger(__name__)




SPEC_FORMS = ("trained:<folder>", "pretrained:<folder or hub id>", "function:<module>:<function>",
              "function:<path/to/file.py>:<function>",
              "<folder> (with reward_stats.json: trained; with config.json: pretrained)",
              "http://<server> or https://<server>")


def _options_for(kind: str, options: dict[str, Any], accepted: tuple[str, ...]) -> dict[str, Any]:
    extra = sorted(k for k in options if k not in accepted)
    if extra:
        allowed = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
        raise ConfigError(f"reward source option(s) {', '.join(extra)} do not apply to a {kind} source; {allowed}")
    return {k: v for k, v in options.items() if k in accepted}


def _http_source(url: str, options: dict[str, Any]) -> RewardSource:
    return HttpReward(url, **options)


def open_source(spec: str, device: str = "cpu", **options) -> RewardSource:
    """The reward source a spec names (SPEC_FORMS, module docstring). Options whose value is None are
    unset; one that does not apply to the kind is refused (ConfigError). pretrained takes head and
    max_length; trained and function take none; http sources get the options as they are."""
    options = {k: v for k, v in options.items() if v is not None}
    text = str(spec).strip()
    forms = "; ".join(SPEC_FORMS)
    if text.startswith(("http://", "https://")):
        return _http_source(text, options)
    kind, colon, target = text.partition(":")
    if colon and kind in ("trained", "pretrained", "function"):
        if not target:
            raise ConfigError(f"reward source {text!r}: nothing after {kind}:; expected {forms}")
        if kind == "trained":
            _options_for(kind, options, ())
            return TrainedReward(target, device)
        if kind == "pretrained":
            return PretrainedReward(target, device, **_options_for(kind, options, ("head", "max_length")))
        _options_for(kind, options, ())
        return FunctionReward(target)
    from reward.trained import STATS_FILE

    folder = Path(text).expanduser()
    if folder.is_dir():
        if (folder / STATS_FILE).is_file():
            _options_for("trained", options, ())
            return TrainedReward(folder, device)
        if (folder / "config.json").is_file():
            return PretrainedReward(str(folder), device, **_options_for("pretrained", options, ("head", "max_length")))
        raise ConfigError(f"reward source {text!r}: the folder holds neither {STATS_FILE} (a model trained by "
                          f"stage=reward) nor config.json (a pretrained model); expected {forms}")
    if colon and kind in SOURCES and kind not in ("combination",):
        return SOURCES[kind](target, **options)
    raise ConfigError(f"reward source {text!r}: not a folder here, nor a spec rsft reads; expected {forms}")
