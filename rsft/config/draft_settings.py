"""draft and distill: what proposes tokens for speculative sampling, and how a draft is trained.
"""

from dataclasses import dataclass

from omegaconf import II, MISSING

from rsft.config.rules import (
    Checked,
    DTYPES,
    _fail,
    _unresolved,
    a_seed,
    at_least,
    boolean,
    kind_is,
    non_negative,
    one_of,
    open_fraction,
    positive,
    sampling_rule,
    setting,
)
from rsft.sampling.verifier import MAX_GAMMA, check_gamma


@dataclass
class DraftNoneConfig(Checked):
    kind: str = setting("none", "none: the plain sampler, one policy forward per token (the baseline).",
                        check=kind_is("none"))
    gamma: int = setting(0, "Unused: draft=none does not speculate.", check=at_least(0))
    adaptive: bool = setting(False, "Unused: draft=none does not speculate.", check=boolean())


# every speculative draft's gamma, and the gamma a draft's acceptance is measured with: rsft.sampling.verifier's
# rule (>= 1 to speculate, at most MAX_GAMMA)
GAMMA = sampling_rule(check_gamma, f"in [1, {MAX_GAMMA}]")
# stage=draft's epochs and learning rate: 0 would save the untrained draft as a trained one
UNTRAINED_DRAFT = "(0 trains nothing, yet stage=draft would save the untrained draft as trained; draft=ngram " \
                  "drafts without training, draft=none samples without a draft)"


@dataclass
class DraftNgramConfig(Checked):
    kind: str = setting("ngram", "ngram: proposes what followed the longest matching suffix in the prompt or the "
                                 "sibling completions (model-free, one-hot).", check=kind_is("ngram"))
    # a low ceiling: already a second draft token is used less often than verifying it costs on a CPU
    # (docs/benchmarks.md#sampling-speed)
    gamma: int = setting(2, "Draft tokens per step at most (the adaptive controller's ceiling).", check=GAMMA)
    adaptive: bool = setting(True, "Shrink or grow gamma (down to 0 = do not speculate) from measured acceptance "
                                   "and cost.", check=boolean())
    max_ngram: int = setting(4, "The longest suffix looked up, in tokens (>= min_ngram).", check=at_least(1))
    # one-token matches are accepted too rarely to be worth verifying (docs/benchmarks.md#sampling-speed)
    min_ngram: int = setting(2, "The shortest suffix looked up, in tokens.", check=at_least(1))

    def __post_init__(self):
        super().__post_init__()
        # the lookup runs from the longest suffix down to the shortest: an empty range would never draft
        if not _unresolved(self.max_ngram) and not _unresolved(self.min_ngram) and self.max_ngram < self.min_ngram:
            _fail(self._AT + "max_ngram", self.max_ngram, f"an integer >= min_ngram ({self.min_ngram})")


@dataclass
class NgramFallbackConfig(DraftNgramConfig):
    """The n-gram draft a trained draft kind (distilled, feature) samples with until its first draft is
    trained; its gamma and adaptive follow the draft's own."""

    gamma: int = setting(II("..gamma"), "Draft tokens per step at most; by default the draft's own gamma.")
    adaptive: bool = setting(II("..adaptive"), "Adapt gamma to measured acceptance; by default the draft's own "
                                               "adaptive.")


@dataclass
class DraftModelConfig(Checked):
    kind: str = setting("model", "model: any causal LM sharing the policy's tokenizer (checked before any work).",
                        check=kind_is("model"))
    source: str = setting("hf", "How name_or_path is loaded: hf (a hub id or save_pretrained folder).")
    name_or_path: str = setting(MISSING, "The draft model's hub id or folder.")
    gamma: int = setting(4, "Draft tokens per step at most (the adaptive controller's ceiling).", check=GAMMA)
    adaptive: bool = setting(True, "Shrink or grow gamma from measured acceptance and cost.", check=boolean())
    dtype: str = setting("float32", "The weights' dtype: float32, bfloat16 or float16.", check=one_of(DTYPES))


@dataclass
class DraftDistilledConfig(Checked):
    kind: str = setting("distilled", "distilled: the run's own small draft (stage=draft, conf/distill); round r "
                                     "uses round r-1's, else runs/<run>/draft.", check=kind_is("distilled"))
    gamma: int = setting(3, "Draft tokens per step at most (the adaptive controller's ceiling).", check=GAMMA)
    adaptive: bool = setting(True, "Shrink or grow gamma from measured acceptance and cost.", check=boolean())
    fallback: NgramFallbackConfig = setting(
        NgramFallbackConfig, "The n-gram draft stage=loop samples with until the first draft is distilled (after "
                             "round 0's SFT).")


@dataclass
class FeatureTrainConfig(Checked):
    """stage=draft's settings for the feature draft (the distilled draft's are the distill group)."""

    num_layers: int = setting(1, "Decoder layers of the draft (EAGLE: 1).", check=at_least(1))
    head_tokens: int = setting(4096, "Output rows: the most frequent completion tokens (+ EOS); 0 = the policy's "
                                     "whole head.", check=at_least(0, "(0 = the policy's whole output layer)"))
    feature_weight: float = setting(1.0, "Weight of the feature regression (smooth L1 to the policy's feature) beside "
                                         "the KL; 0 = the KL alone.", check=non_negative())
    unroll_steps: int = setting(1, "Draft positions trained per step: 2+ read the draft's own predicted features "
                                   "(HASS).", check=at_least(1))
    kl_temperature: float = setting(1.0, "The KL compares p and q tempered by this (the sampler's temperature).",
                                    check=positive())
    more_samples: bool = setting(True, "Also train on earlier rounds' samples and the prefs completions (held out: "
                                       "this round's only).", check=boolean())
    epochs: int = setting(20, "Epochs; cheap, since the policy's features are computed once.",
                          check=at_least(1, UNTRAINED_DRAFT))
    batch_size: int = setting(16, "Sequences per step.", check=at_least(1))
    learning_rate: float = setting(3.0e-3, "AdamW learning rate, decayed linearly to 0.",
                                   check=positive(UNTRAINED_DRAFT))
    weight_decay: float = setting(0.0, "AdamW weight decay.", check=non_negative())
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", check=positive())
    checkpoint_steps: int = setting(200, "Save a resumable checkpoint every N training steps (the last complete one "
                                         "kept, deleted once the draft is saved); a rerun after a kill resumes from "
                                         "it. 0 = none.", check=at_least(0, "(0 = none)"))
    heldout_fraction: float = setting(II("distill.heldout_fraction"),
                                      "Share of the sequences held out for the loss and acceptance measurement.",
                                      check=open_fraction())
    eval_prompts: int = setting(II("distill.eval_prompts"), "Held-out prompts for the acceptance measurement.",
                                check=at_least(1))
    eval_samples: int = setting(II("distill.eval_samples"), "Completions per held-out prompt in the measurement.",
                                check=at_least(1))
    eval_gamma: int = setting(II("distill.eval_gamma"), "The fixed gamma the acceptance is measured with.",
                              check=GAMMA)
    eval_seed: int = setting(II("distill.eval_seed"), "The measurement's sampling seed (the same for trained and "
                                                           "untrained).", check=a_seed())


@dataclass
class DraftFeatureConfig(Checked):
    kind: str = setting("feature", "feature: an EAGLE-style draft layer over the policy's own features and output "
                                   "head (stage=draft trains it).", check=kind_is("feature"))
    gamma: int = setting(3, "Draft tokens per step at most (the adaptive controller's ceiling).", check=GAMMA)
    adaptive: bool = setting(True, "Shrink or grow gamma from measured acceptance and cost.", check=boolean())
    fallback: NgramFallbackConfig = setting(
        NgramFallbackConfig, "The n-gram draft stage=loop samples with until the first draft is trained (after "
                             "round 0's SFT).")
    train: FeatureTrainConfig = setting(FeatureTrainConfig, "How stage=draft trains it.")


@dataclass
class DistillConfig(Checked):
    """The distill group: how stage=draft trains the distilled draft (the policy's architecture with
    few layers, its embeddings, a head over the most frequent completion tokens)."""

    num_layers: int = setting(2, "Decoder layers of the distilled draft.", check=at_least(1))
    head_tokens: int = setting(4096, "Output-layer size: the draft proposes only these tokens (exactness unaffected).",
                               check=at_least(1))
    distill: bool = setting(True, "KL to the policy's distributions; false = cross-entropy on the sampled tokens.",
                            check=boolean())
    epochs: int = setting(4, "Training epochs.", check=at_least(1, UNTRAINED_DRAFT))
    batch_size: int = setting(16, "Sequences per step.", check=at_least(1))
    learning_rate: float = setting(1.0e-3, "AdamW learning rate, decayed linearly to 0.",
                                   check=positive(UNTRAINED_DRAFT))
    heldout_fraction: float = setting(0.1, "Share of the sequences held out for the loss and acceptance measurement.",
                                      check=open_fraction())
    eval_prompts: int = setting(8, "Held-out prompts for the acceptance measurement.", check=at_least(1))
    eval_samples: int = setting(4, "Completions per held-out prompt in the measurement.", check=at_least(1))
    eval_gamma: int = setting(3, "The fixed gamma the acceptance is measured with.", check=GAMMA)
    weight_decay: float = setting(0.0, "AdamW weight decay.", check=non_negative())
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", check=positive())
    eval_seed: int = setting(12345, "The measurement's sampling seed (the same for trained and untrained).",
                             check=a_seed())
    checkpoint_steps: int = setting(200, "Save a resumable checkpoint every N training steps (the last complete one "
                                         "kept, deleted once the draft is saved); a rerun after a kill resumes from "
                                         "it. 0 = none.", check=at_least(0, "(0 = none)"))
