# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 17 — Supervised fine-tuning: the loss mask belongs to the sample
#
# The explanations live in `course/lessons/17_sft_loss_mask.md` (Chinese: `course/lessons/zh/17_sft_loss_mask.md`).
# Write your code where it says `# YOUR CODE HERE`, run the cell, then the test cell under it: it
# calls the checks `python -m course check 17` runs. TODO(author): what this notebook adds (experiments, figures).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch

from course.checks.notebook import run_checks

torch.set_num_threads(1)

# %% [markdown]
# ## Exercise 1 — `first_exercise` (lesson 17 §1.1)

# %%
# exercise: first_exercise
