"""Mutants of the lesson-18 reference that no check can fail, each with why. ``python -m course mutants 18``
lists every other survivor: a gap that a new check (and a catalogued mistake) closes.

Most listed ``activation_bytes`` mutants change a term smaller than the checks' 5 % tolerance (course/checks/
lesson18/memory.py says why it is 5 %: whether two tensors share one storage is a kernel detail, b x hidden bytes
per layer and token, and the tolerance must let both accountings pass); each is listed with the term it moves."""

WITHIN_TOLERANCE = "within the activation checks' 5 % tolerance: "

EQUIVALENT_MUTANTS: dict[str, str] = {
    "flops_per_token#1: statements swapped with the next one":
        "hidden and kv_width are independent assignments",
    "ThroughputMeter.__init__#1: statements swapped with the next one":
        "_clock and _synchronize are independent assignments",
    "ThroughputMeter.__init__#2: statements swapped with the next one":
        "_synchronize and _warmup_left are independent assignments",
    "ThroughputMeter.__init__#3: statements swapped with the next one":
        "_warmup_left and _steps are independent assignments",
    "ThroughputMeter.__init__#4: statements swapped with the next one":
        "the first clock read (after _clock and _synchronize are set) does not use _steps",
    "RunningLoss.__init__#1: statements swapped with the next one":
        "_total and _count are independent assignments",
    "RunningLoss.add#2: statements swapped with the next one":
        "the sum and the count are updated independently",
    "activation_bytes#1: statements swapped with the next one":
        "the argument check and size = dtype.itemsize are independent",
    "activation_bytes#2: statements swapped with the next one":
        "size and the config's three fields are independent assignments",
    "activation_bytes#6: statements swapped with the next one":
        "per_token and targets are independent assignments",
    "_norm_bytes#2: arithmetic + -> -":
        WITHIN_TOLERANCE + "the 1/rms values, 4 bytes per row and head, counted negative (at most 4.0 % of a "
                           "case, the one with 16 heads)",
    "activation_bytes#1: constant 1 -> 2":
        WITHIN_TOLERANCE + "a main norm's one 4-byte 1/rms per token counted twice (0.2 %)",
    "activation_bytes#1: constant 1 -> 0":
        WITHIN_TOLERANCE + "a main norm's one 4-byte 1/rms per token left out (0.2 %)",
    "activation_bytes#4: arithmetic + -> -":
        WITHIN_TOLERANCE + "the loss's 4-byte total weight counted negative (0.0 %)",
    "activation_bytes#10: arithmetic + -> -":
        WITHIN_TOLERANCE + "the int64 targets counted negative (0.1 %)",
    "activation_bytes#5: arithmetic + -> -":
        WITHIN_TOLERANCE + "the float32 logsumexp, 4 bytes per head, counted negative (at most 3.3 %)",
    "activation_bytes#4: arithmetic * -> /":
        WITHIN_TOLERANCE + "the logsumexp as 4 / heads bytes instead of 4 x heads (at most 1.6 %)",
    "activation_bytes#9: arithmetic + -> -":
        WITHIN_TOLERANCE + "the per-head k norm counted negative (at most 2.4 %: 1 or 4 kv heads)",
    "activation_bytes#2: call: first two arguments swapped":
        WITHIN_TOLERANCE + "the k norm's width and rows swapped: its normalized output counted per head, not per "
                           "value (at most 0.5 %)",
    "activation_bytes#14: arithmetic * -> /":
        WITHIN_TOLERANCE + "the k norm's width as kv_heads / head_dim (at most 1.1 %)",
    "activation_bytes#3: call: first two arguments swapped":
        WITHIN_TOLERANCE + "the q norm's width and rows swapped: its normalized output counted per head, not per "
                           "value (at most 2.9 %)",
    "activation_bytes#13: arithmetic * -> /":
        WITHIN_TOLERANCE + "q's rotated values (size x hidden per layer and token) left out (at most 3.9 %): the "
                           "size of the term the attention output / o_proj input storage question moves",
    "activation_bytes#1: constant 3 -> 4":
        WITHIN_TOLERANCE + "the attention output and o_proj's input counted as two tensors (at most 3.9 %; the "
                           "catalogue's equivalent attention_output_copied)",
    "activation_bytes#1: constant 3 -> 2":
        WITHIN_TOLERANCE + "one size x hidden tensor per layer and token less (at most 3.9 %): as far below as "
                           "the equivalent accounting that counts o_proj's input apart is above",
    "without_rope_sync#2: constant 0 -> 1":
        "freqs_cos[1, 0] = cos(1) of computed tables, 0 of lost ones (a meta-device init loses every entry): the "
        "same decision",
    "without_rope_sync#2: constant 0 -> -1":
        "freqs_cos[-1, 0] = cos(max_position_embeddings - 1) is no zero of computed tables, 0 of lost ones",
    "without_rope_sync#3: constant 0 -> 1":
        "freqs_cos[0, 1] = cos(0) = 1 of computed tables, 0 of lost ones: the same decision",
    "without_rope_sync#3: constant 0 -> -1":
        "freqs_cos[0, -1] = cos(0) = 1 of computed tables, 0 of lost ones: the same decision",
}
