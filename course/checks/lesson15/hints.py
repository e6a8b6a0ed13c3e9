"""Lesson 15's hint ladder (``python -m course hint 15 EXERCISE``; collapsed in the notebook): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
}
