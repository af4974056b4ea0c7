"""rsft's error types: the ground floor every other module may import (it imports nothing of rsft).

The entry point (rsft.run.main) prints any of them as one line and exits 1; RSFT_TRACEBACK=1 shows the
traceback. Each message names the setting, file or folder and says what to do.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting the command cannot run with, found before any work."""


class ArtifactError(RuntimeError):
    """An artifact that must not be used as it is."""


class StaleArtifact(ArtifactError):
    """A complete artifact made from other settings or inputs than the ones asked for now."""


class DamagedArtifact(ArtifactError):
    """A complete artifact whose meta.json or files do not match what was written."""


class RunDirectoryBusy(RuntimeError):
    """Another live command holds the run directory's lock."""


# what the entry point turns into one line: rsft's own errors and the built-in ones its checks raise
USER_ERRORS = (ConfigError, ArtifactError, RunDirectoryBusy, FileNotFoundError, ValueError, KeyError, TypeError)
