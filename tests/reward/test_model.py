"""The reward is read at the last real token (causal) or [CLS] (encoder), whatever the padding."""

import pytest
import torch
from omegaconf import OmegaConf

from reward.encoding import encode_pair, pad_right, pair_frame
from reward.backbone import build_tiny_reward_model, reward_forward
from rsft.models import build_byte_tokenizer

TINY = dict(kind="tiny", name_or_path="tiny", seed=0, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64)
TEXTS = [("Write a haiku about the sea.", "Waves fold into foam."), ("Hi", "Hello there, friend!"),
         ("A much longer prompt that goes on and on for a while", "ok")]


def pad_left(sequences, pad_id):
    longest = max(len(s) for s in sequences)
    ids = torch.tensor([[pad_id] * (longest - len(s)) + s for s in sequences])
    mask = torch.tensor([[0] * (longest - len(s)) + [1] * len(s) for s in sequences])
    return ids, mask


@pytest.mark.parametrize("arch, pooling", [("llama", "last"), ("bert", "first"), ("bert", "mean")])
@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_padding_side_does_not_change_the_reward(arch, pooling, pad_is_eos):
    tokenizer = build_byte_tokenizer()
    if pad_is_eos:
        tokenizer.pad_token = tokenizer.eos_token
    model = build_tiny_reward_model(OmegaConf.create({**TINY, "arch": arch}), tokenizer).eval()
    model.config.reward_pooling = pooling
    sequences = [encode_pair(tokenizer, p, c, 64)[0] for p, c in TEXTS]
    with torch.no_grad():
        alone = torch.cat([reward_forward(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))
                           for s in sequences])
        right = reward_forward(model, *pad_right(sequences, tokenizer.pad_token_id))
        left = reward_forward(model, *pad_left(sequences, tokenizer.pad_token_id))
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=1e-4)


def test_last_token_is_the_eos_even_when_pad_is_eos():
    """The reward depends on the final EOS position: changing the token before it changes the reward."""
    tokenizer = build_byte_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    model = build_tiny_reward_model(OmegaConf.create({**TINY, "arch": "llama"}), tokenizer).eval()
    ids, _, _ = encode_pair(tokenizer, "prompt", "reply", 64)
    assert ids[-1] == tokenizer.eos_token_id
    with torch.no_grad():
        hidden = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        expected = model.score(hidden)
        got = reward_forward(model, *pad_right([ids, ids[:5]], tokenizer.pad_token_id))[0]
    torch.testing.assert_close(got, expected.squeeze(), atol=1e-5, rtol=1e-4)


def test_bert_style_tokenizer_without_eos():
    from transformers import BertTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "good"])}
    tokenizer = BertTokenizerFast(vocab=vocab)
    assert tokenizer.eos_token_id is None
    head, middle, tail = pair_frame(tokenizer)
    assert head == [tokenizer.cls_token_id] and middle == tail == [tokenizer.sep_token_id]
    ids, _, _ = encode_pair(tokenizer, "hello world", "good", 16)
    assert ids == [2, 5, 6, 3, 7, 3]


def test_a_pretrained_backbone_gets_the_same_fresh_head_for_the_same_seed(tmp_path):
    from reward.backbone import load_reward_backbone

    tokenizer = build_byte_tokenizer()
    # a bare encoder on disk: the classification head is new at every load
    build_tiny_reward_model(OmegaConf.create({**TINY, "arch": "bert"}), tokenizer).bert.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    cfg = OmegaConf.create({"kind": "hf", "name_or_path": str(tmp_path / "bert")})
    heads = []
    for seed, noise in ((0, 1), (0, 2), (1, 1)):
        torch.manual_seed(noise)  # whatever ran before in the process must not matter
        model, _ = load_reward_backbone(cfg, str(tmp_path / "bert"), seed=seed)
        heads.append(model.classifier.weight.detach().clone())
    assert torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], heads[2])
