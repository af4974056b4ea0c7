"""The built-in demo prompt set: short instructions whose constraints a program can check.

Why: to show that rejection-sampling fine-tuning improves a policy we need a task with a gold
judge (`reward/gold.py`) that a person would agree with. Every prompt here asks for things that
are visible in the text (a topic, a number of sentences, list items or questions, a word budget,
sometimes a friendly tone) and that a small chat model often gets wrong: it rambles past the
budget, adds a preamble, repeats itself, runs into the token limit. Every budget fits in the
~48 new tokens the sampler allows (at most 35 words).

How: TOPICS x TEMPLATES x two variants of each template (its count or word budget) = 384 prompts.
The split holds out whole (template, topic) pairs: for each template, `TEST_TOPICS_PER_TEMPLATE`
topics go to test, so test has 64 prompts (8 per template), and no test prompt differs from a
train prompt only in its number or phrasing. The other 320, shuffled, are split in order: the first
256 are train, the last 64 validation, for choosing a setting (a floor, a learning rate) without
reading test. Validation shares (template, topic) pairs with train, as a random split of one pool
does, but no validation prompt is a train prompt, and a loop reaches none of them before it has
used 256 train prompts (ten rounds of 24). A `random.Random(SEED)` picks the held-out pairs, each
prompt's phrasing and the order; ids are `demo-<split>-<nnnn>` in that order, so they are stable
as long as this file is (train's first 256 are what they were when train held all 320).

Record: {"prompt_id": str, "prompt": str, "task": dict}. The task keys are the same in every
record (None where unused) so that `task` can be stored as a `datasets` column:
  template    the template's name ("describe", "tips", ...)
  topic       the topic as written in the prompt ("the ocean")
  keywords    words that count as mentioning the topic (matched with simple inflections)
  form        "sentences" | "list" | "questions" | "text" (one paragraph) | "message" (a card)
  count       how many sentences / list items / questions were asked for; None for text, message
  max_words   the word budget (stated in the prompt, or implied by "short")
  tone_words  for a friendly message, words that show the tone; None otherwise
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rsft.errors import ConfigError

SEED = 0
TEST_TOPICS_PER_TEMPLATE = 4
VALIDATION_PROMPTS = 64  # the tail of the shuffled train pool
SPLITS = ("train", "validation", "test")
NUMBER_WORDS = {1: "one", 2: "two", 3: "three"}

TOPICS: dict[str, list[str]] = {
    "the ocean": ["ocean", "sea", "water", "wave", "beach", "tide", "marine"],
    "rain": ["rain", "raindrop", "storm", "cloud", "umbrella", "wet", "drizzle", "shower"],
    "cats": ["cat", "kitten", "kitty", "feline", "purr", "meow"],
    "dogs": ["dog", "puppy", "puppies", "pup", "canine", "bark"],
    "coffee": ["coffee", "espresso", "caffeine", "brew", "latte", "bean", "cup"],
    "gardening": ["garden", "gardener", "plant", "soil", "seed", "flower", "grow"],
    "the moon": ["moon", "lunar", "crescent", "moonlight"],
    "birthdays": ["birthday", "cake", "candle", "party", "parties", "celebrate", "celebration"],
    "bicycles": ["bicycle", "bike", "cycling", "cyclist", "pedal", "wheel"],
    "trees": ["tree", "forest", "leaf", "leaves", "branch", "branches", "wood", "oak", "root"],
    "reading": ["read", "reader", "book", "novel", "story", "stories", "page", "library"],
    "winter": ["winter", "snow", "snowflake", "cold", "ice", "icy", "frost", "freezing"],
    "cooking pasta": ["pasta", "spaghetti", "noodle", "boil", "sauce", "cook"],
    "friendship": ["friend", "friendship", "buddy", "buddies", "companion", "pal"],
    "the sun": ["sun", "sunlight", "sunshine", "sunny", "solar"],
    "music": ["music", "musical", "song", "melody", "melodies", "sing", "instrument", "tune"],
    "sleep": ["sleep", "slept", "nap", "bed", "bedtime", "rest", "dream", "asleep"],
    "bees": ["bee", "honey", "hive", "pollen", "buzz", "nectar"],
    "mountains": ["mountain", "peak", "summit", "hike", "climb", "hill"],
    "libraries": ["library", "libraries", "librarian", "book", "shelf", "shelves"],
    "apples": ["apple", "fruit", "orchard"],
    "trains": ["train", "railway", "rail", "station", "locomotive", "track"],
    "drinking water": ["water", "drink", "hydrated", "hydration", "thirst"],
    "picnics": ["picnic", "basket", "blanket", "sandwich", "sandwiches", "outdoor"],
}

FRIENDLY_WORDS = ["happy", "hope", "wish", "wishing", "enjoy", "love", "warm", "dear", "cheers",
                  "joy", "joyful", "best", "congratulations", "thank", "thanks", "smile", "wonderful"]


@dataclass(frozen=True)
class Template:
    """One kind of instruction. Phrasings are `str.format` strings with the fields {topic},
    {n} ("two"), {counted} ("two short sentences": n + unit, pluralised) and {max_words}."""

    name: str
    form: str
    phrasings: tuple[str, ...]
    variants: tuple[tuple[int | None, int], ...]  # (count, max_words) pairs
    unit: str | None = None
    tone_words: tuple[str, ...] | None = None


TEMPLATES: tuple[Template, ...] = (
    Template("describe", "sentences",
             ("Describe {topic} in {counted}.", "In {counted}, describe {topic}."),
             variants=((1, 25), (2, 35)), unit="short sentence"),
    Template("tips", "list",
             ("Give {counted} about {topic}, as a list.",
              "Write {counted} about {topic} as a bulleted list."),
             variants=((2, 25), (3, 35)), unit="short tip"),
    Template("story", "sentences",
             ("Write a {n}-sentence story about {topic}.",
              "Tell a very short story about {topic} in exactly {counted}."),
             variants=((1, 25), (2, 35)), unit="sentence"),
    Template("child", "text",
             ("Explain {topic} to a child in at most {max_words} words.",
              "In {max_words} words or fewer, explain {topic} to a five-year-old."),
             variants=((None, 15), (None, 25))),
    Template("greeting", "message",
             ("Write a short, friendly greeting card message about {topic}, in at most {max_words} words.",
              "Write a warm greeting card message about {topic} in {max_words} words or fewer."),
             variants=((None, 20), (None, 30)), tone_words=tuple(FRIENDLY_WORDS)),
    Template("facts", "list",
             ("Name {counted} about {topic}, as a numbered list.",
              "State {counted} about {topic} as a numbered list."),
             variants=((2, 25), (3, 35)), unit="fact"),
    Template("questions", "questions",
             ("Ask {counted} about {topic}.", "Write {counted} a curious child might ask about {topic}."),
             variants=((1, 20), (2, 30)), unit="question"),
    Template("why", "text",
             ("In at most {max_words} words, explain why people care about {topic}.",
              "Say in {max_words} words or fewer what makes {topic} special."),
             variants=((None, 10), (None, 15))),
)


def _record(template: Template, topic: str, count: int | None, max_words: int, phrasing: str) -> dict:
    counted = None
    if count is not None:
        counted = f"{NUMBER_WORDS[count]} {template.unit}{'' if count == 1 else 's'}"
    prompt = phrasing.format(topic=topic, n=NUMBER_WORDS.get(count), counted=counted, max_words=max_words)
    task = {
        "template": template.name,
        "topic": topic,
        "keywords": list(TOPICS[topic]),
        "form": template.form,
        "count": count,
        "max_words": max_words,
        "tone_words": None if template.tone_words is None else list(template.tone_words),
    }
    return {"prompt": prompt, "task": task}


def build_demo_prompts(split: str) -> list[dict]:
    """The demo prompts of `split` ("train": 256, "validation": 64, "test": 64), in a fixed shuffled order."""
    if split not in SPLITS:
        raise ConfigError(f"demo prompts have splits {', '.join(repr(s) for s in SPLITS)}, not {split!r}; set "
                          f"data.split (and data.eval_split) to one of them")
    rng = random.Random(SEED)
    held_out = {(template.name, topic)
                for template in TEMPLATES
                for topic in rng.sample(list(TOPICS), TEST_TOPICS_PER_TEMPLATE)}
    records: dict[str, list[dict]] = {"train": [], "test": []}
    for template in TEMPLATES:
        for topic in TOPICS:
            pair_split = "test" if (template.name, topic) in held_out else "train"
            for count, max_words in template.variants:
                phrasing = rng.choice(template.phrasings)
                records[pair_split].append(_record(template, topic, count, max_words, phrasing))
    # Both splits are built and shuffled every call so that each one's order and ids never
    # depend on which split was asked for.
    for split_records in records.values():
        rng.shuffle(split_records)
    # validation: the tail of the shuffled train pool (train's ids and order up to 256 are as they were)
    records["validation"] = records["train"][len(records["train"]) - VALIDATION_PROMPTS:]
    records["train"] = records["train"][:len(records["train"]) - VALIDATION_PROMPTS]
    for name, split_records in records.items():
        for index, record in enumerate(split_records, start=1):
            record["prompt_id"] = f"demo-{name}-{index:04d}"
    return [{"prompt_id": r["prompt_id"], "prompt": r["prompt"], "task": r["task"]} for r in records[split]]
