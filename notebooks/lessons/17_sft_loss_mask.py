# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 17 — supervised fine-tuning: the loss mask belongs to the sample
#
# This notebook is the JupyterLab route through lesson 17. The explanations live in the lesson text,
# `course/lessons/17_sft_loss_mask.md` (Chinese: `course/lessons/zh/17_sft_loss_mask.md`); each exercise below
# names its section. The text asks the questions; once you have written your own answer,
# `python -m course answer 17 SECTION` prints the reasoning (e.g. `python -m course answer 17 5.1`).
#
# Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError()`), run the cell, then
# run the test cell under it. The test cells call exactly the checks that `python -m course check 17` runs on
# `impl/sft.py`, so both routes grade the same way. Some test cells hold hidden tests that only run when the
# notebook is graded. The points grade the lesson's objectives (lesson 17 §4.2 lists them); a
# `check_NAME_hardening` cell under an exercise runs the optional hardening tier (lesson 17 §5.5) and scores
# nothing, and so does the cell of the optional extension (§5.6).
#
# The oracle is upstream MiniMind's SFT data path, `course/minimind/sft.py`. The last part shows your mask on a
# conversation of the built-in chat corpus, then trains the tiny model on real SFT masks and draws what the mean
# of micro-batch means costs (also saved under `figures/`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import re
from dataclasses import replace

import matplotlib.pyplot as plt
import torch

from course.checks.notebook import run_checks
from course.experiments.figures import explain_unfinished_exercises, show_and_save
from course.experiments.token_weighting import SFT_SETUP, VARIANTS, compare, draw_comparison
from course.input_errors import InputError
from course.minimind import IGNORE_INDEX, ByteTokenizer
from course.minimind.sft import assistant_markers, read_state_dict
from course.protocol.text import token_weighted_step
from course.protocol.types import TrainingStepOptions
from course.reference import train_session as lesson16
from course.runs.sft import sft_dataset, sft_sample, upstream_tokenizer

# The tensors here are tiny: one thread is faster, and several notebooks graded side by side on a
# small machine no longer fight over cores.
torch.set_num_threads(1)
explain_unfinished_exercises()   # a figure cell run before its exercise is done names that exercise

# %% [markdown]
# ## Exercise 1 — the assistant-only mask (lesson 17 §5.1, the principles in §1.1 and §1.2)
#
# Which ids of a rendered conversation are targets, where does a span start and stop, and what happens where
# `max_length` cut the sample? The test cells compare your labels with upstream's, token for token.

# %%
# exercise: assistant_labels

# %% [markdown]
# ## Exercise 2 — pretrained weights in (lesson 17 §5.2, §1.3)
#
# Upstream loads with `strict=False`. What does that let through, and what must a load check before it
# changes the model?

# %%
# exercise: load_pretrained_weights

# %% [markdown]
# ## Exercise 3 — the normalization units of an update (lesson 17 §5.3, §1.4)
#
# Every K consecutive micro-batches form one update. Which count does each of them need before its backward?

# %%
# exercise: update_normalization_units

# %% [markdown]
# ## Exercise 4 — an SFT epoch on lesson 16's session (lesson 17 §5.3)
#
# The test cells hand your function lesson 16's reference `TrainingSession` and compare each update's gradient
# with one backward of all its micro-batches at once. What must happen to an update without any assistant token?

# %%
# exercise: sft_epoch

# %% [markdown]
# ## Exercise 5 — write the test (lesson 17 §5.4)
#
# Your test gets an implementation of `assistant_labels` and must pass a correct one and fail wrong ones. Which
# conversations (roles, turns, where `max_length` cuts them) make a wrong mask show?

# %%
# exercise: test_assistant_labels_match_upstream

# %% [markdown]
# ## Extension (optional) — an answer that starts with spaces (lesson 17 §5.6)
#
# Upstream loses such an answer once its empty think block is removed. Tokenize so that it is trained.

# %%
# exercise: encode_sft_prompt

# %% [markdown]
# ## Your mask on a conversation of the built-in corpus
#
# Line 4 of `labs/data/sft_tiny.jsonl`, two turns, as upstream's `SFTDataset` renders and cuts it (96 ids): each
# token of the sample, in brackets where your `assistant_labels` makes it a target.

# %% nbgrader={"grade": false, "grade_id": "show_mask", "locked": true, "schema_version": 3, "solution": false, "task": false}
sample_ids, _ = sft_dataset(96, add_system_ratio=0.0, empty_think_ratio=1.0)[4]
sample_ids = sample_ids.tolist()
mask = assistant_labels(sample_ids, *assistant_markers(upstream_tokenizer()))
decode = upstream_tokenizer().decode
print("".join(("[" + decode([i], skip_special_tokens=False) + "]") if label != IGNORE_INDEX
              else decode([i], skip_special_tokens=False) for i, label in zip(sample_ids, mask) if i))

# %% [markdown]
# ## Experiment: token weighting on real SFT masks (lesson 17 §6.2)
#
# The built-in corpus in the loader's order, global batches of 8 in K = 4 micro-batches: three copies of the tiny
# model train 5 AdamW updates (the lab runs 10) with lesson 16's session: one full-batch backward per update (the
# truth), token weighting, and the mean of micro-batch means (upstream's `loss / K`).

# %% nbgrader={"grade": false, "grade_id": "plot_sft_token_weighting", "locked": true, "schema_version": 3, "solution": false, "task": false}
history = compare(lesson16, replace(SFT_SETUP, updates=5), sft_dataset(SFT_SETUP.max_seq_len, seed=SFT_SETUP.seed))
for update, units in enumerate(history["units"], start=1):
    print(f"update {update}: assistant targets per micro-batch {units}")
for variant in VARIANTS[1:]:
    print(f"{variant:>15}: lowest cosine {min(history['cosine'][variant]):.4f}; drift after "
          f"{len(history['loss_gap'])} updates {history['drift'][variant][-1]:.2e}")

fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), layout="constrained")
draw_comparison(axes, history)
fig.suptitle("SFT masks: the mean of micro-batch means (loss / K) vs token-weighted accumulation, against the full batch")
show_and_save(fig, "17_sft_token_weighting")
