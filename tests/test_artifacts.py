"""Artifacts are reused only when they match what is asked now, never when damaged; one command per run dir.

Each case is what a hostile but realistic user did on the tiny models."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

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
from tests.conftest import REPO, TINY
from tests.pipe_lines import PipeLines


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
    PipeLines(holder.stdout).until("held", timeout=120)
    with pytest.raises(RunDirectoryBusy, match=f"pid {holder.pid}"):
        run_stage(cfg)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(30)
    assert "pid" in (tmp_path / "runs" / "demo" / ".lock").read_text()  # the dead holder's record is still there
    assert run_stage(cfg).path.exists()


# ---- the command line: one line per mistake, Ctrl-C says how to resume ----

def run_module_script(setup: str, *args: str) -> str:
    """A `python -m rsft.run ARGS` command line with `setup` run first (to patch a library function)."""
    return (f"import runpy, sys\n{setup}\n"
            f"sys.argv = ['rsft.run', *{list(args)!r}]\n"
            "runpy.run_module('rsft.run', run_name='__main__', alter_sys=True)\n")


def test_ctrl_c_says_how_to_resume(tmp_path):
    setup = "import rsft.preflight\ndef interrupted(cfg):\n    raise KeyboardInterrupt\nrsft.preflight.check_config = interrupted"
    done = subprocess.run([sys.executable, "-c", run_module_script(setup, "stage=sample", f"paths.runs_root={tmp_path}")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 130 and "Traceback" not in done.stderr  # 128 + SIGINT, as a shell reports Ctrl-C
    assert done.stderr.strip() == INTERRUPTED


INTERRUPTED = "interrupted; rerun the same command to resume (complete artifacts are kept)"
# stage=sample, with its dataset's write (rsft.sample.save_dataset, after every shard was sampled and kept) made slow:
# the test sends its signals while the command waits there, so nothing depends on how fast the machine samples
SLOW_WRITE = ("import time\nimport rsft.sample\nreal = rsft.sample.save_dataset\n"
              "def slow_save(ds, path):\n    real(ds, path)\n    print('writing', flush=True)\n{wait}\n"
              "rsft.sample.save_dataset = slow_save")
TINY_SAMPLE = ["stage=sample", *TINY]  # what make_cfg composes: the rerun in this process asks for the same artifact


@contextmanager
def running_command(setup: str, tmp_path, *args: str) -> Iterator[tuple[subprocess.Popen, PipeLines]]:
    """`python -m rsft.run` with `setup` run first, its stdout and stderr read together with deadlines;
    killed on the way out if it is still running (a failed assertion leaves no process behind)."""
    script = run_module_script(setup, *TINY_SAMPLE, f"paths.runs_root={tmp_path}/runs", *args)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=REPO)
    try:
        yield process, PipeLines(process.stdout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_mid_stage_stops_the_command_non_zero_and_the_rerun_resumes(make_cfg, tmp_path, caplog, stop):
    """Ctrl-C or SIGTERM while the stage writes: exit 130 / 143 with one line, nothing half-written left as
    complete (the temporary folder is removed, the lock released), the sampled shards kept; the same command
    resumes from them without sampling again and writes what an uninterrupted run writes."""
    slow = SLOW_WRITE.format(wait="    time.sleep(120)")
    with running_command(slow, tmp_path, "run_name=stopped") as (process, output):
        output.until("writing", timeout=300)
        process.send_signal(stop)
        text = output.rest(timeout=120)
        assert process.wait(30) == 128 + stop, text
    assert text.strip().splitlines()[-1] == INTERRUPTED and "Traceback" not in text, text
    stopped = RunPaths(tmp_path / "runs" / "stopped")
    round_dir = stopped.round_dir(0)
    assert not stopped.samples(0).exists() and not list(round_dir.glob(".samples.tmp-*"))
    assert list(round_dir.glob(".samples.shards/*.json"))
    assert (stopped.root / ".lock").read_text() == ""  # released: the holder's record is cleared on the way out
    with caplog.at_level(logging.INFO, logger="rsft.generation"):
        resumed = load_from_disk(str(run_stage(make_cfg("stage=sample", "run_name=stopped")).path))
    assert "resumed: 1 of 1 shard(s)" in caplog.text  # not sampled again
    straight = load_from_disk(str(run_stage(make_cfg("stage=sample", "run_name=straight")).path))
    assert resumed["completion_ids"] == straight["completion_ids"] and resumed["seed"] == straight["seed"]


def test_a_ctrl_c_a_finaliser_swallows_still_stops_the_command_non_zero(make_cfg, tmp_path):
    """The report: a SIGINT during SFT landed in datasets' Dataset.__del__, Python printed "Exception ignored in
    ... KeyboardInterrupt", and the loop went on to exit 0. Here it lands in a finaliser too; the stage finishes
    its write (a complete artifact is kept), and the runner's next safe point stops the command: exit 130."""
    finaliser = ("    class Finaliser:\n        def __del__(self):\n            print('finalising', flush=True)\n"
                 "            time.sleep(120)\n    Finaliser()")
    with running_command(SLOW_WRITE.format(wait=finaliser), tmp_path, "run_name=swallowed") as (process, output):
        output.until("finalising", timeout=300)
        process.send_signal(signal.SIGINT)
        text = output.rest(timeout=120)
        assert process.wait(30) == 130, text
    assert "Exception ignored in" in text and "Interrupted: interrupted by SIGINT" in text  # swallowed, as reported
    assert text.strip().splitlines()[-1] == INTERRUPTED, text
    samples = RunPaths(tmp_path / "runs" / "swallowed").samples(0)
    stamp = (samples / "meta.json").stat().st_mtime
    assert run_stage(make_cfg("stage=sample", "run_name=swallowed")).path == samples  # complete: reused
    assert (samples / "meta.json").stat().st_mtime == stamp


def test_a_second_signal_stops_the_command_at_once(tmp_path):
    """A stage that swallows every KeyboardInterrupt (a library's `except BaseException` in a retry loop) would
    keep a user waiting for the next safe point: the second Ctrl-C ends the process at once, still exit 130."""
    # the first signal is sent once the process says it is inside the try: sent after 'writing' alone, it could land
    # before the try (a loaded machine) and stop the command without being swallowed
    swallow = ("    for _ in range(3):\n        try:\n            print('waiting', flush=True)\n"
               "            time.sleep(60)\n        except KeyboardInterrupt:\n"
               "            print('swallowed', flush=True)")
    with running_command(SLOW_WRITE.format(wait=swallow), tmp_path) as (process, output):
        output.until("waiting", timeout=300)
        process.send_signal(signal.SIGINT)
        output.until("swallowed", timeout=60)
        process.send_signal(signal.SIGINT)
        text = output.rest(timeout=60)
        assert process.wait(30) == 130, text
    assert "SIGINT again: stopping at once" in text


def test_a_swallowed_signal_is_raised_at_the_next_safe_point_and_decides_the_exit_status(make_cfg):
    """In process: the handler records the signal before it raises; once a finaliser swallowed the
    KeyboardInterrupt, rsft.interrupts.check raises it again, the runner stops before a stage does any work,
    and the command ends as interrupted (143 for SIGTERM) whatever a library raised after the signal."""
    from rsft import interrupts
    from rsft.run import report_failure

    with interrupts.handled():
        assert interrupts.received() is None
        interrupts.check()  # nothing received: a no-op
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            pass  # what Dataset.__del__ did with it
        assert interrupts.received() == signal.SIGTERM and interrupts.exit_status() == 143
        with pytest.raises(interrupts.Interrupted, match="SIGTERM"):
            interrupts.check()
        cfg = make_cfg("stage=sample")
        with pytest.raises(interrupts.Interrupted):
            run_stage(cfg)
        assert not paths_of(cfg).samples(0).exists()  # stopped before the stage did any work
        with pytest.raises(SystemExit) as stop:
            report_failure(RuntimeError("DataLoader worker exited unexpectedly"))
        assert stop.value.code == 143
    assert interrupts.received() is None and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


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
    PipeLines(proc.stdout).until("writing", timeout=300)  # Hydra's log lines come first
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
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


def test_an_artifact_deleted_and_rebuilt_identically_is_the_same_input_downstream(make_cfg, monkeypatch):
    """Delete round 0's samples and rerun: they are rebuilt byte-identical in every row, only datasets' random
    state.json `_fingerprint` differs, so their digest is the same and the scores built from them are reused,
    not refused as "rebuilt or replaced". Samples rebuilt with other rows (the same settings) are refused."""
    import shutil

    from rsft.rows import save_dataset
    from rsft.store import read_meta

    cfg = make_cfg("stage=score")
    install_fake_reward(monkeypatch, cfg)
    samples = run_stage(make_cfg("stage=sample")).path
    scored = run_stage(cfg).path
    digest, state = read_meta(samples)["digest"], (samples / "state.json").read_text()
    stamp = (scored / "meta.json").stat().st_mtime
    shutil.rmtree(samples)
    run_stage(make_cfg("stage=sample"))
    assert (samples / "state.json").read_text() != state  # the random fingerprint: new on every save
    assert read_meta(samples)["digest"] == digest
    assert run_stage(cfg).path == scored and (scored / "meta.json").stat().st_mtime == stamp  # reused

    def other_rows(ds, folder):  # a sampler that did not reproduce: the same settings, another completion
        save_dataset(ds.map(lambda row, i: {"completion": row["completion"] + "!" * (i == 0)}, with_indices=True),
                     folder)

    monkeypatch.setattr("rsft.sample.save_dataset", other_rows)
    shutil.rmtree(samples)
    run_stage(make_cfg("stage=sample"))
    assert read_meta(samples)["digest"] != digest
    with pytest.raises(StaleArtifact, match=r"input artifact round_00/samples: rebuilt or replaced"):
        run_stage(cfg)


def test_the_digest_is_of_content_not_of_metadata(make_cfg, tmp_path):
    """content_digest: two saves of the same rows (a Dataset, a DatasetDict), of the same model (save_pretrained)
    and a metrics.json with other timings have one digest; another row, another format or another weight do
    not. A digest recorded before this rule is read from meta.json as it is, so a finished run stays reusable."""
    from datasets import Dataset, DatasetDict

    from rsft.store import check_fresh, read_meta

    def saved(name, write, measured=None):
        with atomic_artifact(tmp_path / name, {"stage": "test"}, {"config": {"k": 1}, "inputs": {}, "user_files": {}}) \
                as tmp:
            write(tmp)
            if measured is not None:
                (tmp / "metrics.json").write_text(json.dumps({"accuracy": 0.5, "train_seconds": measured}))
        return read_meta(tmp_path / name)["digest"]

    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]

    def save_rows(i):  # what two processes' save_to_disk of the same rows write: another random _fingerprint
        def write(tmp):
            Dataset.from_list(rows).save_to_disk(str(tmp))
            state = json.loads((tmp / "state.json").read_text())
            (tmp / "state.json").write_text(json.dumps({**state, "_fingerprint": f"{i:016x}"}, indent=2))
        return write

    same_rows = {saved(f"rows{i}", save_rows(i), measured=0.1 * i) for i in range(2)}
    assert len(same_rows) == 1
    assert (tmp_path / "rows0" / "state.json").read_text() != (tmp_path / "rows1" / "state.json").read_text()
    assert saved("other_row", lambda tmp: Dataset.from_list(rows[:1]).save_to_disk(str(tmp)), 0.0) not in same_rows
    assert saved("other_format", lambda tmp: Dataset.from_list(rows).with_format("numpy").save_to_disk(str(tmp)),
                 0.0) not in same_rows
    splits = lambda tmp: DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:1])}) \
        .save_to_disk(str(tmp))  # noqa: E731
    assert saved("splits0", splits) == saved("splits1", splits)

    cfg = make_cfg("stage=sample")
    model, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, torch.device("cpu"))

    def pretrained(tmp):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    first = saved("model0", pretrained)
    assert saved("model1", pretrained) == first  # save_pretrained writes no random bits
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert saved("model2", pretrained) != first

    # a run made before: its digests (of state.json's bytes) are read as recorded, never recomputed
    old = tmp_path / "rows0"
    meta = read_meta(old)
    (old / "meta.json").write_text(json.dumps({**meta, "digest": "0123456789abcdef"}))
    with atomic_artifact(tmp_path / "downstream", {"stage": "test"},
                         {"config": {}, "inputs": {"rows0": "0123456789abcdef"}, "user_files": {}}):
        pass
    assert check_fresh(tmp_path / "downstream", tmp_path)["fingerprint"]["inputs"] == {"rows0": "0123456789abcdef"}


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
    from rsft.trl_common import check_trained

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
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(f"cannot create the run folder {blocker}/demo: {blocker} is not a folder")


def test_a_unicode_run_name_is_accepted(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=nope", "run_name=résumé-été",
                           f"paths.runs_root={tmp_path}"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert "stage='nope' is not a stage" in done.stderr  # parsed: Hydra's lexer did not stop it
    assert (tmp_path / "résumé-été").is_dir()  # Hydra's log folder, under the name as typed


def test_a_lock_that_is_a_folder_and_the_last_of_repeated_settings_are_one_line(tmp_path):
    run = tmp_path / "runs" / "demo"
    (run / ".lock").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=sample", "policy=tiny", "logger=none",
                           f"paths.runs_root={tmp_path}/runs"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"{run / '.lock'} is not a file" in done.stderr
    # Hydra takes the last of repeated overrides; so do the checks made before it starts
    done = subprocess.run([sys.executable, "-m", "rsft.run", "stage=sample", "run_name=ok", "run_name=../../x",
                           f"paths.runs_root={tmp_path}/runs"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode != 0 and "run_name='../../x'" in done.stderr and not (tmp_path / "x").exists()
