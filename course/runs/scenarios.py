"""The named tiny scenarios that lessons 14 and 15 are graded and tested on."""
from __future__ import annotations

from .loop import LoopScenario

# Lesson 14: two epochs of 6 micro-batches; K=4 leaves a tail of 2 per epoch.
LOOP_BASE = LoopScenario("dense, 2 epochs, K=4, 6 micro-batches per epoch (tail of 2)")
# The two-epoch base catches the schedule, tail and accumulation mistakes; each other scenario adds one
# situation and runs no longer (fewer micro-batches, 16 tokens) than it needs to: graders run them all.
# base_lr varies from 1e-4 to 1e-2 (the lr is proportional to the base_lr passed, never a constant).
_SHORT = LOOP_BASE.with_(epochs=1, iters=3, max_length=16)
_SMALL = _SHORT.with_(hidden_size=32, num_hidden_layers=1)
LOOP_FP32_SCENARIOS = [
    LOOP_BASE,
    _SHORT.with_(name="dense, 3 micro-batches, K=1 (step every micro-batch), base_lr=2e-3", accumulation_steps=1,
                 base_lr=2e-3),
    _SHORT.with_(name="dense, 3 micro-batches, K=3 divides the epoch (no tail), base_lr=1e-4", accumulation_steps=3,
                 base_lr=1e-4),
    LOOP_BASE.with_(name="MoE (aux_loss > 0), K=4, resumed at epoch 1, start_step=3, base_lr=1e-3", use_moe=True,
                    start_epoch=1, start_step=3, max_length=16, base_lr=1e-3),
    _SHORT.with_(name="dense, 3 micro-batches, K=8 longer than the epoch (tail only), base_lr=1e-2",
                 accumulation_steps=8, base_lr=1e-2),
    # grad_clip varied (0.05 clips every update, 1e3 none; the updates' norms are 1-2) and loaders shorter than
    # iters - start_step: the tail flush follows the last micro-step run, not iters. Two param groups (decay /
    # no decay): the lr, the clip and the update reach both.
    _SMALL.with_(name="dense, iters=8, K=4, the loader ends after 6 (flush at 6), grad_clip=0.05 clips every update, "
                      "two param groups, base_lr=3e-3", iters=8, loader_length=6, grad_clip=0.05,
                 two_param_groups=True, base_lr=3e-3),
    _SMALL.with_(name="dense, iters=7, K=2, resumed at start_step=2, the loader ends after 4 (last window closed at "
                      "6: no flush), grad_clip=1e3 never clips, base_lr=2e-4", iters=7, accumulation_steps=2,
                 start_step=2, loader_length=4, grad_clip=1e3, base_lr=2e-4),
    _SMALL.with_(name="dense, iters=10, K=4, resumed at start_step=9 inside the last partial window (9..10): the "
                      "call runs micro-step 10 alone, then the tail flush", iters=10, start_step=9, base_lr=1e-3),
]
LOOP_AMP_SCENARIOS = [
    LOOP_BASE.with_(name="CPU bf16 autocast, K=4, base_lr=1e-3", autocast_dtype="bfloat16", epochs=1, max_length=16,
                    base_lr=1e-3),
    LOOP_BASE.with_(name="enabled GradScaler('cpu'), overflow injected in micro-step 2: update 4 skipped, the tail "
                         "flush steps at half the scale", scaler_enabled=True, overflow_at_backward=2, epochs=1),
    _SMALL.with_(name="enabled GradScaler('cpu') with growth_interval=1, K=2: update 2 doubles the scale (no skip), "
                      "the tail flush overflows (skipped, scale halved), two param groups, base_lr=1e-2",
                 accumulation_steps=2, scaler_enabled=True, growth_interval=1, overflow_at_backward=3,
                 two_param_groups=True, base_lr=1e-2),
]

# Lesson 15: (scenario, stop epoch, stop micro-step) at update boundaries (multiples of K, or an
# epoch end after the tail flush) of a run of 2 epochs x 6 micro-batches: mid-epoch, an epoch end, the
# first update, the last update of the run (nothing left to train), K=1 and K longer than the epoch. One layer
# of hidden size 32: a checkpoint holds half the tensors of the default tiny model's and saves and loads
# twice as fast, and every rule of a checkpoint shows as well.
RESUME_BASE = LoopScenario("dense, K=2, stopped at epoch 0 step 4", accumulation_steps=2, max_length=16,
                           hidden_size=32, num_hidden_layers=1)
RESUME_FP32 = [
    (RESUME_BASE, 0, 4),
    (RESUME_BASE.with_(name="dense, K=4, stopped at the end of epoch 0 (after the tail flush)", accumulation_steps=4),
     0, 6),
    (RESUME_BASE.with_(name="MoE, K=2, stopped at epoch 1 step 2", use_moe=True), 1, 2),
    (RESUME_BASE.with_(name="dense, K=1, 1 epoch, stopped after the first update", accumulation_steps=1, epochs=1),
     0, 1),
    (RESUME_BASE.with_(name="dense, K=8 longer than the epoch (tail flushes only), stopped after the run's last "
                            "update (epoch 1 step 6): nothing left to train", accumulation_steps=8), 1, 6),
]
RESUME_SCALER = [
    (RESUME_BASE.with_(name="enabled GradScaler('cpu'), overflow in micro-step 2 halves the scale, stopped at epoch 0 "
                            "step 4", scaler_enabled=True, overflow_at_backward=2), 0, 4),
    (RESUME_BASE.with_(name="enabled GradScaler('cpu', growth_interval=2), K=1, 1 epoch: the scale doubled at "
                            "update 2, stopped at step 3 with one good update towards the next growth", scaler_enabled=True,
                       growth_interval=2, accumulation_steps=1, epochs=1), 0, 3),
]
