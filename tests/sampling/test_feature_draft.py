"""The feature draft reads the policy's own features, aligned: entry t = (feature of t - 1, token t).

Its exactness end to end is in test_sampler.py (chi-square against enumeration, batch_rows
invariance); here: the policy's KVBatch keeps the features a full forward computes, and every
proposal equals what the draft network gives on the policy's true features of the whole context.
"""

from __future__ import annotations

import pytest
import torch

from rsft.sampling.proposers import FeatureDraft
from rsft.sampling.feature_model import FeatureDraftModel, feature_draft_config
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.processing import probs_from_logits
from rsft.sampling.batched import Sampler, SamplingSettings
from tests.sampling.test_sampler import PROMPTS, feature_draft, tiny_lm


@torch.no_grad()
def full_features(model, ids: list[int]) -> torch.Tensor:
    """The policy's last-layer features (final norm output) of a plain full forward -> [len, hidden]."""
    return model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


@torch.no_grad()
def test_the_policys_batch_keeps_the_features_and_tokens_of_a_full_forward():
    model = tiny_lm(11, seed=0)
    batch = KVBatch(model, keep_features=True)
    batch.admit([[1, 2, 3], [4, 5]], [2, 1])  # rows 0, 1 share a prefix; row 2 another
    batch.forward(torch.tensor([[6, 7], [8, 9], [10, 1]]), torch.tensor([[True, True], [True, False], [True, True]]))
    batch.commit(torch.tensor([2, 1, 1]))  # row 2's second token is rejected
    batch.forward(torch.tensor([[3], [3], [3]]))
    histories = [[1, 2, 3, 6, 7, 3], [1, 2, 3, 8, 3], [4, 5, 10, 3]]
    for row, ids in enumerate(histories):
        b = int(batch.slot[row])
        assert batch.tokens[b, :len(ids)].tolist() == ids
        torch.testing.assert_close(batch.features[b, :len(ids)], full_features(model, ids), atol=1e-5, rtol=1e-5)


class RecordingDraft(FeatureDraft):
    """Records, at each proposal, every row's context and the draft's q for its first draft token."""

    def __init__(self, model):
        super().__init__(model)
        self.records = []

    def admit(self, prefixes, copies, rows, target):
        super().admit(prefixes, copies, rows, target)
        self.policy_batch = target

    def propose(self, last, gammas, uniforms, sampling, rows):
        tokens, probs, num = super().propose(last, gammas, uniforms, sampling, rows)
        batch = self.policy_batch
        for i, buffer_row in enumerate(batch.slot_list):  # the context: what the policy's cache holds, then last
            context = batch.tokens[buffer_row, :int(batch.length[buffer_row])].tolist() + [int(last[i])]
            self.records.append((context, probs[i, 0].clone()))
        return tokens, probs, num


@torch.no_grad()
@pytest.mark.parametrize("adaptive", [False, True])
def test_each_proposal_equals_the_draft_network_on_the_policys_true_features(adaptive):
    """Through joins, leaves, rejections, full acceptances and (adaptive) plain steps and catch-ups,
    the cached feature draft proposes what the uncached network gives on the context's entries
    (h_{t-1}, x_t), h from a full policy forward."""
    target = tiny_lm(9, seed=0)
    draft = RecordingDraft(feature_draft(target, head_token_ids=[0, 1, 3, 4, 6, 8]).model)
    settings = SamplingSettings(max_new_tokens=14, temperature=1.0, batch_rows=3, gamma=3, adaptive=adaptive)
    sampler = Sampler(target, settings, eos_token_ids=[2], draft=draft)
    if adaptive:  # plain steps between drafting ones: the draft must catch up on what it missed
        script = iter([0, 0, 3, 1, 0, 0, 0, 2] * 40)
        sampler.controller.choose = lambda: next(script)
    sampler.generate([*PROMPTS, [5, 6, 7, 8]], num_samples=3, seed=3, progress=False)
    assert len(draft.records) > 10
    head = torch.tensor(draft.model.head_token_ids)
    for context, q in draft.records:
        features = full_features(target, context[:-1])  # [len - 1, hidden]: the last token is not in the cache yet
        shifted = torch.cat([torch.zeros_like(features[:1]), features])  # entry t: the feature of t - 1
        logits = draft.model(torch.tensor([context]), shifted[None]).logits[0, -1]  # [head]
        expected = torch.zeros(9).index_copy_(0, head, probs_from_logits(logits[None], 1.0, 0, 1.0)[0])
        torch.testing.assert_close(q, expected, atol=1e-5, rtol=1e-5)


def test_a_feature_draft_must_have_the_policys_hidden_size():
    target = tiny_lm(9, seed=0)
    config = feature_draft_config(target.config, 1)
    config.hidden_size = 32
    with pytest.raises(ValueError, match="hidden_size=32"):
        FeatureDraftModel(config, target.get_input_embeddings().weight, target.get_output_embeddings().weight)


@torch.no_grad()
def test_unrolled_training_positions_equal_the_drafting_network():
    """FeatureDraftModel.unrolled (training-time drafting): position k + 1's feature at i equals the
    network run on the cache the sampler holds then: true entries 0..i-k, then the drafted entries
    built from its own earlier predictions."""
    target = tiny_lm(9, seed=0)
    model = feature_draft(target, head_token_ids=[0, 1, 3, 4, 6, 8]).model
    ids = torch.tensor([[5, 6, 7, 8, 1, 3, 4, 0, 6, 1]])  # [1, T]
    true = full_features(target, ids[0].tolist())[None]  # [1, T, hidden]
    features = torch.cat([torch.zeros_like(true[:, :1]), true[:, :-1]], 1)  # entry t: the feature of t - 1
    steps = model.unrolled(ids, features, 3)  # 3 x [1, T, hidden]
    torch.testing.assert_close(steps[0], model(ids, features).features)
    for i in range(2, ids.shape[1]):
        for k in (1, 2):
            drafted = [steps[kk - 1][:, i - k + kk - 1:i - k + kk] for kk in range(1, k + 1)]  # ĥ fed at i-k+kk
            entries = torch.cat([features[:, :i - k + 1], *drafted], 1)
            torch.testing.assert_close(model(ids[:, :i + 1], entries).features[:, -1], steps[k][:, i],
                                       atol=1e-5, rtol=1e-5)
