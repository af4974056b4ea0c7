"""Training a policy with a TRL trainer, the service below stage=sft and stage=dpo: LoRA settings, the trained model (LoRA merged), writing it as an artifact, and the losses the trainer logged; and the tokenised examples (loss on the completion only) that stage=sft trains cut answers on and stage=online every answer on."""

from __future__ import annotations

import logging

from datasets import Dataset
from omegaconf import DictConfig
from transformers import TrainerCallback

from rsft import distributed
from rsft.data import chat_messages
from rsft.errors import InputError

log = logging.getLogger(__name__)


def lora_config(section: DictConfig):
    """peft's LoraConfig from a training section's `lora` settings (sft.lora, dpo.lora)."""
    from peft import LoraConfig

    lora = section.lora
    modules = lora.target_modules
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=modules if isinstance(modules, str) else list(modules), task_type="CAUSAL_LM")


def trained_policy(trainer, mode: str):
    """(the model to save, its state dict or None) after a TRL trainer ran (SFT and DPO): LoRA merged into
    the weights; under several processes every one takes part in gathering the state dict (FSDP shards)."""
    trained, state_dict = trainer.accelerator.unwrap_model(trainer.model), None
    if mode == "lora":
        trained = trained.merge_and_unload()
    elif distributed.world_size() > 1:
        state_dict = trainer.accelerator.get_state_dict(trainer.model)
    trained.eval()
    return trained, state_dict


def policy_writer(trained, state_dict, tokenizer):
    """What writes a trained policy and its tokenizer into an artifact's folder (the runner calls it on the
    main process: every process trained the same (DDP) model)."""
    def write(folder):
        trained.save_pretrained(folder, state_dict=state_dict)
        tokenizer.save_pretrained(folder)

    return write


class LossHistory(TrainerCallback):
    """The trainer's logged losses (TRL reports to nobody; we report to our Tracker), taken from the
    trainer's own log when training ends. A run resumed from a checkpoint restores that log with the
    checkpoint, so the steps before the kill are in it too: a policy whose save failed (a full disk)
    resumes from the checkpoint of its last step and trains no step at all, and still records its losses."""

    def __init__(self):
        self.history: list[dict] = []
        self.steps_run = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps_run += 1

    def on_train_end(self, args, state, control, **kwargs):
        self.history = [{"step": int(logs.get("step", 0)),
                         **{k: v for k, v in logs.items() if isinstance(v, (int, float)) and k != "step"}}
                        for logs in state.log_history if logs]

    def train_loss(self, result) -> float:
        """The mean training loss over every step. Trainer's `training_loss` averages the steps this process
        ran, so after a resume it is the mean of the logged step losses instead (each the mean of
        logging_steps steps)."""
        losses = [h["loss"] for h in self.history if "loss" in h]
        if result.metrics.get("train_loss_over_every_step") or self.steps_run >= int(result.global_step) or not losses:
            return float(result.training_loss)
        return float(sum(losses) / len(losses))


def cut_examples(selected: Dataset, tokenizer, system_prompt: str | None) -> Dataset:
    """Pre-tokenised examples (input_ids, completion_mask) for a selected set with truncated completions
    (finish_reason "length", kept by select.drop_truncated=false). A cut answer is rendered with the
    chat template and the text after its last character (the end-of-turn token and what follows) is
    left out, so the loss teaches its tokens and never a stop there. TRL's SFTTrainer always renders
    the whole conversation, end of turn included, so this is done by hand; complete rows are rendered
    as TRL renders them (prompt + completion through the chat template, the loss where the tokenised
    prompt ends)."""
    rows = []
    for prompt, completion, reason in zip(selected["prompt"], selected["completion"], selected["finish_reason"]):
        messages = chat_messages(prompt, system_prompt)
        prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        text = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": completion}],
                                             tokenize=False)
        if reason == "length":
            answer = completion.rstrip()
            end = text.rfind(answer)
            if not answer or end < 0:
                raise InputError(f"sft: the policy's chat template does not show the truncated completion {answer[:60]!r} "
                                 f"verbatim, so its end of turn cannot be left out; set select.drop_truncated=true")
            text = text[:end + len(answer)]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        start = next((i for i, (a, b) in enumerate(zip(prompt_ids, ids)) if a != b), min(len(prompt_ids), len(ids)))
        rows.append({"input_ids": ids, "completion_mask": [0] * start + [1] * (len(ids) - start)})
    return Dataset.from_list(rows)
