"""Sampling from the policy: the verifier (pure tensors), the batched sampler, the drafts."""
