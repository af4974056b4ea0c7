"""Logits -> the processed distribution that both the draft and the target sample from.

Speculative sampling is exact only when q (draft) and p (target) are the distributions each side
*actually* samples from (Leviathan et al. 2022, arXiv 2211.17192, appendix A.1; Chen et al. 2023,
arXiv 2302.01318). So the sampling settings are applied here, once, the same way for both models,
and the verifier only ever sees the resulting probabilities:

    logits -> / temperature -> top-k -> top-p -> softmax, in float32 (also for bf16 logits)

- top-k keeps the k highest logits (ties with the k-th are kept too); top_k = 0 is off.
- top-p (nucleus) keeps the smallest set of most probable tokens whose mass is >= top_p, and always
  at least one token: the rule of Hugging Face's TopPLogitsWarper, written as "drop a token when the
  tokens strictly more probable than it already hold >= top_p".
- greedy decoding is a one-hot at the argmax (temperature 0 is not a distribution).

Sampling is inverse-CDF with uniforms that the caller passes in (rsft.sampling.keyed_random: a
function of the completion's seed and position), so a row's random numbers depend only on its own
seed and not on which batch it landed in; no global RNG is touched anywhere.
"""

import torch
from torch import Tensor


def check_sampling_settings(temperature: float, top_k: int, top_p: float, strategy: str) -> None:
    """Raise ValueError naming the bad setting (the sampler's check; rsft.config calls each rule below
    for its own setting)."""
    check_temperature(temperature, strategy)
    check_top_p(top_p)
    check_top_k(top_k)


# below this, logits a few tens apart divided by the temperature can pass float32's range: NaN probabilities, and
# samples that are not the policy's; what so cold a temperature asks for is the argmax, strategy=greedy
MIN_TEMPERATURE = 1e-6


def check_temperature(temperature: float, strategy: str) -> None:
    """strategy=greedy takes the argmax: temperature is unused there, and must be >= MIN_TEMPERATURE for any other."""
    if strategy == "greedy":
        return
    if not temperature > 0:  # `not >` also catches NaN
        raise ValueError(
            f"temperature must be > 0 for strategy={strategy} (got {temperature}); "
            "for greedy decoding set sample.strategy=greedy"
        )
    if temperature < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature must be at least {MIN_TEMPERATURE:g} for strategy={strategy} (got {temperature:g}): "
            f"the logits divided by it can overflow float32; for the argmax set sample.strategy=greedy"
        )


def check_top_p(top_p: float, key: str = "top_p") -> None:
    """A nucleus keeps a positive mass at most 1; `key` is the setting's name in the message."""
    if not 0 < top_p <= 1:  # `not` also catches NaN
        raise ValueError(f"{key}={top_p!r}: expected a number in (0, 1] (1.0 = off)")


def check_top_k(top_k: int, key: str = "top_k") -> None:
    """top_k counts the tokens kept; 0 keeps them all."""
    if top_k < 0:
        raise ValueError(f"{key}={top_k!r}: expected an integer >= 0 (0 = off)")


def check_finite(logits: Tensor, row_ids=None, where: str = "") -> None:
    """Raise ValueError naming the first row of logits [batch, ..., vocab] that cannot be sampled from.

    NaN and +inf are bad. -inf alone is fine (some models mask tokens that way), but a row position
    where every token is -inf has nothing to sample. row_ids[i] names batch row i in the message
    (e.g. a prompt id); where says whose logits these are (e.g. "target logits").
    """
    if logits.dim() < 2:
        raise ValueError(f"logits must be [batch, ..., vocab], got shape {tuple(logits.shape)}")
    # fast path, one reduction instead of four passes: a finite sum means no NaN and no +-inf anywhere
    # (an overflowing sum of finite values, or a model that masks with -inf, takes the full check below)
    if torch.isfinite(logits.sum(dtype=torch.float32)):
        return
    per_row = logits.reshape(logits.shape[0], -1, logits.shape[-1])  # [batch, positions, vocab]
    bad_value = (per_row.isnan() | (per_row == float("inf"))).flatten(1).any(-1)  # [batch]
    all_masked = (per_row == float("-inf")).all(-1).any(-1)  # [batch]
    bad = bad_value | all_masked  # [batch]
    if not bad.any():
        return
    index = int(bad.nonzero()[0])
    name = row_ids[index] if row_ids is not None else index
    problem = "NaN or +inf" if bad_value[index] else "every token at -inf (nothing to sample)"
    prefix = f"{where}: " if where else ""
    raise ValueError(f"{prefix}row {name} (batch index {index}) has {problem} in its logits")


def probs_from_logits(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                      in_place: bool = False) -> Tensor:
    """logits [..., vocab] (any dtype) -> float32 probs [..., vocab] after temperature, top-k, top-p.

    in_place: float32 logits the caller owns become the probabilities (no tensor of the vocabulary's
    size is allocated: on a CPU, fresh memory of that size costs more than the arithmetic)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to sample (got {temperature}); greedy decoding: greedy_probs")
    if in_place and logits.dtype == torch.float32 and top_k == 0 and top_p == 1.0:
        scores = logits.div_(temperature) if temperature != 1.0 else logits  # [..., vocab]
        scores.sub_(scores.amax(-1, keepdim=True)).exp_()  # the softmax, step by step, in place
        return scores.div_(scores.sum(-1, keepdim=True))  # [..., vocab]
    scores = logits.float() / temperature  # [..., vocab]
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))  # [..., vocab]
    if top_p < 1.0:
        sorted_scores = scores.sort(dim=-1, descending=True).values  # [..., vocab]
        sorted_probs = sorted_scores.softmax(-1)  # [..., vocab]
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # [..., vocab] mass of the more probable tokens
        # the most probable token has mass_before == 0 < top_p, so at least one token always stays
        drop_sorted = mass_before >= top_p  # [..., vocab]
        # every token tied with the last one kept stays too: which of equal scores a sort puts first may differ
        # between the plain step's shapes and the verification's (bf16 logits tie often), and p must not
        lowest_kept = sorted_scores.masked_fill(drop_sorted, float("inf")).amin(-1, keepdim=True)  # [..., 1]
        scores = scores.masked_fill(scores < lowest_kept, float("-inf"))  # [..., vocab]
    return scores.softmax(-1)  # [..., vocab]


def greedy_probs(logits: Tensor) -> Tensor:
    """logits [..., vocab] -> float32 one-hot [..., vocab] at the argmax (the first one on ties)."""
    top = logits.argmax(-1, keepdim=True)  # [..., 1]
    return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, top, 1.0)


BLOCK = 64  # tokens per block of the two-level inverse CDF


def sample_from_probs(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sampling: probs [batch, vocab], uniforms [batch] in [0, 1) -> tokens [batch] (long).

    Token i is returned when cdf[i-1] <= u * total < cdf[i], so a token with zero probability is never
    returned. The distribution is probs / probs.sum(-1), i.e. rows need not sum to exactly 1.

    Two levels, so that nothing of the vocabulary's size is copied or accumulated in float64 (on a CPU,
    fresh memory of that size costs more than the arithmetic): blocks of BLOCK tokens are summed in
    float32 and accumulated in float64 across blocks; u * total picks a block by those sums, and the
    rest of the threshold, rescaled to the block's own float64 running sum, picks the token inside it.
    So a token's probability is p_i / total times its block's (float32 sum / float64 sum), a factor
    within a few float32 roundings (~1e-7) of 1, the precision of the float32 probabilities
    themselves, and the same for every token of a block. (A float32 running sum over a whole 100k+
    vocabulary would drift by ~1e-4 and move the token boundaries.) Nothing is read back to the
    host."""
    if probs.dim() != 2 or uniforms.shape != probs.shape[:1]:
        shapes = f"{tuple(probs.shape)} and {tuple(uniforms.shape)}"
        raise ValueError(f"need probs [batch, vocab] and uniforms [batch], got {shapes}")
    batch, vocab = probs.shape
    device = probs.device
    full = vocab // BLOCK * BLOCK
    sums = [probs[:, :full].reshape(batch, -1, BLOCK).sum(-1, dtype=torch.float32)]  # [batch, full blocks]
    if full < vocab:
        sums.append(probs[:, full:].sum(-1, keepdim=True, dtype=torch.float32))  # [batch, 1] the short tail block
    block_mass = torch.cat(sums, 1).double() if len(sums) > 1 else sums[0].double()  # [batch, blocks]
    block_cdf = block_mass.cumsum(-1)  # [batch, blocks]
    blocks = block_cdf.shape[1]
    # scaling u by the row's own total keeps u * total < total even when rounding left the total at 1 - eps
    threshold = uniforms.double()[:, None] * block_cdf[:, -1:]  # [batch, 1]
    block = torch.searchsorted(block_cdf, threshold, right=True)  # [batch, 1]
    # u * total can still round up to total itself (u = 1 - 2^-53): the search then runs past the end; take the
    # last block with mass, and inside it its last token with nonzero probability (threshold past its end)
    past_end = block >= blocks  # [batch, 1]
    last_block = blocks - 1 - (block_mass > 0).flip(-1).int().argmax(-1, keepdim=True)  # [batch, 1]
    block = torch.where(past_end, last_block, block)  # [batch, 1]
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)  # [batch, 1] mass before it
    index = block * BLOCK + torch.arange(BLOCK, device=device)[None, :]  # [batch, BLOCK]
    in_vocab = index < vocab  # [batch, BLOCK] (the tail block is short)
    within = torch.where(in_vocab, probs.gather(1, index.clamp(max=vocab - 1)), 0.0)  # [batch, BLOCK]
    within_cdf = within.double().cumsum(-1)  # [batch, BLOCK]
    # the threshold's share of the chosen block (>= 0: block_cdf[block - 1] <= threshold), on the block's own
    # float64 running sum; the chosen block has mass (the search stops at a cdf that grew)
    share = (threshold - before) / block_mass.gather(1, block)  # [batch, 1]
    inside = torch.where(past_end, float("inf"), share * within_cdf[:, -1:])  # [batch, 1]
    offset = torch.searchsorted(within_cdf, inside, right=True)  # [batch, 1]
    # a share that rounds to the block's whole running sum takes its last token with nonzero probability
    # (below the end, the first cdf above the threshold is always a nonzero-probability token: a zero adds
    # nothing to the cdf)
    last_token = BLOCK - 1 - (within > 0).flip(-1).int().argmax(-1, keepdim=True)  # [batch, 1]
    offset = torch.where(offset >= BLOCK, last_token, offset)  # [batch, 1]
    return (block * BLOCK + offset).squeeze(-1)  # [batch]
