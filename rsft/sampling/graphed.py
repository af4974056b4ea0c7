"""The sampler's step at a fixed shape, replayed as a CUDA graph: plain steps and verification steps.

Why: on a GPU a plain decode step of a small policy is launch-bound, not arithmetic-bound. A Llama
forward issues about forty kernels a layer from Python (norms, projections, RoPE, the cache write,
attention, the MLP), over a thousand a step for a 30-layer model, and the host spends longer
issuing them than the card spends running them: the step cost the same for a 135M and a 1.5B policy
(issue 44's H200 table). A CUDA graph records the step's kernels once and replays them with one
launch. torch gives the mechanism (`torch.cuda.CUDAGraph`); what it needs from the caller is a step
whose shapes and memory addresses never change and which never reads the device, and that is what
this module builds. HF's own route (StaticCache + torch.compile) does not apply: rsft's cache is
per row (rows finish and are refilled, each at its own length; rsft.sampling.kv_batch), and a
compile of the model per shape costs minutes a run.

The fixed shape: every buffer row of the batch's cache runs, whether a completion holds it or not,
n = 1 + gamma tokens each (`KVBatch.forward_every_row`: the row's last token and its drafts; n = 1 for a
plain step), with attention over the whole capacity, masked per row. A free row computes tokens nobody
reads, at its own length clamped into the buffer (past its prefix, so a sibling admitted later still
finds the prefix intact). The graph holds the policy forward, the processed distribution (temperature,
top-k, top-p, in place), the rows' keyed uniforms and the verifier (rsft.sampling.verifier.verify; at
gamma 0 it is the plain draw from p), all in static tensors; the sampler copies each running row's
inputs into them (by buffer row) before a replay and takes the results back by buffer row after it.
Each width n, with or without the draft's probabilities (a model draft has them, the n-gram and oracle
drafts are one-hot), is its own graph, captured the first time that step runs.

Exactness and invariance: the arithmetic is the plain step's own (the same processing, the same
keyed uniform from (completion key, tokens emitted), the same two-level inverse CDF), so a
completion's tokens are a function of its key and its own prefix as before. The one caveat is the
one the packed step has: the forward's float sums depend on the batch's shape (here, the buffer's
row count), so a draw within rounding of a boundary can differ from a packed step's
(tests/sampling/test_graphed.py checks the tokens against the packed step, and the chi-square tests
run through this step). `mode="eager"` runs the same fixed-shape step without capturing it: on a CPU
that is how the tests check its arithmetic, and anywhere it is the fallback to compare against.

A graph belongs to one cache: the batch's buffers (their addresses) and its row count. The sampler
makes the steps once per generate() call, after `KVBatch.reserve`; capturing costs three forwards (two
warm-up runs on a side stream, as torch requires, and the capture), paid once per call and width.
"""

from __future__ import annotations

import time

import torch

from rsft.sampling.keyed_random import keyed_uniforms
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.processing import greedy_probs, probs_from_logits
from rsft.sampling.verifier import VerifyResult, verify

MODES = ("auto", "eager", "off")  # sample.cuda_graphs


def graphs_apply(mode: str, device: torch.device, keep_features: bool) -> tuple[bool, bool]:
    """(use the fixed-shape step, capture it as a graph) for sample.cuda_graphs=`mode` on `device`.
    auto: the graph on CUDA, the packed step elsewhere; eager: the fixed-shape step uncaptured; off: the
    packed step. A batch that records features for a feature draft always takes the packed step."""
    if mode not in MODES:
        raise ValueError(f"sample.cuda_graphs={mode!r}: expected one of {', '.join(MODES)}")
    if keep_features or mode == "off":
        return False, False
    if mode == "eager":
        return True, False
    return device.type == "cuda", device.type == "cuda"


class _Graph:
    """One width's static inputs (by buffer row), its outputs and its CUDA graph (None until captured)."""

    def __init__(self, rows: int, width: int, vocab: int, with_q: bool, device: torch.device):
        long = dict(dtype=torch.long, device=device)
        self.tokens = torch.zeros(rows, width, **long)  # [B, n] the token each row feeds, then its drafts
        self.positions = torch.zeros(rows, **long)  # [B] where the row's first token goes
        self.keys = torch.zeros(rows, 2, **long)  # [B, 2] the row's Philox key
        self.counters = torch.zeros(rows, **long)  # [B] tokens it emitted: its uniforms' counter
        self.num_drafts = torch.zeros(rows, **long)  # [B]
        self.q = torch.zeros(rows, width - 1, vocab, device=device) if with_q else None  # [B, gamma, vocab]
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.graph = None


class FixedShapeStep:
    """The sampler's step for every buffer row of `batch` at a fixed shape; captured as CUDA graphs when `capture`."""

    def __init__(self, batch: KVBatch, temperature: float, top_k: int, top_p: float, strategy: str, leniency: float,
                 record_entropy: bool, capture: bool):
        self.batch, self.capture = batch, capture
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.strategy, self.leniency, self.record_entropy = strategy, leniency, record_entropy
        self.graphs: dict[tuple[int, bool], _Graph] = {}  # (width, with draft probabilities) -> its graph
        self.replays = 0  # steps run
        self.captured = 0  # graphs captured and released
        self.capture_seconds = 0.0  # wall time of the captures (their warm-ups included), synchronised
        self.allocation = batch.allocations  # a captured graph is bound to these buffers' addresses and shapes

    def fits(self) -> bool:
        """False once the batch grew its cache (an admission past the reserved rows): make a new step."""
        return self.batch.allocations == self.allocation

    def release(self) -> None:
        """Free the graphs and their memory pools (the logits of every width stay allocated in them otherwise); the
        counts stay. The sampler calls it when generate() returns."""
        self.captured += sum(g.graph is not None for g in self.graphs.values())
        self.graphs = {}

    def _compute(self, g: _Graph) -> tuple[torch.Tensor, ...]:
        """Device work only: -> num_accepted [B], tokens [B, n], kinds [B, n], num_emitted [B], finite [B] (the
        row's logits are), entropy [B, n] (zeros without record_entropy)."""
        width = g.tokens.shape[1]
        gamma = width - 1
        logits = self.batch.forward_every_row(g.tokens, g.positions)  # [B, n, vocab] model dtype
        finite = torch.isfinite(logits).all(-1).all(-1)  # [B]
        if self.strategy == "greedy":
            probs = greedy_probs(logits)  # [B, n, vocab]
        else:  # the logits are this step's own: processed in place (a float32 copy first for other dtypes)
            probs = probs_from_logits(logits.float(), self.temperature, self.top_k, self.top_p, in_place=True)
        # slot 0: the emitted token's draw; slot 2 + 2j: draft j's acceptance test (the sampler's layout)
        uniforms = keyed_uniforms(g.keys, g.counters, 2 * gamma + 1)  # [B, 2 gamma + 1]
        result = verify(g.tokens[:, 1:], g.q, probs, uniforms[:, 2::2], uniforms[:, 0], num_drafts=g.num_drafts,
                        strategy=self.strategy, leniency=self.leniency, checked=False)
        if self.record_entropy:
            entropy = -torch.special.xlogy(probs, probs).sum(-1)  # [B, n]
        else:
            entropy = torch.zeros(g.tokens.shape, dtype=torch.float32, device=g.tokens.device)  # [B, n]
        return result.num_accepted, result.tokens, result.kinds, result.num_emitted, finite, entropy

    def _captured(self, g: _Graph) -> tuple[torch.Tensor, ...]:
        """Warm up on a side stream (torch's rule for capture), record the graph, and replay it."""
        device = self.batch.device
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._compute(g)
        torch.cuda.current_stream(device).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph):
            g.outputs = self._compute(g)
        g.graph.replay()
        torch.cuda.synchronize(device)
        self.capture_seconds += time.perf_counter() - started
        return g.outputs

    @torch.no_grad()
    def run(self, slot: torch.Tensor, inputs: torch.Tensor, draft_probs: torch.Tensor | None,
            num_drafts: torch.Tensor, keys: torch.Tensor, emitted: torch.Tensor
            ) -> tuple[VerifyResult, torch.Tensor, torch.Tensor]:
        """The running rows, by caller row: slot [rows] their buffer rows; inputs [rows, n] the token each feeds
        and its drafts; draft_probs [rows, n - 1, vocab] or None (one-hot drafts); num_drafts, emitted [rows];
        keys [rows, 2] -> (their verification result, finite [rows], entropy [rows, n]). Moves nothing: the
        caller advances the cache's lengths (by n) and commits what was accepted."""
        batch = self.batch
        width = inputs.shape[1]
        key = (width, draft_probs is not None)
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = _Graph(batch.buffer_rows, width, batch.vocab_size, draft_probs is not None,
                                          batch.device)
        g.tokens.index_copy_(0, slot, inputs)
        g.keys.index_copy_(0, slot, keys)
        g.counters.index_copy_(0, slot, emitted)
        g.num_drafts.index_copy_(0, slot, num_drafts)
        if g.q is not None:
            g.q.index_copy_(0, slot, draft_probs.float())
        # a running row's tokens fit in the buffer (reserve sized it for the budget and gamma); a free row's
        # are kept inside it (the forward writes its n tokens at positions + 0 .. n - 1)
        torch.clamp(batch.length, max=batch.capacity - width, out=g.positions)
        if not self.capture:
            outputs = self._compute(g)
        elif g.graph is None:
            outputs = self._captured(g)
        else:
            g.graph.replay()
            outputs = g.outputs
        self.replays += 1
        num_accepted, tokens, kinds, num_emitted, finite, entropy = (t[slot] for t in outputs)
        return VerifyResult(num_accepted=num_accepted, tokens=tokens, kinds=kinds, num_emitted=num_emitted), finite, entropy


def fixed_shape_step(batch: KVBatch, mode: str, temperature: float, top_k: int, top_p: float, strategy: str,
                     leniency: float, record_entropy: bool) -> FixedShapeStep | None:
    """The fixed-shape step for this batch under sample.cuda_graphs=`mode`, or None (the packed step)."""
    use, capture = graphs_apply(mode, batch.device, batch.keep_features)
    if not use:
        return None
    return FixedShapeStep(batch, temperature, top_k, top_p, strategy, leniency, record_entropy, capture)
