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
# `python -m course check 16` runs on `impl/train_session.py`, so both routes grade the same way.
# Some test cells hold hidden tests that only run when the notebook is graded. The points grade the
# lesson's objectives (lesson 16 §4 lists them); a `check_NAME_hardening` cell under an exercise runs
# the optional hardening tier (argument rules and conventions, lesson 16 §4.5) and scores nothing.
#
# The API types (`TrainingStepOutput`, `TrainingStepOptions`, `TrainingStepReport`,
# `TrainingSessionState`, `AccumulationInvalidError`) come from `course/protocol/types.py`. The last
# part trains with *your* session and draws the mean-of-means gap (also saved under `figures/`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
from contextlib import nullcontext
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch

from course.checks.notebook import run_checks
from course.experiments.figures import explain_unfinished_exercises, show_and_save
from course.experiments.token_weighting import VARIANTS, Setup, compare, draw_comparison
from course.protocol.types import (GLOBAL_SEMANTICS, AccumulationInvalidError, TrainingSessionState,
                                           TrainingStepOptions, TrainingStepOutput, TrainingStepReport)
from course.protocol.text import shifted_target_count, token_nll_sum
from course.minimind import IGNORE_INDEX
# Lesson 14's answer (the reference): whether micro-step s closes a window of K; use it if you like.
from course.reference.train_loop import should_step_optimizer
from course.runs import LABEL_CUTS, SESSION_SCENARIO, accumulate_token_weighted, masked_micro_batches, tiny_model

# The tensors here are tiny: one thread is faster, and several notebooks graded side by side on a
# small machine no longer fight over cores.
torch.set_num_threads(1)
explain_unfinished_exercises()   # a figure cell run before its exercise is done names that exercise

# %% [markdown]
# ## Exercise 1 — counting what the loss averages over (lesson 16 §4.1, the math in §1)
#
# The model's loss is a mean over some of the label positions: which ones (§1.3)?

# %%
# exercise: count_loss_units

# %% [markdown]
# ## Exercise 2 — a global batch in micro-batches (lesson 16 §4.2, semantics in §5.3)
#
# `--global-batch-size` is the batch of one optimizer update; K micro-batches share it.

# %%
# exercise: split_global_batch

# %% [markdown]
# ## Exercise 3 — updates per epoch (lesson 16 §4.2)
#
# The short tail of an epoch is an update too.

# %%
# exercise: steps_per_epoch

# %% [markdown]
# ## Exercise 4 — the TrainingSession (lesson 16 §4.3, the protocol in §5.1)
#
# One parameter update over K calls of `train_step`, and the session owns the update boundary. The
# tests compare the accumulated gradients with one backward of the whole global batch (atol 1e-6);
# how to weight each micro-batch's backward, and the order of events at the boundary, are the
# questions of §4.3.

# %%
# exercise: TrainingSession

# %% [markdown]
# ## Exercise 5 — write the test (lesson 16 §4.4)
#
# You write the test: token-weighted accumulation gives the global batch's gradient.
# `accumulate_token_weighted` (imported above) is a correct implementation, so
# `test_token_weighted_matches_global_batch(accumulate_token_weighted)` must return. The grade cell
# also runs your test on the wrong implementations of §4.4's table, and each must make it fail.

# %%
# exercise: test_token_weighted_matches_global_batch

# %% [markdown]
# ## Exercise 6 — migrating a legacy training state (lesson 16 §5.4)
#
# An old state counted micro-batches and micro-steps; where does it resume (§5.4)?

# %%
# exercise: migrate_train_state

# %% [markdown]
# ## Experiment on your code: the mean-of-means gap vs token-weighted (lesson 16 §6)
#
# Padded tiny-corpus samples, sorted by length inside each global batch of 8 (K = 4), so the
# micro-batches hold very different numbers of valid targets. Three copies of the tiny model train
# 5 AdamW updates with **your** `TrainingSession`, `count_loss_units` and `split_global_batch`:
# one full-batch backward per update (the truth), your session with token weighting, and your session
# fed lesson 14's `mean / K`. At each update both accumulated gradients are also measured at the
# full-batch model's weights.

# %% nbgrader={"grade": false, "grade_id": "plot_token_weighting", "locked": true, "schema_version": 3, "solution": false, "task": false}
history = compare(SimpleNamespace(TrainingSession=TrainingSession, count_loss_units=count_loss_units,
                                  split_global_batch=split_global_batch), Setup(updates=5))   # the lab runs 10
print(f"valid targets per micro-batch in update 1: {history['units'][0]}")
for variant in VARIANTS[1:]:
    print(f"{variant:>15}: update 1 cosine = {history['cosine'][variant][0]:.4f}, max |grad diff| = "
          f"{history['max_diff'][variant][0]:.3e}; drift after {len(history['loss_gap'])} updates = "
          f"{history['drift'][variant][-1]:.3e}")

fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), layout="constrained")
draw_comparison(axes, history)
fig.suptitle("Naive loss / K (a mean of micro-batch means) vs token-weighted accumulation, against the full batch")
show_and_save(fig, "16_token_weighting")
