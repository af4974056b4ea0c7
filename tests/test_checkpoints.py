"""Training checkpoints count only when complete and verified (rsft.checkpoints.TrainingCheckpoints), for every
TRL trainer rsft runs: SFT, DPO and the reward model. A full disk while a checkpoint is saved is one line, and
the rerun with room resumes from the last complete checkpoint and ends where an uninterrupted run ends; a
damaged checkpoint is passed over with a message."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import Trainer

from reward.trained import load_scorer
from rsft.errors import ArtifactError
from rsft.models import load_saved_causal_lm
from rsft.paths import RunPaths
from rsft.run import run_stage
from rsft.checkpoints import MANIFEST, checkpoint_problem
from tests.test_rounds import write_sft_policy_and_pairs
from tests.test_sft import write_selected

TORCH_FULL_DISK = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"  # torch.save's words


def _sft(make_cfg, run_name, tmp_path):
    cfg = make_cfg("stage=sft", "sft.learning_rate=3e-3", "sft.epochs=2", "sft.batch_size=2", "sft.checkpoint_steps=3",
                   "device=cpu", f"run_name={run_name}")
    write_selected(cfg, n=8)
    return cfg


def _dpo(make_cfg, run_name, tmp_path):
    cfg = make_cfg("stage=dpo", "loop.dpo=true", "dpo.mode=full", "dpo.learning_rate=5e-3", "dpo.epochs=2",
                   "dpo.batch_size=2", "dpo.min_margin=0.5", "dpo.checkpoint_steps=3", "device=cpu",
                   f"run_name={run_name}")
    write_sft_policy_and_pairs(cfg, margins=[1.0] * 8)
    return cfg


def _reward(make_cfg, run_name, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"prompt": "q{i}", "chosen": "good {i}", "rejected": "bad {i}"}}\n' for i in range(12)))
    return make_cfg("stage=reward", "reward=tiny", f"reward.data.path={pairs}", "reward.data.eval_fraction=0.25",
                    "reward.epochs=8", "reward.checkpoint_steps=3", "reward.batch_size=9", "device=cpu", f"run_name={run_name}")


STAGES = {"sft": _sft, "dpo": _dpo, "reward": _reward}


def _weights(stage: str, path) -> list[torch.Tensor]:
    if stage == "reward":
        return [p.detach().clone() for p in load_scorer(path, "cpu").model.parameters()]
    return [p.detach().clone() for p in load_saved_causal_lm(path, torch.device("cpu"))[0].parameters()]


def _assert_same_weights(stage: str, a, b) -> None:
    worst = max(float((p - q).abs().max()) for p, q in zip(_weights(stage, a), _weights(stage, b)))
    assert worst == 0.0, f"resumed weights differ from an uninterrupted run's by up to {worst}: not identical"


def _train_loss(path) -> float:
    from rsft.store import read_meta

    meta = read_meta(path)
    return (meta.get("metrics") or meta.get("stats"))["train_loss"]


@pytest.fixture
def counted_steps(monkeypatch):
    """The optimizer steps trainers take (1-based), and a switch that kills training at the n-th one."""
    real_step, record = Trainer.training_step, {"steps": [], "kill_at": 0}

    def counting(self, *args, **kwargs):
        record["steps"].append(self.state.global_step + 1)
        if record["kill_at"] and len(record["steps"]) == record["kill_at"]:
            raise KeyboardInterrupt("killed")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", counting)
    return record


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_full_disk_while_a_checkpoint_saves_then_a_rerun_with_room_ends_as_an_uninterrupted_run(
        stage, make_cfg, monkeypatch, counted_steps, caplog, tmp_path):
    straight = run_stage(STAGES[stage](make_cfg, "straight", tmp_path)).path
    assert counted_steps["steps"] == list(range(1, 9))
    cfg = STAGES[stage](make_cfg, "full-disk", tmp_path)
    real_save = torch.save

    def disk_fills_at_the_second_checkpoint(obj, f, *args, **kwargs):
        if "checkpoint-6" in str(f):  # the weights are written by then: a checkpoint folder without its state
            raise RuntimeError(TORCH_FULL_DISK)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_fills_at_the_second_checkpoint)
    counted_steps["steps"].clear()
    with pytest.raises(ArtifactError, match=r"^no space left on device while saving a training checkpoint in "
                                            r".*the last complete one is kept: free space and rerun"):
        run_stage(cfg)
    out = RunPaths.from_config(cfg).root
    progress = next(p for p in out.glob("**/.*.checkpoints/*") if p.is_dir())
    assert sorted(c.name for c in progress.iterdir() if c.is_dir()) == ["checkpoint-3", "checkpoint-6"]
    assert checkpoint_problem(progress / "checkpoint-3") is None and checkpoint_problem(progress / "checkpoint-6")

    monkeypatch.setattr(torch, "save", real_save)  # room again: the same command
    counted_steps["steps"].clear()
    with caplog.at_level(logging.WARNING, logger="rsft.checkpoints"):
        resumed = run_stage(cfg).path
    assert counted_steps["steps"] == [4, 5, 6, 7, 8]  # from checkpoint-3; the half-saved checkpoint-6 is not trusted
    assert f"passing over the training checkpoint {progress / 'checkpoint-6'}: it has no readable {MANIFEST}" \
        in caplog.text
    assert not progress.exists()  # the progress goes once the artifact is written
    _assert_same_weights(stage, straight, resumed)
    # the recorded training loss is over every step, the ones before the resume too
    assert _train_loss(resumed) == pytest.approx(_train_loss(straight), rel=1e-6)


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_damaged_checkpoint_is_passed_over_with_a_message_and_training_starts_afresh(
        stage, make_cfg, counted_steps, caplog, tmp_path):
    straight = run_stage(STAGES[stage](make_cfg, "straight", tmp_path)).path
    cfg = STAGES[stage](make_cfg, "damaged", tmp_path)
    counted_steps["steps"].clear()
    counted_steps["kill_at"] = 5
    with pytest.raises(KeyboardInterrupt):
        run_stage(cfg)
    checkpoint = next(RunPaths.from_config(cfg).root.glob("**/.*.checkpoints/*/checkpoint-3"))
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other content
    weights.write_bytes(bytes(data))
    counted_steps["steps"].clear()
    counted_steps["kill_at"] = 0
    with caplog.at_level(logging.WARNING, logger="rsft.checkpoints"):
        resumed = run_stage(cfg).path
    assert counted_steps["steps"] == list(range(1, 9))  # nothing trusted: from the first step
    assert f"passing over the training checkpoint {checkpoint}: model.safetensors has" in caplog.text
    assert "no complete training checkpoint in" in caplog.text and "training from the first step" in caplog.text
    _assert_same_weights(stage, straight, resumed)


def test_a_checkpoint_without_its_manifest_or_with_a_missing_file_is_not_trusted(tmp_path):
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    assert "no readable" in checkpoint_problem(checkpoint)
    (checkpoint / MANIFEST).write_text('{"files": {"trainer_state.json": {"size": 2, "crc32": "00000000"}, '
                                       '"optimizer.pt": {"size": 9, "crc32": "00000000"}}}')
    assert "CRC-32" in checkpoint_problem(checkpoint)
    from reward.digests import file_digest

    (checkpoint / MANIFEST).write_text('{"files": {"trainer_state.json": %s, "optimizer.pt": {"size": 9, "crc32": "0"}}}'
                                       % __import__("json").dumps(file_digest(checkpoint / "trainer_state.json")))
    assert checkpoint_problem(checkpoint) == "optimizer.pt is missing"


def test_write_failures_are_told_from_other_errors():
    import errno

    from rsft.store import write_failed

    assert write_failed(RuntimeError(TORCH_FULL_DISK))
    assert write_failed(OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise ValueError("a library's own words") from inner
    except ValueError as outer:
        assert write_failed(outer)
    assert not write_failed(RuntimeError("[enforce fail at inline_container.cc:230] . file not found: archive/data.pkl"))
    assert not write_failed(ValueError("No space in this string"))


# ---- the drafts' own training loops (rsft.draft.resumable_epochs, rsft.checkpoints.LoopCheckpoints) ----

DRAFTS = {"distilled": ["distill.epochs=6", "distill.checkpoint_steps=5"],
          "feature": ["draft=feature", "draft.train.epochs=6", "draft.train.checkpoint_steps=5"]}


def _draft_weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("kind", list(DRAFTS))
def test_a_draft_whose_checkpoint_save_fills_the_disk_resumes_identical_and_passes_over_damage(
        kind, make_cfg, monkeypatch, caplog):
    """A full disk at the second checkpoint (step 10): one line, the first checkpoint kept, the rerun resumes
    from step 5 and saves the draft an uninterrupted run saves. Then the same with checkpoint-5 damaged:
    passed over with a message, training from the first step, the same draft again."""
    from tests.test_draft import SMALL

    steps = []
    real_clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: steps.append(1) or real_clip(*a, **k))
    settings = [*SMALL, *DRAFTS[kind]]
    run_stage(make_cfg("stage=sample", *SMALL))  # the draft's training sequences
    straight = run_stage(make_cfg("stage=draft", *settings, "run_name=demo")).path
    total = len(steps)
    assert total > 10
    expected = _draft_weights(straight)
    real_save = torch.save

    def full_at_step_10(obj, f, *args, **kwargs):
        if "checkpoint-10" in str(f):
            raise RuntimeError(TORCH_FULL_DISK)
        return real_save(obj, f, *args, **kwargs)

    for damage in (False, True):
        cfg = make_cfg("stage=draft", *settings, "overwrite=true")
        monkeypatch.setattr(torch, "save", full_at_step_10)
        steps.clear()
        with pytest.raises(ArtifactError, match=r"^no space left on device while saving a training checkpoint"):
            run_stage(cfg)
        assert len(steps) == 10
        folder = next(p for p in straight.parent.glob(".draft.checkpoints/*") if p.is_dir())
        assert [c.name for c in folder.iterdir()] == ["checkpoint-5"]  # the half-saved one is gone
        if damage:
            state = folder / "checkpoint-5" / "state.pt"
            state.write_bytes(state.read_bytes()[:-10])
        monkeypatch.setattr(torch, "save", real_save)
        steps.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rsft.checkpoints"):
            resumed = run_stage(make_cfg("stage=draft", *settings, "overwrite=true")).path
        assert len(steps) == (total if damage else total - 5)
        assert ("passing over the training checkpoint" in caplog.text) == damage
        got = _draft_weights(resumed)
        assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got), kind


def test_damaged_manifests_and_junk_names_are_passed_over_not_crashed_on(tmp_path, caplog):
    import json

    from rsft.checkpoints import TrainingCheckpoints

    checkpoints = TrainingCheckpoints(tmp_path / "policy", {"a": 1})
    for name, manifest in (("checkpoint-3", {"files": []}), ("checkpoint-4", {"files": {"x": {}}}),
                           ("checkpoint-5", {"files": {}})):
        (checkpoints.folder / name).mkdir(parents=True)
        (checkpoints.folder / name / MANIFEST).write_text(json.dumps(manifest))
    (checkpoints.folder / "checkpoint-²").mkdir()  # str.isdigit() says yes, int() says no
    with caplog.at_level(logging.WARNING, logger="rsft.checkpoints"):
        assert checkpoints.resume_from() is None
    assert caplog.text.count("is damaged (expected each file's size and CRC-32)") == 3
    assert [p.name for p in checkpoints.folder.iterdir()] == ["checkpoint-²"]  # not rsft's: left alone


def test_debris_where_progress_is_kept_is_removed_and_a_refused_write_is_one_line(tmp_path, make_cfg, monkeypatch):
    import errno

    from rsft.checkpoints import TrainingCheckpoints

    (tmp_path / ".policy.checkpoints").write_text("debris")
    assert TrainingCheckpoints(tmp_path / "policy", {"a": 1}).resume_from() is None
    cfg = make_cfg("stage=sample")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", "/runs/demo/round_00/.samples.shards/x.json")

    monkeypatch.setattr("rsft.store.ShardStore.save", read_only)
    with pytest.raises(ArtifactError, match=r"^cannot write /runs/demo/round_00/.samples.shards/x.json "
                                            r"\(Read-only file system\) while building .*make it writable"):
        run_stage(cfg)


def test_a_checkpoint_folder_is_named_as_transformers_names_it():
    """rsft.checkpoints imports no transformers (the runner hands every training stage its folder), so it spells
    transformers' checkpoint prefix itself: the Trainer's resume_from_checkpoint and get_last_checkpoint read it."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    from rsft.checkpoints import PREFIX

    assert PREFIX == PREFIX_CHECKPOINT_DIR


def test_a_checkpoint_loads_to_an_indexed_cpu_device_once_resume_registers_it(tmp_path):
    """transformers < 5.24 maps a resumed optimizer's state to args.device, "cpu:N" in a CPU world of several
    processes on a GPU machine; torch alone refuses that location (the resume failed on an H200)."""
    import torch.serialization

    from rsft.checkpoints import restorable_to_indexed_cpu

    path = tmp_path / "optimizer.pt"
    state = {"exp_avg": torch.arange(6.0).reshape(2, 3), "step": torch.tensor(4)}
    torch.save(state, path)
    restorable_to_indexed_cpu()
    before = len(torch.serialization._package_registry)
    restorable_to_indexed_cpu()
    assert len(torch.serialization._package_registry) == before  # registered once
    for index in (0, 1):
        loaded = torch.load(path, map_location=torch.device("cpu", index), weights_only=True)
        assert loaded["exp_avg"].device.type == "cpu" and torch.equal(loaded["exp_avg"], state["exp_avg"])
    assert torch.equal(torch.load(path, map_location="cpu", weights_only=True)["step"], state["step"])
