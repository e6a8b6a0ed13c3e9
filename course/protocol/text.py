"""Text micro-batches and the task step functions that plug into ``TrainingSession.train_step``.

The loss mask is decided per sample (``PretrainDataset``: pad -> -100) and a batch only carries it
position by position; its valid-token count is taken on the host when the batch is built, so the
training loop never waits on the device to learn it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from course.minimind import IGNORE_INDEX
from .types import TrainingStepOutput


@dataclass(frozen=True)
class TextBatch:
    input_ids: torch.Tensor   # [batch, seq], host memory until the step function moves it
    labels: torch.Tensor      # same shape; -100 where a target does not count
    loss_units: int           # valid shifted targets, counted when the batch was built


def shifted_target_count(labels: torch.Tensor) -> int:
    """Valid next-token targets of ``labels``: the positions ``token_nll_sum`` counts (no checks; the
    lesson's exercise ``count_loss_units`` adds them)."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def collate(samples, count_loss_units, pin_memory: bool = False) -> TextBatch:
    """Stack ``(input_ids, labels)`` samples; ``count_loss_units`` is the lesson's exercise function
    (or ``shifted_target_count``). ``pin_memory`` (for a CUDA model) puts the batch in page-locked host
    memory, so the step function's ``non_blocking`` copy runs asynchronously (lesson 14 §5.5)."""
    input_ids = torch.stack([x for x, _ in samples])
    labels = torch.stack([y for _, y in samples])
    if pin_memory:
        input_ids, labels = input_ids.pin_memory(), labels.pin_memory()
    return TextBatch(input_ids, labels, count_loss_units(labels))


def token_nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of the model's shifted next-token NLL: the numerator of a token-weighted loss."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def _to_model(model, batch: TextBatch):
    device = next(model.parameters()).device  # on the CPU .to returns the batch's own tensors
    return batch.input_ids.to(device, non_blocking=True), batch.labels.to(device, non_blocking=True)


def token_weighted_step(model, batch: TextBatch) -> TrainingStepOutput:
    """Mean NLL over this micro-batch's valid tokens (+ MoE aux loss), with its token count.

    The session weights it (lesson 16 §1.2) so that the update's gradient is the one of the whole global
    batch's token mean. A batch without valid tokens contributes 0.
    """
    input_ids, labels = _to_model(model, batch)
    out = model(input_ids)
    nll_sum = token_nll_sum(out.logits, labels)
    loss = nll_sum / max(batch.loss_units, 1) + out.aux_loss
    return TrainingStepOutput(loss=loss, gradient_units=batch.loss_units, loss_sum=nll_sum.detach(),
                              loss_units=batch.loss_units)


def naive_mean_step(model, batch: TextBatch) -> TrainingStepOutput:
    """Lesson 14's objective as a step function: the micro-batch MEAN counts as one unit.

    With ``normalization_units = K`` the session then trains on the mean of micro-batch means, which is the
    bug this lesson fixes. Kept for the labs and the comparison.
    """
    input_ids, labels = _to_model(model, batch)
    out = model(input_ids, labels=labels)
    return TrainingStepOutput(loss=out.loss + out.aux_loss, gradient_units=1,
                              loss_sum=token_nll_sum(out.logits, labels).detach(), loss_units=batch.loss_units)
