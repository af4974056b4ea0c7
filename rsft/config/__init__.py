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
name live together in rsft.config.across_groups (check_across_groups, check_run_name); rsft.preflight applies
them all, and the device, before a command does any work.

Value types are the YAML's (an int stays an int): artifact fingerprints hash these values. Where a
setting takes several types (warmup_steps, lora.target_modules, loop.refresh_reward) it is `Any` and
its check says which. A class default that is an interpolation or `???` is checked only once
resolved, i.e. when OmegaConf builds the object.

One module per group (`rsft/config/<group>_settings.py`: its fields and their rules), the rules' vocabulary
(rsft.config.rules), the rules across groups (rsft.config.across_groups) and the registry (rsft.config.registry).
This package re-exports their names, so `from rsft.config import SampleConfig` reads the same wherever the
class lives. A ground-floor package: it imports nothing of rsft but rsft.errors, rsft.stages and
rsft.sampling's leaf checks.
"""

from rsft.config.rules import (  # noqa: F401
    Check,
    Checked,
    DTYPES,
    SEED_MAX,
    _field_check,
    a_seed,
    at_least,
    boolean,
    check_fields,
    integer,
    kind_is,
    non_negative,
    number,
    one_of,
    open_fraction,
    optional,
    positive,
    row_limit,
    sampling_rule,
    setting,
    typed,
    warmup,
)
from rsft.config.run_settings import (  # noqa: F401
    PathsConfig,
    RunConfig,
    check_top_level,
    max_threads,
)
from rsft.config.policy_settings import (  # noqa: F401
    HfModelSource,
    PolicyHfConfig,
    PolicyPypiGgufConfig,
    PolicyTinyConfig,
    PolicyWeights,
    PypiGgufSource,
    TinyModelSource,
)
from rsft.config.draft_settings import (  # noqa: F401
    DistillConfig,
    DraftDistilledConfig,
    DraftFeatureConfig,
    DraftModelConfig,
    DraftNgramConfig,
    DraftNoneConfig,
    FeatureTrainConfig,
    GAMMA,
    NgramFallbackConfig,
    UNTRAINED_DRAFT,
)
from rsft.config.data_settings import (  # noqa: F401
    DataCheckableConfig,
    DataDemoConfig,
    DataHhRlhfConfig,
    DataHubConfig,
    DataLocalConfig,
    PromptSetConfig,
)
from rsft.config.sample_settings import (  # noqa: F401
    AdaptiveKConfig,
    AutoKConfig,
    BATCH_ROWS,
    CUDA_GRAPHS,
    LENIENCY,
    MAX_NEW_TOKENS,
    MAX_TEMPERATURE,
    PruneConfig,
    SAMPLING_BACKENDS,
    STRATEGY,
    SampleConfig,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    VllmConfig,
    most_samples,
    samples_per_prompt,
)
from rsft.config.select_settings import (  # noqa: F401
    SELECT_STRATEGIES,
    SelectConfig,
)
from rsft.config.training_settings import (  # noqa: F401
    DpoConfig,
    LoraAdapterConfig,
    MAX_LENGTH,
    MIN_MAX_LENGTH,
    SftConfig,
    TRAINING_MODES,
    TrainingConfig,
    UNTRAINED_DPO,
    UNTRAINED_POLICY,
    UNTRAINED_REWARD,
    WARMUP_HELP,
    WARMUP_TYPE,
)
from rsft.config.online_settings import (  # noqa: F401
    GUARD_ACTIONS,
    GUARD_METRIC,
    GuardConfig,
    OnlineConfig,
)
from rsft.config.refresh_settings import (  # noqa: F401
    RefreshConfig,
)
from rsft.config.eval_settings import (  # noqa: F401
    EvalConfig,
)
from rsft.config.loop_settings import (  # noqa: F401
    LoopConfig,
    StopConfig,
)
from rsft.config.prefs_settings import (  # noqa: F401
    PrefsConfig,
)
from rsft.config.reward_settings import (  # noqa: F401
    BackboneHfConfig,
    BackbonePypiFolderConfig,
    BackbonePypiGgufConfig,
    BackboneTinyConfig,
    COMBINE_MODES,
    REWARD_KINDS,
    RewardConfig,
    RewardDataConfig,
    RewardSourceConfig,
)
from rsft.config.logger_settings import (  # noqa: F401
    LoggerNoneConfig,
    LoggerWandbConfig,
)
from rsft.config.across_groups import (  # noqa: F401
    COMPONENTS_KEY,
    RENAMED,
    check_across_groups,
    check_override_names,
    check_run_dir,
    check_run_name,
    check_unknown_settings,
    refresh_reward_on,
    renamed_key,
    simulated_labels_available,
    uses_trained_reward,
)
from rsft.config.registry import (  # noqa: F401
    ROOT_SCHEMA,
    SCHEMAS,
    _place_sections,
    describe,
    register_configs,
    schema_name,
)
