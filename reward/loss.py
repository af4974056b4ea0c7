"""The Bradley-Terry loss with soft labels.

For a pair (chosen, rejected) with label hp = P(chosen beats rejected):

    loss = -hp * log sigmoid(r_c - r_r) - (1 - hp) * log sigmoid(r_r - r_c)

i.e. the cross-entropy between the label and the model's P(chosen wins) = sigmoid(r_c - r_r). With a
hard label (hp = 1) it is TRL's -log sigmoid(r_c - r_r); hp = 0.5 (a tie) pulls the two rewards
together. TRL's RewardTrainer has only the hard-label form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor,
                       label_prob: torch.Tensor | None = None) -> torch.Tensor:
    """Mean soft-label BT loss; r_chosen, r_rejected, label_prob: [pairs]. None = hard labels (hp = 1)."""
    margin = r_chosen - r_rejected  # [pairs]
    hp = torch.ones_like(margin) if label_prob is None else label_prob.to(margin.dtype)
    return -(hp * F.logsigmoid(margin) + (1 - hp) * F.logsigmoid(-margin)).mean()
