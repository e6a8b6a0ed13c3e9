"""Bad inputs end a run with one line, not a traceback.

The data and tokenizer readers raise ``InputError`` with a message that names the file:line, the path or the
argument; the command-line entry points (the oracle trainer, the stage assembly, the trace lab) turn it into
``error: <message>`` on stderr and exit code 2 through ``refusing_input_errors``.
"""
from __future__ import annotations

import functools
import os
import sys


class InputError(ValueError):
    """A data file, tokenizer or argument the run cannot use; the message names it (file:line, path or flag)."""


def refuse(error) -> int:
    """Print ``error: <message>`` on one line (once: rank 0 under torchrun, which sets RANK) and return the
    exit code of a refused run, 2."""
    if os.environ.get("RANK", "0") == "0":
        print("error: " + " ".join(str(error).splitlines()), file=sys.stderr)
    return 2


def refusing_input_errors(main):
    """``main``, returning ``refuse(error)`` for an ``InputError`` instead of raising it."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except InputError as error:
            return refuse(error)
    return run
