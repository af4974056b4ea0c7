"""The run directory: the only module that knows its layout, and how artifacts are written.

    runs/<run_name>/
      prefs/ reward/ draft/                      pairwise labels, reward model, distilled draft
      eval_initial/                              the initial policy's evaluation (the baseline)
      round_00/samples/ scored/ selected/ pairs/ policy/ draft/ eval/
      plots/ summary.md logs/ wandb/

An artifact is a folder (a `datasets.save_to_disk` folder or a `save_pretrained` folder). It is
built under a temporary sibling name, `meta.json` is written into it last, and then it is renamed
into place in one `os.replace`. So a folder at an artifact's name without `meta.json` cannot be the
result of a finished write: it is incomplete, never read, and rebuilt. A kill at any point leaves
either the old state or the complete new artifact; stale temporary folders are swept on the next
write. A complete artifact makes its stage skip unless `overwrite=true`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

META_FILE = "meta.json"


class RunPaths:
    """Where every artifact of one run lives."""

    def __init__(self, run_dir: str | os.PathLike):
        self.root = Path(run_dir)

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

    def policy(self, round_idx: int) -> Path:
        """The policy trained in round r (sampled from in round r + 1)."""
        return self.round_dir(round_idx) / "policy"

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


def is_complete(path: str | os.PathLike) -> bool:
    """An artifact exists only once its meta.json does (it is written last)."""
    return (Path(path) / META_FILE).is_file()


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete artifact (no {META_FILE}); run the stage that builds it")
    return json.loads((path / META_FILE).read_text())


def should_skip(path: str | os.PathLike, overwrite: bool, what: str) -> bool:
    """True when a complete artifact exists and overwrite is off (the stage then does nothing)."""
    if is_complete(path) and not overwrite:
        log.info("%s: complete artifact at %s, skipping (overwrite=true rebuilds it)", what, path)
        return True
    if Path(path).exists() and not is_complete(path):
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


@contextmanager
def atomic_artifact(final: str | os.PathLike, meta: dict[str, Any]) -> Iterator[Path]:
    """Yield a temporary folder to write the artifact into; on success write meta.json, rename.

    The caller may add entries to `meta` inside the block (counts, statistics); they are
    written with the config-independent fields (versions, timings) when the block ends. On an
    exception the temporary folder is removed and nothing at `final` changes.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(final)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    started = time.time()
    try:
        yield tmp
        full_meta = dict(meta)
        full_meta.setdefault("versions", library_versions())
        full_meta["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        full_meta["build_seconds"] = round(time.time() - started, 3)
        (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2, default=str))
        if final.exists():  # an incomplete leftover, or overwrite=true: move aside, then delete
            trash = final.parent / f".{final.name}.tmp-old-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
