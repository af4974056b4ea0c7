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
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.processing import greedy_probs, probs_from_logits, sample_from_probs


class ModelDraft:
    def __init__(self, model, head_token_ids: list[int] | None = None, vocab_size: int | None = None):
        """head_token_ids: the draft's output layer covers only these tokens (q is 0 elsewhere)."""
        self.kv = KVBatch(model)
        self.head = None if head_token_ids is None else torch.tensor(head_token_ids, device=self.kv.device)
        self.vocab_size = vocab_size or model.config.vocab_size
        self.pending: list[list[int]] = []  # per row: tokens emitted but not yet fed to the draft model
        self._fed = torch.zeros(0, dtype=torch.long)  # [rows] pending tokens fed in this step's first forward

    def admit(self, prefixes: list[list[int]], copies: list[int], rows) -> None:
        self.kv.admit(prefixes, copies)
        self.pending.extend([] for _ in range(sum(copies)))

    def keep_rows(self, index: torch.Tensor) -> None:
        self.kv.keep_rows(index)
        self.pending = [self.pending[i] for i in index.tolist()]

    @torch.no_grad()
    def propose(self, last: torch.Tensor, gamma: int, uniforms: torch.Tensor, sampling, rows):
        """last [rows], uniforms [rows, gamma] -> (tokens [rows, gamma], q [rows, gamma, vocab], num [rows])."""
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
            if sampling.strategy == "greedy":
                q = greedy_probs(logits)  # [rows, head or vocab]
                x = q.argmax(-1)  # [rows]
            else:
                q = probs_from_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
                x = sample_from_probs(q, uniforms[:, i])
            if self.head is not None:  # back to vocabulary ids; q is zero off the head
                full = torch.zeros(q.shape[0], self.vocab_size, dtype=q.dtype, device=q.device)  # [rows, vocab]
                q = full.index_copy_(1, self.head, q)
                x = self.head[x]
            tokens.append(x)
            probs.append(q)
            if i + 1 < gamma:
                logits = self.kv.forward(x[:, None])[:, -1]
        return torch.stack(tokens, 1), torch.stack(probs, 1), torch.full_like(last, gamma)

    def after_step(self, draft_tokens, num_accepted, emitted: list[list[int]], rows, fed_last) -> None:
        if draft_tokens is None:  # no speculation this step: the token the policy consumed waits for the draft
            for pending, token in zip(self.pending, fed_last.tolist()):
                pending.append(token)
            return
        gamma = draft_tokens.shape[1]
        # cache now holds: the fed tokens (pending + last), then drafts d1..d(gamma-1)
        self.kv.commit(self._fed + num_accepted.clamp(max=gamma - 1))
        carried = draft_tokens[:, -1].tolist()
        self.pending = [[carried[i]] if int(n) >= gamma else [] for i, n in enumerate(num_accepted.tolist())]


class NgramDraft:
    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"draft.min_ngram={min_ngram}, draft.max_ngram={max_ngram}: need 1 <= min <= max")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.sequences: dict[tuple, list[int]] = {}  # (group, member) -> tokens; member -1 = the prompt
        self.index: dict[int, dict[tuple, list[tuple]]] = defaultdict(lambda: defaultdict(list))

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

    def admit(self, prefixes: list[list[int]], copies: list[int], rows) -> None:
        for row in rows:
            if (row.group, -1) not in self.sequences:
                self._extend(row.group, -1, row.prompt_ids)
            # a row's own sequence starts with the prompt's tail so boundary n-grams are indexed
            self._extend(row.group, row.member, row.prompt_ids[-(self.max_ngram - 1):] if self.max_ngram > 1 else [])

    def keep_rows(self, index: torch.Tensor) -> None:
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

    def propose(self, last: torch.Tensor, gamma: int, uniforms: torch.Tensor, sampling, rows):
        tokens = torch.zeros(len(rows), gamma, dtype=torch.long)  # [rows, gamma]
        num = torch.zeros(len(rows), dtype=torch.long)  # [rows]
        for i, row in enumerate(rows):
            proposal = self._lookup(row, gamma)
            tokens[i, :len(proposal)] = torch.tensor(proposal, dtype=torch.long)
            num[i] = len(proposal)
        return tokens.to(last.device), None, num.to(last.device)

    def after_step(self, draft_tokens, num_accepted, emitted: list[list[int]], rows, fed_last) -> None:
        for row, tokens in zip(rows, emitted):
            self._extend(row.group, row.member, tokens)

