"""Lesson 14 §10: the four "fix upstream" extensions next to upstream's behaviour, one figure each.

    python labs/lesson14_fix_upstream.py                      # the reference's extensions
    python labs/lesson14_fix_upstream.py --impl student       # yours, from impl/train_loop.py
    python labs/lesson14_fix_upstream.py --impl-dir DIR       # a submission laid out like impl/

On the course's tiny model (CPU, fp32, the built-in corpus); the figures go to --out (default figures/):
  10.1 the tail update's gradient, measured as a multiple of its micro-batches' mean gradient:
       upstream divides the tail by K (r/K of the mean), accumulation_divisor by r (1.0);
  10.2 the lr per micro-step (upstream) against lr_per_update, and where a save counted in micro-steps
       (upstream) or in updates (update_cadence_due) lands: a save inside a window loses its gradients;
  10.3 the mean RMSNorm weight under AdamW weight decay on every parameter (upstream's one group) and with
       adamw_param_groups (no decay on norms and embeddings), the gradients set to 0 so only decay moves it;
  10.4 the training loss with MiniMind's cosine (no warmup) and with warmup_cosine_lr at a high lr.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib
import torch

from course.implementations import add_impl_arguments, load_implementation
from course.minimind import get_lr
from course.runs import LoopScenario, tiny_batches, tiny_model
from course.runs.threads import cpu_threads
from lesson14_trace_pretrain_step import positive_int  # labs/ is on sys.path when a lab runs

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the file-only backend

SCENARIO = LoopScenario("fix upstream lab", max_length=32)
K = 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_impl_arguments(parser, "train_loop.py extensions", default="reference")
    parser.add_argument("--out", default="figures", help="folder for the four PNG figures")
    parser.add_argument("--updates", type=positive_int, default=60, help="updates of the 10.3 and 10.4 runs")
    return parser.parse_args(argv)


def save(fig, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{name}.png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    print(f"figure: {out / f'{name}.png'}")


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def tail_scales(impl) -> dict[int, tuple[float, float]]:
    """For epochs of K + r micro-batches (r = 1 .. K-1): the tail update's gradient projected on the mean of
    its r micro-batch gradients, in units of that mean, dividing by K (upstream) and by accumulation_divisor."""
    model = tiny_model(SCENARIO)
    batches = tiny_batches(SCENARIO.batch_size, SCENARIO.max_length, 2 * K, seed=42)
    scales = {}
    for r in range(1, K):
        iters, tail = K + r, batches[K:K + r]
        singles = []
        for input_ids, labels in tail:
            model(input_ids, labels=labels).loss.backward()
            singles.append(flat_grad(model))
            model.zero_grad(set_to_none=True)
        mean = torch.stack(singles).mean(0)
        measured = []
        for divisor in (lambda step: K, lambda step: impl.accumulation_divisor(step, iters, K)):
            for step, (input_ids, labels) in enumerate(tail, start=K + 1):
                (model(input_ids, labels=labels).loss / divisor(step)).backward()
            measured.append(float(flat_grad(model) @ mean / (mean @ mean)))
            model.zero_grad(set_to_none=True)
        scales[r] = tuple(measured)
    return scales


def figure_tail(impl, out: Path) -> None:
    scales = tail_scales(impl)
    for r, (upstream, fixed) in scales.items():
        print(f"10.1 tail of r={r} (K={K}): update gradient = {upstream:.3f} x the tail's mean gradient upstream "
              f"(r/K = {r / K:.3f}), {fixed:.3f} x with accumulation_divisor")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    rs = list(scales)
    ax.bar([r - 0.2 for r in rs], [scales[r][0] for r in rs], 0.4, label="upstream: every micro-batch / K")
    ax.bar([r + 0.2 for r in rs], [scales[r][1] for r in rs], 0.4, label="accumulation_divisor: tail / r")
    ax.axhline(1.0, ls=":", color="grey")
    ax.set(xticks=rs, xlabel=f"tail length r (epoch of K + r micro-batches, K = {K})",
           ylabel="tail gradient / mean gradient", title="10.1 The tail update's effective gradient scale")
    ax.legend(fontsize=8, loc="lower right")
    save(fig, out, "14_fix_upstream_tail")


def figure_lr_and_cadence(impl, out: Path) -> None:
    epochs, iters, base_lr, interval = 2, 10, 5e-4, 3
    micro = range(1, epochs * iters + 1)
    upstream_lr = [get_lr(s, epochs * iters, base_lr) for s in micro]
    update_lr = [impl.lr_per_update((s - 1) // iters, (s - 1) % iters + 1, iters, epochs, K, base_lr) for s in micro]
    closes = [s for s in micro if ((s - 1) % iters + 1) % K == 0 or s % iters == 0]
    print(f"10.2 lr used by each update (2 epochs x {iters} micro-batches, K={K}; updates close at micro-steps "
          f"{closes}):")
    print("     upstream (lr of the closing micro-step): " + ", ".join(f"{upstream_lr[s - 1]:.3e}" for s in closes))
    print("     lr_per_update:                          " + ", ".join(f"{update_lr[s - 1]:.3e}" for s in closes))
    upstream_saves = [s for s in range(1, iters + 1) if s % interval == 0 or s == iters]
    update_saves = [s for s in range(1, iters + 1) if impl.update_cadence_due(s, iters, K, 1)]
    pending = {s: s % K for s in upstream_saves if s % K and s != iters}
    print(f"10.2 saves in an epoch of {iters}: upstream every {interval} micro-steps at {upstream_saves} "
          f"(micro-batches accumulated but not applied: {pending}); update_cadence_due(interval=1) at "
          f"{update_saves}")
    fig, (ax, cadence) = plt.subplots(2, 1, figsize=(8, 5.2), height_ratios=[3, 1], sharex=True)
    ax.plot(micro, upstream_lr, "o-", ms=3, label="upstream: get_lr per micro-step")
    ax.step(micro, update_lr, where="mid", color="tab:orange", label="lr_per_update: one lr per update")
    ax.scatter(closes, [upstream_lr[s - 1] for s in closes], marker="^", s=70, color="tab:green", zorder=3,
               label="optimizer step (upstream's lr there)")
    ax.set(ylabel="learning rate", title=f"10.2 Schedule and save cadence (2 epochs x {iters} micro-batches, K = {K})")
    ax.legend(fontsize=8)
    for epoch in range(epochs):
        offset = epoch * iters
        cadence.scatter([offset + s for s in upstream_saves], [1] * len(upstream_saves), marker="x", color="tab:red",
                        label=f"upstream save (every {interval} micro-steps)" if epoch == 0 else None)
        cadence.scatter([offset + s for s in update_saves], [0] * len(update_saves), marker="s", color="tab:green",
                        label="save counted in updates (interval 1)" if epoch == 0 else None)
    cadence.set(yticks=[0, 1], yticklabels=["updates", "micro-steps"], ylim=(-0.6, 1.6),
                xlabel="global micro-step")
    cadence.legend(fontsize=7, loc="center right")
    save(fig, out, "14_fix_upstream_lr_per_update")


def mean_norm_weight(model) -> float:
    norms = [m.weight for m in model.modules() if type(m).__name__ == "RMSNorm"]
    return float(torch.cat([w.detach().reshape(-1) for w in norms]).mean())


def decay_only_run(param_groups, model, updates: int, lr: float) -> list[float]:
    """AdamW steps with every gradient 0: only the decoupled weight decay moves the weights."""
    optimizer = torch.optim.AdamW(param_groups, lr=lr)
    trace = [mean_norm_weight(model)]
    for _ in range(updates):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        trace.append(mean_norm_weight(model))
    return trace


def figure_norm_decay(impl, out: Path, updates: int) -> None:
    lr, weight_decay = 5e-3, 0.1
    upstream_model, fixed_model = tiny_model(SCENARIO), tiny_model(SCENARIO)
    upstream = decay_only_run([{"params": list(upstream_model.parameters()), "weight_decay": weight_decay}],
                              upstream_model, updates, lr)
    fixed = decay_only_run(impl.adamw_param_groups(fixed_model, weight_decay), fixed_model, updates, lr)
    print(f"10.3 mean RMSNorm weight after {updates} AdamW updates (lr {lr}, weight_decay {weight_decay}, zero "
          f"gradients): one group {upstream[-1]:.4f} (x (1 - lr * wd)^{updates} = "
          f"{(1 - lr * weight_decay) ** updates:.4f}), adamw_param_groups {fixed[-1]:.4f}")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.plot(upstream, label="upstream: AdamW(model.parameters(), weight_decay=0.1)")
    ax.plot(fixed, label="adamw_param_groups: norms and embeddings exempt")
    ax.set(xlabel="update (all gradients 0: only weight decay acts)", ylabel="mean RMSNorm weight",
           title="10.3 Norm weights under weight decay")
    ax.legend(fontsize=8)
    save(fig, out, "14_fix_upstream_norm_decay")


def loss_run(lr_at, updates: int) -> list[float]:
    """The tiny model trained ``updates`` AdamW updates of one micro-batch each, lr_at(update) before each."""
    model = tiny_model(SCENARIO)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    losses = []
    for update, (input_ids, labels) in enumerate(
            tiny_batches(SCENARIO.batch_size, SCENARIO.max_length, updates, seed=42), start=1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(update)
        loss = model(input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def figure_warmup(impl, out: Path, updates: int) -> None:
    base_lr, warmup, last = 1e-1, max(1, updates // 6), max(1, updates // 6)
    plain = loss_run(lambda s: get_lr(s, updates, base_lr), updates)
    warmed = loss_run(lambda s: impl.warmup_cosine_lr(s, updates, base_lr, warmup), updates)
    for label, losses in (("no warmup (get_lr)", plain), (f"warmup of {warmup} (warmup_cosine_lr)", warmed)):
        print(f"10.4 {label}, {updates} updates at base_lr {base_lr}: loss at update 4 {losses[3]:.3f}, "
              f"mean of the last {last} {sum(losses[-last:]) / last:.3f}")
    fig, (ax, lr_ax) = plt.subplots(2, 1, figsize=(7, 5.2), height_ratios=[3, 1.4], sharex=True)
    steps = range(1, updates + 1)
    ax.plot(steps, plain, label="upstream: get_lr, no warmup")
    ax.plot(steps, warmed, label=f"warmup_cosine_lr, W = {warmup}")
    ax.set(ylabel="training loss", title=f"10.4 Warmup at a high lr ({base_lr}), tiny model, one micro-batch per update")
    ax.legend(fontsize=8)
    lr_ax.plot(steps, [get_lr(s, updates, base_lr) for s in steps])
    lr_ax.plot(steps, [impl.warmup_cosine_lr(s, updates, base_lr, warmup) for s in steps])
    lr_ax.set(xlabel="update", ylabel="lr")
    save(fig, out, "14_fix_upstream_warmup")


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> None:
    args = parse_args(argv)
    impl = load_implementation("train_loop.py", args.impl, args.impl_dir)
    out = Path(args.out)
    try:
        figure_tail(impl, out)
        figure_lr_and_cadence(impl, out)
        figure_norm_decay(impl, out, args.updates)
        figure_warmup(impl, out, args.updates)
    except NotImplementedError as exc:
        print(f"TODO: {exc}\nthe lab draws the lesson-14 §10 extensions of {impl.__file__}; write this one, "
              "or run --impl reference meanwhile.", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
