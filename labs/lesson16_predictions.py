"""The answers to lesson 16 §4.0's predictions, measured with the reference TrainingSession and run driver.

    python labs/lesson16_predictions.py

Each block runs the course's reference code (course/reference/train_session.py, course/protocol/driver.py) on
the CPU and prints what the prediction asked for:
  1. K = 2 micro-batches with 30 and 2 valid targets: N, the weight one target gets under loss / K and under
     token weighting (measured as d(backpropagated loss) / d(token NLL) through the session), and whether
     each accumulated gradient equals one backward of the global batch on the tiny model;
  2. the run driver on 20 samples (every label valid), global batch 8, K = 4: updates, micro-steps,
     normalization_units, optimizer steps;
  3. migrate_train_state on a legacy state (micro-batch 6, accum_steps 4, 100 samples) at steps 10, 16, 17;
  4. an enabled GradScaler, K = 2, three updates with an inf gradient in update 2: the reports, the scale,
     optimizer_step and after_update.
"""
from __future__ import annotations

import torch

from course.protocol.driver import run_text_training
from course.protocol.text import naive_mean_step, token_weighted_step
from course.protocol.types import TrainingRunState, TrainingStepOptions, TrainingStepOutput
from course.reference import train_session as reference
from course.runs import (SESSION_SCENARIO, capture_grads, global_batch_gradients, masked_micro_batches, new_session,
                         params_of, run_update, tiny_batches)
from course.runs.threads import cpu_threads

# two micro-batches of 2 samples: labels[i, cut:] = -100, so 15 + 15 = 30 and 2 + 0 = 2 valid shifted targets
PREDICTION_CUTS = ((16, 16), (3, 0))
LEGACY_STATE = {"epoch": 0, "batch_size": 6, "accum_steps": 4, "sample_count": 100}


class TokenProbe(torch.nn.Module):
    """One parameter per valid target of the update: its value plays the target's NLL, so after the update's
    backward its ``.grad`` is the weight the session gave that target."""

    def __init__(self, counts):
        super().__init__()
        self.counts = list(counts)
        self.nll = torch.nn.Parameter(torch.ones(sum(counts)))

    def step_fn(self, gradient_units_of):
        def step(model, k):
            start = sum(model.counts[:k])
            nll_sum = model.nll[start:start + model.counts[k]].sum()
            n_k = model.counts[k]
            return TrainingStepOutput(nll_sum / n_k, gradient_units_of(n_k), nll_sum.detach(), n_k)
        return step


def token_weights(counts, gradient_units_of, normalization_units) -> list[float]:
    """The weight of one target of each micro-batch, as the reference session backpropagates it."""
    probe = TokenProbe(counts)
    session = reference.TrainingSession(probe, torch.optim.SGD(probe.parameters(), lr=0.0), accumulation_steps=2)
    captured = {}
    hook = lambda: captured.update(grad=probe.nll.grad.clone()) or False   # noqa: E731
    for k in range(len(counts)):
        session.train_step(k, TrainingStepOptions(normalization_units=normalization_units, before_update=hook),
                           probe.step_fn(gradient_units_of))
    starts = [sum(counts[:k]) for k in range(len(counts))]
    return [float(captured["grad"][s]) for s in starts]


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.flatten() for _, g in sorted(grads.items())]).double()


def session_gradient(batches, step_fn, normalization_units) -> dict:
    session = new_session(reference, len(batches))
    captured: dict = {}
    run_update(session, batches, units=normalization_units, step_fn=step_fn,
               before_update=capture_grads(session, captured))
    return captured


def prediction_1() -> None:
    batches = masked_micro_batches(PREDICTION_CUTS)
    counts = [reference.count_loss_units(b.labels) for b in batches]
    k, n = len(batches), sum(counts)
    print(f"1. K = {k} micro-batches holding {counts[0]} and {counts[1]} valid targets:")
    print(f"   N = {n}")
    naive = token_weights(counts, lambda n_k: 1, k)
    weighted = token_weights(counts, lambda n_k: n_k, n)
    for name, (w1, w2) in (("loss / K", naive), ("token-weighted", weighted)):
        print(f"   {name:>14}: weight of one target = 1/{1 / w1:g} (micro-batch 1), 1/{1 / w2:g} (micro-batch 2); "
              f"ratio {w2 / w1:g}")
    expected = flat(global_batch_gradients(batches)[0])
    for name, step_fn, units in (("loss / K", naive_mean_step, k), ("token-weighted", token_weighted_step, n)):
        got = flat(session_gradient(batches, step_fn, units))
        cosine = float(torch.nn.functional.cosine_similarity(got, expected, dim=0))
        close = bool(torch.allclose(got, expected, rtol=1e-5, atol=1e-6))
        print(f"   {name:>14}: equals one global-batch backward (atol 1e-6) {close}, cosine {cosine:.4f}")


def prediction_2() -> None:
    input_ids = tiny_batches(20, SESSION_SCENARIO.max_length, 1, 3)[0][0]
    dataset = [(ids, ids.clone()) for ids in input_ids]          # every label valid: 15 shifted targets each
    session = new_session(reference, 4)
    records = run_text_training(session, dataset, TrainingRunState(), global_batch_size=8, accumulation_steps=4,
                                epochs=1, impl=reference)
    print("2. run driver, 20 samples of 16 tokens (every label valid), global batch 8, K = 4, 1 epoch:")
    print(f"   updates {len(records)}: samples {[r['samples'] for r in records]}, micro-steps "
          f"{[r['microsteps'] for r in records]}, normalization_units {[r['normalization_units'] for r in records]}")
    print(f"   optimizer_step after the epoch {session.optimizer_step}")


def prediction_3() -> None:
    print("3. migrate_train_state, legacy micro-batch 6, accum_steps 4, sample_count 100, epoch 0:")
    fields = ("global_batch_size", "epoch", "update_step_in_epoch", "sample_position", "dropped_microsteps")
    for step in (10, 16, 17):
        migrated = reference.migrate_train_state(dict(LEGACY_STATE, step=step))
        print(f"   step {step}: " + ", ".join(f"{f} {migrated[f]}" for f in fields))


def prediction_4() -> None:
    batches = masked_micro_batches()[:2]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    session = new_session(reference, 2, scaler=scaler)
    calls: list = []
    print("4. enabled GradScaler('cpu', init_scale 1024), K = 2, inf gradient in update 2:")
    for update in (1, 2, 3):
        before = params_of(session.model)
        hook = session.model.model.norm.weight.register_hook(lambda g: g + float("inf")) if update == 2 else None
        report = run_update(session, batches, after_update=lambda u=update: calls.append(u))[-1]
        if hook is not None:
            hook.remove()
        unchanged = all(torch.equal(p, before[n]) for n, p in params_of(session.model).items())
        print(f"   update {update}: parameters_updated={report.parameters_updated} "
              f"overflow_skipped={report.overflow_skipped} optimizer_step={report.optimizer_step} "
              f"scale={scaler.get_scale()} weights unchanged {unchanged}")
    print(f"   after_update ran after updates {calls}")


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main() -> None:
    prediction_1()
    prediction_2()
    prediction_3()
    prediction_4()


if __name__ == "__main__":
    main()
