"""The gold judge of the demo task: a programmatic oracle, for labelling and evaluation only.

Nothing on the selection path (sampling, scoring, best-of-K selection, SFT) may read it: the
pipeline selects with the learned reward model. This oracle plays two other parts: the simulated
annotators (`reward/annotators.py`) turn its scores into the pairwise labels the reward model is
trained on, and evaluation uses it to show that the policy improves from round to round.

It judges a completion against the structured constraints of a demo prompt (`task`, see
`rsft/demo_prompts.py`) with criteria a person can check by eye, each in [0, 1]:

  not_empty      1 if the completion has a word in it, else 0.
  on_topic       1 if one of task["keywords"] appears as a whole word (a plural or other simple
                 inflection counts: "bees" for "bee", not "season" for "sea"), else 0.
  format         the requested shape, 1 / (1 + distance from it), where the distance is
                   sentences  |sentences - count|
                   list       |list items - count| + lines that are not items ("Here are...", a title)
                   questions  |questions - count| + sentences that are not questions
                   text       lines beyond the first (one paragraph was asked for);
                 for a message (a greeting card): 1 if a word of task["tone_words"] shows the
                 friendly tone asked for, else 0.
  length         1 within the budget of 3 to max_words words; above it max_words / words, so
                 the score falls with every extra word (graded, not pass/fail); below it words / 3.
  finished       1 if the text ends properly (terminal punctuation, an emoji, or for a list a
                 complete last item) and was not cut by the token limit (finish_reason "length");
                 0.5 if only one of the two holds (a cut right after a full stop is still a cut);
                 0 if it was cut mid-sentence.
  no_repetition  1 - the fraction of word 3-grams that repeat an earlier one: a sentence said
                 twice scores about 0.5-0.6, three times about 0.4 (graded, so loops of different
                 lengths still rank).
  no_meta        0 if it opens with chat preamble ("Sure!", "Here is", "As an AI", ...), 0.5 if it
                 has chat filler elsewhere ("I hope this helps", "Let me know if"), else 1.

Combination: score = not_empty x (0.3 + 0.7 x on_topic) x weighted mean of the other five, with
weights SOFT_WEIGHTS (format 2, length 2, finished 2, no_repetition 2, no_meta 1).
Why a product for the first two: an empty completion is worth nothing, and a person prefers a
clumsy answer on the topic to a tidy one off it, which a mean would not ensure. Off-topic answers
keep 30% rather than 0 so that they still rank among themselves. The rest is a mean so that each
flaw costs a little and the score is graded: two samples for the same prompt rarely tie unless
both are perfect, which pairwise labels need.
"""

from __future__ import annotations

import re
import unicodedata

SOFT_WEIGHTS = {"format": 2.0, "length": 2.0, "finished": 2.0, "no_repetition": 2.0, "no_meta": 1.0}
OFF_TOPIC_FACTOR = 0.3
MIN_WORDS = 3

WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
LIST_MARKER = re.compile(r"^\s*(?:[-*•+]|\d+[.)])(?:\s+|$)")
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
TERMINAL = ".!?…"
CLOSERS = "\"'”’)]*_ \t\n\ufe0f"  # closing quotes, brackets, markdown emphasis, emoji variation selector
INFLECTION = r"(?:s|es|ed|ing|er|ers|y|ies|['’]s)?"
PREAMBLE = re.compile(
    r"^(?:sure|certainly|of course|absolutely|okay|ok|great question|good question|"
    r"here is|here['’]s|here are|as an ai|as a language model|"
    r"i['’]d be happy|i would be happy|i['’]m happy to|i can help)\b",
    re.IGNORECASE)
FILLER = re.compile(
    r"\b(?:as an ai|as a language model|i hope (?:this|that|these|it) helps?|let me know if|feel free to|"
    r"is there anything else)\b",
    re.IGNORECASE)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _is_list_item(line: str) -> bool:
    return LIST_MARKER.match(line) is not None


def _words(text: str) -> list[str]:
    """Lower-cased words, list markers ("1.", "-") not counted."""
    return [w.lower() for line in _lines(text) for w in WORD.findall(LIST_MARKER.sub("", line))]


def _sentences(text: str) -> list[str]:
    """Sentences: split at line breaks and after . ! ? followed by a space; fragments count."""
    pieces = (piece for line in _lines(text) for piece in SENTENCE_END.split(LIST_MARKER.sub("", line)))
    return [piece for piece in pieces if WORD.search(piece)]


def _ends_with_terminal(text: str) -> bool:
    stripped = text.rstrip(CLOSERS)
    return bool(stripped) and (stripped[-1] in TERMINAL or unicodedata.category(stripped[-1]) == "So")


def _mentions(text: str, words: list[str]) -> bool:
    return any(re.search(rf"\b{re.escape(word)}{INFLECTION}\b", text, re.IGNORECASE) for word in words)


def _closeness(distance: float) -> float:
    return 1.0 / (1.0 + distance)


def _format(task: dict, text: str) -> float:
    form, count = task["form"], task["count"]
    if form == "sentences":
        return _closeness(abs(len(_sentences(text)) - count))
    if form == "list":
        lines = _lines(text)
        items = sum(_is_list_item(line) for line in lines)
        return _closeness(abs(items - count) + (len(lines) - items))
    if form == "questions":
        sentences = _sentences(text)
        questions = sum(s.rstrip(CLOSERS).endswith("?") for s in sentences)
        return _closeness(abs(questions - count) + (len(sentences) - questions))
    if form == "text":
        return _closeness(max(len(_lines(text)) - 1, 0))
    if form == "message":
        return 1.0 if _mentions(text, task["tone_words"]) else 0.0
    raise ValueError(f"unknown demo task form {form!r}")


def _length(task: dict, n_words: int) -> float:
    if n_words > task["max_words"]:
        return task["max_words"] / n_words
    return min(n_words / MIN_WORDS, 1.0)


def _finished(task: dict, text: str, finish_reason: str | None) -> float:
    lines = _lines(text)
    ends_properly = _ends_with_terminal(text)
    if finish_reason == "length":
        return 0.5 if ends_properly else 0.0
    # A list's last item needs no full stop; a cut one is caught by finish_reason above.
    if ends_properly or (task["form"] == "list" and lines and _is_list_item(lines[-1])):
        return 1.0
    return 0.5


def _no_repetition(words: list[str]) -> float:
    trigrams = list(zip(words, words[1:], words[2:]))
    if not trigrams:
        return 1.0
    repeated = len(trigrams) - len(set(trigrams))
    return 1.0 - repeated / len(trigrams)


def _no_meta(text: str) -> float:
    if PREAMBLE.match(text.strip().lstrip("#*_\"' ")):
        return 0.0
    return 0.5 if FILLER.search(text) else 1.0


def gold_components(task: dict, completion: str, finish_reason: str | None = None) -> dict[str, float]:
    """Each criterion's score in [0, 1] (see the module docstring); always the same keys."""
    words = _words(completion)
    return {
        "not_empty": 1.0 if words else 0.0,
        "on_topic": 1.0 if _mentions(completion, task["keywords"]) else 0.0,
        "format": _format(task, completion),
        "length": _length(task, len(words)),
        "finished": _finished(task, completion, finish_reason),
        "no_repetition": _no_repetition(words),
        "no_meta": _no_meta(completion),
    }


def gold_score(task: dict, completion: str, finish_reason: str | None = None) -> float:
    """The gold score in [0, 1]: not_empty x (0.3 + 0.7 on_topic) x weighted mean of the rest."""
    components = gold_components(task, completion, finish_reason)
    soft = sum(SOFT_WEIGHTS[name] * components[name] for name in SOFT_WEIGHTS) / sum(SOFT_WEIGHTS.values())
    topic_factor = OFF_TOPIC_FACTOR + (1.0 - OFF_TOPIC_FACTOR) * components["on_topic"]
    return components["not_empty"] * topic_factor * soft


def gold_reward(prompts: list[str], completions: list[str], task: list[dict], finish_reason: list[str]) -> list[float]:
    """The demo task's gold oracle as a reward function (reward_source=function
    reward_source.spec=reward.gold:gold_reward): a perfect verifier, the ceiling a learned proxy is
    measured against. Reads each row's `task` and `finish_reason` columns."""
    return [gold_score(t, c, f) for t, c, f in zip(task, completions, finish_reason)]
