"""Training on cleanly separable toy pairs: high held-out accuracy, every parameter moves, scorer round trip."""

import random

import pytest
import torch
from datasets import Dataset
from omegaconf import OmegaConf

from reward.encoding import tokenize_preferences
from reward.backbone import build_tiny_reward_model
from reward.trained import (
    RewardScorer,
    load_scorer,
    pairwise_accuracy,
    save_reward_model,
    score_pairs,
)
from reward.trainer import train_reward_model
from rsft.trl_common import training_arguments
from rsft.models import build_byte_tokenizer

TINY = OmegaConf.create(dict(kind="tiny", name_or_path="tiny", arch="llama", seed=0, hidden_size=32,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64))
TRAIN = OmegaConf.create(dict(learning_rate=3e-3, epochs=3, batch_size=8, grad_accum=1, weight_decay=0.0,
                              warmup_steps=0, lr_scheduler="constant", max_grad_norm=1.0, seed=0, logging_steps=100,
                              progress=False, activation_checkpointing=False))
WORDS = ["sun", "moon", "tree", "river", "stone", "cloud", "bird", "field", "road", "lamp", "door", "snow"]


def toy_pairs(n: int, seed: int, soft: bool = False) -> Dataset:
    """The chosen reply says 'yes', the rejected one 'no'; prompts and fillers are random words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        filler = " ".join(rng.choices(WORDS, k=2))
        rows.append({"prompt": " ".join(rng.choices(WORDS, k=4)), "chosen": f"{filler} yes",
                     "rejected": f"{filler} no", "label_prob": rng.uniform(0.8, 1.0) if soft else 1.0})
    return Dataset.from_list(rows)


@pytest.mark.parametrize("soft", [False, True])
def test_separable_pairs_are_learned_and_every_parameter_moves(tmp_path, soft):
    tokenizer = build_byte_tokenizer()
    model = build_tiny_reward_model(TINY, tokenizer)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    train, counts = tokenize_preferences(toy_pairs(48, seed=1, soft=soft), tokenizer, max_length=64)
    assert counts["pairs_dropped"] == 0
    train_reward_model(model, tokenizer, train, TRAIN, training_arguments(TRAIN, "reward", torch.device("cpu")),
                       str(tmp_path / "trainer"))
    unchanged = [name for name, p in model.named_parameters() if p.requires_grad and torch.equal(p, before[name])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    scorer = RewardScorer(model, tokenizer, max_length=64)
    held_out = toy_pairs(32, seed=2)
    accuracy, counted = pairwise_accuracy(*score_pairs(scorer, held_out), held_out["label_prob"])
    assert counted == 32 and accuracy >= 0.9


def test_scorer_round_trip_in_input_order(tmp_path):
    tokenizer = build_byte_tokenizer()
    model = build_tiny_reward_model(TINY, tokenizer).eval()
    save_reward_model(model, tokenizer, tmp_path, {"mean": 0.5, "std": 2.0, "max_length": 64})
    scorer = load_scorer(tmp_path, "cpu")
    prompts = ["a", "a much longer prompt here", "mid prompt"]
    completions = ["x", "y", "a long long long long completion"]
    batched = scorer.score(prompts, completions, batch_size=2, progress=False)
    one_by_one = [scorer.score([p], [c], progress=False)[0] for p, c in zip(prompts, completions)]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    original = RewardScorer(model, tokenizer, 64).score(prompts, completions, progress=False)
    assert batched == pytest.approx(original, abs=1e-5)
    assert scorer.normalise([0.5, 2.5]) == [0.0, 1.0]
