"""Lessons 16 and 17: naive ``loss / K`` vs token-weighted accumulation vs the true full batch.

Lesson 16: padded tiny-corpus samples (short lines end in -100 labels), grouped by length inside each global
batch as a length-bucketing loader would do, so the K micro-batches of an update hold very
different numbers of valid targets. Lesson 17: SFT samples (any dataset of ``(input_ids, labels)``) in the
loader's own order, their masks as unequal as the answers are long. Three copies of the tiny MiniMind start
from the same weights and train on the same global batches with AdamW:

* full           - one backward of the whole global batch, loss = NLL sum / its valid tokens (the truth);
* token_weighted - ``TrainingSession`` with K micro-steps and ``normalization_units``;
* naive          - the same session fed lesson 14's objective (each micro-batch mean / K).

At every update the two accumulated gradients are also probed at the FULL model's current weights:
loss gap, gradient cosine and max |grad diff| against the true gradient. After each update the
comparison records how far each trained copy has drifted from the full-batch copy. ``impl`` supplies
``TrainingSession``, ``count_loss_units`` and ``split_global_batch``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from course.protocol.driver import epoch_order
from course.protocol.text import collate, naive_mean_step, token_weighted_step
from course.minimind import TINY_CORPUS, MiniMindConfig, MiniMindForCausalLM, PretrainDataset, setup_seed
from course.runs import grads_of, run_update

VARIANTS = ("full", "token_weighted", "naive")


@dataclass(frozen=True)
class Setup:
    updates: int = 10
    global_batch: int = 8
    accumulation_steps: int = 4
    max_seq_len: int = 64
    hidden_size: int = 64
    num_hidden_layers: int = 2
    lr: float = 1e-3
    grad_clip: float = 1.0
    seed: int = 42
    sort_by_targets: bool = True   # each global batch's samples longest first (near the worst case), else as drawn


# Lesson 17's lab: SFT samples in the loader's order; 96 ids hold every answer of the built-in chat corpus but two
SFT_SETUP = Setup(max_seq_len=96, sort_by_targets=False)


def add_setup_arguments(parser, defaults: Setup = Setup()) -> None:
    """A lab's flags: one ``--name`` per number of ``Setup`` (dashes for underscores), defaulting to ``defaults``."""
    for field in fields(Setup):
        value = getattr(defaults, field.name)
        if not isinstance(value, bool):
            parser.add_argument("--" + field.name.replace("_", "-"), type=type(value), default=value)


def flat(tensors: dict) -> torch.Tensor:
    return torch.cat([t.flatten() for _, t in sorted(tensors.items())]).double()


def global_batches(impl, dataset, setup) -> list[list]:
    """Each update's micro-batches; samples sorted by valid length inside the global batch when the setup says so."""
    order = epoch_order(len(dataset), setup.seed, 0)
    updates = []
    for u in range(setup.updates):
        indices = [order[(u * setup.global_batch + i) % len(order)] for i in range(setup.global_batch)]
        samples = [dataset[i] for i in indices]
        if setup.sort_by_targets:
            samples.sort(key=lambda s: -impl.count_loss_units(s[1]))
        updates.append([collate(m, impl.count_loss_units)
                        for m in impl.split_global_batch(samples, setup.global_batch, setup.accumulation_steps)])
    return updates


def step_setup(impl, variant: str, batches) -> tuple[list, int, object]:
    """(micro-batches, normalization_units, step_fn) of one update for a variant."""
    units = sum(b.loss_units for b in batches)
    if variant == "full":
        whole = collate([(x, y) for b in batches for x, y in zip(b.input_ids, b.labels)], impl.count_loss_units)
        return [whole], units, token_weighted_step
    if variant == "token_weighted":
        return batches, units, token_weighted_step
    return batches, len(batches), naive_mean_step


def probe(impl, model, probe_model, variant: str, batches) -> tuple[torch.Tensor, float]:
    """Gradient and objective value of ``variant`` at ``model``'s weights (the update is aborted)."""
    probe_model.load_state_dict(model.state_dict())
    micro, units, step_fn = step_setup(impl, variant, batches)
    session = impl.TrainingSession(probe_model, torch.optim.SGD(probe_model.parameters(), lr=0.0),
                                   accumulation_steps=len(micro))
    grads: dict = {}

    def capture():
        grads.update(grads_of(probe_model))
        return True
    losses = []

    def recording_step(m, b):
        out = step_fn(m, b)
        losses.append(out.loss.detach() * (out.gradient_units / units))
        return out
    run_update(session, micro, units=units, step_fn=recording_step, before_update=capture)
    return flat(grads), float(sum(losses))


def compare(impl, setup: Setup = Setup(), dataset=None) -> dict:
    """Train the three variants side by side on ``dataset`` (default: the padded tiny corpus); the per-update
    measurements as lists."""
    dataset = PretrainDataset(TINY_CORPUS, max_length=setup.max_seq_len) if dataset is None else dataset
    updates = global_batches(impl, dataset, setup)
    config = MiniMindConfig(hidden_size=setup.hidden_size, num_hidden_layers=setup.num_hidden_layers)
    setup_seed(setup.seed)
    models = {v: MiniMindForCausalLM(config) for v in VARIANTS[:1]}
    for v in VARIANTS[1:]:
        models[v] = MiniMindForCausalLM(config)
        models[v].load_state_dict(models["full"].state_dict())
    probe_model = MiniMindForCausalLM(config)
    start = flat(dict(models["full"].named_parameters())).detach()
    sessions = {v: impl.TrainingSession(m, torch.optim.AdamW(m.parameters(), lr=setup.lr),
                                        accumulation_steps=1 if v == "full" else setup.accumulation_steps)
                for v, m in models.items()}
    history = {"units": [[b.loss_units for b in batches] for batches in updates], "loss_gap": [], "cosine": {},
               "max_diff": {}, "drift": {v: [] for v in VARIANTS[1:]}}
    for v in VARIANTS[1:]:
        history["cosine"][v], history["max_diff"][v] = [], []
    for batches in updates:
        true_grad, true_loss = probe(impl, models["full"], probe_model, "full", batches)
        for v in VARIANTS[1:]:
            grad, loss = probe(impl, models["full"], probe_model, v, batches)
            history["cosine"][v].append(float(torch.nn.functional.cosine_similarity(grad, true_grad, dim=0)))
            history["max_diff"][v].append(float((grad - true_grad).abs().max()))
            if v == "naive":
                history["loss_gap"].append(abs(loss - true_loss))
        for v, session in sessions.items():
            micro, units, step_fn = step_setup(impl, v, batches)
            run_update(session, micro, units=units, step_fn=step_fn, clip=setup.grad_clip)
        full = flat(dict(models["full"].named_parameters())).detach()
        moved = float((full - start).norm())
        for v in VARIANTS[1:]:
            history["drift"][v].append(float((flat(dict(models[v].named_parameters())).detach() - full).norm()) / moved)
    return history


def draw_comparison(axes, history: dict) -> None:
    """Three panels on ``axes``: parameter drift, gradient cosine and max |grad diff| per update."""
    drift_ax, cosine_ax, diff_ax = axes
    steps = range(1, len(history["loss_gap"]) + 1)
    for v, style in (("token_weighted", "-o"), ("naive", "-s")):
        label = "token-weighted" if v == "token_weighted" else "naive loss / K (mean of means)"
        drift_ax.semilogy(steps, [max(d, 1e-12) for d in history["drift"][v]], style, label=label, markersize=3)
        cosine_ax.plot(steps, history["cosine"][v], style, label=label, markersize=3)
        diff_ax.semilogy(steps, [max(d, 1e-12) for d in history["max_diff"][v]], style, label=label, markersize=3)
    cosine_ax.axhline(1.0, color="black", lw=1, ls="--", label="full batch (the truth)")
    drift_ax.set(xlabel="optimizer update", ylabel="||θ - θ_full|| / ||θ_full - θ_0||",
                 title="Parameter drift from the full-batch run")
    cosine_ax.set(xlabel="optimizer update", ylabel="cosine(accumulated grad, full-batch grad)",
                  title="Gradient direction at the full-batch weights")
    diff_ax.set(xlabel="optimizer update", ylabel="max |accumulated grad - full-batch grad|",
                title="Largest gradient error at the full-batch weights")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
