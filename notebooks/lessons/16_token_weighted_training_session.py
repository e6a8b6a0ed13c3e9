# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 16 — token-weighted gradient accumulation and the single-step TrainingSession
#
# This notebook is the JupyterLab route through lesson 16. The explanations live in the lesson text,
# `course/lessons/16_token_weighted_training_session.md` (Chinese:
# `course/lessons/zh/16_token_weighted_training_session.md`); each exercise below names its section.
#
# Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError()`), run the
# cell, then run the test cell under it. The test cells call exactly the checks that
# `python -m course check 16` runs on `impl/core/train_session.py`, so both routes grade the same way.
# Some test cells hold hidden tests that only run when the notebook is graded.
#
# The API types (`TrainingStepOutput`, `TrainingStepOptions`, `TrainingStepReport`,
# `TrainingSessionState`, `AccumulationInvalidError`) come from `course/session_types.py`. The last
# part trains with *your* session and draws the mean-of-means gap (also saved under `figures/`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
from contextlib import nullcontext
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch

from course.checks.notebook import run_checks
from course.experiments.token_weighting import VARIANTS, compare, draw_comparison
from course.minimind import IGNORE_INDEX
from course.notebooks import show_and_save
# Lesson 14's answer (the reference): whether micro-step s closes a window of K; use it if you like.
from course.reference.core.train_loop import should_step_optimizer
from course.session_types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingSessionState,
                                  TrainingStepOptions, TrainingStepOutput, TrainingStepReport)

# The tensors here are tiny: one thread is faster, and several notebooks graded side by side on a
# small machine no longer fight over cores.
torch.set_num_threads(1)

# %% [markdown]
# ## Exercise 1 — counting what the loss averages over (lesson 16 §4.1, the math in §2)
#
# The model's loss is a mean over the *shifted* targets `labels[..., 1:] != -100`.

# %% nbgrader={"grade": false, "grade_id": "count_loss_units", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: count_loss_units

# %% nbgrader={"grade": true, "grade_id": "test_count_loss_units", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point: counts the shifted valid targets, as a Python int.
run_checks(globals(), "16", "count_loss_units_sees_the_shift")

# %% nbgrader={"grade": true, "grade_id": "hidden_count_loss_units", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point, hidden: the argument checks the docstring asks for (the visible line keeps an unsolved
# exercise at 0 here too).
run_checks(globals(), "16", "count_loss_units_sees_the_shift")
### BEGIN HIDDEN TESTS
run_checks(globals(), "16", "count_loss_units_rejects_bad_labels")
### END HIDDEN TESTS

# %% [markdown]
# ## Exercise 2 — a global batch in micro-batches (lesson 16 §4.2, semantics in §5)
#
# `--batch-size` is now the batch of one optimizer update; K micro-batches share it.

# %% nbgrader={"grade": false, "grade_id": "split_global_batch", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: split_global_batch

# %% nbgrader={"grade": true, "grade_id": "test_split_global_batch", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point: micro-batches of global // K samples, in order; a short last global batch is split over what remains.
run_checks(globals(), "16", "split_global_batch_micro_sizes")

# %% nbgrader={"grade": true, "grade_id": "hidden_split_global_batch", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point, hidden: a batch that does not divide, or bad sizes, fail fast.
run_checks(globals(), "16", "split_global_batch_micro_sizes")
### BEGIN HIDDEN TESTS
run_checks(globals(), "16", "split_global_batch_fails_fast")
### END HIDDEN TESTS

# %% [markdown]
# ## Exercise 3 — updates per epoch (lesson 16 §4.2)
#
# The short tail of an epoch is an update too.

# %% nbgrader={"grade": false, "grade_id": "steps_per_epoch", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: steps_per_epoch

# %% nbgrader={"grade": true, "grade_id": "test_steps_per_epoch", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point: ceil(samples / global batch) and its argument checks.
run_checks(globals(), "16", "steps_per_epoch_is_ceil")

# %% [markdown]
# ## Exercise 4 — the TrainingSession (lesson 16 §4.3, the protocol in §3)
#
# One parameter update over K calls of `train_step`: each micro-batch's loss is weighted by
# `gradient_units / normalization_units`, and the session owns the update boundary
# (unscale → clip → step → update → zero_grad). The tests compare the accumulated gradients with one
# backward of the whole global batch (atol 1e-6).

# %% nbgrader={"grade": false, "grade_id": "TrainingSession", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: TrainingSession

# %% nbgrader={"grade": true, "grade_id": "test_TrainingSession", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# 3 points: K micro-steps make one optimizer step, force_update closes a short tail, the gradient equals
# the global batch's, and the reported grad norm is the pre-clip one.
run_checks(globals(), "16", "session_two_microsteps_one_optimizer_step", "session_force_update_commits_a_tail",
           "session_global_normalization_matches_one_backward", "session_grad_norm_is_pre_clip")

# %% nbgrader={"grade": true, "grade_id": "hidden_TrainingSession", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# 3 points, hidden: argument checks, abort and error handling, hooks, lr, loss sums on the device,
# no_sync, GradScaler overflow with unscale before clip, autocast, and a whole text run.
run_checks(globals(), "16", "session_two_microsteps_one_optimizer_step")
### BEGIN HIDDEN TESTS
run_checks(globals(), "16", "session_rejects_zero_normalization_units", "session_rejects_an_optimizer_on_other_tensors",
           "session_abort_discards_the_update", "session_error_invalidates_the_accumulation",
           "session_after_update_runs_after_step_before_zero_grad",
           "session_sets_lr_and_normalization_is_fixed_per_update", "session_keeps_loss_sums_on_device",
           "session_uses_no_sync_before_the_last_microstep", "session_amp_scaler_overflow_and_unscale_before_clip",
           "session_runs_step_fn_under_autocast", "session_drives_the_text_run")
### END HIDDEN TESTS

# %% [markdown]
# ## Exercise 5 — migrating a legacy training state (lesson 16 §6)
#
# An old state counted micro-batches and micro-steps; it resumes at the last update boundary.

# %% nbgrader={"grade": false, "grade_id": "migrate_train_state", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: migrate_train_state

# %% nbgrader={"grade": true, "grade_id": "test_migrate_train_state", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point: a legacy state becomes global semantics at the last update boundary, the input untouched.
run_checks(globals(), "16", "migrate_legacy_state_to_global_semantics")

# %% nbgrader={"grade": true, "grade_id": "hidden_migrate_train_state", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point, hidden: global states come back as copies; unknown semantics and bad legacy values are refused.
run_checks(globals(), "16", "migrate_legacy_state_to_global_semantics")
### BEGIN HIDDEN TESTS
run_checks(globals(), "16", "migrate_keeps_global_states_and_rejects_bad_ones")
### END HIDDEN TESTS

# %% [markdown]
# ## Experiment on your code: the mean-of-means gap vs token-weighted (lesson 16 §8)
#
# Padded tiny-corpus samples, sorted by length inside each global batch of 8 (K = 4), so the
# micro-batches hold very different numbers of valid targets. Three copies of the tiny model train
# 10 AdamW updates with **your** `TrainingSession`, `count_loss_units` and `split_global_batch`:
# one full-batch backward per update (the truth), your session with token weighting, and your session
# fed lesson 14's `mean / K`. At each update both accumulated gradients are also measured at the
# full-batch model's weights.

# %% nbgrader={"grade": false, "grade_id": "plot_token_weighting", "locked": true, "schema_version": 3, "solution": false, "task": false}
history = compare(SimpleNamespace(TrainingSession=TrainingSession, count_loss_units=count_loss_units,
                                  split_global_batch=split_global_batch))
print(f"valid targets per micro-batch in update 1: {history['units'][0]}")
for variant in VARIANTS[1:]:
    print(f"{variant:>15}: update 1 cosine = {history['cosine'][variant][0]:.4f}, max |grad diff| = "
          f"{history['max_diff'][variant][0]:.3e}; drift after {len(history['loss_gap'])} updates = "
          f"{history['drift'][variant][-1]:.3e}")

fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), layout="constrained")
draw_comparison(axes, history)
fig.suptitle("Naive loss / K (a mean of micro-batch means) vs token-weighted accumulation, against the full batch")
show_and_save(fig, "16_token_weighting")
