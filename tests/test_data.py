"""Prompt loading and its errors: each names the setting, the file and what was expected."""

from __future__ import annotations

import json
import logging
import re

import pytest
from datasets import Dataset, DatasetDict
from omegaconf import OmegaConf

from rsft.data import chat_text, load_prompts, prompt_token_ids
from rsft.demo_prompts import build_demo_prompts
from rsft.errors import InputError, MissingInput
from rsft.models import build_byte_tokenizer


def local_cfg(path, **extra):
    base = {"kind": "local", "path": str(path), "split": "train", "eval_path": None, "eval_split": "test",
            "prompt_column": "prompt", "id_column": None, "limit": None, "eval_limit": None, "system_prompt": None}
    return OmegaConf.create({**base, **extra})


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_demo_prompts_have_ids_prompts_and_tasks():
    cfg = OmegaConf.create({"kind": "demo", "split": "train", "eval_split": "test", "prompt_column": "prompt",
                            "id_column": "prompt_id", "limit": 5, "eval_limit": None, "system_prompt": None})
    train, test = load_prompts(cfg, "train"), load_prompts(cfg, "eval")
    assert len(train) == 5 and {"prompt_id", "prompt", "task"} <= set(train.column_names)
    assert not set(train["prompt_id"]) & set(test["prompt_id"])


def test_local_jsonl_with_a_custom_column(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"instruction": "a"}, {"instruction": "b"}])
    ds = load_prompts(local_cfg(path, prompt_column="instruction"))
    assert ds["prompt"] == ["a", "b"] and ds["prompt_id"] == ["p000000", "p000001"]


def test_local_parquet_and_datasets_folder(tmp_path):
    Dataset.from_list([{"prompt": "x", "id": 7}]).to_parquet(str(tmp_path / "p.parquet"))
    assert load_prompts(local_cfg(tmp_path / "p.parquet", id_column="id"))["prompt_id"] == ["7"]
    Dataset.from_list([{"prompt": "y"}]).save_to_disk(str(tmp_path / "folder"))
    assert load_prompts(local_cfg(tmp_path / "folder"))["prompt"] == ["y"]


@pytest.mark.parametrize(
    "rows,extra,error,match",
    [
        (None, {}, MissingInput, r"data.path=.*missing.jsonl.*no such file"),
        ([], {}, InputError, r"data.path=.*is empty"),
        ([{"text": "a"}], {}, InputError, r"data.prompt_column='prompt' is not a column.*\['text'\]"),
        ([{"prompt": "a"}, {"prompt": 3}], {}, InputError, r"row 1, column 'prompt': expected a non-empty string"),
        ([{"prompt": "a"}, {"prompt": "  "}], {}, InputError, r"row 1"),
        # the built-in sets' id column named on a file without it is refused, as any other missing column is
        ([{"prompt": "a"}], {"id_column": "prompt_id"}, InputError,
         r"data.id_column='prompt_id' is not a column of data.path=.*\['prompt'\].*data.id_column=null"),
        ([{"prompt": "a"}], {"id_column": "uid"}, InputError, r"data.id_column='uid' is not a column"),
    ],
)
def test_bad_prompt_files_are_named(tmp_path, rows, extra, error, match):
    path = tmp_path / "missing.jsonl"
    if rows is not None:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(error, match=match):
        load_prompts(local_cfg(path, **extra))


@pytest.mark.parametrize("id_column", ["id", "prompt_id"])
def test_prompt_ids_are_strings_and_an_integer_id_its_decimal_string(tmp_path, id_column):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", id_column: 10}, {"prompt": "b", id_column: 200}])
    ds = load_prompts(local_cfg(path, id_column=id_column))
    assert ds["prompt_id"][:] == ["10", "200"] and ds.features["prompt_id"].dtype == "string"


@pytest.mark.parametrize("second, problem", [
    ({}, "no id"),  # the key left out of the row
    ({"id": None}, "no id"),
    ({"id": 1.5}, "got 1.5"),
    ({"id": True}, "got True"),
    ({"id": [1]}, r"got \[1\]"),
    ({"id": {"n": 1}}, r"got \{'n': 1\}"),
])
@pytest.mark.parametrize("id_column", ["id", "prompt_id"])
def test_a_prompt_id_that_is_not_a_string_or_integer_names_file_row_and_column(tmp_path, second, problem, id_column):
    rows = [{"prompt": "a", "id": "x"}, {"prompt": "b", **second}, {"prompt": "c", "id": "z"}]
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": r["prompt"]} | ({id_column: r["id"]} if "id" in r else {})
                                              for r in rows])
    where = re.escape(f"data.path={str(path)!r}, row 1, column {id_column!r} (data.id_column)")
    with pytest.raises(InputError, match=rf"^{where}: {problem}; expected a string or an integer prompt id$"):
        load_prompts(local_cfg(path, id_column=id_column))


def test_a_carried_column_of_text_and_numbers_is_read_as_text_and_other_mixes_are_refused(tmp_path):
    """A reference answer column with "1,000" beside 3.5 (free-form JSON to `datasets`) reaches the samples as text,
    as written; a list beside a number is refused naming the column and row, before any sampling."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": p, "reference": v} for p, v in
                                              zip("abcd", ["1,000", 3.5, 5, None])])
    ds = load_prompts(local_cfg(path))
    assert ds["reference"][:] == ["1,000", "3.5", "5", None] and ds.features["reference"].dtype == "string"
    for i, values in enumerate(([1, [1, 2]], [{"answer": 4}, {"answer": "four"}], [[1, 2], ["x"]])):
        path = write_jsonl(tmp_path / f"q{i}.jsonl", [{"prompt": p, "task": v} for p, v in zip("ab", values)])
        with pytest.raises(InputError, match=r"column 'task': values of several types or shapes .*; expected one "
                                             r"type a column"):
            load_prompts(local_cfg(path))


def test_two_rows_without_an_id_are_missing_ids_not_duplicates(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "id": "x"}, {"prompt": "b"}, {"prompt": "c"}])
    with pytest.raises(InputError, match=r"row 1, column 'id' \(data\.id_column\): no id"):
        load_prompts(local_cfg(path, id_column="id"))


def test_a_csv_id_column_with_a_gap_names_the_gap_not_the_floats_it_became(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt,id\na,1\nb,\nc,3\n")  # pandas reads 1.0, NaN, 3.0
    with pytest.raises(InputError, match=r"row 1, column 'id' \(data\.id_column\): no id"):
        load_prompts(local_cfg(path, id_column="id"))
    path.write_text("prompt,id\na,1\nb,2\n")
    assert load_prompts(local_cfg(path, id_column="id"))["prompt_id"][:] == ["1", "2"]


def test_chat_template_opens_the_assistant_turn():
    text = chat_text(build_byte_tokenizer(), "hello", system_prompt="be brief")
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


# Prompts whose ids must not change (published samples reproduce): the demo prompts, and text whose
# leading or trailing whitespace the template's newline could merge with.
EDGE_PROMPTS = ["  leading spaces", "\n\nleading newlines", "trailing\n\n", "héllo wörld 日本語 🙂", "tab\there"]


def same_ids_as_plain_tokenization(tokenizer) -> None:
    prompts = [r["prompt"] for split in ("train", "validation", "test") for r in build_demo_prompts(split)] + EDGE_PROMPTS
    for system_prompt in (None, "be brief", " you are\n helpful "):
        for prompt in prompts:
            old = tokenizer(chat_text(tokenizer, prompt, system_prompt), add_special_tokens=False)["input_ids"]
            assert prompt_token_ids(tokenizer, prompt, system_prompt) == (old, 0), (prompt, system_prompt)


def test_prompt_ids_are_unchanged_for_ordinary_prompts():
    same_ids_as_plain_tokenization(build_byte_tokenizer())


@pytest.mark.slow
def test_prompt_ids_are_unchanged_with_the_default_policy_tokenizer(make_cfg):
    from transformers import AutoTokenizer

    from rsft.models import model_source

    cfg = make_cfg("stage=sample", tiny=False)
    same_ids_as_plain_tokenization(AutoTokenizer.from_pretrained(model_source(cfg.policy, cfg.paths.cache_dir)))


def hh_cfg(path, **extra):
    from rsft.config import DataHhRlhfConfig

    return OmegaConf.merge(OmegaConf.structured(DataHhRlhfConfig), {"path": str(path), "limit": None, "eval_limit": None, **extra})


def hh_rows(n):
    rows = []
    for i in range(n):
        prompt = f"\n\nHuman: question {i % (n // 2)}?\n\nAssistant: answer\n\nHuman: and more {i}\n\nAssistant:"
        rows.append({"chosen": prompt + " yes", "rejected": prompt + " no"})
    rows.append({"chosen": "no human turn here", "rejected": "x"})
    return rows


def test_hh_rlhf_prompts_are_first_human_turns_split_by_a_seeded_hash(tmp_path):
    from rsft.data import first_human_turn

    assert first_human_turn("\n\nHuman: Hi there \n\nAssistant: Hello\n\nHuman: more") == "Hi there"
    assert first_human_turn("Assistant: Hi") is None and first_human_turn("\n\nHuman: no reply") is None
    path = write_jsonl(tmp_path / "hh.jsonl", hh_rows(80))
    train, held = load_prompts(hh_cfg(path), "train"), load_prompts(hh_cfg(path), "eval")
    assert len(train) + len(held) == 40  # one prompt per distinct first turn; the malformed row is skipped
    assert not set(train["prompt"]) & set(held["prompt"]) and len(held) > 0
    assert all(p.startswith("question ") for p in train["prompt"])
    reversed_path = write_jsonl(tmp_path / "hh_reversed.jsonl", hh_rows(80)[::-1])
    again = load_prompts(hh_cfg(reversed_path), "eval")
    assert sorted(again["prompt_id"]) == sorted(held["prompt_id"])  # the split ignores the file's order
    other_seed = load_prompts(hh_cfg(path, split_seed=1), "eval")
    assert set(other_seed["prompt"]) != set(held["prompt"])
    assert len(load_prompts(hh_cfg(path, limit=5), "train")) == 5


@pytest.mark.parametrize("extra, error, match", [
    ({"eval_fraction": 1.0}, ValueError, r"data.eval_fraction=1.0"),
    ({"path": "/nowhere/hh.jsonl"}, FileNotFoundError, r"data.path='/nowhere/hh.jsonl'"),
])
def test_hh_rlhf_bad_settings_are_named(tmp_path, extra, error, match):
    path = write_jsonl(tmp_path / "hh.jsonl", hh_rows(10))
    with pytest.raises(error, match=match):
        load_prompts(hh_cfg(extra.pop("path", path), **extra), "train")


def test_hh_rlhf_prompts_need_transcripts(tmp_path):
    path = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "hi"}])
    with pytest.raises(InputError, match="missing column 'chosen'"):
        load_prompts(hh_cfg(path), "train")


# ---- held-out prompts that are train prompts: measured before any work, refused when all are ----

def demo_cfg(kind="demo", **extra):
    return OmegaConf.create({"kind": kind, "split": "train", "eval_split": "test", "prompt_column": "prompt",
                             "id_column": None, "limit": None, "eval_limit": None, "seed": 0, **extra})


@pytest.mark.parametrize("kind", ["demo", "checkable"])
def test_the_built_in_prompt_sets_hold_out_prompts_no_train_prompt_matches(kind):
    from rsft.data import held_out_overlap

    overlap = held_out_overlap(demo_cfg(kind))
    assert overlap["held_out"] == 64 and overlap["train"] > 0
    assert overlap["exact"] == overlap["normalised"] == 0, overlap["examples"]


def test_the_normalised_comparison_ignores_case_whitespace_and_punctuation_only():
    from rsft.data import comparable_text

    assert comparable_text("  What is 2+2?  ") == comparable_text("what is\t2+2") == "what is 2+2"
    assert comparable_text("Ｈｅｌｌｏ, World!") == comparable_text("hello world")  # NFKC: full-width letters
    assert comparable_text("3-4") != comparable_text("34") and comparable_text("2+2") != comparable_text("2-2")


def test_held_out_prompts_that_are_all_train_prompts_are_refused_naming_both_settings(tmp_path, caplog):
    from rsft.data import check_held_out_prompts
    from rsft.errors import ConfigError

    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"Tell me about topic {i}."} for i in range(6)])
    # the same file: the reported case
    with pytest.raises(ConfigError, match=rf"^data\.eval_path={train}: every one of "
                                          rf"its 6 held-out prompts is a train prompt of data\.path={train} \(6 with "
                                          rf"the same text, 0 more.*data\.eval_path at prompts.*\(loop\.eval=false\)$"):
        check_held_out_prompts(local_cfg(train, eval_path=str(train)), "loop.eval=false")
    # another file, the same prompts but for case, spacing and punctuation
    copied = write_jsonl(tmp_path / "copy.jsonl", [{"prompt": "tell me about  TOPIC 1"}, {"prompt": "Tell me about topic 2."}])
    with pytest.raises(ConfigError, match=r"every one of its 2 held-out prompts .*\(1 with the same text, 1 more "
                                          r"after ignoring case, whitespace and punctuation\)"):
        check_held_out_prompts(local_cfg(train, eval_path=str(copied)))
    # some: a warning with the counts and a few ids; the run goes on
    partly = write_jsonl(tmp_path / "partly.jsonl", [{"prompt": "Tell me about topic 3."}, {"prompt": "TELL me about topic 4"},
                                                     {"prompt": "Name a river."}, {"prompt": "Name a tree."}])
    with caplog.at_level(logging.WARNING, logger="rsft.data"):
        overlap = check_held_out_prompts(local_cfg(train, eval_path=str(partly)))
    assert (overlap["held_out"], overlap["exact"], overlap["normalised"]) == (4, 1, 2)
    assert re.search(r"data\.eval_path=.*partly\.jsonl: 2 of its 4 held-out prompts are also train prompts of "
                     r"data\.path=.*\(1 with the same text, 1 more .*\['p000000', 'p000001'\]", caplog.text)
    caplog.clear()
    disjoint = write_jsonl(tmp_path / "held.jsonl", [{"prompt": "Name a river."}])
    with caplog.at_level(logging.WARNING, logger="rsft.data"):
        assert check_held_out_prompts(local_cfg(train, eval_path=str(disjoint)))["normalised"] == 0
    assert not caplog.records
    # the held-out prompts as evaluation reads them (data.eval_limit): the first of partly.jsonl is a train prompt
    with pytest.raises(ConfigError, match=r"every one of its 1 held-out prompts"):
        check_held_out_prompts(local_cfg(train, eval_path=str(partly), eval_limit=1))
    # a DatasetDict folder read at two splits (docs/own-data.md: data.path=my_prompts data.eval_path=my_prompts)
    folder = tmp_path / "both"
    DatasetDict({"train": Dataset.from_list([{"prompt": "a cat"}]), "test": Dataset.from_list([{"prompt": "a dog"}])}) \
        .save_to_disk(str(folder))
    assert check_held_out_prompts(local_cfg(folder, eval_path=str(folder)))["normalised"] == 0
    with pytest.raises(ConfigError, match=r"^data\.eval_path=.*both \(data\.eval_split=train\): every one .*of data\.path=.*both "
                                          r"\(data\.split=train\).*another split of the folder"):
        check_held_out_prompts(local_cfg(folder, eval_path=str(folder), eval_split="train"))


@pytest.mark.parametrize("kind", ["demo", "checkable"])
def test_a_built_in_set_evaluated_on_its_train_split_is_refused(kind):
    from rsft.data import check_held_out_prompts
    from rsft.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^data\.eval_split=train: every one of its \d+ held-out prompts is a train "
                                          rf"prompt of data\.split=train of the {kind} prompts .*data\.eval_split=test"):
        check_held_out_prompts(demo_cfg(kind, eval_split="train"))


def test_a_command_that_evaluates_on_its_train_prompts_stops_before_any_work(make_cfg, tmp_path):
    """The pre-flight (rsft.preflight) runs the check for stage=eval, stage=loop with loop.eval and stage=online
    with eval snapshots, before prefs, the reward model or anything else; a command that does not evaluate
    is not stopped by it."""
    from rsft.preflight import check_config
    from rsft.errors import ConfigError

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi."}, {"prompt": "Say bye."}])
    same = ["data=local", f"data.path={prompts}", f"data.eval_path={prompts}"]
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Say hi.", "chosen": "hi", "rejected": "no"}])
    for stage in (["stage=eval"], ["stage=loop", f"reward.data.path={pairs}", "loop.refresh_reward=false"],
                  ["stage=online", "online.eval_every=1"]):
        with pytest.raises(ConfigError, match=r"^data\.eval_path=.*every one of its 2 held-out prompts"):
            check_config(make_cfg(*stage, *same))
    check_config(make_cfg("stage=sample", *same))  # does not evaluate
    check_config(make_cfg("stage=loop", f"reward.data.path={pairs}", "loop.refresh_reward=false", "loop.eval=false",
                          *same))
    with pytest.raises(ConfigError, match=r"data\.eval_split=train"):
        check_config(make_cfg("stage=eval", "data.eval_split=train"))
    check_config(make_cfg("stage=eval"))  # the default job's data: disjoint splits
