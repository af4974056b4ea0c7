"""Run stages in order under a launcher: `torchrun --nproc-per-node N tests/distributed_job.py JOB.json`.

JOB.json: {"runs_root": ..., "stages": [[override, ...], ...], "kill": {"rank": r, <when>}}.
With "kill", process r kills itself (SIGKILL), <when> being one of: "sft_round": k, when stage=sft starts
round k (a rank lost mid-loop); "shards": n, once it has saved its n-th shard of sampling (mid-stage);
"checkpoint": s, once the training checkpoint of step s is saved and verified (mid-training); "online_batch": b,
when stage=online starts mini-batch b.
The same composition as tests/conftest.py (the tiny models, no wandb).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import compose_cfg  # noqa: E402


def _kill_mid_stage(kill: dict) -> None:
    import rsft.store
    import rsft.checkpoints

    if "shards" in kill:
        real_save, saved = rsft.store.ShardStore.save, []

        def dying_save(self, *args, **kwargs):
            real_save(self, *args, **kwargs)
            saved.append(1)
            if len(saved) == kill["shards"]:
                os.kill(os.getpid(), signal.SIGKILL)

        rsft.store.ShardStore.save = dying_save
    if "checkpoint" in kill:
        real_saved = rsft.checkpoints.TrainingCheckpoints.saved

        def dying_saved(self, step):
            real_saved(self, step)
            if step == kill["checkpoint"]:
                os.kill(os.getpid(), signal.SIGKILL)

        rsft.checkpoints.TrainingCheckpoints.saved = dying_saved
    if "online_batch" in kill:
        import rsft.online

        real_minibatch = rsft.online.run_minibatch

        def dying_minibatch(ctx, stream, progress, batch):
            if batch == kill["online_batch"]:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_minibatch(ctx, stream, progress, batch)

        rsft.online.run_minibatch = dying_minibatch


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # what the test reads in stderr
    import rsft.sft
    from rsft.run import run_stage

    kill = job.get("kill")
    if kill and int(os.environ.get("RANK", 0)) == kill["rank"] and "sft_round" in kill:
        real_sft = rsft.sft.build

        def dying_sft(cfg, job):
            if int(cfg.round) == kill["sft_round"]:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_sft(cfg, job)

        rsft.sft.build = dying_sft
    if kill and int(os.environ.get("RANK", 0)) == kill["rank"]:
        _kill_mid_stage(kill)
    for overrides in job["stages"]:
        # CPU processes (gloo) unless a stage names its device: on a machine with one GPU, two processes
        # would each ask for a GPU of their own (rsft.distributed refuses that, test_distributed checks it)
        cpu = [] if any(o.startswith("device=") for o in overrides) else ["device=cpu"]
        run_stage(compose_cfg(Path(job["runs_root"]), *cpu, *overrides))


if __name__ == "__main__":
    main()
