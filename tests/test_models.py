"""Model loading: the tiny test model, and the real offline default (slow: provisions once)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rsft.models import load_causal_lm

TINY = OmegaConf.create({"kind": "tiny", "name_or_path": "tiny", "seed": 0, "hidden_size": 32,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 64, "dtype": "float32"})


def test_tiny_model_is_deterministic_and_has_a_chat_template(tmp_path):
    model, tok = load_causal_lm(TINY, tmp_path, torch.device("cpu"))
    again, _ = load_causal_lm(TINY, tmp_path, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert model.config.vocab_size == len(tok) and tok.eos_token == "<|im_end|>"
    assert tok.decode(tok("héllo")["input_ids"]) == "héllo"
    model.save_pretrained(tmp_path / "saved")
    tok.save_pretrained(tmp_path / "saved")


@pytest.mark.slow
def test_default_policy_loads_offline_and_speaks():
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["stage=sample"])
    model, tok = load_causal_lm(cfg.policy, cfg.paths.cache_dir, torch.device("cpu"))
    assert model.num_parameters() > 100e6 and model.config.vocab_size == 49152
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])
