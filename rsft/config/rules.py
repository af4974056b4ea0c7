"""The rules' vocabulary every settings module declares its fields with: `setting(default, help, check=...)`,
the checks (`Check` and the functions that make one), and `Checked`, the base whose __post_init__ runs them.
"""

import dataclasses
import math
from typing import Any, Callable, ClassVar, Optional

from omegaconf import MISSING


def setting(default, help: str, *, shown_type: Optional[str] = None, check: Optional["Check"] = None):
    """A dataclass field with its one-sentence help. A list or dict default is copied per instance; a
    dataclass class as the default means a fresh instance of it (a nested section). shown_type names
    the accepted types of an `Any` setting in --help and docs/config.md (e.g. "int or float"). check is
    the setting's own rule (`check=at_least(1)`), run by Checked.__post_init__; a subclass that only
    changes a setting's default or help keeps the rule its base declared."""
    metadata = {"help": help, **({"type": shown_type} if shown_type else {}), **({"check": check} if check else {})}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _unresolved(value) -> bool:
    """A class default still unresolved (`${...}` or `???`): checked when OmegaConf builds the object."""
    return isinstance(value, str) and (value == MISSING or "${" in value)


def _fail(key: str, value, expected: str):
    raise ValueError(f"{key}={value!r}: expected {expected}")


def _typed(key: str, value, kind: type, expected: str) -> None:
    """An int (kind=int) or a number (kind=float; an int is a number too), never a bool or a string. A
    number is finite: NaN and +-inf pass YAML's float type, yet no setting means anything by them (NaN
    fails every comparison, inf overflows a learning rate or a temperature into NaN losses and logits)."""
    allowed = (int,) if kind is int else (int, float)
    if not _unresolved(value) and (isinstance(value, bool) or not isinstance(value, allowed)):
        _fail(key, value, expected)
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        _fail(key, value, expected.replace("a number", "a finite number", 1) if "a number" in expected
              else f"{expected} (a finite number)")


def _integer(key: str, value, minimum: Optional[int] = None, note: str = "") -> None:
    expected = "an integer" + (f" >= {minimum}" if minimum is not None else "") + (f" {note}" if note else "")
    _typed(key, value, int, expected)
    if not _unresolved(value) and minimum is not None and value < minimum:
        _fail(key, value, expected)


def _number(key: str, value, expected: str, within: Callable[[float], bool] = lambda v: True) -> None:
    """A number for which within(value) holds; NaN fails every comparison, so it fails here too."""
    _typed(key, value, float, expected)
    if not _unresolved(value) and not within(value):
        _fail(key, value, expected)


def _positive(key: str, value, note: str = "") -> None:
    _number(key, value, "a number > 0" + (f" {note}" if note else ""), lambda v: v > 0)


def _non_negative(key: str, value) -> None:
    _number(key, value, "a number >= 0", lambda v: v >= 0)


def _open_fraction(key: str, value) -> None:
    _number(key, value, "a number in (0, 1)", lambda v: 0 < v < 1)


def _boolean(key: str, value, expected: str = "true or false") -> None:
    """A switch is a real bool, never a string such as 'no' that Python reads as true."""
    if not _unresolved(value) and not isinstance(value, bool):
        _fail(key, value, expected)


def _one_of(key: str, value, options: tuple) -> None:
    if not _unresolved(value) and value not in options:
        _fail(key, value, f"one of {', '.join(options)}")


def _limit(key: str, value, note: str = "null = all rows") -> None:
    """A row limit is a positive integer or null (rsft.data.check_limit's rule): 0 would leave no rows."""
    if not _unresolved(value) and value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1):
        _fail(key, value, f"a positive integer or null ({note})")


def _sampling_rule(check: Callable, *args) -> None:
    """Run rsft.sampling's rule across settings once they are all resolved (its message starts with the
    key inside the group)."""
    if not any(_unresolved(a) for a in args):
        check(*args)


def _warmup(key: str, value) -> None:
    """transformers 5's reading: an int counts steps, a float below 1 is a fraction of the training steps."""
    if _unresolved(value):
        return
    steps = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    fraction = isinstance(value, float) and 0 <= value < 1
    if not (steps or fraction):
        _fail(key, value, "an integer >= 0 (steps) or a number in [0, 1) (a fraction of the training steps)")


# -- a setting's own rule, declared beside it: setting(..., check=<one of these>) -------------------------------


class Check:
    """One setting's rule: check(key, value) raises ValueError(`<key>=<value!r>: expected <what>`) (the
    rules' vocabulary above); describe() is what it accepts in words, for docs/config.md's type column
    ("" where the type says it all)."""

    def __init__(self, rule: Callable[[str, Any], None], allowed: str = ""):
        self.rule, self.allowed = rule, allowed

    def __call__(self, key: str, value) -> None:
        self.rule(key, value)

    def describe(self) -> str:
        return self.allowed


def integer(note: str = "") -> Check:
    """Any integer."""
    return Check(lambda key, value: _integer(key, value, None, note))


SEED_MAX = 2 ** 32 - 1  # numpy's and torch's seeds are unsigned 32-bit: they refuse anything outside [0, 2**32 - 1]


def _seed(key: str, value) -> None:
    expected = f"an integer in [0, {SEED_MAX}] (a seed: numpy takes no other)"
    _typed(key, value, int, expected)
    if not _unresolved(value) and not 0 <= value <= SEED_MAX:
        _fail(key, value, expected)


def a_seed() -> Check:
    """A seed: an integer in [0, 2**32 - 1], what numpy's and torch's generators accept."""
    return Check(_seed, "in [0, 2**32 - 1]")


def at_least(minimum: int, note: str = "") -> Check:
    """An integer >= minimum; note says what the lowest value means, e.g. "(0 = off)"."""
    return Check(lambda key, value: _integer(key, value, minimum, note), f">= {minimum}")


def number(expected: str, within: Callable[[float], bool], allowed: str) -> Check:
    return Check(lambda key, value: _number(key, value, expected, within), allowed)


def positive(note: str = "") -> Check:
    """A number > 0; note says what 0 would do and what to set instead, e.g. for a learning rate."""
    return Check(lambda key, value: _positive(key, value, note), "> 0")


def non_negative() -> Check:
    return Check(_non_negative, ">= 0")


def open_fraction() -> Check:
    return Check(_open_fraction, "in (0, 1)")


def typed(kind: type, expected: str) -> Check:
    """The type alone (int, or float: a number), where the range is a rule across settings."""
    return Check(lambda key, value: _typed(key, value, kind, expected))


def boolean(expected: str = "true or false", also: tuple = ()) -> Check:
    """true or false, or one of `also` (loop.refresh_reward's auto)."""
    return Check(lambda key, value: value in also or _boolean(key, value, expected))


def one_of(options: tuple) -> Check:
    return Check(lambda key, value: _one_of(key, value, options), "one of " + ", ".join(options))


def row_limit(note: str = "null = all rows") -> Check:
    return Check(lambda key, value: _limit(key, value, note), ">= 1")


def warmup() -> Check:
    return Check(_warmup, ">= 0 (int) or in [0, 1) (float)")


def optional(check: Check) -> Check:
    """null, or what `check` accepts."""
    return Check(lambda key, value: value is None or check(key, value), check.describe())


def kind_is(kind: str) -> Check:
    """The kind selects the code path that reads the other fields: it is the option's, not set alone."""
    def rule(key: str, value) -> None:
        if value != kind:
            _fail(key, value, f"{kind} (the option's kind; another kind is another option of the group)")
    return Check(rule)


def sampling_rule(rule: Callable[[Any, str], None], allowed: str, kind: Optional[type] = None,
                  expected: str = "") -> Check:
    """rsft.sampling's own rule on one setting, rule(value, key), its message naming the key it is given;
    where `kind` is given the YAML's type is checked first (the config's part: a bool is not a number)."""
    def check(key: str, value) -> None:
        if kind is not None:
            _typed(key, value, kind, expected)
        if not _unresolved(value):
            rule(value, key)
    return Check(check, allowed)


def _field_check(cls, name: str) -> Optional[Check]:
    """The check declared for a field: the most derived class that declares one (a subclass that only
    changes the default keeps its base's rule)."""
    for klass in cls.__mro__:
        field = getattr(klass, "__dataclass_fields__", {}).get(name)
        if field is not None and "check" in field.metadata:
            return field.metadata["check"]
    return None


def check_fields(cls, section, at: str = "") -> None:
    """Every setting's own check of schema `cls`, in field order, on `section` (its object, or a composed
    config node); keys are prefixed with `at`, the section's place in its group."""
    for field in dataclasses.fields(cls):
        check = _field_check(cls, field.name)
        if check is not None:
            check(at + field.name, getattr(section, field.name))


class Checked:
    """The base of every schema: __post_init__ runs each setting's own check (setting(check=...)) in field
    order. _AT is where a nested section sits in its group (`train.`, `lora.`, `fallback.`, `stop.`), for its keys:
    set by _place_sections from the fields that hold it, never declared.
    A schema whose rules relate several settings overrides __post_init__: super().__post_init__() first,
    then those rules, each with a comment on why it spans them."""

    _AT: ClassVar[str] = ""

    def __post_init__(self):
        check_fields(type(self), self, self._AT)


DTYPES = ("float32", "bfloat16", "float16")  # rsft.models loads weights in one of these


def _group(help: str):
    """A top-level field holding a config group: the chosen option's own dataclass is its schema."""
    return setting(MISSING, help, shown_type="config group")
