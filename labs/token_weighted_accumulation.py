"""Lesson 16 lab: naive ``loss / K`` vs token-weighted accumulation vs the true full batch.

    python labs/token_weighted_accumulation.py

Padded tiny-corpus samples (short lines end in -100 labels), grouped by length inside each global
batch as a length-bucketing loader would do, so the K micro-batches of an update hold very
different numbers of valid targets. Three copies of the tiny MiniMind start from the same weights
and train on the same global batches with AdamW:

* full           - one backward of the whole global batch, loss = NLL sum / its valid tokens (the truth);
* token_weighted - ``TrainingSession`` with K micro-steps and ``normalization_units``;
* naive          - the same session fed lesson 14's objective (each micro-batch mean / K).

At every update the two accumulated gradients are also probed at the FULL model's current weights:
loss gap, gradient cosine and max |grad diff| against the true gradient. After each update the lab
records how far each trained copy has drifted from the full-batch copy. Prints the numbers, saves a PNG.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from course.checks.lesson16 import grads_of, run_update  # noqa: E402
from course.minimind import TINY_CORPUS, MiniMindConfig, MiniMindForCausalLM, PretrainDataset, setup_seed  # noqa: E402
from course.reference.core.train_session import TrainingSession, count_loss_units, split_global_batch  # noqa: E402
from course.session.driver import epoch_order  # noqa: E402
from course.session.text import collate, naive_mean_step, token_weighted_step  # noqa: E402

VARIANTS = ("full", "token_weighted", "naive")


def flat(tensors: dict) -> torch.Tensor:
    return torch.cat([t.flatten() for _, t in sorted(tensors.items())]).double()


def global_batches(dataset, args) -> list[list]:
    """Each update's micro-batches; samples sorted by valid length inside the global batch."""
    order = epoch_order(len(dataset), args.seed, 0)
    updates = []
    for u in range(args.updates):
        indices = [order[(u * args.global_batch + i) % len(order)] for i in range(args.global_batch)]
        samples = sorted((dataset[i] for i in indices), key=lambda s: -count_loss_units(s[1]))
        updates.append([collate(m, count_loss_units) for m in split_global_batch(samples, args.global_batch,
                                                                                  args.accum_steps)])
    return updates


def step_setup(variant: str, batches) -> tuple[list, int, object]:
    """(micro-batches, normalization_units, step_fn) of one update for a variant."""
    units = sum(b.loss_units for b in batches)
    if variant == "full":
        whole = collate([(x, y) for b in batches for x, y in zip(b.input_ids, b.labels)], count_loss_units)
        return [whole], units, token_weighted_step
    if variant == "token_weighted":
        return batches, units, token_weighted_step
    return batches, len(batches), naive_mean_step


def probe(model, probe_model, variant: str, batches) -> tuple[torch.Tensor, float]:
    """Gradient and objective value of ``variant`` at ``model``'s weights (the update is aborted)."""
    probe_model.load_state_dict(model.state_dict())
    micro, units, step_fn = step_setup(variant, batches)
    session = TrainingSession(probe_model, torch.optim.SGD(probe_model.parameters(), lr=0.0),
                              grad_accum_steps=len(micro))
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


def run(args) -> dict:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    dataset = PretrainDataset(TINY_CORPUS, max_length=args.max_seq_len)
    updates = global_batches(dataset, args)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers)
    setup_seed(args.seed)
    models = {v: MiniMindForCausalLM(config) for v in VARIANTS[:1]}
    for v in VARIANTS[1:]:
        models[v] = MiniMindForCausalLM(config)
        models[v].load_state_dict(models["full"].state_dict())
    probe_model = MiniMindForCausalLM(config)
    start = flat(dict(models["full"].named_parameters())).detach()
    sessions = {v: TrainingSession(m, torch.optim.AdamW(m.parameters(), lr=args.lr),
                                   grad_accum_steps=1 if v == "full" else args.accum_steps)
                for v, m in models.items()}
    history = {"units": [[b.loss_units for b in updates[0]]], "loss_gap": [], "cosine": {}, "max_diff": {},
               "drift": {v: [] for v in VARIANTS[1:]}}
    for v in VARIANTS[1:]:
        history["cosine"][v], history["max_diff"][v] = [], []
    for batches in updates:
        true_grad, true_loss = probe(models["full"], probe_model, "full", batches)
        for v in VARIANTS[1:]:
            grad, loss = probe(models["full"], probe_model, v, batches)
            history["cosine"][v].append(float(torch.nn.functional.cosine_similarity(grad, true_grad, dim=0)))
            history["max_diff"][v].append(float((grad - true_grad).abs().max()))
            if v == "naive":
                history["loss_gap"].append(abs(loss - true_loss))
        for v, session in sessions.items():
            micro, units, step_fn = step_setup(v, batches)
            run_update(session, micro, units=units, step_fn=step_fn, clip=args.grad_clip)
        full = flat(dict(models["full"].named_parameters())).detach()
        moved = float((full - start).norm())
        for v in VARIANTS[1:]:
            history["drift"][v].append(float((flat(dict(models[v].named_parameters())).detach() - full).norm()) / moved)
    return history


def plot(history: dict, out: Path) -> None:
    steps = range(1, len(history["loss_gap"]) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for v, style in (("token_weighted", "-o"), ("naive", "-s")):
        left.semilogy(steps, [max(d, 1e-12) for d in history["drift"][v]], style, label=v, markersize=3)
        right.plot(steps, history["cosine"][v], style, label=v, markersize=3)
    left.set(xlabel="optimizer update", ylabel="||theta - theta_full|| / ||theta_full - theta_0||",
             title="Parameter drift from the full-batch run")
    right.set(xlabel="optimizer update", ylabel="cosine(accumulated grad, full-batch grad)",
              title="Gradient direction at the full-batch weights")
    for ax in (left, right):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle("Lesson 16: naive loss/K vs token-weighted accumulation (padded tiny corpus)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--accum-steps", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-hidden-layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=Path("out/lesson16/token_weighted_accumulation.png"))
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.updates < 1 or args.global_batch % args.accum_steps:
        raise SystemExit("--updates must be >= 1 and --global-batch divisible by --accum-steps")
    history = run(args)
    print(f"valid targets per micro-batch in update 1: {history['units'][0]}")
    print(f"update 1, same weights: naive loss gap = {history['loss_gap'][0]:.3e}")
    for v in VARIANTS[1:]:
        print(f"{v:>15}: update 1 cosine = {history['cosine'][v][0]:.4f}, max |grad diff| = "
              f"{history['max_diff'][v][0]:.3e}; mean cosine over {args.updates} updates = "
              f"{sum(history['cosine'][v]) / args.updates:.4f}; drift after {args.updates} updates = "
              f"{history['drift'][v][-1]:.3e}")
    plot(history, args.out)
    print(f"saved {args.out}")
    return history


if __name__ == "__main__":
    main()
