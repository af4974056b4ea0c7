"""Shared test helpers: Hydra compose against the repo's conf/, a run root under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rsft.config import register_configs

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
SHARED_DATA = Path(__import__("os").environ.get("RSFT_SHARED_DATA", REPO.parent / "shared" / "data"))

# Small everything: the tiny random policy, no wandb, a few prompts and tokens. The round recipe the
# tests were written for is pinned (one reward model, the same prompts every round, full SFT, 16 rows);
# the default recipe's levers (refresh_reward=auto, rotate, LoRA) have their own tests (test_rounds.py).
# a tiny random reward model's config (reward.backbone.build_tiny_reward_model), with its seed added
TINY_REWARD = dict(kind="tiny", name_or_path="tiny", arch="llama", hidden_size=16, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, intermediate_size=32)
TINY = ["policy=tiny", "logger=none", "data.limit=3", "sample.num_samples=3", "sample.max_new_tokens=8",
        "loop.refresh_reward=false", "data.rotate=false", "sft.mode=full", "sft.learning_rate=1e-4",
        "data.eval_limit=24", "sample.batch_rows=16"]


def compose_cfg(tmp_path: Path, *overrides: str, tiny: bool = True):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            "config",
            overrides=[*(TINY if tiny else []), f"paths.runs_root={tmp_path}/runs", *overrides],
        )


@pytest.fixture
def make_cfg(tmp_path):
    """make_cfg("stage=sample", "draft=ngram") -> a composed config whose runs live in tmp_path."""
    return lambda *overrides, tiny=True: compose_cfg(tmp_path, *overrides, tiny=tiny)


def write_artifact(folder, meta, rows=None, files=None):
    """A hand-written complete artifact at `folder`: `rows` as a dataset, `files` {name: text} beside it."""
    from datasets import Dataset

    from rsft.store import atomic_artifact

    with atomic_artifact(folder, meta) as tmp:
        if rows is not None:
            Dataset.from_list(rows).save_to_disk(str(tmp))
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
