"""The API types of lesson 16's single-step training protocol (not exercises).

Both the student's ``impl/train_session.py`` and the reference import these, so a
submission and the reference speak the same language to the run driver and to the checks.

State split (lesson 16 §5.4):

* ``TrainingSessionState`` - what the session owns: lr, optimizer steps, the micro-steps and loss
  numerators of the update in progress, and whether that accumulation is still valid.
* ``TrainingRunState`` - what the run driver owns: epoch, update step in the epoch, sample
  position, dataset identity and the lr schedule recipe.
* the serialized training state - a lesson-15 resume checkpoint (model / optimizer / scaler,
  ``epoch``, ``step``) whose extra keys hold both and ``batch_size_semantics = "global"``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

GLOBAL_SEMANTICS = "global"   # the batch size is the batch of one optimizer update (--global-batch-size)


class AccumulationInvalidError(RuntimeError):
    """A micro-step failed: the half-built update must not be reused until it is reset."""


@dataclass
class TrainingStepOutput:
    """What a task's ``step_fn(model, batch)`` returns for one micro-batch.

    ``loss`` is already normalized by ``gradient_units`` (e.g. NLL sum / valid tokens of this
    micro-batch); the session weights it so that the update's gradient is one backward of the mean over the
    whole update's ``normalization_units`` (lesson 16 §1.2 asks by which factor).
    ``loss_sum`` (an un-normalized numerator on the device) and ``loss_units`` feed the loss
    readback. A micro-batch without valid units returns ``gradient_units=0`` and a finite loss.
    """

    loss: torch.Tensor
    gradient_units: int
    loss_sum: Optional[torch.Tensor] = None
    loss_units: int = 0


@dataclass
class TrainingStepOptions:
    """Per micro-step instructions from the run driver.

    ``normalization_units`` is the unit count of the WHOLE update (every micro-batch, every
    rank), counted before the first micro-step. ``before_update`` returning True aborts the
    update (gradients discarded, parameters untouched); ``after_update`` runs after the optimizer
    step and before ``zero_grad``.
    """

    lr: Optional[float] = None
    clip_grad_norm: float = 0.0
    normalization_units: int = 0
    force_update: bool = False
    before_update: Optional[Callable[[], bool]] = None
    after_update: Optional[Callable[[], None]] = None


@dataclass
class TrainingStepReport:
    """What one ``train_step`` did.

    On a micro-step that does not close an update: ``parameters_updated=False``,
    ``loss_sum=None``, ``loss_units=0``. On the micro-step that closes it, ``loss_sum`` /
    ``loss_units`` are the update's totals (``loss_sum`` still a device tensor: read it back
    when convenient) and ``microsteps_accumulated`` is the number of micro-steps the update held.

    One name per outcome of a closing micro-step (lesson 14 uses the same two names):

    * ``parameters_updated``: ``optimizer.step`` ran; ``optimizer_step`` counts these updates.
    * ``overflow_skipped``: the GradScaler found inf/NaN and skipped ``optimizer.step``.
    * ``update_closed``: the update's data is consumed: it stepped or was skipped.
    * ``aborted``: ``before_update`` returned True; the gradients were discarded, the update is not closed.

    ``grad_norm`` is the pre-clip norm when clipping is on, ``None`` when it is off.
    Upstream MiniMind calls ``scaler.step`` and never reports a skip: its step counter, lr
    schedule and logs advance as if the update had happened.
    """

    parameters_updated: bool
    optimizer_step: int
    microsteps_accumulated: int
    loss_sum: Optional[torch.Tensor] = None
    loss_units: int = 0
    grad_norm: Optional[torch.Tensor] = None
    overflow_skipped: bool = False
    aborted: bool = False

    @property
    def update_closed(self) -> bool:
        """The update's data is consumed: it stepped or was skipped (``parameters_updated or overflow_skipped``)."""
        return self.parameters_updated or self.overflow_skipped


@dataclass
class TrainingSessionState:
    """The session's own state (lesson 16 §5.4)."""

    lr: float
    optimizer_step: int
    microsteps_accumulated: int
    loss_sum: Optional[torch.Tensor]
    loss_units: int
    accumulation_valid: bool


@dataclass
class TrainingRunState:
    """The run driver's state: where in the data and in the schedule the run is.

    ``update_step_in_epoch`` and ``global_step`` count optimizer UPDATES, never micro-steps.
    ``sample_position`` is the number of samples of the epoch's order already consumed, i.e. where
    the next update's global batch starts (0 at the start of an epoch).
    """

    epoch: int = 0
    update_step_in_epoch: int = 0
    global_step: int = 0
    sample_position: int = 0
    dataset_identity: str = ""
    seed: int = 42
    base_lr: float = 5e-4
    total_steps: int = 0
