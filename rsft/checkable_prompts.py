"""The checkable task (data=checkable): short questions with one right number, and their answers.

    python -m rsft.run stage=loop +experiment=verifiable

Four forms, generated from a seed, each answered by one number: "What is 7 + 4?", "What number comes
right after 38?", "Which is larger, 35 or 67?", "What is 6 times 7?", each followed by "Answer with just
the number." The form mix is chosen so that the initial SmolLM2-135M-Instruct is right on a middling share
(docs/history.md#a-verifiable-task): 2-digit arithmetic was too hard for it (5-10%). Every row carries its
`reference` answer, which the checker reward.checkers.first_number reads (a `function` reward). Train and
test questions are drawn from disjoint operand pairs, and a held-out pair's swapped twin is held out with it
(data.held_out=unordered, the default): no test question is a train question up to the order of its operands.
data.held_out=ordered is the split before that rule (commit 5c4b868 and earlier, every verifiable result
recorded until then): disjoint ordered pairs, so 16 of its 64 test questions of + and x had their swapped twin
(6 x 7 beside 7 x 6) in train.

To choose a setting without reading test (a learning rate, issue 47), train on split "fit" and evaluate on split
"validation" (data.split=fit data.eval_split=validation): train's 192 questions cut in two by the same rule, 128
and 64, no validation question a fit question up to operand order. Train and test are unchanged by the cut.
"""

from __future__ import annotations

import random

from rsft.errors import ConfigError

FORMS = ("add", "next", "larger", "times")
HELD_OUT = ("unordered", "ordered")  # data.held_out
HELD_OUT_PAIRS = 16  # x 4 forms = 64 test questions; the other 48 pairs x 4 = 192 train
SPLITS = ("train", "test", "fit", "validation")  # fit + validation = train, cut by the held-out rule
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


def _held(pairs: list[tuple[int, int]], held_out: str) -> set[tuple[int, int]]:
    """The first HELD_OUT_PAIRS of `pairs` (in their order): ordered pairs, or (unordered) each with its twin."""
    if held_out == "ordered":
        return set(pairs[:HELD_OUT_PAIRS])
    held: set[tuple[int, int]] = set()
    for a, b in pairs:
        both = {(a, b), (b, a)}
        if not both & held and len(held | both) <= HELD_OUT_PAIRS:
            held |= both
    return held


def build_checkable_prompts(split: str, seed: int = 0, held_out: str = "unordered") -> list[dict]:
    """The questions of `split` ("train": 192, "test": 64; "fit": 128 and "validation": 64, train cut in two), in a
    fixed shuffled order, each with its form, operands and `reference` answer (a string, as the checker compares
    text). held_out: see the module."""
    if split not in SPLITS:
        raise ConfigError(f"checkable prompts have splits {', '.join(repr(s) for s in SPLITS)}, not {split!r}; set "
                          f"data.split (and data.eval_split) to one of them (fit and validation: train cut in two, to "
                          f"choose a setting without reading test)")
    if held_out not in HELD_OUT:
        raise ConfigError(f"data.held_out={held_out!r}: expected one of {', '.join(HELD_OUT)}")
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(2, 10) for b in range(2, 10)]  # 64 operand pairs per form
    rng.shuffle(pairs)
    held = _held(pairs, held_out)
    validation = _held([p for p in pairs if p not in held], held_out)  # train's own cut, by the same rule
    rows: dict[str, list[tuple[tuple[int, int], dict]]] = {"train": [], "test": []}  # (operand pair, row)
    for form in FORMS:
        for a, b in pairs:
            question, answer = _question(form, a, b)
            rows["test" if (a, b) in held else "train"].append(
                ((a, b), {"prompt": question + SUFFIX, "reference": str(answer), "form": form}))
    for name, records in rows.items():
        rng.shuffle(records)  # the permutation depends on the length only: the same as shuffling the rows alone
        for i, (_, record) in enumerate(records):
            record["prompt_id"] = f"{name}-{i:04d}"
    if split in ("fit", "validation"):  # train's rows (ids kept), cut by their operand pairs
        return [record for pair, record in rows["train"] if (pair in validation) == (split == "validation")]
    return [record for _, record in rows[split]]
