"""One helper for the training figures: a tau plot saved as PNG, skipped without matplotlib."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["save_tau_figure"]


def save_tau_figure(path: str | Path, draw: Callable[[Any], None], *, xlabel: str, title: str,
                    ylabel: str = "DFlash acceptance length tau") -> bool:
    """Draw with ``draw(ax)`` on one axis whose y is DFlash's tau and save it at ``path``.
    Returns False (and writes nothing) where matplotlib is not installed (extra ``bench``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    draw(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
