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
# `python -m course check 15` runs on `impl/checkpoint.py`, so both routes grade the same way.
# Some test cells hold hidden tests that only run when the notebook is graded.
#
# Answer each section's questions in the lesson text before you write the cell. The answers are in a text of
# their own, for after your attempt: `python -m course answer 15 5.1` (5.2, ...); upstream's versions are
# walked through by `python -m course answer 15 3`, for after your first version.
#
# Training always runs on the course's oracle loop, so this notebook does not depend on your lesson 14.
# The last part interrupts a tiny run, resumes it with *your* functions and draws the loss curves
# (also saved under `figures/`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import dataclasses
import os
import tempfile
from collections.abc import Sized
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Sampler

from course.checks.notebook import run_checks
from course.experiments.figures import explain_unfinished_exercises, show_and_save
from course.experiments.resume import draw_loss_curves, drift, resume_runs
from course.runs import LoopScenario

# The tensors here are tiny: one thread is faster, and several notebooks graded side by side on a
# small machine no longer fight over cores.
torch.set_num_threads(1)
explain_unfinished_exercises()   # a figure cell run before its exercise is done names that exercise

# %% [markdown]
# ## Exercise 1 — skipping the batches a resumed epoch already trained (lesson 15 §5.1)
#
# MiniMind regenerates an epoch's order from its seed, so a resumed run only has to skip the first
# `step` batches. §5.1 asks what `__iter__` must read so that a reshuffled sampler gives its new order,
# and what `len` is. The graded objectives are listed in lesson 15 §4.2; the optional hardening
# cells under each exercise grade the conventions of §5.5 (0 points).

# %%
# exercise: SkipBatchSampler

# %% [markdown]
# ## Exercise 2 — writing a resume checkpoint (lesson 15 §5.2, principles in §1.1–§1.7)
#
# Everything the next micro-step reads: fp32 weights, AdamW's moments, the GradScaler, the counters,
# the world size, written so that a crash at any moment leaves the last good checkpoint whole (§1.7 says
# what that takes; §5.2 asks you to put it in order).

# %%
# exercise: save_checkpoint

# %% [markdown]
# ## Exercise 3 — loading it back, validating first (lesson 15 §5.3)
#
# A file that can run no code when it is read, and a file an exact resume cannot start from refused
# before the model, optimizer or scaler change: §5.3 asks you to list those files first.

# %%
# exercise: load_checkpoint

# %% [markdown]
# ## Exercise 4 — where to continue, and the whole resume (lesson 15 §5.4, graded as in §6.2)
#
# Which saved step is special (§5.4)? The second test stops a run at an update boundary, saves it with your `save_checkpoint`, loads it into fresh
# objects with your `load_checkpoint`, positions it with your `resume_position`, feeds it with your
# `SkipBatchSampler` and finishes: the result must equal the run that never stopped, **bitwise**.

# %%
# exercise: resume_position

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
