"""The named recipes (conf/experiment/) compose into configs a user's clone can run: no path outside the
repository by default, and no interpolation that only one data option can satisfy. Nothing here downloads."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
from omegaconf import OmegaConf

HUB = ("Anthropic/hh-rlhf", "harmless-base", "test")  # path, data_dir, split


def check_groups(cfg) -> None:
    """The data and reward groups as their dataclasses: each one's own checks (rsft.config) run."""
    for group in ("data", "reward"):
        OmegaConf.to_object(cfg[group])


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_hh_recipe_defaults_to_the_hub_dataset(make_cfg):
    cfg = make_cfg("stage=loop", "+experiment=hh_rlhf", tiny=False)
    OmegaConf.resolve(cfg)  # every interpolation, not only the keys read below
    assert (cfg.data.kind, cfg.data.path, cfg.data.data_dir, cfg.data.split) == ("hh_rlhf", *HUB)
    d = cfg.reward.data
    assert (d.path, d.data_dir, d.split, d.format) == (*HUB, "hh_rlhf")  # the pairs the prompts come from
    assert "shared" not in OmegaConf.to_yaml(cfg)  # nothing outside the repository
    check_groups(cfg)


def test_hh_recipe_reads_the_hub_through_both_loaders(make_cfg, monkeypatch):
    """The hub id reaches load_dataset with its subset and split, for the prompts and for the pairs."""
    import reward.tables
    from reward.formats import load_raw, to_preference_pairs
    from rsft.data import load_prompts

    calls = []
    turns = [f"\n\nHuman: question {i}?\n\nAssistant:" for i in range(40)]
    rows = [{"chosen": turn + " yes", "rejected": turn + " no"} for turn in turns]

    def fake_load_dataset(path, *args, **kwargs):
        calls.append((path, kwargs.get("data_dir"), kwargs.get("split")))
        return Dataset.from_list(rows)

    monkeypatch.setattr(reward.tables, "load_dataset", fake_load_dataset)
    cfg = make_cfg("stage=loop", "+experiment=hh_rlhf", tiny=False)
    assert len(load_prompts(cfg.data, "train")) > 0
    raw, source = load_raw(cfg.reward.data)
    assert len(to_preference_pairs(raw, cfg.reward.data.format, cfg.reward.data.label_column, source)) == 40
    assert calls and set(calls) == {HUB}


def test_hh_recipe_with_the_local_file_as_an_override(make_cfg):
    local = "../shared/data/hh-rlhf/harmless-base-test.jsonl.gz"
    cfg = make_cfg("stage=loop", "+experiment=hh_rlhf", f"data.path={local}", "data.data_dir=null", tiny=False)
    OmegaConf.resolve(cfg)
    assert cfg.data.path == cfg.reward.data.path == local
    assert cfg.data.data_dir is None and cfg.reward.data.data_dir is None and cfg.reward.data.format == "hh_rlhf"


@pytest.mark.parametrize("pair_format", [None, "preference"])
def test_hh_recipe_with_local_prompts_and_pairs(make_cfg, tmp_path, pair_format):
    """data=local has no data_dir: the recipe's reward.data follows what the data option has."""
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Name a fruit."}, {"prompt": "Name a tree."}])
    held_out = write_jsonl(tmp_path / "held_out.jsonl", [{"prompt": "Name a river."}])
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Name a fruit.", "chosen": "A pear.", "rejected": "No."}])
    extra = [f"reward.data.format={pair_format}"] if pair_format else []
    cfg = make_cfg("stage=loop", "+experiment=hh_rlhf", "data=local", f"data.path={prompts}",
                   f"data.eval_path={held_out}", f"reward.data.path={pairs}", *extra, tiny=False)
    OmegaConf.resolve(cfg)  # raised "Interpolation key 'data.data_dir' not found" before
    assert cfg.data.kind == "local" and cfg.data.path == prompts and cfg.data.limit == 48
    d = cfg.reward.data
    assert (d.path, d.data_dir, d.split) == (pairs, None, "train")
    assert d.format == (pair_format or "hh_rlhf") and (d.parts, d.part) == (2, 0)
    check_groups(cfg)


@pytest.mark.parametrize("data", [["data=demo"], ["data=hub", "data.name=tatsu-lab/alpaca"]])
def test_hh_recipe_with_a_data_option_without_a_path(make_cfg, data):
    cfg = make_cfg("stage=reward", "+experiment=hh_rlhf", *data, tiny=False)
    OmegaConf.resolve(cfg)
    assert cfg.reward.data.path is None and cfg.reward.data.data_dir is None  # null: this run's own prefs
