"""Saving figures: a lab's off-screen, a notebook's next to it."""
from __future__ import annotations

import sys
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


def explain_unfinished_exercises() -> None:
    """In a notebook, a cell that calls an exercise whose cell still raises ``NotImplementedError`` (a figure drawn
    from your functions, say) says which exercise to finish instead of showing a bare traceback; other errors
    show as usual. Outside IPython it does nothing."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def unfinished(shell, kind, error, traceback, tb_offset=None):
        frame = traceback
        while frame.tb_next is not None:   # the innermost frame: the stub that raised
            frame = frame.tb_next
        name = getattr(frame.tb_frame.f_code, "co_qualname", frame.tb_frame.f_code.co_name)
        print(f"This cell needs `{name}`, which still raises NotImplementedError: finish its exercise above, run "
              f"that cell, then run this one again.", file=sys.stderr)

    shell.set_custom_exc((NotImplementedError,), unfinished)
