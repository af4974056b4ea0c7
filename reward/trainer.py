"""Training the reward model: TRL's RewardTrainer with what it lacks added, and nothing else.

TRL's RewardTrainer (trl 1.16) supplies the Trainer plumbing (optimizer, schedule, accumulation,
logging, metrics averaging), its preference collator and the already-tokenised dataset path
(`chosen_ids` / `rejected_ids`). What is added here, and why:

- soft labels: `label_prob` rides through TRL's collator (`PreferenceCollator`) and `compute_loss`
  uses reward.loss.bradley_terry_loss; TRL's loss is hard-label only.
- truncation instead of dropping: TRL tokenises by itself and then filters out every pair over
  max_length, and its tokeniser appends `eos_token`, which BERT-style tokenizers do not have. So
  we hand it pairs already tokenised by reward.encoding (left-truncated prompts, counted) and set
  its max_length to None, which turns its filter off.
- the reward read from the attention mask (reward.backbone.reward_forward) rather than the model's
  own pad-id search, which misreads when pad == eos.
- device-chosen precision: RewardConfig defaults to bf16=True and gradient checkpointing, which on
  a CPU without native bf16 made a MiniLM step ~30x slower. Here fp32 and no checkpointing on CPU,
  bf16 on CUDA devices that support it. Metrics go to our Tracker (report_to="none"), and nothing
  is saved by the Trainer (the stage saves atomically).
"""

from __future__ import annotations

import logging

import torch
from omegaconf import DictConfig
from transformers import TrainerCallback
from trl import RewardConfig, RewardTrainer
from trl.trainer.reward_trainer import DataCollatorForPreference

from reward.formats import LABEL_COLUMN
from reward.loss import bradley_terry_loss
from reward.backbone import reward_forward

log = logging.getLogger(__name__)


class PreferenceCollator(DataCollatorForPreference):
    """TRL's collator (chosen rows, then rejected rows, right-padded) plus `label_prob` [pairs]."""

    def torch_call(self, examples):
        batch = super().torch_call(examples)
        batch[LABEL_COLUMN] = torch.tensor([e[LABEL_COLUMN] for e in examples], dtype=torch.float32)
        return batch


class SoftLabelRewardTrainer(RewardTrainer):
    """RewardTrainer whose loss takes soft labels and reads rewards by attention mask."""

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", LABEL_COLUMN]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        rewards = reward_forward(model, inputs["input_ids"], inputs["attention_mask"])  # [2 * pairs]
        r_chosen, r_rejected = rewards.chunk(2)  # [pairs] each
        label_prob = inputs[LABEL_COLUMN]  # [pairs]
        loss = bradley_terry_loss(r_chosen, r_rejected, label_prob)
        if self.args.center_rewards_coefficient is not None:
            loss = loss + self.args.center_rewards_coefficient * torch.mean((r_chosen + r_rejected) ** 2)
        with torch.no_grad():
            agrees = (r_chosen > r_rejected) == (label_prob > 0.5)
            self._metrics[mode]["accuracy"].append(agrees.float().mean().item())
            self._metrics[mode]["margin"].append((r_chosen - r_rejected).mean().item())
            self._metrics[mode]["mean_reward"].append(rewards.mean().item())
        return (loss, {"rewards": rewards}) if return_outputs else loss


class TrackerCallback(TrainerCallback):
    """Forward the Trainer's logs (loss, lr, accuracy, margin) to our Tracker as reward/train/*."""

    def __init__(self, tracker):
        self.tracker = tracker

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.tracker.log({f"reward/train/{k}": v for k, v in logs.items()}, step=state.global_step)


def training_args(cfg: DictConfig, shared: dict, output_dir: str) -> RewardConfig:
    """RewardConfig from `reward` config fields and `shared`, the TrainingArguments every rsft trainer sets alike
    (precision, batch, schedule and checkpointing chosen from the device: rsft.trl_common.training_arguments)."""
    return RewardConfig(
        output_dir=output_dir,
        **shared,
        seed=cfg.seed,
        data_seed=cfg.seed,
        center_rewards_coefficient=cfg.get("center_rewards_coefficient"),
        max_length=None,  # our pairs are already truncated to reward.max_length; None disables TRL's filter
        eval_strategy="no",
        disable_tqdm=not bool(cfg.get("progress", True)),
    )


def train_reward_model(model, tokenizer, train_pairs, cfg: DictConfig, shared: dict, output_dir: str,
                       tracker=None, checkpoints=None) -> dict:
    """Train `model` in place on tokenised pairs (reward.encoding.tokenize_preferences); return train metrics.
    shared: the TrainingArguments every rsft trainer sets alike (training_args says which).
    checkpoints: the rsft.checkpoints.TrainingCheckpoints at output_dir to resume from and save verified
    checkpoints into (None: output_dir is scratch)."""
    args = training_args(cfg, shared, output_dir)
    trainer = SoftLabelRewardTrainer(
        model=model, args=args, train_dataset=train_pairs, processing_class=tokenizer,
        data_collator=PreferenceCollator(pad_token_id=tokenizer.pad_token_id),
        callbacks=[TrackerCallback(tracker)] if tracker is not None else None,
    )
    log.info("training reward model: %d pairs, %s epochs, batch %d x %d, lr %g, %s on %s", len(train_pairs),
             cfg.epochs, cfg.batch_size, cfg.grad_accum, cfg.learning_rate,
             "bf16" if args.bf16 else "fp32", "the CPU" if args.use_cpu else "the accelerator")
    result = trainer.train() if checkpoints is None else checkpoints.train(trainer)
    model.eval()
    return dict(result.metrics)
