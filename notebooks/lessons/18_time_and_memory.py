# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 18 — where a training step's time and memory go
#
# This notebook is the JupyterLab route through lesson 18. The explanations live in the lesson text,
# `course/lessons/18_time_and_memory.md` (Chinese: `course/lessons/zh/18_time_and_memory.md`); each exercise below
# names its section. The text asks the questions; once you have written your own answer,
# `python -m course answer 18 SECTION` prints the reasoning (e.g. `python -m course answer 18 5.1`).
#
# Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError()`), run the cell, then
# run the test cell under it. The test cells call exactly the checks that `python -m course check 18` runs on
# `impl/step_costs.py`, so both routes grade the same way. Some test cells hold hidden tests that only run when the
# notebook is graded. The points grade the lesson's objectives (lesson 18 §4.2 lists them); a
# `check_NAME_hardening` cell under an exercise runs the optional hardening tier (lesson 18 §5.6) and scores
# nothing, and so does the cell of the optional extension (§10.1).
#
# The last part measures with *your* functions: where the FLOPs of a token are as the sequence grows, what a
# timer without a synchronization reports on a fake GPU, what a training step keeps in memory, this CPU's
# tokens/s and MFU, and how many host syncs a log makes (the figures are also saved under `figures/`). Every
# time printed here is this machine's, now: run a cell twice and it moves.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import time
from collections import deque
from typing import Callable, Optional

import matplotlib.pyplot as plt
import torch

from course.checks.host_syncs import count_host_syncs
from course.checks.notebook import run_checks
from course.experiments.figures import explain_unfinished_exercises, show_and_save
from course.experiments.step_timing import CONFIGS, matmul_peak, training_step
from course.minimind import MiniMindConfig, MiniMindForCausalLM
from course.minimind.model import MiniMindModel
from course.runs.fake_device import FakeDevice
from course.runs.rope_check import recent_upstream_model

# The tensors here are tiny: one thread is faster, and several notebooks graded side by side on a
# small machine no longer fight over cores.
torch.set_num_threads(1)
explain_unfinished_exercises()   # a figure cell run before its exercise is done names that exercise

# %% [markdown]
# ## Exercise 1 — FLOPs per token (lesson 18 §5.1, the principle in §1.1)
#
# Which pieces of the model are matmuls, what does each cost per token, and what does a backward add? The test
# cells count the real model's forward and backward with `FlopCounterMode` and compare exactly.

# %%
# exercise: flops_per_token

# %% [markdown]
# ## Exercise 2 — tokens per second, measured right (lesson 18 §5.2, §1.2)
#
# Where must the synchronization go, which steps are left out, and what is a window's rate? The test cells run
# your meter on a fake clock and a fake asynchronous device.

# %%
# exercise: ThroughputMeter

# %% [markdown]
# ## Exercise 3 — MFU (lesson 18 §5.3, §1.3)

# %%
# exercise: mfu

# %% [markdown]
# ## Exercise 4 — the training state (lesson 18 §5.4, §1.4)
#
# Which tensors does training keep per parameter, and at which dtype? The test cells take a real optimizer step
# and add up the `nbytes` of what exists afterwards.

# %%
# exercise: training_state_bytes

# %% [markdown]
# ## Exercise 5 — the activations (lesson 18 §5.4, §1.5)
#
# What does autograd save for backward, op by op, and what grows with the sequence? The test cells record the
# saved tensors of the real model with `saved_tensors_hooks`.

# %%
# exercise: activation_bytes

# %% [markdown]
# ## Exercise 6 — logging without stalls (lesson 18 §5.5, §1.6)
#
# A running loss with no host sync per step, and one sync per log line. The test cells count the syncs.

# %%
# exercise: RunningLoss

# %% [markdown]
# ## Extension (optional) — the host sync recent upstream makes in every forward (lesson 18 §10.1)

# %%
# exercise: without_rope_sync

# %% [markdown]
# ## Where a token's FLOPs are, as the sequence grows
#
# Your `flops_per_token(config, T, training=True)` for the tiny model and the 26 M config of the labs (hidden 512,
# 8 layers), divided by $6N$. Before you run it: which curve starts near 1, which one lies above it, and which
# one grows faster with $T$, and why?

# %% nbgrader={"grade": false, "grade_id": "plot_flops_per_token", "locked": true, "schema_version": 3, "solution": false, "task": false}
lengths = [2 ** k for k in range(5, 13)]
fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
for name, fields in CONFIGS.items():
    config = MiniMindConfig(**fields)
    with torch.device("meta"):   # the parameters' shapes without their memory
        params = sum(p.numel() for p in MiniMindForCausalLM(config).parameters())
    ratios = [flops_per_token(config, length, training=True) / (6 * params) for length in lengths]
    print(f"{name}: {params:,} parameters, 6N = {6 * params:,}; training FLOPs per token / 6N from "
          f"{ratios[0]:.3f} (T = {lengths[0]}) to {ratios[-1]:.3f} (T = {lengths[-1]})")
    ax.plot(lengths, ratios, marker="o", label=f"{name} ({params / 1e6:.2f} M parameters)")
ax.axhline(1.0, color="gray", linestyle="--", label="6N")
ax.set_xscale("log", base=2)
ax.set_xlabel("sequence length T")
ax.set_ylabel("training FLOPs per token / 6N")
ax.set_title("Your flops_per_token against the 6N rule")
ax.legend()
show_and_save(fig, "18_flops_per_token")

# %% [markdown]
# ## A timer on a fake GPU
#
# `FakeDevice` (`course/runs/fake_device.py`) behaves like a GPU: a launch returns at once and the kernels run
# in the background. Each step below launches 10 ms of device work in 1 ms and trains on 1000 tokens. Your meter
# measures it twice, once with the device's `synchronize` and once without. Predict both rates first.

# %% nbgrader={"grade": false, "grade_id": "fake_device_timer", "locked": true, "schema_version": 3, "solution": false, "task": false}
for synchronized in (True, False):
    device = FakeDevice()
    meter = ThroughputMeter(warmup_steps=1, window=5, clock=device.clock,
                            synchronize=device.synchronize if synchronized else None)
    for _ in range(8):
        device.launch(0.010, launch_seconds=0.001)
        meter.step(1000)
    print(f"synchronize={'device.synchronize' if synchronized else 'None':<18} {meter.tokens_per_second():>12,.0f} "
          f"tokens/s (host clock at {device.host_time * 1e3:.0f} ms, device busy until {device.queue_ends * 1e3:.0f} ms)")

# %% [markdown]
# ## What a training step keeps in memory
#
# The 26 M config, a batch of 16: your `training_state_bytes` (AdamW, fp32 weights) beside your
# `activation_bytes` at growing sequence lengths, in fp32 and with bf16 parameters. Which part grows with $T$,
# and where do the activations overtake the state?

# %% nbgrader={"grade": false, "grade_id": "plot_step_memory", "locked": true, "schema_version": 3, "solution": false, "task": false}
config = MiniMindConfig(**CONFIGS["26m"])
with torch.device("meta"):
    state = training_state_bytes(MiniMindForCausalLM(config), optimizer="adamw")
state_gib = sum(state.values()) / 2 ** 30
print({name: f"{value / 2 ** 20:,.1f} MiB" for name, value in state.items()})
lengths = [64, 128, 256, 512, 1024, 2048]
fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
ax.axhline(state_gib, color="black", label="training state (fp32 weights, gradients, AdamW)")
for dtype in (torch.float32, torch.bfloat16):
    activations = [activation_bytes(config, 16, length, dtype) / 2 ** 30 for length in lengths]
    ax.plot(lengths, activations, marker="o", label=f"activations, {str(dtype).removeprefix('torch.')} parameters")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("sequence length T (batch of 16)")
ax.set_ylabel("GiB")
ax.set_title("The 26 M config's training step: state against saved activations")
ax.legend()
show_and_save(fig, "18_step_memory")

# %% [markdown]
# ## Tokens/s and MFU on this CPU
#
# The tiny model's training step (a batch of 8 sequences of 64 tokens), timed by your `ThroughputMeter` and
# turned into MFU by your `mfu` and `flops_per_token` against this machine's measured matmul peak (one thread,
# as this notebook runs). The first steps are drawn too: what do they pay for?

# %% nbgrader={"grade": false, "grade_id": "plot_cpu_throughput", "locked": true, "schema_version": 3, "solution": false, "task": false}
step = training_step(MiniMindConfig(**CONFIGS["tiny"]), batch_size=8, seq_len=64)
peak = matmul_peak()
per_step = []
meter = ThroughputMeter(warmup_steps=3, window=20)
for _ in range(25):
    one = ThroughputMeter(warmup_steps=0, window=1)
    step()
    one.step(step.tokens)
    meter.step(step.tokens)
    per_step.append(one.tokens_per_second())
rate = meter.tokens_per_second()
utilization = mfu(flops_per_token(step.config, 64, training=True), rate, peak.flops_per_second)
print(f"peak {peak.flops_per_second / 1e9:.1f} GFLOP/s ({peak.source})")
print(f"{rate:,.0f} tokens/s over the last 20 steps after 3 of warm-up: MFU {utilization:.1%}")
fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
ax.plot(range(1, len(per_step) + 1), per_step, marker="o", label="each step alone")
ax.axhline(rate, color="black", linestyle="--", label=f"your meter: {rate:,.0f} tokens/s, MFU {utilization:.1%}")
ax.set_xlabel("step")
ax.set_ylabel("tokens/s")
ax.set_title("The tiny model's training steps on this CPU")
ax.legend()
show_and_save(fig, "18_cpu_throughput")

# %% [markdown]
# ## How many host syncs does a log make?
#
# Twenty training steps of the tiny model, their losses logged every 10 steps two ways, and the syncs of the logging
# counted by the course's host-sync counter (`course/checks/host_syncs.py`): `float(loss)` after every step, and
# your `RunningLoss`. Then recent upstream's model, one training step, before and after your `without_rope_sync`
# (if you wrote it).

# %% nbgrader={"grade": false, "grade_id": "count_syncs", "locked": true, "schema_version": 3, "solution": false, "task": false}
step = training_step(MiniMindConfig(**CONFIGS["tiny"]), batch_size=2, seq_len=32)
every_step, running_syncs = [], []   # the syncs of the logging alone (AdamW's own on the CPU left out)
losses, running = [], RunningLoss()
for number in range(1, 21):
    loss = step()
    with count_host_syncs(every_step):
        losses.append(float(loss))
        if number % 10 == 0:
            print(f"step {number}: float(loss) every step logs {sum(losses) / len(losses):.4f}", end="; ")
            losses = []
    with count_host_syncs(running_syncs):   # the same losses, kept on the device
        running.add(loss)
        if number % 10 == 0:
            print(f"RunningLoss logs {running.pop_mean():.4f}")
print(f"20 steps logged every 10: float(loss) every step {len(every_step)} host syncs, RunningLoss "
      f"{len(running_syncs)}")

upstream = recent_upstream_model(MiniMindConfig(**CONFIGS["tiny"]))
ids = torch.randint(3, upstream.config.vocab_size, (1, 16))
for label in ("recent upstream", "without_rope_sync"):
    if label == "without_rope_sync":
        try:
            upstream = without_rope_sync(upstream)
        except NotImplementedError:
            print("without_rope_sync: not written (the optional extension)")
            break
    counter = []
    with count_host_syncs(counter):
        upstream(ids, labels=ids).loss.backward()
    print(f"{label}: one training forward and backward, {len(counter)} host syncs {counter}")
