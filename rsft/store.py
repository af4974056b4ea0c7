"""Artifacts on disk: how one is written (atomically, meta.json last), told complete, checked for damage and loaded, and the progress a stage keeps beside it to resume from (shards, checkpoints).

An artifact is a folder (a `datasets.save_to_disk` folder or a `save_pretrained` folder). It is built
under a temporary sibling name, `meta.json` is written into it last, and then it is renamed into place
in one `os.replace`. So a folder at an artifact's name without `meta.json` cannot be the result of a
finished write: it is incomplete, never read, and rebuilt. A kill at any point leaves either the old
state or the complete new artifact; stale temporary folders are swept on the next write. A reused or
loaded artifact whose files are missing, have another size or another CRC-32 is damaged
(DamagedArtifact): the error names the folder and the command that rebuilds it. Each file is
checksummed once per process. Where artifacts live is rsft.paths; what made one, rsft.fingerprints."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from rsft import distributed, interrupts
from reward.digests import checksum, file_digest, user_files_digest
from rsft.errors import (
    ArtifactError,
    DamagedArtifact,
    MissingInput,
    StaleArtifact,
)
from rsft.machine import machine, same_machine, warn_if_other_machine

log = logging.getLogger(__name__)


META_FILE = "meta.json"


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
        raise MissingInput(f"{path} is not a complete artifact (no {META_FILE}); run the stage that builds it")
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DamagedArtifact(f"{path / META_FILE} cannot be read ({error}); {rebuild_hint(path)}") from None
    if not isinstance(meta, dict):
        raise DamagedArtifact(f"{path / META_FILE} is not a JSON object; {rebuild_hint(path)}")
    return meta


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
        if "crc32" in record and checksum(file) != record["crc32"]:
            raise DamagedArtifact(f"{path} is damaged: {name} has other content than when it was written (CRC-32 "
                                  f"{checksum(file)}, {META_FILE} recorded {record['crc32']}); "
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


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("rsft", "torch", "transformers", "trl", "datasets", "peft", "accelerate", "huggingface_hub"):
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
    `wanted_fingerprint` (the fingerprint rsft.fingerprints.check_reuse compares), each file's size and CRC-32, and a digest
    of both by content (content_digest) that downstream fingerprints record. On an exception the temporary folder is removed
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
        full_meta.setdefault("machine", machine())
        full_meta["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        full_meta.setdefault("build_seconds", round(time.time() - started, 3))  # the runner's: the whole build
        full_meta["fingerprint"] = wanted_fingerprint or {}
        full_meta["files"] = {str(f.relative_to(tmp)): file_digest(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
        full_meta["digest"] = content_digest(tmp, full_meta["fingerprint"], full_meta["files"])
        (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2, default=str))
        _move_into_place(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise_if_write_failed(error, final)
        raise


# files whose bytes differ between two builds of the same artifact, byte-identical in every row and weight
DATASETS_STATE = "state.json"            # datasets.save_to_disk: its "_fingerprint" is random on every save
DATASETS_CACHE_PREFIX = "cache-"         # datasets' cache files, named by that random fingerprint
MEASUREMENTS = "metrics.json"            # a stage's report of what it measured: wall-clock times among them


def content_digest(folder: str | os.PathLike, fingerprint: dict[str, Any], files: dict[str, dict]) -> str:
    """The artifact's digest, which every artifact built from it records (rsft.fingerprints): what made it
    and what it holds, so that an artifact rebuilt with the same content has the same digest and what was
    built from it is reused (delete round 0 and rerun: round 1 is not stale). Its files enter by size and
    CRC-32 (`files`, as meta.json records them), less what differs between two identical builds:

    - a datasets folder's state.json (at any depth: a DatasetDict's splits) enters without `_fingerprint`,
      a random id on every save_to_disk; its other fields (the data files, the format) stay;
    - datasets' cache-*.arrow files are left out (named by that id, not part of what was saved);
    - the top-level metrics.json is left out: the stage's measurements of its build (seconds, tokens per
      second next to the accuracies), which no stage reads as an input; what they measure is in the other
      files. It is still checked for damage like every file (check_intact).

    Weights, rows, tokenizer and config files are compared byte for byte. A digest recorded before this
    rule (the state.json's bytes included) stays what it was: digests are read from meta.json, never
    recomputed, so a finished run is reused as it was; only a rebuilt artifact gets a digest of this kind."""
    folder = Path(folder)
    content = {}
    for name, record in files.items():
        path = Path(name)
        if name == MEASUREMENTS or path.name.startswith(DATASETS_CACHE_PREFIX):
            continue
        if path.name == DATASETS_STATE:
            state = _datasets_state(folder / name)
            if state is not None:
                record = {"datasets_state": state}
        content[name] = record
    return hashlib.sha256(json.dumps([fingerprint, content], sort_keys=True, default=str).encode()).hexdigest()[:16]


def _datasets_state(file: Path) -> dict | None:
    """A datasets state.json without its random `_fingerprint`; None for a file of that name that is not one."""
    try:
        state = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(state, dict) or "_fingerprint" not in state or "_data_files" not in state:
        return None
    return {key: value for key, value in state.items() if key != "_fingerprint"}


def write_failed(error: BaseException) -> bool:
    """Whether `error` (or what it was raised from) is a write that failed for want of room: OSError ENOSPC,
    a library that only quotes the OS message (safetensors' SafetensorError), or torch.save's stream writer,
    which on a full disk says only `[enforce fail at inline_container.cc] unexpected pos ...`."""
    for link in _chain(error):
        text = str(link)
        torch_writer = "inline_container.cc" in text and ("unexpected pos" in text or "write" in text)
        if (isinstance(link, OSError) and link.errno == errno.ENOSPC) or "No space left on device" in text \
                or torch_writer or "PytorchStreamWriter failed" in text:
            return True
    return False


def _chain(error: BaseException | None):
    """`error` and what it was raised from or during, each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _refused_write(error: BaseException) -> OSError | None:
    """The OSError in `error`'s chain that says the file system refused a write (read-only, no permission)."""
    return next((link for link in _chain(error)
                 if isinstance(link, OSError) and link.errno in (errno.EROFS, errno.EACCES, errno.EPERM)), None)


def _free(path: Path) -> str:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.0f} MB free there now"
    except OSError:
        return "free space unknown"


def raise_if_write_failed(error: BaseException, final: Path, during: str = "artifact") -> None:
    """A full disk, whichever library was writing, becomes one line naming what was being written and what is
    left. during="artifact": nothing (its temporary folder is gone, `final` is as it was); "checkpoint": the
    last complete training checkpoint (rsft.checkpoints.TrainingCheckpoints), which the rerun resumes from;
    "build": the stage's resume progress (finished shards, complete checkpoints) is kept."""
    refused = _refused_write(error)
    if refused is not None:
        raise ArtifactError(f"cannot write {refused.filename or final} ({refused.strerror or refused}) while "
                            f"{'saving a training checkpoint in' if during == 'checkpoint' else 'building'} {final}; "
                            f"what was complete is kept: make it writable and rerun the same command") from error
    if not write_failed(error):
        return
    cause = f"{type(error).__name__}: {str(error).strip()[:160]}; {_free(final)}"
    if during == "checkpoint":
        raise ArtifactError(f"no space left on device while saving a training checkpoint in {final} ({cause}); the "
                            f"checkpoint is not trusted and the last complete one is kept: free space and rerun the "
                            f"same command to resume") from error
    if during == "build":
        raise ArtifactError(f"no space left on device while building {final} ({cause}); what was finished is kept "
                            f"(shards, complete checkpoints): free space and rerun the same command to resume") \
            from error
    raise ArtifactError(f"no space left on device while writing {final}; nothing was written (the temporary "
                        f"folder was removed; {cause}); free space and rerun the same command") from error


def copy_artifact(source: str | os.PathLike, final: str | os.PathLike) -> None:
    """Copy a complete artifact to `final` the way atomic_artifact writes one: into a temporary
    sibling, then renamed into place, so a kill mid-copy leaves nothing that looks complete."""
    source, final = Path(source), Path(final)
    if not is_complete(source):
        raise MissingInput(f"{source} is not a complete artifact (no {META_FILE}); cannot copy it: run the stage "
                           f"that builds it first")
    tmp = _temporary_sibling(final)
    try:
        shutil.copytree(source, tmp)
        _move_into_place(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise_if_write_failed(error, final)
        raise


class ProgressFolder:
    """Where a stage keeps its progress while its artifact `final` is not written, so that a rerun of the
    same command resumes instead of starting again: entries of `.<name>.<kind>/` beside the artifact
    (kind: shards for sampling and scoring, checkpoints for training) whose names start with a key, a
    hash of the stage's fingerprint and the number of processes: progress made for anything else is
    deleted, never resumed. Not swept with the temporary folders; rsft.runner calls remove() once the
    artifact is written."""

    def __init__(self, final: str | os.PathLike, kind: str, wanted: dict, one_process: bool = False):
        final = Path(final)
        self.one_process = one_process  # kept by the main process alone (a one-process build): no barriers
        self.root = final.parent / f".{final.name}.{kind}"
        identity = json.dumps([wanted, distributed.world_size()], sort_keys=True, default=str)
        self.key = hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.folder = self.root / self.key  # for progress that is a folder of its own (a trainer's checkpoints)
        if distributed.is_main():  # rsft's own hidden names: anything else found there is debris
            for junk in (self.root, self.folder):
                if junk.exists() and not junk.is_dir():
                    log.warning("%s is not a folder (debris where rsft keeps resume progress); deleting it", junk)
                    junk.unlink()
        if distributed.is_main() and self.root.is_dir():
            for other in self.root.iterdir():
                if other.name.startswith(self.key):
                    continue
                if other.is_dir():
                    shutil.rmtree(other, ignore_errors=True)
                else:
                    other.unlink(missing_ok=True)
        self.barrier()  # no process reads progress that is about to be deleted
        self._record_machine()

    def barrier(self) -> None:
        if not self.one_process:
            distributed.barrier()

    def _record_machine(self) -> None:
        """The machines that made this progress, in `<key>-machine-rank<r>.json` beside it: resuming progress
        made on another machine is allowed (the fingerprint is the same) but warned about, naming both, and the
        artifact records the other machines (`progress_machines`, rsft.runner), so the mix stays on record."""
        record = self.root / f"{self.key}-machine-rank{distributed.rank()}.json"
        try:
            found = json.loads(record.read_text())
        except (OSError, ValueError):
            found = []
        found = found if isinstance(found, list) else [found]  # one machine per file before this, or debris
        here = json.loads(json.dumps(machine()))
        self.machines = [m for m in found if isinstance(m, dict)]
        for theirs in self.machines:
            warn_if_other_machine("resume progress", self.root, theirs)
        if here not in self.machines:
            self.machines.append(here)
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = record.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(self.machines))
            os.replace(tmp, record)

    def other_machines(self) -> list[dict]:
        """The machines other than this one that made part of this progress."""
        return [m for m in self.machines if not same_machine(m)]

    def remove(self) -> None:
        """The artifact is written: its progress goes, once every process is done with its own."""
        self.barrier()
        if distributed.is_main():
            shutil.rmtree(self.root, ignore_errors=True)


class ShardStore(ProgressFolder):
    """The finished shards of a stage that has not finished (sampling, scoring): it works a shard at a time
    and saves each finished shard's result as JSON (written to a temporary name and renamed), so a rerun
    loads them and does only the rest. The rows assembled from the shards are written into a folder of
    it (rows_folder), so that no process holds them all; they go with the progress once the artifact is written."""

    def __init__(self, final: str | os.PathLike, wanted: dict):
        super().__init__(final, "shards", wanted)

    def rows_folder(self, name: str) -> Path:
        """A folder of this progress that every process shares (the main process writes it)."""
        return self.root / f"{self.key}-{name}"

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
        interrupts.check()  # a safe point: the shard is kept, a signal a library swallowed stops the build here
