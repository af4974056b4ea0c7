"""The run directory: the only module that knows its layout, and how artifacts are written.

    runs/<run_name>/
      prefs/ reward/ draft/                      pairwise labels, reward model, distilled draft
      eval_initial/                              the initial policy's evaluation (the baseline)
      round_00/samples/ prefs/ reward/ scored/ selected/ pairs/ policy/ dpo/ draft/ eval/
                                                 (prefs/ reward/ with loop.refresh_reward, dpo/ with loop.dpo)
      plots/ summary.md logs/ wandb/

An artifact is a folder (a `datasets.save_to_disk` folder or a `save_pretrained` folder). It is
built under a temporary sibling name, `meta.json` is written into it last, and then it is renamed
into place in one `os.replace`. So a folder at an artifact's name without `meta.json` cannot be the
result of a finished write: it is incomplete, never read, and rebuilt. A kill at any point leaves
either the old state or the complete new artifact; stale temporary folders are swept on the next
write.

What made an artifact (its fingerprint) is recorded in meta.json and checked before it is reused:
  config   the config keys its stage reads (listed at each stage's fingerprint() call), resolved, flattened;
           keys that cannot change a result are left out (IGNORED_KEYS: progress bars, logging
           cadence, scoring batch sizes, how often a stage saves progress to resume from; `threads`,
           `device`, `logger` are never listed)
  inputs   the digest of every artifact it read (so a rebuilt upstream artifact makes it stale)
           and the size and checksum of every user file it read (prompt files, pair files)
  files    the size and CRC-32 of each of its own files; `digest` hashes all of the above
A complete artifact is reused only when the fingerprint asked for now equals the recorded one;
otherwise the stage stops before any work with the keys that differ (StaleArtifact), and
`overwrite=true` rebuilds it. Staleness is transitive (check_fresh): an input artifact is trusted
only when what it was built from is unchanged too, all the way up, so after a rebuild everything
downstream stops until rebuilt, not only the next stage. A reused or loaded artifact whose files are
missing, have another size or another CRC-32 is damaged (DamagedArtifact): the error names the
folder and the command that rebuilds it. Each file is checksummed once per process.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf

from rsft import distributed
from rsft.config import refresh_reward_on
from rsft.errors import ArtifactError, DamagedArtifact, RunDirectoryBusy, StaleArtifact

log = logging.getLogger(__name__)

META_FILE = "meta.json"
LOCK_FILE = ".lock"
# Config leaves that cannot change an artifact's content: never part of a fingerprint.
IGNORED_KEYS = {"progress", "logging_steps", "score_batch_size", "shard_prompts", "score_shard_rows",
                "checkpoint_steps"}


class RunPaths:
    """Where every artifact of one run lives, and which artifact a round reads.

    The round rules live here and nowhere else (pinned by tests/test_paths.py's round table):
      round r ends with               round_policy(r): its DPO policy (round_XX/dpo) with loop.dpo, else
                                      its SFT policy (round_XX/policy)
      round r samples from            sampling_policy(r): the policy round r-1 ended with; round 0 the configured one
      round r's SFT starts from       sft_init_policy(r, init): the configured policy (init=initial)
                                      or the policy round r sampled from (init=previous)
      round r's DPO starts from       dpo_init_policy(r): round r's SFT policy, which is also its reference
      eval round r judges             eval_policy(r): the policy round r ended with
      round r's scores come from      scoring_reward(r): round_XX/reward, retrained on the labels of every
                                      round so far, with loop.refresh_reward; else the run's reward/
      ... which trains on             refresh_labels(r): prefs/ (unless the user's pairs stand in) and
                                      round_00/prefs .. round_XX/prefs
      round r prunes with             budget_reward(r): sample.prune / sample.adaptive's reward model, the
                                      newest before round r samples (round r-1's refreshed one, else reward/)
      eval (every round) scores with  eval_reward: the run's reward/, the same for every round and the initial
                                      policy, so their numbers stay comparable when scoring follows the policy
      stage=draft round r imitates    draft_teacher(r): round r's policy, the configured one before any
      ... and writes                  draft_output(r): round_XX/draft (serves round r+1), else draft/
      round r's sampler drafts with   sampling_draft(r): round r-1's refreshed draft, else draft/
    "The configured policy" is None: the caller loads conf/policy (rsft.models.load_policy).
    """

    def __init__(self, run_dir: str | os.PathLike, runs_root: str | os.PathLike | None = None,
                 refresh_reward: bool = False, dpo: bool = False):
        self.root = Path(run_dir)
        self.runs_root = Path(runs_root) if runs_root is not None else self.root.parent
        self.refresh_reward = bool(refresh_reward)  # loop.refresh_reward: each round scores with its own reward model
        self.dpo = bool(dpo)  # loop.dpo: each round ends with a DPO step after SFT

    @classmethod
    def from_config(cls, cfg) -> "RunPaths":
        loop = cfg.get("loop") or {}
        return cls(cfg.paths.run_dir, cfg.paths.runs_root, refresh_reward_on(cfg), bool(loop.get("dpo", False)))

    def other_run(self, run_name: str) -> "RunPaths":
        """Another run under the same runs root (loop.reward_from)."""
        return RunPaths(self.runs_root / run_name, self.runs_root, self.refresh_reward, self.dpo)

    # ---- which artifact a round reads ----

    def round_policy(self, round_idx: int) -> Path:
        """The policy round r ends with: its DPO output with loop.dpo, else its SFT output."""
        return self.dpo_policy(round_idx) if self.dpo else self.policy(round_idx)

    def sampling_policy(self, round_idx: int) -> Path | None:
        """The policy round r samples from: the one round r-1 ended with; None (configured) for round 0."""
        return None if round_idx == 0 else self.round_policy(round_idx - 1)

    def dpo_init_policy(self, round_idx: int) -> Path:
        """The policy round r's DPO starts from and keeps as its reference: round r's SFT policy."""
        return self.policy(round_idx)

    @property
    def eval_reward(self) -> Path:
        """The reward model eval scores every policy with: the run's reward/, whatever scored the rounds."""
        return self.reward

    def scoring_reward(self, round_idx: int) -> Path:
        """The reward model that scores round r's samples: round_XX/reward with loop.refresh_reward, else reward/."""
        return self.round_reward(round_idx) if self.refresh_reward else self.reward

    def budget_reward(self, round_idx: int) -> Path:
        """The reward model that prunes round r's rows and spends its adaptive K while it samples: the
        newest one that exists before round r samples (with loop.refresh_reward round r - 1's, since
        round r's own is trained on these samples; else the run's reward/)."""
        return self.round_reward(round_idx - 1) if self.refresh_reward and round_idx > 0 else self.reward

    def refresh_labels(self, round_idx: int) -> list[Path]:
        """The labelled rounds round r's refreshed reward model trains on, with the initial labels
        (prefs/, or the user's reward.data pairs, which are not an artifact): rounds 0 .. r."""
        return [self.round_prefs(r) for r in range(round_idx + 1)]

    def sft_init_policy(self, round_idx: int, init: str) -> Path | None:
        """The policy round r's SFT starts from (sft.init: initial | previous)."""
        if init == "initial":
            return None
        if init == "previous":
            return self.sampling_policy(round_idx)
        raise ValueError(f"sft.init={init!r}: expected initial (the configured policy) or previous "
                         "(the policy this round sampled from)")

    def eval_policy(self, round_idx: int) -> Path:
        """The policy `eval round=r` judges: the one round r ended with."""
        return self.round_policy(round_idx)

    def draft_teacher(self, round_idx: int) -> Path | None:
        """The policy stage=draft round r imitates: the policy round r ended with once it exists (the one
        round r + 1 samples from), else the configured one."""
        if round_idx >= 0 and is_complete(self.round_policy(round_idx)):
            return self.round_policy(round_idx)
        return None

    def draft_output(self, round_idx: int) -> Path:
        """Where stage=draft round r writes: round_XX/draft (serving round r+1) when round r's policy
        exists, else the run's draft/ (a draft of the configured policy)."""
        return self.draft if self.draft_teacher(round_idx) is None else self.round_draft(round_idx)

    def sampling_draft(self, round_idx: int) -> Path:
        """The distilled draft round r samples with: the one refreshed after round r-1, else draft/."""
        previous = self.round_draft(round_idx - 1) if round_idx > 0 else None
        return previous if previous is not None and is_complete(previous) else self.draft

    # ---- where each artifact lives ----

    def round_dir(self, round_idx: int) -> Path:
        return self.root / f"round_{round_idx:02d}"

    def samples(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "samples"

    def scored(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "scored"

    def selected(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "selected"

    def pairs(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "pairs"

    def round_prefs(self, round_idx: int) -> Path:
        """Pairs of round r's samples, labelled (stage=refresh, loop.refresh_reward)."""
        return self.round_dir(round_idx) / "prefs"

    def round_reward(self, round_idx: int) -> Path:
        """The reward model retrained after round r's sampling (stage=refresh), which scores round r."""
        return self.round_dir(round_idx) / "reward"

    def policy(self, round_idx: int) -> Path:
        """The policy SFT trained in round r (what round r + 1 samples from, unless loop.dpo)."""
        return self.round_dir(round_idx) / "policy"

    def dpo_policy(self, round_idx: int) -> Path:
        """The policy DPO trained from round r's SFT policy on round r's pairs (loop.dpo)."""
        return self.round_dir(round_idx) / "dpo"

    def round_draft(self, round_idx: int) -> Path:
        """The draft refreshed after round r's SFT, for sampling round r + 1."""
        return self.round_dir(round_idx) / "draft"

    def eval(self, round_idx: int) -> Path:
        """The evaluation of the policy trained in round r (round_XX/policy)."""
        return self.round_dir(round_idx) / "eval"

    @property
    def initial_eval(self) -> Path:
        """The evaluation of the initial (configured) policy: the baseline every round is compared with."""
        return self.root / "eval_initial"

    @property
    def prefs(self) -> Path:
        return self.root / "prefs"

    @property
    def reward(self) -> Path:
        return self.root / "reward"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def summary(self) -> Path:
        return self.root / "summary.md"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"


@dataclass(frozen=True)
class Artifact:
    """What a stage returns: its artifact's folder and the meta.json record it holds, whether the stage
    built it now or reused it; the loop hands the records to the report (rsft.report.Records)."""

    path: Path
    meta: dict

    def __fspath__(self) -> str:  # usable wherever a folder is: load_from_disk(artifact), Path(artifact)
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


def finished(path: str | os.PathLike) -> Artifact:
    """A stage's result, once every process can read it (after the barrier that follows rank 0's write)."""
    return Artifact(Path(path), read_meta(path))


def is_complete(path: str | os.PathLike) -> bool:
    """An artifact exists only once its meta.json does (it is written last)."""
    return (Path(path) / META_FILE).is_file()


def rebuild_hint(path: Path, meta: dict | None = None) -> str:
    meta = meta or {}
    stage, round_idx = meta.get("stage"), meta.get("round")
    command = f"python -m rsft.run stage={stage}" + (f" round={round_idx}" if round_idx not in (None, -1) else "")
    return (f"rebuild it with `{command} overwrite=true` (and everything built from it)" if stage
            else f"delete {path} and rerun the stage that builds it")


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete artifact (no {META_FILE}); run the stage that builds it")
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DamagedArtifact(f"{path / META_FILE} cannot be read ({error}); {rebuild_hint(path)}") from None
    if not isinstance(meta, dict):
        raise DamagedArtifact(f"{path / META_FILE} is not a JSON object; {rebuild_hint(path)}")
    return meta


# (file, size, mtime_ns) -> its CRC-32, computed once per process: an artifact read by several stages of a
# loop (a policy folder: 540 MB) is checksummed once, and again only when a file changes on disk
_CHECKSUMS: dict[tuple[str, int, int], str] = {}


def _checksum(file: Path) -> str:
    status = file.stat()
    key = (str(file), status.st_size, status.st_mtime_ns)
    if key not in _CHECKSUMS:
        _CHECKSUMS[key] = file_digest(file)["crc32"]
    return _CHECKSUMS[key]


def _cached_digest(file: Path) -> dict[str, Any]:
    """file_digest's size and CRC-32, from the per-process checksum cache."""
    return {"size": file.stat().st_size, "crc32": _checksum(file)}


def check_intact(path: str | os.PathLike) -> dict[str, Any]:
    """The artifact's meta, after checking that every file it recorded is there with its size and its
    CRC-32 (damage that keeps a file's size is caught too; each file is read once per process)."""
    path = Path(path)
    meta = read_meta(path)
    for name, record in (meta.get("files") or {}).items():
        file = path / name
        size = file.stat().st_size if file.is_file() else None
        if size != record["size"]:
            found = "is missing" if size is None else f"has {size} bytes"
            raise DamagedArtifact(f"{path} is damaged: {name} {found}, {META_FILE} recorded {record['size']} bytes; "
                                  f"{rebuild_hint(path, meta)}")
        if "crc32" in record and _checksum(file) != record["crc32"]:
            raise DamagedArtifact(f"{path} is damaged: {name} has other content than when it was written (CRC-32 "
                                  f"{_checksum(file)}, {META_FILE} recorded {record['crc32']}); "
                                  f"{rebuild_hint(path, meta)}")
    return meta


def check_fresh(path: str | os.PathLike, run_dir: str | os.PathLike, _seen: set | None = None) -> dict[str, Any]:
    """check_intact, and the same for everything it was built from, all the way up: an artifact whose
    input was rebuilt since (its digest changed) or whose user file changed is stale, and so is everything
    built from it. Without this a rebuilt samples/ would stop score, but select would go on reusing
    selected/ picked from the old scores. Inputs that no longer exist are not judged here (the stage
    that needs them says they are missing)."""
    path, run_dir = Path(path), Path(run_dir)
    seen = set() if _seen is None else _seen
    meta = check_intact(path)
    if path in seen:
        return meta
    seen.add(path)
    recorded = meta.get("fingerprint") or {}
    for name, digest in (recorded.get("inputs") or {}).items():
        source = Path(name) if Path(name).is_absolute() else run_dir / name
        if not is_complete(source):
            continue
        current = check_fresh(source, run_dir, seen).get("digest")
        if current != digest:
            raise StaleArtifact(f"{path} was built from {name} before {name} was rebuilt; "
                                f"{rebuild_hint(path, meta)}")
    for name, digest in (recorded.get("user_files") or {}).items():
        if Path(name).expanduser().exists() and user_files_digest(name) != digest:
            raise StaleArtifact(f"{path} was built from {name}, which has changed since; {rebuild_hint(path, meta)}")
    return meta


@contextmanager
def loading_artifact(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Check an input artifact, then turn any failure to load it into an error naming the folder."""
    path = Path(path)
    meta = check_intact(path)
    try:
        yield meta
    except ArtifactError:
        raise
    except Exception as error:  # whatever the loader raised (OSError, SafetensorError, JSONDecodeError, ...)
        raise DamagedArtifact(f"{path} could not be loaded ({type(error).__name__}: {str(error)[:300]}); "
                              f"{rebuild_hint(path, meta)}") from error


def load_dataset_artifact(path: str | os.PathLike):
    """A `datasets` artifact (or DatasetDict), checked and loaded; a clear error when damaged."""
    from datasets import load_from_disk

    with loading_artifact(path):
        return load_from_disk(str(path))


# ---- fingerprints ----

def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key not in IGNORED_KEYS:
                _flatten(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = value


def file_digest(path: str | os.PathLike) -> dict[str, Any]:
    """Size and CRC-32 of a file (cheap: ~1 GB/s), the way artifacts record their own files."""
    crc = 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return {"size": os.path.getsize(path), "crc32": f"{crc:08x}"}


def user_files_digest(path: str | os.PathLike) -> dict[str, Any]:
    """A user's data file or folder (prompts, pairs) by content: each file's size and CRC-32 (checksummed
    once per process while the file is unchanged: check_fresh asks again for every artifact built from it)."""
    path = Path(path).expanduser()
    if path.is_file():
        return _cached_digest(path)
    # a datasets folder: not the cache files that datasets itself writes there when the rows are mapped
    return {str(f.relative_to(path)): _cached_digest(f) for f in sorted(path.rglob("*"))
            if f.is_file() and not f.name.startswith("cache-")}


_ABSENT = object()


def fingerprint(cfg, keys: Iterable[str], inputs: Iterable[str | os.PathLike] = (),
                user_files: Iterable[str | os.PathLike] = ()) -> dict[str, Any]:
    """What an artifact is made from: config keys (flattened), input artifacts' digests, user files."""
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
            raise FileNotFoundError(f"{path} is missing or incomplete; run the stage that builds it first")
        name = str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)
        recorded_inputs[name] = check_fresh(path, run_dir).get("digest")  # stale inputs stop here, transitively
    files = {}
    for path in user_files:
        if not Path(path).expanduser().exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        files[str(path)] = user_files_digest(path)
    wanted = {"config": config, "inputs": recorded_inputs, "user_files": files}
    aliases = {key: source for key in config if (source := _interpolated_from(cfg, key))}
    if aliases:  # not compared: it only lets a refusal name the key the user sets
        wanted["aliases"] = aliases
    return wanted


def omit_when_off(wanted: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """Drop the settings that are at their "off" value from a fingerprint (`off`: flattened key -> that
    value), so an artifact made before such a setting existed still matches while it stays off."""
    for key, value in off.items():
        if key in wanted["config"] and wanted["config"][key] == value:
            wanted["config"].pop(key)
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
    for section in ("config", "inputs", "user_files"):
        before, after = old.get(section) or {}, new.get(section) or {}
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                if section == "config":
                    name = f"{aliases[key]} (read as {key})" if key in aliases else key
                    lines.append(f"{name}: {before.get(key, '(not set)')!r} -> {after.get(key, '(not set)')!r}")
                else:
                    what = "input artifact" if section == "inputs" else "file"
                    change = "rebuilt or replaced" if key in before and key in after else (
                        "new" if key in after else "no longer read")
                    lines.append(f"{what} {key}: {change}")
    return lines


def should_skip(path: str | os.PathLike, overwrite: bool, what: str, wanted: dict[str, Any]) -> bool:
    """True when a complete, intact artifact made from `wanted` (a fingerprint) exists: reuse it.
    False when it must be built (absent, incomplete, or overwrite=true). A complete artifact made
    from anything else raises StaleArtifact, before any work."""
    path = Path(path)
    if is_complete(path) and not overwrite:
        meta = check_intact(path)
        recorded = meta.get("fingerprint") or {}
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


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("rsft", "torch", "transformers", "trl", "datasets", "peft"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def _sweep_stale(final: Path) -> None:
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _temporary_sibling(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(final)
    return final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _move_into_place(tmp: Path, final: Path) -> None:
    if final.exists():  # an incomplete leftover, or overwrite=true: move aside, then delete
        trash = final.parent / f".{final.name}.tmp-old-{uuid.uuid4().hex[:8]}"
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)


@contextmanager
def atomic_artifact(final: str | os.PathLike, meta: dict[str, Any],
                    wanted_fingerprint: dict[str, Any] | None = None) -> Iterator[Path]:
    """Yield a temporary folder to write the artifact into; on success write meta.json, rename.

    The caller may add entries to `meta` inside the block (counts, statistics); they are
    written with the config-independent fields (versions, timings) when the block ends, with
    `wanted_fingerprint` (the fingerprint should_skip compares), each file's size and CRC-32, and a digest
    of both that downstream fingerprints record. On an exception the temporary folder is removed
    and nothing at `final` changes.
    """
    final = Path(final)
    tmp = _temporary_sibling(final)
    tmp.mkdir()
    started = time.time()
    try:
        yield tmp
        full_meta = dict(meta)
        full_meta.setdefault("versions", library_versions())
        full_meta["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        full_meta["build_seconds"] = round(time.time() - started, 3)
        full_meta["fingerprint"] = wanted_fingerprint or {}
        full_meta["files"] = {str(f.relative_to(tmp)): file_digest(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
        full_meta["digest"] = hashlib.sha256(json.dumps([full_meta["fingerprint"], full_meta["files"]],
                                                        sort_keys=True, default=str).encode()).hexdigest()[:16]
        (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2, default=str))
        _move_into_place(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        _raise_if_disk_full(error, final)
        raise


def _raise_if_disk_full(error: BaseException, final: Path) -> None:
    """A full disk, whichever library was writing (OSError ENOSPC, or safetensors' SafetensorError that only
    quotes the OS message), becomes one line: the temporary folder is gone and `final` is as it was."""
    full = isinstance(error, OSError) and error.errno == errno.ENOSPC
    if full or "No space left on device" in str(error):
        raise ArtifactError(f"no space left on device while writing {final}; nothing was written (the temporary "
                            f"folder was removed); free space and rerun the same command") from error


def copy_artifact(source: str | os.PathLike, final: str | os.PathLike) -> None:
    """Copy a complete artifact to `final` the way atomic_artifact writes one: into a temporary
    sibling, then renamed into place, so a kill mid-copy leaves nothing that looks complete."""
    source, final = Path(source), Path(final)
    if not is_complete(source):
        raise FileNotFoundError(f"{source} is not a complete artifact (no {META_FILE}); cannot copy it")
    tmp = _temporary_sibling(final)
    try:
        shutil.copytree(source, tmp)
        _move_into_place(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        _raise_if_disk_full(error, final)
        raise


class ProgressFolder:
    """Where a stage keeps its progress while its artifact `final` is not written, so that a rerun of the
    same command resumes instead of starting again: entries of `.<name>.<kind>/` beside the artifact
    (kind: shards for sampling and scoring, checkpoints for training) whose names start with a key, a
    hash of the stage's fingerprint and the number of processes: progress made for anything else is
    deleted, never resumed. Not swept with the temporary folders; the stage calls remove() once the
    artifact is written."""

    def __init__(self, final: str | os.PathLike, kind: str, wanted: dict):
        final = Path(final)
        self.root = final.parent / f".{final.name}.{kind}"
        identity = json.dumps([wanted, distributed.world_size()], sort_keys=True, default=str)
        self.key = hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.folder = self.root / self.key  # for progress that is a folder of its own (a trainer's checkpoints)
        if distributed.is_main() and self.root.is_dir():
            for other in self.root.iterdir():
                if other.name.startswith(self.key):
                    continue
                if other.is_dir():
                    shutil.rmtree(other, ignore_errors=True)
                else:
                    other.unlink(missing_ok=True)
        distributed.barrier()  # no process reads progress that is about to be deleted

    def remove(self) -> None:
        """The artifact is written: its progress goes, once every process is done with its own."""
        distributed.barrier()
        if distributed.is_main():
            shutil.rmtree(self.root, ignore_errors=True)


class ShardStore(ProgressFolder):
    """The finished shards of a stage that has not finished (sampling, scoring): it works a shard at a time
    and saves each finished shard's result as JSON (written to a temporary name and renamed), so a rerun
    loads them and does only the rest."""

    def __init__(self, final: str | os.PathLike, wanted: dict):
        super().__init__(final, "shards", wanted)

    def _file(self, index: int) -> Path:
        return self.root / f"{self.key}-rank{distributed.rank()}-{index:05d}.json"

    def load(self, index: int) -> Any | None:
        """Shard `index`'s saved result, or None when it was not finished (absent, or cut short)."""
        try:
            return json.loads(self._file(index).read_text())
        except (OSError, ValueError):
            return None

    def save(self, index: int, payload: Any) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        final = self._file(index)
        tmp = final.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, final)


@contextmanager
def run_lock(run_dir: str | os.PathLike, command: str = "") -> Iterator[None]:
    """Hold the run directory exclusively for the length of one command.

    An flock on runs/<run_name>/.lock, which also holds the holder's pid, host, start time and
    command for the error message. The kernel releases an flock when its process dies (kill -9
    included), so a lock left by a dead process is simply taken over; one held by a live process
    is a RunDirectoryBusy error. On a shared runs root this relies on the file system supporting
    flock across machines (NFSv4 and Lustre/GPFS with flock enabled do; NFSv3 without lockd does
    not, and there two machines could both take it).
    """
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunDirectoryBusy(f"run directory {run_dir} is in use by {holder}; wait for it to finish, or use "
                                   f"another run_name=...") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on host {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}"
                     + (f" ({command})" if command else ""))
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)
