"""logger: wandb or none.
"""

from dataclasses import dataclass
from typing import List, Optional

from rsft.config.rules import Checked, kind_is, setting


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
