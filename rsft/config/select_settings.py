"""select: which scored completions SFT trains on.
"""

from dataclasses import dataclass
from typing import Optional

from rsft.config.rules import (
    Checked,
    _fail,
    _integer,
    at_least,
    boolean,
    non_negative,
    number,
    one_of,
    optional,
    positive,
    setting,
    typed,
)


SELECT_STRATEGIES = ("top_k", "threshold", "random", "advantage")
SELECT_WEIGHTS = ("none", "rarity", "difficulty")
SELECT_WEIGHT_SCALES = ("row", "prompt")
ADVANTAGE_SCALES = ("none", "std")
SELECT_REJECTED = ("pool", "newest_round")


@dataclass
class SelectConfig(Checked):
    strategy: str = setting("top_k", "top_k (k=1: best-of-K) | threshold | random (the baseline: k random survivors "
                                     "per prompt) | advantage (every survivor whose reward differs from its prompt's "
                                     "mean in its round, wrong answers too, each weighted in SFT's loss by that "
                                     "difference: the right answers pushed up, the wrong ones down, as a policy "
                                     "gradient with a per-prompt baseline; min_reward and k do not apply; a collapse "
                                     "lever, issue 48, measured to break the verifiable task's policy at the "
                                     "recipe's SFT step: docs/diversity.md; stage=online weighs each mini-batch "
                                     "alike, a step holding the whole mini-batch).", check=one_of(SELECT_STRATEGIES))
    k: int = setting(1, "Completions kept per prompt by top_k and random (>= 1 there).")
    threshold: Optional[float] = setting(0.0, "strategy=threshold: keep every survivor with reward_normalised >= this.",
                                         check=optional(typed(float, "a number (a reward_normalised value) or null")))
    drop_empty: bool = setting(True, "Drop completions with no visible text.", check=boolean())
    drop_truncated: bool = setting(True, "Drop completions cut at sample.max_new_tokens (finish_reason length).",
                                   check=boolean())
    dedupe: bool = setting(True, "Identical completions (after strip) count once.", check=boolean())
    # all earlier rounds, as Llama 2 did: with sft.init=initial the kept set must carry what earlier rounds
    # learned
    pool_rounds: int = setting(-1, "Also rank the scored samples of this many earlier rounds (-1 = all, 0 = this round "
                                   "only).",
                               check=at_least(-1, "(-1 = all earlier rounds)"))
    pairs: bool = setting(True, "Also write pairs/ (best vs worst survivor per prompt, TRL preference format) for DPO.",
                          check=boolean())
    rejected: str = setting("pool", "A pair's rejected answer: pool = the worst survivor of the pooled rounds; "
                                    "newest_round = the worst of those drawn in the prompt's newest round (the "
                                    "policy's own mistakes, as iterative DPO pairs; the same without pooling).",
                            check=one_of(SELECT_REJECTED))
    prefer_complete: bool = setting(True, "With drop_truncated=false: truncated completions rank after every "
                                          "complete one.", check=boolean())
    max_opening_share: Optional[float] = setting(None, "At most this share of the kept set may open with the same 5 "
                                                       "words (a collapse lever, e.g. 0.2; in (0, 1], where 1 caps "
                                                       "nothing); null = no cap.",
                                                 check=optional(number("a fraction in (0, 1] or null (no cap)",
                                                                       lambda v: 0 < v <= 1, "in (0, 1]")))
    truncated_penalty: Optional[float] = setting(None, "With drop_truncated=false: a truncated completion ranks by "
                                                       "reward_normalised less this (reward std units, >= 0); null = "
                                                       "prefer_complete decides.", check=optional(non_negative()))
    min_reward: Optional[float] = setting(None, "top_k and threshold: never keep a completion whose reward_normalised "
                                                "is below this (a verifier's 1.0 keeps only passed answers; the random "
                                                "baseline ignores it); null = off.", check=optional(typed(float, "a number or null")))
    diversity: float = setting(0.0, "top_k only: pick by reward_normalised - this x the share of a completion's word "
                                    "bigrams the kept set already has (a collapse lever, >= 0; 0 = off).",
                               check=non_negative())
    # issue 48 (collapse): of equally rewarded answers (a verifier's right ones), keep the rare ones first
    rarity: bool = setting(False, "Among candidates of equal reward, rank first the text fewest of the prompt's "
                                  "candidates gave (case and spacing aside; every pooled round's count): a rare right "
                                  "answer is kept before a common one (a collapse lever; false = the newer round, then "
                                  "the lower sample index, first).", check=boolean())
    # issue 48: several distinct right answers per prompt, a rare one weighing more in SFT's loss than a common one
    weight: str = setting("none", "rarity: each kept row's SFT loss is weighted by 1 / how many of the prompt's "
                                  "candidates gave its text (case and spacing aside; every pooled round's count), "
                                  "scaled so that a prompt's kept rows average 1 (weight_scale=prompt: sum to 1) (a "
                                  "collapse lever; needs several kept per prompt: top_k with k >= 2, or threshold); "
                                  "difficulty: each kept row's weight is the share of its prompt's samples in the "
                                  "round it was drawn from that fail select.min_reward, scaled so that the kept set's "
                                  "rows average 1: an answer to a prompt the policy already solves every time teaches "
                                  "nothing more and only sharpens it (as GRPO's advantage is 0 there; a collapse "
                                  "lever; needs select.min_reward); none = every row weighs 1.",
                          check=one_of(SELECT_WEIGHTS))
    # issue 48: what a prompt's kept rows weigh together, so that a prompt with many right answers does not outweigh
    # a hard one with a single right answer
    weight_scale: str = setting("row", "With weight=rarity, what a prompt's kept rows weigh together: row = they "
                                       "average 1 (a prompt with n kept rows weighs n); prompt = they sum to 1 (every "
                                       "prompt weighs one row, as with k=1, however many answers it kept; the "
                                       "cross-entropy's scale falls with the rows kept per prompt, so an sft.kl term "
                                       "weighs relatively more).",
                                check=one_of(SELECT_WEIGHT_SCALES))
    # issue 48: GRPO's scale_rewards=group, the one part of its advantage strategy=advantage left out
    advantage_scale: str = setting("none", "With strategy=advantage, what a prompt's reward differences are divided "
                                           "by: none = nothing (a prompt answered right half the time pushes hardest); "
                                           "std = the standard deviation of its candidates' rewards in their round "
                                           "(Bessel's, as GRPO's scale_rewards=group; every prompt that is not tied "
                                           "pushes alike, a rare right or wrong answer hardest).",
                                   check=one_of(ADVANTAGE_SCALES))
    # issue 48: W-REINFORCE's weighting (Zhu et al. 2025), the negative answers' push kept, the positive ones' cut
    advantage_positive: float = setting(1.0, "With strategy=advantage, the factor on the weights of answers above "
                                             "their prompt's mean, after the scale (W-REINFORCE's lambda, 0.1 in Zhu "
                                             "et al. 2025): below 1 pushing wrong answers down outweighs pushing "
                                             "right ones up, which spreads the freed probability over the other "
                                             "answers in proportion to what they had rather than onto the kept ones.",
                                        check=positive("(0 would leave SFT only wrong answers to push down, "
                                                       "which it refuses; set a small factor such as 0.01)"))

    def __post_init__(self):
        super().__post_init__()
        # k counts what top_k and random keep, so there it is >= 1; strategy=threshold does not read it
        _integer("k", self.k, 1 if self.strategy in ("top_k", "random") else None)
        # strategy=threshold keeps by the threshold alone: it needs one
        if self.threshold is None and self.strategy == "threshold":
            _fail("threshold", self.threshold, "a number (a reward_normalised value) for strategy=threshold")
        # a pass rate needs a pass: select.min_reward; the random baseline keeps no reward's order
        if self.weight == "difficulty" and (self.min_reward is None or self.strategy == "random"):
            _fail("weight", self.weight, f"none or rarity here, or difficulty with select.min_reward set (what counts "
                                         f"as a pass) and strategy top_k or threshold (min_reward={self.min_reward}, "
                                         f"strategy={self.strategy} here)")
        # a weight within a prompt's kept rows needs several of them; the random baseline keeps no reward's order
        if self.weight == "rarity" and (self.strategy == "random" or (self.strategy == "top_k" and self.k < 2)):
            _fail("weight", self.weight, f"none with strategy={self.strategy} k={self.k}: a weight within a prompt's "
                                         "kept rows needs top_k with k >= 2 or strategy=threshold")
        # strategy=advantage weighs its rows itself, every one of a prompt's (they sum to 0 per prompt): a cap or a
        # diversity pick would drop some and leave the prompt's push unbalanced
        if self.strategy == "advantage":
            why = ("with strategy=advantage: the strategy weighs every row it keeps itself (its reward less its "
                   "prompt's mean), and a prompt's rows must all stay")
            if self.weight != "none":
                _fail("weight", self.weight, f"none {why}")
            if self.max_opening_share is not None:
                _fail("max_opening_share", self.max_opening_share, f"null {why}")
            if self.diversity:
                _fail("diversity", self.diversity, f"0 {why}")
        if self.advantage_scale != "none" and self.strategy != "advantage":
            _fail("advantage_scale", self.advantage_scale, f"none with strategy={self.strategy}: the scale applies to "
                                                           f"strategy=advantage's reward differences")
        if self.advantage_positive != 1 and self.strategy != "advantage":
            _fail("advantage_positive", self.advantage_positive, f"1 with strategy={self.strategy}: the factor applies "
                                                                 f"to strategy=advantage's weights above the mean")
        if self.weight_scale != "row" and self.weight != "rarity":
            _fail("weight_scale", self.weight_scale, f"row with weight={self.weight}: the scale applies to a weight "
                                                     "(select.weight=rarity)")
