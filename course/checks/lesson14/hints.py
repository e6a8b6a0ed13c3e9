"""Lesson 14's hint ladder (``python -m course hint 14 EXERCISE``; the notebook names the command): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
    "cosine_lr": (
        "The schedule is half a cosine wave, shifted and squeezed so that it starts at base_lr and never goes "
        "below a tenth of it. Write down the two endpoint values first, then ask which cos(...) argument runs "
        "from 0 to pi as s runs from 0 to T.",
        "course/minimind/trainer_utils.py::get_lr is the oracle; lesson 14 §5.1 has you reproduce it. Compare its "
        "value at s = 0, s = T / 2 and s = T with what your formula gives (python -m course align 14 prints the "
        "differences).",
        "lr(s) = base_lr * (a + b * cos(pi * s / T)) with lr(0) = base_lr and lr(T) = 0.1 * base_lr fixes a and b "
        "(the common slip: an old upstream formula that starts at 1.1 * base_lr).",
        "Solve a + b = 1 and a - b = 0.1: a = 0.55, b = 0.45, i.e. base_lr * (0.1 + 0.45 * (1 + cos(pi * s / T))). "
        "Return a Python float (math.cos, not torch.cos).",
    ),
    "scale_loss_for_accumulation": (
        "K backward passes add K gradients. For their sum to be the mean micro-batch gradient, each backward "
        "must carry 1/K of its loss - and the scaled value must stay connected to the graph.",
        "The oracle's train_epoch (course/minimind/train_pretrain.py) divides the loss right after the forward, "
        "inside the autocast block, before scaler.scale(...).backward().",
        "Return a tensor whose gradient with respect to the loss is 1 / K: any expression of the tensor itself "
        "works; anything that goes through .item(), float(...) or .detach() cuts the graph.",
        "return loss / accumulation_steps.",
    ),
    "should_step_optimizer": (
        "A window of K micro-steps closes on its last micro-step. Micro-steps are numbered from 1, so the "
        "first window is 1..K.",
        "In the oracle's train_epoch the optimizer block is guarded by one condition on step and "
        "args.accumulation_steps; enumerate(loader, start=start_step + 1) says where step starts.",
        "Closing micro-steps are the multiples of K: K, 2K, 3K, ... With K = 1 every micro-step closes "
        "((step + 1) % K, upstream's old test, steps one micro-step early).",
        "return step % accumulation_steps == 0.",
    ),
    "should_flush_tail": (
        "An epoch whose length is not a multiple of K ends with gradients accumulated but never applied. A "
        "resume that starts at the epoch's end ran nothing, so it has nothing to flush.",
        "After the loop of the oracle's train_epoch there is one more optimizer block, guarded by a condition "
        "on last_step, start_step and accumulation_steps.",
        "Flush exactly when both hold: this call ran at least one micro-step (last_step > start_step) and the "
        "last one did not close a window (windows count from micro-step 1 of the epoch, not from start_step).",
        "return last_step > start_step and last_step % accumulation_steps != 0.",
    ),
    "train_one_epoch": (
        "One micro-step: set the lr, forward under autocast, scale the loss by 1/K, backward through the "
        "GradScaler. On a closing micro-step (and on the tail after the loop) apply the accumulated update. "
        "Everything you record comes from that order.",
        "Read course/minimind/train_pretrain.py::train_epoch top to bottom: the lr line, the forward and "
        "loss, scaler.scale(loss).backward(), the optimizer block, and the tail flush after the loop. Your "
        "four functions replace four of its expressions. Lesson 14 §1.5 derives the update's order.",
        "The lr counts micro-steps over the whole run: epoch * iters + step of epochs * iters, written into "
        "every param group at every micro-step, before its forward. The update is unscale -> clip "
        "to the grad_clip passed (pre-clip norm recorded) -> scaler.step -> scaler.update -> "
        "zero_grad(set_to_none=True): clipping scaled gradients clips the wrong numbers, and clearing before "
        "the step leaves it nothing to apply. A skipped update is one where the GradScaler's scale went DOWN "
        "(compare get_scale() before and after, enabled scaler only); a scale that grew is no skip. Keep the "
        "losses as detached tensors and read them back to the host after the loop, never per micro-step.",
        "Loop with for step, (input_ids, labels) in enumerate(loader, start=start_step + 1); keep last_step "
        "(start_step before the loop); after the loop call should_flush_tail(last_step, start_step, "
        "accumulation_steps) and run the same update helper, which returns (pre-clip norm, scale went down); "
        "return [] if no micro-step ran; else build one record per micro-step from lists you filled (losses as "
        "detached tensors, torch.stack(...).tolist() once).",
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
    # --- the optional extensions (lesson 14 §10) ---
    "accumulation_divisor": (
        "An update's gradient should be the mean of ITS micro-batch gradients. A full window has K of them; "
        "the epoch's last, partial window has fewer. Which micro-steps belong to that partial window?",
        "Lesson 14 §9 and §10.1: upstream divides the tail by K too (train_epoch's loss / accumulation_steps); "
        "labs/lesson14_adamw_scale.py's last line measures the r/K it leaves. Windows start at micro-step 1.",
        "r = iters % K micro-steps form the tail (none when r == 0); they are the last r of the epoch, i.e. "
        "step > iters - r. They return r, every other micro-step K. Check accumulation_steps, then iters, then "
        "step in [1, iters].",
        "tail = iters % accumulation_steps; return tail if step > iters - tail else accumulation_steps "
        "(after the three checks).",
    ),
    "lr_per_update": (
        "Same cosine, different clock: count optimizer updates instead of micro-steps, so every micro-step of "
        "a window shares the lr of the update it feeds.",
        "Lesson 14 §10.2; cosine_lr (your §5.1) is the schedule, now called with update numbers. The tail "
        "flush is an update too (should_flush_tail).",
        "U = ceil(iters / K) updates per epoch (the tail counted), N = epochs * U in all; micro-step step of "
        "epoch belongs to update n = epoch * U + ceil(step / K), 1-based, so the last one is N and gets "
        "0.1 * base_lr. Checks: accumulation_steps, iters, epochs, epoch in [0, epochs), step in [1, iters].",
        "updates_per_epoch = math.ceil(iters / accumulation_steps); update = epoch * updates_per_epoch + "
        "math.ceil(step / accumulation_steps); return cosine_lr(update, epochs * updates_per_epoch, base_lr).",
    ),
    "update_cadence_due": (
        "A save in the middle of a window stores weights without the gradients already accumulated. Count the "
        "cadence in updates, so logs and saves only ever happen right after an update.",
        "Lesson 14 §10.2; upstream's train_epoch logs and saves on step % interval == 0 or step == iters "
        "(micro-steps); should_step_optimizer (§5.3) tells you where updates close.",
        "Due when step closes a window (a multiple of K) and the number of that update, step / K, is a "
        "multiple of interval; and always at step == iters (the epoch's last update). Checks: "
        "accumulation_steps, iters, interval (each >= 1), then step in [1, iters].",
        "if step == iters: return True; return step % accumulation_steps == 0 and "
        "(step // accumulation_steps) % interval == 0 (after the four checks).",
    ),
    "adamw_param_groups": (
        "Weight decay pulls weights towards 0. That regularises matrices, but a norm's gain or an embedding "
        "row pulled to 0 just loses information. Split the parameters into two groups.",
        "Lesson 14 §10.3; course/minimind/train_pretrain.py::build_training passes model.parameters() to "
        "AdamW. model.named_parameters() yields each Parameter once (the tied lm_head / embed_tokens too).",
        "No decay: param.ndim < 2 (norm weights, biases) or the weight of a torch.nn.Embedding (collect their "
        "ids from model.modules()). Skip requires_grad=False. Groups in that order: [decay with weight_decay, "
        "no_decay with 0.0]. Refuse weight_decay < 0 or NaN (not weight_decay >= 0 catches both).",
        "embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}; for _, param "
        "in model.named_parameters(): skip frozen ones, append to no_decay if param.ndim < 2 or id(param) in "
        "embeddings else to decay; return [{'params': decay, 'weight_decay': weight_decay}, "
        "{'params': no_decay, 'weight_decay': 0.0}].",
    ),
    "warmup_cosine_lr": (
        "Two pieces glued at s = W: a straight line from 0 up to base_lr, then MiniMind's cosine squeezed into "
        "the remaining T - W steps. Both pieces must give base_lr at s = W.",
        "Lesson 14 §10.4 plots it; cosine_lr (your §5.1) is the second piece, called on a shifted clock.",
        "s < W: base_lr * s / W. W <= s <= T: cosine_lr(s - W, T - W, base_lr). Checks in order: total_steps "
        ">= 1, warmup_steps in [0, total_steps) (W = T would leave no step for the cosine), current_step in "
        "[0, total_steps].",
        "if current_step < warmup_steps: return base_lr * current_step / warmup_steps; return "
        "cosine_lr(current_step - warmup_steps, total_steps - warmup_steps, base_lr).",
    ),
}
