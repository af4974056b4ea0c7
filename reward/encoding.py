"""(prompt, completion) -> model input: the one function training and scoring share.

Layout, token level:
- tokenizers with [CLS]/[SEP] (BERT-style, no EOS):  [CLS] prompt [SEP] completion [SEP]
- others (causal LMs):                               prompt "\n\n" completion <eos>
The reward head reads the last real token for causal LMs and [CLS] for encoders
(reward.backbone.reward_forward). No chat template: the reward model sees the raw prompt text, which is
what the score stage passes in.

Truncation, where TRL's RewardTrainer instead drops every pair longer than max_length: the prompt is
cut from the LEFT (its end, next to the completion, is kept); only when the completion alone does
not fit is the completion cut from the right. Both are counted per pair so the caller can log them.
"""

from __future__ import annotations

import torch
from datasets import Dataset

from reward.refusals import ConfigError

SEPARATOR = "\n\n"  # between prompt and completion for tokenizers without a [SEP] token


def pair_frame(tokenizer) -> tuple[list[int], list[int], list[int]]:
    """(head, middle, tail) special ids around prompt and completion."""
    if tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None:
        return [tokenizer.cls_token_id], [tokenizer.sep_token_id], [tokenizer.sep_token_id]
    middle = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    tail = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return [], middle, tail


def encode_pair(tokenizer, prompt: str, completion: str, max_length: int) -> tuple[list[int], int, int]:
    """(input_ids, prompt tokens cut from the left, completion tokens cut from the right)."""
    head, middle, tail = pair_frame(tokenizer)
    room = max_length - len(head) - len(middle) - len(tail)
    if room < 1:
        raise ConfigError(f"reward.max_length={max_length} leaves no room for text after {len(head + middle + tail)} "
                          f"special tokens; raise reward.max_length")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    kept_completion = completion_ids[:room]
    prompt_room = room - len(kept_completion)
    kept_prompt = prompt_ids[max(0, len(prompt_ids) - prompt_room):] if prompt_room > 0 else []
    ids = head + kept_prompt + middle + kept_completion + tail
    return ids, len(prompt_ids) - len(kept_prompt), len(completion_ids) - len(kept_completion)


def tokenize_preferences(pairs: Dataset, tokenizer, max_length: int) -> tuple[Dataset, dict[str, int]]:
    """Add chosen_ids / rejected_ids (TRL's processed format) to prompt/chosen/rejected/label_prob rows.

    Returns the tokenised dataset (only the columns the trainer needs) and truncation counts.
    """
    def encode(row):
        chosen, c_prompt_cut, c_cut = encode_pair(tokenizer, row["prompt"], row["chosen"], max_length)
        rejected, r_prompt_cut, r_cut = encode_pair(tokenizer, row["prompt"], row["rejected"], max_length)
        return {"chosen_ids": chosen, "rejected_ids": rejected,
                "prompt_tokens_cut": max(c_prompt_cut, r_prompt_cut),
                "completions_cut": int(c_cut > 0) + int(r_cut > 0)}

    encoded = pairs.map(encode, remove_columns=[c for c in pairs.column_names if c != "label_prob"],
                        desc="tokenizing pairs")
    prompt_cut = encoded["prompt_tokens_cut"]
    completions_cut = encoded["completions_cut"]
    counts = {
        "pairs": len(encoded),
        "pairs_prompt_truncated": sum(n > 0 for n in prompt_cut),
        "prompt_tokens_cut": sum(prompt_cut),
        "completions_truncated": sum(completions_cut),
        "pairs_dropped": 0,
    }
    return encoded.remove_columns(["prompt_tokens_cut", "completions_cut"]), counts


def pad_right(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [batch, longest], attention_mask [batch, longest]) padded on the right."""
    longest = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)  # [batch, longest]
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)  # [batch, longest]
    for row, seq in enumerate(sequences):
        input_ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, :len(seq)] = 1
    return input_ids, attention_mask
