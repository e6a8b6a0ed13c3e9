"""Mutants of the lesson-15 reference that no check can fail, each with why (``python -m course mutants 15``
lists the rest: each of those is a gap that a new check closes)."""

EQUIVALENT_MUTANTS: dict[str, str] = {
}
