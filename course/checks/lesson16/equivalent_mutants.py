"""Mutants of the lesson-16 reference that no check can fail, each with why (``python -m course mutants 16``
lists the rest: each of those is a gap that a new check closes)."""

EQUIVALENT_MUTANTS: dict[str, str] = {
}
