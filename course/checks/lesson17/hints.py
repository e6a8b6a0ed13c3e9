"""Lesson 17's hint ladder (``python -m course hint 17 EXERCISE``; collapsed in the notebook)."""

HINTS: dict[str, tuple[str, ...]] = {}
