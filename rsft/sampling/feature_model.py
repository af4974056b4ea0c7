"""The feature draft's network: one decoder layer that extrapolates the policy's own features.

EAGLE (Li et al. 2024, arXiv 2401.15077): the policy's last-layer feature h_t (the output of its
final norm, which its output head turns into p(x_{t+1})) is far more predictable one step ahead
than the next token is, and the policy's head already knows how to read it. So the draft is

    entry t:  u_t = fc([h_{t-1} ; e(x_t)])          h_{-1} = 0; e = the policy's token embeddings
    ĥ_t = norm(decoder_layers(u_0 .. u_t))[t]       a prediction of h_t (causal attention)
    q(x_{t+1}) = softmax(head(ĥ_t))                 head = rows of the policy's output layer

and while drafting it feeds its own prediction back: entry t+1 = (ĥ_t, d_1), and so on. Entry t
pairs token t with the feature of position t - 1 (not the other way round) so that the draft's
positions coincide with the policy's: its cache grows along the policy's, and the prefix of a
prompt prefills both the same way.

The embeddings and the output head are the policy's, frozen and not saved with the draft (a draft
is refreshed with each round's policy, rsft.draft): `embed_weight` shares the policy's tensor; the
head is either the policy's whole output layer or its rows for `head_token_ids`, the frequent
tokens (q = 0 elsewhere only means those tokens are never proposed: the verifier stays exact).
Only fc, the decoder layers and the final norm are trained and saved (`SAVED_PREFIXES`).

Written by hand because transformers has no EAGLE model; the decoder layers are transformers'
own LlamaDecoderLayer, so the packed attention of rsft.sampling.kv_batch serves the draft too.
"""

from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

SAVED_PREFIXES = ("fc.", "layers.", "norm.")  # what training changes; the rest is the policy's


def feature_draft_config(policy_config, num_layers: int):
    """The draft's config: the policy's sizes (hidden, heads, RoPE) with `num_layers` layers."""
    config = copy.deepcopy(policy_config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    config.tie_word_embeddings = False
    config._attn_implementation = "sdpa"
    return config


class FeatureDraftModel(nn.Module):
    def __init__(self, config, embed_weight: torch.Tensor, head_weight: torch.Tensor,
                 head_token_ids: list[int] | None = None):
        """config: feature_draft_config(policy.config, layers); embed_weight [vocab, hidden] and
        head_weight [vocab, hidden]: the policy's input embeddings and output layer."""
        super().__init__()
        hidden = config.hidden_size
        if embed_weight.shape[1] != hidden or head_weight.shape[1] != hidden:
            raise ValueError(f"feature draft: hidden_size={hidden} but the policy's embeddings are "
                             f"{list(embed_weight.shape)} and its output layer {list(head_weight.shape)}")
        self.config = config
        self.vocab_size = head_weight.shape[0]
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        # the decoder layer's cache keyword: `cache` where transformers renamed it, `past_key_values` before
        self.layer_cache_keyword = ("cache" if "cache" in inspect.signature(LlamaDecoderLayer.forward).parameters
                                    else "past_key_values")
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)  # shared, frozen
        self.head_token_ids = None if head_token_ids is None else list(head_token_ids)
        rows = head_weight if head_token_ids is None else head_weight[torch.tensor(head_token_ids)]
        self.lm_head = nn.Linear(hidden, rows.shape[0], bias=False)
        self.lm_head.weight = nn.Parameter(rows.detach(), requires_grad=False)

    def get_decoder(self):  # KVBatch(keep_features=True) records the output of get_decoder().norm
        return self

    def get_output_embeddings(self):
        return self.lm_head

    def saved_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if k.startswith(SAVED_PREFIXES)}

    def load_saved_state_dict(self, state: dict[str, torch.Tensor], source: str) -> None:
        expected = set(self.saved_state_dict())
        if set(state) != expected:
            raise ValueError(f"{source}: expected the feature draft's tensors {sorted(expected)[:4]}..., "
                             f"got {sorted(state)[:4]}... ({len(state)} tensors for {len(expected)})")
        self.load_state_dict(state, strict=False)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache=None, use_cache: bool = False, logits_to_keep: int | torch.Tensor = 0, **kwargs):
        """input_ids [batch, T] (token t), features [batch, T, hidden] (the feature of position t - 1)
        -> .features [batch, T, hidden] (ĥ_t) and .logits [batch, kept, head] (the head on ĥ_t).
        Without a cache the attention is causal over the T entries (right padding is harmless)."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.fc(torch.cat([features.to(self.fc.weight.dtype), F.embedding(input_ids, self.embed_weight)], -1))
        position_embeddings = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask=None, position_ids=position_ids, use_cache=use_cache,
                      position_embeddings=position_embeddings, **{self.layer_cache_keyword: cache})
        x = self.norm(x)  # [batch, T, hidden] predicted features
        if isinstance(logits_to_keep, torch.Tensor):
            kept = x[:, logits_to_keep]
        else:
            kept = x[:, -logits_to_keep:] if logits_to_keep else x
        return SimpleNamespace(logits=self.lm_head(kept), features=x)

    def unrolled(self, input_ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time drafting (HASS, arXiv 2408.15766; EAGLE-3's "training-time test"): the
        predicted features of draft positions 1..steps at every position of the sequences at once.

        input_ids [batch, T] and features [batch, T, hidden] as for forward (the policy's feature of
        t - 1 at entry t) -> [ĥ^0, ..., ĥ^(steps-1)], each [batch, T, hidden]. ĥ^k[i] is what the
        draft predicts for the policy's feature at i when it drafts position k + 1, i.e. after the
        true entries 0..i-k and k drafted entries: entry i of step k is (ĥ^(k-1)[i-1], x_i), and it
        attends to the true entries up to i - k and to the drafted entries on its own diagonal
        (step k' at i - k + k'), exactly the cache the sampler holds at that point. Positions
        i < k have no true entry to start from: their outputs are meaningless and must not be scored."""
        batch, width = input_ids.shape
        positions = torch.arange(width, device=input_ids.device)
        position_ids = positions[None]
        embeds = F.embedding(input_ids, self.embed_weight)
        position_embeddings = self.rotary_emb(embeds, position_ids)
        keys, values = [[] for _ in self.layers], [[] for _ in self.layers]  # per layer: per step [batch, kv heads, T, dim]
        out, previous = [], features.to(self.fc.weight.dtype)
        for k in range(steps):
            # mask [T, (k + 1) T]: query i sees true keys j <= i - k, and step k' key i - k + k'
            blocks = [positions[None, :] <= positions[:, None] - k]
            blocks += [positions[None, :] == positions[:, None] - k + kk for kk in range(1, k + 1)]
            mask = torch.cat(blocks, 1)[None, None]
            x = self.fc(torch.cat([previous, embeds], -1))
            for layer, layer_keys, layer_values in zip(self.layers, keys, values):
                x = self._layer_with_keys(layer, x, position_embeddings, mask, layer_keys, layer_values)
            x = self.norm(x)
            out.append(x)
            previous = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)  # entry i of the next step reads ĥ[i-1]
        return out

    @staticmethod
    def _layer_with_keys(layer, x, position_embeddings, mask, keys: list, values: list):
        """One decoder layer whose attention also sees the keys/values of the earlier unroll steps
        (appended to `keys`/`values`): LlamaDecoderLayer's computation with a hand-held key list."""
        from transformers.models.llama.modeling_llama import (
            apply_rotary_pos_emb,
            repeat_kv,
        )

        attn = layer.self_attn
        residual = x
        h = layer.input_layernorm(x)
        shape = (*h.shape[:-1], -1, attn.head_dim)
        q = attn.q_proj(h).view(shape).transpose(1, 2)
        k = attn.k_proj(h).view(shape).transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        keys.append(k)
        values.append(v)
        groups = attn.num_key_value_groups
        all_k, all_v = repeat_kv(torch.cat(keys, 2), groups), repeat_kv(torch.cat(values, 2), groups)
        o = F.scaled_dot_product_attention(q, all_k, all_v, attn_mask=mask, scale=attn.scaling)
        x = residual + attn.o_proj(o.transpose(1, 2).reshape(*x.shape[:-1], -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))
