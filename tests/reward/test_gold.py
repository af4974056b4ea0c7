"""The gold judge: good answers beat flawed ones on every template; bounded; monotone; graded."""

import random

import pytest

from reward.gold import SOFT_WEIGHTS, gold_components, gold_score
from rsft.demo_prompts import TEMPLATES, build_demo_prompts

ALL_TASKS = [r["task"] for split in ("train", "validation", "test") for r in build_demo_prompts(split)]
COMPONENTS = {"not_empty", "on_topic", *SOFT_WEIGHTS}


def demo_task(template, topic, **constraints):
    return next(t for t in ALL_TASKS if t["template"] == template and t["topic"] == topic
                and all(t[key] == value for key, value in constraints.items()))


# template: (task constraints, an answer that respects them, one with the same shape off the topic)
CASES = {
    "describe": (dict(topic="the ocean", count=1),
                 "The ocean is a vast body of salty water that covers most of our planet.",
                 "A car is a machine with four wheels that takes people from place to place."),
    "tips": (dict(topic="sleep", count=3),
             "- Go to bed at the same time every night.\n- Keep your bedroom dark and quiet.\n"
             "- Avoid screens for an hour before you sleep.",
             "- Check your tire pressure every month.\n- Change the engine oil on time.\n"
             "- Keep the windshield clean."),
    "story": (dict(topic="cats", count=2),
              "A small cat found a warm spot in the sun every morning. "
              "One day she shared it with a shy kitten from next door.",
              "A red car drove along the highway every morning. "
              "One day it stopped to help a tired driver get home."),
    "child": (dict(topic="rain", max_words=15),
              "Rain is water that falls from clouds when they get too heavy.",
              "A computer is a machine that helps people write, count and play games."),
    "greeting": (dict(topic="birthdays", max_words=20),
                 "Happy birthday! Wishing you a wonderful year full of cake, laughter and good friends.",
                 "Happy retirement! Wishing you many relaxing days of golf, travel and good friends."),
    "facts": (dict(topic="bees", count=2),
              "1. Bees make honey from the nectar of flowers.\n2. A single hive can hold tens of thousands of bees.",
              "1. Cars run on petrol or electricity.\n2. The first cars were built more than a century ago."),
    "questions": (dict(topic="the moon", count=1),
                  "Why does the moon change its shape during the month?",
                  "Why do cars need oil to run smoothly?"),
    "why": (dict(topic="trees", max_words=10),
            "Trees give us clean air, shade and homes for animals.",
            "Computers help us learn, work and talk with friends."),
}


def flawed_answers(task, good, off_topic):
    """(name, completion, finish_reason) for the usual ways a small chat model goes wrong."""
    topic = task["topic"]
    ramble = (f"There is so much more to say about {topic}, because people everywhere have thought "
              "about it for a very long time and still keep finding new things to talk about.")
    cut_at = good.rfind(" ", 0, int(len(good) * 0.7))
    return [
        ("off_topic", off_topic, "eos"),
        ("rambling", f"{good}\n\n{ramble}", "eos"),
        ("cut_off", good[:cut_at], "length"),
        ("rambling_cut_off", f"{good}\n\n{ramble}"[:200].rsplit(" ", 1)[0], "length"),
        ("repetitive", "\n".join([good] * 3), "eos"),
        ("preamble", f"Sure! Here is my answer about {topic}:\n\n{good}", "eos"),
        ("filler", f"{good}\n\nI hope this helps! Let me know if you have other questions.", "eos"),
        ("empty", "", "eos"),
    ]


def test_cases_cover_every_template():
    assert set(CASES) == {t.name for t in TEMPLATES}


@pytest.mark.parametrize("template", sorted(CASES))
def test_good_answer_scores_high(template):
    constraints, good, _ = CASES[template]
    task = demo_task(template, **constraints)
    assert gold_components(task, good, "eos") == dict.fromkeys(COMPONENTS, 1.0)
    assert gold_score(task, good, "eos") == pytest.approx(1.0)
    assert gold_score(task, good) == gold_score(task, good, "eos")


@pytest.mark.parametrize("template", sorted(CASES))
def test_good_answer_beats_every_flawed_one(template):
    constraints, good, off_topic = CASES[template]
    task = demo_task(template, **constraints)
    good_score = gold_score(task, good, "eos")
    for name, completion, finish_reason in flawed_answers(task, good, off_topic):
        bad_score = gold_score(task, completion, finish_reason)
        assert good_score - bad_score >= 0.05, (name, completion, bad_score)


@pytest.mark.parametrize("template", sorted(CASES))
def test_clumsy_on_topic_beats_tidy_off_topic(template):
    constraints, good, off_topic = CASES[template]
    task = demo_task(template, **constraints)
    name, clumsy, finish_reason = flawed_answers(task, good, off_topic)[3]
    assert name == "rambling_cut_off"
    assert gold_score(task, clumsy, finish_reason) > gold_score(task, off_topic, "eos")


def test_scores_and_components_in_unit_interval():
    rng = random.Random(0)
    pool = ["The", "ocean", "sea", "is", "deep", "and", "blue", ".", "!", "?", ",", "\n", "\n\n", "- ", "1. ",
            "Sure!", "Here is", "I hope this helps", "🌊", "**", "cats", "word", "...", ":", "''"]
    for _ in range(400):
        task = rng.choice(ALL_TASKS)
        completion = " ".join(rng.choice(pool) for _ in range(rng.randrange(0, 60)))
        finish_reason = rng.choice([None, "eos", "stop", "length"])
        components = gold_components(task, completion, finish_reason)
        assert set(components) == COMPONENTS
        assert all(0.0 <= value <= 1.0 for value in components.values()), (completion, components)
        assert 0.0 <= gold_score(task, completion, finish_reason) <= 1.0


@pytest.mark.parametrize("completion", ["", "   \n\n ", "...", "- \n1. "])
def test_empty_scores_zero(completion):
    assert gold_score(demo_task("describe", "the ocean", count=1), completion) == 0.0


def test_length_monotone():
    task = demo_task("why", "trees", max_words=10)
    scores = [gold_score(task, " ".join(["Trees"] + [f"word{i}" for i in range(n - 1)]) + ".")
              for n in range(3, 40)]
    within, over = scores[:10 - 3 + 1], scores[10 - 3:]
    assert all(score == within[0] for score in within)
    assert all(a > b for a, b in zip(over, over[1:]))


def test_too_short_penalised():
    task = demo_task("why", "trees", max_words=10)
    assert gold_score(task, "Trees.") < gold_score(task, "Trees give shade.")


@pytest.mark.parametrize("form_task, units", [
    (("describe", "the ocean", 2), ["The ocean is deep.", "Waves roll onto sand.", "Fish swim below.",
                                    "Whales sing at night.", "Tides rise twice daily."]),
    (("tips", "sleep", 3), ["- Sleep early.", "- Skip late coffee.", "- Dim the lights.", "- Read a book.",
                            "- Keep a cool room.", "- Nap briefly."]),
    (("questions", "the moon", 2), ["Why does the moon glow?", "How far away is it?", "Is it made of rock?",
                                    "Can people live there?", "Does it have weather?"]),
])
def test_count_monotone(form_task, units):
    """The score peaks at the requested count and falls the further the count is from it."""
    template, topic, count = form_task
    task = demo_task(template, topic, count=count)
    separator = "\n" if template == "tips" else " "
    scores = [gold_score(task, separator.join(units[:n])) for n in range(1, len(units) + 1)]
    peak = count - 1
    assert scores[peak] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(scores[:peak], scores[1:peak + 1]))
    assert all(a > b for a, b in zip(scores[peak:], scores[peak + 1:]))


def test_list_intro_line_penalised():
    task = demo_task("tips", "sleep", count=3)
    items = "- Sleep early.\n- Skip late coffee.\n- Dim the lights."
    assert gold_components(task, "Three tips for better sleep:\n" + items)["format"] < 1.0


def test_question_not_answer():
    task = demo_task("questions", "the moon", count=1)
    assert gold_score(task, "The moon is made of rock.") < gold_score(task, "What is the moon made of?")


def test_repetition_monotone():
    task = demo_task("child", "rain", max_words=25)
    loop = "Rain falls from the clouds."
    no_repetition = [gold_components(task, " ".join([loop] * k))["no_repetition"] for k in range(1, 8)]
    assert no_repetition[0] == 1.0
    assert all(a > b for a, b in zip(no_repetition, no_repetition[1:]))


def test_cut_off_penalised():
    task = demo_task("describe", "the ocean", count=1)
    sentence = "The ocean is a vast body of salty water."
    fragment = "The ocean is a vast body of salty"
    assert gold_score(task, sentence, "length") < gold_score(task, sentence, "eos")
    assert gold_score(task, fragment, "length") < gold_score(task, sentence, "length")
    assert gold_score(task, fragment, "eos") < gold_score(task, sentence, "eos")
    assert gold_components(task, sentence + " 🌊", "eos")["finished"] == 1.0


def test_list_needs_no_final_full_stop_unless_cut():
    task = demo_task("tips", "sleep", count=2)
    items = "- Go to bed early\n- Keep the room dark"
    assert gold_components(task, items, "eos")["finished"] == 1.0
    assert gold_components(task, items, "length")["finished"] == 0.0


@pytest.mark.parametrize("opening", ["Sure! ", "Certainly. ", "Here's a sentence: ", "**Here is** my answer. ",
                                     "As an AI, I think "])
def test_preamble_penalised(opening):
    task = demo_task("describe", "the ocean", count=2)
    answer = "The ocean is deep and blue. Whales live in it."
    assert gold_components(task, opening + answer)["no_meta"] == 0.0
    assert gold_score(task, opening + answer) < gold_score(task, answer)


def test_words_that_merely_start_like_a_preamble_are_fine():
    task = demo_task("describe", "the ocean", count=1)
    assert gold_components(task, "Surely the ocean is the deepest place on Earth.")["no_meta"] == 1.0
    assert gold_components(task, "Okra grows far from the ocean.")["no_meta"] == 1.0


def test_keywords_match_inflections_not_other_words():
    ocean = demo_task("describe", "the ocean", count=1)
    assert gold_components(ocean, "Seas and waves are everywhere.")["on_topic"] == 1.0
    assert gold_components(ocean, "Each season brings a new mood.")["on_topic"] == 0.0
    bees = demo_task("facts", "bees", count=2)
    assert gold_components(bees, "1. Bees buzz.\n2. They sting.")["on_topic"] == 1.0


def test_greeting_needs_a_friendly_word():
    task = demo_task("greeting", "birthdays", max_words=20)
    assert gold_score(task, "Another birthday has arrived.") < gold_score(task, "Happy birthday to you!")


def test_text_form_wants_one_paragraph():
    task = demo_task("child", "rain", max_words=25)
    one = "Rain is water falling from clouds. It helps plants grow."
    assert gold_score(task, one.replace(" It", "\n\nIt")) < gold_score(task, one)


def test_graded_on_typical_small_model_outputs():
    """Different flaws give different scores, so pairs of samples rarely tie."""
    task = demo_task("child", "rain", max_words=15)
    samples = [
        ("Rain is water that falls from clouds.", "eos"),
        ("Rain is when tiny drops of water in the clouds get big and heavy and fall down to the ground.",
         "eos"),
        ("Rain is a type of precipitation that occurs when water vapor in the air condenses into droplets "
         "that become heavy enough to fall to the", "length"),
        ("Sure! Rain is water from the clouds.", "eos"),
        ("Rain is water. Rain is water. Rain is water. Rain is water.", "eos"),
        ("Hello little one! Rain is like the sky crying because the clouds are too full of water, and",
         "length"),
        ("Imagine you have a big sponge in the sky.\n\nWhen it gets full, water drips out. That's rain!", "eos"),
    ]
    scores = [gold_score(task, completion, finish_reason) for completion, finish_reason in samples]
    assert len(set(scores)) == len(scores)
    assert scores[0] == max(scores)
