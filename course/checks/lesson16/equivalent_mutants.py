"""Mutants of the lesson-16 reference that no check can fail, each with why (``python -m course mutants 16``
lists the rest: each of those is a gap that a new check closes)."""

EQUIVALENT_MUTANTS: dict[str, str] = {
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
    "migrate_train_state#1: statements swapped with the next one": "micro_steps_per_epoch reads legacy, not the "
                                                                    "unpacked names",
    "migrate_train_state#3: statements swapped with the next one": "the note reads legacy['epoch'], not the new "
                                                                    "epoch",
    # _normalization_units is read only when microsteps_accumulated > 0, after a train_step wrote it
    "TrainingSession._clear_pending#2: constant 0 -> 1": "_normalization_units is written before it is ever read",
    "TrainingSession._clear_pending#2: constant 0 -> -1": "_normalization_units is written before it is ever read",
    "TrainingSession._clear_pending#2: statement removed (Assign)": "_normalization_units is written before it is "
                                                                     "ever read (the first train_step sets it)",
}
