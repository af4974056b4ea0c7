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
        build_checkable_prompts("dev")


def _operands(prompt: str) -> tuple[str, frozenset] | None:
    """(the form, its operands as an unordered set) of a + or x question; None for the others."""
    import re

    found = re.match(r"What is (\d+) (\+|times) (\d+)\?", prompt)
    return (found.group(2), frozenset((found.group(1), found.group(3)))) if found else None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_test_question_is_a_train_question_up_to_the_order_of_its_operands(seed):
    train, test = (build_checkable_prompts(s, seed) for s in ("train", "test"))
    assert (len(train), len(test)) == (192, 64)
    seen = {_operands(r["prompt"]) for r in train} - {None}
    assert not {_operands(r["prompt"]) for r in test} & seen
    # the split before the rule, kept for the results recorded on it: 16 test questions had a swapped twin in train
    old_train, old_test = (build_checkable_prompts(s, seed, "ordered") for s in ("train", "test"))
    assert (len(old_train), len(old_test)) == (192, 64)
    old_seen = {_operands(r["prompt"]) for r in old_train} - {None}
    twins = [r for r in old_test if _operands(r["prompt"]) in old_seen]
    assert twins and not {r["prompt"] for r in old_test} & {r["prompt"] for r in old_train}
    with pytest.raises(ConfigError, match="data.held_out='both'"):
        build_checkable_prompts("test", seed, "both")


@pytest.mark.parametrize("held_out", ["unordered", "ordered"])
def test_fit_and_validation_cut_train_in_two_and_no_validation_question_is_a_fit_or_test_question(held_out):
    """A setting chosen on validation (data.split=fit data.eval_split=validation) never read test, and did not
    train on the questions it is judged on, up to the order of their operands."""
    train, test, fit, validation = (build_checkable_prompts(s, 0, held_out)
                                    for s in ("train", "test", "fit", "validation"))
    assert (len(fit), len(validation)) == (128, 64)
    assert sorted(r["prompt_id"] for r in fit + validation) == sorted(r["prompt_id"] for r in train)
    assert {r["form"] for r in validation} == set(FORMS)
    assert not {r["prompt"] for r in validation} & {r["prompt"] for r in fit + test}
    if held_out == "unordered":
        seen = {_operands(r["prompt"]) for r in fit + test} - {None}
        assert not {_operands(r["prompt"]) for r in validation} & seen
    assert build_checkable_prompts("validation", 1, held_out) != validation


def test_the_checker_reads_the_first_number_and_has_nothing_to_check_without_a_reference():
    completions = ["42", "The answer is 42.", "7 times 6 is 42", "forty-two", "42", "-3"]
    reference = ["42", "42", "42", "42", None, "-3"]
    assert first_number([""] * 6, completions, reference) == [1.0, 1.0, 0.0, 0.0, None, 1.0]


def test_the_checker_compares_numbers_by_value():
    """Decimals, thousands separators and references read as floats (a column with one decimal answer in it)
    are compared as numbers; a gap in the column (NaN) has nothing to check; a reference that is no number is
    refused rather than never matched."""
    completions = ["24", "It is 3.5 cups.", "1,000 people", "1000", ".5", "12.5", "3,4 and 5", "-7.0", "x"]
    reference = [24.0, "3.5", 1000, "1,000", "0.5", 12, 3, " -7 ", float("nan")]
    assert first_number([""] * 9, completions, reference) == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, None]
    assert first_number([""] * 3, ["1e20 is 100000000000000000000", "0.0000001", "+4"], [1e20, 1e-7, "+4"]) == \
        [0.0, 1.0, 1.0]  # "1e20" reads as 1, then stops: what comes first counts
    assert first_number([""], ["4"], [""]) == [None]  # an empty reference is a gap, as a null is
    for written in ("forty", "3,4", "1,00", "1e3", "1_000"):  # read as strictly as an answer is
        with pytest.raises(ValueError, match=f"row 1 of the batch: reference answer '{written}' is not a number"):
            first_number([""] * 2, ["4", "40"], ["4", written])


def test_the_held_out_rule_is_part_of_the_samples_fingerprint(make_cfg):
    """Samples drawn under one split rule are not reused under the other: the prompts differ."""
    from rsft.runner import wanted_fingerprint

    fingerprints = [wanted_fingerprint(make_cfg("stage=sample", "+experiment=verifiable", f"data.held_out={rule}"))
                    for rule in ("unordered", "ordered")]
    assert fingerprints[0] != fingerprints[1]
    assert [f["config"].get("data.held_out") for f in fingerprints] == ["unordered", "ordered"]
