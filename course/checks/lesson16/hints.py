"""Lesson 16's hint ladder (``python -m course hint 16 EXERCISE``; the notebook names the command): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
    "count_loss_units": (
        "Count what the loss divides by: the positions whose NLL the model's shifted cross-entropy actually "
        "adds up. Which position of a sequence does nothing predict, and which labels are ignored?",
        "course/minimind/model.py::MiniMindForCausalLM.forward shifts the logits and labels before its "
        "cross_entropy(..., ignore_index=-100); course/protocol/text.py::token_nll_sum does the same as a sum. "
        "Lesson 16 §1.3 lists what N counts; §1.4 shows the unshifted count (49 instead of 42).",
        "A target is a label at position >= 1 (labels[..., 1:], along the last dimension, so [seq] and "
        "[batch, seq] both work) that is not -100. Return a Python int. (Hardening, optional, lesson 16 §4.5: a "
        "0-dim tensor and a floating, complex or bool dtype are a ValueError naming labels.)",
        "return int((labels[..., 1:] != IGNORE_INDEX).sum()).",
    ),
    "split_global_batch": (
        "A global batch is the samples of ONE optimizer update; the K micro-batches are just how it is fed to "
        "memory. Cut it into equal slices in order - and think about the short last global batch of an epoch.",
        "course/protocol/driver.py::run_text_training calls it once per update with the samples of that update "
        "(fewer at the epoch's end) and collates each slice; lesson 16 §4.2 and §5.3 give the sizes.",
        "micro = global_batch_size // accumulation_steps samples per slice; a short global batch is cut into "
        "slices of the same size, the last one smaller, down to a tail of one sample. (Hardening, optional, "
        "§4.5: list(samples) first so tuples and ranges give lists; a ValueError naming the bad argument for a "
        "size < 1, an accumulation_steps that does not divide global_batch_size, an empty or oversized samples.)",
        "samples = list(samples); micro = global_batch_size // accumulation_steps; "
        "return [samples[i:i + micro] for i in range(0, len(samples), micro)].",
    ),
    "steps_per_epoch": (
        "Every global batch of the epoch is one optimizer update, and the leftover samples at the end form one "
        "more (smaller) update: none is dropped.",
        "run_text_training (course/protocol/driver.py) loops update_step_in_epoch from 0 to this number; the "
        "check's cases (160, 8) -> 20 and (161, 8) -> 21 show the rounding.",
        "The number of updates is the sample count divided by the global batch, rounded UP (0 samples: 0 "
        "updates). (Hardening, optional, §4.5: exact for any int, and a ValueError for sample_count < 0 or "
        "global_batch_size < 1.)",
        "return -(-sample_count // global_batch_size): integer arithmetic (math.ceil(sample_count / "
        "global_batch_size) divides in floats, which the hardening tier catches above 2**53).",
    ),
    "TrainingSession": (
        "One update = K micro-steps whose gradients add up in .grad, then one optimizer step. For that sum to "
        "be the gradient of the global batch's token mean, each micro-step's loss must be weighted by its share "
        "of the update's targets - and the session, not the caller, owns the boundary, the errors and the hooks.",
        "Start from course/minimind/train_pretrain.py::train_epoch (loss / K, step % K, the optimizer block, the "
        "tail flush) and lesson 14's train_one_epoch. Then read course/protocol/types.py (the Options, Output "
        "and Report fields), course/protocol/driver.py::run_text_training (how train_step is called) and "
        "course/runs/session.py::run_update / capture_grads (how the checks drive and observe you).",
        "Backpropagate scaler.scale(output.loss * output.gradient_units / options.normalization_units). The "
        "update closes when force_update or (microsteps + 1) is a multiple of K. Write options.lr (when not "
        "None) into every param group. At the boundary: before_update -> unscale_ -> clip (pre-clip norm) -> "
        "scaler.step -> scaler.update -> if stepped: optimizer_step += 1 and after_update -> clear the "
        "gradients and the totals. The scaler skipped the step exactly when update() LOWERED its scale: compare "
        "get_scale() before and after (only when the scaler is enabled; a higher scale is growth, not a skip). "
        "Wrap the whole micro-step in try/except that sets accumulation_valid = False and re-raises. (Hardening, "
        "optional, §4.5: argument rules, except BaseException, set_to_none gradients, no_sync under DDP.)",
        "train_step: if not self.accumulation_valid: raise AccumulationInvalidError('... reset_accumulation()'); "
        "try: return self._step(...) except BaseException: self.accumulation_valid = False; raise. _step: write "
        "options.lr into every group; closes = ...; ctx = model.no_sync() if hasattr(model, 'no_sync') and not "
        "closes else nullcontext(); with ctx: with self.autocast: out = step_fn(model, batch); backward. Add "
        "out.loss_sum.detach() and out.loss_units to the totals, microsteps += 1; not closing -> "
        "TrainingStepReport(False, self.optimizer_step, self.microsteps_accumulated). Closing: keep the totals, "
        "abort via reset_accumulation() -> aborted=True; else the boundary sequence above, then clear the totals "
        "and return TrainingStepReport(not skipped, optimizer_step, microsteps, loss_sum, loss_units, grad_norm, "
        "overflow_skipped=skipped).",
    ),
    "test_token_weighted_matches_global_batch": (
        "A test is only as strong as the wrong code it rejects. List the wrong weightings (the mean of "
        "micro-batch means, counts with masked or unshifted targets, each micro-batch by its own count, one "
        "tensor slightly off, a sign or a place wrong) and choose inputs under which each changes the gradient.",
        "course/runs/accumulation.py::accumulate_token_weighted is the correct version your test receives; "
        "course/runs/session.py::masked_micro_batches and global_batch_gradients show how the oracle is "
        "built. Lesson 16 answers §4.4's table says which input lets each bug through.",
        "K >= 2 micro-batches with UNEQUAL valid-target counts, masked (-100) targets in some, valid labels at "
        "position 0 of some samples; the oracle is ONE backward of token_nll_sum / shifted_target_count over "
        "all of them concatenated, on a second model with the same seed; compare every parameter's gradient "
        "element-wise with rtol around 1e-5 and atol around 1e-6 (the default atol 1e-5 hides a 1 % error of "
        "the norm weights' ~7e-4 gradients).",
        "micro = [(b.input_ids, b.labels) for b in masked_micro_batches()]; ids = torch.cat([i for i, _ in "
        "micro]); labels = torch.cat([l for _, l in micro]); big = tiny_model(SESSION_SCENARIO); "
        "(token_nll_sum(big(ids).logits, labels) / shifted_target_count(labels)).backward(); model = "
        "tiny_model(SESSION_SCENARIO); accumulate_token_weighted(model, micro); for each (name, p), q in "
        "zip(model.named_parameters(), big.parameters()): torch.testing.assert_close(p.grad, q.grad, "
        "rtol=1e-5, atol=1e-6).",
    ),
    "migrate_train_state": (
        "A legacy checkpoint counted micro-steps of micro-batches; the new format counts updates of global "
        "batches. Pending gradients were never saved, so a resume can only start at an update boundary - unless "
        "the epoch had already ended.",
        "course/protocol/driver.py::load_train_state calls it; lesson 15's stage assembly (impl/"
        "train_pretrain_impl.py, the oracle's train_epoch) writes batch_size, accum_steps and a micro-step "
        "'step', and saves after the tail flush at the epoch's end. Lesson 16 answers §5.4 works the 160-sample "
        "example.",
        "global_batch_size = batch_size * accum_steps. Micro-steps per epoch = ceil(sample_count / batch_size). "
        "step == that count -> epoch + 1, update 0, nothing dropped; step < it -> update step // accum_steps, "
        "step % accum_steps dropped. sample_position = update * global_batch_size. A state already 'global' "
        "comes back as it is. (Hardening, optional, §4.5: a copy, never the input; the defaults epoch 0, step 0, "
        "accum_steps 1; a ValueError naming the key for a value that is no int in its range, another "
        "batch_size_semantics, a step past the epoch's end.)",
        "semantics = state.get('batch_size_semantics'); 'global' -> dict(state). "
        "legacy = {'epoch': 0, 'step': 0, 'accum_steps': 1, **state}; compute as in level 3; "
        "migrated = {k: v for k, v in legacy.items() if k not in ('batch_size', 'step')}; "
        "migrated.update(batch_size_semantics='global', global_batch_size=..., epoch=..., "
        "update_step_in_epoch=..., sample_position=..., dropped_microsteps=..., migration_note='... update "
        "boundary ...' or '... start of the next epoch ...').",
    ),
}
