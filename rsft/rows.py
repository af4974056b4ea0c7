"""Dataset artifacts written and read a part at a time, so that a stage's memory stays flat in its row count.

Why: `Dataset.from_list(rows)` over a whole stage holds every row twice (the Python objects and the
Arrow table), and a memory-mapped dataset read end to end keeps every page it touched resident; at
100k prompts x K completions that no longer fits a small machine (issue 33). Here:

- RowWriter writes rows (dicts, or Arrow tables) in parts to Arrow files and assembles from them the
  folder `Dataset.from_list(all rows).save_to_disk(folder)` writes: the same columns, types, rows and
  cells. Each part's types are inferred as from_list infers them, then the parts' types are unified
  (pyarrow's permissive promotion: a column all None in one part and int in another is int, as one
  inference over all rows makes it) and every part is written with the unified types. Without a folder
  it keeps the parts in memory (callers that sample a few prompts and write nothing).
- ArtifactRows reads the rows of saved dataset folders (one, or several concatenated) a record batch
  at a time with plain file reads, not a memory map, in order (batches) or by row position (take).
- save_dataset writes a dataset that is a saved folder, as loaded, by copying its files; anything else
  with `save_to_disk`.

Simplification: a saved folder's shard count follows save_to_disk's rule (500 MB of Arrow per shard)
from the parts' sizes, which can differ from the whole table's by a few bytes per part; only the
split of the rows over files could differ, never a row.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from datasets import Dataset, DatasetInfo, Features
from datasets import config as datasets_config
from datasets.table import InMemoryTable

STATE_FILE = "state.json"  # what save_to_disk writes beside the Arrow files (datasets.config's names)
INFO_FILE = "dataset_info.json"


def _inferred(rows: list[dict], columns: list[str]) -> pa.Table:
    """The table Dataset.from_list infers for these rows, keyed as from_list keys (the first row's keys)."""
    return Dataset.from_list([{k: r.get(k) for k in columns} for r in rows]).data.table.replace_schema_metadata(None)


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with the unified types: as it is when they match; else its values converted again, as one
    inference over all rows would have typed them (a null column becomes int, an int column double)."""
    table = table.replace_schema_metadata(None)
    if table.schema.equals(schema):
        return table
    return pa.Table.from_pylist(table.to_pylist(), schema=schema)


def _shard_ranges(rows: int, nbytes: int, num_shards: int | None) -> list[tuple[int, int]]:
    """save_to_disk's split of `rows` rows over files: one per 500 MB of Arrow (at most one per row), the
    rows contiguous and the first `rows % shards` files one row longer (Dataset.shard(contiguous=True))."""
    if num_shards is None:
        limit = datasets_config.MAX_SHARD_SIZE
        from datasets.utils.py_utils import convert_file_size_to_int

        num_shards = min(rows, int(nbytes / convert_file_size_to_int(limit)) + 1)
    num_shards = max(num_shards, 1)
    div, mod = divmod(rows, num_shards)
    starts = [div * i + min(i, mod) for i in range(num_shards)]
    return [(start, start + div + (i < mod)) for i, start in enumerate(starts)]


def _write_json(path: Path, value: dict, sort_keys: bool) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=sort_keys)


class RowWriter:
    """A dataset written in parts (see the module docstring): add_rows / add_table, then close().

    folder: where the saved dataset goes (its parts are kept in `<folder>/.parts` until close); None keeps
    the parts in memory and close() returns an in-memory Dataset. features / info: the types and the
    dataset info to write (a stage that adds columns to a dataset it read keeps that dataset's info);
    by default both are inferred, as from_list infers them."""

    def __init__(self, folder: str | os.PathLike | None, features: Features | None = None,
                 info: DatasetInfo | None = None, num_shards: int | None = None):
        self.folder = None if folder is None else Path(folder)
        self.features, self.info, self.num_shards = features, info, num_shards
        self.columns: list[str] | None = None
        self.parts: list[pa.Table | Path] = []
        self.schemas: list[pa.Schema] = []
        self.rows = self.nbytes = 0
        if self.folder is not None:  # a folder left by a killed run is rewritten from the start
            shutil.rmtree(self.folder, ignore_errors=True)
            (self.folder / ".parts").mkdir(parents=True)

    def add_rows(self, rows: list[dict]) -> None:
        """Rows as from_list reads them: the first row written fixes the columns (a later row's missing key is None)."""
        if not rows:
            return
        if self.columns is None:
            self.columns = list(rows[0])
        self.add_table(_inferred(rows, self.columns))

    def add_table(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self.rows += table.num_rows
        self.nbytes += table.nbytes
        self.schemas.append(table.schema.remove_metadata())
        if self.folder is None:
            self.parts.append(table)
            return
        path = self.folder / ".parts" / f"part-{len(self.parts):05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as stream:
            stream.write_table(table)
        self.parts.append(path)

    def _schema(self) -> pa.Schema:
        if self.features is not None:
            return self.features.arrow_schema.remove_metadata()
        return pa.unify_schemas(self.schemas, promote_options="permissive")

    def _tables(self, schema: pa.Schema) -> Iterator[pa.Table]:
        for part in self.parts:
            if isinstance(part, Path):
                with pa.OSFile(str(part)) as source:
                    part = pa.ipc.open_stream(source).read_all()
            yield _conformed(part, schema)

    def close(self) -> Dataset | None:
        """Write the saved folder (state.json, dataset_info.json, the Arrow files) and drop the parts; with
        no folder, the Dataset. No rows at all is a bug of the caller (from_list refuses them too)."""
        if not self.rows:
            raise ValueError("RowWriter: no rows were added; an empty dataset has no columns to write")
        schema = self._schema()
        features = self.features or Features.from_arrow_schema(schema)
        info = self.info.copy() if self.info is not None else DatasetInfo()
        info.features = features
        if self.folder is None:
            return Dataset(InMemoryTable(pa.concat_tables(list(self._tables(schema)))), info=info)
        self._write(schema, info)
        shutil.rmtree(self.folder / ".parts", ignore_errors=True)
        return None

    def _write(self, schema: pa.Schema, info: DatasetInfo) -> None:
        """The files save_to_disk writes: each shard through datasets' ArrowWriter (its schema metadata,
        its batch size), then state.json and dataset_info.json as it writes them."""
        from datasets.arrow_writer import (
            ArrowWriter,
            get_writer_batch_size_from_data_size,
        )
        from datasets.fingerprint import generate_random_fingerprint
        from datasets.utils.py_utils import asdict

        ranges = _shard_ranges(self.rows, self.nbytes, self.num_shards)
        batch_size = datasets_config.DEFAULT_MAX_BATCH_SIZE
        if self.nbytes > 0:
            batch_size = min(batch_size, get_writer_batch_size_from_data_size(self.rows, self.nbytes))
        names = [f"data-{i:05d}-of-{len(ranges):05d}.arrow" for i in range(len(ranges))]
        tables, pending, done = self._tables(schema), None, 0
        for name, (start, end) in zip(names, ranges):
            writer = ArrowWriter(features=info.features, path=str(self.folder / name), embed_local_files=True,
                                 writer_batch_size=batch_size)
            while done < end:
                if pending is None:
                    pending = next(tables)
                take = min(end - done, pending.num_rows)
                writer.write_table(pending.slice(0, take))
                pending = pending.slice(take) if take < pending.num_rows else None
                done += take
            writer.finalize()
            writer.close()
        state = {"_data_files": [{"filename": name} for name in names], "_fingerprint": generate_random_fingerprint(),
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                 "_split": None}
        _write_json(self.folder / STATE_FILE, state, sort_keys=True)
        dataset_info = asdict(info)
        _write_json(self.folder / INFO_FILE, {key: dataset_info[key] for key in sorted(dataset_info)}, sort_keys=False)


def write_rows(folder: str | os.PathLike | None, parts: Iterable[list[dict]], **options) -> Dataset | None:
    """RowWriter over parts of rows, closed: the saved folder (or, without one, the Dataset)."""
    writer = RowWriter(folder, **options)
    for rows in parts:
        writer.add_rows(rows)
    return writer.close()


def load_saved(folder: str | os.PathLike) -> Dataset:
    """A saved folder as a memory-mapped Dataset (its pages are read only when its rows are)."""
    from datasets import load_from_disk

    return load_from_disk(str(folder))


def _saved_folder(ds: Dataset) -> Path | None:
    """The folder `ds` was loaded from, when it is that folder's rows unchanged (load_from_disk gives a
    folder's dataset the same fingerprint every time, and every datasets transform a new one); else None."""
    files = [Path(f["filename"]) for f in ds.cache_files]
    if not files or len({f.parent for f in files}) != 1 or ds._indices is not None:
        return None
    folder = files[0].parent
    try:
        state = json.loads((folder / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if [folder / f["filename"] for f in state.get("_data_files", [])] != files:
        return None
    return folder if load_saved(folder)._fingerprint == ds._fingerprint else None


def save_dataset(ds: Dataset, folder: str | os.PathLike) -> None:
    """ds.save_to_disk(folder), by copying the files when `ds` is a saved folder as loaded (a copy reads
    them through the page cache; save_to_disk would read every row through the memory map, resident)."""
    source = _saved_folder(ds)
    if source is None:
        ds.save_to_disk(str(folder))
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name in [f["filename"] for f in json.loads((source / STATE_FILE).read_text())["_data_files"]] + [
            STATE_FILE, INFO_FILE]:
        shutil.copyfile(source / name, Path(folder) / name)


@dataclass
class _Batch:
    file: Path
    offset: int      # where its message starts in the file
    start: int       # its first row's position over all the folders' rows
    rows: int


class ArtifactRows:
    """The rows of one or more saved dataset folders, concatenated, read a record batch at a time from
    the files (plain reads: nothing stays resident but the batch in hand). Iterating `batches()` once
    indexes where each batch starts, so that `take` then reads only the batches that hold its rows."""

    def __init__(self, folders: Iterable[str | os.PathLike]):
        self.folders = [Path(f) for f in folders]
        self.files: list[Path] = []
        for folder in self.folders:
            state = json.loads((folder / STATE_FILE).read_text())
            self.files += [folder / f["filename"] for f in state["_data_files"]]
        self.index: list[_Batch] | None = None
        self._schemas: dict[Path, pa.Schema] = {}
        self._cached: tuple[int, pa.RecordBatch] | None = None

    def features(self, folder_index: int = 0) -> Features:
        """The features one folder recorded (dataset_info.json, as load_from_disk reads them)."""
        return self.info(folder_index).features

    def info(self, folder_index: int = 0) -> DatasetInfo:
        return DatasetInfo.from_directory(str(self.folders[folder_index]))

    def column_names(self, folder_index: int = 0) -> list[str]:
        return list(self.features(folder_index))

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every row, in order, a record batch at a time."""
        index, start = [], 0
        for file in self.files:
            with pa.OSFile(str(file)) as source:
                reader = pa.ipc.open_stream(source)
                self._schemas[file] = reader.schema
                offset = source.tell()
                for batch in reader:
                    index.append(_Batch(file, offset, start, batch.num_rows))
                    offset, start = source.tell(), start + batch.num_rows
                    yield batch
        self.index = index

    def __len__(self) -> int:
        if self.index is None:
            for _ in self.batches():
                pass
        return sum(b.rows for b in self.index)

    def _read(self, i: int) -> pa.RecordBatch:
        if self._cached is not None and self._cached[0] == i:
            return self._cached[1]
        where = self.index[i]
        with pa.OSFile(str(where.file)) as source:
            source.seek(where.offset)
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(source), self._schemas[where.file])
        self._cached = (i, batch)
        return batch

    def take(self, positions: list[int]) -> list[dict]:
        """The rows at these positions (over all folders' rows), as dicts, in the order asked; each batch
        that holds some of them is read once per call."""
        if self.index is None:
            len(self)
        from bisect import bisect_right

        starts = [b.start for b in self.index]
        wanted: dict[int, list[int]] = {}
        for position in sorted(set(positions)):
            wanted.setdefault(bisect_right(starts, position) - 1, []).append(position)
        found: dict[int, dict] = {}
        for i, inside in wanted.items():
            rows = self._read(i).take([p - self.index[i].start for p in inside]).to_pylist()
            found.update(zip(inside, rows))
        return [found[p] for p in positions]


def in_tables(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """The batches regrouped into tables of `rows` rows each, the last one shorter (rows=0: one table of all)."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        while batch.num_rows:
            take = batch.num_rows if rows <= 0 else min(rows - held, batch.num_rows)
            pending.append(batch.slice(0, take))
            held += take
            batch = batch.slice(take)
            if rows > 0 and held == rows:
                yield pa.Table.from_batches(pending)
                pending, held = [], 0
    if held:
        yield pa.Table.from_batches(pending)
