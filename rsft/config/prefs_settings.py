"""prefs: the initial preference labels.
"""

from dataclasses import dataclass
from typing import Optional

from omegaconf import II

from rsft.config.rules import Checked, a_seed, at_least, boolean, one_of, open_fraction, positive, row_limit, setting
from rsft.config.sample_settings import (
    BATCH_ROWS,
    CUDA_GRAPHS,
    LENIENCY,
    MAX_NEW_TOKENS,
    STRATEGY,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    _check_sampling,
)


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
