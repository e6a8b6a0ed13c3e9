"""Lesson 14's mistake catalogue: each wrong variant of a reference function FAILS the check named; each
equivalent PASSES every check (tests/test_mistakes.py proves both)."""
from __future__ import annotations


from ..catalogue import equivalent, mistake
from ..student_tests import COMPARE_EVERY_PARAMETER, assert_gradients, weak_comparisons
from .checks import (cosine_lr_matches_get_lr, cosine_lr_rejects_bad_arguments, cosine_lr_returns_a_python_float,
                     scale_loss_divides_by_k, should_flush_only_a_partial_window, should_flush_rejects_bad_arguments,
                     should_flush_returns_a_bool, should_step_at_window_ends, should_step_rejects_bad_arguments,
                     should_step_returns_a_bool)
from .extensions import (accumulation_divisor_gives_the_tail_its_mean_gradient, accumulation_divisor_is_k_then_r,
                         accumulation_divisor_rejects_bad_arguments, adamw_param_groups_exempt_norms_and_embeddings,
                         adamw_param_groups_reject_bad_weight_decay, lr_per_update_follows_the_update_count,
                         lr_per_update_rejects_bad_arguments, update_cadence_counts_updates,
                         update_cadence_rejects_bad_arguments, warmup_cosine_lr_ramps_then_follows_get_lr,
                         warmup_schedule_rejects_bad_arguments)
from .loop import (train_one_epoch_clears_gradients_to_none, train_one_epoch_emits_no_warnings,
                   train_one_epoch_sends_every_batch_to_the_device,
                   train_one_epoch_marks_the_tail_flush, train_one_epoch_matches_oracle_amp,
                   train_one_epoch_matches_oracle_fp32, train_one_epoch_records_python_values,
                   train_one_epoch_reports_a_norm_only_where_an_update_closed,
                   train_one_epoch_returns_nothing_for_an_empty_epoch, train_one_epoch_scaler_none_is_disabled,
                   train_one_epoch_sets_lr_in_every_param_group, train_one_epoch_syncs_once_per_epoch)
from .loop_arguments import train_one_epoch_accepts_boundary_arguments, train_one_epoch_rejects_bad_arguments
from .test_writing import accumulation_test_passes_correct_and_fails_wrong

# The loop body from the lr write to the records' lr: as in the reference, and with the lr written only right
# before a window's update (two catalogued mistakes start from it).
LOOP_LR_EVERY_MICRO_STEP = (
        '        for group in optimizer.param_groups:\n            group["lr"] = lr\n        with autocast_ctx:\n'
        '            out = model(input_ids, labels=labels)\n            loss = out.loss + out.aux_loss\n'
        '            scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)\n'
        '        scaler.scale(scaled_loss).backward()\n        if should_step_optimizer(step, accumulation_steps):\n'
        '            grad_norms[step], skipped = _optimizer_update(model, optimizer, scaler, grad_clip)\n'
        '            if skipped:\n                skipped_steps.add(step)\n        steps.append(step)\n'
        '        lrs.append(optimizer.param_groups[-1]["lr"])')
LOOP_LR_AT_UPDATES_ONLY = (
        '        with autocast_ctx:\n'
        '            out = model(input_ids, labels=labels)\n            loss = out.loss + out.aux_loss\n'
        '            scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)\n'
        '        scaler.scale(scaled_loss).backward()\n        if should_step_optimizer(step, accumulation_steps):\n'
        '            for group in optimizer.param_groups:\n                group["lr"] = lr\n'
        '            grad_norms[step], skipped = _optimizer_update(model, optimizer, scaler, grad_clip)\n'
        '            if skipped:\n                skipped_steps.add(step)\n        steps.append(step)\n'
        '        lrs.append(lr)')
# The lr written after the micro-step's update instead of before its forward: every forward and update runs at the
# previous micro-step's lr.
LR_WRITE = '        for group in optimizer.param_groups:\n            group["lr"] = lr\n'
LOOP_LR_AFTER_THE_UPDATE = LOOP_LR_EVERY_MICRO_STEP.replace(LR_WRITE, "").replace(
    "        steps.append(step)\n", LR_WRITE + "        steps.append(step)\n")
# From the records' lr to the tail flush's update, unchanged by both.
LOOP_END_TO_TAIL_FLUSH = (
        '  # what the optimizer really holds, as upstream logs it\n        losses.append(loss.detach())\n'
        '        aux_losses.append(out.aux_loss.detach())\n\n    tail_step = None\n'
        '    if should_flush_tail(last_step, start_step, accumulation_steps):\n        tail_step = last_step\n')

# The words of the rule that each weakened reference test's failure names (its hint: course/checks/wrong_gradients.py).
MISTAKES = [
    mistake("off_by_one_step", "steps when (step + 1) % K == 0 (upstream before PR #698, issue #691)",
        "should_step_optimizer", "return step % accumulation_steps == 0", "return (step + 1) % accumulation_steps == 0",
        should_step_at_window_ends, rule="1-based"),
    mistake("old_cosine_peaks_at_1_1", "lr/10 + 0.5*lr*(1+cos): the old formula, starts at 1.1*lr",
        "cosine_lr", "base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
        "base_lr / 10 + 0.5 * base_lr * (1 + math.cos(math.pi * current_step / total_steps))",
        cosine_lr_matches_get_lr, rule="starts at 1.1 x base_lr instead of base_lr"),
    mistake("loss_not_divided", "backpropagates the raw loss: K micro-batches sum instead of average",
        "scale_loss_for_accumulation", "return loss / accumulation_steps", "return loss", scale_loss_divides_by_k,
        rule="not divided by K"),
    mistake("clip_before_unscale", "clips the still-scaled gradients, then unscales",
        "_optimizer_update",
        "    scaler.unscale_(optimizer)\n"
        "    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n",
        "    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n"
        "    scaler.unscale_(optimizer)\n",
        train_one_epoch_matches_oracle_amp, rule="unscale first"),
    mistake("no_tail_flush", "never flushes an epoch's partial last window: its gradients leak into the next "
        "epoch's first update (K + r micro-batches) and are lost after the last epoch",
        "train_one_epoch", "if should_flush_tail(last_step, start_step, accumulation_steps):", "if False:",
        train_one_epoch_matches_oracle_fp32, rule="the tail flush is missing"),
    mistake("lr_only_at_optimizer_steps", "writes the lr into the optimizer only on update micro-steps",
        "train_one_epoch", '        for group in optimizer.param_groups:\n            group["lr"] = lr\n',
        '        if should_step_optimizer(step, accumulation_steps):\n'
        '            for group in optimizer.param_groups:\n                group["lr"] = lr\n',
        train_one_epoch_matches_oracle_fp32, rule="at EVERY micro-step"),
    mistake("forgets_aux_loss", "trains on the LM loss only: the MoE router's balance loss is lost",
        "train_one_epoch", "loss = out.loss + out.aux_loss", "loss = out.loss", train_one_epoch_matches_oracle_fp32,
        rule="the aux loss is not in the loss"),
    mistake("schedule_ignores_epoch", "cosine_lr(step, ...) restarts the schedule every epoch",
        "train_one_epoch",
        "cosine_lr(epoch * iters + step, epochs * iters, base_lr)", "cosine_lr(step, epochs * iters, base_lr)",
        train_one_epoch_matches_oracle_fp32, rule="restarts every epoch"),
    mistake("ignores_start_step", "counts micro-steps from 1 after a resume",
        "train_one_epoch", "enumerate(loader, start=start_step + 1)", "enumerate(loader, start=1)",
        train_one_epoch_matches_oracle_fp32, rule="micro-steps continue after a resume"),
    mistake("zero_grad_every_micro_step", "clears gradients before each backward: nothing accumulates",
        "train_one_epoch", "        scaler.scale(scaled_loss).backward()\n",
        "        optimizer.zero_grad(set_to_none=True)\n        scaler.scale(scaled_loss).backward()\n",
        train_one_epoch_matches_oracle_fp32, rule="zeroed every micro-step"),
    mistake("flush_ignores_start_step", "flushes whenever last_step % K != 0, also after a resume that ran nothing",
        "should_flush_tail", "return last_step > start_step and last_step % accumulation_steps != 0",
        "return last_step % accumulation_steps != 0", should_flush_only_a_partial_window, rule="ran no micro-step"),
    mistake("flush_counts_windows_from_start_step", "(last - start) % K: windows restart at the resume point",
        "should_flush_tail", "return last_step > start_step and last_step % accumulation_steps != 0",
        "return last_step > start_step and (last_step - start_step) % accumulation_steps != 0",
        should_flush_only_a_partial_window, rule="not from start_step"),
    mistake("flush_needs_the_whole_partial_window", "flushes only when this call ran the whole partial window: "
        "resumed inside it (start 9, last 10, K=4), the waiting gradient is never applied",
        "should_flush_tail", "return last_step > start_step and last_step % accumulation_steps != 0",
        "return last_step - start_step >= last_step % accumulation_steps > 0",
        should_flush_only_a_partial_window, rule="still waiting in param.grad"),
    mistake("loss_loses_graph", "rebuilds the scaled loss from .item(): no gradient reaches the model",
        "scale_loss_for_accumulation", "return loss / accumulation_steps",
        "return torch.tensor(loss.item() / accumulation_steps, requires_grad=True)", scale_loss_divides_by_k,
        rule="lose its graph"),
    mistake("step_accepts_negative_k", "should_step_optimizer refuses K == 0 only",
        "should_step_optimizer",
        "    _validate_counts(accumulation_steps=accumulation_steps)\n    if step <= 0:",
        "    if accumulation_steps == 0:\n        raise ValueError(f\"accumulation_steps must be >= 1, got "
        "{accumulation_steps}\")\n    if step <= 0:", should_step_rejects_bad_arguments),
    mistake("step_accepts_negative_step", "should_step_optimizer refuses step == 0 only",
        "should_step_optimizer", "if step <= 0:", "if step == 0:", should_step_rejects_bad_arguments),
    mistake("flush_accepts_negative_k", "should_flush_tail refuses K == 0 only",
        "should_flush_tail",
        "    _validate_counts(accumulation_steps=accumulation_steps)\n    if start_step < 0:",
        "    if accumulation_steps == 0:\n        raise ValueError(f\"accumulation_steps must be >= 1, got "
        "{accumulation_steps}\")\n    if start_step < 0:", should_flush_rejects_bad_arguments),
    mistake("accepts_negative_epoch", "train_one_epoch checks epoch < epochs only",
        "train_one_epoch", "if not 0 <= epoch < epochs:", "if epoch >= epochs:", train_one_epoch_rejects_bad_arguments),
    mistake("accepts_negative_start_step", "train_one_epoch checks start_step <= iters only",
        "train_one_epoch",
        "if not 0 <= start_step <= iters:", "if start_step > iters:", train_one_epoch_rejects_bad_arguments),
    mistake("empty_epoch_crashes", "stacks the losses of an epoch that ran nothing: torch.stack([]) raises",
        "train_one_epoch",
        "    if not steps:\n        return []\n", "", train_one_epoch_returns_nothing_for_an_empty_epoch,
        rule="return [] early"),
    mistake("lr_in_first_group_only", "writes the lr into param_groups[0] only: other groups keep a stale lr",
        "train_one_epoch", '        for group in optimizer.param_groups:\n            group["lr"] = lr\n',
        '        optimizer.param_groups[0]["lr"] = lr\n', train_one_epoch_sets_lr_in_every_param_group,
        rule="EVERY optimizer.param_groups entry"),
    mistake("scaler_none_enabled", "scaler=None builds an enabled GradScaler: fp32 runs skip overflowed updates",
        "train_one_epoch", "scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)",
        "scaler = torch.amp.GradScaler(torch.device(device).type, enabled=True)",
        train_one_epoch_scaler_none_is_disabled, rule="never skips"),
    mistake("overflow_never_reported", "records overflow_skipped=False even when the GradScaler skipped the step",
        "train_one_epoch", '"overflow_skipped": s in skipped_steps,', '"overflow_skipped": False,',
        train_one_epoch_matches_oracle_amp, rule="report overflow_skipped=True there"),
    mistake("skipped_update_not_closed", "update_closed only where parameters changed: a skipped window looks open",
        "train_one_epoch",
        '"update_closed": s in norm_values,', '"update_closed": s in norm_values and s not in skipped_steps,',
        train_one_epoch_matches_oracle_amp, rule="a skipped update still closes its window"),
    mistake("records_scaled_loss", "records loss / K instead of the micro-batch's loss",
        "train_one_epoch", "losses.append(loss.detach())", "losses.append(scaled_loss.detach())",
        train_one_epoch_matches_oracle_fp32, rule="record the unscaled loss"),
    mistake("tail_flush_not_marked", "the tail flush runs but no record says tail_flush",
        "train_one_epoch",
        '"tail_flush": s == tail_step}', '"tail_flush": False}', train_one_epoch_marks_the_tail_flush,
        rule="tail_flush=True"),
    mistake("grad_norm_zero_without_update", "grad_norm 0.0 instead of None on micro-steps without an update",
        "train_one_epoch", '"grad_norm": norm_values.get(s),', '"grad_norm": norm_values.get(s, 0.0),',
        train_one_epoch_reports_a_norm_only_where_an_update_closed, rule="not 0.0"),
    mistake("overflow_on_scale_growth", "reports a skipped step whenever the scale changed: a growing scale "
        "(growth_interval updates without inf/NaN) is not an overflow",
        "_optimizer_update", "scaler.get_scale() < scale_before", "scaler.get_scale() != scale_before",
        train_one_epoch_matches_oracle_amp, rule="a scale that grows"),
    mistake("tail_overflow_not_reported", "an overflow in the tail flush is skipped but not recorded",
        "train_one_epoch", "        if skipped:\n            skipped_steps.add(tail_step)\n", "",
        train_one_epoch_matches_oracle_amp, rule="in the tail flush too"),
    mistake("clip_hard_coded", "clip_grad_norm_(..., 1.0): the default grad_clip, whatever the caller passes",
        "_optimizer_update", "clip_grad_norm_(model.parameters(), grad_clip)",
        "clip_grad_norm_(model.parameters(), 1.0)", train_one_epoch_matches_oracle_fp32,
        rule="clipping to the grad_clip passed"),
    mistake("no_clipping", "measures the norm with max_norm=inf: nothing is ever clipped",
        "_optimizer_update", "clip_grad_norm_(model.parameters(), grad_clip)",
        'clip_grad_norm_(model.parameters(), float("inf"))', train_one_epoch_matches_oracle_fp32,
        rule="clipping to the grad_clip passed"),
    mistake("zero_grad_keeps_zeros", "zero_grad(set_to_none=False): zero tensors stay allocated after each update",
        "_optimizer_update", "set_to_none=True", "set_to_none=False", train_one_epoch_clears_gradients_to_none),
    mistake("tail_flush_from_iters", "decides the flush from iters, not from the last micro-step run: a loader "
        "that ends early is flushed wrongly (or twice)", "train_one_epoch",
        "if should_flush_tail(last_step, start_step, accumulation_steps):",
        "if should_flush_tail(iters, start_step, accumulation_steps):", train_one_epoch_matches_oracle_fp32,
        rule="never from iters"),
    mistake("host_sync_every_micro_step", "loss.item() at every micro-step: one device-to-host sync each",
        "train_one_epoch", "losses.append(loss.detach())", "losses.append(torch.tensor(loss.item()))",
        train_one_epoch_syncs_once_per_epoch, rule="convert them after the loop"),
    mistake("scale_read_every_micro_step", "reads the GradScaler's scale (get_scale()) at every micro-step: with an "
        "enabled scaler one host sync each", "train_one_epoch", "scaler.scale(scaled_loss).backward()",
        "scaler.scale(scaled_loss).backward(); scale_seen = scaler.get_scale()",
        train_one_epoch_syncs_once_per_epoch, rule="read it where an update closes"),
    mistake("batch_left_on_the_host", "never sends the batch to device: on CUDA the forward pass crashes",
        "train_one_epoch",
        "input_ids, labels = input_ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)",
        "input_ids, labels = input_ids, labels", train_one_epoch_sends_every_batch_to_the_device,
        rule="move each micro-batch to the device first"),
    mistake("labels_left_on_the_host", "sends input_ids to device but not labels: the loss mixes devices on CUDA",
        "train_one_epoch",
        "input_ids, labels = input_ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)",
        "input_ids = input_ids.to(device, non_blocking=True)", train_one_epoch_sends_every_batch_to_the_device,
        rule="move each micro-batch to the device first"),
    mistake("tail_flush_needs_the_whole_window", "flushes a resumed epoch's tail only when this call ran the whole "
        "partial window: resumed at 9 of 10 with K=4, micro-step 10's gradient is never applied", "train_one_epoch",
        "if should_flush_tail(last_step, start_step, accumulation_steps):",
        "if should_flush_tail(last_step, start_step, accumulation_steps) and "
        "last_step - start_step >= last_step % accumulation_steps:", train_one_epoch_matches_oracle_fp32,
        rule="the tail flush"),
    mistake("stale_lr_in_tail_flush", "records the lr it computes but writes it into the optimizer only where a "
        "window closes: the tail flush steps with the last boundary's lr", "train_one_epoch",
        LOOP_LR_EVERY_MICRO_STEP, LOOP_LR_AT_UPDATES_ONLY, train_one_epoch_matches_oracle_fp32,
        rule="not only before an update"),
    mistake("aux_not_in_backward", "records out.loss + out.aux_loss but backpropagates out.loss / K only",
        "train_one_epoch", "scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)",
        "scaled_loss = scale_loss_for_accumulation(out.loss, accumulation_steps)", train_one_epoch_matches_oracle_fp32,
        rule="the aux loss is not in the backward"),
    mistake("k_checked_by_scale_loss", "no accumulation_steps check of its own: the error comes from the first "
        "micro-step's scale_loss_for_accumulation, after the loader started", "train_one_epoch",
        "_validate_counts(accumulation_steps=accumulation_steps, iters=iters, epochs=epochs)", "_validate_counts(iters=iters, epochs=epochs)",
        train_one_epoch_rejects_bad_arguments),
    mistake("epochs_checked_by_epoch", "no epochs check: epochs=0 is reported as a bad epoch",
        "train_one_epoch", "_validate_counts(accumulation_steps=accumulation_steps, iters=iters, epochs=epochs)",
        "_validate_counts(accumulation_steps=accumulation_steps, iters=iters)", train_one_epoch_rejects_bad_arguments),
    mistake("rejects_one_batch_epoch", "iters <= 1 refused: an epoch of one micro-batch is valid",
        "train_one_epoch", "    " + "_validate_counts(accumulation_steps=accumulation_steps, iters=iters, epochs=epochs)" + "\n",
        "    _validate_counts(accumulation_steps=accumulation_steps, epochs=epochs)\n"
        '    if iters <= 1:\n        raise ValueError(f"iters must be >= 1, got {iters}")\n',
        train_one_epoch_accepts_boundary_arguments),
    # the student's test (reference: course/reference/train_loop.py) with one edit each
    *weak_comparisons(
        "test_accumulation_matches_big_batch", "1e-4", accumulation_test_passes_correct_and_fails_wrong,
        "    accumulate_gradients(model, list(zip(input_ids.split(micro_size), labels.split(micro_size))), k)\n"),
    mistake("test_bitwise", "rtol=0, atol=0: float rounding of a correct accumulation fails it",
        "test_accumulation_matches_big_batch",
        "rtol=1e-4, atol=1e-6,", "rtol=0.0, atol=0.0,", accumulation_test_passes_correct_and_fails_wrong,
        rule="compare with a tolerance"),
    mistake("test_with_k_1", "one micro-batch of 6: a missing division by K cannot show",
        "test_accumulation_matches_big_batch",
        "k, micro_size = 2, 3", "k, micro_size = 1, 6", accumulation_test_passes_correct_and_fails_wrong,
        rule="use K >= 2"),
    mistake("test_micro_batch_size_equals_k", "2 micro-batches of 2: dividing by the micro-batch size looks right",
        "test_accumulation_matches_big_batch",
        "k, micro_size = 2, 3", "k, micro_size = 2, 2", accumulation_test_passes_correct_and_fails_wrong,
        rule="micro-batch size different from K"),
    mistake("test_identical_micro_batches", "the same 3 samples in every micro-batch: one micro-batch alone "
        "already has the big batch's gradient",
        "test_accumulation_matches_big_batch",
        "input_ids, labels = tiny_batches(k * micro_size, scenario.max_length, 1, seed=0)[0]",
        "input_ids, labels = (t.repeat(k, 1) for t in tiny_batches(micro_size, scenario.max_length, 1, "
        "seed=0)[0])", accumulation_test_passes_correct_and_fails_wrong, rule="use different samples"),
    mistake("test_expects_summed_gradient", "expects K x the big batch's gradient (the sum, not the mean)",
        "test_accumulation_matches_big_batch", "param.grad, expected.grad,", "param.grad, expected.grad * k,",
        accumulation_test_passes_correct_and_fails_wrong, rule="the whole batch's mean loss"),
    # the optional extensions (§10)
    mistake("tail_still_divided_by_k", "accumulation_divisor returns K everywhere: upstream's tail of r/K",
        "accumulation_divisor",
        "return tail if step > iters - tail else accumulation_steps", "return accumulation_steps",
        accumulation_divisor_gives_the_tail_its_mean_gradient),
    mistake("tail_window_one_step_early", "step >= iters - r: the last micro-step of the last full window "
        "joins the tail", "accumulation_divisor", "return tail if step > iters - tail else accumulation_steps",
        "return tail if step >= iters - tail else accumulation_steps", accumulation_divisor_is_k_then_r),
    mistake("divisor_accepts_step_past_iters", "accumulation_divisor checks step >= 1 only",
        "accumulation_divisor",
        "    if not 1 <= step <= iters:\n        raise ValueError(f\"step must be in [1, iters={iters}], got "
        "{step}\")\n    tail = ",
        "    if step < 1:\n        raise ValueError(f\"step must be in [1, iters={iters}], got {step}\")\n"
        "    tail = ", accumulation_divisor_rejects_bad_arguments),
    mistake("lr_per_micro_step", "lr_per_update keeps upstream's schedule over micro-steps",
        "lr_per_update", "return cosine_lr(update, epochs * updates_per_epoch, base_lr)",
        "return cosine_lr(epoch * iters + step, epochs * iters, base_lr)", lr_per_update_follows_the_update_count),
    mistake("updates_floor_division", "iters // K updates per epoch: the tail flush is not counted",
        "lr_per_update", "updates_per_epoch = math.ceil(iters / accumulation_steps)",
        "updates_per_epoch = iters // accumulation_steps", lr_per_update_follows_the_update_count),
    mistake("update_index_zero_based", "(step - 1) // K: updates counted from 0, the schedule never ends at "
        "0.1 * base_lr", "lr_per_update", "math.ceil(step / accumulation_steps)", "(step - 1) // accumulation_steps",
        lr_per_update_follows_the_update_count),
    mistake("lr_per_update_accepts_any_step", "lr_per_update never checks step",
        "lr_per_update",
        "    _validate_position(epoch=epoch, epochs=epochs, step=step, iters=iters)\n",
        '    if not 0 <= epoch < epochs:\n        raise ValueError(f"epoch must be in [0, epochs={epochs}), got {epoch}")\n',
        lr_per_update_rejects_bad_arguments),
    mistake("cadence_in_micro_steps", "step % interval: upstream's cadence, counted in micro-steps",
        "update_cadence_due",
        "(step // accumulation_steps) % interval == 0", "step % interval == 0", update_cadence_counts_updates),
    mistake("cadence_misses_epoch_end", "no log or save after the epoch's last (tail) update",
        "update_cadence_due", "    if step == iters:\n        return True\n", "", update_cadence_counts_updates),
    mistake("cadence_accepts_zero_interval", "update_cadence_due refuses a negative interval only",
        "update_cadence_due", "    _validate_counts(accumulation_steps=accumulation_steps, iters=iters, interval=interval)\n",
        "    _validate_counts(accumulation_steps=accumulation_steps, iters=iters)\n"
        '    if interval < 0:\n        raise ValueError(f"interval must be >= 1, got {interval}")\n',
        update_cadence_rejects_bad_arguments),
    mistake("cadence_iters_checked_by_step", "update_cadence_due has no iters check: iters=0 is reported as a bad "
        "step", "update_cadence_due",
        "    _validate_counts(accumulation_steps=accumulation_steps, iters=iters, interval=interval)\n", "    _validate_counts(accumulation_steps=accumulation_steps, interval=interval)\n",
        update_cadence_rejects_bad_arguments),
    mistake("warmup_rejects_one_step_run", "total_steps <= 1 refused: a run of one step is valid",
        "warmup_cosine_lr", "if total_steps <= 0:", "if total_steps <= 1:", warmup_cosine_lr_ramps_then_follows_get_lr),
    mistake("decays_norms", "1-D parameters (norm weights) decay: only embeddings are exempt",
        "adamw_param_groups", "if param.ndim < 2 or id(param) in embeddings:", "if id(param) in embeddings:",
        adamw_param_groups_exempt_norms_and_embeddings),
    mistake("decays_embeddings", "the embedding (and the tied lm_head) decays",
        "adamw_param_groups", "if param.ndim < 2 or id(param) in embeddings:", "if param.ndim < 2:",
        adamw_param_groups_exempt_norms_and_embeddings),
    mistake("tied_weight_listed_twice", "named_parameters(remove_duplicate=False): the tied embedding / lm_head "
        "weight lands in the no-decay group twice", "adamw_param_groups", "for _, param in model.named_parameters():",
        "for _, param in model.named_parameters(remove_duplicate=False):",
        adamw_param_groups_exempt_norms_and_embeddings),
    mistake("frozen_parameters_grouped", "parameters with requires_grad=False go to the optimizer too",
        "adamw_param_groups", "        if not param.requires_grad:\n            continue\n", "",
        adamw_param_groups_exempt_norms_and_embeddings),
    mistake("rejects_zero_weight_decay", "weight_decay > 0 as the rule: the valid 0.0 (no decay at all) raises",
        "adamw_param_groups",
        "if not weight_decay >= 0:", "if not weight_decay > 0:", adamw_param_groups_reject_bad_weight_decay),
    mistake("accepts_nan_weight_decay", "weight_decay < 0 as the test: NaN passes",
        "adamw_param_groups",
        "if not weight_decay >= 0:", "if weight_decay < 0:", adamw_param_groups_reject_bad_weight_decay),
    mistake("cosine_ignores_warmup", "after the warmup the cosine runs over s / T, not (s - W) / (T - W)",
        "warmup_cosine_lr", "return cosine_lr(current_step - warmup_steps, total_steps - warmup_steps, base_lr)",
        "return cosine_lr(current_step, total_steps, base_lr)", warmup_cosine_lr_ramps_then_follows_get_lr),
    mistake("warmup_one_step_ahead", "(s + 1) / W: the warmup reaches base_lr one step early",
        "warmup_cosine_lr",
        "return base_lr * current_step / warmup_steps", "return base_lr * (current_step + 1) / warmup_steps",
        warmup_cosine_lr_ramps_then_follows_get_lr),
    mistake("warmup_may_fill_the_run", "warmup_steps == total_steps accepted: no step left for the cosine",
        "warmup_cosine_lr", "if not 0 <= warmup_steps < total_steps:", "if not 0 <= warmup_steps <= total_steps:",
        warmup_schedule_rejects_bad_arguments),
    # rules that no single-bug scenario showed: the optimizer's lr between updates, any iterable, the argument
    # order when two are bad, the return types
    mistake("lr_written_only_before_updates", "writes each micro-step's lr into the param groups only right before "
        "an update (window ends and the tail flush); the records carry the computed lr and the weights move the same",
        "train_one_epoch", LOOP_LR_EVERY_MICRO_STEP + LOOP_END_TO_TAIL_FLUSH,
        LOOP_LR_AT_UPDATES_ONLY + LOOP_END_TO_TAIL_FLUSH
        + '        for group in optimizer.param_groups:\n            group["lr"] = lr\n',
        train_one_epoch_matches_oracle_fp32, rule="not only before an update"),
    mistake("flush_from_loader_length", "decides the tail flush from start_step + len(loader): a generator has no "
        "length", "train_one_epoch", "if should_flush_tail(last_step, start_step, accumulation_steps):",
        "if should_flush_tail(start_step + len(loader), start_step, accumulation_steps):",
        train_one_epoch_matches_oracle_fp32, rule="do not call len(loader)"),
    mistake("iters_checked_before_k", "checks iters before accumulation_steps: with both bad, iters is named",
        "train_one_epoch",
        "_validate_counts(accumulation_steps=accumulation_steps, iters=iters, epochs=epochs)", "_validate_counts(iters=iters, accumulation_steps=accumulation_steps, epochs=epochs)",
        train_one_epoch_rejects_bad_arguments),
    mistake("cosine_checks_step_first", "checks current_step before total_steps: (-1, 0) names current_step",
        "cosine_lr",
        '    if total_steps <= 0:\n        raise ValueError(f"total_steps must be > 0, got {total_steps}")\n'
        '    if not 0 <= current_step <= total_steps:\n        raise ValueError(f"current_step must be in [0, '
        'total_steps={total_steps}], got {current_step}")\n',
        '    if not 0 <= current_step <= total_steps:\n        raise ValueError(f"current_step must be in [0, '
        'total_steps={total_steps}], got {current_step}")\n'
        '    if total_steps <= 0:\n        raise ValueError(f"total_steps must be > 0, got {total_steps}")\n',
        cosine_lr_rejects_bad_arguments),
    mistake("cosine_returns_tensor", "returns a float64 0-dim tensor: equal to the float, but not one",
        "cosine_lr", "return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
        "return torch.tensor(base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps))), "
        "dtype=torch.float64)", cosine_lr_returns_a_python_float),
    mistake("step_returns_int", "returns int(...): 0 / 1 instead of a bool",
        "should_step_optimizer", "return step % accumulation_steps == 0", "return int(step % accumulation_steps == 0)",
        should_step_returns_a_bool),
    mistake("flush_returns_int", "returns int(...): 0 / 1 instead of a bool",
        "should_flush_tail", "return last_step > start_step and last_step % accumulation_steps != 0",
        "return int(last_step > start_step and last_step % accumulation_steps != 0)",
        should_flush_returns_a_bool),
    # rules an outside student's wrong variants broke unseen (each scenario varied across its range since)
    mistake("hardcoded_base_lr", "cosine_lr(..., 5e-4): the schedule of one fixed base_lr, whatever the caller passes",
        "train_one_epoch", "cosine_lr(epoch * iters + step, epochs * iters, base_lr)",
        "cosine_lr(epoch * iters + step, epochs * iters, 5e-4)", train_one_epoch_matches_oracle_fp32,
        rule="proportional to the caller's base_lr"),
    mistake("skipped_norm_recorded_finite", "a skipped update (inf/NaN gradients) records grad_norm 0.0, not the "
        "non-finite pre-clip norm", "_optimizer_update", "return grad_norm, scale_before",
        "return torch.nan_to_num(grad_norm, posinf=0.0), scale_before", train_one_epoch_matches_oracle_amp,
        rule="never a finite stand-in"),
    mistake("tail_flush_on_last_boundary", "tail_flush=True also where a window closes on its K-th micro-step at "
        "step == iters", "train_one_epoch", '"tail_flush": s == tail_step}', '"tail_flush": s in (tail_step, iters)}',
        train_one_epoch_matches_oracle_fp32, rule="not even at step == iters"),
    mistake("clip_first_group_only", "measures and clips param_groups[0]'s gradients only: other groups are "
        "neither counted in the norm nor clipped", "_optimizer_update",
        "clip_grad_norm_(model.parameters(), grad_clip)",
        'clip_grad_norm_(optimizer.param_groups[0]["params"], grad_clip)', train_one_epoch_matches_oracle_fp32,
        rule="not one param group's"),
    mistake("host_copy_every_micro_step", "loss.detach().cpu() at every micro-step: a device-to-host copy each",
        "train_one_epoch", "losses.append(loss.detach())", "losses.append(loss.detach().cpu())",
        train_one_epoch_syncs_once_per_epoch, rule="a host copy (cpu) per micro-step"),
    mistake("numpy_every_micro_step", "the loss through .numpy() at every micro-step: a host copy each",
        "train_one_epoch", "losses.append(loss.detach())", "losses.append(torch.from_numpy(loss.detach().numpy()))",
        train_one_epoch_syncs_once_per_epoch, rule="a host copy (numpy) per micro-step"),
    mistake("scaler_none_for_cuda", "scaler=None builds torch.amp.GradScaler(): a CUDA scaler (enabled on a GPU, "
        "a warning and disabled on a CPU-only machine)", "train_one_epoch",
        "scaler = torch.amp.GradScaler(torch.device(device).type, enabled=False)", "scaler = torch.amp.GradScaler()",
        train_one_epoch_emits_no_warnings),
    mistake("records_loss_tensors", "keeps the losses as 0-dim tensors in the records instead of Python floats",
        "train_one_epoch", "loss_values = torch.stack(losses).float().tolist()",
        "loss_values = list(torch.stack(losses).float())", train_one_epoch_records_python_values),
    # variants whose failure once named another mistake's rule (issue 25): each now gets its own
    mistake("lr_one_micro_step_late", "writes the lr after the micro-step's update: every forward and update runs "
        "at the previous micro-step's lr", "train_one_epoch", LOOP_LR_EVERY_MICRO_STEP, LOOP_LR_AFTER_THE_UPDATE,
        train_one_epoch_sets_lr_in_every_param_group, rule="one micro-step late"),
    mistake("zero_grad_before_step", "clears the gradients before the step: the step finds none, the weights never "
        "move", "_optimizer_update",
        "    scaler.step(optimizer)\n    scaler.update()\n    optimizer.zero_grad(set_to_none=True)\n",
        "    optimizer.zero_grad(set_to_none=True)\n    scaler.step(optimizer)\n    scaler.update()\n",
        train_one_epoch_matches_oracle_fp32, rule="zero_grad after the step"),
    mistake("loss_divided_twice", "divides the result of scale_loss_for_accumulation by K again: every update's "
        "gradient is 1/K of the mean", "train_one_epoch",
        "scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps)",
        "scaled_loss = scale_loss_for_accumulation(loss, accumulation_steps) / accumulation_steps",
        train_one_epoch_matches_oracle_fp32, rule="divided by K twice"),
]

EQUIVALENTS = [
    equivalent("multiply_by_reciprocal", "loss * (1 / K) instead of loss / K",
        "scale_loss_for_accumulation", "return loss / accumulation_steps", "return loss * (1.0 / accumulation_steps)"),
    equivalent("cosine_in_torch_float64", "the cosine computed on a float64 CPU tensor, then float(): a tensor born "
        "on the host waits for no device", "cosine_lr",
        "return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
        "return float(base_lr * (0.1 + 0.45 * (1 + torch.cos(torch.tensor(math.pi * current_step / total_steps, "
        "dtype=torch.float64)))))"),
    equivalent("rearranged_cosine", "0.1*lr + 0.45*lr*(1 + cos(pi * (s / T)))",
        "cosine_lr", "base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
        "0.1 * base_lr + 0.45 * base_lr * (1 + math.cos(math.pi * (current_step / total_steps)))"),
    equivalent("not_modulo", "not step % K instead of step % K == 0",
        "should_step_optimizer", "return step % accumulation_steps == 0", "return not step % accumulation_steps"),
    equivalent("test_relative_norm", "one relative-norm bound on all gradients instead of assert_close per tensor",
        "test_accumulation_matches_big_batch",
        COMPARE_EVERY_PARAMETER + assert_gradients("1e-4"),
        "    actual = torch.cat([p.grad.flatten() for p in model.parameters()])\n"
        "    expected = torch.cat([p.grad.flatten() for p in big.parameters()])\n"
        "    error = float((actual - expected).norm() / expected.norm())\n"
        "    assert error <= 1e-5, f\"relative gradient error {error:.2e} > 1e-5\"\n"),
    equivalent("test_chunks_by_k", "input_ids.chunk(k) instead of split(micro_size): the same micro-batches",
        "test_accumulation_matches_big_batch", "list(zip(input_ids.split(micro_size), labels.split(micro_size)))",
        "list(zip(input_ids.chunk(k), labels.chunk(k)))"),
    equivalent("warmup_fraction_first", "current_step / warmup_steps * base_lr",
        "warmup_cosine_lr",
        "return base_lr * current_step / warmup_steps", "return current_step / warmup_steps * base_lr"),
]
