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


# ---------------------------------------------------------------- loading a folder: rsft.models.load_pretrained


def _saved_causal_lm(folder, tie=True):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rsft.models import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, max_position_embeddings=128,
                         tie_word_embeddings=tie, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _hf(folder):
    return OmegaConf.create({"kind": "hf", "name_or_path": str(folder), "dtype": "float32"})


def test_a_saved_folder_loads_whole_tied_weights_included(tmp_path):
    folder = _saved_causal_lm(tmp_path / "lm")  # tied: no lm_head.weight in the file, and none missing
    model, tokenizer = load_causal_lm(_hf(folder), tmp_path, torch.device("cpu"))
    assert model.config.tie_word_embeddings and tokenizer.eos_token == "<|im_end|>"


def test_a_policy_folder_without_its_output_layer_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from rsft.errors import InputError

    folder = _saved_causal_lm(tmp_path / "lm", tie=False)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError) as refused:
        load_causal_lm(_hf(folder), tmp_path, torch.device("cpu"))
    message = str(refused.value)
    assert f"model {str(folder)!r} (kind=hf): {folder} lacks 1 weight(s)" in message and "lm_head.weight" in message


@pytest.mark.parametrize("file,damage,named", [
    ("model.safetensors", lambda b: b[:len(b) - 64], "not a complete safetensors file"),
    ("model.safetensors", lambda b: b"", "not a complete safetensors file"),
    ("config.json", lambda b: b"{\"model_type\": ", "not valid JSON"),
    ("tokenizer.json", lambda b: b[:64], "not valid JSON"),
])
def test_a_damaged_policy_file_is_named_with_what_to_do(tmp_path, file, damage, named):
    from rsft.errors import InputError
    from rsft.models import load_policy_tokenizer

    folder = _saved_causal_lm(tmp_path / "lm")
    (folder / file).write_bytes(damage((folder / file).read_bytes()))
    loaders = [lambda: load_causal_lm(_hf(folder), tmp_path, torch.device("cpu"))]
    if file != "model.safetensors":  # what an engine (vLLM) reads besides the weights
        loaders.append(lambda: load_policy_tokenizer(str(folder)))
    for load in loaders:
        with pytest.raises(InputError) as refused:
            load()
        message = str(refused.value)
        assert f"{folder / file} is damaged: {named}" in message and "\n" not in message


def test_a_folder_that_holds_no_model_is_refused_naming_it(tmp_path):
    from rsft.errors import InputError

    folder = _saved_causal_lm(tmp_path / "lm")
    (folder / "model.safetensors").unlink()
    with pytest.raises(InputError, match=f"{folder} holds no loadable causal language model"):
        load_causal_lm(_hf(folder), tmp_path, torch.device("cpu"))
