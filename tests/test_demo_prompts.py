"""The demo prompt set: deterministic, disjoint splits, unique ids, one task schema, storable."""

import re

import pytest
from datasets import Dataset

from rsft.demo_prompts import TEMPLATES, TOPICS, build_demo_prompts

TASK_KEYS = {"template", "topic", "keywords", "form", "count", "max_words", "tone_words"}
SPLITS = ("train", "validation", "test")
# train's 1st and 72nd prompts as they were before validation was split off the train pool
FIRST_TRAIN_PROMPT = "In at most 10 words, explain why people care about reading."
SEVENTY_SECOND_TRAIN_PROMPT = "Explain reading to a child in at most 15 words."


@pytest.fixture(scope="module")
def prompts():
    return {split: build_demo_prompts(split) for split in SPLITS}


def test_deterministic(prompts):
    for split in SPLITS:
        assert build_demo_prompts(split) == prompts[split]


def test_sizes(prompts):
    assert (len(prompts["train"]), len(prompts["validation"]), len(prompts["test"])) == (256, 64, 64)


def test_ids_unique_and_stable_format(prompts):
    ids = [r["prompt_id"] for split in SPLITS for r in prompts[split]]
    assert len(ids) == len(set(ids))
    for split in SPLITS:
        assert all(re.fullmatch(rf"demo-{split}-\d{{4}}", r["prompt_id"]) for r in prompts[split])


def test_splits_disjoint(prompts):
    train, test = prompts["train"], prompts["test"]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    # Whole (template, topic) pairs are held out, so test prompts are not train prompts with
    # another number in them.
    pairs = {split: {(r["task"]["template"], r["task"]["topic"]) for r in prompts[split]} for split in SPLITS}
    assert not pairs["train"] & pairs["test"] and not pairs["validation"] & pairs["test"]
    # validation is the tail of the train pool: no prompt of train, nor of test
    assert not {r["prompt"] for r in prompts["validation"]} & {r["prompt"] for r in train + test}


def test_every_template_in_both_splits(prompts):
    names = {t.name for t in TEMPLATES}
    for split in SPLITS:
        assert {r["task"]["template"] for r in prompts[split]} == names


def test_same_task_keys_and_simple_values(prompts):
    for record in [r for split in SPLITS for r in prompts[split]]:
        assert set(record) == {"prompt_id", "prompt", "task"}
        task = record["task"]
        assert set(task) == TASK_KEYS
        for value in task.values():
            assert value is None or isinstance(value, (str, int)) or (
                isinstance(value, list) and all(isinstance(v, str) for v in value))


def test_tasks_match_prompts(prompts):
    for record in [r for split in SPLITS for r in prompts[split]]:
        task, prompt = record["task"], record["prompt"]
        assert task["topic"] in prompt
        assert task["keywords"] == TOPICS[task["topic"]]
        assert task["form"] in {"sentences", "list", "questions", "text", "message"}
        assert (task["count"] is None) == (task["form"] in {"text", "message"})
        assert (task["tone_words"] is None) == (task["form"] != "message")
        # Budgets fit in ~48 new tokens.
        assert 5 <= task["max_words"] <= 35
        if task["form"] in {"text", "message"}:
            assert str(task["max_words"]) in prompt
        assert "<|" not in prompt and "\n" not in prompt


def test_storable_as_datasets_column(prompts):
    records = prompts["test"]
    assert Dataset.from_list(records).to_list() == records


def test_unknown_split():
    with pytest.raises(ValueError, match="'train', 'validation', 'test', not 'dev'"):
        build_demo_prompts("dev")


def test_train_kept_its_first_256_prompts_when_validation_was_split_off():
    """Runs recorded before the validation split (a loop of 3 rounds x 24 uses train's first 72) still reproduce:
    train's first prompts and ids are fixed, checked against two known ones."""
    train = build_demo_prompts("train")
    assert train[0]["prompt_id"] == "demo-train-0001" and train[255]["prompt_id"] == "demo-train-0256"
    assert (train[0]["prompt"], train[71]["prompt"]) == (FIRST_TRAIN_PROMPT, SEVENTY_SECOND_TRAIN_PROMPT)
