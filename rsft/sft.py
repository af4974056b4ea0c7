"""stage=sft: fine-tune the round's policy on the selected completions; save the next round's policy.

    python -m rsft.run stage=sft [round=0] [sft.mode=lora sft.learning_rate=2e-4]

Reads round_XX/selected/ and the policy to start from (RunPaths.sft_init_policy), sft.init:
`initial` (the default: the configured policy, every round) or `previous` (the policy round XX
sampled from); writes round_XX/policy/, a plain `save_pretrained`
folder with the tokenizer, which round XX + 1 samples from (rsft.paths.RunPaths.sampling_policy).

Why `initial` by default: fine-tuning the previous round's policy again compounds the drift of
every round; on the demo task it over-fitted in a second round (docs/history.md#why-sftinitinitial).
Restarting from
the initial policy each round on the kept completions of all rounds so far (select.pool_rounds=-1),
as ReST-EM does (Singh et al. 2023, arXiv 2312.06585), keeps every round one fine-tune away from
the initial policy while the data gets better: later rounds sample from the improved policy, so
their best completions (pooled with the earlier ones) are better training targets.

TRL's SFTTrainer does the work. Each selected row becomes a conversational prompt-completion
example, prompt = [system?, user] messages as stage=sample showed them, completion = [assistant],
so TRL renders both with the policy's chat template and masks the loss to the completion tokens
(including the end-of-turn token, so the policy also learns where to stop). A truncated completion
(kept with select.drop_truncated=false) trains without its end of turn (cut_examples). LoRA (sft.mode=lora)
is merged into the weights before saving, so the next round loads a plain folder. TRL's defaults
for bf16 and gradient checkpointing are chosen for GPUs and are far slower on a CPU, so the device
decides (rsft.trl_common.training_arguments): fp32 without checkpointing on CPU, bf16 where the GPU
supports it. Losses go to our Tracker (report_to="none"). The trainer saves a checkpoint every
sft.checkpoint_steps steps beside the artifact (rsft.checkpoints.TrainingCheckpoints), so a killed run
resumes from its last one; the checkpoints go once the policy is written.

sft.kl > 0 adds a KL(start || policy) term on the completion tokens, the start being the policy SFT fine-tunes, and a
selected set with a `weight` column (select.weight, select.strategy=advantage, whose wrong answers weigh less than
0) weights each row's cross-entropy by it
(rsft.policy_training.lever_sft_trainer), sft.loss=gem trains with GEM's loss in place of the cross-entropy,
sft.tempered_loss takes the loss on the logits divided by sample.temperature (the distribution the kept answers were
drawn from), sft.loss_temperature on the logits divided by a temperature of its own, and
sft.merge_weight < 1 saves a mix of the fine-tuned weights and those at sft.merge_at of the same run (WiSE-FT,
rsft.policy_training.merge_with_early): levers against collapse (issue 48, docs/diversity.md).
"""

from __future__ import annotations

import logging
import math

import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from rsft import distributed
from rsft.data import chat_messages
from rsft.errors import ConfigError, InputError, MissingInput
from rsft.models import load_policy, resolve_device
from rsft.paths import RunPaths
from rsft.policy_training import (
    EarlyWeights,
    LossHistory,
    lever_sft_trainer,
    merge_with_early,
    cut_examples,
    lora_config,
    loss_temperature,
    policy_writer,
    trained_policy,
)
from rsft.runner import Built, Job, Plan
from rsft.store import is_complete, load_dataset_artifact
from rsft.trl_common import check_trained, training_arguments

log = logging.getLogger(__name__)


def conversational_examples(selected: Dataset, system_prompt: str | None) -> Dataset:
    """TRL's conversational prompt-completion format (loss on the completion only), with the rows' loss weights
    where select.weight gave them."""
    return Dataset.from_dict({
        "prompt": [chat_messages(p, system_prompt) for p in selected["prompt"]],
        "completion": [[{"role": "assistant", "content": c}] for c in selected["completion"]],
        **({"weight": selected["weight"]} if "weight" in selected.column_names else {}),
    })


def training_examples(selected: Dataset, tokenizer, system_prompt: str | None) -> tuple[Dataset, int]:
    """(SFT examples, how many are truncated completions): conversational ones for TRL to render, or, when
    the set holds truncated completions, cut_examples."""
    cut = sum(r == "length" for r in selected["finish_reason"]) if "finish_reason" in selected.column_names else 0
    if not cut:
        return conversational_examples(selected, system_prompt), 0
    examples = cut_examples(selected, tokenizer, system_prompt)
    if "weight" in selected.column_names:
        examples = examples.add_column("weight", list(selected["weight"]))
    return examples, cut


def check_weights(weights: list, source) -> None:
    """A selected set's loss weights (select.weight, select.strategy=advantage) are finite numbers, at least one of
    them positive: else InputError, before the policy is loaded. A negative weight pushes its row's completion down
    (select.strategy=advantage's worse answers); a set of none but those would only unlearn."""
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise InputError(f"{source}: row {i}'s `weight` is {w!r}; expected a finite number (the row's SFT "
                             f"loss weight, select.weight or select.strategy=advantage)")
    if not any(w > 0 for w in weights):
        raise InputError(f"{source}: no row's `weight` is positive (largest {max(weights, default=None)!r}), so SFT "
                         f"would learn nothing or only push answers down; expected a positive weight on at least "
                         f"one row (select.weight, select.strategy=advantage)")


def trainer_config(cfg: DictConfig, device: torch.device, output_dir: str):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=output_dir,
        **training_arguments(cfg.sft, "sft", device),
        max_length=cfg.sft.max_length,
        completion_only_loss=True,
        packing=False,
        seed=cfg.seed + cfg.round,
        disable_tqdm=True,
    )


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """Every sft setting, the seed and round (the trainer's seed), the prompt format, the policy it starts from
    (configured, or an artifact) and the selected completions."""
    round_idx = cfg.round
    source, init_path = paths.selected(round_idx), paths.sft_init_policy(round_idx, cfg.sft.init)
    if not is_complete(source):
        raise MissingInput(f"sft needs round {round_idx}'s selected completions at {source}; run "
                           f"`python -m rsft.run stage=select round={round_idx}` first")
    return Plan(outputs=[paths.policy(round_idx)], inputs=[p for p in (source, init_path) if p is not None],
                given={"selected": source, "init": init_path})


def build(cfg: DictConfig, job: Job) -> Built:
    from trl import SFTTrainer

    round_idx = cfg.round
    source, init_path = job.plan.given["selected"], job.plan.given["init"]
    selected = load_dataset_artifact(source)
    if len(selected) == 0:
        raise InputError(f"{source} holds no selected completions; nothing to fine-tune on (see its meta.json)")
    weighted = "weight" in selected.column_names  # select.weight
    if weighted:
        check_weights(selected["weight"], source)
    merging = cfg.sft.merge_weight < 1  # WiSE-FT (sft.merge_weight, sft.merge_at)
    if merging and cfg.sft.mode != "lora" and distributed.world_size() > 1:
        raise ConfigError(f"sft.merge_weight={cfg.sft.merge_weight} with sft.mode={cfg.sft.mode} under "
                          f"{distributed.world_size()} processes: each holds a shard of the weights, so the earlier "
                          f"copy would be a shard too; expected sft.mode=lora, or one process")
    device = resolve_device(cfg.device)
    model, tokenizer, policy_source = load_policy(cfg, init_path, device)
    train, cut = training_examples(selected, tokenizer, cfg.data.get("system_prompt"))
    log.info("sft: round %d fine-tunes %s (sft.init=%s)%s", round_idx, policy_source, cfg.sft.init,
             f"; {cut} truncated completions train without their end of turn" if cut else "")
    history = LossHistory()
    checkpoints = job.checkpoints()  # a killed run resumes from its last checkpoint
    gem_beta = cfg.sft.gem_beta if cfg.sft.loss == "gem" else None
    temperature = loss_temperature(cfg, "sft")
    trainer_class = (lever_sft_trainer(SFTTrainer, cfg.sft.kl, cfg.sft.mode, weighted, gem_beta, temperature)
                     if cfg.sft.kl or weighted or gem_beta is not None or temperature != 1.0 else SFTTrainer)
    early = EarlyWeights(cfg.sft.merge_at, checkpoints.folder / "merge-early.pt") if merging else None
    trainer = trainer_class(
        model=model, args=trainer_config(cfg, device, str(checkpoints.folder)), train_dataset=train,
        processing_class=tokenizer, peft_config=lora_config(cfg.sft) if cfg.sft.mode == "lora" else None,
        callbacks=[history, *([early] if early else [])],
    )
    result = checkpoints.train(trainer)
    if early is not None:
        merge_with_early(trainer.accelerator.unwrap_model(trainer.model), early.weights, cfg.sft.merge_weight,
                         cfg.sft.mode)
        log.info("sft: WiSE-FT: the policy is %g x the fine-tuned weights + %g x those of step %d of %d",
                 cfg.sft.merge_weight, 1 - cfg.sft.merge_weight, early.step, int(result.global_step))
    trained, state_dict = trained_policy(trainer, cfg.sft.mode)

    losses = [h["loss"] for h in history.history if "loss" in h]
    kls = getattr(trainer, "kl_history", [])  # sft.kl's trainer only
    stats = {
        "train_loss": history.train_loss(result),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "steps": int(result.global_step),
        "examples": len(train),
        "truncated_examples": cut,
        "world_size": distributed.world_size(),
        "seconds": float(result.metrics.get("train_runtime", 0.0)),
        # sft.kl: the mean KL(start || policy) per completion token of the first and the last step
        "kl_first": kls[0] if kls else None,
        "kl_last": kls[-1] if kls else None,
        "merge_step": early.step if early is not None else None,  # sft.merge_at: the earlier point's step
    }
    meta = {"stage": "sft", "round": round_idx, "trained_from": policy_source, "selected": str(source),
            "stats": stats, "loss_history": history.history,
            "settings": OmegaConf.to_container(cfg.sft, resolve=True)}
    check_trained(trained, stats["train_loss"], cfg.sft, "sft", state_dict)
    log.info("sft: %d examples, %d steps, loss %s -> %s; round %d's policy for %s", len(train),
             stats["steps"], stats["loss_first"], stats["loss_last"], round_idx, job.out)
    return Built([(meta, policy_writer(trained, state_dict, tokenizer))],
                 {f"sft/{k}": v for k, v in stats.items() if v is not None}, step=round_idx)
