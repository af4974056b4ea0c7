"""What made an artifact (its fingerprint), and whether a complete one may be reused.

A fingerprint, recorded in meta.json:
  config      the config keys its stage declares it reads (rsft.stages: reads), resolved and flattened,
              less the leaves that never change a result (rsft.stages.UNCOUNTED) and the settings at their
              off value (rsft.stages.WHILE_OFF, applied by rsft.runner)
  inputs      the digest of every artifact it read (so a rebuilt upstream artifact makes it stale)
  user_files  the size and checksum of every user file it read (prompt files, pair files)
A complete artifact is reused only when the fingerprint asked for now equals the recorded one;
otherwise the stage stops before any work with the keys that differ (StaleArtifact), and
`overwrite=true` rebuilds it. Staleness is transitive (rsft.store.check_fresh): an input artifact is
trusted only when what it was built from is unchanged too, all the way up."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, ListConfig, OmegaConf

from rsft.errors import (
    MissingInput,
    StaleArtifact,
)
from reward.digests import user_files_digest
from rsft.config import renamed_key
from rsft.stages import UNCOUNTED
from rsft.store import (
    META_FILE,
    check_fresh,
    check_intact,
    is_complete,
)

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key not in UNCOUNTED:
                _flatten(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = value




_ABSENT = object()


def fingerprint(cfg, keys: Iterable[str], inputs: Iterable[str | os.PathLike] = (),
                user_files: Iterable[str | os.PathLike] = (), sources: dict | None = None) -> dict[str, Any]:
    """What an artifact is made from: config keys (flattened), input artifacts' digests, user files, and the
    reward sources other than a trained model folder (rsft.reward_service.source_identity: their content)."""
    config: dict[str, Any] = {}
    for key in keys:  # a key the composed config does not have (another data kind's setting) is left out
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
        if value is not _ABSENT:
            _flatten(key, _plain(value), config)
    run_dir = Path(cfg.paths.run_dir)
    recorded_inputs = {}
    for path in inputs:
        path = Path(path)
        if not is_complete(path):
            raise MissingInput(f"{path} is missing or incomplete; run the stage that builds it first")
        name = str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)
        recorded_inputs[name] = check_fresh(path, run_dir).get("digest")  # stale inputs stop here, transitively
    files = {}
    for path in user_files:
        if not Path(path).expanduser().exists():
            raise MissingInput(f"{path}: no such file or folder; check the setting that names it (data.path, "
                               f"data.eval_path, reward.data.path, refresh.pairs)")
        files[str(path)] = user_files_digest(path)
    wanted = {"config": config, "inputs": recorded_inputs, "user_files": files}
    if sources:  # only when a stage scores with one: artifacts made before sources existed still match
        wanted["sources"] = {name: json.loads(json.dumps(identity, default=str)) for name, identity in sources.items()}
    aliases = {key: source for key in config if (source := _interpolated_from(cfg, key))}
    if aliases:  # not compared: it only lets a refusal name the key the user sets
        wanted["aliases"] = aliases
    return wanted


def _interpolated_from(cfg, key: str) -> str | None:
    """The key a setting takes its value from (prefs.temperature: ${sample.temperature} -> sample.temperature)."""
    parent_key, _, last = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or last not in parent or not OmegaConf.is_interpolation(parent, last):
        return None
    match = re.fullmatch(r"\$\{([A-Za-z_][\w.]*)\}", str(parent._get_node(last)._value()))
    return match.group(1) if match else None


def _differences(old: dict, new: dict) -> list[str]:
    lines = []
    aliases = new.get("aliases") or {}
    for section in ("config", "inputs", "user_files", "sources"):
        before, after = old.get(section) or {}, new.get(section) or {}
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                if section == "config":
                    name = f"{aliases[key]} (read as {key})" if key in aliases else key
                    lines.append(f"{name}: {before.get(key, '(not set)')!r} -> {after.get(key, '(not set)')!r}")
                elif section == "sources":
                    lines.append(f"reward source {key}: {before.get(key, '(none)')} -> {after.get(key, '(none)')}")
                else:
                    what = "input artifact" if section == "inputs" else "file"
                    change = "rebuilt or replaced" if key in before and key in after else (
                        "new" if key in after else "no longer read")
                    lines.append(f"{what} {key}: {change}")
    return lines


def check_reuse(path: str | os.PathLike, overwrite: bool, what: str, wanted: dict[str, Any]) -> bool:
    """The decision on an artifact before any work. True when a complete, intact artifact made from `wanted`
    (a fingerprint) exists: reuse it. False when it must be built (absent, incomplete, or overwrite=true). A complete artifact made
    from anything else raises StaleArtifact, before any work."""
    path = Path(path)
    if is_complete(path) and not overwrite:
        meta = check_intact(path)
        recorded = dict(meta.get("fingerprint") or {})
        # an artifact recorded under a renamed setting's old name (rsft.config.RENAMED) still matches
        recorded["config"] = {renamed_key(k): v for k, v in (recorded.get("config") or {}).items()}
        differences = _differences(recorded, wanted)
        if differences:
            raise StaleArtifact(
                f"{what}: {path} was made from other settings or inputs than this command's:\n  "
                + "\n  ".join(differences)
                + "\nEither rebuild it, and then everything downstream of it, with overwrite=true, "
                  "or keep both with another run_name=...")
        log.info("%s: complete artifact at %s made from the same settings, reusing it (overwrite=true rebuilds it)",
                 what, path)
        return True
    if path.exists() and not is_complete(path):
        log.warning("%s: %s is incomplete (no %s, a killed run?); rebuilding it", what, path, META_FILE)
    return False
