"""Drafts: who proposes the tokens the policy verifies.

- `ModelDraft`: a small causal LM sharing the policy's tokenizer. It samples gamma tokens from its
  own processed distribution q (same temperature / top-k / top-p as the policy) and returns q, so
  the verifier can apply min(1, p/q). Its KV cache is a `KVBatch` that follows each row: after
  verification a row keeps the drafts it accepted, and a row that accepted all gamma carries the
  last draft (never fed to the draft model) into the next step's first forward.
- `NgramDraft`: model-free and deterministic (q is one-hot): it looks up the longest suffix
  (max_ngram down to min_ngram tokens) of a row's context in the prompt and in the completions
  already sampled for the same prompt (its K siblings, running or finished), and proposes the
  tokens that followed. A row with no match proposes nothing that step (num_drafts = 0) and, as
  the policy's forward is packed (rsft.sampling.kv_batch), costs nothing extra. Measured on the
  demo task (SmolLM2-135M, T=0.7, gamma=1, `scripts/bench_sampling.py --prompts 16 --batch-rows 16
  --gammas 1 --methods ngram --repeats 1 --min-ngram M` for M = 1..4): drafts from matches of at
  least 1, 2, 3, 4 tokens are accepted 24%, 41%, 53%, 52% of the time, so one-token matches alone
  only ~15%, well below what verifying a token costs (0.25-0.36 of a row's share of a step,
  `--forward-cost`): hence min_ngram=2. The
  proposals of row i depend only on tokens that are already fixed, so the verifier's guarantee
  holds per row, and sibling rows stay independent samples.
- `FeatureDraft`: EAGLE's draft (rsft.sampling.feature_model): one decoder layer that reads the
  policy's own last-layer features and reuses its output head. See its docstring.

The interface the sampler uses (each row's `gammas[r]` is its own cap: a row never drafts past its
own token budget, whatever its neighbours have left):
  begin()                                 a new generate() call: no row of an earlier call goes on (its
                                          prompt indices are the call's own, so state kept by them would
                                          belong to other prompts)
  admit(prefixes, copies, rows, target)   new rows (target: the policy's KVBatch, already admitted)
  catch_up()                              feed what the policy emitted during steps without drafts
  propose(last, gammas, uniforms, sampling, rows) -> (tokens [rows, G], q [rows, G, vocab] or None,
                                          num [rows] <= gammas), G = max(gammas); row r's draft i
                                          uses only uniforms[r, i]
  after_step(draft_tokens, num_drafts, num_accepted, emitted, rows, fed_last)
                                          emitted: each row's tokens as host lists for a draft whose
                                          `reads_emitted` is True, else None (no host read)
  keep_rows(index)                         index: the rows that go on (a list of row numbers)
`catch_up` exists so that the work of catching up after plain steps is not charged to the step
that drafts again (rsft.sampling.batched.GammaController).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.processing import greedy_probs, probs_from_logits, sample_from_probs


def _sample_drafts(logits: torch.Tensor, uniforms: torch.Tensor, sampling, head: torch.Tensor | None,
                   vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, head or vocab], uniforms [rows] -> (draft token ids [rows], q [rows, vocab]): the
    draft's processed distribution (the policy's temperature / top-k / top-p), zero off the head."""
    if sampling.strategy == "greedy":
        q = greedy_probs(logits)  # [rows, head or vocab]
        x = q.argmax(-1)  # [rows]
    else:
        q = probs_from_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        x = sample_from_probs(q, uniforms)
    if head is not None:  # back to vocabulary ids; q is zero off the head
        full = torch.zeros(q.shape[0], vocab_size, dtype=q.dtype, device=q.device)  # [rows, vocab]
        q = full.index_copy_(1, head, q)
        x = head[x]
    return x, q


class ModelDraft:
    def __init__(self, model, head_token_ids: list[int] | None = None, vocab_size: int | None = None):
        """head_token_ids: the draft's output layer covers only these tokens (q is 0 elsewhere)."""
        self.kv = KVBatch(model)
        self.head = None if head_token_ids is None else torch.tensor(head_token_ids, device=self.kv.device)
        self.vocab_size = vocab_size or model.config.vocab_size
        self.pending: list[list[int]] = []  # per row: tokens emitted but not yet fed to the draft model
        self._fed = torch.zeros(0, dtype=torch.long)  # [rows] pending tokens fed in this step's first forward

    def begin(self) -> None:
        """Drop the rows an interrupted call left behind (a finished call has kept none): the state a call that
        ran to its end leaves, cache buffers and output head kept for this one."""
        self.keep_rows([])

    def admit(self, prefixes: list[list[int]], copies: list[int], rows, target=None) -> None:
        self.kv.admit(prefixes, copies)
        self.pending.extend([] for _ in range(sum(copies)))

    def keep_rows(self, index: list[int]) -> None:
        self.kv.keep_rows(index)
        self.pending = [self.pending[i] for i in index]

    @torch.no_grad()
    def catch_up(self) -> None:
        """Feed the tokens emitted during steps without drafts (all pending tokens) in one forward."""
        counts = [len(p) for p in self.pending]
        if not any(counts):
            return
        width = max(counts)
        ids = torch.zeros(len(counts), width, dtype=torch.long)  # [rows, width] left-aligned
        valid = torch.zeros(len(counts), width, dtype=torch.bool)  # [rows, width]
        for i, p in enumerate(self.pending):
            ids[i, :len(p)] = torch.tensor(p, dtype=torch.long)
            valid[i, :len(p)] = True
        self.kv.forward(ids.to(self.kv.device), valid.to(self.kv.device), logits_to_keep=1)
        self.kv.commit(torch.tensor(counts, device=self.kv.device))
        self.pending = [[] for _ in self.pending]

    @torch.no_grad()
    def propose(self, last: torch.Tensor, gammas: torch.Tensor, uniforms: torch.Tensor, sampling, rows):
        """last [rows], gammas [rows], uniforms [rows, G] -> (tokens [rows, G], q [rows, G, vocab], gammas)."""
        gamma = int(gammas.max())
        feed = [p + [t] for p, t in zip(self.pending, last.tolist())]
        width = max(len(f) for f in feed)
        first = torch.zeros(len(feed), width, dtype=torch.long)  # [rows, width] right-aligned
        valid = torch.zeros(len(feed), width, dtype=torch.bool)  # [rows, width]
        for i, f in enumerate(feed):
            first[i, width - len(f):] = torch.tensor(f)
            valid[i, width - len(f):] = True
        self._fed = valid.long().sum(1).to(last.device)
        logits = self.kv.forward(first.to(last.device), valid.to(last.device), logits_to_keep=1)[:, -1]
        tokens, probs = [], []
        for i in range(gamma):
            x, q = _sample_drafts(logits, uniforms[:, i], sampling, self.head, self.vocab_size)
            tokens.append(x)
            probs.append(q)
            if i + 1 < gamma:  # only rows that draft another token feed this one
                logits = self.kv.forward(x[:, None], (gammas > i + 1)[:, None], logits_to_keep=1)[:, -1]
        return torch.stack(tokens, 1), torch.stack(probs, 1), gammas.clone()

    def after_step(self, draft_tokens, num_drafts, num_accepted, emitted: list[list[int]], rows, fed_last) -> None:
        if draft_tokens is None:  # no speculation this step: the token the policy consumed waits for the draft
            for pending, token in zip(self.pending, fed_last.tolist()):
                pending.append(token)
            return
        # row r's cache now holds: the fed tokens (pending + last), then its drafts d1..d(n_r - 1)
        fed_drafts = (num_drafts - 1).clamp(min=0)  # [rows]
        self.kv.commit(self._fed + torch.minimum(num_accepted, fed_drafts))
        self.kv.refresh_length_bound()  # its cache rows keep what was accepted: the bound is exact again
        all_accepted = (num_drafts > 0) & (num_accepted >= num_drafts)  # [rows] its last draft was never fed
        carried = draft_tokens.gather(1, fed_drafts[:, None])[:, 0].tolist()
        self.pending = [[carried[i]] if bool(a) else [] for i, a in enumerate(all_accepted.tolist())]


class NgramDraft:
    reads_emitted = True  # after_step indexes the tokens each row emitted (the sampler brings them to the host)

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"draft.min_ngram={min_ngram}, draft.max_ngram={max_ngram}: need 1 <= min <= max")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.sequences: dict[tuple, list[int]] = {}  # (group, member) -> tokens; member -1 = the prompt
        self.index: dict[int, dict[tuple, list[tuple]]] = defaultdict(lambda: defaultdict(list))

    def begin(self) -> None:
        """Forget the earlier call's prompts and completions: they are keyed by the call's own prompt numbers
        (row.group), so prompt 0 of the next shard would otherwise extend the last shard's prompt 0, never be
        indexed itself, and be drafted from another prompt's text (exact still, but rarely accepted), and the
        index would grow with every shard."""
        self.sequences.clear()
        self.index.clear()

    def _extend(self, group: int, member: int, new_tokens: list[int]) -> None:
        seq = self.sequences.setdefault((group, member), [])
        table = self.index[group]
        for token in new_tokens:
            seq.append(token)
            end = len(seq)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                hits = table[tuple(seq[end - n:end])]
                hits.append((member, end))  # continuation starts at seq[end]
                if len(hits) > 4:
                    del hits[0]

    def admit(self, prefixes: list[list[int]], copies: list[int], rows, target=None) -> None:
        for row in rows:
            if (row.group, -1) not in self.sequences:
                self._extend(row.group, -1, row.prompt_ids)
            # a row's own sequence starts with the prompt's tail so boundary n-grams are indexed
            self._extend(row.group, row.member, row.prompt_ids[-(self.max_ngram - 1):] if self.max_ngram > 1 else [])

    def keep_rows(self, index: list[int]) -> None:
        pass  # finished rows stay in the index: their completions are good material for siblings

    def _lookup(self, row, gamma: int) -> list[int]:
        """The continuation after the longest matching suffix; among its (up to 4) occurrences, one
        whose next token most of them agree on, the most recent on ties."""
        context = self.sequences[(row.group, row.member)]
        table = self.index[row.group]
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            continuations = [self.sequences[(row.group, member)][start:start + gamma]
                             for member, start in table.get(tuple(context[-n:]), ())]
            continuations = [c for c in continuations if c]
            if continuations:
                votes = Counter(c[0] for c in continuations)
                return max(reversed(continuations), key=lambda c: votes[c[0]])
        return []

    def catch_up(self) -> None:
        pass  # after_step indexes every emitted token, drafting or not

    def propose(self, last: torch.Tensor, gammas: torch.Tensor, uniforms: torch.Tensor, sampling, rows):
        gamma = int(gammas.max())
        tokens = torch.zeros(len(rows), gamma, dtype=torch.long)  # [rows, gamma]
        num = torch.zeros(len(rows), dtype=torch.long)  # [rows]
        for i, (row, cap) in enumerate(zip(rows, gammas.tolist())):
            proposal = self._lookup(row, cap) if cap else []
            tokens[i, :len(proposal)] = torch.tensor(proposal, dtype=torch.long)
            num[i] = len(proposal)
        return tokens.to(last.device), None, num.to(last.device)

    def after_step(self, draft_tokens, num_drafts, num_accepted, emitted: list[list[int]], rows, fed_last) -> None:
        for row, tokens in zip(rows, emitted):
            self._extend(row.group, row.member, tokens)



class FeatureDraft:
    """EAGLE's draft: proposes from the policy's own last-layer features (rsft.sampling.feature_model).

    Its entry t pairs token t with the policy's feature at t - 1, which the policy's KVBatch keeps
    (`keep_features=True`: the sampler asks for it through `needs_policy_features`) from the same
    packed forward that verified the tokens. Each step it first feeds the entries the policy has
    completed since the last step (1 + the drafts accepted, up to the row's `last` token, whose
    entry needs only the feature of the position before it), then drafts one token at a time,
    feeding its own predicted feature ĥ in place of the policy's (entry t+1 = (ĥ_t, d_1), ...).

    Its own state is a small KV cache (a KVBatch over its one decoder layer, same positions as the
    policy's), not a recomputation: with the cache each step costs 1 + gamma draft entries per row;
    recomputing the layer over the whole context would cost the context's length every step (the
    prompt alone is 30-100 tokens here). After verification it keeps only the entries built from
    the policy's true features (`commit(fed)`); the drafted entries, built from its own
    predictions, are overwritten next step by the true ones. After steps without drafts it does
    nothing: `catch_up` (or the next proposal) feeds the missed entries from the policy's cache in
    one forward. A prompt's prefix is prefilled once and copied to its K rows, as for the policy.
    """

    needs_policy_features = True

    def __init__(self, model):
        self.model = model
        self.kv = KVBatch(model, keep_features=True)
        self.head = None if model.head_token_ids is None else torch.tensor(model.head_token_ids, device=self.kv.device)
        self.vocab_size = model.vocab_size
        self.target = None  # the policy's KVBatch (set at admission)
        self._fed = torch.zeros(0, dtype=torch.long)  # [rows] true entries fed in this step's first forward

    def begin(self) -> None:
        """Drop the rows an interrupted call left behind, as ModelDraft.begin does."""
        self.keep_rows([])

    def admit(self, prefixes: list[list[int]], copies: list[int], rows, target) -> None:
        if not target.keep_features:
            raise ValueError("FeatureDraft needs the policy's KVBatch built with keep_features=True")
        self.target = target

        def prefix_features(keys: list[list[int]]) -> dict[str, torch.Tensor]:
            """Entry t of a prefix: the policy's feature at t - 1 (zeros for t = 0) -> [sum of lengths, hidden]."""
            out = []
            for key in keys:
                held = target.features[target.holder(key), :len(key)]  # [len, hidden]
                out.append(torch.cat([torch.zeros_like(held[:1]), held[:-1]]))
            return {"features": torch.cat(out)}

        self.kv.admit(prefixes, copies, prefill_inputs=prefix_features)

    def keep_rows(self, index: list[int]) -> None:
        self.kv.keep_rows(index)

    def _entries(self, last: torch.Tensor | None):
        """The entries the policy has completed and the draft has not fed, up to `last`'s (or the one
        before it when last is None): (ids [rows, n], features [rows, n, hidden], valid [rows, n])."""
        target, device = self.target, self.kv.device
        start = self.kv.length[self.kv.slot]  # [rows] entries the draft holds
        end = target.length[target.slot] - (1 if last is None else 0)  # [rows] last entry to feed
        count = (end - start + 1).clamp(min=0)  # [rows]
        width = max(int(count.max()), 1)
        position = start[:, None] + torch.arange(width, device=device)[None, :]  # [rows, n]
        valid = position <= end[:, None]  # [rows, n]
        at = torch.minimum(position, (target.length[target.slot] - 1).clamp(min=0)[:, None])  # [rows, n] in range
        buffer_row = target.slot[:, None]  # [rows, 1]
        ids = target.tokens[buffer_row, at]  # [rows, n]
        if last is not None:  # `last` is not in the policy's cache yet: it sits at position length
            ids = torch.where(position == target.length[target.slot][:, None], last[:, None], ids)
        features = target.features[buffer_row, (position - 1).clamp(min=0).clamp(max=target.capacity - 1)]
        features = features * (position > 0)[..., None]  # [rows, n, hidden]; entry 0 has no feature before it
        return ids, features, valid

    def _last_feature(self) -> torch.Tensor:
        """ĥ at each row's newest entry -> [rows, hidden]."""
        return self.kv.features[self.kv.slot, self.kv.length[self.kv.slot] - 1]

    @torch.no_grad()
    def catch_up(self) -> None:
        ids, features, valid = self._entries(last=None)
        if valid.any():
            self.kv.forward(ids, valid, logits_to_keep=1, features=features)
            self.kv.commit(valid.long().sum(1))

    @torch.no_grad()
    def propose(self, last: torch.Tensor, gammas: torch.Tensor, uniforms: torch.Tensor, sampling, rows):
        """last [rows], gammas [rows], uniforms [rows, G] -> (tokens [rows, G], q [rows, G, vocab], gammas)."""
        gamma = int(gammas.max())
        ids, features, valid = self._entries(last)
        self._fed = valid.long().sum(1)  # [rows]
        logits = self.kv.forward(ids, valid, logits_to_keep=1, features=features)[:, -1]  # [rows, head]
        tokens, probs = [], []
        for i in range(gamma):
            x, q = _sample_drafts(logits, uniforms[:, i], sampling, self.head, self.vocab_size)
            tokens.append(x)
            probs.append(q)
            if i + 1 < gamma:  # entry (ĥ, d_i) for the rows that draft another token
                more = (gammas > i + 1)[:, None]  # [rows, 1]
                logits = self.kv.forward(x[:, None], more, logits_to_keep=1,
                                         features=self._last_feature()[:, None])[:, -1]
        return torch.stack(tokens, 1), torch.stack(probs, 1), gammas.clone()

    def after_step(self, draft_tokens, num_drafts, num_accepted, emitted: list[list[int]], rows, fed_last) -> None:
        if draft_tokens is not None:  # keep the entries built from the policy's features, drop the drafted ones
            self.kv.commit(self._fed)
            self.kv.refresh_length_bound()
