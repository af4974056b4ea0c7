"""Reward functions for tests/test_reward_sources.py: fn(prompts, completions, **columns) -> a score per row."""

from __future__ import annotations

SEEN: list[dict] = []  # what each call of `length` received, for the tests to check


def exact_match(prompts, completions, reference):
    """1.0 when the completion is the reference answer, 0.0 when not, None without a reference."""
    return [None if ref is None else float(c.strip() == ref) for c, ref in zip(completions, reference)]


def length(prompts, completions, **columns):
    SEEN.append({"prompts": list(prompts), "completions": list(completions), **columns})
    return [float(len(c)) for c in completions]


def count_a(prompts, completions):
    return [float(c.count("a")) for c in completions]


def none_when_empty(prompts, completions):
    return [None if not c else 1.0 for c in completions]


def constant(prompts, completions):
    return [3.0] * len(completions)


def raises(prompts, completions):
    if "Say hi" in prompts:
        raise RuntimeError("the verifier broke")
    return [1.0] * len(completions)


def nan_on_three(prompts, completions):
    return [float("nan") if c == "one two three" else 1.0 for c in completions]


def huge_on_three(prompts, completions):
    return [10 ** 400 if c == "one two three" else 1 for c in completions]


def string_on_three(prompts, completions):
    return ["high" if c == "one two three" else 1.0 for c in completions]


def one_short(prompts, completions):
    return [1.0] * (len(completions) - ("Say hi" in prompts))


NOT_A_FUNCTION = 3
