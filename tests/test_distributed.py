"""Two CPU processes (torchrun, gloo) on the tiny models: the same artifacts as one process; DDP training
saves one model; a loop that loses a rank resumes; mismatched ranks and idle ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from datasets import load_from_disk

from rsft.paths import RunPaths
from rsft.run import run_stage
from rsft.store import copy_artifact, is_complete, read_meta
from tests.conftest import REPO

JOB = REPO / "tests" / "distributed_job.py"
PREFS = ["prefs.num_prompts=4", "prefs.num_samples=2", "reward=tiny", "device=cpu"]
BUDGET = ["sample.prune.at=[2,4]", "sample.adaptive_k.k0=2", "sample.adaptive_k.mean=2.5"]


def launch(tmp_path, stages: list[list[str]], kill: dict | None = None, processes: int = 2):
    job = tmp_path / f"job-{len(list(tmp_path.glob('job-*.json')))}.json"
    job.write_text(json.dumps({"runs_root": str(tmp_path), "stages": stages, "kill": kill}))
    # gloo over the loopback interface: by default it binds to the address the hostname resolves to, which on a
    # machine without a network (a lent GPU box) need not be reachable, and the first barrier then fails
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                           "--standalone", str(JOB), str(job)],
                          capture_output=True, text=True, cwd=REPO, timeout=300, env=env)


def why(done) -> str:
    """A failed launch's message: what the ranks wrote last before torchrun's own traceback (ChildFailedError and
    the exit codes, which filled the tail on its own and left the rank's error unread on the GPU machine,
    2026-11-28), then the tail."""
    launcher = done.stderr.find('Traceback (most recent call last):\n  File "<frozen runpy>"')
    ranks = done.stderr[:launcher] if launcher >= 0 else ""
    return f"{ranks[-3000:]}\n... torchrun:\n{done.stderr[-1500:]}"


def rows(path, *columns):
    ds = load_from_disk(str(path))
    return {c: ds[c] for c in columns}


def test_two_processes_write_the_artifacts_one_process_writes(make_cfg, tmp_path):
    two = ["run_name=two", *PREFS]
    done = launch(tmp_path, [["stage=prefs", *two], ["stage=reward", *two], ["stage=sample", *two],
                             ["stage=score", *two], ["stage=eval", "eval.policy=initial", *two],
                             ["stage=select", *two], ["stage=sft", *two], ["stage=sample", "round=1", *BUDGET, *two],
                             ["stage=sample", "run_name=idle", "data.limit=1", "device=cpu", "sample.num_samples=2"]])
    assert done.returncode == 0, why(done)
    dist = RunPaths(tmp_path / "runs" / "two")
    # training: DDP over both processes, one complete model saved
    assert read_meta(dist.reward)["metrics"]["world_size"] == 2 and read_meta(dist.policy(0))["stats"]["world_size"] == 2
    assert sorted(p.name for p in dist.root.iterdir() if p.name.startswith(".")) == [".lock"]  # no temporary debris
    # sampling and scoring: row for row what one process writes from the same reward model
    one = RunPaths(tmp_path / "runs" / "one")
    copy_artifact(dist.reward, one.reward)
    for stage in ("prefs", "sample", "score"):
        run_stage(make_cfg(f"stage={stage}", "run_name=one", *PREFS))
    run_stage(make_cfg("stage=eval", "eval.policy=initial", "run_name=one", *PREFS))
    assert read_meta(dist.samples(0))["sampling"]["world_size"] == 2
    assert rows(dist.prefs / "train", "chosen", "rejected") == rows(one.prefs / "train", "chosen", "rejected")
    for path in ("samples", "scored"):
        a, b = rows(getattr(dist, path)(0), "prompt_id", "completion_ids", "seed"), rows(getattr(one, path)(0),
                                                                                         "prompt_id", "completion_ids", "seed")
        assert a == b, path
    assert rows(dist.scored(0), "reward")["reward"] == pytest.approx(rows(one.scored(0), "reward")["reward"], abs=1e-5)
    assert rows(dist.initial_eval, "completion_ids") == rows(one.initial_eval, "completion_ids")
    assert rows(dist.initial_eval, "reward")["reward"] == pytest.approx(rows(one.initial_eval, "reward")["reward"],
                                                                        abs=1e-5)
    # pruning and adaptive K: each process prunes its own prompts, one allocation over all of them
    copy_artifact(dist.policy(0), one.policy(0))
    run_stage(make_cfg("stage=sample", "round=1", "run_name=one", *BUDGET, *PREFS))
    budget = ("prompt_id", "sample_idx", "completion_ids", "finish_reason")
    assert rows(dist.samples(1), *budget) == rows(one.samples(1), *budget)
    assert "pruned" in rows(one.samples(1), "finish_reason")["finish_reason"]
    # more processes than prompts: the idle rank still reaches every collective
    assert len(load_from_disk(str(RunPaths(tmp_path / "runs" / "idle").samples(0)))) == 2


LOOP = ["stage=loop", "loop.rounds=2", "run_name=loop", "data.eval_limit=2", "eval.num_samples=2",
        "sft.learning_rate=1e-3", "select.drop_truncated=false", *PREFS]


def test_a_two_rank_loop_that_loses_a_rank_resumes(tmp_path):
    killed = launch(tmp_path, [LOOP], kill={"rank": 1, "sft_round": 1})
    assert killed.returncode != 0
    paths = RunPaths(tmp_path / "runs" / "loop")
    assert is_complete(paths.eval(0)) and not is_complete(paths.policy(1))
    resumed = launch(tmp_path, [LOOP])
    assert resumed.returncode == 0, why(resumed)
    assert is_complete(paths.eval(1)) and (paths.root / "summary.md").exists()


def test_ranks_started_with_different_configs_stop_with_a_clear_error(tmp_path):
    done = launch(tmp_path, [["stage=sample", "run_name=x", "device=cpu", "seed=${oc.env:RANK}"]])
    assert done.returncode != 0
    assert "ranks were started with different configs" in done.stderr
    assert not (tmp_path / "runs" / "x" / "round_00").exists()


def test_a_rank_killed_mid_sample_and_mid_sft_resumes_to_the_uninterrupted_two_process_artifacts(tmp_path):
    """Rank 1 is SIGKILLed after its first finished shard of sampling, and, in the next launch, once SFT's
    checkpoint of step 4 (of 8) is saved; each relaunch of the same stages resumes (shards, the verified
    checkpoint) and ends with what an uninterrupted 2-process run writes: the same rows, the same weights."""
    import torch

    from rsft.models import load_saved_causal_lm
    from tests.conftest import compose_cfg
    from tests.test_sft import write_selected

    settings = ["device=cpu", "data.limit=4", "sample.shard_prompts=1", "sft.epochs=2", "sft.batch_size=2",
                "sft.checkpoint_steps=2", "sft.learning_rate=3e-3"]
    for name in ("straight", "killed"):
        write_selected(compose_cfg(tmp_path, *settings, f"run_name={name}"), n=8)
    stages = [["stage=sample", *settings], ["stage=sft", *settings]]
    straight = launch(tmp_path, [[*stage, "run_name=straight"] for stage in stages])
    assert straight.returncode == 0, why(straight)
    killed = [[*stage, "run_name=killed"] for stage in stages]
    mid_sample = launch(tmp_path, killed, kill={"rank": 1, "shards": 1})
    paths, done = RunPaths(tmp_path / "runs" / "killed"), RunPaths(tmp_path / "runs" / "straight")
    assert mid_sample.returncode != 0 and not is_complete(paths.samples(0))
    assert list(paths.round_dir(0).glob(".samples.shards/*-rank1-*.json"))  # rank 1's finished shard is kept
    mid_sft = launch(tmp_path, killed, kill={"rank": 1, "checkpoint": 4})
    assert mid_sft.returncode != 0 and is_complete(paths.samples(0)), why(mid_sft)
    assert not is_complete(paths.policy(0))
    assert [c.name for c in paths.round_dir(0).glob(".policy.checkpoints/*/checkpoint-*")] == ["checkpoint-4"]
    resumed = launch(tmp_path, killed)
    assert resumed.returncode == 0, why(resumed)
    assert "resuming training from" in resumed.stderr and "(step 4)" in resumed.stderr
    columns = ("prompt_id", "sample_idx", "completion_ids", "seed", "finish_reason")
    assert rows(paths.samples(0), *columns) == rows(done.samples(0), *columns)
    a = load_saved_causal_lm(paths.policy(0), torch.device("cpu"))[0].state_dict()
    b = load_saved_causal_lm(done.policy(0), torch.device("cpu"))[0].state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a), "resumed SFT weights differ from the uninterrupted run's"
    assert read_meta(paths.policy(0))["stats"]["world_size"] == 2


def test_more_processes_than_gpus_is_refused_before_the_process_group_starts(monkeypatch):
    """torchrun --nproc-per-node 2 on a machine with one GPU: process 1 would ask for cuda:1. rsft gives each
    process its own GPU, so it refuses and names both counts (the multi-process tests here run CPU processes,
    device=cpu, which any machine can)."""
    from rsft import distributed
    from rsft.errors import ConfigError

    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"device=auto: 2 processes on this machine but 1 CUDA device"):
        distributed.check_devices_per_process("auto", wants_cuda=True)
    distributed.check_devices_per_process("cpu", wants_cuda=False)  # CPU processes: any number
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    distributed.check_devices_per_process("cuda", wants_cuda=True)  # one process, one GPU


def test_a_cpu_world_on_a_machine_with_a_gpu_waits_at_a_cpu_barrier(monkeypatch):
    """accelerate's wait_for_everyone passes device_ids=[local rank] to torch.distributed.barrier, which then puts
    the barrier on cuda:<local rank> even in a gloo CPU world: rank 1 of two CPU processes on a one-GPU machine
    died there (the GPU check of 2026-11-27). init gives such a world a plain barrier (no device ids)."""
    import accelerate

    from rsft import distributed

    class TwoCpuProcesses:  # what PartialState(cpu=True) is under a launcher of two processes
        def __init__(self, cpu: bool):
            assert cpu
            self.num_processes = 2

        def wait_for_everyone(self):
            raise AssertionError("accelerate's own wait: device_ids=[local rank]")

    barriers = []
    monkeypatch.setattr(accelerate, "PartialState", TwoCpuProcesses)
    monkeypatch.setattr(distributed, "_STATE", None)
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distributed.torch.distributed, "barrier", lambda *a, **k: barriers.append((a, k)))
    distributed.init("cpu")
    distributed.barrier()
    assert barriers == [((), {})]  # no device_ids: torch runs a gloo group's barrier on the CPU


def test_two_processes_weighted_or_anchored_sft_start_at_plain_sfts_loss(make_cfg, tmp_path):
    """select.weight and sft.kl take SFT's loss by hand (rsft.policy_training.lever_sft_trainer): under DDP it is
    scaled as SFTTrainer scales its own (the token count is every rank's, the gradients are averaged), so with every
    weight 1, and with a KL term that is 0 at the first step, the first logged loss is plain SFT's."""
    from tests.test_sft import COMPLETION, write_weighted

    rows = [{"prompt_id": f"p{i}", "prompt": f"Tell me about bees, {i}.", "completion": COMPLETION + " " * (i % 2),
             "reward": 1.0, "weight": 1.0} for i in range(8)]
    for name in ("plain", "ones", "kl"):
        cfg = make_cfg("stage=sft", f"run_name={name}")
        write_weighted(cfg, [{k: v for k, v in r.items() if k != "weight" or name == "ones"} for r in rows])
    common = ["stage=sft", "device=cpu", "sft.learning_rate=3e-3"]
    done = launch(tmp_path, [[*common, "run_name=plain"], [*common, "run_name=ones"],
                             [*common, "run_name=kl", "sft.kl=0.5"]])
    assert done.returncode == 0, why(done)
    stats = {name: read_meta(RunPaths(tmp_path / "runs" / name).policy(0))["stats"] for name in ("plain", "ones", "kl")}
    assert all(s["world_size"] == 2 for s in stats.values())
    assert stats["ones"]["loss_first"] == pytest.approx(stats["plain"]["loss_first"], rel=1e-4)
    assert stats["kl"]["loss_first"] == pytest.approx(stats["plain"]["loss_first"], rel=1e-4)
