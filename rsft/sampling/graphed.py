"""The plain step at a fixed shape, replayed as a CUDA graph.

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
one token each (`KVBatch.forward_every_row`), with attention over the whole capacity, masked per row.
A free row computes a token nobody reads, at its own length clamped into the buffer (past its prefix,
so a sibling admitted later still finds the prefix intact). The graph holds the policy forward, the
processed distribution (temperature, top-k, top-p, in place), the row's keyed uniform and the draw,
all in static tensors; the sampler copies each running row's inputs into them (by buffer row) before
a replay and reads the tokens back by buffer row after it.

Exactness and invariance: the arithmetic is the plain step's own (the same processing, the same
keyed uniform from (completion key, tokens emitted), the same two-level inverse CDF), so a
completion's tokens are a function of its key and its own prefix as before. The one caveat is the
one the packed step has: the forward's float sums depend on the batch's shape (here, the buffer's
row count), so a draw within rounding of a boundary can differ from a packed step's
(tests/sampling/test_graphed.py checks the tokens against the packed step, and the chi-square tests
run through this step). `mode="eager"` runs the same fixed-shape step without capturing it: on a CPU
that is how the tests check its arithmetic, and anywhere it is the fallback to compare against.

A graph belongs to one cache: the batch's buffers (their addresses) and its row count. The sampler
makes one per generate() call, after `KVBatch.reserve`; capturing costs three forwards (two warm-up
runs on a side stream, as torch requires, and the capture), paid once per call.
"""

from __future__ import annotations

import torch

from rsft.sampling.keyed_random import keyed_uniforms
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.processing import probs_from_logits, sample_from_probs

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


class FixedShapePlainStep:
    """One plain step for every buffer row of `batch`: token, finite flag and (record_entropy) entropy,
    by buffer row; captured as a CUDA graph when `capture`."""

    def __init__(self, batch: KVBatch, temperature: float, top_k: int, top_p: float, greedy: bool,
                 record_entropy: bool, capture: bool):
        self.batch, self.capture = batch, capture
        self.temperature, self.top_k, self.top_p, self.greedy = temperature, top_k, top_p, greedy
        self.record_entropy = record_entropy
        rows, device = batch.buffer_rows, batch.device
        long = dict(dtype=torch.long, device=device)
        # the graph's inputs, by buffer row: the token fed, its position, the row's key and its counter
        self.tokens = torch.zeros(rows, **long)  # [B]
        self.positions = torch.zeros(rows, **long)  # [B]
        self.keys = torch.zeros(rows, 2, **long)  # [B, 2]
        self.counters = torch.zeros(rows, **long)  # [B]
        self.outputs: tuple[torch.Tensor, ...] | None = None  # the graph's outputs (static once captured)
        self.graph = None
        self.replays = 0
        self.layout = self._layout()

    def _layout(self) -> tuple:
        """What a captured graph is bound to: the cache buffers' addresses, its rows and its capacity."""
        b = self.batch
        return b.buffer_rows, b.capacity, tuple(t.data_ptr() for t in b.keys + b.values)

    def fits(self) -> bool:
        """False once the batch grew its cache (an admission past the reserved rows): make a new step."""
        return self._layout() == self.layout

    def _compute(self) -> tuple[torch.Tensor, ...]:
        """-> token [B], finite [B] (the row's logits are), entropy [B] (zeros without record_entropy): device
        work only."""
        logits = self.batch.forward_every_row(self.tokens, self.positions)  # [B, vocab] model dtype
        finite = torch.isfinite(logits).all(-1)  # [B]
        if self.greedy:
            token = logits.argmax(-1)  # [B] the first on ties, as greedy_probs' one-hot gives
            entropy = torch.zeros(token.shape, dtype=torch.float32, device=token.device)  # [B] a point mass
            return token, finite, entropy
        # the logits are this step's own: processed in place (a float32 copy first for other dtypes)
        probs = probs_from_logits(logits.float(), self.temperature, self.top_k, self.top_p, in_place=True)
        uniforms = keyed_uniforms(self.keys, self.counters, 1)[:, 0]  # [B] slot 0: the emitted token's draw
        token = sample_from_probs(probs, uniforms)  # [B]
        if self.record_entropy:
            entropy = -torch.special.xlogy(probs, probs).sum(-1)  # [B]
        else:
            entropy = torch.zeros(token.shape, dtype=torch.float32, device=token.device)  # [B]
        return token, finite, entropy

    def _captured(self) -> tuple[torch.Tensor, ...]:
        """Warm up on a side stream (torch's rule for capture), record the graph, and replay it."""
        side = torch.cuda.Stream(self.batch.device)
        side.wait_stream(torch.cuda.current_stream(self.batch.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._compute()
        torch.cuda.current_stream(self.batch.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = self._compute()
        self.graph.replay()
        return self.outputs

    @torch.no_grad()
    def run(self, slot: torch.Tensor, last: torch.Tensor, keys: torch.Tensor, emitted: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The running rows' inputs by caller row (slot [rows]: their buffer rows; last, emitted [rows],
        keys [rows, 2]) -> their token [rows], finite [rows] (their logits are) and entropy [rows].
        Advances nothing: the caller moves the cache's lengths and its row state."""
        batch = self.batch
        self.tokens.index_copy_(0, slot, last)
        self.keys.index_copy_(0, slot, keys)
        self.counters.index_copy_(0, slot, emitted)
        # a running row's length is inside the buffer (reserve sized it); a free row's is clamped into it
        torch.clamp(batch.length, max=batch.capacity - 1, out=self.positions)
        if not self.capture:
            token, finite, entropy = self._compute()
        elif self.graph is None:
            token, finite, entropy = self._captured()
        else:
            self.graph.replay()
            token, finite, entropy = self.outputs
        self.replays += 1
        return token[slot], finite[slot], entropy[slot]


def fixed_shape_step(batch: KVBatch, mode: str, temperature: float, top_k: int, top_p: float, greedy: bool,
                     record_entropy: bool) -> FixedShapePlainStep | None:
    """The fixed-shape plain step for this batch under sample.cuda_graphs=`mode`, or None (the packed step)."""
    use, capture = graphs_apply(mode, batch.device, batch.keep_features)
    if not use:
        return None
    return FixedShapePlainStep(batch, temperature, top_k, top_p, greedy, record_entropy, capture)

