"""Hydra composition and the stage table."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException

from rsft.run import run_stage
from rsft.stages import STAGES
from tests.conftest import CONF_DIR, REPO

GROUPS = {path.name: sorted(p.stem for p in path.glob("*.yaml") if not p.stem.startswith("_"))
          for path in CONF_DIR.iterdir() if path.is_dir() and path.name != "experiment"}
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g, options in GROUPS.items() for o in options])
def test_every_config_group_option_composes(make_cfg, group, option):
    cfg = make_cfg("stage=sample", f"{group}={option}", tiny=False)
    assert cfg[group] is not None


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_sets_globals(make_cfg, experiment):
    cfg = make_cfg("stage=loop", f"+experiment={experiment}", tiny=False)
    assert "experiment" not in cfg and cfg.stage == "loop"  # it sets other groups' keys (@package _global_)


def test_experiments_combine_the_hh_random_baseline(make_cfg):
    cfg = make_cfg("stage=loop", "+experiment=[hh_rlhf,random_baseline]", "run_name=hh-random", "loop.reward_from=hh",
                   tiny=False)
    assert cfg.data.kind == "hh_rlhf" and cfg.select.strategy == "random" and cfg.loop.reward_from == "hh"
    assert cfg.sample.max_new_tokens == 96 and cfg.run_name == "hh-random"


def test_hh_recipe_trains_proxy_and_judge_on_disjoint_parts_of_the_same_pairs(make_cfg):
    proxy = make_cfg("stage=reward", "+experiment=hh_rlhf", tiny=False)
    judge = make_cfg("stage=reward", "+experiment=hh_rlhf", "run_name=hh-judge", "reward.data.part=1", tiny=False)
    assert proxy.data.kind == "hh_rlhf" and proxy.reward.data.path == proxy.data.path == judge.reward.data.path
    assert (proxy.reward.data.parts, proxy.reward.data.part, judge.reward.data.part) == (2, 0, 1)
    assert proxy.eval.judge == "hh-judge" and proxy.reward.data.format == "hh_rlhf"


def test_every_yaml_starts_with_the_command_that_uses_it():
    for path in CONF_DIR.rglob("*.yaml"):
        first = [line for line in path.read_text().splitlines() if not line.startswith("# @package")][0]
        assert first.startswith("# python -m rsft.run"), f"{path} does not start with its command"


def test_overrides_reach_the_config(make_cfg, tmp_path):
    cfg = make_cfg("stage=sample", "run_name=abc", "sample.num_samples=5", "draft=ngram", "draft.gamma=3")
    assert cfg.sample.num_samples == 5 and cfg.draft.kind == "ngram" and cfg.draft.gamma == 3
    assert cfg.paths.run_dir == f"{tmp_path}/runs/abc"


def test_unknown_option_is_an_error(make_cfg):
    with pytest.raises(ConfigCompositionException):
        make_cfg("stage=sample", "sample.no_such_option=1")


def test_unknown_and_missing_stage_list_the_valid_ones(make_cfg):
    with pytest.raises(SystemExit, match="valid stages: .*sample"):
        run_stage(make_cfg("stage=nope"))
    with pytest.raises(SystemExit, match="no stage given"):
        run_stage(make_cfg())


def test_stage_table_names_only_importable_stages():
    import importlib

    for stage in STAGES:  # an artifact stage is a plan and a build (rsft.runner); a driver runs the others
        module = importlib.import_module(stage.module)
        needed = ("plan", "build") if stage.artifact else ("run",)
        assert all(callable(getattr(module, name, None)) for name in needed), stage.name


def test_command_line_reports_a_bad_stage(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=nope", f"paths.runs_root={tmp_path}"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode != 0
    assert "valid stages" in done.stderr + done.stdout


def test_help_lists_every_stage_and_no_private_config(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rsft.run", "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    stages = done.stdout.split("Stages:")[1].split("Config groups")[0]
    assert [line.split()[0] for line in stages.strip().splitlines()] == [stage.name for stage in STAGES]
    groups = done.stdout.split("Config groups (group=option")[1].split("Settings (")[0]
    assert "reward: hf, minilm, policy, tiny" in groups and "schema" not in groups  # the typed schemas are private
    options = [o.strip() for line in groups.strip().splitlines()[1:] for o in line.split(":", 1)[1].split(",")]
    assert options and not [o for o in options if o.startswith("_")]
    settings = done.stdout.split("Settings (")[1]
    assert "sample.temperature=0.7  # " in settings  # every key with its default and its meaning (rsft.config)


def test_renamed_settings_keep_working_on_the_command_line(capsys):
    from rsft.run import renamed_settings

    assert renamed_settings(["sample.adaptive.k0=2", "+sample.adaptive.budget=3", "sample.num_samples=4"]) == [
        "sample.adaptive_k.k0=2", "+sample.adaptive_k.mean=3", "sample.num_samples=4"]
    assert "sample.adaptive.k0 is now sample.adaptive_k.k0" in capsys.readouterr().err
