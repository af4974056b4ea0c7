"""rsft/sampling is a leaf: tensors, models and plain settings in, tokens out; nothing else of rsft."""

from __future__ import annotations

import ast
from pathlib import Path

SAMPLING = Path(__file__).resolve().parents[2] / "rsft" / "sampling"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def test_sampling_imports_nothing_from_rsft_outside_itself():
    files = sorted(SAMPLING.glob("*.py"))
    assert files
    for path in files:
        outside = {m for m in imported_modules(path)
                   if (m == "rsft" or m.startswith("rsft.")) and not m.startswith("rsft.sampling")}
        assert not outside, f"{path.name} imports {sorted(outside)}"
        assert not {m for m in imported_modules(path) if m.split(".")[0] in ("omegaconf", "hydra", "reward")}, path.name
