"""Run stages in order under a launcher: `torchrun --nproc-per-node N tests/distributed_job.py JOB.json`.

JOB.json: {"runs_root": ..., "stages": [[override, ...], ...], "kill": {"rank": r, "sft_round": k}}.
With "kill", process r kills itself (SIGKILL) when stage=sft starts round k: a rank lost mid-loop.
The same composition as tests/conftest.py (the tiny models, no wandb).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import compose_cfg  # noqa: E402


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    import rsft.sft
    from rsft.run import run_stage

    kill = job.get("kill")
    if kill and int(os.environ.get("RANK", 0)) == kill["rank"]:
        real_sft = rsft.sft.build

        def dying_sft(cfg, job):
            if int(cfg.round) == kill["sft_round"]:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_sft(cfg, job)

        rsft.sft.build = dying_sft
    for overrides in job["stages"]:
        run_stage(compose_cfg(Path(job["runs_root"]), *overrides))


if __name__ == "__main__":
    main()
