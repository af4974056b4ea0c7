"""The stages, listed once: name, module, the config groups it reads, what it reads and writes.

    python -m rsft.run stage=<name>

`rsft.run` dispatches and builds `--help` from this list, `rsft.checks` checks the groups a stage
reads before it runs, `rsft.loop` takes a round's stages from it, and the README's stage table is
generated from it (scripts/gen_docs.py; tests/test_docs.py fails when the README is out of date).
Modules are imported on use, so `stage=sample` does not load TRL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    module: str                # exposes run(cfg, tracker=None) -> rsft.paths.Artifact (path and record)
    groups: tuple[str, ...]    # config groups it reads (besides policy and the top-level keys); checked first
    reads: str
    writes: str
    does: str
    round_step: bool = False   # one of the stages stage=loop runs every round, in this list's order
    loop_switch: str = ""      # a round step that runs only when this loop.* setting is on


STAGES = (
    Stage("prefs", "rsft.prefs", ("sample", "prefs", "data"), "policy, demo prompts", "`prefs/`",
          "samples completions of the initial policy and labels pairs of them with simulated annotators "
          "(hard or soft), from the demo task's gold oracle"),
    Stage("reward", "rsft.reward", ("reward",), "`prefs/` or your pairs", "`reward/`",
          "trains the Bradley-Terry reward model (TRL RewardTrainer, soft labels); held-out accuracy"),
    Stage("sample", "rsft.sample", ("sample", "draft", "data"), "the round's policy, prompts",
          "`round_XX/samples/`",
          "K completions per prompt, plain or speculative (`draft=`), with provenance and acceptance counts",
          round_step=True),
    Stage("refresh", "rsft.refresh", ("refresh", "prefs", "reward", "data"), "samples, earlier labels",
          "`round_XX/prefs/`, `round_XX/reward/`",
          "labels pairs of the round's samples (simulated, or your `refresh.pairs`) and retrains the reward "
          "model on every label so far; that model scores the round", round_step=True, loop_switch="refresh_reward"),
    Stage("score", "rsft.score", ("refresh",), "samples, the round's reward model", "`round_XX/scored/`",
          "the reward model's raw and normalised score of each completion", round_step=True),
    Stage("select", "rsft.select", ("select", "data"), "scored (+ earlier rounds)",
          "`round_XX/selected/`, `round_XX/pairs/`",
          "best-of-K (top-k, threshold, or the random baseline) after filters; best-vs-worst pairs for DPO",
          round_step=True),
    Stage("sft", "rsft.sft", ("sft", "data"), "selected", "`round_XX/policy/`",
          "TRL SFTTrainer (LoRA, merged, or full) on the kept completions, loss on the completion only",
          round_step=True),
    Stage("dpo", "rsft.dpo", ("dpo",), "SFT policy, pairs", "`round_XX/dpo/`",
          "TRL DPOTrainer on the round's best-vs-worst pairs, from the round's SFT policy (also the reference)",
          round_step=True, loop_switch="dpo"),
    Stage("draft", "rsft.draft", ("sample", "data", "draft"), "samples, the round's policy",
          "`draft/`, `round_XX/draft/`",
          "trains a distilled or feature draft on the policy's own samples, for the speculative sampler"),
    Stage("eval", "rsft.eval", ("eval", "sample", "data"), "a policy, held-out prompts",
          "`eval_initial/`, `round_XX/eval/`",
          "reward, gold or judge score with intervals, win rates, diversity and length on held-out prompts"),
    Stage("loop", "rsft.loop", (), "everything", "everything, `plots/`, `summary.md`",
          "prefs and reward if missing, then rounds of sample (refresh) score select sft (dpo) (draft) (eval)"),
)

BY_NAME = {stage.name: stage for stage in STAGES}
ROUND_STEPS = tuple(stage for stage in STAGES if stage.round_step)


def get(name: str) -> Stage:
    """The stage called `name`; a KeyError listing the valid ones otherwise."""
    if name not in BY_NAME:
        raise KeyError(f"stage={name!r} is not a stage; valid stages: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def groups_read(name: str) -> tuple[str, ...]:
    """The config groups a command reads: its stage's, or for stage=loop those of every stage it runs."""
    if name == "loop":
        seen = {"loop": None}
        for stage in STAGES:
            seen.update(dict.fromkeys(stage.groups))
        return tuple(seen)
    return get(name).groups


def help_lines() -> str:
    """One line per stage for `--help`."""
    return "\n".join(f"  {stage.name:<8}{stage.does}" for stage in STAGES)


def markdown_table() -> str:
    """The README's stage table."""
    rows = ["| stage | reads | writes | what it does |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.reads} | {s.writes} | {s.does} |" for s in STAGES]
    return "\n".join(rows)
