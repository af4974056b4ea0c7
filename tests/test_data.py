"""Prompt loading and its errors: each names the setting, the file and what was expected."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
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
    ],
)
def test_bad_prompt_files_are_named(tmp_path, rows, extra, error, match):
    path = tmp_path / "missing.jsonl"
    if rows is not None:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(error, match=match):
        load_prompts(local_cfg(path, **extra))


def test_chat_template_opens_the_assistant_turn():
    text = chat_text(build_byte_tokenizer(), "hello", system_prompt="be brief")
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


# Prompts whose ids must not change (published samples reproduce): the demo prompts, and text whose
# leading or trailing whitespace the template's newline could merge with.
EDGE_PROMPTS = ["  leading spaces", "\n\nleading newlines", "trailing\n\n", "héllo wörld 日本語 🙂", "tab\there"]


def same_ids_as_plain_tokenization(tokenizer) -> None:
    prompts = [r["prompt"] for split in ("train", "test") for r in build_demo_prompts(split)] + EDGE_PROMPTS
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
