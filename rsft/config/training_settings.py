"""sft and dpo: training the policy with a TRL trainer (LoRA or full), the settings they share.
"""

from dataclasses import dataclass
from typing import Any

from rsft.config.rules import (
    Check,
    Checked,
    _fail,
    at_least,
    boolean,
    non_negative,
    number,
    one_of,
    positive,
    setting,
    typed,
    warmup,
)


# Each trainer's epochs and learning rate: 0 trains nothing, yet the stage would save its model as trained.
# The TrainingConfig defaults are sft's; dpo and reward declare their own.
UNTRAINED_POLICY = "(0 trains nothing, yet stage=sft would save the policy as this round's fine-tuned one; to stop " \
                   "before SFT run the stages up to stage=select, to evaluate the untrained policy eval.policy=initial)"
UNTRAINED_DPO = "(0 trains nothing, yet stage=dpo would save the SFT policy as the DPO-trained one; loop.dpo=false " \
                "skips DPO)"
UNTRAINED_REWARD = "(0 trains nothing, yet the untrained head would be saved as the reward model; reward_source=" \
                   "pretrained, function or http scores without training one)"

# The fewest tokens a training row may be cut to: the prompt's chat-template markers (sft, dpo) or the special
# tokens around prompt and completion (reward) take several, and the loss needs completion tokens after them;
# below this a round's whole kept set is cut to nothing and the trainer fails after sampling and selection.
MIN_MAX_LENGTH = 16
MAX_LENGTH = at_least(MIN_MAX_LENGTH, f"(the prompt's template tokens and at least some completion tokens must fit; "
                                      f"below {MIN_MAX_LENGTH} every row loses its completion)")

WARMUP_TYPE = "int or float"
WARMUP_HELP = "Warmup: an int counts steps, a float < 1 is a fraction of the training steps."


def _module_names(key: str, modules) -> None:
    names = [modules] if isinstance(modules, str) else modules
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
        _fail(key, modules, "a module name such as all-linear or a non-empty list of names")


@dataclass
class LoraAdapterConfig(Checked):
    """LoRA's settings for mode=lora (sft.lora, dpo.lora); the adapter is merged before saving."""

    r: int = setting(16, "The adapters' rank.", check=at_least(1))
    alpha: int = setting(32, "LoRA's scaling numerator (the update is scaled by alpha / r).", check=at_least(1))
    dropout: float = setting(0.0, "Dropout on the adapters' input, in [0, 1).",
                             check=number("a number in [0, 1)", lambda v: 0 <= v < 1, "in [0, 1)"))
    target_modules: Any = setting("all-linear", "The modules adapted: a name peft knows (all-linear) or a list of "
                                                "module names.", shown_type="str or list of str",
                                  check=Check(_module_names, "non-empty"))


@dataclass
class TrainingConfig(Checked):
    """The settings every TRL trainer of rsft reads (rsft.trl_common.training_arguments): sft, dpo and reward
    take them from here, each with its own defaults."""

    learning_rate: float = setting(2.0e-4, "Peak learning rate.", check=positive(UNTRAINED_POLICY))
    epochs: int = setting(2, "Training epochs.", check=at_least(1, UNTRAINED_POLICY))
    batch_size: int = setting(4, "Examples per optimizer step over all processes (before grad_accum).",
                              check=at_least(1))
    grad_accum: int = setting(1, "Gradient accumulation steps.", check=at_least(1))
    max_length: int = setting(512, "Prompt + completion tokens; longer rows are truncated from the end.",
                              check=MAX_LENGTH)
    lr_scheduler: str = setting("constant", "transformers' learning-rate schedule (linear, cosine, constant, ...).")
    warmup_steps: Any = setting(0, WARMUP_HELP, shown_type=WARMUP_TYPE, check=warmup())
    weight_decay: float = setting(0.0, "AdamW weight decay.", check=non_negative())
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", check=positive())
    activation_checkpointing: bool = setting(False, "Recompute activations in the backward pass; CUDA only, never on "
                                                    "CPU.", check=boolean())
    logging_steps: int = setting(1, "Log the training loss every this many steps.", check=at_least(1))
    checkpoint_steps: int = setting(200, "Save a resumable checkpoint every N optimizer steps (the last one kept, "
                                         "deleted once the model is saved); a rerun after a kill resumes from it. "
                                         "0 = none.", check=at_least(0, "(0 = none)"))


TRAINING_MODES = ("full", "lora")
# sft.loss and online.loss: cross-entropy or GEM (rsft.policy_training.gem_token_losses), with GEM's temperature
TRAINING_LOSSES = ("ce", "gem")
GEM_BETA = number("a number in (0, 1]", lambda v: 0 < v <= 1, "in (0, 1]")
MERGE_WEIGHT = number("a number in (0, 1] (1 = no merge)", lambda v: 0 < v <= 1, "in (0, 1]")
MERGE_AT = number("a fraction of the training steps in [0, 1)", lambda v: 0 <= v < 1, "in [0, 1)")


@dataclass
class SftConfig(TrainingConfig):
    """TRL's SFTTrainer on the selected completions (loss on the completion only, the policy's chat template);
    precision and checkpointing follow the device."""

    init: str = setting("initial", "initial: every round fine-tunes the configured policy on the kept set (pooled, "
                                   "see select); previous: the policy the round sampled from (drift compounds).",
                        check=one_of(("initial", "previous")))
    # LoRA keeps the policy's diversity over the rounds, where full fine-tuning lost it
    # (docs/history.md#why-each-default-setting)
    mode: str = setting("lora", "full | lora (LoRA is merged into the weights before saving).",
                        check=one_of(TRAINING_MODES))
    # the TrainingConfig defaults (learning rate, epochs) are LoRA's on the demo policy's small kept sets; full
    # fine-tuning wants a lower learning rate (docs/history.md#why-each-default-setting)
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")
    # issue 48 (collapse): a pull towards the policy SFT starts from, so the policy keeps its range
    kl: float = setting(0.0, "Weight of a KL(start || policy) term added to the SFT loss on the completion tokens: the "
                             "policy SFT starts from (sft.init) as the reference, so the policy keeps the answers it "
                             "could give (docs/diversity.md). 0 = plain SFT.", check=non_negative())
    # issue 48: fit the sampler's distribution (logits / sample.temperature), as GRPO's log-probabilities do
    tempered_loss: bool = setting(False, "Take the loss (and the KL term) on the policy's logits divided by "
                                         "sample.temperature, the distribution the kept answers were drawn from, as "
                                         "TRL's GRPOTrainer does; false = on the raw logits (TRL's SFT loss), which "
                                         "goes on sharpening the sampler's distribution after it puts all its mass "
                                         "on the kept answers.", check=boolean())
    # issue 48: the same loss at a temperature of its own, between the sampler's (tempered_loss) and 1 (TRL's SFT)
    loss_temperature: float = setting(1.0, "Take the loss (and the KL term) on the policy's logits divided by this: "
                                           "1 = the raw logits (TRL's SFT loss); sample.temperature = "
                                           "tempered_loss; a value between sharpens the sampler's distribution less "
                                           "than 1 and more than the sampler's own (docs/diversity.md). Not with "
                                           "tempered_loss=true.", check=positive())
    # issue 48 (collapse): GEM (Li et al., ICLR 2025), a loss that fits the kept answers without sharpening onto them
    loss: str = setting("ce", "ce: cross-entropy on the completion tokens (TRL's loss); gem: GEM's entropic "
                              "distribution matching (Li et al. 2025), whose gradient pushes the target token up and "
                              "the policy's own sharpened choices down, so the answers it learns do not crowd out the "
                              "others (docs/diversity.md).", check=one_of(TRAINING_LOSSES))
    gem_beta: float = setting(0.7, "GEM's temperature, in (0, 1]: the tokens pushed down follow the policy's "
                                   "distribution at this temperature; 1 gives cross-entropy's gradient.",
                              check=GEM_BETA)
    # issue 48 (collapse): WiSE-FT, weight-space interpolation with an earlier point of the same fine-tune
    merge_weight: float = setting(1.0, "WiSE-FT: the saved policy is this share of the fine-tuned weights plus the "
                                       "rest from an earlier point of the same fine-tune (sft.merge_at), in (0, 1]; "
                                       "1 = off (docs/diversity.md).", check=MERGE_WEIGHT)
    merge_at: float = setting(0.0, "With sft.merge_weight < 1: where in the fine-tune the earlier weights are taken, a "
                                   "fraction of its steps in [0, 1): 0 = the policy SFT starts from (Wortsman et al. "
                                   "2022), > 0 an early checkpoint (Dang et al. 2025).", check=MERGE_AT)


@dataclass
class DpoConfig(TrainingConfig):
    """With loop.dpo: TRL's DPOTrainer on the round's best-vs-worst pairs, from the round's SFT policy, which
    is also the reference."""

    learning_rate: float = setting(1.0e-4, "Peak learning rate.", check=positive(UNTRAINED_DPO))
    epochs: int = setting(1, "Training epochs.", check=at_least(1, UNTRAINED_DPO))
    mode: str = setting("lora", "full | lora (LoRA: the reference is the SFT policy with the adapter off; merged "
                                "before saving).", check=one_of(TRAINING_MODES))
    beta: float = setting(0.1, "DPO's KL strength, > 0: larger keeps the policy closer to the SFT policy.",
                          check=positive())
    min_margin: float = setting(0.5, "Skip pairs whose reward gap (reward_normalised, in reward-model std units) is "
                                     "smaller; 0 keeps every pair.",
                                check=typed(float, "a number (a gap in reward_normalised; 0 keeps every pair)"))
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")
