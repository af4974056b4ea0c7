"""rsft's error types, and how a command ends on one: the ground floor every other module may import (it
imports nothing of rsft; the refusal types that reward/ raises too are defined in reward.refusals and re-exported
here).

A deliberate refusal, something the user can act on, is an RsftError: every entry point (rsft.run.main,
each script in scripts/, `python -m rsft.serve_reward`) prints it as one line and exits 1;
RSFT_TRACEBACK=1 shows the traceback. Each message names the setting, file, row or folder and says what
to do. Anything else that escapes a stage (a KeyError inside a library, a TypeError after a refactor) is
a bug and shows its traceback.

Each class also derives from the built-in its refusals used to be (ValueError, FileNotFoundError,
RuntimeError), so an existing `except ValueError` or `pytest.raises(FileNotFoundError)` still catches it.
Pick the narrowest:

- ConfigError: a setting (or a combination of settings) the command cannot run with.
- InputError: a user's file or its rows: prompts, preference pairs, tables, a model folder they named.
- MissingInput: a file, folder or artifact the command needs that is not there.
- ArtifactError / StaleArtifact / DamagedArtifact: an artifact that must not be used as it is.
- RunDirectoryBusy: another command holds the run directory.
- MissingPackage: a package the settings need is not installed (vLLM for sample.backend=vllm, peft for LoRA).

A check that only a bug can fail (an internal invariant) raises a built-in, so that it shows a traceback.

report_failure says how a command ends on an exception, for every entry point alike: `python -m rsft.run`
(rsft.run.report_failure adds its reading of OmegaConf's errors), and through main_guard every script in
scripts/ and `python -m rsft.serve_reward` (`if __name__ == "__main__": main_guard(main)()`).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from reward.refusals import ConfigError, InputError, MissingInput, MissingPackage, RsftError  # noqa: F401  (re-exported)


class ArtifactError(RsftError, RuntimeError):
    """An artifact that must not be used as it is."""


class StaleArtifact(ArtifactError):
    """A complete artifact made from other settings or inputs than the ones asked for now."""


class DamagedArtifact(ArtifactError):
    """A complete artifact whose meta.json or files do not match what was written."""


class RunDirectoryBusy(RsftError, RuntimeError):
    """Another live command holds the run directory's lock."""


# what the entry point turns into one line; every other exception is a bug and keeps its traceback
USER_ERRORS = (RsftError,)

BUG_REPORT = ("this is a bug in rsft, not a problem with your settings: please report it with the command, "
              "this traceback and the output of `pip freeze`")
TRACEBACK_HINT = "(RSFT_TRACEBACK=1 shows the traceback)"


def report_failure(error: BaseException, explain: Callable[[BaseException], str | None] | None = None,
                   interrupted: str = "interrupted") -> NoReturn:
    """How a command ends on an exception (it always raises SystemExit, or the error itself).

    A user error (USER_ERRORS, or one `explain` turns into a line) ends in that line, then a line saying
    how to see the traceback, exit 1; RSFT_TRACEBACK=1 raises the error with its traceback instead.
    Ctrl-C (a KeyboardInterrupt) ends in the line `interrupted` on stderr and exit status 128 + the signal
    (130; 143 for rsft.interrupts' SIGTERM), as a shell reports a command a signal stopped. A SystemExit
    passes (argparse's usage errors, a script's exit status). Anything else is a bug: its traceback is
    logged on the "rsft" logger (stderr when nothing configured logging), then a line saying so, exit 1."""
    if isinstance(error, SystemExit):
        raise error
    if isinstance(error, KeyboardInterrupt):
        print(interrupted, file=sys.stderr, flush=True)
        raise SystemExit(128 + getattr(error, "signum", signal.SIGINT)) from None
    message = str(error) if isinstance(error, USER_ERRORS) else explain(error) if explain else None
    if message is not None:
        if os.environ.get("RSFT_TRACEBACK"):
            raise error
        raise SystemExit(f"{message}\n{TRACEBACK_HINT}") from None
    logging.getLogger("rsft").error("the command failed with an unexpected %s:", type(error).__name__, exc_info=error)
    raise SystemExit(BUG_REPORT) from None


def main_guard(main: Callable) -> Callable:
    """`main` ending as report_failure says (it returns what main returns): a script's entry point is
    `if __name__ == "__main__": main_guard(main)()`."""
    @functools.wraps(main)
    def guarded(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001  (report_failure re-raises or ends the command)
            report_failure(error)
    return guarded
