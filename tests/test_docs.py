"""The docs that are generated stay generated, and the README stays a front door: short, its links alive."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

README = REPO / "README.md"


def test_config_reference_and_stage_table_are_up_to_date():
    done = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout


RENDERED = re.compile(r"<!-- table .*?<!-- end of table -->|<!-- value .*?<!-- /value -->", re.S)
NOT_MEASURED = re.compile(r"```.*?```|`[^`\n]*`|<!--.*?-->|\]\([^)]*\)|\bm = [0-9.]+|\b95%|\d+\.\d+\.\d+", re.S)
MEASURED = re.compile(r"\b\d+(?:\.\d+)?x\b|\d+(?:\.\d+)?\s?%|(?<![\w.])[-+]?\d*\.\d+")


def typed_numbers(text: str) -> list[str]:
    """The measured numbers typed by hand in a page, each with its line: a decimal, a percentage or a ratio (1.9x)
    outside what gen_docs renders from records (tables and values), code, comments and link targets. A margin
    (m = 0.03, set before a run), the 95% of an interval and a version (5.24.0) are not measurements."""
    kept = NOT_MEASURED.sub(" ", RENDERED.sub(" ", text))
    return [f"{found.group(0)!r} in: {line.strip()[:160]}" for line in kept.splitlines()
            for found in MEASURED.finditer(line)]


def test_every_measured_number_of_the_readme_and_results_is_rendered_from_a_record():
    """Issue 47: README.md and docs/results.md hold no number typed by hand; each is a table or a value gen_docs
    renders from docs/results/*.json (so a missing or changed record fails test_config_reference_...). The
    measurements from before records, typed at the time, are docs/history.md's."""
    for page in (README, REPO / "docs" / "results.md"):
        assert not typed_numbers(page.read_text()), (f"{page.name} holds typed numbers; render each from a record "
                                                      f"(scripts/gen_docs.py):\n" + "\n".join(typed_numbers(page.read_text())))


def test_the_typed_number_check_reads_measurements_only():
    assert typed_numbers("gold goes 0.761 -> 0.891, 1.9x faster, at 63% of the tokens") == [
        "'0.761' in: gold goes 0.761 -> 0.891, 1.9x faster, at 63% of the tokens",
        "'0.891' in: gold goes 0.761 -> 0.891, 1.9x faster, at 63% of the tokens",
        "'1.9x' in: gold goes 0.761 -> 0.891, 1.9x faster, at 63% of the tokens",
        "'63%' in: gold goes 0.761 -> 0.891, 1.9x faster, at 63% of the tokens"]
    rendered = ("gold <!-- value demo policies.-1.a.mean .3f -->0.891<!-- /value --> at m = 0.03 with 95% intervals, "
                "`sample.temperature=0.7`, torch 2.13.0, [a](docs/results.md#v0.5)\n```\npass 0.5\n```\n"
                "<!-- table seeds from docs/results/x.json, rendered by scripts/gen_docs.py -->\n| 0.5 |\n"
                "<!-- end of table -->\n3 seeds, 64 prompts, K=8")
    assert typed_numbers(rendered) == []


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


# Issue 47: a comparison between two results is decided by one rule, rsft.stats.verdict, on the paired
# interval and a margin stated before the run: better / not worse / worse / undecided. "Reaches",
# "matches" or "beats" beside a difference or a share of tokens, without the rule's word, is the claim a
# skeptic does not accept (a result 0.02 worse "reaching" another because its interval includes zero).
COMPARISON_VERB = re.compile(r"\b(reach(es|ed|ing)?|match(es|ed|ing)?|beat(s|en|ing)?|level with|as good as|tied)\b",
                             re.IGNORECASE)
NOT_A_COMPARISON = re.compile(r"\b(\d+-)?token match(es)?\b|\bshortest match\b", re.IGNORECASE)  # the n-gram draft's
# a signed difference (-0.018, +0.06), not the second end of a range (0.58-0.67), or a share (37-41%)
RESULT_NUMBER = re.compile(r"(?<![\d.])[+-]0\.\d{2,}|\d%")
RULE_WORD = re.compile(r"\b(better|not worse|worse|undecided)\b|no paired interval", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """The prose of a Markdown page, one sentence a string: code blocks, tables and images left out, link
    targets, inline code and comments dropped, a paragraph's or list item's lines joined before it is split."""
    blocks, current, fenced = [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        starts_block = not stripped or stripped.startswith(("|", "#", "![", "- ", "* ")) or re.match(r"\d+\. ", stripped)
        if fenced or starts_block:
            blocks.append(" ".join(current))
            current = []
        if fenced or not stripped or stripped.startswith(("|", "![")):
            continue
        current.append(stripped)
    blocks.append(" ".join(current))
    found = []
    for block in blocks:
        block = re.sub(r"\]\([^)\s]*\)", "]", block)  # [text](target) -> [text]
        block = re.sub(r"`[^`]*`", "`code`", block)
        block = re.sub(r"<!--.*?-->", "", block)  # a rendered value's marker: its number stays
        found += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[`\"])", block) if s]
    return found


def unruled_comparisons(text: str) -> list[str]:
    """The sentences that compare two results with a comparison verb and a number, without the rule's word."""
    return [s for s in sentences(text)
            if COMPARISON_VERB.search(NOT_A_COMPARISON.sub("", s)) and RESULT_NUMBER.search(s)
            and not RULE_WORD.search(s)]


def test_every_comparison_claim_in_the_docs_names_the_rules_verdict():
    """README.md and docs/*.md: a sentence that says one result reaches, matches, beats, ties or is level with
    another, beside a difference or a share, says which verdict the rule gives (or that no paired interval
    was recorded)."""
    failures = [f"{page.relative_to(REPO)}: {sentence}" for page in [README, *sorted((REPO / "docs").glob("*.md"))]
                for sentence in unruled_comparisons(page.read_text())]
    assert not failures, ("comparison claims without better / not worse / worse / undecided "
                          "(rsft.stats.verdict, with the margin and seeds):\n" + "\n".join(failures))


def test_the_comparison_check_reads_a_claim_as_the_rule_asks():
    reaching = "Online at K=4 reaches the rounds' final gold at 37-41% of their tokens on both seeds."
    ruled = ("Online at K=4 ends undecided at m = 0 against the rounds' final gold on seed 1 (-0.018 [-0.055, "
             "+0.018]), so 'reaches' is not shown.")
    assert unruled_comparisons(reaching) == [reaching]
    assert unruled_comparisons(ruled) == []
    assert unruled_comparisons("A completion that reaches max_new_tokens is cut.") == []  # no result compared
    assert unruled_comparisons("A 2-4 token match exists at 15% of positions.") == []     # the n-gram draft
    assert unruled_comparisons("Published reward models reach 0.65-0.72 on HH.") == []    # a range, not a difference
    assert unruled_comparisons("It beat random (+0.17; no paired interval recorded).") == []
    assert unruled_comparisons("```\nit reaches +0.034\n```\n| reaches | +0.034 |") == []   # code and tables
