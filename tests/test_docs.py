"""The docs that are generated stay generated, and the README stays a front door: short, its links alive."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

README = REPO / "README.md"


def test_config_reference_and_stage_table_are_up_to_date():
    done = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr + done.stdout


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 300


def test_every_local_link_of_the_readme_and_docs_resolves():
    """A link to a page exists; a link to #anchor names a heading of that page (GitHub's anchor rule)."""
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            assert path.exists(), f"{page.name}: link to {target} (no such file)"
            if anchor and path.suffix == ".md":
                assert anchor in anchors(path), f"{page.name}: link to {target} (no such heading)"


def anchors(page) -> set[str]:
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found
