"""Training a policy, the service below stage=sft, stage=dpo and stage=online: LoRA settings, the trained model (LoRA
merged), writing it as an artifact, the losses a TRL trainer logged, and the tokenised examples (loss on the
completion only) that stage=sft trains cut answers on and stage=online every answer on; and online's policy in
memory (OnlinePolicy) with its one optimiser step of SFT, plus a DPO term (train_step).

The online step is written by hand: TRL's SFTTrainer trains on one fixed dataset, and online's data is new every
mini-batch while the optimiser's state must carry over. Its SFT loss is the one SFTTrainer takes (cross-entropy on
the completion tokens, the mean over the step's completion tokens) on the same examples (cut_examples), and its steps
walk them in the Trainer's order (trainer_batches). Its DPO term (dpo_loss_sum) is DPOTrainer's default loss: TRL 1.16
computes it only inside DPOTrainer.compute_loss, so it is written here and tested equal to it."""

from __future__ import annotations

import copy
import logging
import random
import statistics
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from datasets import Dataset
from omegaconf import DictConfig
from transformers import TrainerCallback

from rsft import distributed
from rsft.data import chat_messages
from rsft.errors import InputError

log = logging.getLogger(__name__)


def loss_temperature(cfg: DictConfig, section: str) -> float:
    """What a training step of `section` ("sft" or "online") divides the policy's logits by: sample.temperature with
    <section>.tempered_loss (the distribution the trained answers were drawn from), else sft.loss_temperature for
    the rounds' SFT and 1 online."""
    if cfg[section].get("tempered_loss", False):
        return cfg.sample.temperature
    return cfg.sft.get("loss_temperature", 1.0) if section == "sft" else 1.0


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


def forward_kl_sum(logits: torch.Tensor, reference_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sum over the positions `mask` keeps of KL(reference || policy) between the next-token distributions
    the two sets of logits give. The forward direction covers the reference's support: a token the reference
    could sample and the policy stops giving costs the most, which is what keeps a policy's range."""
    reference = torch.log_softmax(reference_logits.float(), dim=-1)
    policy = torch.log_softmax(logits.float(), dim=-1)
    return ((reference.exp() * (reference - policy)).sum(-1) * mask).sum()


def gem_token_losses(logits: torch.Tensor, targets: torch.Tensor, beta: float) -> torch.Tensor:
    """GEM's loss (Li et al., "Preserving Diversity in Supervised Fine-tuning of Large Language Models", ICLR 2025;
    its linear form) at each position: -log p(target) + sum_v q(v) log p(v), with p the policy's next-token
    distribution and q = softmax(logits / beta) held constant; 0 where `targets` is -100. Its gradient in the logits
    is q - onehot(target): the target goes up by 1 - q(target) and the tokens the policy itself would pick go down
    by their sharpened probability, where cross-entropy's p - onehot(target) pushes the whole tail down. Once the
    target is the policy's clear first choice, q(target) nears 1 and the push stops, so the policy is not
    sharpened further onto the kept answer and the other tokens keep their share. beta = 1 makes q = p, which
    is cross-entropy's gradient. Written here because TRL's SFTTrainer offers only nll and dft losses."""
    logits = logits.float()
    log_p = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        q = torch.softmax(logits / beta, dim=-1)
    mask = targets != -100
    target_log_p = log_p.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (-target_log_p + (q * log_p).sum(-1)) * mask


def lever_sft_trainer(trainer_class, kl: float, mode: str, weighted: bool, gem_beta: float | None = None,
                      temperature: float = 1.0):
    """TRL's SFTTrainer with the collapse levers in its loss: the cross-entropy on the completion tokens, each row's
    tokens times its `weight` column when `weighted` (select.weight), plus `kl` x the mean over those tokens of
    KL(reference || policy) (sft.kl), the reference being the policy training starts from: the adapter switched off
    with LoRA, a frozen copy otherwise. With `gem_beta` set (sft.loss=gem), GEM's loss (gem_token_losses) takes the
    cross-entropy's place, weighted alike. The sum is divided by the step's completion tokens, as TRL divides its
    own loss, so with every weight 1, kl 0, no gem_beta and temperature 1 it is SFTTrainer's loss. Every term reads
    the logits divided by `temperature` (sft.tempered_loss: sample.temperature; sft.loss_temperature: its own).
    Written by hand because SFTTrainer has neither a reference model nor a weight per example; as TRL 1.16
    advises for a custom loss, it overrides compute_loss, which needs the full logits (TRL's own loss reads fused
    log-probabilities) and leaves out TRL's per-step entropy and accuracy metrics. The weights reach the loss as a
    column TRL's collator does not know: kept through the Trainer's column filter, and batched beside TRL's
    collation. `kl_history` is each step's mean KL per completion token, for the stage's stats (empty when kl is
    0)."""

    class LeverSFTTrainer(trainer_class):
        def __init__(self, *args, **kwargs):
            frozen = None
            if kl and mode != "lora":  # copied before TRL wraps the model: its forward is patched to read the model's head
                frozen = copy.deepcopy(kwargs["model"]).eval().requires_grad_(False)
            super().__init__(*args, **kwargs)
            self.kl_history: list[float] = []
            self._frozen = frozen
            if weighted:
                collate = self.data_collator
                self.data_collator = lambda examples: {**collate(examples), "weight": torch.tensor(
                    [float(e["weight"]) for e in examples])}

        def _set_signature_columns_if_needed(self):
            super()._set_signature_columns_if_needed()
            if weighted and "weight" not in self._signature_columns:
                self._signature_columns = [*self._signature_columns, "weight"]

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            forward = {k: v for k, v in inputs.items() if k not in ("labels", "use_cache", "weight")}
            outputs = model(**forward, use_cache=False)
            logits, targets = tempered(outputs.logits[:, :-1], temperature), inputs["labels"][:, 1:]
            mask = (targets != -100).float()
            tokens = torch.as_tensor(num_items_in_batch if num_items_in_batch is not None else mask.sum()).clamp(min=1)
            if gem_beta is None:  # [rows, positions], 0 outside the completion
                nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=-100,
                                                        reduction="none")
            else:
                nll = gem_token_losses(logits, targets, gem_beta)
            if weighted:
                nll = nll * inputs["weight"].to(nll)[:, None]
            loss = nll.sum()
            if kl:
                with torch.no_grad():
                    if self._frozen is not None:
                        reference = self._frozen(**forward, use_cache=False).logits[:, :-1]
                    else:
                        with self.accelerator.unwrap_model(model).disable_adapter():
                            reference = model(**forward, use_cache=False).logits[:, :-1]
                    reference = tempered(reference, temperature)
                divergence = forward_kl_sum(logits, reference, mask)
                self.kl_history.append(float(divergence.detach()) / max(float(mask.sum()), 1.0))
                loss = loss + kl * divergence
            loss = loss / tokens.to(loss.device)
            # as SFTTrainer's own loss: num_items_in_batch counts every rank's tokens and DDP averages the gradients
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            return (loss, outputs) if return_outputs else loss

    return LeverSFTTrainer


class EarlyWeights(TrainerCallback):
    """WiSE-FT's earlier point (sft.merge_at): the trainable weights (LoRA's adapters, or every weight) as they stand
    after `at` x the run's steps (0: before the first step, the policy SFT starts from), copied once and kept on the
    CPU. The copy is also written beside the training checkpoints (`path`), before any later checkpoint, so a run
    resumed past that step reads it back instead of merging with the wrong weights."""

    def __init__(self, at: float, path):
        self.at, self.path = at, path
        self.step: int | None = None
        self.weights: dict[str, torch.Tensor] | None = None

    def _take(self, model) -> None:
        self.weights = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}
        if distributed.is_main():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            torch.save(self.weights, tmp)
            tmp.replace(self.path)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.step = 0 if self.at == 0 else max(1, round(self.at * state.max_steps))
        if self.weights is None and self.path.is_file():
            self.weights = torch.load(self.path, map_location="cpu", weights_only=True)
        elif self.weights is None and state.global_step == self.step:
            self._take(model)
        elif self.weights is None and state.global_step > self.step:
            raise RuntimeError(f"sft.merge_at: resumed at step {state.global_step}, past step {self.step} where the "
                               f"earlier weights were taken, and {self.path} is missing; delete the training "
                               f"checkpoints beside the policy to train again from the first step")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.weights is None and state.global_step == self.step:
            self._take(model)


def merge_with_early(model, early: dict[str, torch.Tensor], weight: float, mode: str) -> None:
    """WiSE-FT in place, before the trained policy is taken (trained_policy): every weight training changed becomes
    `weight` x its fine-tuned value + (1 - weight) x its value at the earlier point `early` (EarlyWeights). With LoRA
    the merged weight W0 + delta is linear in each layer's delta, not in its two factors, so each adapted layer's base
    weight takes (1 - weight) x (delta_early - delta_final) now and the final adapter is merged as usual. Written by
    hand: peft's add_weighted_adapter mixes adapters of one model, not two points of one training run, and TRL has no
    weight averaging."""
    params = dict(model.named_parameters())
    missing = sorted(set(early) - set(params))
    if missing:
        raise RuntimeError(f"sft.merge_at: the earlier weights name {missing[:3]}, which the trained model lacks")
    with torch.no_grad():
        if mode != "lora":
            for name, value in early.items():
                params[name].mul_(weight).add_(value.to(params[name]), alpha=1 - weight)
            return
        from peft.tuners.lora import LoraLayer

        layers = [m for m in model.modules() if isinstance(m, LoraLayer) and hasattr(m, "get_delta_weight")]
        final = {n: params[n].detach().clone() for n in early}

        def deltas():
            return [sum(m.get_delta_weight(a) for a in m.active_adapters) for m in layers]

        final_deltas = deltas()
        for name, value in early.items():
            params[name].copy_(value)
        early_deltas = deltas()
        for name, value in final.items():
            params[name].copy_(value)
        for layer, d_final, d_early in zip(layers, final_deltas, early_deltas):
            base = layer.get_base_layer().weight
            base.add_((d_early - d_final).to(base), alpha=1 - weight)


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


@dataclass
class OnlinePolicy:
    """The policy in memory: `model` samples and trains (with LoRA, the base model with peft's adapters in its
    layers); `wrapper` is the peft model (None for full fine-tuning); the optimiser and schedule carry over."""

    model: torch.nn.Module
    wrapper: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    schedule: object
    device: torch.device
    reference: torch.nn.Module | None = None  # full training with the DPO or KL term: a frozen copy of the initial policy

    @classmethod
    def build(cls, model, online: DictConfig, device, total_steps: int) -> OnlinePolicy:
        from transformers import get_scheduler

        reference = None
        anchored = online.dpo_weight > 0 or online.kl > 0
        if anchored and online.mode != "lora":  # LoRA's reference is the adapter turned off
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        wrapper = None
        if online.mode == "lora":
            from peft import get_peft_model

            wrapper = get_peft_model(model, lora_config(online))  # its A matrices are drawn from torch's RNG
            model = wrapper.get_base_model()
        trainable = [p for p in (wrapper or model).parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=online.learning_rate,
                                      weight_decay=online.weight_decay)
        schedule = get_scheduler(online.lr_scheduler, optimizer, num_warmup_steps=online.warmup_steps,
                                 num_training_steps=total_steps)
        return cls(model, wrapper, optimizer, schedule, device, reference)

    @contextmanager
    def as_reference(self):
        """The initial policy, the DPO and KL terms' reference: with LoRA the model with its adapter off."""
        if self.wrapper is None:
            yield self.reference
            return
        with self.wrapper.disable_adapter():
            yield self.model

    def trainable(self) -> dict[str, torch.Tensor]:
        """The weights that train (the adapter with LoRA, every weight otherwise), by name."""
        return {n: p.detach().clone() for n, p in (self.wrapper or self.model).named_parameters() if p.requires_grad}

    def load_trainable(self, weights: dict[str, torch.Tensor]) -> None:
        result = (self.wrapper or self.model).load_state_dict(weights, strict=False)
        if result.unexpected_keys or set(weights) != set(self.trainable()):  # a checkpoint of another model: a bug
            raise RuntimeError(f"the checkpoint's weights do not match the policy's: {result.unexpected_keys[:3]}")

    def final(self):
        """The model to save: LoRA merged into the weights."""
        model = self.wrapper.merge_and_unload() if self.wrapper is not None else self.model
        model.eval()
        return model


def padded(examples: list[dict], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, loss mask) of examples, right-padded: [rows, longest]."""
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), longest), pad_id, dtype=torch.long)  # [rows, longest]
    attention = torch.zeros((len(examples), longest), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), longest), dtype=torch.bool)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        attention[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(e["completion_mask"], dtype=torch.bool)
    return ids.to(device), attention.to(device), loss_mask.to(device)


def completion_tokens(examples: list[dict]) -> int:
    """The tokens the loss is taken on: completion tokens after the first token (each is predicted)."""
    return sum(sum(e["completion_mask"][1:]) for e in examples)


def completion_nll(model, ids: torch.Tensor, attention: torch.Tensor, loss_mask: torch.Tensor,
                   temperature: float = 1.0):
    """(the next-token logits [rows, longest - 1, vocab], divided by `temperature`, the cross-entropy of each
    completion token under them, 0 elsewhere [rows, longest - 1]) of padded examples."""
    logits = tempered(model(input_ids=ids, attention_mask=attention).logits[:, :-1], temperature)
    nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")
    return logits, nll * loss_mask[:, 1:]


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The logits divided by `temperature` (sft.tempered_loss, online.tempered_loss: the distribution the sampler
    draws from, as TRL's GRPOTrainer takes its log-probabilities; sft.loss_temperature: a temperature of its own);
    the same tensor at 1."""
    return logits if temperature == 1.0 else logits / temperature


def token_nll(model, examples: list[dict], pad_id: int, device) -> torch.Tensor:
    """Each example's cross-entropy summed over its completion tokens: [rows]."""
    return completion_nll(model, *padded(examples, pad_id, device))[1].sum(dim=1)


def sft_loss(model, examples: list[dict], pad_id: int, device, total: int) -> torch.Tensor:
    """The SFT loss of `examples`: the cross-entropy of their completion tokens, summed and divided by `total` (the
    step's completion tokens, on every process). It is the loss TRL's SFTTrainer takes (stage=sft): the model's own
    causal-LM loss function (transformers' ForCausalLMLoss), labels -100 outside the completion, divided by the
    batch's token count (num_items_in_batch) rather than averaged per process."""
    ids, attention, loss_mask = padded(examples, pad_id, device)
    labels = ids.masked_fill(~loss_mask, -100)  # [rows, longest]: the loss reads the completion tokens only
    return model(input_ids=ids, attention_mask=attention, labels=labels,
                 num_items_in_batch=torch.tensor(total, device=device)).loss


def sft_loss_and_kl(policy: OnlinePolicy, examples: list[dict], pad_id: int, total: int, kl: bool = True,
                    gem_beta: float | None = None,
                    temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the SFT loss of `examples` as sft_loss takes it, or with `gem_beta` GEM's loss (gem_token_losses) summed and
    divided alike, each example's tokens times its `weight` where it has one (as stage=sft weighs its rows,
    lever_sft_trainer); with `kl` the sum over their completion tokens of KL(initial || policy), else None) from one
    forward of the policy and, with `kl`, one of its reference (online.kl, online.loss; stage=sft's sft.kl and
    sft.loss take the same terms, forward_kl_sum). Every term reads both models' logits divided by `temperature`
    (online.tempered_loss)."""
    ids, attention, loss_mask = padded(examples, pad_id, policy.device)
    if gem_beta is None:
        logits, token_losses = completion_nll(policy.model, ids, attention, loss_mask, temperature)
    else:
        logits = tempered(policy.model(input_ids=ids, attention_mask=attention).logits[:, :-1], temperature)
        token_losses = gem_token_losses(logits, ids[:, 1:].masked_fill(~loss_mask[:, 1:], -100), gem_beta)
    if has_weights(examples):
        token_losses = token_losses * torch.tensor([e.get("weight", 1.0) for e in examples]).to(token_losses)[:, None]
    if not kl:
        return token_losses.sum() / total, None
    with torch.no_grad(), policy.as_reference() as reference:
        reference_logits = tempered(reference(input_ids=ids, attention_mask=attention).logits[:, :-1], temperature)
    return token_losses.sum() / total, forward_kl_sum(logits, reference_logits, loss_mask[:, 1:].float())


def has_weights(examples: list[dict]) -> bool:
    """Whether any example carries a loss weight other than 1."""
    return any(e.get("weight", 1.0) != 1.0 for e in examples)


@dataclass
class Pairs:
    """A mini-batch's best-vs-worst pairs for the DPO term: the examples and the frozen reference's summed
    log-probabilities of each completion, [pairs] each."""

    chosen: list[dict]
    rejected: list[dict]
    reference_chosen: torch.Tensor
    reference_rejected: torch.Tensor
    beta: float
    weight: float


def dpo_loss_sum(model, pairs: Pairs, pad_id: int, device, rank: int = 0, world: int = 1) -> torch.Tensor:
    """The DPO loss -log sigmoid(beta ((log pi - log ref)(chosen) - (log pi - log ref)(rejected))) summed over this
    process's pairs (every `world`-th from `rank`), log-probabilities summed over each completion's tokens: the loss
    TRL's DPOTrainer takes for stage=dpo (its default sigmoid loss; tests/test_online.py compares them)."""
    chosen = -token_nll(model, pairs.chosen[rank::world], pad_id, device)      # [my pairs]
    rejected = -token_nll(model, pairs.rejected[rank::world], pad_id, device)  # [my pairs]
    margin = (chosen - pairs.reference_chosen[rank::world]) - (rejected - pairs.reference_rejected[rank::world])
    return -torch.nn.functional.logsigmoid(pairs.beta * margin).sum()


def train_step(policy: OnlinePolicy, batch: list[dict], pad_id: int, max_grad_norm: float,
               pairs: Pairs | None = None, kl: float = 0.0, gem_beta: float | None = None,
               temperature: float = 1.0) -> tuple[float, float | None, float | None]:
    """One optimiser step on `batch` (every process's examples; this one takes every W-th): the mean
    cross-entropy over the batch's completion tokens (with `gem_beta`, online.loss=gem: GEM's loss; an example with a
    `weight` counts its tokens that many times, below 0 pushing them down), plus with
    `kl` > 0 kl x the mean over those tokens of KL(initial || policy) (online.kl), plus with `pairs` weight x the
    mean DPO loss -log sigmoid(beta ((log pi - log ref)(chosen) - (log pi - log ref)(rejected))) over every pair.
    The SFT and KL terms read the logits divided by `temperature` (online.tempered_loss), the DPO term the raw ones.
    Returns (the SFT loss, the DPO loss or None, the mean KL per completion token or None)."""
    total = completion_tokens(batch)
    rank, world = distributed.rank(), distributed.world_size()
    mine = batch[rank::world]
    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    # [SFT loss summed over tokens, DPO loss summed over pairs, KL summed over tokens]
    sums = torch.zeros(3, device=policy.device)
    objective = torch.zeros((), device=policy.device)
    if mine and total and (kl > 0 or gem_beta is not None or has_weights(mine) or temperature != 1.0):
        sft, divergence = sft_loss_and_kl(policy, mine, pad_id, total, kl > 0, gem_beta, temperature)
        objective = objective + sft
        sums[0] = sft.detach() * total
        if divergence is not None:
            objective = objective + kl * divergence / total
            sums[2] = divergence.detach()
    elif mine and total:
        sft = sft_loss(policy.model, mine, pad_id, policy.device, total)
        objective = objective + sft
        sums[0] = sft.detach() * total
    if pairs is not None and pairs.chosen[rank::world]:
        dpo_sum = dpo_loss_sum(policy.model, pairs, pad_id, policy.device, rank, world)
        objective = objective + pairs.weight * dpo_sum / len(pairs.chosen)
        sums[1] = dpo_sum.detach()
    if objective.requires_grad:
        objective.backward()
    params = [p for p in policy.optimizer.param_groups[0]["params"]]
    if world > 1:  # data-parallel: the sum of every process's share is the batch's gradient
        for p in params:
            if p.grad is None:  # a process without examples in this step still takes part in every sum
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
        torch.distributed.all_reduce(sums)
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    policy.optimizer.step()
    policy.schedule.step()
    policy.model.eval()
    sft = float(sums[0]) / max(total, 1)  # no completion tokens (empty answers): no SFT term, loss 0
    return (sft, float(sums[1]) / len(pairs.chosen) if pairs is not None else None,
            float(sums[2]) / max(total, 1) if kl > 0 else None)


def online_examples(rows: list[dict], tokenizer, system_prompt: str | None, max_length: int) -> list[dict]:
    """The SFT examples of kept rows (stage=sft's rendering, cut_examples), cut to online.max_length tokens; a row's
    `weight` (select.weight, select.strategy=advantage) rides along as the example's loss weight."""
    if not rows:
        return []
    table = Dataset.from_dict({k: [r[k] for r in rows] for k in ("prompt", "completion", "finish_reason")})
    return [{"input_ids": e["input_ids"][:max_length], "completion_mask": e["completion_mask"][:max_length],
             **({"weight": float(r["weight"])} if r.get("weight") is not None else {})}
            for r, e in zip(rows, cut_examples(table, tokenizer, system_prompt).to_list())]


def dpo_pairs(policy: OnlinePolicy, examples, pairs: list[tuple[dict, dict]], online: DictConfig,
              pad_id: int) -> Pairs | None:
    """The DPO term's pairs (`examples` renders rows), with the reference's log-probabilities (computed once: it is
    frozen)."""
    if not pairs or online.dpo_weight == 0:
        return None
    chosen, rejected = examples([b for b, _ in pairs]), examples([w for _, w in pairs])
    with torch.no_grad(), policy.as_reference() as reference:
        reference_chosen = -token_nll(reference, chosen, pad_id, policy.device)      # [pairs]
        reference_rejected = -token_nll(reference, rejected, pad_id, policy.device)  # [pairs]
    return Pairs(chosen, rejected, reference_chosen, reference_rejected, online.dpo_beta, online.dpo_weight)


def trainer_batches(count: int, size: int, steps: int, seed: int) -> list[list[int]]:
    """The example indices of `steps` optimiser steps over `count` examples, `size` a step, in the order
    transformers' Trainer feeds a dataset to stage=sft and stage=dpo: epoch e is torch.randperm(count) drawn from a
    generator seeded with seed + e (accelerate's seedable sampler, which the Trainer uses by default), cut into steps
    of `size`, the epoch's last step shorter when `size` does not divide `count`; the next epoch follows. So a
    mini-batch's steps over a round's kept rows are that round's SFT steps (tests/test_online.py)."""
    batches, epoch = [], 0
    while len(batches) < steps:
        order = torch.randperm(count, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        batches += [order[at:at + size] for at in range(0, count, size)]
        epoch += 1
    return batches[:steps]


def train_on_batch(policy: OnlinePolicy, tokenizer, online: DictConfig, seed: int, system_prompt: str | None,
                   kept: list[dict], earlier: list[dict], batch: int, pairs: list[tuple[dict, dict]] = (),
                   kl: float | None = None, temperature: float = 1.0) -> dict:
    """Mini-batch `batch`'s training (stage=online): online.steps_per_batch steps on the kept rows and online.replay
    of the earlier ones (with online.dpo_weight, and the DPO term on the mini-batch's best-vs-worst pairs); the
    losses, each step's among them. The steps walk the examples as transformers' Trainer would with the seed
    seed + batch (trainer_batches), as round r's SFT trains with seed + r. `kl` is the KL weight in force (online.kl,
    raised by online.guard's raise_kl crossings: rsft.guard.kl_weight); None = online.kl. `temperature` divides the
    logits of the SFT and KL terms (online.tempered_loss: sample.temperature)."""
    def examples(rows):
        return online_examples(rows, tokenizer, system_prompt, online.max_length)

    replayed = []
    if online.replay and earlier:
        draw = random.Random(f"{seed}/replay/{batch}")
        replayed = [earlier[i] for i in sorted(draw.sample(range(len(earlier)), min(online.replay, len(earlier))))]
    rendered = examples(kept + replayed)
    if not rendered:
        return {"steps": 0, "examples": 0, "replayed": 0, "loss": None}
    losses, dpo_losses, kls = [], [], []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    dpo = dpo_pairs(policy, examples, list(pairs), online, pad_id)
    kl = online.kl if kl is None else kl
    for rows in trainer_batches(len(rendered), online.batch_size, online.steps_per_batch, seed + batch):
        loss, dpo_loss, divergence = train_step(policy, [rendered[i] for i in rows], pad_id, online.max_grad_norm,
                                                dpo, kl, online.gem_beta if online.loss == "gem" else None,
                                                temperature)
        losses.append(loss)
        dpo_losses += [dpo_loss] if dpo_loss is not None else []
        kls += [divergence] if divergence is not None else []
    return {"steps": len(losses), "examples": len(rendered), "replayed": len(replayed),
            "loss": statistics.fmean(losses), "loss_last": losses[-1], "step_losses": losses,
            **({"dpo_pairs": len(dpo.chosen) if dpo else 0, "dpo_loss": statistics.fmean(dpo_losses) if dpo else None}
               if online.dpo_weight > 0 else {}),
            **({"kl": statistics.fmean(kls) if kls else None, "kl_weight": kl} if kl > 0 else {}),
            "learning_rate": float(policy.schedule.get_last_lr()[0])}
