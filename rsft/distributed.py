"""One stage on several processes: `accelerate launch [--num_processes N] -m rsft.run stage=...` or
`torchrun --nproc-per-node N -m rsft.run stage=...`; a plain `python -m rsft.run` is a world of one.

accelerate's PartialState reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, ...) and initialises torch.distributed: gloo on CPU (PartialState(cpu=True); without
it accelerate ignores a CPU world launched by torchrun), nccl on GPUs with one device per process.
TRL's trainers use the same (singleton) state, so the reward and SFT stages train data-parallel
(DDP) with nothing more here. What this module adds, for the stages that sample or score:

- shard(n): the indices this rank handles, strided (rank r takes r, r + W, ...) so that ranks get
  similar work; a rank may get none (more ranks than prompts) and still reaches every collective.
- gather(items): every rank's list, concatenated in rank order, on every rank (all_gather_object).
- main process: rank 0 alone writes artifacts (rsft.paths), takes the run-directory lock, logs to
  wandb and writes the report; the others wait at barrier() and then read what it wrote.
- same_config(cfg): ranks started with different configs stop with a clear error.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, ContextManager, Iterator

import torch
from omegaconf import DictConfig, OmegaConf

from rsft.errors import ConfigError

_STATE = None


def init(device: str) -> None:
    """Join the launcher's process group (a no-op for a world of one, or when already joined)."""
    global _STATE
    if _STATE is not None:
        return
    from accelerate import PartialState

    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    check_devices_per_process(device, wants_cuda)
    _STATE = PartialState(cpu=not wants_cuda)
    if _STATE.num_processes > 1 and not wants_cuda and torch.cuda.is_available():
        _wait_on_the_cpu(type(_STATE))


def _wait_on_the_cpu(state_class) -> None:
    """A CPU world (gloo) on a machine that has GPUs: accelerate's wait_for_everyone passes
    device_ids=[local rank] to torch.distributed.barrier, and torch then puts the barrier's tensor on
    cuda:<local rank> even for gloo. With one GPU, rank 1 asked for cuda:1 and died at the first barrier (the
    multi-process tests, on the GPU machine of 2026-11-27). Every caller in the process (rsft, and TRL's and
    accelerate's own waits, which go through the shared PartialState) gets a plain barrier instead, which
    torch runs on the CPU for a gloo group. accelerate has no setting for this, hence the patch."""
    def wait_for_everyone(self) -> None:
        torch.distributed.barrier()

    state_class.wait_for_everyone = wait_for_everyone


def check_devices_per_process(device: str, wants_cuda: bool) -> None:
    """One GPU per process: a launcher that starts more processes on a machine than it has GPUs would
    have process i ask for cuda:i, which does not exist, and hang or fail at the first collective. Refused
    before the process group starts, naming both counts."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not wants_cuda or processes <= 1:
        return
    gpus = torch.cuda.device_count()
    if processes > gpus:
        raise ConfigError(f"device={device}: {processes} processes on this machine but {gpus} CUDA device(s); "
                          f"rsft gives each process its own GPU: launch at most {gpus} process(es) "
                          f"(--nproc-per-node {gpus}), or set device=cpu for CPU processes")


def world_size() -> int:
    return _STATE.num_processes if _STATE is not None else 1


def rank() -> int:
    return _STATE.process_index if _STATE is not None else 0


def local_rank() -> int:
    return _STATE.local_process_index if _STATE is not None else 0


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if world_size() > 1:
        _STATE.wait_for_everyone()


def shard(n: int) -> list[int]:
    """The indices of n items this rank handles: rank, rank + W, rank + 2W, ..."""
    return list(range(rank(), n, world_size()))


def gather(items: list) -> list:
    """Every rank's `items`, concatenated in rank order, on every rank."""
    if world_size() == 1:
        return list(items)
    from accelerate.utils import gather_object

    return gather_object(list(items))


def gather_each(value: Any) -> list:
    """One value per rank, in rank order, on every rank."""
    return gather([value])


def broadcast(value: Any) -> Any:
    """Rank 0's value, on every rank."""
    if world_size() == 1:
        return value
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box, from_process=0)
    return box[0]


def same_config(cfg: DictConfig) -> None:
    """Stop (ConfigError, on every rank) when ranks were started with different resolved configs."""
    if world_size() == 1:
        return
    digest = hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()[:12]
    digests = gather_each(digest)
    if len(set(digests)) > 1:
        raise ConfigError(f"the {len(digests)} ranks were started with different configs (hashes by rank: "
                          f"{digests}); launch every rank with the same command and overrides")


def per_device_batch(setting: str, batch_size: int) -> int:
    """The per-process batch that keeps `batch_size` the global batch (per step, before accumulation)."""
    world = world_size()
    if batch_size % world:
        raise ConfigError(f"{setting}={batch_size}: the global batch must divide evenly over the {world} "
                          f"processes; use a multiple of {world} (or grad_accum for larger batches)")
    return batch_size // world


@contextmanager
def on_main(enter: Callable[[], ContextManager]) -> Iterator[None]:
    """Enter a context (the run-directory lock) on rank 0 only; if that fails, every rank raises its
    error instead of waiting at a barrier for a rank that has stopped."""
    with ExitStack() as stack:
        error = None
        if is_main():
            try:
                stack.enter_context(enter())
            except Exception as failure:  # RunDirectoryBusy, OSError on the run directory
                error = failure
        error = broadcast(error)
        if error is not None:
            raise error
        yield
