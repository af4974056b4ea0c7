"""The refusal types, defined at the bottom of the import graph so that reward/ (a leaf: it imports nothing from
rsft/) raises the same errors the stages raise. rsft.errors re-exports them beside the types only the pipeline
raises and the way a command ends on one (report_failure, main_guard); code in rsft/ imports them from there.

Each class also derives from the built-in its refusals used to be (ValueError, FileNotFoundError), so an
`except ValueError` still catches it.
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


class MissingPackage(RsftError, ImportError):
    """An optional package the settings ask for is not installed (or cannot be imported): name the setting,
    the package, how to install it and the setting that does without it."""
