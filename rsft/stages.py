"""The stages, each declared once: the config it reads, what it reads and writes, what it does.

    python -m rsft.run stage=<name>

A stage is this declaration plus one build function in its module (rsft.<name>: plan + build, see
rsft.runner). Everything about a stage that is not its computation derives from the declaration:
  - rsft.preflight checks the groups of the keys it reads before any work;
  - rsft.runner fingerprints its artifact from the keys it reads (`reads`; not `uses`, and not the
    keys that never change a result, UNCOUNTED, nor a setting at its off value, WHILE_OFF);
  - tests/test_declared_reads.py runs every stage with a config that records each key read and
    fails on a key the declaration does not name;
  - `--help` and the README's stage table (scripts/gen_docs.py) print `reads_doc`, `writes`, `does`;
  - stage=loop runs the round steps in this list's order, through the same runner.
Modules are imported on use, so `stage=sample` does not load TRL. This module imports nothing of rsft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class When:
    """Config keys a stage reads only while `holds(cfg)`: fingerprinted (or used) then, left out otherwise;
    checked either way."""

    keys: tuple[str, ...]
    holds: Callable[[Any], bool]
    doc: str  # the condition in words, for docs/run-directory.md


Keys = tuple  # of str (a key or a whole group) and When


# The keys every command reads to find its way (the run directory, the round table, the device);
# checked always, fingerprinted never: where an artifact lives is not what it holds.
EVERY_STAGE: Keys = ("stage", "run_name", "round", "overwrite", "device", "threads", "paths", "logger",
                     "loop.refresh_reward", "loop.dpo", "data.kind", "refresh.pairs", "select.strategy",
                     "reward_source.kind", "reward_source.components")

# Config leaves (by name, in any group) that never change what an artifact holds: how often progress is
# shown, logged or saved to resume from, and how many rows are scored at a time. Never fingerprinted.
UNCOUNTED = frozenset({"progress", "logging_steps", "score_batch_size", "shard_prompts", "score_shard_rows",
                       "checkpoint_steps", "checkpoint_every"})


# Settings left out of every fingerprint while they are at their "off" value (flattened key or key prefix ->
# is-off test of the config), so an artifact made before the setting existed still matches while it
# stays off, and a setting that changes nothing in this configuration does not refuse an artifact.
WHILE_OFF: dict[str, Callable[[Any], bool]] = {
    "select.truncated_penalty": lambda cfg: cfg.select.get("truncated_penalty") is None,
    "select.diversity": lambda cfg: float(cfg.select.get("diversity") or 0.0) == 0.0,
    "select.min_reward": lambda cfg: cfg.select.get("min_reward") is None,
    "reward.label_smoothing": lambda cfg: float(cfg.reward.get("label_smoothing") or 0.0) == 0.0,
    "sample.prune.": lambda cfg: cfg.sample.get("prune") is None or not cfg.sample.prune.at,
    "sample.adaptive_k.": lambda cfg: cfg.sample.get("adaptive_k") is None or cfg.sample.adaptive_k.k0 == 0,
    "sample.backend": lambda cfg: cfg.sample.get("backend", "rsft") != "vllm",
    "sample.vllm.": lambda cfg: cfg.sample.get("backend", "rsft") != "vllm",
    # each completion has its own random stream (its key) and a packed forward gives every row a plain forward's logits:
    # the rows per forward change nothing while sampling plainly
    "sample.batch_rows": lambda cfg: cfg.get("stage") == "sample" and cfg.draft.kind == "none",
    "prefs.batch_rows": lambda cfg: True,  # prefs samples plainly, always
    # a CUDA graph's fixed-shape step computes the packed step's draws: only the float rounding of the forward differs
    "sample.cuda_graphs": lambda cfg: True,
    "prefs.cuda_graphs": lambda cfg: True,
    # the run's own trained model is an input artifact (its folder's digest), not a setting
    "reward_source.": lambda cfg: cfg.reward_source.kind == "trained",
    # how a server is asked (its scores are what they are): never in a fingerprint
    "reward_source.timeout": lambda cfg: True,
    "reward_source.retries": lambda cfg: True,
    "reward_source.batch_size": lambda cfg: True,
    # counted through the K it chose for the round (sample.num_samples, resolved by rsft.auto_k)
    "sample.auto_k.": lambda cfg: True,
    # the labels' choice of pairs: refresh.choose=first is how every round was labelled before it existed
    "refresh.choose": lambda cfg: cfg.refresh.get("choose", "first") == "first",
    "refresh.label_budget": lambda cfg: cfg.refresh.get("choose", "first") == "first",
    "refresh.dropout_passes": lambda cfg: cfg.refresh.get("choose", "first") != "uncertain",
    "sft.kl": lambda cfg: float(cfg.sft.get("kl") or 0.0) == 0.0,
    "sft.loss": lambda cfg: cfg.sft.get("loss", "ce") == "ce",
    "sft.gem_beta": lambda cfg: cfg.sft.get("loss", "ce") != "gem",
    "sft.merge_weight": lambda cfg: cfg.sft.get("merge_weight", 1.0) == 1,
    "sft.merge_at": lambda cfg: cfg.sft.get("merge_weight", 1.0) == 1,
    "online.kl": lambda cfg: float(cfg.online.get("kl") or 0.0) == 0.0,
    "online.loss": lambda cfg: cfg.online.get("loss", "ce") == "ce",
    "online.gem_beta": lambda cfg: cfg.online.get("loss", "ce") != "gem",
    "select.rarity": lambda cfg: not cfg.select.get("rarity"),
    "select.weight": lambda cfg: cfg.select.get("weight", "none") == "none",
    "select.weight_scale": lambda cfg: cfg.select.get("weight_scale", "row") == "row",
    "select.advantage_scale": lambda cfg: cfg.select.get("advantage_scale", "none") == "none",
    "select.advantage_positive": lambda cfg: float(cfg.select.get("advantage_positive", 1.0)) == 1.0,
    "online.advantage_share": lambda cfg: not cfg.online.get("advantage_share", False),
    "online.tempered_loss": lambda cfg: not cfg.online.get("tempered_loss", False),
    "sft.tempered_loss": lambda cfg: not cfg.sft.get("tempered_loss", False),
    "sft.loss_temperature": lambda cfg: cfg.sft.get("loss_temperature", 1.0) == 1,
    "select.rejected": lambda cfg: cfg.select.get("rejected", "pool") == "pool",
    "online.guard.kl_factor": lambda cfg: cfg.online.guard.get("action") != "raise_kl",
    "online.guard.widen_k": lambda cfg: True,  # online refuses widen_select: the key never acts there
}

# the keys a prompt set depends on (data=hh_rlhf reads one transcript file for both sets, split by a seeded hash)
_HH = When(("data.path", "data.split", "data.data_dir", "data.eval_fraction", "data.split_seed"),
           lambda cfg: cfg.data.kind == "hh_rlhf", "data=hh_rlhf")
PROMPT_SET: Keys = ("data.kind", "data.name", "data.config_name", "data.prompt_column", "data.id_column",
                    "data.system_prompt", _HH, When(("data.seed", "data.held_out"),
                                                     lambda cfg: cfg.data.kind == "checkable", "data=checkable"))
TRAIN_PROMPTS: Keys = (*PROMPT_SET, "data.path", "data.split", "data.limit", "data.rotate")
EVAL_PROMPTS: Keys = (*PROMPT_SET, "data.eval_path", "data.eval_split", "data.eval_limit")
# the sample settings that shape a completion (not num_samples, not batch_rows)
SAMPLING: Keys = ("sample.max_new_tokens", "sample.temperature", "sample.top_k", "sample.top_p", "sample.strategy",
                  "sample.leniency")
ENGINE: Keys = ("sample.backend", "sample.vllm")  # the vLLM engine's settings (WHILE_OFF with backend=rsft)
_FEATURE = lambda cfg: cfg.draft.kind == "feature"  # noqa: E731
_OWN_LABELS = lambda cfg: cfg.refresh.get("pairs") is not None  # noqa: E731
_SPENDS = lambda cfg: bool(cfg.sample.prune.at) or cfg.sample.adaptive_k.k0 > 0  # noqa: E731


@dataclass(frozen=True)
class Stage:
    name: str
    module: str                # plan(cfg, paths) -> rsft.runner.Plan and build(cfg, job) -> rsft.runner.Built
    reads: Keys                # config keys (or groups) that shape its artifact: checked and fingerprinted
    reads_doc: str             # for --help and the README
    writes: str
    does: str
    uses: Keys = ()            # keys it reads that do not shape its artifact: checked, not fingerprinted
    round_step: bool = False   # one of the stages stage=loop runs every round, in this list's order
    loop_switch: str = ""      # a round step that runs only when this RunPaths switch is on
    one_process: bool = False  # its build runs on the main process only (hand-written training loops)
    artifact: bool = True      # False: a driver that runs other stages (stage=loop)
    in_loop: bool = True       # False: stage=loop never runs it (its groups are not checked with the loop's)
    lowest_round: int = 0      # the lowest `round` it takes (stage=draft: -1, the policy before any SFT)


STAGES = (
    Stage("prefs", "rsft.prefs",
          # sample before prefs: the prefs group takes its sampling values from sample's (${sample.*}), so a bad
          # value is named where the user set it
          reads=("policy", *PROMPT_SET, "data.path", "data.split", *ENGINE, "prefs",
                 When(("data.limit",), lambda cfg: cfg.prefs.num_prompts is None, "prefs.num_prompts=null")),
          uses=("prefs.batch_rows", "sample.shard_prompts", "data.limit", "data.rotate"),
          reads_doc="policy, demo prompts", writes="`prefs/`",
          does="samples completions of the initial policy and labels pairs of them with simulated annotators "
               "(hard or soft), from the demo task's gold oracle"),
    Stage("reward", "rsft.train_reward", reads=("reward",), reads_doc="`prefs/` or your pairs", writes="`reward/`",
          does="trains the Bradley-Terry reward model (TRL RewardTrainer, soft labels); held-out accuracy"),
    Stage("sample", "rsft.sample", reads=("seed", "round", "policy", *TRAIN_PROMPTS, "sample", "draft",
                                          When(("reward_source",), _SPENDS, "pruning or adaptive K")),
          reads_doc="the round's policy, prompts", writes="`round_XX/samples/`",
          does="K completions per prompt, plain or speculative (`draft=`), with provenance and acceptance counts",
          round_step=True),
    Stage("labels", "rsft.labels",
          reads=("round", When(("refresh.samples_per_prompt", "prefs.tau", "prefs.soft", "prefs.test_fraction",
                                "prefs.seed", "refresh.choose", "refresh.label_budget", "refresh.dropout_passes"),
                      lambda cfg: not _OWN_LABELS(cfg), "simulated labels"),
                 When(("refresh.pairs", "reward.data.format", "reward.data.label_column", "reward.data.eval_fraction",
                       "reward.seed"), _OWN_LABELS, "refresh.pairs set")),
          reads_doc="samples, or your `refresh.pairs`", writes="`round_XX/prefs/`",
          does="labels pairs of the round's samples (simulated), or reads your labels of them (`refresh.pairs`), "
               "for the refreshed reward model", round_step=True, loop_switch="refresh_reward"),
    Stage("refresh", "rsft.refresh", reads=("round", "reward", "refresh.init", "refresh.epochs"),
          uses=("refresh", "reward_source.kind", "reward_source.components"),
          reads_doc="every round's labels so far", writes="`round_XX/reward/`",
          does="retrains the reward model on every label so far (stage=labels of rounds 0..r first); that model "
               "scores the round", round_step=True, loop_switch="refresh_reward"),
    Stage("score", "rsft.score", reads=("reward_source",), uses=("reward.score_shard_rows",),
          reads_doc="samples, the round's reward model", writes="`round_XX/scored/`",
          does="the reward model's raw and normalised score of each completion", round_step=True),
    Stage("select", "rsft.select", reads=("seed", "round", "select", "data.system_prompt"),
          uses=(When(("dpo.min_margin",), lambda cfg: cfg.loop.dpo and cfg.select.pairs,
                     "loop.dpo and select.pairs"),),
          reads_doc="scored (+ earlier rounds)", writes="`round_XX/selected/`, `round_XX/pairs/`",
          does="best-of-K (top-k, threshold, or the random baseline) after filters; best-vs-worst pairs for DPO",
          round_step=True),
    Stage("sft", "rsft.sft", reads=("seed", "round", "sft", "data.system_prompt", "policy",
                                    When(("sample.temperature",), lambda cfg: cfg.sft.get("tempered_loss", False),
                                         "sft.tempered_loss=true")),
          reads_doc="selected", writes="`round_XX/policy/`",
          does="TRL SFTTrainer (LoRA, merged, or full) on the kept completions, loss on the completion only",
          round_step=True),
    Stage("dpo", "rsft.dpo", reads=("seed", "round", "dpo"), uses=("policy",),
          reads_doc="SFT policy, pairs", writes="`round_XX/dpo/`",
          does="TRL DPOTrainer on the round's best-vs-worst pairs, from the round's SFT policy (also the reference)",
          round_step=True, loop_switch="dpo"),
    Stage("draft", "rsft.draft",
          reads=("seed", "round", When(("draft.kind", "draft.train"), _FEATURE, "draft=feature"),
                 When(("distill",), lambda cfg: not _FEATURE(cfg), "draft=distilled"), "policy",
                 "data.system_prompt", *SAMPLING,
                 "sample.batch_rows"),
          uses=("draft", "sample.cuda_graphs"),
          reads_doc="samples, the round's policy", writes="`draft/`, `round_XX/draft/`",
          does="trains a distilled or feature draft on the policy's own samples, for the speculative sampler",
          one_process=True, lowest_round=-1),
    Stage("eval", "rsft.eval", reads=("eval", "policy", *SAMPLING, *ENGINE, *EVAL_PROMPTS, "reward_source"),
          uses=("sample.shard_prompts", "sample.batch_rows", "sample.cuda_graphs", "reward.score_batch_size"),
          reads_doc="a policy, held-out prompts", writes="`eval_initial/`, `round_XX/eval/`",
          does="reward, gold or judge score with intervals, win rates, diversity and length on held-out prompts"),
    Stage("online", "rsft.online",
          reads=("seed", "policy", *TRAIN_PROMPTS, "sample", "draft", "select", "online", "reward_source",
                 When(("eval.num_samples", "eval.seed", "eval.judge", "data.eval_path", "data.eval_split",
                       "data.eval_limit"), lambda cfg: cfg.online.eval_every > 0, "online.eval_every > 0"),
                 When(("reward", "refresh.init", "refresh.epochs", "refresh.samples_per_prompt", "refresh.choose",
                       "refresh.label_budget", "refresh.dropout_passes", "prefs.tau", "prefs.soft",
                       "prefs.test_fraction", "prefs.seed"),
                      lambda cfg: cfg.online.refresh_every > 0, "online.refresh_every > 0")),
          reads_doc="policy, the train prompt stream, the reward", writes="`online/`",
          does="the policy learns while it samples: per mini-batch of prompts sample, score, select and take a few "
               "optimiser steps (LoRA or full), resumable; eval snapshots against tokens sampled",
          in_loop=False),
    Stage("loop", "rsft.loop", reads=(), uses=("loop", "draft.kind", "draft.fallback", "eval.policy", "reward.data.path"),
          artifact=False,
          reads_doc="everything", writes="everything, `plots/`, `summary.md`",
          does="prefs and reward if missing, then rounds of sample (labels refresh) score select sft (dpo) "
               "(draft) (eval)"),
)

BY_NAME = {stage.name: stage for stage in STAGES}
ROUND_STEPS = tuple(stage for stage in STAGES if stage.round_step)


def get(name: str) -> Stage:
    """The stage called `name`; a KeyError listing the valid ones otherwise."""
    if name not in BY_NAME:
        raise KeyError(f"stage={name!r} is not a stage; valid stages: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def _keys(declared: Keys, cfg: Any | None) -> list[str]:
    """The keys of a declaration; with a cfg only those whose When holds, without one all of them."""
    out: list[str] = []
    for entry in declared:
        if isinstance(entry, When):
            if cfg is None or entry.holds(cfg):
                out += entry.keys
        else:
            out.append(entry)
    return list(dict.fromkeys(out))


def counted_keys(stage: Stage, cfg: Any) -> list[str]:
    """The keys a stage's fingerprint is made of, for this config (rsft.runner)."""
    return _keys(stage.reads, cfg)


def declared_keys(stage: Stage, cfg: Any | None = None) -> list[str]:
    """Every key a stage may read: its reads and uses, and what every stage reads."""
    return _keys((*stage.reads, *stage.uses, *EVERY_STAGE), cfg)


def _reads(declared: list[str], key: str) -> bool:
    """`key` is among the declared keys, or inside a group or section declared whole."""
    return any(d == key or key.startswith(d + ".") for d in declared)


def reads_num_samples(stage: Stage, cfg: Any) -> bool:
    """Whether the stage reads sample.num_samples (rsft.auto_k chooses it for the round first)."""
    return _reads(declared_keys(stage, cfg), "sample.num_samples")


def command_reads(name: str, cfg: Any, key: str) -> bool:
    """Whether command `name` reads config key `key` (a key one of its stages declares, or the group or section
    declared whole that holds it; with cfg's Whens): a rule across groups applies to the commands that read what it
    is about (rsft.config.check_across_groups), whatever their names."""
    return any(_reads(_keys((*stage.reads, *stage.uses), cfg), key) for stage in commands_stages(name))


def lowest_round(name: str) -> int:
    """The lowest `round` command `name` takes (0 for a name that is no stage: rsft.run refuses those itself)."""
    return min((stage.lowest_round for stage in STAGES if stage.name == name), default=0)


def commands_stages(name: str) -> tuple[Stage, ...]:
    """The stages a command runs: its own, or for stage=loop every stage it runs (all but stage=online)."""
    return tuple(stage for stage in STAGES if stage.in_loop) if name == "loop" else (get(name),)


def groups_read(name: str, cfg: Any | None = None) -> tuple[str, ...]:
    """The config groups a command reads (the first part of every key its stages declare, not EVERY_STAGE's
    layout keys), in declaration order; with a cfg, only the keys whose When holds. rsft.preflight checks them."""
    groups: dict[str, None] = {}
    for stage in commands_stages(name):
        for key in _keys((*stage.reads, *stage.uses), cfg):
            groups.setdefault(key.split(".")[0], None)
    return tuple(groups)


def help_lines() -> str:
    """One line per stage for `--help`."""
    return "\n".join(f"  {stage.name:<8}{stage.does}" for stage in STAGES)


def _described(declared: Keys) -> str:
    parts: list[str] = []
    for entry in declared:
        if isinstance(entry, When):
            parts.append(f"{', '.join(f'`{k}`' for k in entry.keys)} (with {entry.doc})")
        elif f"`{entry}`" not in parts:
            parts.append(f"`{entry}`")
    return ", ".join(parts) or "none"


def fingerprint_table() -> str:
    """docs/run-directory.md's table of what each stage's artifact is fingerprinted from (its inputs and user
    files are decided by its plan)."""
    rows = ["| stage | config keys in its fingerprint | also read, not in it |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {_described(s.reads)} | {_described(s.uses) if s.uses else ''} |"
             for s in STAGES if s.artifact]
    rows += ["", "Never in a fingerprint: the leaves " + ", ".join(f"`{k}`" for k in sorted(UNCOUNTED))
             + " in any group; while off: " + ", ".join(f"`{k.rstrip('.')}`" for k in WHILE_OFF) + "."]
    return "\n".join(rows)


def markdown_table() -> str:
    """The README's stage table."""
    rows = ["| stage | reads | writes | what it does |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.reads_doc} | {s.writes} | {s.does} |" for s in STAGES]
    return "\n".join(rows)
