"""The batched sampler: K completions for each of P prompts, plain or speculative, exact.

One loop serves both. Each step, every running row has a `last` token (emitted, not yet in the
policy's cache). With a draft, the draft proposes up to gamma tokens per row; the policy runs one
forward over [last, d1..d_gamma] (rows with fewer drafts mask the rest) and the verifier
(rsft.sampling.verifier) accepts a prefix of the drafts and emits one more token, so each row gains
1..gamma+1 tokens. Without a draft (or when the gamma controller says speculation does not pay),
gamma is 0 and the step is plain sampling: one forward, one token from p.

Batch management (rsft.sampling.kv_batch): at most `batch_rows` rows run at once; a row leaves as
soon as it emits EOS or reaches max_new_tokens and the next waiting completion takes its place; a
prompt's rows are admitted together where they fit and share one prefill of the prompt. The cache is
allocated once, for batch_rows rows of the longest prompt plus the budget, and a finished row's cache
row is handed to the next completion in place.

Host and device: every row's state (its key, tokens kept, count, next input, counters) lives in
tensors on the batch's device (`_RowState`), and a plain step reads the device once, at its end:
which rows finished, the cache's longest row and the step's counts, packed in one tensor; the
tokens of the rows that finished come in one more read on the steps where some did. Logits are
checked (finite) inside that read and rows are named only when the check fails. A speculative step
reads more: the drafts' own bookkeeping, and on a CPU the widest draft (so that the packed forward
verifies no empty position); on an accelerator the verification runs the fixed [rows, 1 + gamma]
shape, padding included.

Randomness: every completion has its own key, its 63-bit seed from (seed, prompt index, sample
index), and every uniform it consumes is a keyed, counter-based function of (key, tokens it has
emitted before the step, slot) (rsft.sampling.keyed_random, Philox4x32-10), computed for all rows in
one vectorised call on the batch's device: slot 0 is the emitted token's draw, slot 1 + 2j draft j's
sample, slot 2 + 2j its acceptance test. A step emits at least one token, so no uniform is used twice,
and what a row draws depends only on its own key, position and its own gamma g_r, which is the step's
gamma capped by the row's *own* remaining budget (never the batch's longest). So:
- plain sampling, and a model draft (`ModelDraft`, distilled) or a feature draft (`FeatureDraft`)
  at a fixed gamma: a completion's tokens do not depend on which rows share its batch; the same
  seed gives the same completions at any batch_rows (tests: batch_rows 1, 3 and 8). The one caveat
  is float rounding: the packed forward's sums depend on the batch's shape, so a draw that falls
  within rounding of a boundary can flip (measured: docs/benchmarks.md#scaling-over-processes).
- the n-gram draft: not batch-invariant. It looks up the sibling completions sampled so far, and
  how far a sibling has got depends on which rows ran together, so the proposals (and with them
  which uniforms decide what) differ with batch_rows. Every completion is still an exact sample.
- adaptive gamma (`draft.adaptive=true`): not reproducible token for token on a real machine. The
  gamma of a step follows measured time (the wall clock, or the `clock` a caller injects), and the
  gamma changes how many uniforms each row draws. Again every completion is an exact sample: the
  verifier's guarantee holds for any gamma chosen from the past.

Adaptive gamma (`GammaController`): a row that drafts g tokens gains a + a^2 + ... + a^g tokens
per policy forward for acceptance rate a (Leviathan et al. 2022), but on a CPU every verified
token costs compute. The controller measures the acceptance rate, the fraction of the g draft
slots the draft actually fills (the n-gram draft proposes only where it finds a match; the packed
forward charges only for real tokens), and the time of policy forwards per width and of draft
proposals, and picks the g in 0..gamma_max with the highest expected tokens per second; g = 0
means "do not speculate". Its first step is plain, so the cost of every wider forward is measured
against a measured plain one from the start: the prior slope (0.3 of a step per extra position)
fits a CPU at moderate row counts but not at many rows, where a verified position costs more and
speculating on the prior alone ran slower than plain (measured costs:
docs/benchmarks.md#the-adaptive-controllers-first-plain-step). It re-probes neighbouring values now
and then so its estimates stay current. After steps at g = 0 a model or feature draft is behind: it has not
seen the tokens the policy emitted meanwhile. Feeding them (`draft.catch_up()`, one forward) is timed on its own
(`draft_catch_up_seconds`) and not charged to the draft tokens: it is what switching back costs,
once, not what drafting costs per token, and charging it to the probe step made a probe after 16
plain steps look ~16 tokens' worth too dear, which kept gamma at 0 for good. Time comes from
`clock` (default `time.perf_counter`; the tests inject a simulated clock and costs).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rsft.sampling.budget import PRUNED, PruneSchedule, rows_to_stop, scored_tokens
from rsft.sampling.graphed import MODES as GRAPH_MODES
from rsft.sampling.graphed import FixedShapeStep, fixed_shape_step
from rsft.sampling.keyed_random import key_words, keyed_uniforms
from rsft.sampling.kv_batch import KVBatch
from rsft.sampling.processing import check_finite, check_sampling_settings, greedy_probs, probs_from_logits
from rsft.sampling.verifier import AcceptanceStats, AcceptanceTally, check_gamma, check_strategy, verify


@dataclass
class SamplingSettings:
    """Plain settings (rsft.generation.sampling_settings builds them from conf/sample and conf/draft).
    What has no neutral value is required; the defaults are the "off" values (no top-k / top-p,
    exact verification, no draft), never a second copy of the config's."""

    max_new_tokens: int
    temperature: float
    batch_rows: int
    top_k: int = 0
    top_p: float = 1.0
    strategy: str = "exact"
    leniency: float = 1.0
    gamma: int = 0
    adaptive: bool = False
    cuda_graphs: str = "auto"  # plain steps as a replayed CUDA graph where the device is CUDA (rsft.sampling.graphed)

    def check(self) -> None:
        check_sampling_settings(self.temperature, self.top_k, self.top_p, self.strategy)
        check_strategy(self.strategy, self.leniency)
        if self.max_new_tokens < 1:
            raise ValueError(f"sample.max_new_tokens={self.max_new_tokens}: expected >= 1")
        if self.batch_rows < 1:
            raise ValueError(f"sample.batch_rows={self.batch_rows}: expected >= 1")
        if self.gamma != 0:
            check_gamma(self.gamma)  # 0 = no speculation
        if self.cuda_graphs not in GRAPH_MODES:
            raise ValueError(f"sample.cuda_graphs={self.cuda_graphs!r}: expected one of {', '.join(GRAPH_MODES)}")


@dataclass
class Completion:
    prompt_index: int
    sample_idx: int
    seed: int
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    num_drafted: int = 0
    num_accepted: int = 0
    num_target_forwards: int = 0
    pruned_at: int = 0  # the checkpoint where pruning stopped it (finish_reason "pruned"); 0: not pruned
    # with record_entropy: the entropy (nats) of the distribution each kept token was drawn from, summed
    entropy_sum: float | None = None


@dataclass
class _Row:
    group: int  # prompt index
    member: int  # sample index within the prompt
    prompt_ids: list[int]
    completion: Completion


def completion_seed(seed: int, prompt_index: int, sample_idx: int) -> int:
    """A 63-bit seed per completion, stable across runs, batch sizes and Python versions."""
    digest = hashlib.sha256(f"{seed}/{prompt_index}/{sample_idx}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class GammaController:
    """Chooses gamma each step from measured acceptance and measured cost (see module docstring)."""

    def __init__(self, gamma_max: int, adaptive: bool, probe_every: int = 16):
        self.gamma_max, self.adaptive, self.probe_every = gamma_max, adaptive, probe_every
        self.accept_rate = 0.5  # prior, replaced by the running estimate after the first drafts
        self.drafted = self.accepted = 0.0
        self.coverage = 1.0  # fraction of the rows x gamma draft slots filled (prior: all)
        self.slots = self.filled = 0.0
        self.target_seconds: dict[int, float] = {}  # positions per row -> EMA seconds per forward
        self.draft_seconds = 0.0  # EMA seconds per proposed token (all rows)
        self.steps = 0
        self.history: list[int] = []

    def _target_cost(self, positions: int, prior_slope: float = 0.3) -> float:
        """Seconds per policy forward over `positions` per row: measured, or extrapolated from the
        measured widths with a slope per extra position (prior 0.3: a 2-core CPU at 8-32 rows)."""
        if positions in self.target_seconds:
            return self.target_seconds[positions]
        measured = [(n, t) for n, t in self.target_seconds.items() if n > 1]
        if 1 in self.target_seconds:
            one = self.target_seconds[1]
            slope = sum((t / one - 1) / (n - 1) for n, t in measured) / len(measured) if measured else prior_slope
        elif measured:  # only speculative steps so far: back out the plain cost with the prior slope
            one = sum(t / (1 + prior_slope * (n - 1)) for n, t in measured) / len(measured)
            slope = prior_slope
        else:
            one, slope = 1.0, prior_slope
        return one * (1 + max(slope, 0.0) * (positions - 1))

    def expected_rate(self, gamma: int) -> float:
        """Expected emitted tokens per second per row-step for this gamma."""
        a = min(self.accept_rate, 0.999)
        tokens = 1 + self.coverage * (a - a ** (gamma + 1)) / (1 - a)
        return tokens / (self._target_cost(gamma + 1) + gamma * self.draft_seconds)

    def choose(self) -> int:
        self.steps += 1
        if not self.adaptive or self.gamma_max == 0:
            gamma = self.gamma_max
        elif 1 not in self.target_seconds:  # a plain step first: what a verified position costs is judged
            gamma = 0                        # against it, not against the prior slope (see the module docstring)
        else:
            best = max(range(self.gamma_max + 1), key=self.expected_rate)
            if self.steps % self.probe_every == 0:  # re-measure a neighbour (and acceptance when at 0)
                best = min(best + 1, self.gamma_max) if best == 0 or self.steps % (2 * self.probe_every) else best - 1
            gamma = best
        self.history.append(gamma)
        return gamma

    def observe(self, gamma: int, drafted: int, accepted: int, target_s: float, draft_s: float,
                rows: int = 1, asked: int | None = None, slots: int | None = None) -> None:
        """gamma: positions verified beyond the first (the widest row's drafts); asked: the gamma the
        draft was asked for (default gamma), so steps where no row found a draft count as empty;
        slots: the draft slots the rows could fill (default rows x asked; fewer where a row's own
        budget capped it). draft_s is the proposal alone: the catch-up after plain steps is a cost
        of switching back to drafting, not of drafting (see the module docstring)."""
        decay = 0.9
        asked = gamma if asked is None else asked
        slots = rows * asked if slots is None else slots
        if asked and slots:
            self.slots = decay * self.slots + slots
            self.filled = decay * self.filled + drafted
            self.coverage = self.filled / self.slots
        if drafted:
            self.drafted = decay * self.drafted + drafted
            self.accepted = decay * self.accepted + accepted
            self.accept_rate = self.accepted / self.drafted
        old = self.target_seconds.get(gamma + 1)
        self.target_seconds[gamma + 1] = target_s if old is None else decay * old + (1 - decay) * target_s
        if asked:
            per_token = draft_s / asked  # the draft runs `asked` forwards, one per draft position
            self.draft_seconds = decay * self.draft_seconds + (1 - decay) * per_token if self.draft_seconds else per_token


class Sampler:
    """Generates completions from `target`; with `draft` (ModelDraft / NgramDraft), speculatively."""

    def __init__(self, target, settings: SamplingSettings, eos_token_ids: list[int], draft=None,
                 clock: Callable[[], float] = time.perf_counter, prune: PruneSchedule | None = None,
                 score: Callable[[list[tuple[int, list[int]]]], list[float]] | None = None,
                 record_entropy: bool = False):
        """clock: what the controller's costs are measured with (tests inject a simulated one).
        prune and score: stop the lowest-ranked rows of each prompt at prune.checkpoints (see
        _Pruning); score([(prompt_index, token_ids), ...]) gives the reward of each, the tokens read
        as a finished answer, prompt_index being the prompt's index in the whole set.
        record_entropy: each completion's `entropy_sum`, the entropy of the processed distribution (after
        temperature, top-k, top-p) at every token it kept, summed (an evaluation's measure of range; one
        more pass over the vocabulary a step)."""
        settings.check()
        if draft is not None:
            check_gamma(settings.gamma)
        if prune is not None:
            prune.check(settings.max_new_tokens)
            if score is None:
                raise ValueError("pruning needs a score function (a reward model)")
        self.target, self.settings, self.draft, self.clock = target, settings, draft, clock
        self.record_entropy = record_entropy
        self.prune, self.score = (prune, score) if prune is not None and prune.checkpoints else (None, None)
        self.prune_counts = {"prefixes_scored": 0, "score_calls": 0, "rows_stopped": 0, "finished_then_stopped": 0}
        self.eos = set(int(t) for t in eos_token_ids)
        self.eos_ids = torch.tensor(sorted(self.eos), dtype=torch.long, device=next(target.parameters()).device)
        self.stats = AcceptanceStats()
        # a step drafts at most the row's tokens left less one (its own cap, in _step): buffers and the fixed-shape
        # step are sized for what a step can use, not for a gamma past the token budget
        usable = min(settings.gamma, max(settings.max_new_tokens - 1, 1))
        self.controller = GammaController(usable if draft is not None else 0, settings.adaptive)
        self.timings = {"target_seconds": 0.0, "draft_seconds": 0.0, "draft_catch_up_seconds": 0.0,
                        "prefill_seconds": 0.0, "budget_reward_seconds": 0.0,
                        "graph_capture_seconds": 0.0}
        self._draft_behind = False  # a step ran without the draft: it has tokens to catch up on

    def _processed(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.settings
        if s.strategy == "greedy":
            return greedy_probs(logits)
        return probs_from_logits(logits, s.temperature, s.top_k, s.top_p)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], num_samples: int, seed: int, progress: bool = True,
                 prompt_indices: list[int] | None = None, sample_ranges: list[range] | None = None
                 ) -> list[Completion]:
        """K = num_samples completions for each prompt (token ids, chat-formatted); in prompt order.

        prompt_indices: each prompt's index in the whole prompt set (default 0, 1, ...), which seeds its
        completions and is their `prompt_index`: a shard of the prompts (one process of several) gets
        exactly the completions the whole set would. sample_ranges: per prompt, the sample indices to
        draw instead of range(num_samples) (adaptive K's second pass draws k0, k0 + 1, ...); completion
        (prompt, k) is the same whichever call draws it. With pruning, stopped rows are returned too,
        with finish_reason "pruned", the tokens they had and `pruned_at`."""
        indices = list(range(len(prompts))) if prompt_indices is None else list(prompt_indices)
        if len(indices) != len(prompts):
            raise ValueError(f"prompt_indices has {len(indices)} entries for {len(prompts)} prompts")
        if sample_ranges is None:
            if num_samples < 1:
                raise ValueError(f"sample.num_samples={num_samples}: expected >= 1")
            sample_ranges = [range(num_samples)] * len(prompts)
        if len(sample_ranges) != len(prompts):
            raise ValueError(f"sample_ranges has {len(sample_ranges)} entries for {len(prompts)} prompts")
        for i, ids in enumerate(prompts):
            if not ids:
                raise ValueError(f"prompt {i} tokenizes to nothing; expected at least one token")
        waiting = [(p, k) for p in range(len(prompts)) for k in sample_ranges[p]]
        waiting.reverse()  # pop() from the end takes them in prompt order
        done: list[Completion] = []
        pruning = None if self.prune is None else _Pruning(self, [len(r) for r in sample_ranges], indices)
        target = KVBatch(self.target, keep_features=getattr(self.draft, "needs_policy_features", False))
        if self.draft is not None:
            self.draft.begin()
        if waiting:  # the whole cache at once: no step grows or copies it (a row's tokens never pass this)
            longest = max(len(prompts[p]) for p, _ in waiting)
            target.reserve(min(self.settings.batch_rows, len(waiting)),
                           longest + self.settings.max_new_tokens + self.controller.gamma_max + 1)
        self._tally = AcceptanceTally(self.controller.gamma_max, target.device)
        self._fixed = self._fixed_step(target)
        state = _RowState(target.device, self.settings.max_new_tokens, self.controller.gamma_max, self.record_entropy)
        rows: list[_Row] = []
        with tqdm(total=len(waiting), desc="sampling", unit="completion", disable=not progress) as bar:
            while rows or waiting:
                free = self.settings.batch_rows - len(rows)
                if free > 0 and waiting:
                    admitted = [waiting.pop() for _ in range(min(free, len(waiting)))]
                    new_rows = self._admit(target, admitted, prompts, indices, seed)
                    rows.extend(new_rows)
                    state.add(new_rows)
                    if pruning is not None:
                        pruning.admitted(new_rows)
                finished = self._step(target, rows, state, pruning is not None)
                keep = [i for i in range(len(rows)) if i not in finished]
                if pruning is not None:
                    started = self.clock()
                    stopped = pruning.decide()
                    self.timings["budget_reward_seconds"] += self.clock() - started
                    if stopped:
                        for i in keep:
                            if id(rows[i].completion) in stopped:
                                finished[i] = rows[i].completion
                        keep = [i for i in keep if id(rows[i].completion) not in stopped]
                rows = self._keep(target, rows, state, keep)
                done.extend(finished.values())
                bar.update(len(finished))
        self._tally.flush_into(self.stats)
        if self._fixed is not None:  # the graphs' memory pools hold every width's logits: not kept past the call
            self.timings["graph_capture_seconds"] += self._fixed.capture_seconds
            self._fixed.release()
        done.sort(key=lambda c: (c.prompt_index, c.sample_idx))
        return done

    def _fixed_step(self, target: KVBatch) -> FixedShapeStep | None:
        """The fixed-shape plain step (a CUDA graph where it is captured) for this batch's cache, or None."""
        s = self.settings
        return fixed_shape_step(target, s.cuda_graphs, s.temperature, s.top_k, s.top_p, s.strategy, s.leniency,
                                self.record_entropy)

    def _admit(self, target: KVBatch, admitted: list[tuple[int, int]], prompts: list[list[int]], indices: list[int],
               seed: int) -> list[_Row]:
        """New rows for (prompt, sample) pairs, each with its own seed; a prompt's rows share one prefill."""
        started = self.clock()
        groups: dict[int, list[int]] = {}
        for p, k in admitted:
            groups.setdefault(p, []).append(k)
        new_rows = []
        for p, members in groups.items():
            for k in members:
                cseed = completion_seed(seed, indices[p], k)
                new_rows.append(_Row(p, k, prompts[p], Completion(indices[p], k, cseed)))
        prefixes = [prompts[p][:-1] for p in groups]
        copies = [len(m) for m in groups.values()]
        target.admit(prefixes, copies)
        if self.draft is not None:
            self.draft.admit(prefixes, copies, new_rows, target)
        self.timings["prefill_seconds"] += self.clock() - started
        return new_rows

    def _step(self, target: KVBatch, rows: list[_Row], state: "_RowState", host_tokens: bool) -> dict[int, Completion]:
        """One draft-and-verify step (a plain step when gamma is 0) for every running row; returns the
        rows that finished, by index. Everything per row stays on the batch's device: the host reads it
        once, at the end (which rows finished, the longest cache row, the step's counts), plus the
        tokens of the rows that finished. host_tokens: also bring every row's tokens so far (pruning
        reads them)."""
        s, device, clock = self.settings, target.device, self.clock
        remaining = s.max_new_tokens - state.emitted  # [rows]
        chosen = self.controller.choose()
        # each row's own cap: it never drafts past its own budget, whatever its neighbours have left
        gammas = (remaining - 1).clamp(min=0, max=chosen)  # [rows]
        # draft positions any row may use (a speculative step reads the device here; a plain step does not)
        gamma = int(gammas.max()) if self.draft is not None and chosen else 0
        fixed = self._fixed  # the fixed-shape step (replayed CUDA graphs), or None: the packed step
        if fixed is not None and not fixed.fits():  # an admission grew the cache: the graphs are bound to the old one
            fixed = self._fixed = self._fixed_step(target)
        draft_tokens = draft_probs = None
        num_drafts = torch.zeros(len(rows), dtype=torch.long, device=device)  # [rows]
        draft_s = 0.0
        width = 0
        if fixed is None or gamma > 0:  # (the fixed-shape step draws its own uniforms, the same ones)
            # slot 0: the emitted token's draw; slot 1 + 2j: draft j's sample; slot 2 + 2j: its acceptance test
            uniforms = keyed_uniforms(state.keys, state.emitted, 2 * gamma + 1)  # [rows, 2 gamma + 1]
            emit_u, draft_u, accept_u = uniforms[:, 0], uniforms[:, 1::2], uniforms[:, 2::2]  # [rows], [rows, gamma] x2
        if gamma > 0:
            if self._draft_behind:  # the switch from plain steps back to drafting: not this gamma's cost
                started = clock()
                self.draft.catch_up()
                self.timings["draft_catch_up_seconds"] += clock() - started
                self._draft_behind = False
            started = clock()
            draft_tokens, draft_probs, num_drafts = self.draft.propose(state.last, gammas, draft_u, s, rows)
            num_drafts = torch.minimum(num_drafts, gammas)  # [rows]
            draft_s = clock() - started
            self.timings["draft_seconds"] += draft_s
            # no row drafted more: on a CPU (where reading the device is free) verify only that many positions
            width = int(num_drafts.max()) if device.type == "cpu" else draft_tokens.shape[1]
        elif self.draft is not None:
            self._draft_behind = True
        started = clock()
        verified = None if width == 0 else draft_tokens[:, :width]  # [rows, width]
        inputs = state.last[:, None] if width == 0 else torch.cat([state.last[:, None], verified], 1)  # [rows, 1+w]
        if fixed is not None:  # every buffer row at [1 + w] tokens, captured once per width and replayed
            q = None if draft_probs is None else draft_probs[:, :width]  # [rows, w, vocab]
            # rows near their budget draft fewer: padded to the step's gamma (its graph), the padding past every row's
            # num_drafts, never read. So are the last steps, where every row has one token left and none drafts: one
            # step at the wide graph costs less than capturing the plain graph for them (its warm-ups and capture)
            if width < chosen and self.draft is not None:
                inputs = F.pad(inputs, (0, chosen - width))
                q = None if q is None else F.pad(q, (0, 0, 0, chosen - width))
            result, finite_rows, entropy = fixed.run(target.slot, inputs, q, num_drafts, state.keys, state.emitted)
            target.length[target.slot] += inputs.shape[1]  # what the packed forward does; the commit keeps the accepted
            finite = finite_rows.all()  # []
            entropy = entropy if self.record_entropy else None

            def name_rows():
                bad = [f"prompt {r.group} sample {r.member}" for r, ok in zip(rows, finite_rows.tolist()) if not ok]
                raise ValueError(f"policy logits: NaN or inf for {len(bad)} of {len(rows)} rows "
                                 f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''})")
        else:
            # a CPU packs only the real tokens (a padded slot costs compute there); an accelerator runs the fixed
            # [rows, 1 + w] shape and reads nothing back: padded slots hold token 0, whose logits the verifier
            # never reads and whose cache entries the commit below drops
            packed = width > 0 and device.type == "cpu"
            valid = torch.arange(width + 1, device=device)[None, :] <= num_drafts[:, None] if packed else None
            logits = target.forward(inputs, valid)  # [rows, 1+w, vocab]
            finite = torch.isfinite(logits.sum(dtype=torch.float32))  # [] one reduction; rows named only on failure
            if s.strategy == "greedy":
                target_probs = greedy_probs(logits)
            else:  # the logits are this step's own: processed in place, nothing of the vocabulary's size allocated
                target_probs = probs_from_logits(logits.float(), s.temperature, s.top_k, s.top_p, in_place=True)
            empty = torch.zeros(len(rows), 0, dtype=torch.long, device=device)  # [rows, 0]
            result = verify(
                empty if width == 0 else verified,
                None if draft_probs is None else draft_probs[:, :width],  # [rows, width, vocab]
                target_probs,
                accept_u[:, :width],
                emit_u,
                num_drafts=num_drafts,
                strategy=s.strategy,
                leniency=s.leniency,
                checked=False,
            )
            # the entropy of each verified position's distribution [rows, 1+w] (xlogy: 0 log 0 = 0)
            entropy = -torch.special.xlogy(target_probs, target_probs).sum(-1) if self.record_entropy else None

            def name_rows():  # the probabilities carry the logits' NaN / inf (processed in place): name the row
                check_finite(logits if s.strategy == "greedy" else target_probs, where="policy logits",
                             row_ids=[f"prompt {r.group} sample {r.member}" for r in rows])
        bad_drafts = torch.zeros((), dtype=torch.bool, device=device) if width == 0 else (
            ((verified < 0) | (verified >= target.vocab_size))
            & (torch.arange(width, device=device)[None, :] < num_drafts[:, None])).any()
        return self._end_step(target, rows, state, host_tokens, result, num_drafts, entropy, finite, bad_drafts,
                              name_rows, started, inputs.shape[1] - 1, gamma, draft_s, gammas, draft_tokens)

    def _end_step(self, target: KVBatch, rows: list[_Row], state: "_RowState", host_tokens: bool, result,
                  num_drafts: torch.Tensor, entropy: torch.Tensor | None, finite: torch.Tensor,
                  bad_drafts: torch.Tensor, name_rows: Callable[[], None], started: float, width: int, gamma: int,
                  draft_s: float, gammas: torch.Tensor | None, draft_tokens: torch.Tensor | None
                  ) -> dict[int, Completion]:
        """What every step does after its verification: keep the accepted cache, count, append the tokens,
        read the device once, check, time, tell the draft; -> the rows that finished, by index."""
        target.commit(1 + result.num_accepted)
        self._tally.update(result, num_drafts)
        reason = state.append(result, num_drafts, self.eos_ids, entropy)  # [rows] 0 running, 1 eos, 2 length
        # the step's one read of the device
        summary = torch.cat((reason, torch.stack((target.length[target.slot].max(), num_drafts.sum(),
                                                  result.num_accepted.sum(), finite.long(), bad_drafts.long())))).tolist()
        reasons, (longest, drafted, accepted, is_finite, has_bad_draft) = summary[:len(rows)], summary[len(rows):]
        if not is_finite:
            name_rows()
            raise ValueError("policy logits: their sum is not finite (an inf that the probabilities absorbed)")
        if has_bad_draft:
            raise ValueError(f"a draft proposed a token outside the policy's vocabulary [0, {target.vocab_size})")
        target.note_max_length(longest)
        target_s = self.clock() - started
        self.timings["target_seconds"] += target_s
        self.controller.observe(width, drafted, accepted, target_s, draft_s, rows=len(rows), asked=gamma,
                                slots=int(gammas.sum()) if gamma else 0)
        if self.draft is not None:
            emitted = None  # the tokens each row emitted, on the host, only for a draft that reads them (n-gram)
            if getattr(self.draft, "reads_emitted", False):
                tokens = result.tokens.tolist()
                emitted = [tokens[i][:n] for i, n in enumerate(result.num_emitted.tolist())]
            self.draft.after_step(draft_tokens if gamma else None, num_drafts, result.num_accepted, emitted, rows,
                                  state.last_fed)
        finished_rows = [i for i, r in enumerate(reasons) if r]
        finished = state.finish(rows, finished_rows, reasons)
        if host_tokens:
            state.bring_tokens(rows, [i for i in range(len(rows)) if not reasons[i]])
        return finished

    def _keep(self, target: KVBatch, rows: list[_Row], state: "_RowState", keep: list[int]) -> list[_Row]:
        """Only rows[keep] go on (the policy's, the draft's and the row state of the others is dropped)."""
        if len(keep) == len(rows):
            return rows
        target.keep_rows(keep)
        if self.draft is not None:
            self.draft.keep_rows(keep)
        state.keep(keep)
        return [rows[i] for i in keep]

    def summary(self) -> dict:
        out = self.stats.summary()
        out.update({k: round(v, 3) for k, v in self.timings.items()})
        history = self.controller.history
        out["gamma_chosen_mean"] = sum(history) / len(history) if history else 0.0
        out["gamma_max"] = self.controller.gamma_max
        if self.prune is not None:
            out.update({f"prune_{k}": v for k, v in self.prune_counts.items()})
        return out


class _RowState:
    """What each running row carries from step to step, as device tensors aligned with the sampler's
    rows: its Philox key, the tokens it has kept, how many, the token it feeds next, and its counts.
    Appending a step's tokens (up to EOS or the budget) is tensor arithmetic; the host reads a row's
    tokens once, when it finishes (or every step where pruning reads them)."""

    def __init__(self, device: torch.device, max_new_tokens: int, gamma_max: int, records_entropy: bool):
        self.device, self.max_new_tokens, self.records_entropy = device, max_new_tokens, records_entropy
        self.width = max_new_tokens + gamma_max + 1  # a step's tokens fit even when the budget cuts them
        long = dict(dtype=torch.long, device=device)
        self.keys = torch.zeros(0, 2, **long)  # [rows, 2] Philox key words (the completion's seed)
        self.emitted = torch.zeros(0, **long)  # [rows] tokens kept so far: the counter of its uniforms
        self.tokens = torch.zeros(0, self.width, **long)  # [rows, width] tokens kept (and, past them, scratch)
        self.last = torch.zeros(0, **long)  # [rows] the token each row feeds next
        self.last_fed = self.last  # [rows] the token each row fed this step (the draft's after_step reads it)
        self.counts = torch.zeros(0, 3, **long)  # [rows] forwards, drafted, accepted
        self.entropy = torch.zeros(0, dtype=torch.float64, device=device)  # [rows] summed (record_entropy)

    def add(self, rows: list[_Row]) -> None:
        long = dict(dtype=torch.long, device=self.device)
        seeds = torch.tensor([r.completion.seed for r in rows], **long)  # [new]
        self.keys = torch.cat([self.keys, key_words(seeds)])
        self.emitted = torch.cat([self.emitted, torch.zeros(len(rows), **long)])
        self.tokens = torch.cat([self.tokens, torch.zeros(len(rows), self.width, **long)])
        self.last = torch.cat([self.last, torch.tensor([r.prompt_ids[-1] for r in rows], **long)])
        self.counts = torch.cat([self.counts, torch.zeros(len(rows), 3, **long)])
        self.entropy = torch.cat([self.entropy, torch.zeros(len(rows), dtype=torch.float64, device=self.device)])

    def keep(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.keys, self.emitted, self.tokens = self.keys[index], self.emitted[index], self.tokens[index]
        self.last, self.counts, self.entropy = self.last[index], self.counts[index], self.entropy[index]

    def append(self, result, num_drafts: torch.Tensor, eos_ids: torch.Tensor,
               entropy: torch.Tensor | None = None) -> torch.Tensor:
        """Keep each row's emitted tokens [rows, 1 + w] up to EOS (not kept) or the budget; -> why each
        row ended this step [rows]: 0 running, 1 eos, 2 length."""
        tokens, num_emitted = result.tokens, result.num_emitted  # [rows, 1+w], [rows]
        rows, slots = tokens.shape
        column = torch.arange(slots, device=self.device)[None, :]  # [1, 1+w]
        remaining = self.max_new_tokens - self.emitted  # [rows]
        is_eos = torch.isin(tokens, eos_ids) & (column < num_emitted[:, None])  # [rows, 1+w]
        first_eos = torch.where(is_eos, column, slots).amin(1)  # [rows] slots: none
        # EOS ends the row when it comes before the budget does (the tokens before it are kept)
        ends_at_eos = first_eos < torch.minimum(num_emitted, remaining)  # [rows]
        take = torch.where(ends_at_eos, first_eos, torch.minimum(num_emitted, remaining))  # [rows]
        # every emitted token is written; those past `take` land beyond what the row keeps (the buffer has
        # room for a whole step past the budget), where nothing reads them and the next step overwrites them
        self.tokens.scatter_(1, self.emitted[:, None] + column, tokens)
        self.emitted = self.emitted + take
        if entropy is not None:  # [rows, 1+w]: summed over the positions each row keeps
            self.entropy = self.entropy + torch.where(column < take[:, None], entropy.double(), 0.0).sum(1)
        self.last_fed = self.last
        self.last = tokens.gather(1, (num_emitted - 1)[:, None])[:, 0]  # [rows] the last token emitted
        self.counts = self.counts + torch.stack(
            (torch.ones_like(take), num_drafts, result.num_accepted), 1)
        ends_at_length = ~ends_at_eos & (self.emitted >= self.max_new_tokens)  # [rows]
        return torch.where(ends_at_eos, 1, torch.where(ends_at_length, 2, 0))  # [rows]

    def finish(self, rows: list[_Row], finished: list[int], reasons: list[int]) -> dict[int, Completion]:
        """Fill the completions of rows[finished] from the device, in one read, with why each ended."""
        self.bring_tokens(rows, finished)
        for i in finished:
            rows[i].completion.finish_reason = "eos" if reasons[i] == 1 else "length"
        return {i: rows[i].completion for i in finished}

    def bring_tokens(self, rows: list[_Row], indices: list[int]) -> None:
        """Copy the tokens so far, the counts (and the entropy, when recorded) of rows[indices] to their
        completions, in one read of the device (pruning scores running rows' prefixes with them)."""
        if not indices:
            return
        index = torch.tensor(indices, dtype=torch.long, device=self.device)
        packed = torch.cat((self.emitted[index, None], self.counts[index], self.tokens[index]), 1).tolist()
        entropy = self.entropy[index].tolist() if self.records_entropy else [None] * len(indices)
        for i, values, entropy_sum in zip(indices, packed, entropy):
            c = rows[i].completion
            c.token_ids = values[4:4 + values[0]]
            c.num_target_forwards, c.num_drafted, c.num_accepted = values[1:4]
            c.entropy_sum = entropy_sum


class _Pruning:
    """The pruning decisions of one generate() call (rsft.sampling.budget has the rule and its bias).

    A prompt's checkpoint c is decided once every one of its rows has been admitted and every row not
    yet stopped has either finished or emitted more than c tokens; rows that got there first keep decoding
    meanwhile (they are never paused, so the batch stays full), and are judged by their first c tokens
    all the same. A decision therefore depends only on the completions' own tokens, which depend only
    on their own generators: sampling with pruning keeps what a replay on the exhaustive set keeps.
    A row stopped after it had finished (it ran ahead) is stopped all the same, for that reason."""

    def __init__(self, sampler: Sampler, group_sizes: list[int], indices: list[int]):
        self.sampler, self.schedule, self.indices = sampler, sampler.prune, indices
        self.sizes = group_sizes
        self.members: dict[int, list[_Row]] = {}  # prompt -> its admitted rows
        self.next_checkpoint: dict[int, int] = {}  # prompt -> index into checkpoints
        self.cache: dict[tuple[int, int, int], float] = {}  # (prompt, sample, tokens scored) -> score

    def admitted(self, rows: list[_Row]) -> None:
        for row in rows:
            self.members.setdefault(row.group, []).append(row)
            self.next_checkpoint.setdefault(row.group, 0)

    def _ready(self, p: int) -> int | None:
        """The checkpoint prompt p can decide now, if any."""
        i = self.next_checkpoint[p]
        if i >= len(self.schedule.checkpoints) or len(self.members[p]) < self.sizes[p]:
            return None
        c = self.schedule.checkpoints[i]
        candidates = [r.completion for r in self.members[p] if r.completion.finish_reason != PRUNED]
        # past c: finished, or beyond c tokens (with exactly c, whether the next token is EOS is not known yet)
        if all(x.finish_reason or len(x.token_ids) > c for x in candidates):
            return c
        return None

    def decide(self) -> set[int]:
        """Decide every checkpoint that is ready; the ids of the completions stopped."""
        stopped: set[int] = set()
        while True:
            ready = [(p, c) for p in list(self.next_checkpoint) if (c := self._ready(p)) is not None]
            if not ready:
                return stopped
            plans, requests = [], []
            for p, c in ready:
                self.next_checkpoint[p] += 1
                candidates = [r.completion for r in self.members[p] if r.completion.finish_reason != PRUNED]
                scored = [scored_tokens(x.token_ids, x.finish_reason == "eos", c) for x in candidates]
                if all(done for _, done in scored):  # every answer finished within c tokens: nothing to stop
                    continue
                plans.append((p, c, candidates, scored))
                for x, (tokens, _) in zip(candidates, scored):
                    if (p, x.sample_idx, len(tokens)) not in self.cache:
                        requests.append((p, x.sample_idx, tokens))
            if requests:
                values = self.sampler.score([(self.indices[p], tokens) for p, _, tokens in requests])
                self.sampler.prune_counts["score_calls"] += 1
                self.sampler.prune_counts["prefixes_scored"] += len(requests)
                for (p, k, tokens), value in zip(requests, values):
                    self.cache[(p, k, len(tokens))] = float(value)
            for p, c, candidates, scored in plans:
                values = [self.cache[(p, x.sample_idx, len(t))] for x, (t, _) in zip(candidates, scored)]
                live = [not done for _, done in scored]
                for i in rows_to_stop(values, live, self.schedule.share, self.schedule.rank_finished):
                    x = candidates[i]
                    if x.finish_reason:
                        self.sampler.prune_counts["finished_then_stopped"] += 1
                    x.finish_reason, x.pruned_at = PRUNED, c
                    stopped.add(id(x))
                    self.sampler.prune_counts["rows_stopped"] += 1
