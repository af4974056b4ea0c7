"""Simulated annotators for the demo task: pairwise preference labels from the gold judge.

A Bradley-Terry annotator with a temperature: completion i is preferred over completion j with
probability sigmoid((gold_i - gold_j) / temperature), where gold is `reward.gold.gold_score`. A
small temperature is a near-perfect annotator, a large one a noisy one; equal gold scores give a
coin flip. A soft label is that probability itself (what a large panel of such annotators would
report); a hard label is one annotator's Bernoulli draw from it, taken from the `random.Random`
passed in, so that labelling is reproducible and never touches global random state. Soft labels
draw nothing from the rng.
"""

from __future__ import annotations

import math
import random

from reward.refusals import ConfigError


def preference_probability(gold_i: float, gold_j: float, temperature: float) -> float:
    """P(i preferred over j) = sigmoid((gold_i - gold_j) / temperature)."""
    if temperature <= 0:
        raise ConfigError(f"prefs.tau={temperature}: the annotator temperature must be > 0 (e.g. prefs.tau=0.05)")
    z = (gold_i - gold_j) / temperature
    # Two branches so that exp() only ever sees a non-positive argument and cannot overflow.
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def label_pair(gold_i: float, gold_j: float, temperature: float, rng: random.Random, soft: bool) -> float:
    """The label of pair (i, j): soft, P(i preferred); hard, 1.0 if i is preferred else 0.0."""
    p = preference_probability(gold_i, gold_j, temperature)
    if soft:
        return p
    return 1.0 if rng.random() < p else 0.0
