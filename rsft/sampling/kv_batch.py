"""A batch of sequences decoding together through one causal LM: packed tokens, a per-row KV cache.

Why by hand: HF `generate` keeps one cache whose rows all advance by the same number of tokens and
never change membership; assisted generation refuses batch > 1. Speculative sampling needs rows
that each accept their own number of tokens, rows that leave when finished and rows that join
while others are mid-way. And a padded [rows, n] forward makes every row pay for the widest one:
with one row carrying 4 drafts and fifteen carrying none, all sixteen run 5 positions through every
linear layer, most of a forward on a CPU (docs/benchmarks.md#where-a-step-goes). So the new tokens
of all rows are *packed* into one sequence [1, T] of only the real tokens; the linear layers, norms
and RoPE are per token and never see the rows. Only attention needs the rows, and it gets them from
`packed_attention`, an attention function registered with transformers' AttentionInterface, over a
preallocated cache.

Layout (per layer, keys and values): a buffer [buffer_rows, kv_heads, capacity, head_dim]. Buffer
row b holds one sequence's tokens at positions 0 .. length[b] - 1, contiguous, no holes:

- `forward(ids [rows, n], valid [rows, n])` writes row r's valid tokens at length + 0, 1, ... (their
  positions, so RoPE positions are the cache positions) and returns their logits;
  `commit(keep [rows])` then keeps, per row, the first keep[r] tokens written since the last commit.
  Rejected drafts are not removed: the row's length just stops before them, and the next forward
  overwrites them. Caches follow each row, not the batch minimum.
- The caller's rows map to buffer rows through `slot`: `keep_rows(index)` only remaps (no copy of
  the cache); a finished row's buffer row is free for the next admitted one.
- `admit(prefixes, copies)` adds rows. A prefix that a row in the buffer already holds (a sibling
  admitted earlier: K completions of a prompt often join in several steps) is copied from that row;
  the others are prefilled together in one packed forward and copied to their other rows.

The output head: on a CPU in float32 it runs through oneDNN instead of MKL for the batch's own
forwards (`onednn_head`; logits equal to ~1e-6); the model itself is not changed.
Measured costs: docs/benchmarks.md#the-onednn-output-head.

Features (`KVBatch(model, keep_features=True)`, for rsft.sampling.proposers.FeatureDraft): the batch
also keeps, per buffer row and position, the token fed there and the model's last-layer feature
(the output of its final norm, what the output head reads), written by every forward through a
hook on the final norm that is attached only while the batch's own forward runs: the feature draft
reads the policy's features from the same forward that gave the logits, never from a second pass.
They follow the rows exactly like the keys and values (overwritten after rejections, copied with
a shared prefix). Extra per-token model inputs (the feature draft's `features`) are packed like
the token ids: `forward(ids, valid, features=[rows, n, hidden])`, and `admit` takes a
`prefill_inputs` callback that gives them for the prefixes it prefills.

It works for models whose attention layers call `past_key_values.update(...)` and then the
AttentionInterface function named by `config._attn_implementation`, with explicit position_ids:
the Llama family in transformers 5 (Llama, SmolLM, Mistral, Qwen2/3, ...). Sliding-window layers
are not supported (every key before a query's position is visible).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTENTION_NAME = "rsft_packed"
GROUPED_ON_CPU = False  # grouped-query attention by grouping the queries on a CPU too (tests check that path there)


class _Plan:
    """Where each packed token sits: buffer row, column among its row's new tokens, position.

    width (the most new tokens of any row) and rows (the buffer rows taking part, or None when at least
    half of them do: attention then runs over every buffer row, a view, no copy) come from the caller,
    who knows them without reading the device (no host round trip inside a step)."""

    def __init__(self, buffer_row: torch.Tensor, column: torch.Tensor, position: torch.Tensor, width: int,
                 rows: torch.Tensor | None, local_row: torch.Tensor | None, num_buffer_rows: int, key_length: int):
        self.buffer_row, self.column, self.position = buffer_row, column, position  # [T] each
        self.width, self.rows = width, rows  # rows: [R] buffer rows attended, or None: all of them
        self.local_row = buffer_row if rows is None else local_row  # [T] each token's row among those attended
        num = num_buffer_rows if rows is None else rows.numel()
        query_position = torch.zeros(num, width, dtype=torch.long, device=position.device)  # [R, W]
        query_position[self.local_row, column] = position
        # query (r, i) at position p sees keys 0..p; padding queries see key 0 (finite, discarded)
        slots = torch.arange(key_length, device=position.device)  # [S]
        self.mask = (slots[None, None, :] <= query_position[:, :, None])[:, None]  # [R, 1, W, S]
        self._grouped_masks: dict[int, torch.Tensor] = {}

    def grouped_mask(self, group: int) -> torch.Tensor:
        """The mask for queries grouped by their key-value head, `group` query heads each: [R, 1, group W, S]
        (made once a forward, not once a layer)."""
        if group not in self._grouped_masks:
            r, _, w, s = self.mask.shape
            self._grouped_masks[group] = self.mask[:, :, None].expand(r, 1, group, w, s).reshape(r, 1, group * w, s)
        return self._grouped_masks[group]


_current: list[_Plan] = []  # the plan of the forward in progress (set by KVBatch.forward)


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query [1, heads, T, dim] (the packed tokens); key/value [buffer_rows, kv_heads, S, dim] (the
    cache, this forward's tokens already written) -> ([1, T, heads, dim], None)."""
    plan = _current[-1]
    heads, dim = query.shape[1], query.shape[3]
    if plan.rows is not None:
        key, value = key.index_select(0, plan.rows), value.index_select(0, plan.rows)
    rows, kv_heads = plan.mask.shape[0], key.shape[1]
    padded = query.new_zeros(rows, plan.width, heads, dim)  # [R, W, heads, dim]
    padded[plan.local_row, plan.column] = query[0].transpose(0, 1)
    if kv_heads != heads and (query.device.type != "cpu" or GROUPED_ON_CPU):
        # grouped-query attention without copying the cache: the query heads that share a key-value head become
        # more queries of it ([R, kv_heads, group W, dim], heads h // group together, as HF's repeat_kv pairs them).
        # SDPA's own enable_gqa with a mask falls back to its math kernel, which repeats every cached key and value
        # group times a layer: on a GPU that copy is most of a decode step's memory traffic. (A CPU keeps the call
        # below, whose rounding its recorded results were measured with.)
        group = heads // kv_heads
        grouped = padded.transpose(1, 2).reshape(rows, kv_heads, group * plan.width, dim)
        out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=plan.grouped_mask(group), scale=scaling)
        out = out.reshape(rows, heads, plan.width, dim)  # [R, heads, W, dim]
    else:
        out = F.scaled_dot_product_attention(padded.transpose(1, 2), key, value, attn_mask=plan.mask, scale=scaling,
                                             enable_gqa=kv_heads != heads)  # [R, heads, W, dim]
    return out.transpose(1, 2)[plan.local_row, plan.column][None], None  # [1, T, heads, dim]


AttentionInterface.register(ATTENTION_NAME, packed_attention)


class _BufferCache:
    """What the model's attention layers see as `past_key_values`: writes the packed tokens' keys
    and values into the buffers and hands back the whole buffer up to the longest row."""

    def __init__(self, batch: "KVBatch"):
        self.batch = batch

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        b = self.batch
        plan = _current[-1]
        keys, values = b.keys[layer_idx], b.values[layer_idx]
        keys[plan.buffer_row, :, plan.position] = key_states[0].transpose(0, 1).to(keys.dtype)  # [T, kv_heads, dim]
        values[plan.buffer_row, :, plan.position] = value_states[0].transpose(0, 1).to(values.dtype)
        return keys[:, :, :b.key_length], values[:, :, :b.key_length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.batch.key_length


@contextmanager
def _packed_attention_on(model):
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def onednn_head(model) -> torch.nn.Module | None:
    """The model's output head as a oneDNN linear layer, where that is faster: float32 on a CPU.

    Why: nn.Linear calls MKL's sgemm, which runs the output head's [tokens, hidden] x [hidden, vocab]
    product (SmolLM2's 49k-token head) markedly slower than oneDNN at the sampler's row counts, and a
    whole policy forward gains with it (measured costs: docs/benchmarks.md#the-onednn-output-head).
    Every other linear layer of the model is as fast either way, so only the head changes.
    torch.utils.mkldnn.MkldnnLinear is torch's own wrapper (a oneDNN copy of the weight, dense tensors
    in and out). The same products summed in another order: logits agree to ~1e-6.
    None where it does not apply (another device or dtype, no oneDNN or `torch.backends.mkldnn.enabled`
    turned off, a head that is not an nn.Linear child of the model named lm_head)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # the head must be the model's own `lm_head` child (not reached through a wrapper such as a PEFT model,
    # where assigning lm_head would register a new submodule on the wrapper instead of replacing the head)
    if (not isinstance(head, torch.nn.Linear) or model._modules.get("lm_head") is not head
            or head.weight.device.type != "cpu" or head.weight.dtype != torch.float32
            or not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)):
        return None
    from torch.utils.mkldnn import MkldnnLinear

    with torch.no_grad():
        return MkldnnLinear(head, torch.float32)


@contextmanager
def _head_swapped(model, head):
    """model.lm_head is `head` inside the block (nothing changes for head=None); restored on any exit."""
    if head is None:
        yield
        return
    original = model.lm_head
    model.lm_head = head
    try:
        yield
    finally:
        model.lm_head = original


def cache_keyword(model) -> str:
    """The forward keyword that takes a cache object: `cache` in transformers that renamed it (5.2x; the
    old `past_key_values` warns there and goes in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class KVBatch:
    def __init__(self, model, keep_features: bool = False, fast_head: bool = True):
        """fast_head: run the output head through oneDNN where that is faster (`onednn_head`); the
        weights are copied once here, so a model trained after this batch was made needs a new one."""
        self.model = model
        self.keep_features = keep_features
        self.head = onednn_head(model) if fast_head else None
        self.cache_keyword = cache_keyword(model)
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        config = model.config
        self.num_layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.vocab_size = model.get_output_embeddings().out_features
        self.keys: list[torch.Tensor] = []  # per layer [buffer_rows, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.length = torch.zeros(0, dtype=torch.long, device=self.device)  # [buffer_rows] tokens held
        self.committed = self.length.clone()  # [buffer_rows] tokens held at the last commit
        self.prefix: list[tuple | None] = []  # per buffer row: the prefix it was admitted with
        self.slot = torch.zeros(0, dtype=torch.long, device=self.device)  # [rows] caller's row -> buffer row
        self.slot_list: list[int] = []  # the same on the host (admission and removal are host decisions)
        # an upper bound on every buffer row's length, kept on the host so that a forward never reads the
        # device to size its keys: + n per forward of n tokens a row, exact after `note_max_length`
        self.length_bound = 0
        self.key_length = 0  # keys handed to attention this forward
        self.allocations = 0  # times the buffers were (re)allocated
        self._cache = _BufferCache(self)
        if keep_features:
            self.hidden_size = config.hidden_size
            self.final_norm = getattr(model.get_decoder(), "norm", None)
            if self.final_norm is None:
                raise ValueError(f"{type(model).__name__}: keep_features needs the decoder's final norm at "
                                 f"model.get_decoder().norm (the Llama family's layout)")
        self.features = torch.zeros(0, 0, 0, device=self.device)  # [buffer_rows, capacity, hidden] final-norm output
        self.tokens = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [buffer_rows, capacity] token fed

    # ---- buffers ----
    @property
    def num_rows(self) -> int:
        return len(self.slot_list)

    @property
    def buffer_rows(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, rows: int, capacity: int) -> None:
        """Allocate rows x capacity at once (the sampler knows both: its batch rows, and the longest prompt
        plus the token budget), so that no step grows or copies the cache."""
        self._allocate(rows, capacity)

    def _allocate(self, rows: int, capacity: int) -> None:
        """Grow the buffers to at least rows x capacity, keeping what they hold."""
        old_rows, old_capacity = self.buffer_rows, self.capacity
        if self.keys and rows <= old_rows and capacity <= old_capacity:
            return
        rows, capacity = max(rows, old_rows), max(capacity, old_capacity)
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        grown_k, grown_v = [], []
        for layer in range(self.num_layers):
            # zeros, not empty: attention multiplies masked slots' values by weight 0, and 0 x NaN garbage is NaN
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if self.keys:
                k[:old_rows, :, :old_capacity] = self.keys[layer]
                v[:old_rows, :, :old_capacity] = self.values[layer]
            grown_k.append(k)
            grown_v.append(v)
        self.keys, self.values = grown_k, grown_v
        self.allocations += 1  # new buffers: whatever holds the old ones' addresses (a CUDA graph) is stale
        if self.keep_features:
            features = torch.zeros(rows, capacity, self.hidden_size, dtype=self.dtype, device=self.device)
            tokens = torch.zeros(rows, capacity, dtype=torch.long, device=self.device)
            if old_rows:
                features[:old_rows, :old_capacity] = self.features
                tokens[:old_rows, :old_capacity] = self.tokens
            self.features, self.tokens = features, tokens
        zeros = torch.zeros(rows - old_rows, dtype=torch.long, device=self.device)
        self.length = torch.cat([self.length, zeros])
        self.committed = torch.cat([self.committed, zeros])
        self.prefix.extend([None] * (rows - old_rows))

    def _free_rows(self) -> list[int]:
        used = set(self.slot_list)
        return [b for b in range(self.buffer_rows) if b not in used]

    def note_max_length(self, length: int) -> None:
        """The caller read the rows' longest length (its one read of the device a step): the bound is exact again."""
        self.length_bound = length

    def refresh_length_bound(self) -> None:
        """Read the rows' longest length from the device (a host sync), for callers that do not track it."""
        self.length_bound = int(self.length[self.slot].max()) if self.slot_list else 0

    # ---- the model ----
    def _run(self, input_ids: torch.Tensor, buffer_row: torch.Tensor, column: torch.Tensor, position: torch.Tensor,
             logits_index: torch.Tensor | None, width: int, rows: torch.Tensor | None = None,
             local_row: torch.Tensor | None = None, whole_capacity: bool = False,
             **inputs: torch.Tensor) -> torch.Tensor:
        """One packed forward: input_ids [T] for buffer rows [T] at positions [T], extra per-token
        inputs [T, ...]; logits [T or kept, vocab]. width: the most tokens of one row (host-known);
        rows/local_row: the buffer rows attended and each token's index among them (None: all).
        whole_capacity: attention reads every cache position (masked past each row's own), a shape that
        depends on nothing the step computes (`forward_every_row`); else the positions up to the bound."""
        needed = self.capacity if whole_capacity else self.length_bound + width  # > every position written
        if needed > self.capacity:
            self._allocate(self.buffer_rows, max(needed, 2 * self.capacity, 64))
        self.key_length = needed
        _current.append(_Plan(buffer_row, column, position, width, rows, local_row, self.buffer_rows,
                              self.key_length))
        hook = None
        if self.keep_features:
            self.tokens[buffer_row, position] = input_ids

            def record(module, args, output):  # output [1, T, hidden]: what the output head reads
                self.features[buffer_row, position] = output[0].to(self.features.dtype)

            hook = self.final_norm.register_forward_hook(record)
        try:
            with _packed_attention_on(self.model), _head_swapped(self.model, self.head):
                out = self.model(input_ids=input_ids[None], position_ids=position[None],
                                 use_cache=True, logits_to_keep=0 if logits_index is None else logits_index,
                                 **{self.cache_keyword: self._cache},
                                 **{name: value[None] for name, value in inputs.items()})
        finally:
            _current.pop()
            if hook is not None:
                hook.remove()
        if not whole_capacity:
            self.length_bound = needed
        return out.logits[0]

    def forward_every_row(self, input_ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """n tokens for every buffer row, running or not: input_ids [buffer_rows, n] written at position + 0 ..
        n - 1 (position [buffer_rows]) -> logits [buffer_rows, n, vocab] in the model's dtype. Nothing here reads
        the device or depends on a value the step computes: the rows, the width and the keys attended (the whole
        capacity, masked per row) are the buffer's, so the same kernels run every step and a CUDA graph can
        replay them (rsft.sampling.graphed). The caller keeps every position inside the buffer (a free row's
        too, whose tokens land past its prefix and are overwritten by the next row given its buffer row) and
        moves `length` and commits itself. Not with keep_features."""
        if self.keep_features:
            raise ValueError("forward_every_row does not record features (keep_features=True)")
        rows, n = input_ids.shape
        buffer_row = torch.arange(rows, device=self.device).repeat_interleave(n)  # [T = rows n]
        column = torch.arange(n, device=self.device).repeat(rows)  # [T]
        logits = self._run(input_ids.reshape(-1), buffer_row, column, position.repeat_interleave(n) + column, None, n,
                           whole_capacity=True)  # [T, vocab]
        return logits.reshape(rows, n, -1)  # [B, n, vocab]

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, valid: torch.Tensor | None = None, logits_to_keep: int = 0,
                **inputs: torch.Tensor):
        """Append input_ids [rows, n] (only where valid [rows, n]) to each row; return logits
        [rows, n, vocab] (zeros where not valid), or with logits_to_keep=1 [rows, 1, vocab] at each
        row's last valid token. inputs: extra per-token model inputs [rows, n, ...], packed alike.

        valid=None: every slot is a real token. Then nothing is read back from the device (the packed
        order is row-major and every row has n tokens), which is the sampler's plain step, and its
        verification step on an accelerator (rsft.sampling.batched runs the fixed [rows, 1 + gamma]
        shape there, padding included, and keeps only what the verifier accepts)."""
        rows, n = input_ids.shape
        if logits_to_keep not in (0, 1):
            raise ValueError(f"logits_to_keep={logits_to_keep}: KVBatch.forward supports 0 (all) or 1 (last)")
        shape = (rows, 1 if logits_to_keep else n, self.vocab_size)
        if rows == 0 or n == 0:
            return torch.zeros(shape, device=self.device)
        if valid is None:
            buffer_row = self.slot.repeat_interleave(n)  # [T = rows n]
            column = torch.arange(n, device=self.device).repeat(rows)  # [T]
            position = self.length[buffer_row] + column  # [T]
            attended = 2 * rows < self.buffer_rows  # few rows: attend over theirs only
            keep_index = torch.arange(rows, device=self.device) * n + n - 1 if logits_to_keep else None  # [rows]
            logits = self._run(input_ids.reshape(-1), buffer_row, column, position, keep_index, n,
                               rows=self.slot if attended else None,
                               local_row=torch.arange(rows, device=self.device).repeat_interleave(n) if attended else None,
                               **{name: value.flatten(0, 1) for name, value in inputs.items()})
            self.length[self.slot] += n
            return logits.to(torch.get_default_dtype()).reshape(shape)  # [rows, n or 1, vocab], no copy
        row, col = valid.nonzero(as_tuple=True)  # [T] each, row-major: a row's tokens in order
        if row.numel() == 0:  # no real token anywhere: nothing to run
            return torch.zeros(shape, device=self.device)
        rank = valid.long().cumsum(1) - 1  # [rows, n] index among the row's valid tokens
        buffer_row = self.slot[row]  # [T]
        position = self.length[buffer_row] + rank[row, col]  # [T]
        counts = valid.long().sum(1)  # [rows]
        has_tokens = counts > 0  # [rows]
        keep_index = (counts.cumsum(0) - 1)[has_tokens] if logits_to_keep else None  # each row's last packed token
        taking_part = torch.unique(buffer_row)  # [R] (this path packs on the host's terms: a CPU, or a draft)
        attended = 2 * taking_part.numel() < self.buffer_rows
        logits = self._run(input_ids[row, col], buffer_row, rank[row, col], position, keep_index, int(counts.max()),
                           rows=taking_part if attended else None,
                           local_row=torch.searchsorted(taking_part, buffer_row) if attended else None,
                           **{name: value[row, col] for name, value in inputs.items()})
        self.length[self.slot] += counts
        if row.numel() == rows * n:  # every slot held a real token: packed order is row-major
            return logits.to(torch.get_default_dtype()).reshape(shape)  # [rows, n or 1, vocab], no copy
        out = torch.zeros(shape, device=self.device)  # zeros where nothing ran
        if logits_to_keep:
            out[has_tokens, 0] = logits.to(out.dtype)  # [rows with tokens, vocab]
        else:
            out[row, col] = logits.to(out.dtype)
        return out  # [rows, n or 1, vocab]

    def commit(self, keep: torch.Tensor) -> None:
        """Keep the first keep[r] tokens written to row r since the last commit; drop the rest."""
        start = self.committed[self.slot]  # [rows]
        self.length[self.slot] = start + torch.minimum(keep.to(self.device), self.length[self.slot] - start)
        self.committed = self.length.clone()

    def holder(self, prefix) -> int:
        """A buffer row that holds `prefix` (a row admitted with it), e.g. to read its features."""
        key = tuple(prefix)
        for b, held in enumerate(self.prefix):
            if held == key:
                return b
        raise KeyError(f"no buffer row holds a prefix of {len(key)} tokens starting {list(key[:5])}")

    @torch.no_grad()
    def admit(self, prefixes: list[list[int]], copies: list[int], prefill_inputs=None) -> None:
        """Add rows after the existing ones: prefix i is held by copies[i] new rows. prefill_inputs:
        prefixes -> {name: [sum of their lengths, ...]}, the extra model inputs of the prefixes this
        call prefills (packed in order), for a model that takes more than token ids.

        A buffer row admitted with a prefix holds it for as long as it is not given to another row: a
        row's length never falls below its prefix (commit keeps at least what was committed), so which
        rows hold what is known on the host, without reading lengths back from the device."""
        live = set(self.slot_list)
        held = {}  # prefix -> a buffer row holding it, live rows first
        for b in sorted(range(self.buffer_rows), key=lambda b: b not in live):
            if self.prefix[b] is not None:
                held.setdefault(self.prefix[b], b)
        sources = {tuple(p): held[tuple(p)] for p in prefixes if tuple(p) in held}
        # a free row that holds a prefix becomes that prefix's first new row (nothing to copy): kept out of the
        # free rows, it would make the cache grow past the rows reserved for it
        own = {}
        for prefix, count in zip(prefixes, copies):
            source = sources.get(tuple(prefix))
            if count and source is not None and source not in live and source not in own.values():
                own[tuple(prefix)] = source
        free = [b for b in self._free_rows() if b not in set(sources.values())]
        needed = sum(copies) - len(own)
        longest = max((len(p) for p in prefixes), default=0)
        if needed > len(free) or longest > self.capacity:
            start = self.buffer_rows
            self._allocate(start + max(needed - len(free), 0), max(self.capacity, longest))
            free += list(range(start, self.buffer_rows))
        new_rows, groups = [], []
        for prefix, count in zip(prefixes, copies):
            mine = [own[tuple(prefix)]] if tuple(prefix) in own and count else []
            take = count - len(mine)
            rows = mine + free[:take]
            free = free[take:]
            new_rows += rows
            groups.append((tuple(prefix), rows))
        # prefill the prefixes nobody holds, all in one packed forward, into each one's first row
        fresh = [(key, rows[0]) for key, rows in groups if key not in sources and key and rows]
        seen = set()
        fresh = [(k, b) for k, b in fresh if not (k in seen or seen.add(k))]
        if fresh:
            ids = torch.tensor([t for key, _ in fresh for t in key], dtype=torch.long, device=self.device)
            buffer_row = torch.tensor([b for key, b in fresh for _ in key], dtype=torch.long, device=self.device)
            column = torch.tensor([i for key, _ in fresh for i in range(len(key))], dtype=torch.long, device=self.device)
            last = torch.tensor([len(key) for key, _ in fresh], device=self.device).cumsum(0) - 1
            extra = prefill_inputs([list(key) for key, _ in fresh]) if prefill_inputs is not None else {}
            taking_part = sorted(b for _, b in fresh)
            attended = 2 * len(taking_part) < self.buffer_rows
            rows_index = torch.tensor(taking_part, dtype=torch.long, device=self.device)
            local = {b: i for i, b in enumerate(taking_part)}
            local_row = torch.tensor([local[b] for key, b in fresh for _ in key], dtype=torch.long, device=self.device)
            bound = self.length_bound
            self.length_bound = 0  # positions start at 0: the prefill's keys end at its longest prefix
            self._run(ids, buffer_row, column, column, last, max(len(key) for key, _ in fresh),
                      rows=rows_index if attended else None, local_row=local_row if attended else None, **extra)
            self.length_bound = max(bound, self.length_bound)
            for key, b in fresh:
                sources.setdefault(key, b)
        targets_all, lengths_all = [], []
        for key, rows in groups:
            length = len(key)
            targets = [b for b in rows if b != sources.get(key)]
            if length and targets:
                index = torch.tensor(targets, dtype=torch.long, device=self.device)
                source = sources[key]
                for layer in range(self.num_layers):  # clone: source and targets share the buffer
                    self.keys[layer][index, :, :length] = self.keys[layer][source, :, :length].clone()
                    self.values[layer][index, :, :length] = self.values[layer][source, :, :length].clone()
                if self.keep_features:
                    self.features[index, :length] = self.features[source, :length].clone()
                    self.tokens[index, :length] = self.tokens[source, :length].clone()
            for b in rows:
                targets_all.append(b)
                lengths_all.append(length)
                self.prefix[b] = key
        if targets_all:
            self.length[torch.tensor(targets_all, dtype=torch.long, device=self.device)] = torch.tensor(
                lengths_all, dtype=torch.long, device=self.device)
            self.length_bound = max(self.length_bound, max(lengths_all))
        self.committed = self.length.clone()
        self.slot_list = self.slot_list + new_rows
        self.slot = torch.tensor(self.slot_list, dtype=torch.long, device=self.device)

    def keep_rows(self, index) -> None:
        """Keep only the rows in index (a list of row numbers, in that order); the others' buffer rows
        become free. Its length bound stays an upper bound."""
        index = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        self.slot_list = [self.slot_list[i] for i in index]
        self.slot = torch.tensor(self.slot_list, dtype=torch.long, device=self.device)
