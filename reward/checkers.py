"""Checkers: reward functions that verify an answer (reward_source=function reward_source.spec=reward.checkers:<name>).

A checker returns 1.0 for a right answer, 0.0 for a wrong one and None when the row has nothing to check
against (no reference); rsft counts the Nones and never keeps such a row.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+")


def first_number(prompts: list[str], completions: list[str], reference: list[str | None]) -> list[float | None]:
    """1.0 when the first number in the completion is the reference answer, 0.0 when another number or none
    comes first (an answer that talks around the number before giving it counts as what it says first)."""
    out: list[float | None] = []
    for completion, answer in zip(completions, reference):
        if answer is None:
            out.append(None)
            continue
        found = NUMBER.search(completion)
        out.append(float(found is not None and found.group() == str(answer).strip()))
    return out
