"""The soft-label Bradley-Terry loss: a hand computation, the hard-label limits, swap symmetry."""

import math

import pytest
import torch

from reward.loss import bradley_terry_loss

R_I = torch.tensor([1.5, -0.3, 0.0, 2.0])
R_J = torch.tensor([0.5, 0.7, 0.0, -1.0])


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_against_hand_computation():
    hp = torch.tensor([1.0, 0.8, 0.5, 0.1])
    expected = sum(-h * log_sigmoid(a - b) - (1 - h) * log_sigmoid(b - a)
                   for a, b, h in zip(R_I.tolist(), R_J.tolist(), hp.tolist())) / 4
    assert bradley_terry_loss(R_I, R_J, hp).item() == pytest.approx(expected, rel=1e-6)


def test_hard_labels_are_the_usual_loss():
    usual = -torch.nn.functional.logsigmoid(R_I - R_J).mean()
    assert bradley_terry_loss(R_I, R_J, torch.ones(4)).item() == pytest.approx(usual.item(), rel=1e-6)
    assert bradley_terry_loss(R_I, R_J).item() == pytest.approx(usual.item(), rel=1e-6)
    # hp = 0: j beat i, the usual loss with the pair swapped.
    swapped = -torch.nn.functional.logsigmoid(R_J - R_I).mean()
    assert bradley_terry_loss(R_I, R_J, torch.zeros(4)).item() == pytest.approx(swapped.item(), rel=1e-6)


@pytest.mark.parametrize("hp", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_symmetric_under_swap(hp):
    labels = torch.full((4,), hp)
    assert bradley_terry_loss(R_I, R_J, labels).item() == pytest.approx(
        bradley_terry_loss(R_J, R_I, 1 - labels).item(), rel=1e-6)


def test_soft_label_optimum_is_the_label():
    """The loss is minimised where sigmoid(r_i - r_j) equals the label."""
    margin = torch.zeros(1, requires_grad=True)
    optimiser = torch.optim.SGD([margin], lr=1.0)
    for _ in range(500):
        optimiser.zero_grad()
        bradley_terry_loss(margin, torch.zeros(1), torch.tensor([0.8])).backward()
        optimiser.step()
    assert torch.sigmoid(margin).item() == pytest.approx(0.8, abs=1e-3)


def test_label_smoothing_pulls_labels_toward_a_tie_and_must_be_below_one_half(make_cfg):
    from datasets import Dataset

    from rsft.bt_fit import smoothed
    from rsft.run import run_stage

    pairs = Dataset.from_list([{"prompt": "p", "chosen": "a", "rejected": "b", "label_prob": hp} for hp in (1.0, 0.7, 0.0)])
    assert smoothed(pairs, 0.0) is pairs
    assert [round(x, 6) for x in smoothed(pairs, 0.1)["label_prob"]] == [0.95, 0.68, 0.05]
    with pytest.raises(ValueError, match="reward.label_smoothing=0.5"):
        run_stage(make_cfg("stage=reward", "reward.label_smoothing=0.5"))
