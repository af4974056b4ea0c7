"""Preference data: formats in, truncation counted, bad input named by column and row."""

import math

import pytest
import torch
from datasets import Dataset

from reward.encoding import encode_pair, tokenize_preferences
from reward.formats import split_hh_transcript, to_preference_pairs
from rsft.models import build_byte_tokenizer

HH_CHOSEN = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke\n\nAssistant: Why did the chicken..."
HH_REJECTED = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke\n\nAssistant: No."


def test_hh_transcript_split():
    prompt, chosen, rejected = split_hh_transcript(HH_CHOSEN, HH_REJECTED)
    assert prompt == "Human: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke\n\nAssistant:"
    assert (chosen, rejected) == ("Why did the chicken...", "No.")


def test_hh_split_when_earlier_turns_differ():
    prompt, chosen, rejected = split_hh_transcript("\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: d",
                                                   "\n\nHuman: a\n\nAssistant: b\n\nHuman: x\n\nAssistant: y")
    assert prompt == "Human: a\n\nAssistant:" and chosen.startswith("b\n\nHuman: c") and rejected.startswith("b\n\nHuman: x")


def test_hh_split_at_the_last_shared_assistant_turn_and_never_without_one():
    """Transcripts that part right after a shared assistant turn split there, not a turn earlier; transcripts that
    share less than one assistant turn are refused (an end before the marker used to count from the end)."""
    prompt, chosen, rejected = split_hh_transcript(
        "\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: d\n\nHuman: e\n\nAssistant: f",
        "\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: g")
    assert prompt == "Human: a\n\nAssistant: b\n\nHuman: c\n\nAssistant:"
    assert (chosen, rejected) == ("d\n\nHuman: e\n\nAssistant: f", "g")
    with pytest.raises(ValueError, match="share no assistant turn"):
        split_hh_transcript("\n\nHuman: How do I bake bread?\n\nAssistant: Knead it.",
                            "\n\nHuman: Tell me a joke\n\nAssistant: no.")


@pytest.mark.parametrize("row", [{"chosen": None, "rejected": "x"}, {"chosen": "x", "rejected": None}])
def test_a_null_transcript_is_named_by_row_and_column(row):
    from rsft.errors import InputError

    rows = Dataset.from_list([{"chosen": HH_CHOSEN, "rejected": HH_REJECTED}, row])
    column = "chosen" if row["chosen"] is None else "rejected"
    with pytest.raises(InputError, match=f"pairs.jsonl, row 1, column '{column}': expected a transcript .* got None"):
        to_preference_pairs(rows, "hh_rlhf", "label_prob", "pairs.jsonl")


def test_formats_plain_conversational_implicit_and_soft_labels():
    plain = Dataset.from_list([{"prompt": "p", "chosen": "a", "rejected": "b", "label_prob": 0.7}])
    assert to_preference_pairs(plain, "preference", "label_prob", "t")[0] == {
        "prompt": "p", "chosen": "a", "rejected": "b", "label_prob": 0.7}
    conversational = Dataset.from_list([{"prompt": [{"role": "user", "content": "p"}],
                                         "chosen": [{"role": "assistant", "content": "a"}],
                                         "rejected": [{"role": "assistant", "content": "b"}]}])
    assert to_preference_pairs(conversational, "preference", "label_prob", "t")[0] == {
        "prompt": "p", "chosen": "a", "rejected": "b", "label_prob": 1.0}
    turn = [{"role": "user", "content": "p"}]
    implicit = Dataset.from_list([{"chosen": turn + [{"role": "assistant", "content": "a"}],
                                   "rejected": turn + [{"role": "assistant", "content": "b"}]}])
    assert to_preference_pairs(implicit, "preference", "label_prob", "t")[0]["prompt"] == "p"
    hh = Dataset.from_list([{"chosen": HH_CHOSEN, "rejected": HH_REJECTED}])
    assert to_preference_pairs(hh, "hh_rlhf", "label_prob", "t")[0]["rejected"] == "No."


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "p", "chosen": "a"}], "missing column 'rejected'"),
    ([{"chosen": "a", "rejected": "b"}], "missing column 'prompt'"),
    ([{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "same", "rejected": "same"}],
     "row 1: columns 'chosen' and 'rejected' are identical"),
    ([{"prompt": "p", "chosen": "a", "rejected": "b", "label_prob": 1.2}], "row 0, column 'label_prob'"),
    ([{"prompt": "p", "chosen": "a", "rejected": "b", "label_prob": 0.5},
      {"prompt": "p", "chosen": "a", "rejected": "b", "label_prob": math.nan}], "row 1, column 'label_prob'"),
    ([{"prompt": "p", "chosen": "a", "rejected": None}], "row 0, column 'rejected'"),
])
def test_bad_input_names_column_and_row(rows, message):
    with pytest.raises((ValueError, KeyError), match=message):
        to_preference_pairs(Dataset.from_list(rows), "preference", "label_prob", "my.jsonl")


def test_empty_dataset():
    with pytest.raises(ValueError, match="no rows"):
        to_preference_pairs(Dataset.from_dict({"prompt": [], "chosen": [], "rejected": []}), "preference",
                            "label_prob", "my.jsonl")


def test_prompt_truncated_from_the_left_and_counted():
    tokenizer = build_byte_tokenizer()  # one token per byte; frame: "\n\n" (2 tokens) + eos
    ids, prompt_cut, completion_cut = encode_pair(tokenizer, "0123456789", "abc", 10)
    assert (prompt_cut, completion_cut) == (6, 0)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "6789\n\nabc"
    ids, prompt_cut, completion_cut = encode_pair(tokenizer, "0123", "abcdefghij", 10)
    assert (prompt_cut, completion_cut, len(ids)) == (4, 3, 10)
    pairs = Dataset.from_list([{"prompt": "0123456789", "chosen": "abc", "rejected": "de", "label_prob": 1.0},
                               {"prompt": "01", "chosen": "a", "rejected": "b", "label_prob": 1.0},
                               {"prompt": "0123", "chosen": "abcdefghij", "rejected": "x", "label_prob": 1.0}])
    encoded, counts = tokenize_preferences(pairs, tokenizer, 10)
    assert len(encoded) == 3 and all(len(ids) <= 10 for ids in list(encoded["chosen_ids"]) + list(encoded["rejected_ids"]))
    assert counts == {"pairs": 3, "pairs_prompt_truncated": 2, "prompt_tokens_cut": 6 + 4,
                      "completions_truncated": 1, "pairs_dropped": 0}


def pair_rows(prompts, per_prompt):
    return Dataset.from_list([{"prompt": f"prompt {p}", "chosen": f"good {p}.{i}", "rejected": f"bad {p}.{i}",
                               "label_prob": 1.0} for p in range(prompts) for i in range(per_prompt)])


@pytest.mark.parametrize("by", ["prompt", "row"])
def test_partition_gives_disjoint_seeded_parts_that_cover_the_pairs(by):
    from reward.formats import pair_hashes, partition

    pairs = pair_rows(30, 3)
    parts = [partition(pairs, 3, i, by, 7, "pairs") for i in range(3)]
    hashes = [set(pair_hashes(p)) for p in parts]
    assert sum(len(h) for h in hashes) == 90 and len(set.union(*hashes)) == 90  # disjoint, covering
    assert all(20 <= len(p) <= 40 for p in parts)
    if by == "prompt":  # every pair of a prompt in one part
        assert all(not set(a["prompt"]) & set(b["prompt"]) for a in parts for b in parts if a is not b)
    assert partition(pairs, 3, 1, by, 7, "pairs")["chosen"] == parts[1]["chosen"]  # seeded
    assert partition(pairs, 3, 1, by, 8, "pairs")["chosen"] != parts[1]["chosen"]
    assert partition(pairs, 1, 0, by, 7, "pairs") is pairs


@pytest.mark.parametrize("parts, part, by, match", [
    (0, 0, "prompt", "reward.data.parts=0"), (2, 2, "prompt", r"reward.data.part=2: expected an integer in \[0, 1\]"),
    (2, 0, "word", "reward.data.part_by='word'"), (50, 49, "prompt", "part 49 of 50 .* holds no pairs"),
])
def test_partition_bad_settings(parts, part, by, match):
    from reward.formats import partition

    with pytest.raises(ValueError, match=match):
        partition(pair_rows(10, 1), parts, part, by, 0, "pairs")


def test_reward_model_trained_on_hh_reads_bare_prompts_in_the_hh_frame():
    from reward.trained import RewardScorer, prompt_template

    assert prompt_template("hh_rlhf").format(prompt="Hi?") == "Human: Hi?\n\nAssistant:"
    prompt, _, _ = split_hh_transcript("\n\nHuman: Hi?\n\nAssistant: yes", "\n\nHuman: Hi?\n\nAssistant: no")
    assert prompt == prompt_template("hh_rlhf").format(prompt="Hi?")  # the frame the proxy was trained on
    scorer = RewardScorer(torch.nn.Linear(1, 1), None, 8, template=prompt_template("preference"))
    assert scorer.as_trained(["Hi?"]) == ["Hi?"]


def test_a_soft_label_that_is_not_a_number_names_file_row_and_column():
    ds = Dataset.from_list([{"prompt": "p", "chosen": "a", "rejected": "b", "label_prob": "0.7"},
                            {"prompt": "p", "chosen": "c", "rejected": "d", "label_prob": "high"}])
    with pytest.raises(ValueError, match=r"^pairs\.jsonl, row 1, column 'label_prob': soft label 'high' is not a number"):
        to_preference_pairs(ds, "preference", "label_prob", "pairs.jsonl")


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_an_empty_pairs_file_is_one_line_not_a_traceback(tmp_path, content):
    from omegaconf import OmegaConf

    from reward.formats import load_raw

    path = tmp_path / "pairs.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"reward\.data\.path=.*pairs\.jsonl.*(is empty|has no rows).*preference pairs"):
        load_raw(OmegaConf.create({"path": str(path), "split": "train", "data_dir": None}))


def test_a_column_of_text_and_numbers_names_the_row_before_arrow_sees_it(tmp_path):
    import json
    import re

    from omegaconf import OmegaConf

    from reward.formats import load_raw

    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "q0", "chosen": "good", "rejected": "bad"}) + "\n"
                    + json.dumps({"prompt": "q1", "chosen": 5, "rejected": "bad"}) + "\n")
    raw, source = load_raw(OmegaConf.create({"path": str(path), "split": "train", "data_dir": None}))
    where = re.escape(f"reward.data.path={str(path)!r}, row 1, column 'chosen'")
    with pytest.raises(ValueError, match=rf"^{where}: expected text, got 5$"):
        to_preference_pairs(raw, "preference", "label_prob", source)
