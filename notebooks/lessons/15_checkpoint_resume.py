# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 15 — checkpoint and exact resume
#
# This notebook is the JupyterLab route through lesson 15. The explanations live in the lesson text,
# `course/lessons/15_checkpoint_resume.md` (Chinese: `course/lessons/zh/15_checkpoint_resume.md`);
# each exercise below names its section.
#
# Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError()`), run the
# cell, then run the test cell under it. The test cells call exactly the checks that
# `python -m course check 15` runs on `impl/core/checkpoint.py`, so both routes grade the same way.
# Some test cells hold hidden tests that only run when the notebook is graded.
#
# Training always runs on the course's oracle loop, so this lesson does not depend on your lesson 14.
# The last part interrupts a tiny run, resumes it with *your* functions and draws the loss curves
# (also saved under `figures/`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import dataclasses
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from course.checks.notebook import run_checks
from course.checks.tiny_runs import LoopScenario
from course.experiments.resume import draw_loss_curves, drift, resume_runs
from course.notebooks import show_and_save

# The tensors here are tiny: one thread is faster, and several notebooks graded side by side on a
# small machine no longer fight over cores.
torch.set_num_threads(1)

# %% [markdown]
# ## Exercise 1 — skipping the batches a resumed epoch already trained (lesson 15 §5.1)
#
# MiniMind regenerates an epoch's order from its seed, so a resumed run only has to skip the first
# `step` batches. Upstream's sampler keeps the final partial batch; yours also refuses a skip the
# epoch cannot have.

# %% nbgrader={"grade": false, "grade_id": "SkipBatchSampler", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: SkipBatchSampler

# %% nbgrader={"grade": true, "grade_id": "test_SkipBatchSampler", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# 2 points: the same batches and len as upstream's sampler for every skip of several epochs.
run_checks(globals(), "15", "skip_batch_sampler_matches_upstream")

# %% nbgrader={"grade": true, "grade_id": "hidden_SkipBatchSampler", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point, hidden: the argument checks the docstring asks for (the visible line keeps an unsolved
# exercise at 0 here too).
run_checks(globals(), "15", "skip_batch_sampler_matches_upstream")
### BEGIN HIDDEN TESTS
run_checks(globals(), "15", "skip_batch_sampler_rejects_bad_arguments")
### END HIDDEN TESTS

# %% [markdown]
# ## Exercise 2 — writing a resume checkpoint (lesson 15 §5.2, principles in §1.1–§1.7)
#
# Everything the next micro-step reads: fp32 weights, AdamW's moments, the GradScaler, the counters,
# the world size. Written to a temporary file and renamed, so a crash never destroys the last good one.

# %% nbgrader={"grade": false, "grade_id": "save_checkpoint", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: save_checkpoint

# %% nbgrader={"grade": true, "grade_id": "test_save_checkpoint", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# 2 points: every entry is there, bit for bit, and loads with weights_only=True.
run_checks(globals(), "15", "save_checkpoint_writes_full_state")

# %% [markdown]
# ## Exercise 3 — loading it back, validating first (lesson 15 §5.3)
#
# `weights_only=True`, and every entry checked before the model, optimizer or scaler change.

# %% nbgrader={"grade": false, "grade_id": "load_checkpoint", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: load_checkpoint

# %% nbgrader={"grade": true, "grade_id": "test_load_checkpoint", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# 2 points: fresh model, optimizer and scaler get the saved state bit for bit.
run_checks(globals(), "15", "load_checkpoint_restores_everything")

# %% nbgrader={"grade": true, "grade_id": "hidden_save_checkpoint", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# 2 points, hidden (exercise 2, placed here because the atomic-write test reloads the surviving file with
# your load_checkpoint): an atomic write, no save with pending gradients, no negative counters.
run_checks(globals(), "15", "save_checkpoint_writes_full_state")
### BEGIN HIDDEN TESTS
run_checks(globals(), "15", "save_checkpoint_is_atomic", "save_checkpoint_refuses_pending_gradients",
           "save_checkpoint_rejects_bad_counters")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "hidden_load_checkpoint", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# 2 points, hidden: unreadable and foreign files are refused untouched; the world-size rescale.
run_checks(globals(), "15", "load_checkpoint_restores_everything")
### BEGIN HIDDEN TESTS
run_checks(globals(), "15", "load_checkpoint_rejects_unreadable_files", "load_checkpoint_rejects_foreign_checkpoints",
           "load_checkpoint_rescales_step_for_world_size")
### END HIDDEN TESTS

# %% [markdown]
# ## Exercise 4 — where to continue, and the whole resume (lesson 15 §5.4, graded as in §6.2)
#
# A checkpoint written at the end of an epoch continues at the start of the next one. The second
# test stops a run at an update boundary, saves it with your `save_checkpoint`, loads it into fresh
# objects with your `load_checkpoint`, positions it with your `resume_position`, feeds it with your
# `SkipBatchSampler` and finishes: the result must equal the run that never stopped, **bitwise**.

# %% nbgrader={"grade": false, "grade_id": "resume_position", "locked": false, "schema_version": 3, "solution": true, "task": false}
# exercise: resume_position

# %% nbgrader={"grade": true, "grade_id": "test_resume_position", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# 2 points: the resume positions; an fp32 resume (dense K = 2 and 4, MoE) equals the uninterrupted run.
run_checks(globals(), "15", "resume_position_cases", "exact_resume_fp32")

# %% nbgrader={"grade": true, "grade_id": "hidden_resume_position", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 1 point, hidden: the same with an enabled GradScaler whose scale was halved before the stop.
run_checks(globals(), "15", "resume_position_cases")
### BEGIN HIDDEN TESTS
run_checks(globals(), "15", "exact_resume_with_grad_scaler")
### END HIDDEN TESTS

# %% [markdown]
# ## Experiment on your code: resumed vs uninterrupted loss curves (lesson 15 §6.3)
#
# Two epochs of 6 micro-batches, K = 4, interrupted after micro-step 4 of epoch 0. The exact resume
# uses your four functions; the other curves are the shortcuts of §8 (AdamW restarted with empty
# moments — with your `load_checkpoint` —, upstream's fp16 resume file, upstream's save before the
# epoch's tail flush). The exact curve lies on the uninterrupted one; the others peel away after
# the interruption.

# %% nbgrader={"grade": false, "grade_id": "plot_resume_curves", "locked": true, "schema_version": 3, "solution": false, "task": false}
interrupted = LoopScenario("resume experiment", epochs=2, iters=6, accumulation_steps=4)
STOP_EPOCH, STOP_STEP = 0, 4
yours = SimpleNamespace(SkipBatchSampler=SkipBatchSampler, save_checkpoint=save_checkpoint,
                        load_checkpoint=load_checkpoint, resume_position=resume_position)
runs = resume_runs(yours, interrupted, STOP_EPOCH, STOP_STEP, "exact (your functions)")
for name, result in runs["resumed"].items():
    print(f"{name:<40} max |param - uninterrupted| = {drift(result, runs['uninterrupted']):.3e}")

fig, axes = plt.subplots(1, 2, figsize=(14, 5), layout="constrained")
draw_loss_curves(*axes, runs, interrupted.iters, STOP_EPOCH * interrupted.iters + STOP_STEP)
fig.suptitle("Interrupt at an update boundary, resume: your exact resume vs upstream's shortcuts")
show_and_save(fig, "15_resume_curves")
