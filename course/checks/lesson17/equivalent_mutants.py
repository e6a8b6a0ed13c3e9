"""Mutants of the lesson-17 reference that no check can fail, each with why: equivalent to the reference.
``python -m course mutants 17`` lists the rest: each of those is a gap that a new check (and a catalogued mistake)
closes."""

EQUIVALENT_MUTANTS: dict[str, str] = {
    "_spans#1: constant 0 -> -1":
        "resume starts at -1 instead of 0: position < resume is false for every position >= 0 either way",
    "_validate_weights#1: statements swapped with the next one":
        "missing and unexpected are computed from the same two dicts, independently: their order does not matter",
    "_validate_weights#2: statements swapped with the next one":
        "unexpected and fits are computed from the same two dicts, independently: their order does not matter",
    "update_normalization_units#1: statements swapped with the next one":
        "counts and the empty units list are independent assignments",
    "sft_epoch#1: statements swapped with the next one":
        "units and the empty reports list are independent assignments",
}
