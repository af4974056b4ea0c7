"""A file's content as a small record (size and CRC-32): how artifacts record their own files (rsft.store), how a
fingerprint names a user's data file (rsft.fingerprints), and how a reward source names its model folder or the
Python file of its function (reward.sources). In reward/ because reward/ is a leaf and needs it; rsft.store uses
the same functions, so one checksum cache serves both.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any


def file_digest(path: str | os.PathLike) -> dict[str, Any]:
    """Size and CRC-32 of a file (cheap: ~1 GB/s), the way artifacts record their own files."""
    crc = 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return {"size": os.path.getsize(path), "crc32": f"{crc:08x}"}


# (file, size, mtime_ns) -> its CRC-32, computed once per process: an artifact read by several stages of a
# loop (a policy folder: 540 MB) is checksummed once, and again only when a file changes on disk
_CHECKSUMS: dict[tuple[str, int, int], str] = {}


def checksum(file: Path) -> str:
    status = file.stat()
    key = (str(file), status.st_size, status.st_mtime_ns)
    if key not in _CHECKSUMS:
        _CHECKSUMS[key] = file_digest(file)["crc32"]
    return _CHECKSUMS[key]


def cached_digest(file: Path) -> dict[str, Any]:
    """file_digest's size and CRC-32, from the per-process checksum cache."""
    return {"size": file.stat().st_size, "crc32": checksum(file)}


def user_files_digest(path: str | os.PathLike) -> dict[str, Any]:
    """A user's data file or folder (prompts, pairs) by content: each file's size and CRC-32 (checksummed
    once per process while the file is unchanged: check_fresh asks again for every artifact built from it)."""
    path = Path(path).expanduser()
    if path.is_file():
        return cached_digest(path)
    # a datasets folder: not the cache files that datasets itself writes there when the rows are mapped
    return {str(f.relative_to(path)): cached_digest(f) for f in sorted(path.rglob("*"))
            if f.is_file() and not f.name.startswith("cache-")}
