"""scripts/push_to_hub.py picks the policy the last round ended with and that round's kept set, and writes a
model card and a dataset card from the run's records (no network: the dry run prints them)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys

import pytest
from huggingface_hub import DatasetCard, ModelCard
from omegaconf import OmegaConf

from rsft.errors import ConfigError, MissingInput
from rsft.paths import RunPaths
from rsft.store import atomic_artifact, read_meta
from tests.conftest import REPO, compose_cfg


def load_script():
    spec = importlib.util.spec_from_file_location("push_to_hub", REPO / "scripts" / "push_to_hub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def complete(path):
    with atomic_artifact(path, {"stage": "test"}):
        pass


def test_the_last_complete_round_and_its_dpo_policy_when_there_is_one(tmp_path):
    script, paths = load_script(), RunPaths(tmp_path / "run")
    for r in (0, 1):
        complete(paths.policy(r))
        complete(paths.selected(r))
    paths.round_dir(2).mkdir()  # a round that started but trained nothing
    assert script.final_artifacts(paths.root) == (1, paths.policy(1), paths.selected(1))
    complete(paths.dpo_policy(1))
    assert script.final_artifacts(paths.root)[1] == paths.dpo_policy(1)


def test_a_run_without_a_trained_policy_says_what_to_run(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingInput, match="stage=loop"):
        load_script().final_artifacts(tmp_path / "empty")
    with pytest.raises(MissingInput, match="no such folder"):
        load_script().final_artifacts(tmp_path / "missing")


# a tiny finished loop, run as a user runs it (Hydra logs its command under logs/)
LOOP = ["stage=loop", "policy=tiny", "logger=none", "reward=tiny", "loop.rounds=1", "data.limit=3",
        "sample.num_samples=2", "sample.max_new_tokens=8", "loop.refresh_reward=false", "data.rotate=false",
        "sft.mode=full", "data.eval_limit=2", "eval.num_samples=2", "prefs.num_prompts=4", "prefs.num_samples=2",
        "select.drop_truncated=false", "device=cpu", "run_name=tiny"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    command = [*LOOP, f"paths.runs_root={root}"]
    done = subprocess.run([sys.executable, "-m", "rsft.run", *command], check=False, capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return root / "tiny", command


def dry_run(capsys, run_dir, *extra):
    load_script().main([str(run_dir), "--repo", "you/tiny-rsft", "--dry-run", *extra])
    out = capsys.readouterr().out
    head, _, cards = out.partition("\n----- model card: README.md of you/tiny-rsft -----\n")
    model, _, dataset = cards.partition("\n----- dataset card: README.md of you/tiny-rsft-data -----\n")
    return head, ModelCard(model), DatasetCard(dataset) if dataset else None


def interval(metrics: dict, key: str) -> str:
    low, high = metrics["intervals"][key]
    return f"{metrics[key]:.3f} [{low:.3f}, {high:.3f}]"


def test_the_dry_run_prints_both_cards_and_they_say_what_the_run_recorded(run, capsys):
    run_dir, command = run
    head, model, dataset = dry_run(capsys, run_dir)
    paths = RunPaths(run_dir)
    policy, kept = read_meta(paths.policy(0)), read_meta(paths.selected(0))
    config = policy["config"]
    assert f"policy {paths.policy(0)} -> you/tiny-rsft" in head and "-> you/tiny-rsft-data (dataset)" in head
    assert model.data.library_name == "transformers" and model.data.datasets == ["you/tiny-rsft-data"]
    assert model.data.base_model is None  # a tiny random policy is no hub model
    assert "rsft" in model.data.tags and dataset.data.task_categories == ["text-generation"]
    assert dataset.data.size_categories == ["n<1K"]
    for card in (model, dataset):
        text = card.text
        assert f"`{config['policy']['name_or_path']}`" in text  # the base model
        assert "best-of-K rejection-sampling fine-tuning" in text
        assert f"**Rounds**: 1 (loop.rounds={config['loop']['rounds']})" in text
        assert f"**K** (sample.num_samples): {config['sample']['num_samples']}," in text
        assert "Bradley-Terry reward model" in text and f"`{config['reward']['backbone']['name_or_path']}`" in text
        assert f"select.strategy={config['select']['strategy']}, k={config['select']['k']}" in text
        for artifact in (paths.policy(0), paths.selected(0), paths.reward, paths.eval(0)):
            assert f"| {read_meta(artifact)['digest']} |" in text  # the fingerprints' digests
        machine = policy.get("machine")
        assert (f"- cpu: {machine['cpu']}" in text) if machine else "- not recorded" in text
        assert f"torch {policy['versions']['torch']}" in text
        assert "```\npython -m rsft.run " + " ".join(shlex.quote(c) for c in command) + "\n```" in text
        assert "logs/" in text and "overrides.yaml" in text  # the command Hydra logged
    for evaluation in (paths.initial_eval, paths.eval(0)):  # the held-out table with its intervals
        metrics = read_meta(evaluation)["metrics"]
        assert interval(metrics, "gold_mean") in model.text and interval(metrics, "reward_mean") in model.text
    assert f"**Rows**: {kept['counts']['selected']};" in dataset.text
    assert f"pooled over rounds {kept['rounds_pooled']}" in dataset.text


def test_no_dataset_prints_the_model_card_only(run, capsys):
    head, model, dataset = dry_run(capsys, run[0], "--no-dataset")
    assert dataset is None and "(dataset)" not in head and model.data.datasets is None


def test_without_hydra_s_log_the_command_is_reconstructed_and_composes_the_recorded_config(run, tmp_path, capsys):
    copy = tmp_path / "tiny"
    shutil.copytree(run[0], copy, ignore=shutil.ignore_patterns("logs"))
    _, model, _ = dry_run(capsys, copy)
    assert "Reconstructed from the config recorded with the policy" in model.text
    line = model.text.split("```\n")[-2].strip()
    words = shlex.split(line)
    assert words[:4] == ["python", "-m", "rsft.run", "stage=loop"]
    recorded = read_meta(copy / "round_00" / "policy")["config"]
    script = load_script()
    composed = OmegaConf.to_container(compose_cfg(tmp_path, *words[3:], tiny=False), resolve=True)
    assert script._compared(composed) == script._compared(recorded)


def test_the_machine_is_rendered_key_by_key():
    script = load_script()
    lines = script.machine_lines({"cpu": "AMD EPYC 7B13", "vector_flags": ["avx2", "fma"], "cores": 2, "gpu": None})
    assert lines == ["- cpu: AMD EPYC 7B13", "- vector_flags: avx2, fma", "- cores: 2", "- gpu: none"]
    assert script.machine_lines(None) == ["- not recorded (the artifacts were made before rsft recorded the machine)"]


def test_hydra_override_values():
    value = load_script().override_value
    assert [value(v) for v in (None, True, 3, 0.5, "top_k", [8, 16], "a b", "null", "${x}", {})] == [
        "null", "true", "3", "0.5", "top_k", "[8,16]", "'a b'", "'null'", "'${x}'", "{}"]


def test_a_bad_repo_id_is_named(run):
    with pytest.raises(ConfigError, match="--repo you/x/y"):
        load_script().main([str(run[0]), "--repo", "you/x/y", "--dry-run"])


def test_the_push_uploads_the_weights_then_the_model_card_and_the_dataset_card_before_the_rows(run, monkeypatch):
    """No network: every upload is replaced by a record of the call."""
    import datasets
    import huggingface_hub
    import transformers

    calls = []

    class Pushable:
        def __init__(self, what):
            self.what = what

        def push_to_hub(self, repo, private=False):
            calls.append((self.what, repo, private))

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda path: Pushable("model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: Pushable("tokenizer"))
    monkeypatch.setattr(huggingface_hub, "create_repo", lambda repo, **kw: calls.append(("create", repo, kw)))
    monkeypatch.setattr(huggingface_hub.RepoCard, "push_to_hub",
                        lambda card, repo, **kw: calls.append((type(card).__name__, repo, str(card))))
    monkeypatch.setattr(datasets.Dataset, "push_to_hub", lambda ds, repo, private=False: calls.append(
        ("rows", repo, len(ds))))
    load_script().main([str(run[0]), "--repo", "you/tiny-rsft", "--private"])
    assert [c[:2] for c in calls] == [("model", "you/tiny-rsft"), ("tokenizer", "you/tiny-rsft"),
                                      ("ModelCard", "you/tiny-rsft"), ("create", "you/tiny-rsft-data"),
                                      ("DatasetCard", "you/tiny-rsft-data"), ("rows", "you/tiny-rsft-data")]
    assert calls[0][2] is True and calls[3][2] == {"repo_type": "dataset", "private": True, "exist_ok": True}
    assert "## Held-out evaluation" in calls[2][2] and "# you/tiny-rsft-data" in calls[4][2]


def built(path, config=None, files=None):
    with atomic_artifact(path, {"stage": "test", **({"config": config} if config is not None else {})}) as tmp:
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)


def test_a_dpo_run_whose_last_dpo_step_is_missing_is_refused(tmp_path):
    """The card of a loop.dpo=true run describes a DPO policy: the round's SFT policy is not pushed under it."""
    script, paths = load_script(), RunPaths(tmp_path / "run")
    built(paths.policy(0), {"loop": {"dpo": True, "rounds": 1}})
    built(paths.selected(0))
    with pytest.raises(MissingInput, match=r"loop.dpo=true and the DPO step of round 0 is not built"):
        script.final_artifacts(paths.root)
    built(paths.dpo_policy(0))
    assert script.final_artifacts(paths.root)[1] == paths.dpo_policy(0)


def test_a_damaged_policy_is_refused_before_anything_is_listed(tmp_path):
    from rsft.errors import DamagedArtifact

    script, paths = load_script(), RunPaths(tmp_path / "run")
    built(paths.policy(0), {"loop": {"rounds": 1}}, {"model.safetensors": b"weights!"})
    built(paths.selected(0))
    assert script.final_artifacts(paths.root)[1] == paths.policy(0)
    (paths.policy(0) / "model.safetensors").write_bytes(b"WEIGHTS!")  # the same size, other content
    with pytest.raises(DamagedArtifact, match="is damaged: model.safetensors has other content"):
        script.final_artifacts(paths.root)


@pytest.mark.parametrize("loop,says", [({"eval": False}, "No complete evaluation in the run (loop.eval=false)."),
                                       ({"eval": True}, "No complete evaluation in the run: no evaluation was built."),
                                       ({}, "No complete evaluation in the run: no evaluation was built.")])
def test_a_missing_evaluation_is_explained_only_by_what_the_config_recorded(tmp_path, loop, says):
    lines = load_script().evaluation_section(RunPaths(tmp_path / "run"), 1, {"loop": loop})
    assert says in lines


def test_fewer_rounds_than_asked_are_said_in_the_card(tmp_path):
    script, paths = load_script(), RunPaths(tmp_path / "run")
    assert script.short_of_rounds({"loop": {"rounds": 1}}, 0) == ""
    assert script.short_of_rounds({"loop": {"rounds": 3}}, 0).startswith("only 1 of loop.rounds=3 rounds are done")
    lines = script.method_lines({"loop": {"rounds": 3}}, 0, paths.policy(0))
    assert any(line.startswith("- **Unfinished**: only 1 of loop.rounds=3") for line in lines)
