"""Ctrl-C and SIGTERM stop a command, even where a library swallows the KeyboardInterrupt.

    with interrupts.handled():      # rsft.run.main, around the whole command
        ...
    interrupts.check()              # a safe point: rsft.runner before a stage and after its artifact is written,
                                    # rsft.store.ShardStore after each finished shard

The first SIGINT or SIGTERM is recorded and raised as Interrupted (a KeyboardInterrupt) wherever Python is.
A library may swallow it: a SIGINT during a round's SFT landed in datasets' Dataset.__del__, Python printed
"Exception ignored in ... KeyboardInterrupt", and the loop went on to exit 0. So the signal stays recorded,
and every safe point raises it again: the command stops at the next one at the latest. Its exit status is
128 + the signal (130 for SIGINT, 143 for SIGTERM) whenever one was received (exit_status), whatever else
happened after it. A second signal ends the process at once (os._exit), for a user who means it.

Either way the run directory stays resumable: an artifact is written under a temporary name and renamed
into place with meta.json written last (rsft.store), so a command stopped at any point, or killed, leaves
complete artifacts and finished shards and checkpoints, and the same command resumes from them.

The handlers are installed whatever disposition the process inherited: a shell starts a background job
(`cmd &`, nohup, some CI runners) with SIGINT ignored, and such a command must still stop on a SIGINT sent
to it. This module imports nothing of rsft.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM)

_received: int | None = None  # the first signal received while handled(), until it ends


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM, raised where the handler found Python and again at every safe point (check)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def received() -> int | None:
    """The signal this process received while its handlers were installed (None: none)."""
    return _received


def exit_status(default: int = 128 + signal.SIGINT) -> int:
    """128 + the signal received: 130 for SIGINT, 143 for SIGTERM; `default` when none was recorded (a
    KeyboardInterrupt raised by Python's own handler, or by hand)."""
    return 128 + _received if _received is not None else default


def check() -> None:
    """A safe point: raise Interrupted when a signal was received (and perhaps swallowed on the way here)."""
    if _received is not None:
        raise Interrupted(_received)


def _handle(signum: int, frame) -> None:
    global _received
    if _received is not None:  # the second: the user means it; what is complete on disk is kept
        os.write(2, f"\n{signal.Signals(signum).name} again: stopping at once\n".encode())
        os._exit(128 + _received)
    _received = signum
    raise Interrupted(signum)


@contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM handled as this module says, for the block (the main thread only: signals are
    delivered there; elsewhere this does nothing). The previous handlers and the record are restored after."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received = None
    try:
        with installed(_handle):
            yield
    finally:
        _received = None


@contextmanager
def installed(handler) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM inside the block, whatever disposition the process inherited (a
    background job starts with SIGINT ignored); the previous handlers are restored after. Main thread only."""
    previous = {signum: signal.getsignal(signum) for signum in HANDLED}
    for signum in HANDLED:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before if before is not None else signal.SIG_DFL)
