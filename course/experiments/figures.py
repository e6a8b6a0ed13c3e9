"""Saving a notebook's figures next to it."""
from __future__ import annotations

from pathlib import Path


def show_and_save(fig, name: str, folder: str = "figures") -> Path:
    """Save ``fig`` as ``folder/name.png`` (next to the notebook) and show it inline."""
    import matplotlib.pyplot as plt

    path = Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.show()
    return path
