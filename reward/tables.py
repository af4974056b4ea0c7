"""One reader for the tables a user hands rsft: prompt files and preference-pair files.

    rows, source = read_table("data.path", "my_prompts.jsonl", expected="prompts, one per row")

A table is a local file (JSONL, JSON, parquet or CSV, each optionally gzipped), a
`datasets.save_to_disk` folder (a DatasetDict: `split` picks one), or a hub dataset name (needs
network or a warm cache). Bad input stops here, named by its setting and file: a missing path, an
unknown suffix, an empty file, the first line of a JSONL file that is not a JSON object, a table
datasets cannot parse. datasets' own errors name neither (a bad JSONL line is a DatasetGenerationError
without its number; an empty file is a StopIteration from its JSON builder), which is why this
reader checks first instead of only wrapping `load_dataset`.

It imports only reward.refusals (prompts in rsft.data and pairs in reward.formats both read through it).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError

from reward.refusals import InputError, MissingInput

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def table_suffix(path: str) -> str:
    """The table suffix of a file name, looking through a trailing .gz: data.jsonl.gz -> .jsonl."""
    file = Path(path)
    return file.suffixes[-2] if file.suffix == ".gz" and len(file.suffixes) > 1 else file.suffix


def looks_local(path: str) -> bool:
    """A path, not a hub name: it starts like one or ends in a table suffix."""
    return path.startswith((".", "/", "~")) or table_suffix(path) in BUILDERS


def _open(file: Path):
    return gzip.open(file, "rb") if file.suffix == ".gz" else file.open("rb")


def check_jsonl(setting: str, path: str, file: Path, expected: str) -> None:
    """Every non-blank line of a JSONL file (gzipped or not) is a JSON object, and there is at least
    one; else name the first bad line. One streaming pass, cheap next to loading the file."""
    rows = 0
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
    if rows == 0:
        raise InputError(f"{setting}={path!r} has no rows (only blank lines); expected {expected}")


def read_table(setting: str, path: str, expected: str, split: str = "train", data_dir: str | None = None,
               config_name: str | None = None) -> tuple[Dataset, str]:
    """The rows of the table at `path` (named `setting` in errors) and a description of where they
    came from. `expected` says what a row is, for the messages ("prompts, one per row")."""
    path = str(path)
    file = Path(path).expanduser()
    source = f"{setting}={path!r}"
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
        except (DatasetGenerationError, StopIteration) as e:  # neither names the setting or the file
            raise InputError(f"{source}: could not be read as a {suffix} table ({e.__cause__ or e!r}); "
                             f"expected {expected}") from None
    if looks_local(path):
        raise MissingInput(f"{source}: no such file or folder; expected a {', '.join(sorted(BUILDERS))} file "
                           f"(optionally .gz), a datasets.save_to_disk folder or a hub dataset name")
    where = path + (f", data_dir {data_dir}" if data_dir else "") + (f", config {config_name}" if config_name else "")
    try:
        rows = load_dataset(path, config_name, data_dir=data_dir, split=split)
    except DatasetNotFoundError as e:  # a hub name that is not there (or not reachable offline)
        raise MissingInput(f"{source}: {e}; expected a {', '.join(sorted(BUILDERS))} file (optionally .gz), "
                           f"a datasets.save_to_disk folder or a hub dataset name") from None
    return rows, f"hub dataset {where} (split {split})"
