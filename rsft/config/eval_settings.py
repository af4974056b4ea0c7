"""eval: how a policy is evaluated on held-out prompts.
"""

from dataclasses import dataclass
from typing import Optional

from rsft.config.rules import Checked, a_seed, at_least, one_of, setting


@dataclass
class EvalConfig(Checked):
    policy: str = setting("round", "round: the policy round r trained; initial: the configured policy (the baseline).",
                          check=one_of(("round", "initial")))
    num_samples: int = setting(4, "Completions per held-out prompt (distinct-n and win rate use them).",
                               check=at_least(1))
    seed: int = setting(7919, "The same for every policy evaluated: common random numbers, less noisy comparisons.",
                        check=a_seed())
    judge: Optional[str] = setting(None, "A held-out reward model (a folder stage=reward wrote, or a run name) that "
                                         "stands in for gold where there is no oracle.")
