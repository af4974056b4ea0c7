"""KVBatch's packed forward gives every row the logits a plain full forward of that row gives.

Rows join with shared and distinct prefixes (some copied from a sibling already in the batch),
append ragged numbers of tokens per step, keep only some of them (rejected drafts), and leave.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rsft.sampling.kv_batch import ATTENTION_NAME, KVBatch


def tiny(vocab: int = 13) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def reference(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0]  # [len, vocab]


@pytest.fixture(params=["enable_gqa", "grouped queries"])
def attention_path(request, monkeypatch):
    """Both ways packed_attention serves grouped-query attention: SDPA's enable_gqa (a CPU) and the queries of a
    key-value head grouped as more queries of it (an accelerator; forced here on the CPU)."""
    import rsft.sampling.kv_batch as kv_batch

    monkeypatch.setattr(kv_batch, "GROUPED_ON_CPU", request.param == "grouped queries")
    return request.param


@torch.no_grad()
def test_packed_logits_match_full_forwards_through_joins_rejections_and_leaves(attention_path):
    model, rng = tiny(), random.Random(0)
    batch = KVBatch(model)
    histories: list[list[int]] = []  # per caller row: the tokens its cache holds (committed)
    prompts = [[1, 2, 3, 4], [5, 6], [1, 2, 3, 4], [7], [8, 9, 10, 11, 12, 1, 2]]
    checked = 0
    lasts: list[int] = []
    for step in range(30):
        if step % 6 == 0 and prompts:  # join: a prompt's prefix (all but its last token) for 1-3 rows
            prompt = prompts.pop(0)
            copies = rng.randint(1, 3)
            batch.admit([prompt[:-1]], [copies])
            histories += [prompt[:-1] for _ in range(copies)]
            pending_last = [prompt[-1]] * copies
            lasts = lasts + pending_last
        rows = len(histories)
        n = rng.randint(1, 4)
        ids = torch.tensor([[lasts[r]] + [rng.randrange(13) for _ in range(n - 1)] for r in range(rows)])
        width = torch.tensor([rng.randint(1, n) for _ in range(rows)])  # real tokens per row, 1..n
        valid = torch.arange(n)[None, :] < width[:, None]
        logits = batch.forward(ids, valid)
        for r in range(rows):
            fed = ids[r, :int(width[r])].tolist()
            expected = reference(model, histories[r] + fed)[-len(fed):]
            torch.testing.assert_close(logits[r, :len(fed)], expected, atol=1e-4, rtol=1e-4)
            assert torch.all(logits[r, len(fed):] == 0)
            checked += 1
        keep = torch.tensor([rng.randint(1, int(w)) for w in width])  # accepted drafts + the first token
        batch.commit(keep)
        for r in range(rows):
            histories[r] = histories[r] + ids[r, :int(keep[r])].tolist()
        lasts = [rng.randrange(13) for _ in range(rows)]
        if step % 4 == 3 and rows > 1:  # a row leaves, the others keep their order
            gone = rng.randrange(rows)
            index = torch.tensor([r for r in range(rows) if r != gone])
            batch.keep_rows(index)
            histories = [h for r, h in enumerate(histories) if r != gone]
            lasts = [t for r, t in enumerate(lasts) if r != gone]
    assert checked > 50
    assert model.config._attn_implementation != ATTENTION_NAME  # restored after every forward


@torch.no_grad()
def test_last_token_logits_for_right_aligned_rows():
    model = tiny()
    batch = KVBatch(model)
    batch.admit([[1, 2], [3]], [1, 2])
    ids = torch.tensor([[0, 4, 5], [6, 7, 8], [0, 0, 9]])
    valid = ids > 0
    last = batch.forward(ids, valid, logits_to_keep=1)[:, -1]
    for r, history in enumerate([[1, 2, 4, 5], [3, 6, 7, 8], [3, 9]]):
        torch.testing.assert_close(last[r], reference(model, history)[-1], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_rows_without_tokens_get_zero_logits_and_keep_their_cache():
    model = tiny()
    batch = KVBatch(model)
    batch.admit([[1, 2], [3]], [1, 1])
    nothing = batch.forward(torch.tensor([[4], [5]]), torch.zeros(2, 1, dtype=torch.bool))
    assert nothing.shape == (2, 1, 13) and torch.all(nothing == 0)
    last = batch.forward(torch.tensor([[0, 0], [6, 7]]), torch.tensor([[False, False], [True, True]]),
                         logits_to_keep=1)[:, -1]
    assert torch.all(last[0] == 0)
    torch.testing.assert_close(last[1], reference(model, [3, 6, 7])[-1], atol=1e-4, rtol=1e-4)
    batch.commit(torch.tensor([0, 2]))
    after = batch.forward(torch.tensor([[8], [9]]))[:, -1]
    torch.testing.assert_close(after[0], reference(model, [1, 2, 8])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(after[1], reference(model, [3, 6, 7, 9])[-1], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_plain_step_with_the_onednn_head_matches_full_forwards_and_restores_the_head():
    model = tiny()
    head = model.lm_head
    fast, mkl = KVBatch(model), KVBatch(model, fast_head=False)
    assert fast.head is not None and mkl.head is None  # float32 on a CPU: the head runs through oneDNN
    for batch in (fast, mkl):
        batch.admit([[1, 2, 3], [4]], [2, 1])
    ids = torch.tensor([[5, 6], [7, 8], [9, 10]])
    logits = fast.forward(ids)  # every slot a real token: the packed logits are returned as they are
    for r, history in enumerate([[1, 2, 3, 5, 6], [1, 2, 3, 7, 8], [4, 9, 10]]):
        torch.testing.assert_close(logits[r], reference(model, history)[-2:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, mkl.forward(ids), atol=1e-5, rtol=1e-5)
    assert model.lm_head is head  # swapped in only for the batch's own forward
    with pytest.raises(IndexError):
        fast.forward(torch.full((3, 1), 99))  # a token outside the vocabulary fails inside the model
    assert model.lm_head is head and model.config._attn_implementation != ATTENTION_NAME
    assert KVBatch(tiny().to(torch.bfloat16)).head is None  # only float32 on a CPU
    with torch.backends.mkldnn.flags(enabled=False):  # the user turned oneDNN off: MKL as before
        assert KVBatch(model).head is None


def test_no_onednn_head_through_a_wrapper():
    from peft import LoraConfig, get_peft_model

    from rsft.sampling.kv_batch import onednn_head

    wrapped = get_peft_model(tiny(), LoraConfig(r=2, target_modules=["q_proj"]))
    before = set(dict(wrapped.named_modules()))
    assert onednn_head(wrapped) is None  # its lm_head lives in the wrapped model, not on the wrapper
    assert onednn_head(wrapped.get_base_model()) is not None
    assert set(dict(wrapped.named_modules())) == before


@torch.no_grad()
def test_every_row_at_a_fixed_shape_gives_the_running_rows_logits(attention_path):
    """forward_every_row (the CUDA graph's step): every buffer row, free ones too, one token each over the whole
    capacity; the rows that hold a sequence get the logits of a full forward of it."""
    model = tiny()
    batch = KVBatch(model)
    batch.reserve(4, 20)
    batch.admit([[1, 2, 3], [5]], [2, 1])  # 3 rows of 4: buffer row 3 is free
    histories = [[1, 2, 3], [1, 2, 3], [5]]
    for step in range(4):
        fed = [(7 + step + r) % 13 for r in range(3)]
        tokens = torch.zeros(4, dtype=torch.long)
        tokens[batch.slot] = torch.tensor(fed)
        logits = batch.forward_every_row(tokens[:, None], batch.length.clamp(max=batch.capacity - 1))[:, 0]  # [4, vocab]
        batch.length[batch.slot] += 1
        batch.commit(torch.ones(3, dtype=torch.long))
        for r in range(3):
            histories[r] = histories[r] + [fed[r]]
            torch.testing.assert_close(logits[batch.slot_list[r]], reference(model, histories[r])[-1],
                                       atol=1e-5, rtol=1e-5)
    assert batch.length.tolist()[:3] == [len(h) for h in histories]
