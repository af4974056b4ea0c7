"""stage=dpo: learn from the rejected: DPO on round r's best-vs-worst pairs, from round r's SFT policy.

    python -m rsft.run stage=dpo round=0 loop.dpo=true [dpo.beta=0.1 dpo.min_margin=0.5 dpo.mode=full]

Best-of-K SFT learns only from what it keeps; the K - 1 completions it rejects are thrown away,
though they say as much about what the reward model dislikes. Iterative DPO pipelines (Xu et al.
2023, arXiv 2312.16682; Xiong et al. 2024, arXiv 2312.11456) train on the best-vs-worst pairs of each
round, which stage=select already writes to round_XX/pairs/. Here DPO runs after SFT, as its own
stage rather than as an sft.method: it starts from round r's SFT policy and keeps that policy as its
reference (the KL anchor of the DPO loss), so the SFT artifact must exist first, and keeping both
on disk lets either be rerun, resumed or compared alone.

Reads round_XX/policy (RunPaths.dpo_init_policy) and round_XX/pairs/; writes round_XX/dpo/, a plain
`save_pretrained` folder with the tokenizer, which with loop.dpo is the policy round r ends with
(RunPaths.round_policy: what round r + 1 samples from and what eval round=r judges).

- Pairs whose reward gap is tiny (reward_normalised of chosen minus rejected below dpo.min_margin,
  in units of the scoring reward model's standard deviation) are skipped: the reward model barely
  prefers one, so DPO would be pushed by its noise.
- TRL's DPOTrainer does the work, on the pairs in TRL's conversational preference format (the
  policy's chat template renders them). dpo.mode=lora trains an adapter and uses the SFT policy with
  the adapter switched off as the reference (no second copy in memory), merged before saving;
  dpo.mode=full trains every weight against a second, frozen copy of the SFT policy.
- DPOConfig, like SFTConfig, defaults to bf16 and gradient checkpointing, chosen for GPUs: precision
  and checkpointing come from the device (rsft.trl_common.training_arguments), fp32 without checkpointing
  on a CPU.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from rsft import distributed
from rsft.errors import ArtifactError, ConfigError, InputError, MissingInput
from rsft.models import load_policy, resolve_device
from rsft.paths import RunPaths
from rsft.policy_training import LossHistory, lora_config, policy_writer, trained_policy
from rsft.runner import Built, Job, Plan
from rsft.store import is_complete, load_dataset_artifact
from rsft.trl_common import check_trained, training_arguments

log = logging.getLogger(__name__)

def margin_filter(pairs, min_margin: float):
    """The pairs whose normalised reward gap (chosen - rejected) is at least min_margin."""
    return pairs.filter(lambda p: p["chosen_reward_normalised"] - p["rejected_reward_normalised"] >= min_margin)


def trainer_config(cfg: DictConfig, device, output_dir: str):
    from trl import DPOConfig

    return DPOConfig(
        output_dir=output_dir,
        **training_arguments(cfg.dpo, "dpo", device),
        beta=cfg.dpo.beta,
        max_length=cfg.dpo.max_length,
        seed=cfg.seed + cfg.round,
        disable_tqdm=True,
    )


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """Every dpo setting, the seed and round (the trainer's seed), the pairs and the SFT policy."""
    round_idx = cfg.round
    if not paths.dpo:
        raise ConfigError("stage=dpo writes round_XX/dpo, which only loop.dpo=true samples from and evaluates; add "
                          "loop.dpo=true (to this command and to the loop's)")
    source, init_path = paths.pairs(round_idx), paths.dpo_init_policy(round_idx)
    for needed, stage in ((source, "select"), (init_path, "sft")):
        if not is_complete(needed):
            raise MissingInput(f"dpo needs round {round_idx}'s {needed.name} at {needed}; run "
                               f"`python -m rsft.run stage={stage} round={round_idx}` first")
    return Plan(outputs=[paths.dpo_policy(round_idx)], inputs=[source, init_path])


def build(cfg: DictConfig, job: Job) -> Built:
    from trl import DPOTrainer

    round_idx = cfg.round
    source, init_path = job.plan.inputs
    pairs = load_dataset_artifact(source)
    for column in ("chosen_reward_normalised", "rejected_reward_normalised"):
        if column not in pairs.column_names:
            raise ArtifactError(f"{source} has no {column!r} column (an older stage=select wrote it); rebuild it "
                                f"with `python -m rsft.run stage=select round={round_idx} overwrite=true`")
    kept = margin_filter(pairs, cfg.dpo.min_margin)
    if len(kept) == 0:
        raise InputError(f"dpo: none of the {len(pairs)} pairs in {source} has a normalised reward gap >= "
                         f"dpo.min_margin={cfg.dpo.min_margin}; lower dpo.min_margin or set loop.dpo=false")
    device = resolve_device(cfg.device)
    model, tokenizer, policy_source = load_policy(cfg, init_path, device)
    reference = None if cfg.dpo.mode == "lora" else load_policy(cfg, init_path, device)[0]  # frozen copy (full)
    log.info("dpo: round %d trains %s on %d of %d pairs (reward gap >= %s), beta %s, %s", round_idx, policy_source,
             len(kept), len(pairs), cfg.dpo.min_margin, cfg.dpo.beta, cfg.dpo.mode)
    history = LossHistory()
    checkpoints = job.checkpoints()  # a killed run resumes from its last checkpoint
    trainer = DPOTrainer(
        model=model, ref_model=reference, args=trainer_config(cfg, device, str(checkpoints.folder)),
        train_dataset=kept.select_columns(["prompt", "chosen", "rejected"]), processing_class=tokenizer,
        peft_config=lora_config(cfg.dpo) if cfg.dpo.mode == "lora" else None, callbacks=[history],
    )
    result = checkpoints.train(trainer)
    trained, state_dict = trained_policy(trainer, cfg.dpo.mode)

    logged = [h for h in history.history if "loss" in h]
    stats = {
        "train_loss": history.train_loss(result),
        "loss_first": logged[0]["loss"] if logged else None,
        "loss_last": logged[-1]["loss"] if logged else None,
        "margin_last": logged[-1].get("rewards/margins") if logged else None,
        "accuracy_last": logged[-1].get("rewards/accuracies") if logged else None,
        "steps": int(result.global_step),
        "pairs": len(kept),
        "pairs_skipped_by_margin": len(pairs) - len(kept),
        "world_size": distributed.world_size(),
        "seconds": float(result.metrics.get("train_runtime", 0.0)),
    }
    meta = {"stage": "dpo", "round": round_idx, "trained_from": policy_source, "reference": policy_source,
            "pairs": str(source), "stats": stats, "loss_history": history.history,
            "settings": OmegaConf.to_container(cfg.dpo, resolve=True)}
    check_trained(trained, stats["train_loss"], cfg.dpo, "dpo", state_dict)
    log.info("dpo: %d pairs, %d steps, loss %s -> %s; round %d's policy for %s", len(kept), stats["steps"],
             stats["loss_first"], stats["loss_last"], round_idx, job.out)
    return Built([(meta, policy_writer(trained, state_dict, tokenizer))],
                 {f"dpo/{k}": v for k, v in stats.items() if v is not None}, step=round_idx)
