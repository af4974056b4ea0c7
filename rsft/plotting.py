"""What rsft's interval plots share: a mean with its 95% interval per point, and saving a finished figure.

Used by the online report (rsft.online_report) and the benchmark scripts (bench_grpo, bench_labels); matplotlib
is imported on use, with the Agg backend (no display)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def interval_errorbar(ax, xs, shown: list[dict], **kwargs) -> None:
    """Draw means with their intervals: `shown` holds rsft.stats.bootstrap's {mean, low, high} per x."""
    ax.errorbar(xs, [m["mean"] for m in shown], yerr=[[m["mean"] - m["low"] for m in shown],
                                                      [m["high"] - m["mean"] for m in shown]],
                marker="o", capsize=3, **kwargs)


def finish(fig, axes, out: Path, dpi: int = 110) -> Path:
    """A light grid and a legend on every axis, then write the figure to `out` (its folder made) and close it."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    pyplot().close(fig)
    return out
