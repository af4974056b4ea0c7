"""The verifiable task: generated questions with one right number, and the checker that reads their answers."""

from __future__ import annotations

import pytest

from reward.checkers import first_number
from rsft.checkable_prompts import FORMS, build_checkable_prompts
from rsft.errors import ConfigError


def test_the_splits_are_disjoint_fixed_and_every_answer_is_right():
    train, test = build_checkable_prompts("train"), build_checkable_prompts("test")
    assert (len(train), len(test)) == (192, 64)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert build_checkable_prompts("test") == test and build_checkable_prompts("test", seed=1) != test
    assert {r["form"] for r in test} == set(FORMS)
    by_prompt = {r["prompt"]: r["reference"] for r in train + test}
    assert by_prompt["What is 7 + 4? Answer with just the number."] == "11"
    assert by_prompt["What is 6 times 7? Answer with just the number."] == "42"
    assert by_prompt["What number comes right after 38? Answer with just the number."] == "39"
    assert by_prompt["Which is larger, 35 or 54? Answer with just the number."] == "54"
    with pytest.raises(ConfigError, match="data.split"):
        build_checkable_prompts("validation")


def test_the_checker_reads_the_first_number_and_has_nothing_to_check_without_a_reference():
    completions = ["42", "The answer is 42.", "7 times 6 is 42", "forty-two", "42", "-3"]
    reference = ["42", "42", "42", "42", None, "-3"]
    assert first_number([""] * 6, completions, reference) == [1.0, 1.0, 0.0, 0.0, None, 1.0]
