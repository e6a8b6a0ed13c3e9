"""Optional: align the exercises with a real MiniMind checkout (``MINIMIND_ROOT=/path/to/minimind``).

Upstream's ``get_lr`` is read from ``trainer/trainer_utils.py`` and executed on its own (upstream's
module imports transformers, which this course does not need), then compared with ``cosine_lr``.
"""
from __future__ import annotations

import ast
import math
import os
from pathlib import Path

import pytest

from course.checks.framework import expect_close
from course.checks.lesson14 import LESSON

ROOT = os.environ.get("MINIMIND_ROOT")
pytestmark = [pytest.mark.upstream,
              pytest.mark.skipif(not ROOT, reason="set MINIMIND_ROOT to a MiniMind checkout to run this test")]


def upstream_get_lr():
    path = Path(ROOT) / "trainer" / "trainer_utils.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_lr"), None)
    assert node is not None, f"{path} has no top-level get_lr"
    namespace = {"math": math}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["get_lr"]


def test_cosine_lr_matches_upstream_get_lr(impl_module, impl_name):
    get_lr = upstream_get_lr()
    module = impl_module(LESSON)
    for total in (1, 20, 997):
        for step in sorted({0, 1, total // 2, total - 1, total}):
            try:
                actual = module.cosine_lr(step, total, 5e-4)
            except NotImplementedError as exc:
                if impl_name == "reference":
                    raise
                pytest.skip(f"TODO: {exc}")
            expect_close(f"cosine_lr({step}, {total}, 5e-4) vs upstream get_lr", actual, get_lr(step, total, 5e-4),
                         rtol=1e-12)
