"""data: the prompts.
"""

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from rsft.config.rules import Checked, a_seed, boolean, kind_is, one_of, open_fraction, row_limit, setting


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
    # (docs/history.md#why-each-default-setting)
    eval_limit: Optional[int] = setting(64, "Held-out prompts evaluated (null = all).")
    split: str = setting("train", "The split sampled for training.")
    eval_split: str = setting("test", "The held-out split eval judges on (demo: test, or validation to choose a "
                                      "setting without reading test).")


@dataclass
class DataCheckableConfig(DataDemoConfig):
    """Generated like the demo prompts (ids, rotation, train and test splits), with their own questions."""

    kind: str = setting("checkable", "checkable: short questions with one right number (rsft.checkable_prompts), "
                                     "each with its `reference` answer.", check=kind_is("checkable"))
    limit: Optional[int] = setting(64, "Train prompts per round (null = all 192).")
    eval_limit: Optional[int] = setting(64, "Held-out prompts evaluated (null = all 64).")
    split: str = setting("train", "The split sampled for training: train (192 questions), or fit (128 of them) to "
                                  "choose a setting on validation.")
    eval_split: str = setting("test", "The held-out split eval judges on: test (64), or validation (train's other 64, "
                                      "none a fit question up to operand order) to choose a setting without reading "
                                      "test.")
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
