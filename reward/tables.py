"""One reader for the tables a user hands rsft: prompt files and preference-pair files.

    rows, source = read_table("data.path", "my_prompts.jsonl", expected="prompts, one per row")

A table is a local file (JSONL, JSON, parquet or CSV, each optionally gzipped), a
`datasets.save_to_disk` folder (a DatasetDict: `split` picks one), or a hub dataset name (needs
network or a warm cache). Bad input stops here, named by its setting and file: an empty path, a
missing one, an unknown suffix, an empty file, the first line of a JSONL file that is not a JSON object,
a .gz file that is not gzip or ends early, a table with no rows, a table datasets cannot parse.
datasets' own errors name neither (a bad JSONL line is a DatasetGenerationError without its number; an
empty file is a StopIteration from its JSON builder, an empty JSON list or a header-only CSV a
ValueError about the "train" split, a truncated .json.gz a bare EOFError), which is why this reader
checks first instead of only wrapping `load_dataset`.

It imports only reward.refusals (prompts in rsft.data and pairs in reward.formats both read through it).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError
from pyarrow import ArrowException

from reward.refusals import ConfigError, InputError, MissingInput

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
# what a gzipped table holds, for the refusal of a damaged .gz
CONTENTS = {".jsonl": "JSON lines", ".json": "JSON", ".parquet": "parquet data", ".csv": "CSV text"}
# what reading a damaged .gz raises: the stream ends early, the file is not gzip, its data is corrupt
GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)
# what a table setting may name, for the refusals
ANY_TABLE = (f"a {', '.join(sorted(BUILDERS))} file (optionally .gz), a datasets.save_to_disk folder or a hub "
             f"dataset name")


def table_suffix(path: str) -> str:
    """The table suffix of a file name, looking through a trailing .gz: data.jsonl.gz -> .jsonl."""
    file = Path(path)
    return file.suffixes[-2] if file.suffix == ".gz" and len(file.suffixes) > 1 else file.suffix


def looks_local(path: str) -> bool:
    """A path, not a hub name: it starts like one or ends in a table suffix."""
    return path.startswith((".", "/", "~")) or table_suffix(path) in BUILDERS


def _open(file: Path):
    return gzip.open(file, "rb") if file.suffix == ".gz" else file.open("rb")


def _damaged_gzip(source: str, suffix: str, error: BaseException) -> InputError:
    """The refusal for a .gz file whose reading raised one of GZIP_ERRORS, saying which way it is damaged:
    gzip's own words name neither the setting nor the file, and a truncated download is the usual cause."""
    contents = CONTENTS[suffix]
    if isinstance(error, EOFError):
        return InputError(f"{source}: the gzip stream ends early (a truncated download?); expected a complete "
                          f"gzip file of {contents}")
    if isinstance(error, gzip.BadGzipFile):
        return InputError(f"{source}: not gzip data ({error}); expected a gzip file of {contents}, or the name "
                          f"without .gz for an uncompressed one")
    return InputError(f"{source}: damaged gzip data ({error}); expected an intact gzip file of {contents}")


def check_jsonl(setting: str, path: str, file: Path, expected: str) -> None:
    """Every non-blank line of a JSONL file (gzipped or not) is a JSON object, and there is at least
    one; else name the first bad line (or the damage of a .gz file). One streaming pass, cheap next to
    loading the file."""
    rows = 0
    try:
        with _open(file) as lines:
            for number, raw in enumerate(lines, start=1):
                where = f"{setting}={path!r}, line {number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start}); "
                                     f"expected one JSON object per line") from None
                if not line.strip():
                    continue  # datasets skips blank lines too
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{where}: invalid JSON ({e.msg} at column {e.colno}); "
                                     f"expected one JSON object per line") from None
                if not isinstance(row, dict):
                    raise InputError(f"{where}: a JSON {type(row).__name__}, expected a JSON object "
                                     f"such as {{\"prompt\": \"...\"}}")
                rows += 1
    except GZIP_ERRORS as e:
        raise _damaged_gzip(f"{setting}={path!r}", ".jsonl", e) from None
    if rows == 0:
        raise InputError(f"{setting}={path!r} has no rows (only blank lines); expected {expected}")


def _unreadable(source: str, suffix: str, expected: str, error: BaseException) -> InputError:
    """The refusal for a local table `load_dataset` failed on (`error`, or the error it wraps): a damaged .gz,
    a table without rows (datasets says its "train" split "corresponds to no data"), or the parser's own words."""
    cause = error.__cause__ if isinstance(error, DatasetGenerationError) and error.__cause__ else error
    if isinstance(cause, GZIP_ERRORS):
        return _damaged_gzip(source, suffix, cause)
    if type(cause) is ValueError and "corresponds to no data" in str(cause):
        return InputError(f"{source}: no rows; expected {expected}")
    return InputError(f"{source}: could not be read as a {suffix} table ({cause!r}); expected {expected}")


def read_table(setting: str, path: str, expected: str, split: str = "train", data_dir: str | None = None,
               config_name: str | None = None) -> tuple[Dataset, str]:
    """The rows of the table at `path` (named `setting` in errors) and a description of where they
    came from. `expected` says what a row is, for the messages ("prompts, one per row")."""
    path = str(path)
    file = Path(path).expanduser()
    source = f"{setting}={path!r}"
    if not path.strip():  # Path("") is the working directory, which datasets would try to read as a folder
        raise ConfigError(f"{source}: the path is empty; expected {ANY_TABLE}")
    if file.is_dir():
        try:
            loaded = load_from_disk(str(file))
        except FileNotFoundError as e:  # a folder datasets did not write: its message names neither the setting
            raise InputError(f"{source}: not a datasets.save_to_disk folder ({e}); expected a "
                             f"{', '.join(sorted(BUILDERS))} file (optionally .gz) or such a folder") from None
        if isinstance(loaded, DatasetDict):
            if split not in loaded:
                which = setting[:-len("path")] + "split" if setting.endswith("path") else "the split"  # data.split
                raise InputError(f"{source} holds splits {list(loaded)}, not {split!r}; set {which} to one of them")
            loaded = loaded[split]
        return loaded, source
    if file.exists():
        suffix = table_suffix(path)
        if suffix not in BUILDERS:
            raise InputError(f"{source}: unknown file type {suffix!r}; expected {', '.join(sorted(BUILDERS))} "
                             f"(optionally .gz) or a datasets folder")
        if file.stat().st_size == 0:
            raise InputError(f"{source} is empty; expected {expected}")
        if suffix == ".jsonl":
            check_jsonl(setting, path, file, expected)
        try:
            return load_dataset(BUILDERS[suffix], data_files=str(file), split="train"), source
        # none of these names the setting or the file; ValueError: also datasets' "no data" for a table
        # without rows, ArrowException: a file Arrow cannot parse (a corrupt parquet file)
        except (DatasetGenerationError, StopIteration, ValueError, ArrowException, *GZIP_ERRORS) as e:
            raise _unreadable(source, suffix, expected, e) from None
    if looks_local(path):
        raise MissingInput(f"{source}: no such file or folder; expected {ANY_TABLE}")
    where = path + (f", data_dir {data_dir}" if data_dir else "") + (f", config {config_name}" if config_name else "")
    try:
        rows = load_dataset(path, config_name, data_dir=data_dir, split=split)
    except DatasetNotFoundError as e:  # a hub name that is not there (or not reachable offline)
        raise MissingInput(f"{source}: {e}; expected {ANY_TABLE}") from None
    return rows, f"hub dataset {where} (split {split})"
