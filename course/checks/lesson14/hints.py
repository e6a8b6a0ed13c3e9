"""Lesson 14's hint ladder (``python -m course hint 14 EXERCISE``; collapsed in the notebook): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
    "cosine_lr": (
        "The schedule is half a cosine wave, shifted and squeezed so that it starts at base_lr and never goes "
        "below a tenth of it. Write down the two endpoint values first, then ask which cos(...) argument runs "
        "from 0 to pi as s runs from 0 to T.",
        "course/minimind/trainer_utils.py::get_lr is the oracle; lesson 14 §5.1 plots it. Compare its value at "
        "s = 0, s = T / 2 and s = T with what your formula gives (python -m course align 14 prints the differences).",
        "lr(s) = base_lr * (a + b * cos(pi * s / T)) with lr(0) = base_lr and lr(T) = 0.1 * base_lr fixes a and b. "
        "Arguments are checked before any arithmetic: total_steps <= 0 first, then current_step outside [0, T].",
        "Solve a + b = 1 and a - b = 0.1: a = 0.55, b = 0.45, i.e. base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T))). "
        "Return a Python float (math.cos, not torch.cos).",
    ),
    "scale_loss_for_accumulation": (
        "K backward passes add K gradients. For their sum to be the mean micro-batch gradient, each backward "
        "must carry 1/K of its loss - and the scaled value must stay connected to the graph.",
        "The oracle's train_epoch (course/minimind/train_pretrain.py) divides the loss right after the forward, "
        "inside the autocast block, before scaler.scale(...).backward().",
        "Return a tensor whose gradient with respect to the loss is 1 / K: any expression of the tensor itself "
        "works; anything that goes through .item(), float(...) or .detach() cuts the graph. K <= 0 is a ValueError "
        "naming accumulation_steps.",
        "return loss / accumulation_steps (after the argument check).",
    ),
    "should_step_optimizer": (
        "A window of K micro-steps closes on its last micro-step. Micro-steps are numbered from 1, so the "
        "first window is 1..K.",
        "In the oracle's train_epoch the optimizer block is guarded by one condition on step and "
        "args.accumulation_steps; enumerate(loader, start=start_step + 1) says where step starts.",
        "Closing micro-steps are the multiples of K: K, 2K, 3K, ... With K = 1 every micro-step closes. "
        "Refuse K <= 0 (naming accumulation_steps) before step <= 0 (naming step).",
        "return step % accumulation_steps == 0, after the two argument checks.",
    ),
    "should_flush_tail": (
        "An epoch whose length is not a multiple of K ends with gradients accumulated but never applied. A "
        "resume that starts at the epoch's end ran nothing, so it has nothing to flush.",
        "After the loop of the oracle's train_epoch there is one more optimizer block, guarded by a condition "
        "on last_step, start_step and accumulation_steps.",
        "Flush exactly when both hold: this call ran at least one micro-step (last_step > start_step) and the "
        "last one did not close a window (windows count from micro-step 1 of the epoch, not from start_step). "
        "Argument order: accumulation_steps, start_step, last_step.",
        "return last_step > start_step and last_step % accumulation_steps != 0, after the three checks.",
    ),
    "train_one_epoch": (
        "One micro-step: set the lr, forward under autocast, scale the loss by 1/K, backward through the "
        "GradScaler. On a closing micro-step (and on the tail after the loop) apply the accumulated update. "
        "Everything you record comes from that order.",
        "Read course/minimind/train_pretrain.py::train_epoch top to bottom: the lr line, the forward and "
        "loss, scaler.scale(loss).backward(), the optimizer block, and the tail flush after the loop. Your "
        "four functions replace four of its expressions.",
        "The update is unscale -> clip (pre-clip norm recorded) -> scaler.step -> scaler.update -> "
        "zero_grad(set_to_none=True): clipping scaled gradients clips the wrong numbers. The lr counts "
        "micro-steps over the whole run: epoch * iters + step of epochs * iters. A skipped update is one where "
        "the GradScaler backed its scale off. Read losses back to the host once, after the loop.",
        "Loop with for step, (input_ids, labels) in enumerate(loader, start=start_step + 1); keep last_step; "
        "after the loop call should_flush_tail(last_step, start_step, accumulation_steps) and run the same "
        "update helper; build one record per micro-step from lists you filled (losses as detached tensors, "
        "stacked and converted once).",
    ),
    "test_accumulation_matches_big_batch": (
        "A test is only as strong as the wrong code it rejects. Ask which wrong accumulations exist (no "
        "division, division twice, zeroing every micro-batch, one micro-batch only, dividing by the batch size) "
        "and pick inputs under which each of them gives a different gradient.",
        "course/runs/accumulation.py holds the correct accumulation your test receives; tiny_model and "
        "tiny_batches (course.runs) give a seeded model and batches. Compare against ONE backward of the whole "
        "batch's mean loss.",
        "K >= 2 (K = 1 hides a missing division), micro-batches of different samples and a micro-batch size "
        "different from K, no padding, and every parameter's gradient compared element-wise with a tolerance "
        "between float rounding (~1e-8) and the smallest bug (~1e-3).",
        "Build big = tiny_model(...), backward (out.loss + out.aux_loss) of all samples; model = tiny_model(...) "
        "(same seed); call accumulate_gradients(model, list of (input_ids, labels) micro-batches, k); then "
        "torch.testing.assert_close(param.grad, big_param.grad, rtol=1e-4, atol=1e-6) for every parameter pair.",
    ),
}
