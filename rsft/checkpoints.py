"""Resume progress of a training stage: the checkpoints a trainer (TRL's, through rsft.trl_common.VerifiedSaves)
or a hand-written loop (a draft's) writes beside its artifact, counted only when complete and verified.

It imports no transformers, so the runner, which hands each training stage its checkpoint folder, does not load
it for a stage that trains nothing.
"""

from __future__ import annotations

import functools
import json
import random
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from reward.digests import file_digest
from rsft import distributed
from rsft.store import ProgressFolder, raise_if_write_failed

log = logging.getLogger(__name__)

PREFIX = "checkpoint"  # a checkpoint's folder is <PREFIX>-<step>: transformers' PREFIX_CHECKPOINT_DIR (a test says so)
MANIFEST = "rsft-checkpoint.json"  # written last into a checkpoint: its files' sizes and CRC-32s
LOSSES = "rsft-losses.json"  # every training_step's loss up to the checkpoint (TrainingCheckpoints.train)


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be trusted (no manifest: its save never finished; a file missing, of another
    size or another CRC-32: damaged), or None when every file it recorded verifies."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"it has no readable {MANIFEST} (its save did not finish: a kill or a full disk)"
    if not isinstance(files, dict) or not files or not all(
            isinstance(r, dict) and {"size", "crc32"} <= set(r) for r in files.values()):
        return f"its {MANIFEST} is damaged (expected each file's size and CRC-32)"
    for name, record in files.items():
        file = checkpoint / name
        if not file.is_file():
            return f"{name} is missing"
        digest = file_digest(file)
        if digest != {"size": record["size"], "crc32": record["crc32"]}:
            return f"{name} has {digest['size']} bytes, CRC-32 {digest['crc32']}; recorded {record['size']} bytes, " \
                   f"CRC-32 {record['crc32']}"
    return None


_STEP = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also takes '²', which int() refuses


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("-", 1)[1])


def _restore_on_indexed_cpu(storage, location: str):
    """A storage loaded with map_location "cpu:N": torch's own handler knows only "cpu" (None: not ours)."""
    return storage.cpu() if re.fullmatch(r"cpu:\d+", location) else None


@functools.cache  # once: register_package appends to torch's registry each time it is called
def restorable_to_indexed_cpu() -> None:
    """Let torch.load restore storages to an indexed CPU device ("cpu:0"), which it refuses by default.

    transformers before 5.24 loads a resumed optimizer's state with map_location=args.device whenever the world
    has several processes, and in a CPU world on a machine with a GPU that device is "cpu:N": the resume then
    failed with "don't know how to restore data location ... (tagged with cpu:0)" (seen on an H200 with
    transformers 5.17, which pyproject admits). torch's registry of locations (torch.serialization.register_package)
    takes one more handler for that spelling; its tagger tags nothing, so saving is unchanged. Idempotent."""
    torch.serialization.register_package(30, lambda storage: None, _restore_on_indexed_cpu)


class TrainingCheckpoints(ProgressFolder):
    """The checkpoints of a training stage (reward, refresh, SFT, DPO) that has not finished, beside its artifact.

    A run that trains for hours and is killed would otherwise start again from its first step: the
    artifact is written once, at the end. So the TRL trainer writes its checkpoints (the weights, or the
    LoRA adapter, with the optimizer, scheduler and RNG states: transformers' Trainer format) every
    `<group>.checkpoint_steps` steps into this folder (rsft.store.ProgressFolder: keyed by the stage's
    fingerprint); a rerun of the same command resumes from the last one (`train`), so it redoes at most
    one checkpoint interval. How close a resumed run comes to an uninterrupted one: docs/run-directory.md.

    A checkpoint counts only when it is complete and verifies, as artifacts do: transformers writes a
    checkpoint's files one by one into its folder, so a kill or a full disk mid-save leaves a folder that
    looks like a checkpoint and is not (transformers' own get_last_checkpoint goes by the folder name and
    then stops on the missing trainer_state.json). Here the main process writes a manifest (each file's
    size and CRC-32) once every process has saved, and deletes the older checkpoint only after that;
    resume takes the newest checkpoint whose files verify, deletes the others with a message, and trains
    from the first step, saying so, when none does.
    """

    def __init__(self, final: str | Path, wanted: dict, one_process: bool = False):
        super().__init__(final, "checkpoints", wanted, one_process)
        self.losses: list[float] = []  # every training_step's loss so far, saved with each checkpoint

    def saved(self, step: int) -> None:
        """The trainer saved checkpoint `step` (every process its share: a barrier): the main process writes the
        losses so far and the manifest, atomically, and only then deletes the checkpoints before it."""
        distributed.barrier()
        if distributed.is_main():
            checkpoint = self.folder / f"{PREFIX}-{step}"
            (checkpoint / LOSSES).write_text(json.dumps(self.losses))
            write_manifest(checkpoint, step)
            for older in self.folder.glob(f"{PREFIX}-*"):
                if older != checkpoint and older.is_dir():
                    shutil.rmtree(older, ignore_errors=True)
        distributed.barrier()

    def _checkpoints(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return [c for c in self.folder.glob(f"{PREFIX}-*")
                if c.is_dir() and _STEP.fullmatch(c.name.rsplit("-", 1)[1])]

    def resume_from(self) -> str | None:
        """The newest checkpoint that verifies, or None (train from the first step); the ones that do not
        verify are deleted (by the main process, every process waits) with a message saying why."""
        if distributed.is_main() and self.folder.is_dir():
            found = sorted(self._checkpoints(), key=_step, reverse=True)
            trusted = None
            for checkpoint in found:
                problem = None if trusted is not None else checkpoint_problem(checkpoint)
                if trusted is None and problem is None:
                    trusted = checkpoint
                    continue
                if problem is not None:
                    log.warning("passing over the training checkpoint %s: %s; deleting it", checkpoint, problem)
                shutil.rmtree(checkpoint, ignore_errors=True)
            if found and trusted is None:
                log.warning("no complete training checkpoint in %s: training from the first step", self.folder)
        self.barrier()
        last = max(self._checkpoints(), key=_step, default=None)
        if last is not None:
            log.info("resuming training from %s (step %d)", last, _step(last))
        return str(last) if last is not None else None

    def train(self, trainer):
        """`trainer.train()`, resumed from the newest verified checkpoint, each new checkpoint verified; a full
        disk while it saves is one line (the last good checkpoint is kept: rerun with room to resume).

        The result's training loss is the mean over every step, the ones before a resume included: the
        Trainer's own averages only the steps this process ran, so a resumed reward model would record
        another train_loss than an uninterrupted one. Each training_step's loss is kept and saved with
        every checkpoint (rsft-losses.json), and the mean is taken over all of them."""
        from rsft.trl_common import VerifiedSaves  # transformers is loaded where a trainer is

        trainer.add_callback(VerifiedSaves(self.saved))
        resume = self.resume_from()
        losses = self.losses
        losses.clear()
        exact = True
        if resume is not None:
            restorable_to_indexed_cpu()
            try:
                losses.extend(float(v) for v in json.loads((Path(resume) / LOSSES).read_text()))
            except (OSError, ValueError, TypeError):
                exact = False  # a checkpoint from before rsft kept its losses: the Trainer's partial mean stays
        real_step = trainer.training_step

        def kept_step(*args, **kwargs):
            loss = real_step(*args, **kwargs)
            losses.append(float(loss))
            return loss

        trainer.training_step = kept_step
        try:
            result = trainer.train(resume_from_checkpoint=resume)
        except Exception as error:
            raise_if_write_failed(error, self.folder, during="checkpoint")
            raise
        finally:
            trainer.training_step = real_step
        if resume is not None and exact and result.global_step:
            mean = sum(losses) / result.global_step  # as the Trainer divides: micro-batch losses over steps
            result = result._replace(training_loss=mean, metrics={**result.metrics, "train_loss": mean,
                                                                   "train_loss_over_every_step": True})
        return result


def write_manifest(checkpoint: Path, step: int) -> None:
    """The manifest, written last (to a temporary name, then renamed): from then on `checkpoint` counts."""
    files = {str(f.relative_to(checkpoint)): file_digest(f) for f in sorted(checkpoint.rglob("*"))
             if f.is_file() and f.name != MANIFEST and not f.name.startswith(f".{MANIFEST}")}
    tmp = checkpoint / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"step": step, "files": files}))
    os.replace(tmp, checkpoint / MANIFEST)


class LoopCheckpoints(TrainingCheckpoints):
    """The checkpoints of a training loop rsft writes by hand (the distilled and the feature draft: a draft
    trains on the policy's own logits or features, which no TRL trainer does), kept by the one process that
    trains: the model, optimizer and scheduler states, the RNG states and the position in the epoch, in one
    torch.save file per checkpoint, verified like a trainer's (a manifest written last), so that a rerun
    resumes where the last complete checkpoint left off and ends as an uninterrupted run ends."""

    STATE = "state.pt"

    def __init__(self, final: str | Path, wanted: dict):
        super().__init__(final, wanted, one_process=True)

    def save(self, step: int, state: dict) -> None:
        """Write checkpoint `step` (into a temporary folder, renamed when complete), then drop the older ones."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"{PREFIX}-{step}"
        tmp = self.folder / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            torch.save(state, tmp / self.STATE)
            write_manifest(tmp, step)
            os.replace(tmp, final)
        except Exception as error:
            shutil.rmtree(tmp, ignore_errors=True)
            raise_if_write_failed(error, self.folder, during="checkpoint")
            raise
        for older in self._checkpoints():
            if older != final:
                shutil.rmtree(older, ignore_errors=True)

    def load(self) -> dict | None:
        """The newest verified checkpoint's state, or None (train from the first step)."""
        for stale in self.folder.glob(f".{PREFIX}-*.tmp-*") if self.folder.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)  # a save cut short
        last = self.resume_from()
        return None if last is None else torch.load(Path(last) / self.STATE, weights_only=False)


# the RNG states a hand-written loop's checkpoint holds (stage=online), so that a resumed run draws what an
# uninterrupted one draws
def rng_states() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def seed_everything(seed: int) -> None:
    """A fresh run starts from RNG states of its seed alone, whatever ran before it in the process."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
