"""stage=draft on the tiny policy, distilled and feature drafts: shares the tokenizer, loads as a
draft, learns (held-out acceptance above an untrained draft of the same shape), drafts when sampling."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from rsft.generation import build_draft
from rsft.models import (
    DRAFT_HEAD_FILE,
    load_causal_lm,
    load_distilled_draft,
    load_feature_draft,
)
from rsft.paths import RunPaths
from rsft.store import read_meta
from rsft.run import run_stage

SMALL = ["policy.initializer_range=0.5", "data.limit=6", "sample.num_samples=6", "sample.max_new_tokens=24", "distill.num_layers=1",
         "distill.epochs=6", "distill.batch_size=8", "distill.eval_prompts=3", "distill.eval_samples=16",
         "distill.learning_rate=3e-3"]


def test_draft_stage_trains_a_draft_that_beats_an_untrained_one(make_cfg, tmp_path):
    run_stage(make_cfg("stage=sample", *SMALL))
    out = run_stage(make_cfg("stage=draft", *SMALL)).path
    assert out == RunPaths(f"{tmp_path}/runs/demo").draft
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["heldout_loss_after"] < metrics["heldout_loss_before"]
    assert metrics["acceptance_rate"] > metrics["untrained_acceptance_rate"]
    assert read_meta(out)["metrics"] == metrics
    # it shares the policy's tokenizer and loads as a draft for sampling
    cfg = make_cfg("stage=sample", "draft=distilled", *SMALL)
    policy, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, torch.device("cpu"))
    model, draft_tokenizer, head = load_distilled_draft(out, torch.device("cpu"))
    assert draft_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert json.loads((out / DRAFT_HEAD_FILE).read_text())["head_token_ids"] == head
    assert build_draft(cfg, policy, tokenizer, torch.device("cpu")) is not None
    samples = run_stage(make_cfg("stage=sample", "draft=distilled", "run_name=demo", "round=0", "overwrite=true", *SMALL)).path
    assert read_meta(samples)["sampling"]["num_drafted"] > 0


FEATURE = [*SMALL, "draft=feature", "draft.train.epochs=30", "draft.train.batch_size=8",
           "draft.train.learning_rate=3e-3"]


def test_feature_draft_stage_trains_a_draft_that_beats_an_untrained_one(make_cfg, tmp_path):
    run_stage(make_cfg("stage=sample", *SMALL))
    out = run_stage(make_cfg("stage=draft", *FEATURE)).path
    assert out == RunPaths(f"{tmp_path}/runs/demo").draft
    meta = read_meta(out)
    metrics = meta["metrics"]
    assert meta["kind"] == metrics["kind"] == "feature"
    assert metrics["heldout_kl_after"] < metrics["heldout_kl_before"]
    assert metrics["acceptance_rate"] > metrics["untrained_acceptance_rate"]
    # it shares the policy's tokenizer and hidden size, and its head is rows of the policy's output layer
    cfg = make_cfg("stage=sample", *FEATURE)
    policy, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, torch.device("cpu"))
    model, draft_tokenizer = load_feature_draft(out, policy, torch.device("cpu"))
    assert draft_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert model.config.hidden_size == policy.config.hidden_size
    head = json.loads((out / DRAFT_HEAD_FILE).read_text())["head_token_ids"]
    assert torch.equal(model.lm_head.weight, policy.get_output_embeddings().weight[torch.tensor(head)])
    samples = run_stage(make_cfg("stage=sample", "overwrite=true", *FEATURE)).path
    assert read_meta(samples)["sampling"]["num_drafted"] > 0
    assert "draft" in read_meta(samples)["fingerprint"]["inputs"]  # a retrained draft makes the samples stale
    # the wrong kind, or another policy's hidden size, is a clear error naming the folder
    with pytest.raises(ValueError, match="holds a feature draft"):
        load_distilled_draft(out, torch.device("cpu"))
    wider, _ = load_causal_lm(OmegaConf.merge(cfg.policy, {"hidden_size": 64}), cfg.paths.cache_dir, torch.device("cpu"))
    with pytest.raises(ValueError, match="config.json: the feature draft has hidden_size=32, the policy 64"):
        load_feature_draft(out, wider, torch.device("cpu"))
