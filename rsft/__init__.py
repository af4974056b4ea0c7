"""rsft: rejection-sampling fine-tuning (best-of-N) with an exact speculative sampler."""

__version__ = "0.1.0"
