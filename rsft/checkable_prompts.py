"""The checkable task (data=checkable): short questions with one right number, and their answers.

    python -m rsft.run stage=loop +experiment=verifiable

Four forms, generated from a seed, each answered by one number: "What is 7 + 4?", "What number comes
right after 38?", "Which is larger, 35 or 67?", "What is 6 times 7?", each followed by "Answer with just
the number." The form mix is chosen so that the initial SmolLM2-135M-Instruct is right on a middling share
(docs/results.md#a-verifiable-task): 2-digit arithmetic was too hard for it (5-10%). Every row carries its
`reference` answer, which the checker reward.checkers.first_number reads (a `function` reward). Train and
test questions are drawn from disjoint operand pairs, and a held-out pair's swapped twin is held out with it
(data.held_out=unordered, the default): no test question is a train question up to the order of its operands.
data.held_out=ordered is the split before that rule (commit 5c4b868 and earlier, every verifiable result
recorded until then): disjoint ordered pairs, so 16 of its 64 test questions of + and x had their swapped twin
(6 x 7 beside 7 x 6) in train.
"""

from __future__ import annotations

import random

from rsft.errors import ConfigError

FORMS = ("add", "next", "larger", "times")
HELD_OUT = ("unordered", "ordered")  # data.held_out
HELD_OUT_PAIRS = 16  # x 4 forms = 64 test questions; the other 48 pairs x 4 = 192 train
SUFFIX = " Answer with just the number."


def _question(form: str, a: int, b: int) -> tuple[str, int]:
    if form == "add":
        return f"What is {a} + {b}?", a + b
    if form == "next":
        return f"What number comes right after {10 * a + b}?", 10 * a + b + 1
    if form == "larger":
        x, y = 10 * a + b, 10 * b + a + 1
        return f"Which is larger, {x} or {y}?", max(x, y)
    return f"What is {a} times {b}?", a * b


def build_checkable_prompts(split: str, seed: int = 0, held_out: str = "unordered") -> list[dict]:
    """The questions of `split` ("train": 192, "test": 64), in a fixed shuffled order, each with its form,
    operands and `reference` answer (a string, as the checker compares text). held_out: see the module."""
    if split not in ("train", "test"):
        raise ConfigError(f"checkable prompts have splits 'train' and 'test', not {split!r}; set data.split (and "
                          f"data.eval_split) to train or test")
    if held_out not in HELD_OUT:
        raise ConfigError(f"data.held_out={held_out!r}: expected one of {', '.join(HELD_OUT)}")
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(2, 10) for b in range(2, 10)]  # 64 operand pairs per form
    rng.shuffle(pairs)
    if held_out == "ordered":
        held = set(pairs[:HELD_OUT_PAIRS])
    else:  # in the shuffled order, each pair with its twin, while they fit
        held: set[tuple[int, int]] = set()
        for a, b in pairs:
            both = {(a, b), (b, a)}
            if not both & held and len(held | both) <= HELD_OUT_PAIRS:
                held |= both
    rows = {"train": [], "test": []}
    for form in FORMS:
        for a, b in pairs:
            question, answer = _question(form, a, b)
            rows["test" if (a, b) in held else "train"].append(
                {"prompt": question + SUFFIX, "reference": str(answer), "form": form})
    for name, records in rows.items():
        rng.shuffle(records)
        for i, record in enumerate(records):
            record["prompt_id"] = f"{name}-{i:04d}"
    return rows[split]
