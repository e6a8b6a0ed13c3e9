"""Lesson 16 lab: the core of token weighting, by hand, on four unevenly masked micro-batches.

    python labs/lesson16_mean_of_means.py

The four micro-batches of ``course/runs/session.py`` (2 samples each, labels cut to -100 per
sample) hold 29, 10, 2 and 1 valid shifted targets. At the tiny model's initial weights the lab
prints each micro-batch's NLL sum S_k and mean S_k / n_k, what N counts with and without the
shift, the global loss S / N next to lesson 14's mean of means, and then accumulates gradients two
ways, backward(S_k / N) and backward(mean_k / K), each compared with ONE backward of the whole
global batch. No TrainingSession is involved: this is the arithmetic the session must reproduce.
"""
from __future__ import annotations

import argparse

import torch

from course.protocol.text import token_nll_sum
from course.minimind import IGNORE_INDEX
from course.runs import SESSION_SCENARIO, global_batch_gradients, masked_micro_batches, tiny_model
from course.runs.threads import cpu_threads


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.flatten() for _, g in sorted(grads.items())]).double()


def accumulate(batches, weight_of) -> dict:
    """K backward passes into one fresh model; micro-batch k backpropagates weight_of(S_k, n_k)."""
    model = tiny_model(SESSION_SCENARIO)
    for batch in batches:
        weight_of(token_nll_sum(model(batch.input_ids).logits, batch.labels), batch.loss_units).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> dict:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    batches = masked_micro_batches()
    k = len(batches)
    units = [b.loss_units for b in batches]
    n_total = sum(units)
    unshifted = sum(int((b.labels != IGNORE_INDEX).sum()) for b in batches)
    model = tiny_model(SESSION_SCENARIO)
    with torch.no_grad():
        sums = [float(token_nll_sum(model(b.input_ids).logits, b.labels)) for b in batches]
    print(f"K = {k} micro-batches of {batches[0].labels.shape[0]} samples, sequence length {batches[0].labels.shape[1]}")
    for i, (s, n) in enumerate(zip(sums, units), start=1):
        print(f"micro-batch {i}: n_k = {n:2d} valid targets, S_k = {s:8.4f}, mean S_k / n_k = {s / n:.4f}")
    print(f"N = sum n_k = {n_total} (labels != -100 without the shift would count {unshifted})")
    global_loss = sum(sums) / n_total
    mean_of_means = sum(s / n for s, n in zip(sums, units)) / k
    token_weighted = sum((n / n_total) * (s / n) for s, n in zip(sums, units))
    print(f"global loss S / N = {global_loss:.4f}; token-weighted accumulation = {token_weighted:.4f}; "
          f"lesson 14 mean of means = {mean_of_means:.4f}")
    print(f"weight of one token of micro-batch 1 / micro-batch 4: token-weighted 1/N = 1/{n_total} for both; "
          f"naive 1/(K n_k) = 1/{k * units[0]} vs 1/{k * units[-1]}")

    expected = flat(global_batch_gradients(batches)[0])
    results = {"token-weighted": accumulate(batches, lambda s, n: s / n_total),
               "mean of means": accumulate(batches, lambda s, n: s / n / k)}
    print("accumulated gradient vs one backward of the global batch:")
    for name, grads in results.items():
        got = flat(grads)
        cosine = float(torch.nn.functional.cosine_similarity(got, expected, dim=0))
        print(f"{name:>14}: max |grad diff| = {float((got - expected).abs().max()):.3e}, cosine = {cosine:.6f}")
    return {"sums": sums, "units": units, "global_loss": global_loss, "mean_of_means": mean_of_means}


if __name__ == "__main__":
    main()
