"""Mutants of the lesson-16 reference that no check can fail, each with why (``python -m course mutants 16``
lists the rest: each of those is a gap that a new check closes)."""

EQUIVALENT_MUTANTS: dict[str, str] = {
    # the test-writing exercise test_token_weighted_matches_global_batch: other inputs as strong as the reference's
    "test_token_weighted_matches_global_batch#1: constant 16 -> 17":
        "cut 17 masks nothing in a 16-token sample, as 16 does: the same micro-batches",
    "test_token_weighted_matches_global_batch#1: constant 16 -> 15":
        "cuts (15, 15), ...: valid targets 28, 10, 2, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 15 -> 16":
        "cuts (16, 16), ...: valid targets 30, 10, 2, 1, still unequal, masked targets in 3 micro-batches",
    "test_token_weighted_matches_global_batch#1: constant 15 -> 14":
        "cuts (16, 14), ...: valid targets 28, 10, 2, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 9 -> 10":
        "cuts ..., (10, 3), ...: valid targets 29, 11, 2, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 9 -> 8":
        "cuts ..., (8, 3), ...: valid targets 29, 9, 2, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 3 -> 4":
        "cuts ..., (9, 4), ...: valid targets 29, 11, 2, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 3 -> 2":
        "cuts ..., (9, 2), ...: valid targets 29, 9, 2, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 2 -> 3":
        "cuts ..., (3, 2), ...: valid targets 29, 10, 3, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 2 -> 1":
        "cuts ..., (1, 2), ...: valid targets 29, 10, 1, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#2: constant 2 -> 3":
        "cuts ..., (2, 3), ...: valid targets 29, 10, 3, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#2: constant 2 -> 1":
        "cuts ..., (2, 1), ...: valid targets 29, 10, 1, 1, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#3: constant 2 -> 3":
        "cuts ..., (3, 0): valid targets 29, 10, 2, 2, still unequal, masked and position-0 labels kept",
    "test_token_weighted_matches_global_batch#3: constant 2 -> 1":
        "cuts ..., (1, 0): valid targets 29, 10, 2, 0 (a micro-batch without a target), still unequal, masked"
        " and position-0 labels kept",
    "test_token_weighted_matches_global_batch#1: constant 0 -> 1":
        "cuts ..., (2, 1): a label at position 0 only (no shifted target): the counts 29, 10, 2, 1 stay, the "
        "unshifted count sees one more",
    "test_token_weighted_matches_global_batch#1: constant 0 -> -1":
        "cuts ..., (2, -1): only the last label masked: valid targets 29, 10, 2, 15, still unequal",
    "test_token_weighted_matches_global_batch#3: call: first two arguments swapped":
        "assert_close(expected, actual): rtol scales by the accumulated instead of the global-batch gradient,"
        " equal to ~1e-7",
    "test_token_weighted_matches_global_batch#3: statements swapped with the next one":
        "input_ids and labels are concatenated independently",
    "test_token_weighted_matches_global_batch#4: statements swapped with the next one":
        "concatenating the labels and building the seeded big model are independent",
    "test_token_weighted_matches_global_batch#6: statements swapped with the next one":
        "building the second model between forward and backward changes nothing: the backward draws no random"
        " numbers",
}
