"""The top level of the config (run_name, seed, threads, ...) and paths.
"""

import os
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from rsft import stages
from rsft.config.rules import (
    Check,
    Checked,
    _fail,
    _group,
    _integer,
    _typed,
    _unresolved,
    a_seed,
    boolean,
    check_fields,
    setting,
)


@dataclass
class RunConfig(Checked):
    """The whole config: one field per group (the chosen option's own dataclass is its schema), then the
    settings every command reads. conf/config.yaml picks each group's default option."""

    paths: Any = _group("Where runs and the provisioned-model cache live (conf/paths/).")
    policy: Any = _group("The model that samples and is fine-tuned (conf/policy/).")
    draft: Any = _group("The draft that proposes tokens for speculative sampling (conf/draft/).")
    distill: Any = _group("How stage=draft trains the distilled draft (conf/distill/).")
    data: Any = _group("The prompts: their source, splits and limits (conf/data/).")
    sample: Any = _group("How completions are sampled (conf/sample/).")
    select: Any = _group("Which scored completions SFT trains on (conf/select/).")
    sft: Any = _group("Supervised fine-tuning on the selected completions (conf/sft/).")
    dpo: Any = _group("DPO on each round's best-vs-worst pairs, with loop.dpo (conf/dpo/).")
    refresh: Any = _group("Relabelling and retraining the reward model each round (conf/refresh/).")
    eval: Any = _group("Evaluation on the held-out prompts (conf/eval/).")
    loop: Any = _group("The rounds of stage=loop (conf/loop/).")
    online: Any = _group("stage=online: the policy learns while it samples, a mini-batch at a time (conf/online/).")
    prefs: Any = _group("Simulated preference labels for the demo task (conf/prefs/).")
    reward: Any = _group("The Bradley-Terry reward model: backbone and training (conf/reward/).")
    reward_source: Any = _group("What scores completions wherever a reward is used: the trained model, a "
                                "pretrained one, a function, a server or a combination (conf/reward_source/).")
    logger: Any = _group("Where metrics are logged (conf/logger/).")
    stage: str = setting(MISSING, "Which stage to run; an unknown one lists the valid ones.")
    run_name: str = setting("demo", "runs/<run_name>/ holds every artifact of this run.")
    round: int = setting(0, "Which round's artifacts a single stage reads and writes (stage=draft: -1 = before any "
                            "SFT).")
    seed: int = setting(0, "The root seed: every completion's seed derives from it.", check=a_seed())
    overwrite: bool = setting(False, "Rebuild an artifact even when a complete one exists.", check=boolean())
    device: str = setting("auto", "auto (cuda if available, else cpu), cpu, cuda or cuda:N.")
    threads: int = setting(0, "Torch CPU threads; 0 = torch's default; at most 4 x the machine's CPU cores (more only "
                              "oversubscribes them, and an OpenMP pool of thousands of threads fails to start).",
                           check=Check(lambda key, value: _threads(key, value), "0 to 4 x the CPU cores"))

    def __post_init__(self):
        check_top_level(self)


def max_threads() -> int:
    """The most torch CPU threads a run may ask for: 4 per core (beyond that threads only wait on each other)."""
    return 4 * (os.cpu_count() or 1)


def _threads(key: str, value) -> None:
    most = max_threads()
    expected = f"an integer in [0, {most}] (0 = torch's default; at most 4 x this machine's {most // 4} CPU cores)"
    _typed(key, value, int, expected)
    if not _unresolved(value) and not 0 <= value <= most:
        _fail(key, value, expected)


def check_top_level(run) -> None:
    """The settings every command reads (RunConfig's own fields, read from the dataclass or a composed cfg)."""
    check_fields(RunConfig, run)
    # round's lowest value is the stage's declared one: stage=draft may read -1, the policy before any SFT
    lowest = stages.lowest_round(run.stage)
    _integer("round", run.round, lowest, f"(stage={run.stage}: -1 = before any SFT)" if lowest < 0 else "")


@dataclass
class PathsConfig(Checked):
    runs_root: str = setting("${oc.env:RSFT_RUNS_ROOT,runs}",
                             "The folder that holds every run (env RSFT_RUNS_ROOT, else runs/).")
    run_dir: str = setting("${paths.runs_root}/${run_name}", "This run's folder, where every stage reads and writes.")
    cache_dir: str = setting("${oc.env:RSFT_CACHE_DIR,${oc.env:HOME}/.cache/rsft}",
                             "Where the offline default models are provisioned (converted) once and reused.")
