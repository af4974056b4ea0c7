"""Checkers: reward functions that verify an answer (reward_source=function reward_source.spec=reward.checkers:<name>).

A checker returns 1.0 for a right answer, 0.0 for a wrong one and None when the row has nothing to check
against (no reference); rsft counts the Nones and never keeps such a row.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

# a number as people write one: -7, 3.5, .5, 1,000 (commas only in groups of three: "3,4" is 3, then 4)
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")


def _number(text: str) -> Decimal | None:
    """The value of a number written as NUMBER reads one ("1,000" and "1000.0" are 1000; a leading + allowed), or
    None when the whole text is no such number ("3,4", "1e3", "1_000": what an answer could not say either)."""
    text = text.strip().removeprefix("+")
    return Decimal(text.replace(",", "")) if NUMBER.fullmatch(text) else None  # the pattern admits only Decimals


def first_number(prompts: list[str], completions: list[str], reference: list[str | None]) -> list[float | None]:
    """1.0 when the first number in the completion equals the reference answer as a number, 0.0 when another
    number or none comes first (an answer that talks around the number before giving it counts as what it says
    first). Numbers compare by value, so a reference read as 24.0 (a column that holds one decimal answer is
    read as floats) matches "24", and "1,000" matches 1000. A missing reference (None, "", or NaN: a gap in a CSV
    or Parquet column) has nothing to check against; a reference that is not a number as an answer would write it
    ("forty", "3,4", "1e3") is refused."""
    out: list[float | None] = []
    for row, (completion, answer) in enumerate(zip(completions, reference)):
        if answer is None or isinstance(answer, float) and math.isnan(answer) or str(answer).strip() == "":
            out.append(None)
            continue
        # a float as its shortest decimal, written out ("1e+20" is 100000000000000000000, as an answer would say it)
        expected = _number(f"{Decimal(repr(answer)):f}" if isinstance(answer, float) else str(answer))
        if expected is None:
            raise ValueError(f"row {row} of the batch: reference answer {answer!r:.40} is not a number as an answer "
                             f"would write it (-7, 3.5, 1,000); first_number compares numbers (write your own checker "
                             f"for other answers)")
        found = NUMBER.search(completion)
        out.append(float(found is not None and _number(found.group()) == expected))
    return out
