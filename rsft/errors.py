"""rsft's error types: the ground floor every other module may import (it imports nothing of rsft).

A deliberate refusal, something the user can act on, is an RsftError: the entry point
(rsft.run.main) prints it as one line and exits 1; RSFT_TRACEBACK=1 shows the traceback. Each message
names the setting, file, row or folder and says what to do. Anything else that escapes a stage (a
KeyError inside a library, a TypeError after a refactor) is a bug and shows its traceback.

Each class also derives from the built-in its refusals used to be (ValueError, FileNotFoundError,
RuntimeError), so an existing `except ValueError` or `pytest.raises(FileNotFoundError)` still catches it.
Pick the narrowest:

- ConfigError: a setting (or a combination of settings) the command cannot run with.
- InputError: a user's file or its rows: prompts, preference pairs, tables, a model folder they named.
- MissingInput: a file, folder or artifact the command needs that is not there.
- ArtifactError / StaleArtifact / DamagedArtifact: an artifact that must not be used as it is.
- RunDirectoryBusy: another command holds the run directory.

A check that only a bug can fail (an internal invariant) raises a built-in, so that it shows a traceback.
"""

from __future__ import annotations


class RsftError(Exception):
    """Base of every deliberate refusal: printed as one line by the entry point, never a traceback."""


class ConfigError(RsftError, ValueError):
    """A setting the command cannot run with: found by the checks before any work, or by the work where
    only it can tell (training that diverges at this learning rate). Name the key and a value to set."""


class InputError(RsftError, ValueError):
    """A user's file, row or folder that cannot be used as it is (a prompt file without the prompt column,
    a pair whose label is not a number, a model folder without a tokenizer): name the file (its setting),
    the row and column where there is one, and what was expected."""


class MissingInput(RsftError, FileNotFoundError):
    """A file, folder or artifact the command needs that is not there: name it and the setting or the
    stage (`python -m rsft.run stage=...`) that provides it."""


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
