"""Artifacts are reused only when they match what is asked now, never when damaged; one command per run dir.

Each case is what a hostile but realistic user did on the tiny models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from datasets import load_from_disk
from fake_reward import install_fake_reward

from rsft.errors import (
    ArtifactError,
    ConfigError,
    DamagedArtifact,
    RunDirectoryBusy,
    StaleArtifact,
)
from rsft.lock import run_lock
from rsft.models import load_causal_lm, load_saved_causal_lm
from rsft.paths import RunPaths
from rsft.run import run_stage
from rsft.store import atomic_artifact
from tests.conftest import REPO


def paths_of(cfg) -> RunPaths:
    return RunPaths.from_config(cfg)


# ---- 1. changed settings never reuse old results ----

def test_changed_sample_settings_stop_before_work_and_name_the_keys(make_cfg):
    run_stage(make_cfg("stage=sample", "run_name=s", "sample.num_samples=2"))
    samples = paths_of(make_cfg("stage=sample", "run_name=s")).samples(0)
    stamp = (samples / "meta.json").stat().st_mtime
    with pytest.raises(StaleArtifact, match=r"(?s)sample\.num_samples: 2 -> 3.*overwrite=true.*run_name"):
        run_stage(make_cfg("stage=sample", "run_name=s", "sample.num_samples=3"))
    with pytest.raises(StaleArtifact, match=r"sample\.temperature: 0\.7 -> 0\.9"):
        run_stage(make_cfg("stage=sample", "run_name=s", "sample.num_samples=2", "sample.temperature=0.9"))
    with pytest.raises(StaleArtifact, match=r"policy\.initializer_range"):
        run_stage(make_cfg("stage=sample", "run_name=s", "sample.num_samples=2", "policy.initializer_range=0.5"))
    assert (samples / "meta.json").stat().st_mtime == stamp  # nothing was touched
    # keys that cannot change a result are not part of it: the same samples are reused
    assert run_stage(make_cfg("stage=sample", "run_name=s", "sample.num_samples=2", "threads=1",
                              "sample.batch_rows=5")).path == samples
    rebuilt = run_stage(make_cfg("stage=sample", "run_name=s", "sample.num_samples=3", "overwrite=true")).path
    assert len(load_from_disk(str(rebuilt))) == 9


def test_a_changed_prompt_file_makes_the_samples_stale(make_cfg, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a cat", "a dog")))
    local = ["data=local", f"data.path={prompts}", "run_name=local"]
    run_stage(make_cfg("stage=sample", *local))
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a cat", "a bird")))
    with pytest.raises(StaleArtifact, match=r"file .*prompts\.jsonl: rebuilt or replaced"):
        run_stage(make_cfg("stage=sample", *local))
    prompts.unlink()
    with pytest.raises(FileNotFoundError, match="prompts.jsonl"):
        run_stage(make_cfg("stage=sample", *local))


def test_a_prompt_folder_is_reused_as_it_is(make_cfg, tmp_path):
    from datasets import Dataset

    folder = tmp_path / "prompts"
    Dataset.from_dict({"instruction": ["a cat", "a dog"]}).save_to_disk(str(folder))
    local = ["data=local", f"data.path={folder}", "data.prompt_column=instruction", "run_name=folder"]
    first = run_stage(make_cfg("stage=sample", *local)).path
    assert run_stage(make_cfg("stage=sample", *local)).path == first  # datasets' own cache files do not count


def test_missing_required_settings_and_a_loop_without_labels_are_refused(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"^data\.path: required by data\.kind=local"):
        run_stage(make_cfg("stage=sample", "data=local"))
    with pytest.raises(ConfigError, match="reward.data.path=<your pairs>"):
        run_stage(make_cfg("stage=loop", "data=local", f"data.path={tmp_path}/p.jsonl"))


def test_a_malformed_pairs_file_names_its_line(make_cfg, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n{broken\n")
    with pytest.raises(ValueError, match=r"reward\.data\.path=.*pairs\.jsonl.*line 2"):
        run_stage(make_cfg("stage=reward", "reward=tiny", f"reward.data.path={pairs}"))


def test_reward_model_from_another_or_a_missing_pairs_file_is_not_reused(make_cfg, tmp_path):
    def pairs_file(name, words):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"prompt": f"say {w}", "chosen": f"{w} {w}", "rejected": "no"}) + "\n"
                                for w in words))
        return path

    first, second = pairs_file("a.jsonl", ["sun", "moon", "tree", "river"]), pairs_file("b.jsonl", ["x", "y", "z", "w"])
    reward = ["stage=reward", "reward=tiny", "run_name=r", "reward.epochs=1"]
    out = run_stage(make_cfg(*reward, f"reward.data.path={first}")).path
    assert run_stage(make_cfg(*reward, f"reward.data.path={first}", "reward.progress=true")).path == out  # reused
    with pytest.raises(StaleArtifact, match=r"reward\.data\.path"):
        run_stage(make_cfg(*reward, f"reward.data.path={second}"))
    with pytest.raises(FileNotFoundError, match=r"reward\.data\.path=.*missing\.jsonl"):
        run_stage(make_cfg(*reward, f"reward.data.path={tmp_path}/missing.jsonl"))


def test_samples_rebuilt_with_overwrite_make_the_scores_stale(make_cfg, monkeypatch):
    run_stage(make_cfg("stage=sample", "sample.num_samples=2"))
    cfg = make_cfg("stage=score")
    install_fake_reward(monkeypatch, cfg)
    run_stage(cfg)
    run_stage(make_cfg("stage=sample", "sample.num_samples=4", "overwrite=true"))
    with pytest.raises(StaleArtifact, match=r"input artifact round_00/samples: rebuilt or replaced"):
        run_stage(make_cfg("stage=score"))
    assert len(load_from_disk(str(run_stage(make_cfg("stage=score", "overwrite=true")).path))) == 12


def test_invalid_settings_are_refused_after_a_complete_run(make_cfg):
    run_stage(make_cfg("stage=sample"))
    with pytest.raises(ConfigError, match="top_p|temperature"):  # the first of the two in field order
        run_stage(make_cfg("stage=sample", "sample.temperature=-1", "sample.top_p=7"))


LOOP = ["stage=loop", "loop.rounds=1", "reward=tiny", "prefs.num_prompts=4", "prefs.num_samples=2",
        "data.eval_limit=2", "eval.num_samples=2", "sample.num_samples=2", "sft.learning_rate=1e-3",
        "select.drop_truncated=false", "device=cpu", "run_name=loop"]


def test_a_finished_loop_rerun_with_other_settings_stops_and_keeps_its_summary(make_cfg):
    root = run_stage(make_cfg(*LOOP)).path
    summary = (root / "summary.md").read_text()
    assert "K=2" in summary and "lr=0.001" in summary
    with pytest.raises(StaleArtifact, match=r"sample\.num_samples: 2 -> 4"):
        run_stage(make_cfg(*LOOP, "sample.num_samples=4", "sft.learning_rate=0.05"))
    with pytest.raises(StaleArtifact, match=r"reward\.epochs: 1 -> 2"):  # the loop's reward model is checked too
        run_stage(make_cfg(*LOOP, "reward.epochs=2"))
    with pytest.raises(StaleArtifact, match=r"eval_initial.*\n  eval\.num_samples: 2 -> 3"):  # and the baseline
        run_stage(make_cfg(*LOOP[1:], "stage=eval", "round=0", "eval.num_samples=3"))
    assert (root / "summary.md").read_text() == summary
    # the summary says what the artifacts were made with, whatever the current config says
    from rsft.report import write_summary

    write_summary(RunPaths(root), 1, {}, [])
    assert "K=2" in (root / "summary.md").read_text() and "lr=0.001" in (root / "summary.md").read_text()


# ---- 2. damaged artifacts are never trusted ----

def test_a_truncated_arrow_file_is_damage_named_with_the_folder(make_cfg, monkeypatch):
    samples = run_stage(make_cfg("stage=sample")).path
    arrow = next(samples.glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    with pytest.raises(DamagedArtifact, match=rf"{samples}.*damaged.*\.arrow.*stage=sample round=0 overwrite=true"):
        run_stage(make_cfg("stage=sample"))
    cfg = make_cfg("stage=score")
    install_fake_reward(monkeypatch, cfg)
    with pytest.raises(DamagedArtifact, match=str(samples)):
        run_stage(cfg)
    run_stage(make_cfg("stage=sample", "overwrite=true"))
    assert len(load_from_disk(str(run_stage(cfg).path))) == 9


def test_an_invalid_meta_json_names_its_path(make_cfg):
    samples = run_stage(make_cfg("stage=sample")).path
    (samples / "meta.json").write_text("{not json")
    with pytest.raises(DamagedArtifact, match=rf"{samples}/meta.json cannot be read"):
        run_stage(make_cfg("stage=sample"))


def test_truncated_policy_weights_name_the_policy_folder(make_cfg):
    cfg = make_cfg("stage=sample", "round=1")
    policy = paths_of(cfg).policy(0)
    model, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, torch.device("cpu"))
    with atomic_artifact(policy, {"stage": "sft", "round": 0}) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    weights = policy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(DamagedArtifact, match=rf"{policy} is damaged: model.safetensors has 1000 bytes.*stage=sft round=0"):
        load_saved_causal_lm(policy, torch.device("cpu"))
    with pytest.raises(DamagedArtifact, match=str(policy)):
        run_stage(cfg)


# ---- 3. one command per run directory ----

def test_a_run_directory_held_by_a_live_command_is_refused(make_cfg):
    cfg = make_cfg("stage=sample")
    with run_lock(cfg.paths.run_dir, "stage=loop"):
        with pytest.raises(RunDirectoryBusy, match=rf"pid {os.getpid()} on host .* \(stage=loop\).*another run_name"):
            run_stage(cfg)
    run_stage(cfg)  # released


def test_a_lock_left_by_a_dead_process_is_taken_over(make_cfg, tmp_path):
    cfg = make_cfg("stage=sample")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom rsft.lock import run_lock\n"
        f"with run_lock({cfg.paths.run_dir!r}, 'stage=loop'):\n    print('held', flush=True)\n    time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunDirectoryBusy, match=f"pid {holder.pid}"):
        run_stage(cfg)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert "pid" in (tmp_path / "runs" / "demo" / ".lock").read_text()  # the dead holder's record is still there
    assert run_stage(cfg).path.exists()


# ---- the command line: one line per mistake, Ctrl-C says how to resume ----

def run_module_script(setup: str, *args: str) -> str:
    """A `python -m rsft.run ARGS` command line with `setup` run first (to patch a library function)."""
    return (f"import runpy, sys\n{setup}\n"
            f"sys.argv = ['rsft.run', *{list(args)!r}]\n"
            "runpy.run_module('rsft.run', run_name='__main__', alter_sys=True)\n")


def test_ctrl_c_says_how_to_resume(tmp_path):
    setup = "import rsft.checks\ndef interrupted(cfg):\n    raise KeyboardInterrupt\nrsft.checks.check_config = interrupted"
    done = subprocess.run([sys.executable, "-c", run_module_script(setup, "stage=sample", f"paths.runs_root={tmp_path}")],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "interrupted; rerun the same command to resume (complete artifacts are kept)"


# ---- kill -9 mid-write: the resumed artifact equals an uninterrupted one ----

def test_kill_minus_nine_while_writing_samples_then_resume_gives_the_same_rows(make_cfg, tmp_path):
    common = ["policy=tiny", "logger=none", "data.limit=3", "sample.num_samples=3", "sample.max_new_tokens=8",
              f"paths.runs_root={tmp_path}/runs"]
    # stage=sample writes its dataset with rsft.rows.save_dataset (a copy of the folder it assembled)
    setup = ("import time\nimport rsft.sample\nreal = rsft.sample.save_dataset\n"
             "def slow_save(ds, path):\n    real(ds, path)\n    print('writing', flush=True)\n"
             "    time.sleep(60)\n"
             "rsft.sample.save_dataset = slow_save")
    script = run_module_script(setup, "stage=sample", "run_name=killed", *common)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    for line in proc.stdout:  # Hydra's log lines come first
        if line.strip() == "writing":
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = RunPaths(tmp_path / "runs" / "killed")
    assert not killed.samples(0).exists()  # only a temporary folder was left
    resumed = load_from_disk(str(run_stage(make_cfg("stage=sample", "run_name=killed")).path))
    straight = load_from_disk(str(run_stage(make_cfg("stage=sample", "run_name=straight")).path))
    assert resumed["completion_ids"] == straight["completion_ids"] and resumed["seed"] == straight["seed"]


# ---- 3. staleness follows the whole artifact graph; damage that keeps the size is caught ----

def test_samples_rebuilt_stop_select_too_not_only_score(make_cfg, monkeypatch):
    """select reads scored/, which still has its old digest: it is stale through samples/, transitively."""
    cfg = make_cfg("stage=score")
    install_fake_reward(monkeypatch, cfg)
    run_stage(make_cfg("stage=sample"))
    run_stage(cfg)
    run_stage(make_cfg("stage=select", "select.drop_truncated=false"))
    run_stage(make_cfg("stage=sample", "sample.temperature=0.9", "overwrite=true"))
    with pytest.raises(StaleArtifact, match=r"round_00/scored was built from round_00/samples before .*stage=score"):
        run_stage(make_cfg("stage=select", "select.drop_truncated=false"))


def test_bytes_overwritten_in_place_are_damage_even_at_the_same_size(make_cfg, monkeypatch):
    samples = run_stage(make_cfg("stage=sample")).path
    arrow = next(samples.glob("*.arrow"))
    data = bytearray(arrow.read_bytes())
    data[len(data) // 2: len(data) // 2 + 8] = b"\xff" * 8
    arrow.write_bytes(bytes(data))
    with pytest.raises(DamagedArtifact, match=rf"{samples} is damaged: .*\.arrow has other content"):
        run_stage(make_cfg("stage=sample"))
    cfg = make_cfg("stage=score")
    install_fake_reward(monkeypatch, cfg)
    with pytest.raises(DamagedArtifact, match="other content"):
        run_stage(cfg)


def test_a_refusal_names_the_key_the_user_sets_not_the_one_that_reads_it(make_cfg):
    prefs = ["stage=prefs", "prefs.num_prompts=4", "prefs.num_samples=2"]
    run_stage(make_cfg(*prefs))
    with pytest.raises(StaleArtifact, match=r"sample\.temperature \(read as prefs\.temperature\): 0\.7 -> 0\.9"):
        run_stage(make_cfg(*prefs, "sample.temperature=0.9"))


def test_a_full_disk_is_one_line_and_leaves_nothing(make_cfg, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("rsft.sample.save_dataset", full)  # what writes stage=sample's dataset
    cfg = make_cfg("stage=sample")
    with pytest.raises(ArtifactError, match=r"^no space left on device while writing .*round_00/samples; nothing"):
        run_stage(cfg)
    round_dir = paths_of(cfg).round_dir(0)
    assert not (round_dir / "samples").exists() and not list(round_dir.glob(".samples.tmp-*"))
    assert list(round_dir.glob(".samples.shards/*.json"))  # the sampled shard is kept: a rerun does not sample again


def test_a_diverged_training_run_saves_nothing_and_names_the_learning_rate(make_cfg, monkeypatch):
    from rsft.training import check_trained

    model = torch.nn.Linear(2, 2)
    check_trained(model, 0.5, make_cfg("stage=sft").sft, "sft")
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"sft: training diverged .*1 of 2 weight tensors.*sft\.learning_rate"):
        check_trained(model, 0.5, make_cfg("stage=sft").sft, "sft")
    with pytest.raises(ValueError, match=r"reward: training diverged \(train loss nan"):
        check_trained(torch.nn.Linear(2, 2), float("nan"), make_cfg("stage=reward").reward, "reward")


def test_a_read_only_or_unwritable_runs_root_is_one_line_before_hydra_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=sample", f"paths.runs_root={blocker}"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(f"cannot create the run folder {blocker}/demo: {blocker} is not a folder")


def test_a_unicode_run_name_is_accepted(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=nope", "run_name=résumé-été",
                           f"paths.runs_root={tmp_path}"], capture_output=True, text=True, cwd=REPO)
    assert "stage='nope' is not a stage" in done.stderr  # parsed: Hydra's lexer did not stop it
    assert (tmp_path / "résumé-été").is_dir()  # Hydra's log folder, under the name as typed


def test_a_lock_that_is_a_folder_and_the_last_of_repeated_settings_are_one_line(tmp_path):
    run = tmp_path / "runs" / "demo"
    (run / ".lock").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=sample", "policy=tiny", "logger=none",
                           f"paths.runs_root={tmp_path}/runs"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"{run / '.lock'} is not a file" in done.stderr
    # Hydra takes the last of repeated overrides; so do the checks made before it starts
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=sample", "run_name=ok", "run_name=../../x",
                           f"paths.runs_root={tmp_path}/runs"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0 and "run_name='../../x'" in done.stderr and not (tmp_path / "x").exists()
