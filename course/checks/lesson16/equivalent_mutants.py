"""Mutants of the lesson-16 reference that no core check can fail, each with why: equivalent to the reference, or
different only in a rule of the hardening tier (lesson 16 §4.5: the hardening check named in brackets fails it).
``python -m course mutants 16`` lists the rest: each of those is a gap that a new check closes."""

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
    # independent assignments: their order changes nothing
    "TrainingSession.__init__#2: statements swapped with the next one": "model/optimizer and K are set independently",
    "TrainingSession.__init__#3: statements swapped with the next one": "device_type reads model, not self.model",
    "TrainingSession.__init__#5: statements swapped with the next one": "scaler and autocast are set independently",
    "TrainingSession.__init__#6: statements swapped with the next one": "autocast and optimizer_step are independent",
    "TrainingSession.__init__#7: statements swapped with the next one": "two independent counters",
    "TrainingSession.__init__#8: statements swapped with the next one": "the valid flag and the pending totals are "
                                                                         "independent",
    "TrainingSession._clear_pending#1: statements swapped with the next one": "independent resets",
    "TrainingSession._clear_pending#2: statements swapped with the next one": "independent resets",
    "TrainingSession._clear_pending#3: statements swapped with the next one": "independent resets",
    "TrainingSession.reset_accumulation#1: statements swapped with the next one": "zero_grad and the counters' "
                                                                                   "reset are independent",
    "TrainingSession.reset_accumulation#2: statements swapped with the next one": "the pending totals and the "
                                                                                   "valid flag are independent",
    "TrainingSession._train_step#1: statements swapped with the next one": "closes_update and the no_sync lookup "
                                                                            "are independent",
    "TrainingSession._train_step#3: statements swapped with the next one": "two independent counters",
    "TrainingSession._close_update#1: statements swapped with the next one": "grad_norm = None does not touch the "
                                                                              "gradients unscale_ rewrites",
    "TrainingSession._close_update#2: statements swapped with the next one": "scaler.step never changes the scale: "
                                                                              "read before or after it, it is the same",
    "TrainingSession._close_update#5: statements swapped with the next one": "zero_grad and the counters' reset are "
                                                                              "independent",
    "migrate_train_state#2: statements swapped with the next one": "validating legacy and unpacking it are "
                                                                    "independent",
    "migrate_train_state#3: statements swapped with the next one": "micro_steps_per_epoch reads legacy, not the "
                                                                    "unpacked names",
    "migrate_train_state#5: statements swapped with the next one": "the note reads legacy['epoch'], not the new "
                                                                    "epoch",
    "TrainingSession.__init__#1: statements swapped with the next one": "the identity check reads its arguments, "
                                                                         "not self.model / self.optimizer",
    # only a rule of the hardening tier (lesson 16 §4.5) differs: the core's valid inputs train the same
    "split_global_batch#1: statement removed (Assign)":
        "without list(samples) a tuple or a range comes back as slices of its own type, equal in values "
        "(split_global_batch_returns_lists)",
    "TrainingSession.__init__#1: statement removed (Expr)":
        "no refusal of an optimizer over other tensors; an optimizer over the model's own parameters trains the "
        "same (session_rejects_an_optimizer_on_other_tensors)",
    "migrate_train_state#1: statement removed (Expr)":
        "no refusal of bad legacy values; a valid legacy state migrates the same (migrate_rejects_bad_states)",
    "TrainingSession.reset_accumulation#2: constant True -> False":
        "zero tensors instead of None gradients: the next update's gradient, and an SGD step, are the same "
        "(session_leaves_no_gradient_tensors)",
    "TrainingSession._close_update#1: constant True -> False":
        "zero tensors instead of None gradients: the next update's gradient, and an SGD step, are the same "
        "(session_leaves_no_gradient_tensors)",
    "TrainingSession.state#1: constant 0 -> -1":
        "the last param group's lr instead of group 0's: every group holds the same lr once options.lr or "
        "load_state wrote it; they differ only before either (session_load_state_only_at_a_boundary)",
    # _normalization_units is read only when microsteps_accumulated > 0, after a train_step wrote it
    "TrainingSession._clear_pending#2: constant 0 -> 1": "_normalization_units is written before it is ever read",
    "TrainingSession._clear_pending#2: constant 0 -> -1": "_normalization_units is written before it is ever read",
    "TrainingSession._clear_pending#2: statement removed (Assign)": "_normalization_units is written before it is "
                                                                     "ever read (the first train_step sets it)",
}
