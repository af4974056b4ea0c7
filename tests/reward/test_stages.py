"""stage=prefs then stage=reward through Hydra compose, with the tiny policy and tiny reward model."""

from pathlib import Path

import pytest
from datasets import load_from_disk
from hydra import compose, initialize_config_dir

from reward.trained import load_scorer
from rsft.store import is_complete, read_meta
from rsft.run import run_stage

CONF = str(Path(__file__).parents[2] / "conf")


def config(tmp_path, stage, *extra):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=[f"stage={stage}", "policy=tiny", "reward=tiny", "logger=none",
                                            f"paths.runs_root={tmp_path}", f"paths.cache_dir={tmp_path}/cache",
                                            "prefs.num_prompts=4", "prefs.max_new_tokens=8", "device=cpu", *extra])


def test_prefs_then_reward(tmp_path):
    prefs_dir = run_stage(config(tmp_path, "prefs", "prefs.soft=false")).path
    assert is_complete(prefs_dir)
    splits = load_from_disk(str(prefs_dir))
    assert set(splits) == {"train", "test"}
    assert not set(splits["train"]["prompt_id"]) & set(splits["test"]["prompt_id"])
    assert {"prompt", "chosen", "rejected", "label_prob", "gold_chosen", "gold_rejected"} <= set(splits["train"].column_names)
    assert all(p == 1.0 for p in splits["train"]["label_prob"])  # hard labels, chosen = the winner
    assert read_meta(prefs_dir)["counts"]["pairs"] == len(splits["train"]) + len(splits["test"])

    reward_dir = run_stage(config(tmp_path, "reward", "reward.epochs=1")).path
    metrics = read_meta(reward_dir)["metrics"]
    assert 0.0 <= metrics["heldout_accuracy"] <= 1.0 and metrics["heldout_pairs"] > 0
    assert (Path(reward_dir) / "metrics.json").is_file()
    scorer = load_scorer(reward_dir, "cpu")
    assert scorer.std > 0 and len(scorer.score(["a", "b"], ["x", "y"], progress=False)) == 2
    assert run_stage(config(tmp_path, "reward")).path == reward_dir  # complete: skips


def test_soft_prefs(tmp_path):
    splits = load_from_disk(str(run_stage(config(tmp_path, "prefs", "prefs.soft=true", "prefs.tau=0.5")).path))
    labels = list(splits["train"]["label_prob"]) + list(splits["test"]["label_prob"])
    assert all(0.5 <= p <= 1.0 for p in labels) and any(p < 1.0 for p in labels)


def test_reward_on_user_pairs_and_missing_prefs(tmp_path):
    with pytest.raises(FileNotFoundError, match="stage=prefs"):
        run_stage(config(tmp_path, "reward"))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"prompt": "q{i}", "chosen": "good {i}", "rejected": "bad {i}"}}\n' for i in range(12)))
    reward_dir = run_stage(config(tmp_path, "reward", f"reward.data.path={pairs}", "reward.data.eval_fraction=0.25")).path
    assert read_meta(reward_dir)["metrics"]["heldout_pairs"] == 3


def test_prefs_needs_the_demo_task(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"prompt": "there"}\n')
    with pytest.raises(ValueError, match="demo task"):
        run_stage(config(tmp_path, "prefs", "data=local", f"data.path={prompts}"))


def test_reward_training_killed_mid_way_resumes_from_its_last_checkpoint(tmp_path, monkeypatch):
    """8 steps, a checkpoint every 3, killed in step 5: the rerun trains steps 4-8 and ends with the weights an
    uninterrupted run ends with."""
    import torch
    from transformers import Trainer

    real_step, steps, kill = Trainer.training_step, [], {"at": 0}

    def counting(self, *args, **kwargs):
        steps.append(self.state.global_step + 1)
        if kill["at"] and len(steps) == kill["at"]:
            raise KeyboardInterrupt("killed")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", counting)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"prompt": "q{i}", "chosen": "good {i}", "rejected": "bad {i}"}}\n' for i in range(12)))
    settings = [f"reward.data.path={pairs}", "reward.data.eval_fraction=0.25", "reward.epochs=8",
                "reward.checkpoint_steps=3", "reward.batch_size=9"]
    straight = run_stage(config(tmp_path, "reward", *settings, "run_name=straight")).path
    assert steps == list(range(1, 9))
    steps.clear()
    kill["at"] = 5
    with pytest.raises(KeyboardInterrupt):
        run_stage(config(tmp_path, "reward", *settings, "run_name=killed"))
    assert list((tmp_path / "killed").glob(".reward.checkpoints/*/checkpoint-3"))
    steps.clear()
    kill["at"] = 0
    resumed = run_stage(config(tmp_path, "reward", *settings, "run_name=killed")).path
    assert steps == [4, 5, 6, 7, 8] and not list((tmp_path / "killed").glob(".reward.checkpoints"))
    a, b = load_scorer(straight, "cpu"), load_scorer(resumed, "cpu")
    texts = (["q1", "q2"], ["good 1", "bad 2"])
    assert torch.allclose(torch.tensor(a.score(*texts, progress=False)), torch.tensor(b.score(*texts, progress=False)),
                          atol=1e-5)
