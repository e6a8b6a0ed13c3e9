"""Saving figures: a lab's off-screen, a notebook's next to it."""
from __future__ import annotations

from pathlib import Path


def save_lab_figure(fig, out: Path) -> None:
    """A lab's figure: laid out, written to ``out`` (its folder created) and closed (the labs draw off-screen)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def show_and_save(fig, name: str, folder: str = "figures") -> Path:
    """Save ``fig`` as ``folder/name.png`` (next to the notebook) and show it inline."""
    import matplotlib.pyplot as plt

    path = Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.show()
    return path
