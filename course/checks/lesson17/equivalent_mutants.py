"""Mutants of the lesson-17 reference that no core check can fail, each with why. ``python -m course mutants 17``
lists the rest: each of those is a gap that a new check closes."""

EQUIVALENT_MUTANTS: dict[str, str] = {}
