"""The mistake catalogue: typical wrong implementations, each proven to be caught.

Every entry is a small source edit of the reference solution (``old`` -> ``new``). The tests build
the edited module, run the lesson's checks on it and assert that ``caught_by`` FAILS with a helpful
message; ``EQUIVALENTS`` are edits that are algebraically the same and must PASS every check.
The lessons list these entries; ``python -m course mistakes`` prints them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .framework import REFERENCE_DIR, module_from_source


@dataclass(frozen=True)
class Mistake:
    lesson: str
    name: str
    description: str
    old: str
    new: str
    caught_by: str = ""   # the check that must fail ("" for an accepted equivalent)
    module_path: str = "core/train_loop.py"

    def source(self) -> str:
        original = (REFERENCE_DIR / self.module_path).read_text(encoding="utf-8")
        count = original.count(self.old)
        if count != 1:
            raise ValueError(f"mistake {self.name!r}: its 'old' snippet occurs {count} times in "
                             f"{self.module_path}, expected exactly once (did the reference change?)")
        return original.replace(self.old, self.new)

    def build(self):
        return module_from_source(self.source(), f"{self.lesson}_{self.name}",
                                  f"<mistake {self.name}: {self.module_path}>")


MISTAKES = [
    Mistake("14", "off_by_one_step", "steps when (step + 1) % K == 0 (upstream before PR #698, issue #691)",
            "return step % accumulation_steps == 0", "return (step + 1) % accumulation_steps == 0",
            "should_step_at_window_ends"),
    Mistake("14", "old_cosine_peaks_at_1_1", "lr/10 + 0.5*lr*(1+cos): the old formula, starts at 1.1*lr",
            "base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
            "base_lr / 10 + 0.5 * base_lr * (1 + math.cos(math.pi * current_step / total_steps))",
            "cosine_lr_matches_get_lr"),
    Mistake("14", "loss_not_divided", "backpropagates the raw loss: K micro-batches sum instead of average",
            "return loss / accumulation_steps", "return loss", "scale_loss_divides_by_k"),
    Mistake("14", "clip_before_unscale", "clips the still-scaled gradients, then unscales",
            "    scaler.unscale_(optimizer)\n    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n",
            "    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n    scaler.unscale_(optimizer)\n",
            "train_one_epoch_matches_oracle_amp"),
    Mistake("14", "no_tail_flush", "drops the gradients of an epoch's last, partial window",
            "if should_flush_tail(last_step, start_step, accumulation_steps):", "if False:",
            "train_one_epoch_matches_oracle_fp32"),
    Mistake("14", "lr_only_at_optimizer_steps", "writes the lr into the optimizer only on update micro-steps",
            '        for group in optimizer.param_groups:\n            group["lr"] = lr\n',
            '        if should_step_optimizer(step, accumulation_steps):\n'
            '            for group in optimizer.param_groups:\n                group["lr"] = lr\n',
            "train_one_epoch_matches_oracle_fp32"),
    Mistake("14", "forgets_aux_loss", "trains on the LM loss only: the MoE router's balance loss is lost",
            "loss = out.loss + out.aux_loss", "loss = out.loss", "train_one_epoch_matches_oracle_fp32"),
    Mistake("14", "schedule_ignores_epoch", "cosine_lr(step, ...) restarts the schedule every epoch",
            "cosine_lr(epoch * iters + step, epochs * iters, base_lr)", "cosine_lr(step, epochs * iters, base_lr)",
            "train_one_epoch_matches_oracle_fp32"),
    Mistake("14", "ignores_start_step", "counts micro-steps from 1 after a resume",
            "enumerate(loader, start=start_step + 1)", "enumerate(loader, start=1)",
            "train_one_epoch_matches_oracle_fp32"),
    Mistake("14", "zero_grad_every_micro_step", "clears gradients before each backward: nothing accumulates",
            "        scaler.scale(scaled_loss).backward()\n",
            "        optimizer.zero_grad(set_to_none=True)\n        scaler.scale(scaled_loss).backward()\n",
            "train_one_epoch_matches_oracle_fp32"),
]

EQUIVALENTS = [
    Mistake("14", "multiply_by_reciprocal", "loss * (1 / K) instead of loss / K",
            "return loss / accumulation_steps", "return loss * (1.0 / accumulation_steps)"),
    Mistake("14", "rearranged_cosine", "0.1*lr + 0.45*lr*(1 + cos(pi * (s / T)))",
            "base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))",
            "0.1 * base_lr + 0.45 * base_lr * (1 + math.cos(math.pi * (current_step / total_steps)))"),
    Mistake("14", "not_modulo", "not step % K instead of step % K == 0",
            "return step % accumulation_steps == 0", "return not step % accumulation_steps"),
]


_SESSION = "core/train_session.py"
MISTAKES += [
    Mistake("16", "loss_over_k", "backpropagates loss / K (mean of micro-batch means) instead of unit weighting",
            "weight = output.gradient_units / options.normalization_units", "weight = 1 / self.grad_accum_steps",
            "session_global_normalization_matches_one_backward", _SESSION),
    Mistake("16", "counts_unshifted_labels", "counts labels != -100 without the shift: one target too many per row",
            "return int((labels[..., 1:] != IGNORE_INDEX).sum())", "return int((labels != IGNORE_INDEX).sum())",
            "count_loss_units_sees_the_shift", _SESSION),
    Mistake("16", "steps_on_micro_count_only", "closes an update only every K micro-steps: force_update is ignored",
            "closes_update = options.force_update or should_step_optimizer(", "closes_update = should_step_optimizer(",
            "session_force_update_commits_a_tail", _SESSION),
    Mistake("16", "clip_before_unscale", "clips the still-scaled gradients, then unscales",
            "        self.scaler.unscale_(self.optimizer)\n        grad_norm = None\n"
            "        if options.clip_grad_norm > 0:\n"
            "            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)\n",
            "        grad_norm = None\n        if options.clip_grad_norm > 0:\n"
            "            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), options.clip_grad_norm)\n"
            "        self.scaler.unscale_(self.optimizer)\n",
            "session_amp_scaler_overflow_and_unscale_before_clip", _SESSION),
    Mistake("16", "error_keeps_half_update", "a failed micro-step leaves the accumulation valid: the next call reuses it",
            "            self.accumulation_valid = False\n            raise\n", "            raise\n",
            "session_error_invalidates_the_accumulation", _SESSION),
    Mistake("16", "abort_keeps_gradients", "a before_update abort forgets the counters but keeps the gradients",
            "            self.reset_accumulation()\n            return TrainingStepReport(False",
            "            self._clear_pending()\n            return TrainingStepReport(False",
            "session_abort_discards_the_update", _SESSION),
    Mistake("16", "zero_units_accepted", "accepts normalization_units == 0 (division by zero instead of a clear error)",
            "if options.normalization_units <= 0:", "if options.normalization_units < 0:",
            "session_rejects_zero_normalization_units", _SESSION),
    Mistake("16", "loss_readback_every_microstep", "reads the loss back to the host on every micro-step",
            "loss_sum = output.loss_sum.detach()", "loss_sum = torch.tensor(output.loss_sum.item())",
            "session_keeps_loss_sums_on_device", _SESSION),
    Mistake("16", "syncs_every_microstep", "never uses no_sync: DDP all-reduces on every micro-step",
            "sync_ctx = no_sync() if no_sync is not None and not closes_update else nullcontext()",
            "sync_ctx = nullcontext()", "session_uses_no_sync_before_the_last_microstep", _SESSION),
    Mistake("16", "floor_steps_per_epoch", "sample_count // global_batch_size: the short tail update is lost",
            "return math.ceil(sample_count / global_batch_size)", "return sample_count // global_batch_size",
            "steps_per_epoch_is_ceil", _SESSION),
    Mistake("16", "split_drops_partial_micro", "drops a partial micro-batch of a short global batch",
            "for i in range(0, len(samples), micro)]", "for i in range(0, len(samples) - micro + 1, micro)]",
            "split_global_batch_micro_sizes", _SESSION),
    Mistake("16", "legacy_batch_kept_as_global", "reads a legacy micro-batch size as the global batch",
            'global_batch = state["batch_size"] * state["accum_steps"]', 'global_batch = state["batch_size"]',
            "migrate_legacy_state_to_global_semantics", _SESSION),
]

EQUIVALENTS += [
    Mistake("16", "weight_inside_the_graph", "loss * units / N as tensor ops instead of a Python float weight",
            "self.scaler.scale(output.loss * weight).backward()",
            "self.scaler.scale(output.loss * output.gradient_units / options.normalization_units).backward()",
            module_path=_SESSION),
    Mistake("16", "count_with_item", "(...).sum().item() instead of int((...).sum())",
            "return int((labels[..., 1:] != IGNORE_INDEX).sum())",
            "return (labels[..., 1:] != IGNORE_INDEX).sum().item()", module_path=_SESSION),
    Mistake("16", "ceil_by_negation", "-(-n // b) instead of math.ceil(n / b)",
            "return math.ceil(sample_count / global_batch_size)", "return -(-sample_count // global_batch_size)",
            module_path=_SESSION),
]

_CHECKPOINT = "core/checkpoint.py"
MISTAKES += [
    Mistake("15", "drops_optimizer_state", "restores the weights only: AdamW restarts with empty moments",
            '        optimizer.load_state_dict(checkpoint["optimizer"])\n', "        pass\n",
            "exact_resume_fp32", _CHECKPOINT),
    Mistake("15", "saves_fp16_weights", "stores the model in fp16 like upstream's resume file: resume is inexact",
            '"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}',
            '"model": {k: v.detach().half().cpu() for k, v in model.state_dict().items()}',
            "save_checkpoint_writes_full_state", _CHECKPOINT),
    Mistake("15", "does_not_skip_trained_batches", "the sampler ignores skip_batches: a resumed epoch retrains them",
            "            if position < skipped_samples:\n                continue\n", "",
            "skip_batch_sampler_matches_upstream", _CHECKPOINT),
    Mistake("15", "drops_final_partial_batch", "the sampler drops the epoch's last, partial batch",
            "        if batch:\n            yield batch\n", "", "skip_batch_sampler_matches_upstream", _CHECKPOINT),
    Mistake("15", "non_atomic_write", "torch.save straight onto the path: a crash mid-save destroys the last checkpoint",
            'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
            "fd, tmp_name = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), str(path)",
            "save_checkpoint_is_atomic", _CHECKPOINT),
    Mistake("15", "forgets_the_scaler", "never restores the GradScaler: the scale restarts at 65536",
            "        scaler.load_state_dict(scaler_state)\n", "        pass\n",
            "exact_resume_with_grad_scaler", _CHECKPOINT),
    Mistake("15", "saves_mid_accumulation", "saves while gradients are pending: the file silently lacks them",
            "    if any(p.grad is not None and bool(p.grad.ne(0).any()) for p in model.parameters()):\n",
            "    if False:\n", "save_checkpoint_refuses_pending_gradients", _CHECKPOINT),
    Mistake("15", "weights_only_false", "torch.load(weights_only=False): a checkpoint can run arbitrary code",
            'torch.load(path, map_location="cpu", weights_only=True)',
            'torch.load(path, map_location="cpu", weights_only=False)',
            "load_checkpoint_rejects_unreadable_files", _CHECKPOINT),
    Mistake("15", "loads_model_before_validating", "loads the weights, then finds the optimizer state is foreign",
            '    if optimizer is not None:\n        _validate_optimizer_state(path, checkpoint["optimizer"], optimizer)\n'
            '    scaler_state = checkpoint["scaler"]\n',
            '    model.load_state_dict(checkpoint["model"])\n    if optimizer is not None:\n'
            '        _validate_optimizer_state(path, checkpoint["optimizer"], optimizer)\n'
            '    scaler_state = checkpoint["scaler"]\n',
            "load_checkpoint_rejects_foreign_checkpoints", _CHECKPOINT),
    Mistake("15", "no_world_size_rescale", "keeps the saved step after a world-size change (upstream rescales it)",
            '    if checkpoint["world_size"] != current:\n', "    if False:\n",
            "load_checkpoint_rescales_step_for_world_size", _CHECKPOINT),
    Mistake("15", "resumes_one_step_late", "start_step = step + 1: the micro-batch after the checkpoint is skipped",
            "return (epoch + 1, 0) if step == iters else (epoch, step)",
            "return (epoch + 1, 0) if step == iters else (epoch, step + 1)", "resume_position_cases", _CHECKPOINT),
]

EQUIVALENTS += [
    Mistake("15", "ceil_by_negation", "-(-N // bs) instead of (N + bs - 1) // bs in __len__",
            "(len(self.indices) + self.batch_size - 1) // self.batch_size - self.skip_batches",
            "-(-len(self.indices) // self.batch_size) - self.skip_batches", module_path=_CHECKPOINT),
    Mistake("15", "fixed_tmp_name", "upstream's fixed path + '.tmp' instead of a mkstemp name",
            'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
            'tmp_name = f"{path}.tmp"\n    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)',
            module_path=_CHECKPOINT),
]


def catalogue(lesson: str) -> tuple[list[Mistake], list[Mistake]]:
    return [m for m in MISTAKES if m.lesson == lesson], [m for m in EQUIVALENTS if m.lesson == lesson]
