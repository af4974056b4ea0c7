"""loop: the rounds, and the rule that stops them.
"""

from dataclasses import dataclass
from typing import Any, Optional

from rsft.config.online_settings import GuardConfig
from rsft.config.rules import Checked, _fail, at_least, boolean, number, one_of, setting


@dataclass
class StopConfig(Checked):
    """loop.stop (rsft.loop.stop_decision): after each round's evaluation, the round's gain over the policy
    before it (the paired difference on held-out prompts, 95% bootstrap interval over prompts) under the
    truth: eval.judge when set, else gold where the task has an oracle. A round has gained when the interval's
    low end is above min_gain; the loop stops after `patience` rounds in a row that have not."""

    enabled: bool = setting(False, "Stop when the truth's round-over-round gain is not positive for `patience` "
                                   "rounds in a row (needs loop.eval).", check=boolean())
    patience: int = setting(1, "Rounds in a row without a gain before the loop stops.", check=at_least(1))
    min_gain: float = setting(0.0, "The gain a round must show: its paired interval's low end above this.",
                              check=number("a number >= 0", lambda v: v >= 0, ">= 0"))
    truth: str = setting("auto", "The column judged: auto (judge, else gold), judge, gold or reward (the proxy: "
                                 "then the rule measures the proxy, not the truth).",
                         check=one_of(("auto", "judge", "gold", "reward")))


@dataclass
class LoopConfig(Checked):
    """Rounds of sample -> score -> select -> sft (-> eval); prefs and reward are trained first if missing."""

    # gold on held-out prompts rose in every round of the default job (docs/history.md#why-each-default-setting)
    rounds: int = setting(3, "Rounds to run.", check=at_least(1))
    eval: bool = setting(True, "Evaluate the initial policy and every round's policy on the held-out prompts.",
                         check=boolean())
    examples: int = setting(6, "Example completions per round in the wandb table and summary.md; 0 = none.",
                            check=at_least(0, "(0 = none)"))
    reward_from: Optional[str] = setting(None, "Another run_name: reuse its prefs/, reward/ and eval_initial/ (the "
                                               "same judge for baselines).")
    refresh_reward: Any = setting("auto", "Relabel each round's samples and retrain the reward model that scores them "
                                          "(auto: on for the demo task or with refresh.pairs, unless "
                                          "select.strategy=random).", shown_type="bool or auto",
                                  check=boolean("true, false or auto", also=("auto",)))
    dpo: bool = setting(False, "End each round with DPO on its best-vs-worst pairs, from its SFT policy.",
                        check=boolean())
    stop: StopConfig = setting(StopConfig, "Stop the rounds early when they stop paying (off by default; "
                                           "loop.rounds is then the most rounds).")
    guard: GuardConfig = setting(GuardConfig, "The collapse guard: a bound on each round's evaluated range (off by "
                                              "default).")

    def __post_init__(self):
        super().__post_init__()
        # the guard reads each round's evaluation
        if self.guard.metric is not None and self.eval is False:
            _fail("eval", False, f"true with loop.guard.metric={self.guard.metric} (the guard reads each round's "
                                      f"evaluation)")
