"""Mutants of the lesson-14 reference that no check can fail, each with why (``python -m course mutants 14``
lists the rest: each of those is a gap that a new check closes)."""

EQUIVALENT_MUTANTS: dict[str, str] = {
}
