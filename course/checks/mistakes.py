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


def catalogue(lesson: str) -> tuple[list[Mistake], list[Mistake]]:
    return [m for m in MISTAKES if m.lesson == lesson], [m for m in EQUIVALENTS if m.lesson == lesson]
