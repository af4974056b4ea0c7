"""Keyed, counter-based uniforms: a random number is a pure function of (key, counter).

Why: rsft's sampler gives every completion its own random stream, so a completion's tokens depend
on (seed, prompt, sample index) and not on its batch, its neighbours or a resume. A
`torch.Generator` per row gives that only through a Python loop over the rows and, on a GPU, a
host round trip per row. A counter-based generator gives it in one vectorised call for all rows:
uniform = f(completion key, position, slot), computed with integer tensor operations on the
batch's own device (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"; JAX's
threefry and PyTorch's CUDA generator are of this family). torch has no public keyed generator
that takes a key per element, hence this module.

The function is Philox4x32-10: 10 rounds of a Feistel-like network over four 32-bit counter words
with a 64-bit key; it passes TestU01's BigCrush and is checked here against Random123's published
known-answer vectors (tests/sampling/test_keyed_random.py). torch's unsigned 64-bit integers lack
shifts and products on the CPU, so the 32 x 32 -> 64-bit products are formed from 16-bit halves in
int64, where nothing overflows (every intermediate is below 2^49), on any device.

How the sampler keys it: key = the completion's 63-bit seed; counter = (tokens the completion has
emitted before this step, slot // 2, stream, 0), and each call of the function gives two float64
uniforms with 53 random bits each (two words per uniform). Within a step, slot 0 is the emitted
token's draw, slot 1 + 2j draft j's sample and slot 2 + 2j draft j's acceptance test. A step
emits at least one token, so no counter is used twice for a completion, and what a row draws does
not depend on any other row or on the batch's widest gamma.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # Philox4x32's round multipliers
KEY_STEPS = (0x9E3779B9, 0xBB67AE85)  # the key schedule's Weyl increments
ROUNDS = 10

# streams: independent families of draws under one key (the sampler's own; a benchmark's oracle draft)
SAMPLER_STREAM = 0
ORACLE_DRAFT_STREAM = 1


def _mulhilo(a: torch.Tensor, multiplier: torch.Tensor):
    """a [...] int64 holding 32-bit words, multiplier broadcastable -> (hi, lo) 32-bit words of the
    64-bit product, from 16-bit halves of a: each partial product is below 2^48 (no int64 overflow)."""
    low_part = (a & 0xFFFF) * multiplier  # [...] < 2^48
    high_part = (a >> 16) * multiplier  # [...] < 2^48
    middle = low_part + ((high_part & 0xFFFF) << 16)  # [...] < 2^49: the product's low 49 bits, carried
    return (high_part >> 16) + (middle >> 32), middle & MASK32


_CONSTANTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The round multipliers and key increments on `device`, made once (no host-to-device copy a step)."""
    if device not in _CONSTANTS:
        _CONSTANTS[device] = (torch.tensor(MULTIPLIERS, dtype=torch.long, device=device),
                              torch.tensor(KEY_STEPS, dtype=torch.long, device=device))
    return _CONSTANTS[device]


def philox4x32(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """counter [..., 4], key [..., 2] (int64 holding 32-bit words, broadcastable) -> [..., 4] words."""
    multipliers, steps = _constants(counter.device)  # [2] each
    even, odd = counter[..., 0::2], counter[..., 1::2]  # [..., 2] each: (c0, c2), (c1, c3)
    key = key.expand(*even.shape[:-1], 2)  # [..., 2]
    for round_index in range(ROUNDS):
        if round_index:
            key = (key + steps) & MASK32
        hi, lo = _mulhilo(even, multipliers)  # [..., 2]: products of c0 and c2
        # c0' = hi(c2) ^ c1 ^ k0, c1' = lo(c2), c2' = hi(c0) ^ c3 ^ k1, c3' = lo(c0)
        even, odd = hi.flip(-1) ^ odd ^ key, lo.flip(-1)
    return torch.stack((even, odd), -1).flatten(-2)  # [..., 4] in word order c0 c1 c2 c3


def key_words(seeds: torch.Tensor) -> torch.Tensor:
    """seeds [...] int64 (63-bit completion seeds) -> Philox keys [..., 2] (low word, high word)."""
    return torch.stack((seeds & MASK32, (seeds >> 32) & MASK32), -1)


def keyed_uniforms(keys: torch.Tensor, positions: torch.Tensor, slots: int, stream: int = SAMPLER_STREAM
                   ) -> torch.Tensor:
    """keys [rows, 2] (key_words), positions [rows] -> float64 uniforms [rows, slots] in [0, 1).

    Uniform (row, s) is a function of (keys[row], positions[row], s, stream) alone."""
    rows = keys.shape[0]
    blocks = (slots + 1) // 2
    device = keys.device
    counter = torch.zeros(rows, blocks, 4, dtype=torch.long, device=device)  # [rows, blocks, 4]
    counter[..., 0] = positions[:, None] & MASK32
    counter[..., 1] = torch.arange(blocks, dtype=torch.long, device=device)[None, :]
    counter[..., 2] = stream
    words = philox4x32(counter, keys[:, None, :])  # [rows, blocks, 4]
    # 27 + 26 bits of two words -> a float64 in [0, 1) with all 53 mantissa bits random
    bits = ((words[..., 0::2] >> 5) << 26) + (words[..., 1::2] >> 6)  # [rows, blocks, 2]
    return (bits.double() * 2.0 ** -53).flatten(1)[:, :slots]  # [rows, slots]
