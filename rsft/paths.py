"""The run directory's layout, and which artifact a round reads: the only module that knows either.

    runs/<run_name>/
      prefs/ reward/ draft/                      pairwise labels, reward model, distilled draft
      eval_initial/                              the initial policy's evaluation (the baseline)
      round_00/samples/ prefs/ reward/ scored/ selected/ pairs/ policy/ dpo/ draft/ eval/
                                                 (prefs/ reward/ with loop.refresh_reward, dpo/ with loop.dpo)
      online/                                    stage=online: policy/ kept/ evals/ metrics.json
      plots/ summary.md logs/ wandb/ .lock

How an artifact is written, told complete and checked: rsft.store. What made it and when it may be
reused: rsft.fingerprints. The lock: rsft.lock.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rsft.config import refresh_reward_on
from rsft.errors import ConfigError
from rsft.store import is_complete

log = logging.getLogger(__name__)

class RunPaths:
    """Where every artifact of one run lives, and which artifact a round reads.

    The round rules live here and nowhere else (pinned by tests/test_paths.py's round table):
      round r ends with               round_policy(r): its DPO policy (round_XX/dpo) with loop.dpo, else
                                      its SFT policy (round_XX/policy)
      round r samples from            sampling_policy(r): the policy round r-1 ended with; round 0 the configured one
      round r's SFT starts from       sft_init_policy(r, init): the configured policy (init=initial)
                                      or the policy round r sampled from (init=previous)
      round r's DPO starts from       dpo_init_policy(r): round r's SFT policy, which is also its reference
      eval round r judges             eval_policy(r): the policy round r ended with
      round r's scores come from      scoring_reward(r): round_XX/reward, retrained on the labels of every
                                      round so far, with loop.refresh_reward; else the run's reward/
      ... which trains on             refresh_labels(r): prefs/ (unless the user's pairs stand in) and
                                      round_00/prefs .. round_XX/prefs
      round r prunes with             budget_reward(r): sample.prune / sample.adaptive_k's reward model, the
                                      newest before round r samples (round r-1's refreshed one, else reward/)
      eval (every round) scores with  eval_reward: the run's reward/, the same for every round and the initial
                                      policy, so their numbers stay comparable when scoring follows the policy
      stage=draft round r imitates    draft_teacher(r): round r's policy, the configured one before any
      ... and writes                  draft_output(r): round_XX/draft (serves round r+1), else draft/
      round r's sampler drafts with   sampling_draft(r): round r-1's refreshed draft, else draft/
    "The configured policy" is None: the caller loads conf/policy (rsft.models.load_policy).
    """

    def __init__(self, run_dir: str | os.PathLike, runs_root: str | os.PathLike | None = None,
                 refresh_reward: bool = False, dpo: bool = False):
        self.root = Path(run_dir)
        self.runs_root = Path(runs_root) if runs_root is not None else self.root.parent
        self.refresh_reward = bool(refresh_reward)  # loop.refresh_reward: each round scores with its own reward model
        self.dpo = bool(dpo)  # loop.dpo: each round ends with a DPO step after SFT

    @classmethod
    def from_config(cls, cfg) -> "RunPaths":
        loop = cfg.get("loop") or {}
        return cls(cfg.paths.run_dir, cfg.paths.runs_root, refresh_reward_on(cfg), bool(loop.get("dpo", False)))

    def other_run(self, run_name: str) -> "RunPaths":
        """Another run under the same runs root (loop.reward_from)."""
        return RunPaths(self.runs_root / run_name, self.runs_root, self.refresh_reward, self.dpo)

    # ---- which artifact a round reads ----

    def round_policy(self, round_idx: int) -> Path:
        """The policy round r ends with: its DPO output with loop.dpo, else its SFT output."""
        return self.dpo_policy(round_idx) if self.dpo else self.policy(round_idx)

    def sampling_policy(self, round_idx: int) -> Path | None:
        """The policy round r samples from: the one round r-1 ended with; None (configured) for round 0."""
        return None if round_idx == 0 else self.round_policy(round_idx - 1)

    def dpo_init_policy(self, round_idx: int) -> Path:
        """The policy round r's DPO starts from and keeps as its reference: round r's SFT policy."""
        return self.policy(round_idx)

    @property
    def eval_reward(self) -> Path:
        """The reward model eval scores every policy with: the run's reward/, whatever scored the rounds."""
        return self.reward

    def scoring_reward(self, round_idx: int) -> Path:
        """The reward model that scores round r's samples: round_XX/reward with loop.refresh_reward, else reward/."""
        return self.round_reward(round_idx) if self.refresh_reward else self.reward

    def budget_reward(self, round_idx: int) -> Path:
        """The reward model that prunes round r's rows and spends its adaptive K while it samples: the
        newest one that exists before round r samples (with loop.refresh_reward round r - 1's, since
        round r's own is trained on these samples; else the run's reward/)."""
        return self.round_reward(round_idx - 1) if self.refresh_reward and round_idx > 0 else self.reward

    def refresh_labels(self, round_idx: int) -> list[Path]:
        """The labelled rounds round r's refreshed reward model trains on, with the initial labels
        (prefs/, or the user's reward.data pairs, which are not an artifact): rounds 0 .. r."""
        return [self.round_prefs(r) for r in range(round_idx + 1)]

    def sft_init_policy(self, round_idx: int, init: str) -> Path | None:
        """The policy round r's SFT starts from (sft.init: initial | previous)."""
        if init == "initial":
            return None
        if init == "previous":
            return self.sampling_policy(round_idx)
        raise ConfigError(f"sft.init={init!r}: expected initial (the configured policy) or previous "
                          "(the policy this round sampled from)")

    def eval_policy(self, round_idx: int) -> Path:
        """The policy `eval round=r` judges: the one round r ended with."""
        return self.round_policy(round_idx)

    def draft_teacher(self, round_idx: int) -> Path | None:
        """The policy stage=draft round r imitates: the policy round r ended with once it exists (the one
        round r + 1 samples from), else the configured one."""
        if round_idx >= 0 and is_complete(self.round_policy(round_idx)):
            return self.round_policy(round_idx)
        return None

    def draft_output(self, round_idx: int) -> Path:
        """Where stage=draft round r writes: round_XX/draft (serving round r+1) when round r's policy
        exists, else the run's draft/ (a draft of the configured policy)."""
        return self.draft if self.draft_teacher(round_idx) is None else self.round_draft(round_idx)

    def sampling_draft(self, round_idx: int) -> Path:
        """The distilled draft round r samples with: the one refreshed after round r-1, else draft/."""
        previous = self.round_draft(round_idx - 1) if round_idx > 0 else None
        return previous if previous is not None and is_complete(previous) else self.draft

    # ---- where each artifact lives ----

    def round_dir(self, round_idx: int) -> Path:
        return self.root / f"round_{round_idx:02d}"

    def samples(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "samples"

    def scored(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "scored"

    def selected(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "selected"

    def pairs(self, round_idx: int) -> Path:
        return self.round_dir(round_idx) / "pairs"

    def round_prefs(self, round_idx: int) -> Path:
        """Pairs of round r's samples, labelled (stage=refresh, loop.refresh_reward)."""
        return self.round_dir(round_idx) / "prefs"

    def round_reward(self, round_idx: int) -> Path:
        """The reward model retrained after round r's sampling (stage=refresh), which scores round r."""
        return self.round_dir(round_idx) / "reward"

    def policy(self, round_idx: int) -> Path:
        """The policy SFT trained in round r (what round r + 1 samples from, unless loop.dpo)."""
        return self.round_dir(round_idx) / "policy"

    def dpo_policy(self, round_idx: int) -> Path:
        """The policy DPO trained from round r's SFT policy on round r's pairs (loop.dpo)."""
        return self.round_dir(round_idx) / "dpo"

    def round_draft(self, round_idx: int) -> Path:
        """The draft refreshed after round r's SFT, for sampling round r + 1."""
        return self.round_dir(round_idx) / "draft"

    def eval(self, round_idx: int) -> Path:
        """The evaluation of the policy trained in round r (round_XX/policy)."""
        return self.round_dir(round_idx) / "eval"

    @property
    def initial_eval(self) -> Path:
        """The evaluation of the initial (configured) policy: the baseline every round is compared with."""
        return self.root / "eval_initial"

    @property
    def prefs(self) -> Path:
        return self.root / "prefs"

    @property
    def reward(self) -> Path:
        return self.root / "reward"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    @property
    def online(self) -> Path:
        """stage=online's artifact: the policy it ends with (policy/), the kept completions (kept/), the
        per-mini-batch metrics and the evaluation snapshots (metrics.json, evals/)."""
        return self.root / "online"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def summary(self) -> Path:
        return self.root / "summary.md"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"


# ---- fingerprints ----


