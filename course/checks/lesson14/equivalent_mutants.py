"""Mutants of the lesson-14 reference that no check can fail, each with why (``python -m course mutants 14``
lists the rest: each of those is a gap that a new check closes)."""

EQUIVALENT_MUTANTS: dict[str, str] = {
    "_optimizer_update#1: statements swapped with the next one":
        "reading the scale before or after unscale_ is the same: unscale_ never changes the scale",
    "_optimizer_update#5: statements swapped with the next one":
        "scaler.update() reads the inf/NaN record unscale_ left, not the gradients: zero_grad before it is the same",
    "train_one_epoch#1: constant True -> False":
        "non_blocking=False on the CPU: .to('cpu') returns the very same tensor either way",
    "train_one_epoch#2: constant True -> False":
        "non_blocking=False on the CPU: .to('cpu') returns the very same tensor either way",
    "train_one_epoch#9: statement removed (Assign)":
        "no .to(device) with device='cpu' and CPU batches: .to would return the same tensors (on CUDA a missing "
        "move fails at once with a device mismatch, not silently)",
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
    "update_cadence_due#1: arithmetic // -> /":
        "only evaluated when step % K == 0, where step / K is an exact float equal to step // K",
    "adamw_param_groups#1: statements swapped with the next one":
        "building the embedding-id set and the two empty lists are independent",
}
