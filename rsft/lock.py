"""The run directory's lock: one command at a time per run directory."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rsft.errors import (
    ArtifactError,
    RunDirectoryBusy,
)

log = logging.getLogger(__name__)


LOCK_FILE = ".lock"


@contextmanager
def run_lock(run_dir: str | os.PathLike, command: str = "") -> Iterator[None]:
    """Hold the run directory exclusively for the length of one command.

    An flock on runs/<run_name>/.lock, which also holds the holder's pid, host, start time and
    command for the error message. The kernel releases an flock when its process dies (kill -9
    included), so a lock left by a dead process is simply taken over; one held by a live process
    is a RunDirectoryBusy error. On a shared runs root this relies on the file system supporting
    flock across machines (NFSv4 and Lustre/GPFS with flock enabled do; NFSv3 without lockd does
    not, and there two machines could both take it).
    """
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():  # rsft's own name; a folder or anything else there is not its lock
        raise ArtifactError(f"{path} is not a file (rsft keeps the run directory's lock there); remove it and rerun "
                            f"the same command")
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunDirectoryBusy(f"run directory {run_dir} is in use by {holder}; wait for it to finish, or use "
                                   f"another run_name=...") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on host {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}"
                     + (f" ({command})" if command else ""))
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)
