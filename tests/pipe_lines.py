"""A child process's output read with a deadline: every wait on a pipe in the tests is bounded.

A plain `for line in process.stderr` or `process.stdout.readline()` waits forever when the child never
writes the line (a server that never starts, a command stuck before its marker); a reader thread hands
the lines over a queue, and the test waits on the queue with a timeout instead.

    lines = PipeLines(process.stderr)
    lines.until("serving", timeout=120)      # the lines up to the first that contains "serving"
    lines.rest(timeout=30)                   # the remaining lines, once the child closed the pipe
"""

from __future__ import annotations

import queue
import threading
import time
from typing import IO

import pytest


class PipeLines:
    """The lines of `stream` (a text pipe), read by a daemon thread; every wait has a deadline."""

    def __init__(self, stream: IO[str]):
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._closed = False
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        try:
            for line in iter(stream.readline, ""):
                self._lines.put(line)
        finally:
            self._lines.put(None)  # the pipe closed: the child exited (or closed it)

    def _next(self, deadline: float, waiting_for: str) -> str | None:
        left = deadline - time.monotonic()
        try:
            line = self._lines.get(timeout=max(left, 0.0))
        except queue.Empty:
            pytest.fail(f"no {waiting_for} within the deadline; the output so far:\n{''.join(self.seen)[-3000:]}")
        if line is None:
            self._closed = True
        else:
            self.seen.append(line)
        return line

    def until(self, text: str, timeout: float) -> str:
        """The lines read so far up to and including the first that contains `text` (fails at the deadline or
        when the pipe closes first)."""
        deadline = time.monotonic() + timeout
        start = len(self.seen)
        while True:
            if self._closed:
                pytest.fail(f"the pipe closed before a line with {text!r}:\n{''.join(self.seen)[-3000:]}")
            line = self._next(deadline, f"line with {text!r}")
            if line is not None and text in line:
                return "".join(self.seen[start:])

    def rest(self, timeout: float) -> str:
        """The lines left until the pipe closes (fails at the deadline)."""
        deadline = time.monotonic() + timeout
        start = len(self.seen)
        while not self._closed:
            self._next(deadline, "end of the output")
        return "".join(self.seen[start:])
