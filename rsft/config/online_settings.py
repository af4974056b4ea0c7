"""online and its collapse guard (the guard's settings are loop.guard's too).
"""

import re
from dataclasses import dataclass
from typing import Optional

from rsft.config.rules import (
    Check,
    Checked,
    _fail,
    at_least,
    boolean,
    non_negative,
    number,
    one_of,
    open_fraction,
    optional,
    positive,
    setting,
    typed,
)
from rsft.config.training_settings import GEM_BETA, LoraAdapterConfig, MAX_LENGTH, TRAINING_LOSSES, TRAINING_MODES


GUARD_ACTIONS = ("stop", "lower_lr", "raise_temperature", "raise_kl", "widen_select")  # rsft.guard
# the actions online refuses, and why the loop can take them
LOOP_ONLY_GUARD_ACTIONS = {"raise_temperature": "the rounds sample and evaluate apart",
                           "widen_select": "it changes the selection of the rounds after a crossing"}
# the measures of range an evaluation records (rsft.eval): higher is wider, except the two shares, where lower is
GUARD_METRIC = re.compile(r"^(distinct_1|distinct_1_all|distinct_2|distinct_2_all|distinct_answers|alike_share|"
                          r"mean_entropy|top_opening_share|(judge_)?pass_at_[1248])$")  # the names and k eval reports


def _guard_metric(key: str, value) -> None:
    if value is not None and not (isinstance(value, str) and GUARD_METRIC.match(value)):
        _fail(key, value, "null (off) or one of distinct_1, distinct_2, distinct_2_all, distinct_answers, alike_share, "
                          "mean_entropy, top_opening_share, pass_at_<k> (the reward's) or judge_pass_at_<k> with "
                          "k = 1, 2, 4 or 8 (an evaluation's measure)")


@dataclass
class GuardConfig(Checked):
    """The collapse guard (rsft.guard): a bound on an evaluation's measure of range, watched after training."""

    metric: Optional[str] = setting(None, "The measure watched: distinct_2, distinct_2_all, distinct_answers, "
                                          "mean_entropy, pass_at_<k> (floors), alike_share, top_opening_share "
                                          "(ceilings); null = off.", check=Check(_guard_metric), shown_type="str")
    min: Optional[float] = setting(None, "The floor: an evaluation after training below it crosses the guard.",
                                   check=optional(typed(float, "a number")))
    max: Optional[float] = setting(None, "The ceiling: an evaluation after training above it crosses the guard.",
                                   check=optional(typed(float, "a number")))
    action: str = setting("stop", "stop (end the training there, with the reason) | lower_lr (later training at "
                                  "lr_factor times the rate, once per crossing) | raise_temperature (loop.guard only: "
                                  "later rounds sample at temperature_factor times sample.temperature, once per "
                                  "crossing; evaluations keep sample.temperature) | raise_kl (later training at "
                                  "kl_factor times the KL weight, sft.kl for the loop, online.kl online, once per "
                                  "crossing; the weight must be > 0) | widen_select (loop.guard only: the rounds "
                                  "after the first crossing keep up to widen_k answers a prompt, a rare one weighing "
                                  "more).", check=one_of(GUARD_ACTIONS))
    lr_factor: float = setting(0.5, "action=lower_lr: the learning rate's factor per crossing, in (0, 1).",
                               check=open_fraction())
    temperature_factor: float = setting(1.25, "action=raise_temperature: the sampling temperature's factor per "
                                              "crossing, > 1.", check=number("a number > 1", lambda v: v > 1, "> 1"))
    kl_factor: float = setting(2.0, "action=raise_kl: the KL weight's factor per crossing, > 1.",
                               check=number("a number > 1", lambda v: v > 1, "> 1"))
    widen_k: int = setting(4, "action=widen_select: the rounds after the first crossing select with select.k=widen_k, "
                              "select.weight=rarity and select.weight_scale=prompt (each prompt still weighs one row); "
                              "more than select.k.", check=at_least(2))

    def __post_init__(self):
        super().__post_init__()
        # a measure needs a bound to watch, and a bound the measure it bounds
        if self.metric is not None and self.min is None and self.max is None:
            _fail(self._AT + "min", None, f"a number (the floor), or {self._AT}max set, with metric={self.metric}")
        if self.metric is None and (self.min is not None or self.max is not None):
            _fail(self._AT + "metric", None, "a measure to bound (e.g. distinct_2) when min or max is set")


@dataclass
class OnlineConfig(Checked):
    """stage=online (rsft.online): the policy learns while it samples. Each mini-batch takes the next
    prompts_per_batch train prompts, samples sample.num_samples completions of each with the current weights,
    scores them (reward_source), keeps what the select group's rule keeps and takes steps_per_batch optimiser
    steps on it; the optimiser and schedule carry across mini-batches."""

    minibatches: int = setting(9, "Mini-batches in all; mini-batch b takes prompts b*M .. b*M + M - 1 of the stream, "
                                  "wrapping once it is used up: the whole train split with data.rotate, else its "
                                  "first data.limit prompts (the prompts the rounds would see).",
                               check=at_least(1))
    prompts_per_batch: int = setting(8, "M: train prompts per mini-batch.", check=at_least(1))
    # 4 steps of 4: two passes over the 8 completions best-of-K keeps of 8 prompts, as sft's 2 epochs of batch 4
    steps_per_batch: int = setting(4, "Optimiser steps on each mini-batch's kept completions (and replay).",
                                   check=at_least(1, "(a mini-batch that takes no step never changes the policy)"))
    batch_size: int = setting(4, "Examples per optimiser step over all processes; the steps walk the mini-batch's "
                                 "examples in the order transformers' Trainer walks sft's (the seed "
                                 "seed + b for mini-batch b): epochs of seeded permutations, an epoch's last step "
                                 "shorter when batch_size does not divide the examples.", check=at_least(1))
    replay: int = setting(0, "Kept completions of earlier mini-batches drawn (seeded) into each mini-batch's examples; "
                             "0 = off.", check=at_least(0, "(0 = off)"))
    mode: str = setting("lora", "full | lora (the adapter trains; merged into the saved policy's weights).",
                        check=one_of(TRAINING_MODES))
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")
    learning_rate: float = setting(2.0e-4, "AdamW's peak learning rate.",
                                   check=positive("(0 trains nothing, yet the policy would be saved as trained)"))
    lr_scheduler: str = setting("constant", "transformers' schedule over all minibatches x steps_per_batch steps "
                                            "(constant, linear, cosine, ...).")
    warmup_steps: int = setting(0, "Warmup optimiser steps.", check=at_least(0))
    weight_decay: float = setting(0.0, "AdamW weight decay.", check=non_negative())
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", check=positive())
    max_length: int = setting(512, "Prompt + completion tokens; longer examples are cut from the end.",
                              check=MAX_LENGTH)
    dpo_weight: float = setting(0.0, "Weight of a DPO loss on each prompt's best-vs-worst survivors, added to every "
                                     "step (against the initial policy: LoRA with the adapter off, or a frozen copy); "
                                     "0 = off.", check=non_negative())
    dpo_beta: float = setting(0.1, "The DPO loss's KL strength, > 0.", check=positive())
    # issue 48: GRPO averages its loss over every sampled completion, so a mini-batch of tied prompts moves it less
    advantage_share: bool = setting(False, "With select.strategy=advantage, multiply a mini-batch's weights by the "
                                           "share of its prompts whose answers are not all tied, so that a mini-batch "
                                           "with little to learn from (its prompts all solved or all failed) takes a "
                                           "smaller step, as GRPO's loss, averaged over every sampled completion, "
                                           "does; false = every mini-batch's right answers weigh its kept prompts.",
                                    check=boolean())
    # issue 48: GRPO's log-probabilities are the sampler's (logits / temperature); SFT's are the raw logits'
    tempered_loss: bool = setting(False, "Take each step's loss (and its KL term) on the policy's logits divided by "
                                         "sample.temperature, the distribution the answers were drawn from, as TRL's "
                                         "GRPOTrainer does; false = on the raw logits, as stage=sft does, which "
                                         "goes on sharpening the sampler's distribution after it puts all its mass "
                                         "on the kept answers.", check=boolean())
    # issue 48 (collapse): online's pull towards where it started, as sft.kl is the rounds'
    kl: float = setting(0.0, "Weight of a KL(initial || policy) term added to every step's SFT loss, the mean over "
                             "the step's completion tokens, against the initial policy (LoRA with the adapter off, "
                             "or a frozen copy), so the policy keeps the answers it could give (docs/diversity.md); "
                             "0 = off.", check=non_negative())
    loss: str = setting("ce", "ce: cross-entropy on the kept answers' tokens; gem: GEM's loss (Li et al. 2025), as "
                              "sft.loss=gem trains the rounds: the answers it learns do not crowd out the others "
                              "(docs/diversity.md).", check=one_of(TRAINING_LOSSES))
    gem_beta: float = setting(0.7, "GEM's temperature with online.loss=gem, in (0, 1]; 1 gives cross-entropy's "
                                   "gradient.", check=GEM_BETA)
    refresh_every: int = setting(0, "Retrain the reward model every R mini-batches, as loop.refresh_reward does each "
                                    "round: labels of the last R mini-batches' samples (the refresh group's choice, "
                                    "the demo's simulated annotators) join every label so far, and the model it "
                                    "trains scores mini-batch b when R divides b + 1, and the ones after; 0 = off.",
                                check=at_least(0, "(0 = off)"))
    eval_every: int = setting(3, "Evaluate on the held-out prompts (eval.num_samples, eval.seed) before the first "
                                 "mini-batch, every E mini-batches and after the last; 0 = off.",
                              check=at_least(0, "(0 = off)"))
    checkpoint_every: int = setting(1, "Save a resumable checkpoint every C mini-batches (the newest kept, deleted "
                                       "once the artifact is written); a rerun after a kill redoes at most C. 0 = none.",
                                    check=at_least(0, "(0 = none)"))
    progress: bool = setting(True, "Show a progress bar over the mini-batches.", check=boolean())
    guard: GuardConfig = setting(GuardConfig, "The collapse guard: a bound on the snapshots' evaluated range (off "
                                              "by default).")

    def __post_init__(self):
        super().__post_init__()
        # the guard reads the eval snapshots
        if self.guard.metric is not None and self.eval_every == 0:
            _fail("eval_every", 0, f"> 0 with online.guard.metric={self.guard.metric} (the guard reads the "
                                          f"eval snapshots)")
        # the loop's own actions: online samples and evaluates with one sampler's settings (a raised temperature
        # would move the snapshots it is judged by too), and keeps each mini-batch's selection with one select group
        why = LOOP_ONLY_GUARD_ACTIONS.get(self.guard.action)
        if why:
            _fail("guard.action", self.guard.action, f"stop, lower_lr or raise_kl ({self.guard.action} is "
                                                     f"loop.guard's: {why})")
        # raise_kl multiplies the KL weight in force: with none there is nothing to raise
        if self.guard.action == "raise_kl" and self.guard.metric is not None and not self.kl > 0:
            _fail("kl", self.kl, "> 0 with online.guard.action=raise_kl (the guard multiplies this weight by "
                                 "guard.kl_factor at each crossing)")
