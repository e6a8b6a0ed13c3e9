"""Lesson 16's tiny updates: masked micro-batches, the one-backward oracle, and a driven update.

The oracle of a session update is ONE backward of the whole global batch with the loss
``sum of NLL / valid tokens of the global batch``; ``run_update`` drives a ``TrainingSession`` (of any
implementation) through one update the way the run driver does.
"""
from __future__ import annotations

import torch

from course.protocol.text import TextBatch, collate, shifted_target_count, token_nll_sum, token_weighted_step
from course.protocol.types import TrainingStepOptions, TrainingStepReport

from .eager import eager
from .loop import LoopScenario, tiny_batches, tiny_model

SESSION_SCENARIO = LoopScenario("lesson 16 tiny model", hidden_size=32, num_hidden_layers=1, max_length=16)
# Valid label positions per sample (labels[i, cut:] = -100), 2 samples per micro-batch: the four
# micro-batches hold 29, 10, 2 and 1 valid shifted targets - as unequal as padding gets.
LABEL_CUTS = ((16, 15), (9, 3), (2, 2), (2, 0))


def masked_micro_batches(cuts=LABEL_CUTS, seed: int = 7) -> list[TextBatch]:
    """Micro-batches of 2 samples whose loss masks are decided per sample (labels[i, cut:] = -100)."""
    input_ids, labels = tiny_batches(len(cuts) * 2, SESSION_SCENARIO.max_length, 1, seed)[0]
    samples = []
    for i, cut in enumerate(c for pair in cuts for c in pair):
        sample_labels = labels[i].clone()
        sample_labels[cut:] = -100
        samples.append((input_ids[i], sample_labels))
    return [collate(samples[2 * j:2 * j + 2], shifted_target_count) for j in range(len(cuts))]


def session_model(params: dict | None = None):
    """The lesson's tiny model, holding ``params`` (``params_of`` a session's model after earlier updates) if given."""
    model = tiny_model(SESSION_SCENARIO)
    if params is not None:
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(params[name])
    return model


def global_batch_gradients(batches: list[TextBatch], params: dict | None = None) -> tuple[dict, torch.Tensor, int]:
    """The oracle: one forward/backward of the whole global batch, loss = NLL sum / its valid tokens, on the
    tiny model (holding ``params`` when given)."""
    model = session_model(params)
    input_ids = torch.cat([b.input_ids for b in batches])
    labels = torch.cat([b.labels for b in batches])
    units = sum(b.loss_units for b in batches)
    nll_sum = token_nll_sum(model(input_ids).logits, labels)
    (nll_sum / units).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, nll_sum.detach(), units


def new_session(impl, k: int, *, optimizer_cls=torch.optim.SGD, two_param_groups: bool = False, device: str = "cpu",
                **kwargs):
    """``impl.TrainingSession`` over a fresh tiny model (lr 0.1) on ``device`` accumulating ``k`` micro-steps.

    ``two_param_groups``: matrices and 1-D parameters (norm weights) in separate groups, the second
    at lr 0.05, as weight-decay setups do; an lr written to the first group only then shows.
    """
    model = tiny_model(SESSION_SCENARIO.with_(device=device))
    params = list(model.parameters())
    groups = ([{"params": [p for p in params if p.dim() > 1]}, {"params": [p for p in params if p.dim() <= 1],
                                                               "lr": 0.05}] if two_param_groups else params)
    optimizer = eager(optimizer_cls)(groups, lr=0.1)
    return impl.TrainingSession(model, optimizer, accumulation_steps=k, **kwargs)


def params_of(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def grads_of(model) -> dict:
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in
            model.named_parameters()}


def run_update(session, batches, *, clip=0.0, units=None, step_fn=token_weighted_step,
               **hooks) -> list[TrainingStepReport]:
    """Drive one update the way the run driver does; returns the report of each micro-step."""
    units = sum(b.loss_units for b in batches) if units is None else units
    return [session.train_step(b, TrainingStepOptions(clip_grad_norm=clip, normalization_units=units,
                                                      force_update=i == len(batches) - 1, **hooks), step_fn)
            for i, b in enumerate(batches)]


def capture_grads(session, into: dict):
    """A before_update hook that snapshots the accumulated gradients and lets the update proceed."""
    def hook():
        into.update(grads_of(session.model))
        return False
    return hook
