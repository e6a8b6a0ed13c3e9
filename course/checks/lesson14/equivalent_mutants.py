"""Mutants of the lesson-14 reference that no core check can fail, each with why (``python -m course mutants 14``
lists the rest: each of those is a gap that a new check closes). A core mutant that only a hardening check fails
is listed here when only a convention differs."""

EQUIVALENT_MUTANTS: dict[str, str] = {
    "_optimizer_update#1: statements swapped with the next one":
        "reading the scale before or after unscale_ is the same: unscale_ never changes the scale",
    "_optimizer_update#5: statements swapped with the next one":
        "scaler.update() reads the inf/NaN record unscale_ left, not the gradients: zero_grad before it is the same",
    "_optimizer_update#1: constant True -> False":
        "only a convention differs: zero_grad(set_to_none=False) leaves zero tensors where None frees the memory; "
        "the next backward adds to the zeros, the same gradients (the hardening check "
        "train_one_epoch_clears_gradients_to_none grades it)",
    "train_one_epoch#1: constant True -> False":
        "non_blocking=False on the CPU: .to('cpu') returns the very same tensor either way",
    "train_one_epoch#2: constant True -> False":
        "non_blocking=False on the CPU: .to('cpu') returns the very same tensor either way",
    "train_one_epoch#4: statements swapped with the next one":
        "moving the batch and setting last_step are independent",
    "train_one_epoch#5: statements swapped with the next one":
        "setting last_step and computing the lr are independent",
    "train_one_epoch#2: constant 1 -> 0":
        "param_groups[0] and [-1] hold the same lr: it is written into every group (graded by the param-group check)",
    "train_one_epoch#1: statements swapped with the next one":
        "the record lists and last_step = start_step are independent initialisations",
    "train_one_epoch#6: statements swapped with the next one": "two independent appends (steps, lrs)",
    "train_one_epoch#7: statements swapped with the next one": "two independent appends (lrs, losses)",
    "train_one_epoch#8: statements swapped with the next one": "two independent appends (losses, aux_losses)",
    "train_one_epoch#2: statements swapped with the next one":
        "two independent read-backs at the end (loss_values, aux_values)",
    "train_one_epoch#3: statements swapped with the next one":
        "two independent read-backs at the end (aux_values, norm_values)",
    "lr_per_update#2: statements swapped with the next one":
        "the counts are validated first, so updates_per_epoch computed before the position rule cannot raise",
    "update_cadence_due#1: arithmetic // -> /":
        "only evaluated when step % K == 0, where step / K is an exact float equal to step // K",
    "adamw_param_groups#1: statements swapped with the next one":
        "building the embedding-id set and the two empty lists are independent",
    # the test-writing exercise test_accumulation_matches_big_batch: other inputs as strong as the reference's
    "test_accumulation_matches_big_batch#1: constant 3 -> 4":
        "2 micro-batches of 4 samples: another micro-batch size != K, an equally strong test",
    "test_accumulation_matches_big_batch#1: constant 1 -> 2":
        "a 2-layer model instead of 1: every wrong implementation still shows, on more parameters",
    "test_accumulation_matches_big_batch#1: constant 16 -> 17":
        "the tiny corpus is still unpadded at this length: an equally strong test",
    "test_accumulation_matches_big_batch#1: constant 16 -> 15":
        "the tiny corpus is still unpadded at this length: an equally strong test",
    "test_accumulation_matches_big_batch#1: constant 0 -> -1":
        "tiny_batches(..., 1, ...)[-1]: the only batch drawn is also the last, the same samples",
    "test_accumulation_matches_big_batch#2: constant 1 -> 2":
        "tiny_batches(..., 2, ...)[0]: the first of 2 batches holds the same samples as the only one",
    "test_accumulation_matches_big_batch#2: constant 0 -> 1":
        "another seed draws other samples, as different from each other: an equally strong test",
    "test_accumulation_matches_big_batch#2: constant 0 -> -1":
        "another seed draws other samples, as different from each other: an equally strong test",
    "test_accumulation_matches_big_batch#1: arithmetic + -> -":
        "the test's model is dense, its aux_loss exactly 0; and on an MoE model no big-batch test can pin the"
        " aux loss: a product of two batch means, it is not additive over micro-batches (the router's "
        "accumulated gradient is 7 % off)",
    "test_accumulation_matches_big_batch#4: call: first two arguments swapped":
        "assert_close(expected, actual): rtol scales by the accumulated instead of the big-batch gradient, "
        "equal to ~1e-7",
    "test_accumulation_matches_big_batch#5: call: first two arguments swapped":
        "unpadded pretraining labels ARE the input ids (the model shifts them): zip(labels, input_ids) builds"
        " the same micro-batches",
    "test_accumulation_matches_big_batch#1: statements swapped with the next one":
        "scenario and k, micro_size are independent assignments",
    "test_accumulation_matches_big_batch#3: statements swapped with the next one":
        "the batch and the seeded big model are independent (tiny_batches draws with its own generator)",
    "test_accumulation_matches_big_batch#6: statements swapped with the next one":
        "building the second model between forward and backward changes nothing: the backward draws no random"
        " numbers",
}
