"""A batch of sequences decoding together through one causal LM, with a per-row KV cache.

Why by hand: HF `generate` keeps one cache whose rows all advance by the same number of tokens and
never change membership; assisted generation refuses batch > 1. Speculative sampling needs rows
that each accept their own number of tokens, rows that leave when finished and rows that join
while others are mid-way. This class does that over a transformers `DynamicCache`:

- Every cache slot has a validity bit (`mask [rows, slots]`). A row's real tokens are its valid
  slots; left padding (rows of different lengths) and rejected draft slots are invalid slots, which
  the attention mask hides. A row's next position id is its count of valid slots, so RoPE
  positions stay contiguous over the holes.
- `forward(ids [rows, n], valid [rows, n])` appends n slots to every row; `commit(keep [rows])`
  then keeps, per row, the first keep[r] valid slots appended since the last commit and
  invalidates the rest (the rejected drafts). Caches follow each row, not the batch minimum.
- `admit(prefixes, copies)` prefills each distinct prefix once (batch of one, no padding) and
  repeats its cache for `copies` rows: K completions of a prompt share the prompt's prefill.
  `keep_rows(index)` drops finished rows; `compact()` squeezes out invalid slots once they are
  the majority, so memory follows the real tokens.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class KVBatch:
    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [rows, slots]
        self.num_real = torch.zeros(0, dtype=torch.long, device=self.device)  # [rows] valid slots
        self._committed_real = self.num_real.clone()  # [rows] valid slots at the last commit
        self._pending_from = 0  # first slot appended since the last commit

    @property
    def num_rows(self) -> int:
        return self.mask.shape[0]

    @property
    def num_slots(self) -> int:
        return self.mask.shape[1]

    def _layers(self):
        return [layer for layer in self.cache.layers if layer.is_initialized]

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, valid: torch.Tensor | None = None, logits_to_keep: int = 0):
        """Append input_ids [rows, n] to every row; return logits [rows, n, vocab] (or the last few)."""
        rows, n = input_ids.shape
        if valid is None:
            valid = torch.ones(rows, n, dtype=torch.bool, device=self.device)  # [rows, n]
        positions = self.num_real[:, None] + valid.long().cumsum(1) - 1  # [rows, n]
        positions = positions.clamp(min=0)  # an invalid first slot of an empty row: any position works
        attention = torch.cat([self.mask, valid], dim=1)  # [rows, slots + n]
        cache_position = torch.arange(self.num_slots, self.num_slots + n, device=self.device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention.long(),
            position_ids=positions,
            past_key_values=self.cache,
            cache_position=cache_position,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        self.mask = attention
        self.num_real = self.num_real + valid.long().sum(1)
        return out.logits

    def commit(self, keep: torch.Tensor) -> None:
        """Keep the first keep[r] valid slots appended since the last commit; invalidate the rest."""
        pending = self.mask[:, self._pending_from:]  # [rows, appended]
        rank = pending.long().cumsum(1)  # [rows, appended] 1-based rank among valid slots
        self.mask[:, self._pending_from:] = pending & (rank <= keep[:, None])
        self.num_real = self._committed_real + torch.minimum(keep, pending.long().sum(1))
        self._committed_real = self.num_real.clone()
        self._pending_from = self.num_slots

    @torch.no_grad()
    def admit(self, prefixes: list[list[int]], copies: list[int]) -> None:
        """Add rows: prefix i is prefilled once and its cache repeated for copies[i] new rows."""
        for prefix, count in zip(prefixes, copies):
            fresh = DynamicCache(config=self.model.config)
            if prefix:
                ids = torch.tensor([prefix], dtype=torch.long, device=self.device)  # [1, len]
                self.model(input_ids=ids, past_key_values=fresh, use_cache=True, logits_to_keep=1)
                new_layers = [(layer.keys.expand(count, -1, -1, -1), layer.values.expand(count, -1, -1, -1))
                              for layer in fresh.layers if layer.is_initialized]
            else:  # a one-token prompt: nothing to prefill, zero slots per layer
                new_layers = [(self._empty_slots(count), self._empty_slots(count))
                              for _ in range(self.model.config.num_hidden_layers)]
            length = len(prefix)
            new_mask = torch.ones(count, length, dtype=torch.bool, device=self.device)  # [count, len]
            self._append_rows(new_layers, new_mask)

    def _empty_slots(self, rows: int) -> torch.Tensor:
        config = self.model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(rows, heads, 0, head_dim, dtype=dtype, device=self.device)  # [rows, heads, 0, dim]

    def _append_rows(self, new_layers, new_mask: torch.Tensor) -> None:
        width = max(self.num_slots, new_mask.shape[1])
        old_layers = self._layers()
        if self.num_rows == 0 or not old_layers:
            merged = [(self._pad_left(k, width), self._pad_left(v, width)) for k, v in new_layers]
            mask = self._pad_left_mask(new_mask, width)
        else:
            merged = []
            for (k_old, v_old), (k_new, v_new) in zip(((l.keys, l.values) for l in old_layers), new_layers):
                merged.append((torch.cat([self._pad_left(k_old, width), self._pad_left(k_new, width)]),
                               torch.cat([self._pad_left(v_old, width), self._pad_left(v_new, width)])))
            mask = torch.cat([self._pad_left_mask(self.mask, width), self._pad_left_mask(new_mask, width)])
        self._set_layers(merged)
        self.mask = mask
        added = new_mask.long().sum(1)
        self.num_real = torch.cat([self.num_real, added])
        self._committed_real = self.num_real.clone()
        self._pending_from = self.num_slots

    @staticmethod
    def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
        # t: [rows, heads, slots, head_dim]; zero slots (finite, so masked attention stays NaN-free)
        missing = width - t.shape[2]
        if missing == 0:
            return t.contiguous()
        pad = torch.zeros(t.shape[0], t.shape[1], missing, t.shape[3], dtype=t.dtype, device=t.device)
        return torch.cat([pad, t], dim=2)

    @staticmethod
    def _pad_left_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
        missing = width - mask.shape[1]
        pad = torch.zeros(mask.shape[0], missing, dtype=torch.bool, device=mask.device)
        return torch.cat([pad, mask], dim=1)

    def _set_layers(self, tensors) -> None:
        if not self._layers():  # an empty cache: let the cache build its layers, then fill them
            self.cache = DynamicCache(ddp_cache_data=tensors, config=self.model.config)
            return
        for layer, (k, v) in zip(self._layers(), tensors):
            layer.keys, layer.values = k, v

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows in index [kept] (in that order); drop the others."""
        self._set_layers([(l.keys.index_select(0, index), l.values.index_select(0, index)) for l in self._layers()])
        self.mask = self.mask.index_select(0, index)
        self.num_real = self.num_real.index_select(0, index)
        self._committed_real = self._committed_real.index_select(0, index)
        self.compact()

    def compact(self, min_waste: float = 0.5) -> None:
        """Squeeze out invalid slots when they are at least `min_waste` of the cache (after a commit)."""
        if self.num_rows == 0:
            self.cache = DynamicCache(config=self.model.config)
            self.mask = self.mask[:, :0]
            self._pending_from = 0
            return
        width = int(self.num_real.max())
        if self.num_slots == 0 or 1 - width / self.num_slots < min_waste:
            return
        # Each row's valid slots, right-aligned in `width` slots (left padding), order preserved.
        order = torch.argsort(self.mask.long(), dim=1, stable=True)[:, -width:]  # [rows, width]
        new_mask = torch.gather(self.mask, 1, order)  # [rows, width]
        tensors = []
        for layer in self._layers():
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            tensors.append((torch.gather(layer.keys, 2, index), torch.gather(layer.values, 2, index)))
        self._set_layers(tensors)
        self.mask = new_mask
        self._pending_from = self.num_slots
