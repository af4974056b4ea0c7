"""The speculative verifier: batched, pure tensors, no model.

A draft proposed tokens x_0 .. x_{gamma-1}, x_i drawn from q_i; one target forward over the same
positions gave p_0 .. p_gamma (p_i conditions on the drafts before position i). p and q are the
*processed* distributions each side samples from (rsft.sampling.processing). Left to right:

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i))
    at the first rejection, emit one token from residual_i = normalize(max(0, p_i - q_i)) and stop
    if every draft was accepted, emit a bonus token from p_gamma

Each emitted token is then distributed exactly as a token sampled from p at its position
(Leviathan et al. 2022, arXiv 2211.17192, appendix A.1; Chen et al. 2023, arXiv 2302.01318):

    P(x) = q(x) min(1, p(x)/q(x)) + (1 - sum_y min(q(y), p(y))) residual(x)
         = min(p, q)(x) + max(0, p - q)(x) = p(x)

- A deterministic draft (n-gram lookup) is q = one-hot at x: accept with probability p(x); the
  residual is p with x removed, renormalised. draft_probs=None selects it without building one-hots.
- Rows carry their own number of real drafts (num_drafts, 0..gamma); a row whose real drafts are all
  accepted gets its bonus token from p at position num_drafts. num_drafts = 0 is plain sampling.
- Randomness comes in as uniforms: accept_uniforms[i, j] decides draft j of row i, sample_uniforms[i]
  samples row i's one extra token (recovered or bonus) by inverse CDF.

Strategies. "exact" is the default and the only sampling strategy that is lossless:
- greedy: accept iff the draft is the argmax of p; the extra token is the argmax of p. Emits token for
  token what greedy decoding emits; ignores q and the uniforms.
- lenient (lossy, 0 < leniency <= 1): accept with min(1, p(x) / (leniency q(x))), residual as in exact.
  It over-emits the tokens the draft over-proposes (q > p): the emitted distribution is off from p by
  total variation sum_x max(0, min(q(x), p(x)/leniency) - p(x)). leniency = 1 is exact.
- skip_adjustment (lossy): accept as in exact but sample the replacement from p instead of the residual.
  The emitted distribution is min(p, q) + (1 - sum min(p, q)) p: tokens the draft under-proposes come
  out too rarely, total variation 1/2 sum_x |min(p, q)(x) - p(x) sum_y min(p, q)(y)|, 0 only if p == q.
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from rsft.sampling.processing import sample_from_probs

ACCEPTED = 0  # a draft token the target kept
RECOVERED = 1  # sampled after a rejection (from the residual, or from p for skip_adjustment)
BONUS = 2  # every real draft was accepted: sampled from p at the next position
PAD = -1  # no token in this slot

STRATEGIES = ("exact", "greedy", "lenient", "skip_adjustment")


# a step emits 1 + its accepted drafts; drafts accepted independently at rate a give (1 - a^(g+1)) / (1 - a) tokens
# a step, so past 64 drafts even a = 0.95 gains under 4% more (a^65 = 0.036), while every step pays for all of them
MAX_GAMMA = 64


def check_gamma(gamma: int, key: str = "draft.gamma") -> None:
    """A speculative draft proposes at least one token per step and at most MAX_GAMMA (the sampler's and the
    config's rule; `key` names the setting in the message)."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"{key}: gamma must be >= 1 (got {gamma!r}); to sample without speculation "
                         f"use draft=none")
    if gamma > MAX_GAMMA:
        raise ValueError(f"{key}: gamma must be at most {MAX_GAMMA} (got {gamma}): a step pays for every draft it "
                         f"proposes, and past {MAX_GAMMA} even drafts accepted 95% of the time add under 4% more "
                         f"tokens a step")


def check_strategy(strategy: str, leniency: float) -> None:
    """Raise ValueError for an unknown strategy, or a leniency that is out of (0, 1] or given without lenient."""
    check_strategy_name(strategy)
    check_leniency(leniency, strategy)


def check_strategy_name(strategy: str, key: str = "strategy") -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"{key} must be one of {STRATEGIES} (got {strategy!r})")


def check_leniency(leniency: float, strategy: str) -> None:
    """leniency belongs to strategy=lenient: in (0, 1] there, and left at 1.0 with any other strategy."""
    if strategy == "lenient" and not 0 < leniency <= 1:
        raise ValueError(f"leniency must be in (0, 1] for strategy=lenient (got {leniency})")
    if strategy != "lenient" and leniency != 1.0:
        raise ValueError(f"leniency={leniency} only applies to strategy=lenient (strategy={strategy})")


@dataclass
class VerifyResult:
    num_accepted: Tensor  # [batch] long, accepted drafts, 0..num_drafts
    tokens: Tensor  # [batch, gamma + 1] long, emitted tokens, PAD after the last one
    kinds: Tensor  # [batch, gamma + 1] long, ACCEPTED / RECOVERED / BONUS / PAD per slot
    num_emitted: Tensor  # [batch] long, num_accepted + 1


def acceptance_probs(p_at_x: Tensor, q_at_x: Tensor, leniency: float = 1.0) -> Tensor:
    """min(1, p(x) / (leniency q(x))) elementwise (any shape); 0 where q(x) = 0.

    q(x) = 0 for a drafted x cannot happen with a correct draft; if it does the draft is rejected
    instead of dividing by zero.
    """
    proposable = q_at_x > 0  # [...]
    safe_q = torch.where(proposable, q_at_x, torch.ones_like(q_at_x))  # [...] no division by zero below
    ratio = p_at_x / (leniency * safe_q)  # [...]
    return torch.where(proposable, ratio.clamp(max=1.0), torch.zeros_like(ratio))  # [...]


def _normalize_or_p(excess: Tensor, p: Tensor) -> Tensor:
    """excess [..., vocab] / its sum, or p [..., vocab] where the excess has no mass."""
    mass = excess.sum(-1, keepdim=True)  # [..., 1]
    # No mass means p <= q everywhere, i.e. p == q up to rounding: every draft is then accepted (up to a
    # rounding-sized chance), so this distribution is (almost) never sampled; p is the natural fallback
    # and keeps the result a valid distribution. clamp: no 0/0 even in the branch torch.where discards.
    return torch.where(mass > 0, excess / mass.clamp(min=torch.finfo(mass.dtype).tiny), p)  # [..., vocab]


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """normalize(max(0, p - q)) for p, q [..., vocab]; p where p - q has no positive mass."""
    return _normalize_or_p((p - q).clamp(min=0), p)  # [..., vocab]


def residual_distribution_one_hot(p: Tensor, drafted: Tensor) -> Tensor:
    """The residual for q = one-hot at drafted [...] (long): p [..., vocab] without that token, renormalised."""
    excess = p.scatter(-1, drafted[..., None], 0.0)  # [..., vocab]
    return _normalize_or_p(excess, p)  # [..., vocab]


def replacement_distribution(p: Tensor, q: Tensor | None, drafted: Tensor, strategy: str) -> Tensor:
    """What a rejected position emits from. p [..., vocab]; q [..., vocab] or None (one-hot draft); drafted [...]."""
    if strategy == "skip_adjustment":
        return p  # the lossy shortcut: no residual
    if q is None:
        return residual_distribution_one_hot(p, drafted)
    return residual_distribution(p, q)


def _check_inputs(draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms, num_drafts,
                  strategy, checked=True):
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [batch, gamma], got shape {tuple(draft_tokens.shape)}")
    batch, gamma = draft_tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (batch, gamma + 1):
        raise ValueError(
            f"target_probs must be [batch, gamma + 1, vocab] = [{batch}, {gamma + 1}, vocab], "
            f"got {tuple(target_probs.shape)}"
        )
    vocab = target_probs.shape[-1]
    if draft_probs is not None and draft_probs.shape != (batch, gamma, vocab):
        raise ValueError(
            f"draft_probs must be [batch, gamma, vocab] = {(batch, gamma, vocab)}, got {tuple(draft_probs.shape)}"
        )
    if strategy != "greedy":  # greedy needs no random numbers
        if accept_uniforms is None or accept_uniforms.shape != (batch, gamma):
            shape = None if accept_uniforms is None else tuple(accept_uniforms.shape)
            raise ValueError(f"accept_uniforms must be [batch, gamma] = {(batch, gamma)}, got {shape}")
        if sample_uniforms is None or sample_uniforms.shape != (batch,):
            shape = None if sample_uniforms is None else tuple(sample_uniforms.shape)
            raise ValueError(f"sample_uniforms must be [batch] = ({batch},), got {shape}")
    if num_drafts is not None:
        if num_drafts.shape != (batch,):
            raise ValueError(f"num_drafts must be [batch] = ({batch},), got {tuple(num_drafts.shape)}")
        if checked and batch and (num_drafts.min() < 0 or num_drafts.max() > gamma):
            raise ValueError(f"num_drafts must be in [0, gamma={gamma}], got {num_drafts.tolist()}")


def verify(
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    accept_uniforms: Tensor | None,
    sample_uniforms: Tensor | None,
    *,
    num_drafts: Tensor | None = None,
    strategy: str = "exact",
    leniency: float = 1.0,
    checked: bool = True,
) -> VerifyResult:
    """Verify a batch of drafts against the target; see the module docstring.

    draft_tokens [batch, gamma] long (slots at or past num_drafts[i] are ignored, any value, e.g. PAD);
    draft_probs [batch, gamma, vocab], or None for a deterministic (one-hot) draft;
    target_probs [batch, gamma + 1, vocab]; accept_uniforms [batch, gamma]; sample_uniforms [batch]
    (both may be None for strategy=greedy); num_drafts [batch] long in 0..gamma, default gamma.
    checked=False skips the checks of values (num_drafts in range, draft tokens in the vocabulary), which
    read the device: a caller that checks them itself, in its one read a step (the sampler), passes
    False; out-of-range drafts are then clamped into the vocabulary, and the caller discards the result.
    """
    check_strategy(strategy, leniency)
    _check_inputs(draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms, num_drafts,
                  strategy, checked)
    batch, gamma = draft_tokens.shape
    device = target_probs.device
    if num_drafts is None:
        num_drafts = torch.full((batch,), gamma, dtype=torch.long, device=device)  # [batch]
    is_draft = torch.arange(gamma, device=device) < num_drafts[:, None]  # [batch, gamma]
    # slots past a row's drafts may hold anything; point them at token 0 so every gather stays in range
    drafts = torch.where(is_draft, draft_tokens, 0)  # [batch, gamma]
    vocab = target_probs.shape[-1]
    if not checked:  # in range for every gather; the caller raises on the original values
        drafts = drafts.clamp(0, vocab - 1)  # [batch, gamma]
    out_of_range = (drafts < 0) | (drafts >= vocab)  # [batch, gamma]
    if checked and gamma and out_of_range.any():
        row, slot = out_of_range.nonzero()[0].tolist()
        bad = int(drafts[row, slot])
        raise ValueError(f"draft token {bad} (row {row}, slot {slot}) is not in [0, vocab={vocab})")

    if strategy == "greedy":
        accepted = drafts == target_probs[:, :gamma].argmax(-1)  # [batch, gamma]
    else:
        p_at_x = target_probs[:, :gamma].gather(-1, drafts[..., None]).squeeze(-1)  # [batch, gamma]
        if draft_probs is None:
            q_at_x = torch.ones_like(p_at_x)  # [batch, gamma] one-hot draft: q(x) = 1
        else:
            q_at_x = draft_probs.gather(-1, drafts[..., None]).squeeze(-1)  # [batch, gamma]
        accepted = accept_uniforms < acceptance_probs(p_at_x, q_at_x, leniency)  # [batch, gamma]
    accepted = accepted & is_draft  # [batch, gamma]
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [batch] length of the leading run of acceptances

    rows = torch.arange(batch, device=device)  # [batch]
    # p at the first slot not accepted [batch, vocab]; with no drafts, slot 0 of every row (a view, no copy)
    next_p = target_probs[:, 0] if gamma == 0 else target_probs[rows, num_accepted]
    rejected = num_accepted < num_drafts  # [batch] stopped at a rejected draft (else: bonus)
    if strategy == "greedy":
        extra = next_p.argmax(-1)  # [batch]
    else:
        emit_from = next_p  # [batch, vocab]
        if gamma > 0:
            # rows that were not rejected may point one past the drafts; clamp, their value is discarded below
            at = num_accepted.clamp(max=gamma - 1)  # [batch]
            q = None if draft_probs is None else draft_probs[rows, at]  # [batch, vocab]
            replacement = replacement_distribution(next_p, q, drafts[rows, at], strategy)  # [batch, vocab]
            emit_from = torch.where(rejected[:, None], replacement, next_p)  # [batch, vocab]
        extra = sample_from_probs(emit_from, sample_uniforms)  # [batch]

    slots = torch.arange(gamma + 1, device=device)  # [gamma + 1]
    kept = slots < num_accepted[:, None]  # [batch, gamma + 1]
    tokens = torch.where(kept, F.pad(drafts, (0, 1), value=PAD), PAD)  # [batch, gamma + 1]
    tokens = tokens.scatter(1, num_accepted[:, None], extra[:, None])  # [batch, gamma + 1]
    kinds = torch.where(kept, ACCEPTED, PAD)  # [batch, gamma + 1]
    extra_kind = torch.where(rejected, RECOVERED, BONUS)  # [batch]
    kinds = kinds.scatter(1, num_accepted[:, None], extra_kind[:, None])  # [batch, gamma + 1]
    return VerifyResult(num_accepted=num_accepted, tokens=tokens, kinds=kinds, num_emitted=num_accepted + 1)


class StreamingVerifier:
    """Verify one row's drafts as they arrive, one token at a time; emits exactly what verify() emits.

    target_probs: [gamma + 1, vocab], or a callable position -> p [vocab] (computed lazily);
    accept_uniforms [gamma] and sample_uniform (a float or 0-d tensor) are that row's random numbers,
    the same ones verify() would get (both may be None for strategy=greedy).
    offer() takes the next draft token and its q [vocab] (None: deterministic draft) and says whether
    it was accepted; after the first rejection the row is done. finish() adds the bonus token if no
    draft was rejected and returns (tokens, kinds). Stopping early is num_drafts = drafts offered.
    """

    def __init__(
        self,
        target_probs: Tensor | Callable[[int], Tensor],
        accept_uniforms: Tensor | None,
        sample_uniform: float | Tensor | None,
        *,
        strategy: str = "exact",
        leniency: float = 1.0,
    ):
        check_strategy(strategy, leniency)
        if strategy != "greedy" and (accept_uniforms is None or sample_uniform is None):
            raise ValueError(f"strategy={strategy} needs accept_uniforms [gamma] and sample_uniform")
        self.target_probs = target_probs
        self.accept_uniforms = accept_uniforms  # [gamma]
        self.sample_uniform = sample_uniform
        self.strategy = strategy
        self.leniency = leniency
        self.tokens: list[int] = []
        self.kinds: list[int] = []
        self.rejected = False
        self.finished = False

    def _p(self, position: int) -> Tensor:
        if callable(self.target_probs):
            return self.target_probs(position)  # [vocab]
        if position >= self.target_probs.shape[0]:
            raise ValueError(f"target_probs has {self.target_probs.shape[0]} positions, needed position {position}")
        return self.target_probs[position]  # [vocab]

    def _emit(self, emit_from: Tensor) -> int:
        """One token from emit_from [vocab], as verify() picks its extra token."""
        if self.strategy == "greedy":
            return int(emit_from.argmax())
        uniform = torch.as_tensor(self.sample_uniform, dtype=torch.float64).reshape(1)  # [1]
        return int(sample_from_probs(emit_from[None], uniform)[0])

    def offer(self, token: int, q_probs: Tensor | None = None) -> bool:
        if self.rejected or self.finished:
            raise RuntimeError("this row is done: a draft was rejected or finish() was called")
        position = len(self.tokens)
        if self.accept_uniforms is not None and position >= self.accept_uniforms.shape[0]:
            raise ValueError(f"more drafts offered than accept_uniforms ({self.accept_uniforms.shape[0]})")
        p = self._p(position)  # [vocab]
        if self.strategy == "greedy":
            accepted = token == int(p.argmax())
        else:
            q_at_x = torch.ones_like(p[token]) if q_probs is None else q_probs[token]  # []
            accept_prob = acceptance_probs(p[token], q_at_x, self.leniency)  # []
            accepted = bool(self.accept_uniforms[position] < accept_prob)
        if accepted:
            self.tokens.append(token)
            self.kinds.append(ACCEPTED)
            return True
        if self.strategy == "greedy":
            emit_from = p  # the correction is the argmax of p
        else:
            q = None if q_probs is None else q_probs[None]  # [1, vocab]
            drafted = torch.tensor([token], device=p.device)  # [1]
            emit_from = replacement_distribution(p[None], q, drafted, self.strategy)[0]  # [vocab]
        self.tokens.append(self._emit(emit_from))
        self.kinds.append(RECOVERED)
        self.rejected = True
        return False

    def finish(self) -> tuple[list[int], list[int]]:
        if not self.rejected and not self.finished:
            self.tokens.append(self._emit(self._p(len(self.tokens))))
            self.kinds.append(BONUS)
        self.finished = True
        return list(self.tokens), list(self.kinds)


def expected_tokens_per_forward(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): expected emitted tokens per verify with i.i.d. acceptance."""
    if alpha >= 1.0:
        return float(gamma + 1)  # the limit of the geometric sum as alpha -> 1
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


class AcceptanceStats:
    """Acceptance counters accumulated over verify() calls; summary() is JSON-serialisable.

    A "target forward" counts once per row per verify call (a batched forward over 8 rows counts 8).
    gamma may change between calls (adaptive drafts), so the counters are kept per draft position
    and per number of drafts, and gamma reports the largest one seen.
    """

    def __init__(self):
        self.gamma = 0
        self.num_verify_calls = 0
        self.num_target_forwards = 0  # rows verified, summed over calls
        self.num_drafted = 0
        self.num_accepted = 0
        self.num_emitted = 0
        self.reached_at: list[int] = []  # [position] rows whose draft at this position was looked at
        self.accepted_at: list[int] = []  # [position] rows that accepted the draft at this position
        self.rows_by_num_drafts: dict[int, int] = {}  # num_drafts -> rows verified with that many drafts

    def update(self, result: VerifyResult, num_drafts: Tensor | int) -> None:
        """num_drafts: the [batch] tensor given to verify(), or an int when every row had that many.
        Counted as AcceptanceTally counts (one rule for both), then read back at once."""
        batch, slots = result.tokens.shape
        num_drafts = torch.as_tensor(num_drafts, device=result.tokens.device).expand(batch)  # [batch]
        tally = AcceptanceTally(slots - 1, result.tokens.device)
        tally.update(result, num_drafts)
        tally.flush_into(self)

    def merge(self, other: "AcceptanceStats") -> "AcceptanceStats":
        self.add_counts(**vars(other))
        return self

    @classmethod
    def from_dict(cls, counters: dict) -> "AcceptanceStats":
        """The counters as vars() gave them, back from JSON (whose object keys are strings)."""
        stats = cls()
        stats.add_counts(**{**counters, "rows_by_num_drafts": {int(k): v for k, v in counters["rows_by_num_drafts"].items()}})
        return stats

    def add_counts(self, *, gamma, num_verify_calls, num_target_forwards, num_drafted, num_accepted, num_emitted,
                   reached_at, accepted_at, rows_by_num_drafts):
        """Add counts summed elsewhere (another AcceptanceStats, JSON, an AcceptanceTally)."""
        self.gamma = max(self.gamma, gamma)
        self.num_verify_calls += num_verify_calls
        self.num_target_forwards += num_target_forwards
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.num_emitted += num_emitted
        for mine, theirs in ((self.reached_at, reached_at), (self.accepted_at, accepted_at)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, count in enumerate(theirs):
                mine[i] += count
        for d, rows in rows_by_num_drafts.items():
            self.rows_by_num_drafts[d] = self.rows_by_num_drafts.get(d, 0) + rows

    def summary(self) -> dict:
        """Rates are None where nothing was counted yet.

        acceptance_rate is accepted / drafted (drafts after a rejection count as drafted). The
        theoretical tokens per forward (1 - a^(gamma+1)) / (1 - a) (Leviathan et al. 2022, eq. 1)
        takes a = alpha, the chance that a draft is accepted *given that it was reached*, measured as
        accepted / reached; it is averaged over the rows' numbers of drafts (gamma when fixed).
        """

        def ratio(a, b):
            return a / b if b else None

        alpha = ratio(self.num_accepted, sum(self.reached_at))  # None only if no row had a draft
        theoretical = None
        if self.num_target_forwards:
            expected = sum(
                rows * expected_tokens_per_forward(alpha or 0.0, d)
                for d, rows in self.rows_by_num_drafts.items()
            )
            theoretical = expected / self.num_target_forwards
        return {
            "acceptance_rate": ratio(self.num_accepted, self.num_drafted),
            "alpha": alpha,
            "acceptance_per_position": [ratio(a, r) for a, r in zip(self.accepted_at, self.reached_at)],
            "mean_accepted_length": ratio(self.num_accepted, self.num_target_forwards),
            "tokens_per_target_forward": ratio(self.num_emitted, self.num_target_forwards),
            "theoretical_tokens_per_forward": theoretical,
            "gamma": self.gamma,
            "mean_num_drafts": ratio(self.num_drafted, self.num_target_forwards),
            "num_verify_calls": self.num_verify_calls,
            "num_target_forwards": self.num_target_forwards,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "num_emitted": self.num_emitted,
        }


class AcceptanceTally:
    """AcceptanceStats' counters summed on the batch's device step after step, and read back to the host
    only when asked (`flush_into`): AcceptanceStats.update reads every step, a host round trip each on
    an accelerator. gamma_max: the widest verification the caller will ask for."""

    def __init__(self, gamma_max: int, device: torch.device):
        self.gamma_max, self.device = gamma_max, device
        self.counts = torch.zeros(3, dtype=torch.long, device=device)  # drafted, accepted, emitted
        self.reached_at = torch.zeros(gamma_max, dtype=torch.long, device=device)  # [gamma_max]
        self.accepted_at = torch.zeros(gamma_max, dtype=torch.long, device=device)  # [gamma_max]
        self.by_num_drafts = torch.zeros(gamma_max + 1, dtype=torch.long, device=device)  # [gamma_max + 1]
        self.calls = self.forwards = self.gamma = 0

    def update(self, result: VerifyResult, num_drafts: Tensor) -> None:
        """result of verify() over [batch] rows, num_drafts [batch] (on the device)."""
        batch, slots = result.tokens.shape
        gamma = slots - 1
        self.calls += 1
        self.forwards += batch
        self.gamma = max(self.gamma, gamma)
        num_accepted = result.num_accepted  # [batch]
        self.counts += torch.stack((num_drafts.sum(), num_accepted.sum(), result.num_emitted.sum()))
        if gamma:
            positions = torch.arange(gamma, device=num_accepted.device)  # [gamma]
            reached = (positions < num_drafts[:, None]) & (positions <= num_accepted[:, None])  # [batch, gamma]
            self.reached_at[:gamma] += reached.sum(0)
            self.accepted_at[:gamma] += (positions < num_accepted[:, None]).sum(0)
        # a histogram by comparison, not torch.bincount: on CUDA bincount reads the maximum back to size its output
        values = torch.arange(self.gamma_max + 1, device=num_drafts.device)  # [gamma_max + 1]
        self.by_num_drafts += (num_drafts[:, None] == values[None, :]).sum(0)

    def flush_into(self, stats: AcceptanceStats) -> None:
        """Add what was counted since the last flush to stats (one read of the device), and start again."""
        if not self.calls:
            return
        counts = torch.cat((self.counts, self.reached_at, self.accepted_at, self.by_num_drafts)).tolist()
        g = self.gamma_max
        drafted, accepted, emitted = counts[:3]
        reached_at, accepted_at, by_num = counts[3:3 + g], counts[3 + g:3 + 2 * g], counts[3 + 2 * g:]
        stats.add_counts(gamma=self.gamma, num_verify_calls=self.calls, num_target_forwards=self.forwards,
                         num_drafted=drafted, num_accepted=accepted, num_emitted=emitted,
                         reached_at=reached_at[:self.gamma], accepted_at=accepted_at[:self.gamma],
                         rows_by_num_drafts={d: n for d, n in enumerate(by_num) if n})
        self.__init__(self.gamma_max, self.device)
