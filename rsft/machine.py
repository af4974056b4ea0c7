"""The machine a process runs on, as every artifact records it (meta.json `machine`), and the warning when
a run directory holds work from another machine.

The same command gives different numbers on different CPUs: matrix kernels round differently with AVX2,
AVX-512 (with or without BF16/VNNI) or AMX, so the default job's round-0 gold differs in the second decimal
between them (docs/results.md). A run directory therefore says which machine made each
artifact, and a command that reuses, reads or resumes work made on another machine says so, naming both
(rsft.runner). Nothing here changes a fingerprint: the same settings on another machine still reuse
the artifact, as a user who moves a run expects; the warning is what keeps the mix from being silent.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# the instruction-set extensions that change which kernels torch picks, and so the rounding
VECTOR_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
                "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")

# what tells two machines apart for rsft's numbers (not the core count, the kernel or the host name)
IDENTITY = ("cpu", "cpu_id", "vector_flags", "gpu")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none: macOS, Windows)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _gpus() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


@functools.lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """This machine: CPU model, vendor/family/model (two CPU generations can share a marketing name),
    the vector flags that decide torch's kernels, cores, GPUs, OS and Python."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    gpus = _gpus()
    vendor = info.get("vendor_id", "")
    family, model = info.get("cpu family"), info.get("model")
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine() or "unknown",
        "cpu_id": " ".join(part for part in (vendor, family and f"family {family}", model and f"model {model}")
                           if part) or platform.machine(),
        "vector_flags": [flag for flag in VECTOR_FLAGS if flag in flags],
        "cores": os.cpu_count(),
        "gpu": ", ".join(gpus) if gpus else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def identity(record: dict | None) -> tuple | None:
    """What two machines are compared by; None for a record without one (an artifact older than this) or one
    that is not a machine record (a damaged meta.json: nothing to compare)."""
    if not record or not isinstance(record, dict):
        return None
    return tuple(tuple(value) if isinstance(value, list) else value for value in (record.get(k) for k in IDENTITY))


def describe(record: dict | None) -> str:
    """One line: 'AMD EPYC (AuthenticAMD family 25 model 1; avx2 fma avx512f ...; 2 cores; GPU none)'."""
    if not record or not isinstance(record, dict):
        return "an unrecorded machine"
    flags = record.get("vector_flags")
    flags = " ".join(map(str, flags)) if isinstance(flags, list) else str(flags or "") or "no vector flags recorded"
    return (f"{record.get('cpu', '?')} ({record.get('cpu_id', '?')}; {flags}; {record.get('cores', '?')} cores; "
            f"GPU {record.get('gpu') or 'none'})")


def same_machine(record: dict | None) -> bool:
    """Whether `record` (an artifact's meta.json `machine`) is this machine; an unrecorded one counts as the same
    (nothing to compare: artifacts made before rsft recorded machines)."""
    theirs = identity(record)
    return theirs is None or theirs == identity(machine())


# (their identity) already warned about in this process: one warning per other machine, not one per artifact
_WARNED: set = set()


def warn_if_other_machine(what: str, path: str | os.PathLike, record: dict | None) -> bool:
    """Log a warning when `path` (an artifact or resume progress, `what` says which) was made on another
    machine; True when it was. Once per other machine per process."""
    if same_machine(record):
        return False
    key = identity(record)
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("%s at %s was made on another machine: %s; this one is %s. Numbers from the two differ in "
                    "rounding (docs/results.md, 'Which CPU'); the run directory now mixes both (summary.md lists "
                    "which artifact came from which). For one machine's numbers rebuild with overwrite=true here.",
                    what, path, describe(record), describe(machine()))
    return True


RECORDS = Path(__file__).resolve().parents[1] / "docs" / "results"  # the results records (scripts/gen_docs.py)


def commit() -> str | None:
    """The project's commit (git's short hash) when its checkout is a git repository, else None: a results record
    names the code that measured it."""
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30,
                              cwd=RECORDS.parents[1])
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def write_record(name: str, record: dict, folder: Path = RECORDS) -> Path:
    """Write a results record as NAME.json in `folder` (docs/results/, what scripts/gen_docs.py renders tables
    from); its path."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}.json"
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return out
