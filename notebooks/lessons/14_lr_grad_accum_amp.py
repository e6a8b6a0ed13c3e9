# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 14 — learning rate, gradient accumulation, mixed precision, clipping
#
# This notebook is the JupyterLab route through lesson 14. The explanations live in the lesson text,
# `course/lessons/14_lr_grad_accum_amp.md` (Chinese: `course/lessons/zh/14_lr_grad_accum_amp.md`);
# each exercise below names its section.
#
# Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError()`), run the
# cell, then run the test cell under it. The test cells call exactly the checks that
# `python -m course check 14` runs on `impl/train_loop.py`, so both routes grade the same way.
# Some test cells hold hidden tests that only run when the notebook is graded.
#
# The scored cells grade the lesson's objectives (lesson 14 §3): the schedule, the loss scaling, the update
# cadence and order, the tail flush, the overflow skip, no host sync inside the loop, the records and your
# test. The cells named `check_..._hardening` run the optional hardening tier (argument rules and
# conventions, lesson 14 §5.7): they print PASS / FAIL and score no points. A warning your code emits is
# printed with the results and costs no points.
#
# The last part runs experiments on *your* functions and draws four figures (also saved under
# `figures/`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
from contextlib import nullcontext

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import MaxNLocator

from course.checks.notebook import run_checks
from course.experiments.figures import explain_unfinished_exercises, show_and_save
from course.runs import LoopScenario, accumulate_gradients, epoch_batches, run_impl, tiny_batches, tiny_model

# The tensors here are tiny: one thread is faster, and several notebooks graded side by side on a
# small machine no longer fight over cores (with 2 threads per kernel that costs 10-50x).
torch.set_num_threads(1)
explain_unfinished_exercises()   # a figure cell run before its exercise is done names that exercise

# %% [markdown]
# ## Exercise 1 — the cosine schedule (lesson 14 §5.1)
#
# MiniMind's `get_lr` has no warmup: it starts at `base_lr` and ends at `0.1 * base_lr`.
# It is evaluated at every **micro-step**, not only where the optimizer steps.

# %%
# exercise: cosine_lr

# %% [markdown]
# ## Exercise 2 — scaling the loss for accumulation (lesson 14 §5.2)
#
# K backward passes add their gradients. Dividing each micro-batch loss by K turns that sum into a mean.

# %%
# exercise: scale_loss_for_accumulation

# %% [markdown]
# ## Exercise 3 — when the optimizer steps (lesson 14 §5.3)
#
# Micro-steps are counted from 1. The optimizer steps when a micro-step closes a window of K.

# %%
# exercise: should_step_optimizer

# %% [markdown]
# ## Exercise 4 — the tail of an epoch (lesson 14 §5.4)
#
# When an epoch ends inside a window, its gradients are still waiting; they must not be thrown away.

# %%
# exercise: should_flush_tail

# %% [markdown]
# ## Exercise 5 — one epoch of the training loop (lesson 14 §5.5)
#
# Put the four pieces together into one epoch of MiniMind's loop. Lesson 14 §1 derives each part; the five
# actions of an update run in the one order that §1.5 leaves: derive it there before you write the loop.
# The test runs your loop and MiniMind's on the same tiny model and data and compares every record,
# every parameter and the AdamW state. The hidden tests add an enabled GradScaler with an overflow,
# `scaler=None` (no loss scaling: nothing is skipped) and a count of the host syncs inside the loop.

# %%
# exercise: train_one_epoch

# %% [markdown]
# ## Exercise 6 — write the test (lesson 14 §5.6)
#
# This time you write the test: K accumulated micro-batches with loss / K give the gradient of one big
# batch. Its argument is the implementation under test; `accumulate_gradients` (imported above) is a
# correct one, so `test_accumulation_matches_big_batch(accumulate_gradients)` must return. The grade cell
# also runs your test on the wrong implementations of lesson 14 §5.6, and your test must fail each of them
# (with `AssertionError`, §5.6 says why). Design its inputs and tolerance with §5.6's questions first.

# %%
# exercise: test_accumulation_matches_big_batch

# %% [markdown]
# ## Experiments on your code
#
# Every figure below is drawn from the functions you wrote above.
#
# ### The learning rate over micro-steps
#
# Two epochs of 10 micro-batches with K = 4: the lr of every micro-step, and markers where your loop
# closes an update (a window of K, or the tail flush). Compare them with your prediction 2 of lesson 14 §3.

# %% nbgrader={"grade": false, "grade_id": "plot_lr_schedule", "locked": true, "schema_version": 3, "solution": false, "task": false}
schedule = LoopScenario("lr schedule", epochs=2, iters=10, accumulation_steps=4)
records = run_impl(train_one_epoch, schedule).records
total = schedule.epochs * schedule.iters
micro = [r["epoch"] * schedule.iters + r["step"] for r in records]
lrs = [r["lr"] for r in records]
window_ends = [(m, lr) for m, lr, r in zip(micro, lrs, records) if r["update_closed"] and not r["tail_flush"]]
tail_flushes = [(m, lr) for m, lr, r in zip(micro, lrs, records) if r["tail_flush"]]

fig, ax = plt.subplots(figsize=(8, 4))
ax.plot(range(total + 1), [cosine_lr(s, total, schedule.base_lr) for s in range(total + 1)], ":",
        color="grey", label="cosine_lr(s, T) for s = 0 … T")
ax.plot(micro, lrs, "o-", ms=3, label="lr set at each micro-step")
ax.scatter(*zip(*window_ends), s=90, marker="^", color="tab:green", zorder=3,
           label=f"optimizer step (window of K = {schedule.accumulation_steps} closed)")
ax.scatter(*zip(*tail_flushes), s=90, marker="s", color="tab:red", zorder=3,
           label="optimizer step (tail flush at epoch end)")
for epoch in range(1, schedule.epochs):
    ax.axvline(epoch * schedule.iters + 0.5, ls="--", color="lightgrey", label="epoch boundary")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set(xlabel="global micro-step  s = epoch · iters + step", ylabel="learning rate",
       title="Cosine lr per micro-step, optimizer steps marked (2 epochs × 10 micro-batches, K = 4)")
ax.legend(fontsize=8)
show_and_save(fig, "14_lr_schedule")

# %% [markdown]
# ### K micro-batches vs one batch
#
# 16 unpadded samples (every sample has the same number of tokens), trained as one batch or as K
# micro-batches with accumulated gradients. Dividing by K reproduces the one-batch loss and gradient
# up to float rounding; forgetting it multiplies both by K.

# %% nbgrader={"grade": false, "grade_id": "plot_accumulation_equivalence", "locked": true, "schema_version": 3, "solution": false, "task": false}
equal_lengths = LoopScenario("equivalence")   # max_length 32: every corpus line fills it, no padding
input_ids, labels = tiny_batches(16, equal_lengths.max_length, 1, seed=0)[0]


def accumulate(k, loss_for_backward):
    """Fresh seeded model, K micro-batches: (sum of backpropagated losses, flat gradient)."""
    model = tiny_model(equal_lengths)
    total_loss = 0.0
    for ids, lab in zip(input_ids.chunk(k), labels.chunk(k)):
        loss = loss_for_backward(model(ids, labels=lab).loss, k)
        loss.backward()
        total_loss += loss.item()
    return total_loss, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def unscaled(loss, k):
    return loss


one_loss, one_grad = accumulate(1, unscaled)
for k in (2, 4, 8):
    loss_k, grad_k = accumulate(k, scale_loss_for_accumulation)
    rel = float((grad_k - one_grad).norm() / one_grad.norm())
    print(f"K={k}: loss {loss_k:.6f} vs one batch {one_loss:.6f};  relative gradient difference {rel:.1e}")

K = 4
scaled_loss, scaled_grad = accumulate(K, scale_loss_for_accumulation)
raw_loss, raw_grad = accumulate(K, unscaled)
fig, (ax_loss, ax_grad) = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained")
ax_loss.bar(["one batch\nof 16", f"K={K} micro-batches\nΣ loss / K", f"K={K} micro-batches\nΣ loss (not divided)"],
            [one_loss, scaled_loss, raw_loss], color=["grey", "tab:blue", "tab:orange"])
ax_loss.set(ylabel="loss that was backpropagated", title="Loss: one batch vs accumulated")
largest = one_grad.abs().topk(3000).indices   # drawing all ~10^5 entries takes seconds, shows the same
ax_grad.scatter(one_grad[largest], raw_grad[largest], s=4, color="tab:orange",
                label=f"Σ loss (not divided): slope K = {K}")
ax_grad.scatter(one_grad[largest], scaled_grad[largest], s=4, color="tab:blue", label="Σ loss / K: on y = x")
limit = float(one_grad.abs().max())
ax_grad.plot([-limit, limit], [-limit, limit], "k--", lw=1, label="y = x")
ax_grad.set(xlabel="gradient entry, one batch of 16", ylabel=f"gradient entry, K={K} micro-batches of 4",
            title=f"Gradient: the {len(largest)} largest entries")
ax_grad.legend(fontsize=8)
fig.suptitle("Gradient accumulation reproduces the big batch only when each loss is divided by K")
show_and_save(fig, "14_accumulation_equivalence")

# %% [markdown]
# ### GradScaler across an overflow
#
# An enabled `GradScaler` (CPU, fp32 here so the effect is easy to see) doubles its scale after 3 clean
# optimizer steps. We inject an `inf` into one gradient: the scaler skips that optimizer step and halves
# the scale.

# %% nbgrader={"grade": false, "grade_id": "plot_grad_scaler", "locked": true, "schema_version": 3, "solution": false, "task": false}
class RecordingScaler(torch.amp.GradScaler):
    """A GradScaler that remembers its scale after every update()."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.history = []

    def update(self, new_scale=None):
        super().update(new_scale)
        self.history.append(self.get_scale())


scaler_run = LoopScenario("scaler", epochs=1, iters=24, accumulation_steps=2)
OVERFLOW_AT_BACKWARD = 9   # micro-step 9 opens window 5, so optimizer step 5 sees the inf
INIT_SCALE = 2.0 ** 10
model = tiny_model(scaler_run)
optimizer = torch.optim.AdamW(model.parameters(), lr=scaler_run.base_lr)
scaler = RecordingScaler("cpu", init_scale=INIT_SCALE, growth_interval=3)
backward_calls = []


def inject_overflow(grad):
    backward_calls.append(len(backward_calls) + 1)
    return grad + float("inf") if backward_calls[-1] == OVERFLOW_AT_BACKWARD else grad


model.model.norm.weight.register_hook(inject_overflow)
applied = []   # optimizer steps that really ran (GradScaler skips optimizer.step on inf)
optimizer.register_step_post_hook(lambda *_: applied.append(len(scaler.history) + 1))
train_one_epoch(model, epoch_batches(scaler_run, 0), optimizer, device="cpu", epoch=0, epochs=1,
                iters=scaler_run.iters, base_lr=scaler_run.base_lr,
                accumulation_steps=scaler_run.accumulation_steps, grad_clip=scaler_run.grad_clip, scaler=scaler)
steps = range(1, len(scaler.history) + 1)
used = [INIT_SCALE] + scaler.history[:-1]   # the scale each optimizer step was taken with
skipped = [s for s in steps if s not in applied]
print(f"optimizer steps: {len(scaler.history)}, skipped: {skipped}, final scale: {scaler.get_scale():g}")

fig, ax = plt.subplots(figsize=(8, 4))
ax.step(steps, used, where="mid", label="scale used at this optimizer step")
ax.scatter(skipped, [used[s - 1] for s in skipped], s=120, marker="x", color="tab:red", zorder=3,
           label="skipped: inf in the unscaled gradients")
ax.set_yscale("log", base=2)
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set(xlabel="optimizer step", ylabel="GradScaler scale (log₂ axis)",
       title="GradScaler: ×2 after 3 clean steps, ×½ and skip on overflow")
ax.legend(fontsize=8)
show_and_save(fig, "14_grad_scaler")

# %% [markdown]
# ### Gradient norm before and after clipping
#
# `clip_grad_norm_` returns the norm **before** clipping (what your records hold) and rescales the
# gradients so their norm is at most `grad_clip`. A hook on `optimizer.step` measures what the
# optimizer really receives.

# %% nbgrader={"grade": false, "grade_id": "plot_grad_clipping", "locked": true, "schema_version": 3, "solution": false, "task": false}
clip_run = LoopScenario("clipping", epochs=1, iters=24, accumulation_steps=2, grad_clip=2.0)
model = tiny_model(clip_run)
optimizer = torch.optim.AdamW(model.parameters(), lr=clip_run.base_lr)
norm_at_step = []


def record_norm_at_step(opt, args, kwargs):
    grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
    norm_at_step.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


optimizer.register_step_pre_hook(record_norm_at_step)
records = train_one_epoch(model, epoch_batches(clip_run, 0), optimizer, device="cpu", epoch=0, epochs=1,
                          iters=clip_run.iters, base_lr=clip_run.base_lr,
                          accumulation_steps=clip_run.accumulation_steps, grad_clip=clip_run.grad_clip)
before = [r["grad_norm"] for r in records if r["update_closed"]]
steps = range(1, len(before) + 1)

fig, ax = plt.subplots(figsize=(8, 4))
ax.plot(steps, before, "o-", label="before clipping (grad_norm in your records)")
ax.plot(steps, norm_at_step, "s--", label="after clipping (seen by optimizer.step)")
ax.axhline(clip_run.grad_clip, color="tab:red", lw=1, label=f"grad_clip = {clip_run.grad_clip}")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set(xlabel="optimizer step", ylabel="global L2 norm of the gradients",
       title="clip_grad_norm_: norms above grad_clip are scaled down to it")
ax.legend(fontsize=8)
show_and_save(fig, "14_grad_clipping")

# %% [markdown]
# ## Extensions: fix upstream (optional, lesson 14 §10)
#
# Four places where upstream MiniMind's loop could be better. They are **optional**: their cells below
# check your code and print PASS / FAIL but score **no points** (the grade is the exercises above).
# `python -m course check 14 --all` grades the same functions in `impl/train_loop.py`, and
# `python labs/lesson14_fix_upstream.py --impl student` draws each one next to upstream's behaviour.
# An extension you skip only makes its own check cell fail.
#
# ### 10.1 — divide the tail by its real size r
#
# Upstream divides every micro-batch by K, also the r = iters % K micro-batches of an epoch's last,
# partial window: that update applies only r/K of their mean gradient.

# %%
# exercise: accumulation_divisor

# %% [markdown]
# ### 10.2 — the lr per optimizer update, and log/save cadence in updates
#
# One lr per update (constant within a window), from the update's number over the total number of updates;
# a log or a save counted in updates never falls inside a window whose gradients are still pending.

# %%
# exercise: lr_per_update

# %%
# exercise: update_cadence_due

# %% [markdown]
# ### 10.3 — no weight decay on norms and embeddings
#
# Upstream hands `model.parameters()` to AdamW: its decay also pulls RMSNorm weights and the (tied)
# embedding towards 0.

# %%
# exercise: adamw_param_groups

# %% [markdown]
# ### 10.4 — linear warmup before the cosine
#
# MiniMind's schedule starts at the full `base_lr`; a warmup ramps it up from 0 over the first W steps.

# %%
# exercise: warmup_cosine_lr
