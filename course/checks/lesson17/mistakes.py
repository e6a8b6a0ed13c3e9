"""Lesson 17's mistake catalogue: each wrong variant of a reference function FAILS the check named; each
equivalent PASSES every check (tests/test_mistakes.py proves both)."""
from __future__ import annotations

MISTAKES = []
EQUIVALENTS = []
