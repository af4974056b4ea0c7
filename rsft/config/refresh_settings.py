"""refresh: the reward model following the policy, round by round.
"""

from dataclasses import dataclass
from typing import Optional

from rsft.config.rules import Checked, _fail, _unresolved, at_least, one_of, optional, setting


@dataclass
class RefreshConfig(Checked):
    """With loop.refresh_reward: after round r's sampling, stage=refresh labels pairs of its samples and
    retrains the reward model on every label so far; that model scores round r."""

    samples_per_prompt: int = setting(4, "Demo labels: every pair among the first N completions of a prompt (4 -> 6 "
                                         "pairs).", check=at_least(2, "(pairs need two completions of a prompt)"))
    choose: str = setting("first", "Which pairs of the round are labelled: first (every pair among the first "
                                   "samples_per_prompt completions), random, uncertain (where the reward model that "
                                   "scored the round before is least sure: dropout disagreement) or posterior (one at "
                                   "a time where its head's Bayesian posterior is least sure, each pick counted "
                                   "before the next), label_budget of them.",
                          check=one_of(("first", "random", "uncertain", "posterior")))
    label_budget: Optional[int] = setting(None, "With choose=random, uncertain or posterior: pairs to label per round "
                                                "(null = as many as choose=first labels).",
                                          check=optional(at_least(1)))
    dropout_passes: int = setting(8, "With choose=uncertain: dropout masks per completion to measure disagreement.",
                                  check=at_least(2))
    pairs: Optional[str] = setting(None, "Your own labels instead: a folder with round_00.jsonl, round_01.jsonl, ... "
                                         "(pairs of that round's samples).")
    init: str = setting("previous", "scratch: the backbone with a fresh head; previous: continue training the reward "
                                    "model that scored round r - 1.", check=one_of(("scratch", "previous")))
    epochs: Optional[int] = setting(1, "With init=previous: epochs on the pooled labels (null = reward.epochs).",
                                    check=optional(at_least(1, "or null (= reward.epochs); 0 would train nothing, yet "
                                                               "save the previous reward model as retrained: "
                                                               "loop.refresh_reward=false keeps one reward model")))

    def __post_init__(self):
        super().__post_init__()
        if _unresolved(self.choose) or _unresolved(self.label_budget):
            return
        if self.label_budget is not None and self.choose == "first":
            _fail("label_budget", self.label_budget, "null with refresh.choose=first, which labels every pair "
                  "among the first samples_per_prompt completions; set refresh.choose=random, uncertain or posterior "
                  "to spend a budget")
        if self.choose != "first" and self.pairs is not None and not _unresolved(self.pairs):
            _fail("choose", self.choose, "first with refresh.pairs, whose labels are read as they are; to "
                  "label only the pairs the reward model is least sure of, export them with "
                  "`python scripts/pairs_to_label.py` and label those")
