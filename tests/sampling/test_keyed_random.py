"""The keyed, counter-based uniforms: Philox4x32-10 against Random123's known answers, and what a
row's numbers depend on."""

import pytest
import torch
from scipy.stats import kstest

from rsft.sampling.keyed_random import ORACLE_DRAFT_STREAM, key_words, keyed_uniforms, philox4x32

# Random123's published known-answer vectors for Philox4x32-10 (its tests/kat_vectors)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_philox_matches_the_reference_implementation(counter, key, expected):
    out = philox4x32(torch.tensor([counter]), torch.tensor([key]))
    assert out[0].tolist() == list(expected)


def test_a_rows_uniforms_depend_on_its_key_position_and_slot_only():
    keys = key_words(torch.tensor([11, 12, 13, (1 << 63) - 1]))
    positions = torch.tensor([0, 5, 5, 127])
    u = keyed_uniforms(keys, positions, 7)  # [4, 7]
    assert u.shape == (4, 7) and u.dtype == torch.float64 and ((u >= 0) & (u < 1)).all()
    alone = keyed_uniforms(keys[2:3], positions[2:3], 3)  # another batch, fewer slots: the same first three
    assert torch.equal(alone[0], u[2, :3])
    assert not torch.equal(u[1], u[2])  # same position, another key
    assert not torch.equal(keyed_uniforms(keys[1:2], positions[1:2] + 1, 7)[0], u[1])  # the next position
    assert not torch.equal(keyed_uniforms(keys, positions, 7, stream=ORACLE_DRAFT_STREAM), u)
    before = torch.random.get_rng_state()
    keyed_uniforms(keys, positions, 3)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is not touched


def test_uniforms_are_uniform_and_uncorrelated_across_neighbouring_counters():
    """Kolmogorov-Smirnov against U(0, 1) over 200k draws from consecutive keys, positions and slots
    (false-alarm rate 1e-3 each, fixed inputs), and no correlation between a draw and the next position's."""
    keys = key_words(torch.arange(2000))
    u = keyed_uniforms(keys.repeat_interleave(20, 0), torch.arange(20).repeat(2000), 5)  # [40000, 5]
    assert kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    pairs = u[:, 0].reshape(2000, 20)
    correlation = torch.corrcoef(torch.stack((pairs[:, :-1].flatten(), pairs[:, 1:].flatten())))[0, 1]
    assert abs(float(correlation)) < 4 / (2000 * 19) ** 0.5  # ~4 standard errors
