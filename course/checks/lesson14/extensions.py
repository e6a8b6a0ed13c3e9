"""Lesson 14 §10, "fix upstream": the optional extensions' checks. ``python -m course check 14 --all``
grades them; they never change the exit code and score no notebook points. Their checks are all visible."""
from __future__ import annotations

import torch

from course.minimind import get_lr
from course.runs import LoopScenario, full_epoch_batches, tiny_model
from course.runs.eager import eager

from ..framework import check, expect_close, expect_equal, expect_raises, expect_tensors_close, fail
from .checks import LR_RTOL
from .loop_hints import hint


def valid_call(what: str, fn):
    """``fn()`` on valid arguments (a boundary such as iters = 1 included): a ValueError is a failure."""
    try:
        return fn()
    except ValueError as exc:
        fail(f"{what} (valid arguments)", f"ValueError: {exc}", "a result, no error")

# --- accumulation_divisor (§10.1) ----------------------------------------------------------------

# One epoch of 6 micro-batches with K=4: a full window (micro-steps 1-4) and a tail of r=2 (5-6).
TAIL_SCENARIO = LoopScenario("dense, 1 epoch of 6 micro-batches, K=4 (tail of 2)", epochs=1, max_length=16)
GRAD_RTOL = 1e-4    # summing g_i / d in another order moves a gradient by a few ulps; r/K moves it by 50%


@check("accumulation_divisor")
def accumulation_divisor_is_k_then_r(impl):
    """K inside full windows, r = iters % K in the last r micro-steps (windows count from micro-step 1)."""
    cases = [((6, 4), [4, 4, 4, 4, 2, 2]), ((8, 4), [4] * 8), ((3, 8), [3, 3, 3]), ((5, 1), [1] * 5),
             ((7, 3), [3, 3, 3, 3, 3, 3, 1]), ((1, 4), [1])]
    for (iters, k), expected in cases:
        what = f"[accumulation_divisor(step, iters={iters}, K={k}) for step in 1..{iters}]"
        expect_equal(what, valid_call(what, lambda: [impl.accumulation_divisor(step, iters, k)
                                                     for step in range(1, iters + 1)]), expected)


def window_gradients(model, batches, divisor) -> list[dict]:
    """Accumulate ``loss / divisor(step)`` over ``batches``; the gradients at each window's close (every
    K-th micro-step and the last one), cleared after each. No optimizer: the weights never move."""
    k, iters, closed = TAIL_SCENARIO.accumulation_steps, len(batches), []
    for step, (input_ids, labels) in enumerate(batches, start=1):
        out = model(input_ids, labels=labels)
        ((out.loss + out.aux_loss) / divisor(step)).backward()
        if step % k == 0 or step == iters:
            closed.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            model.zero_grad(set_to_none=True)
    return closed


@check("accumulation_divisor")
def accumulation_divisor_gives_the_tail_its_mean_gradient(impl):
    """A loop dividing each micro-batch by accumulation_divisor: the full window's gradient is the mean of its 4
    micro-batch gradients, and the tail update's the mean of its r=2 (upstream: r/K = 0.5 of it)."""
    batches = full_epoch_batches(TAIL_SCENARIO, 0)
    iters, k = len(batches), TAIL_SCENARIO.accumulation_steps
    model = tiny_model(TAIL_SCENARIO)
    actual = window_gradients(model, batches, lambda step: impl.accumulation_divisor(step, iters, k))
    per_batch = []
    for input_ids, labels in batches:
        out = model(input_ids, labels=labels)
        (out.loss + out.aux_loss).backward()
        per_batch.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    windows = [per_batch[:k], per_batch[k:]]
    expect_equal("updates closed in an epoch of 6 micro-batches, K=4", len(actual), len(windows))
    for index, (got, members) in enumerate(zip(actual, windows)):
        want = {n: torch.stack([g[n] for g in members]).mean(0) for n in members[0]}
        scale = max(float(w.abs().max()) for w in want.values())
        name = "model.norm.weight"
        ratio = float(got[name].norm() / want[name].norm())
        with hint(f"the update's gradient is {ratio:.3f} x the mean of its {len(members)} micro-batch gradients"
                  + (f" (r/K = {len(members)}/{k}: the tail is still divided by K)"
                     if abs(ratio - len(members) / k) < 0.01 else "")):
            expect_tensors_close(f"update {index + 1} ({len(members)} micro-batches): accumulated gradient vs "
                                 "the mean of its micro-batch gradients", got, want, rtol=GRAD_RTOL,
                                 atol=GRAD_RTOL * scale)


@check("accumulation_divisor")
def accumulation_divisor_rejects_bad_arguments(impl):
    """accumulation_steps or iters <= 0, step outside [1, iters]: ValueError naming the argument."""
    for args, argument in [((1, 6, 0), "accumulation_steps"), ((1, 6, -4), "accumulation_steps"),
                           ((1, 0, 4), "iters"), ((0, 6, 4), "step"), ((7, 6, 4), "step")]:
        expect_raises(f"accumulation_divisor{args}", lambda: impl.accumulation_divisor(*args), ValueError, argument,
                      ("step", "iters", "accumulation_steps"))

# --- lr_per_update and update_cadence_due (§10.2) ------------------------------------------------


# (iters, K, epochs): tails of 2 and 2, none, an epoch shorter than K, K=1 (one update per micro-step),
# iters=1 (the smallest valid epoch).
UPDATE_RUNS = [(6, 4, 2), (10, 4, 2), (8, 4, 1), (3, 8, 2), (5, 1, 1), (1, 2, 1)]


@check("lr_per_update")
def lr_per_update_follows_the_update_count(impl):
    """Every micro-step of update n (1-based, n = epoch * ceil(iters/K) + ceil(step/K)) gets get_lr(n, N),
    N = epochs * ceil(iters/K): constant within a window, 0.1 * base_lr on the last update."""
    base_lr = 5e-4
    for iters, k, epochs in UPDATE_RUNS:
        per_epoch = -(-iters // k)
        for epoch in range(epochs):
            for step in range(1, iters + 1):
                update = epoch * per_epoch + -(-step // k)
                what = (f"lr_per_update(epoch={epoch}, step={step}, iters={iters}, epochs={epochs}, K={k}) "
                        f"(update {update} of {epochs * per_epoch})")
                expect_close(what, valid_call(what, lambda: impl.lr_per_update(epoch, step, iters, epochs, k, base_lr)),
                             get_lr(update, epochs * per_epoch, base_lr), rtol=LR_RTOL)


@check("lr_per_update")
def lr_per_update_rejects_bad_arguments(impl):
    """K, iters or epochs <= 0, epoch outside [0, epochs), step outside [1, iters]: ValueError naming it."""
    good = dict(epoch=0, step=1, iters=6, epochs=2, accumulation_steps=4, base_lr=5e-4)
    bad = [(dict(accumulation_steps=0), "accumulation_steps"), (dict(iters=0), "iters"), (dict(epochs=0), "epochs"),
           (dict(epoch=2), "epoch"), (dict(epoch=-1), "epoch"), (dict(step=0), "step"), (dict(step=7), "step")]
    for changes, argument in bad:
        expect_raises(f"lr_per_update(..., {', '.join(f'{k}={v}' for k, v in changes.items())})",
                      lambda: impl.lr_per_update(**{**good, **changes}), ValueError, argument, tuple(good))


@check("update_cadence_due")
def update_cadence_counts_updates(impl):
    """Due where micro-step step closes update n = step / K with n % interval == 0, and at step == iters."""
    cases = [((10, 2, 2), [4, 8, 10]), ((10, 4, 1), [4, 8, 10]), ((12, 4, 2), [8, 12]), ((7, 1, 3), [3, 6, 7]),
             ((3, 8, 5), [3]), ((16, 4, 3), [12, 16]), ((1, 4, 2), [1])]
    for (iters, k, interval), expected in cases:
        what = f"micro-steps 1..{iters} where update_cadence_due(step, iters={iters}, K={k}, interval={interval})"
        expect_equal(what, valid_call(what, lambda: [s for s in range(1, iters + 1)
                                                     if impl.update_cadence_due(s, iters, k, interval)]), expected)


@check("update_cadence_due")
def update_cadence_rejects_bad_arguments(impl):
    """K, iters or interval <= 0, step outside [1, iters]: ValueError naming the argument."""
    for args, argument in [((1, 10, 0, 2), "accumulation_steps"), ((1, 0, 2, 2), "iters"),
                           ((1, 10, 2, 0), "interval"), ((1, 10, 2, -1), "interval"), ((0, 10, 2, 2), "step"),
                           ((11, 10, 2, 2), "step")]:
        expect_raises(f"update_cadence_due{args}", lambda: impl.update_cadence_due(*args), ValueError, argument,
                      ("step", "iters", "accumulation_steps", "interval"))

# --- adamw_param_groups (§10.3) --------------------------------------------------------------------


def _group_names(model, groups) -> list[list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names.get(id(p), f"<not a parameter of the model: {tuple(p.shape)}>") for p in g["params"]]
            for g in groups]


@check("adamw_param_groups")
def adamw_param_groups_exempt_norms_and_embeddings(impl):
    """Two groups (weight_decay wd, then 0.0): matrices decay; 1-D parameters and the (tied) embedding do
    not; every trainable parameter appears exactly once and a frozen one not at all; AdamW accepts them."""
    for use_moe in (False, True):
        model = tiny_model(LoopScenario("param groups", use_moe=use_moe))
        frozen = model.model.layers[0].self_attn.q_proj.weight
        frozen.requires_grad_(False)
        groups = impl.adamw_param_groups(model, 0.1)
        where = f"adamw_param_groups(tiny {'MoE' if use_moe else 'dense'} model, 0.1)"
        if not (isinstance(groups, list) and all(isinstance(g, dict) and "params" in g for g in groups)):
            fail(f"{where}: type", type(groups).__name__, "a list of dicts with 'params' and 'weight_decay'")
        expect_equal(f"{where}: weight_decay of each group", [g.get("weight_decay") for g in groups], [0.1, 0.0])
        actual = _group_names(model, groups)
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        expected = [[n for n, p in trainable if p.ndim >= 2 and id(p) not in embeddings],
                    [n for n, p in trainable if p.ndim < 2 or id(p) in embeddings]]
        expect_equal(f"{where}: parameter names of (decay, no decay); lm_head.weight is model.embed_tokens.weight",
                     actual, expected)
        eager(torch.optim.AdamW)(groups, lr=5e-4)   # raises if a parameter is in two groups


@check("adamw_param_groups")
def adamw_param_groups_reject_bad_weight_decay(impl):
    """A negative or NaN weight_decay raises ValueError naming weight_decay; 0 and values >= 1 are valid."""
    model = tiny_model(LoopScenario("param groups"))
    for value in (-0.1, float("nan")):
        expect_raises(f"adamw_param_groups(model, {value})", lambda: impl.adamw_param_groups(model, value),
                      ValueError, "weight_decay", ("model", "weight_decay"))
    for value in (0.0, 1.0, 2.5):
        try:
            groups = impl.adamw_param_groups(model, value)
        except ValueError as exc:
            fail(f"adamw_param_groups(model, {value}) (a valid weight decay)", f"ValueError: {exc}",
                 "two groups; only a negative or NaN weight_decay is an error")
        expect_equal(f"adamw_param_groups(model, {value}): weight_decay of each group",
                     [g.get("weight_decay") for g in groups], [value, 0.0])

# --- warmup_cosine_lr (§10.4) ----------------------------------------------------------------------


def _warmup_cosine(step: int, total: int, base_lr: float, warmup: int) -> float:
    return base_lr * step / warmup if step < warmup else get_lr(step - warmup, total - warmup, base_lr)


@check("warmup_cosine_lr")
def warmup_cosine_lr_ramps_then_follows_get_lr(impl):
    """base_lr * s / W below W, then get_lr(s - W, T - W): 0 at s = 0, base_lr at W, 0.1 * base_lr at T;
    W = 0 is get_lr itself."""
    for total, warmup, base_lr in [(20, 5, 5e-4), (100, 10, 1.0), (7, 1, 1e-3), (12, 0, 2.0), (3, 2, 1.0), (1, 0, 1.0)]:
        for step in range(total + 1):
            what = f"warmup_cosine_lr({step}, total_steps={total}, base_lr={base_lr}, warmup_steps={warmup})"
            expect_close(what, valid_call(what, lambda: impl.warmup_cosine_lr(step, total, base_lr, warmup)),
                         _warmup_cosine(step, total, base_lr, warmup), rtol=LR_RTOL, atol=1e-15)
    for step, expected in [(0, 0.0), (10, 1.0), (100, 0.1)]:
        expect_close(f"warmup_cosine_lr({step}, 100, 1.0, 10) (endpoint)", impl.warmup_cosine_lr(step, 100, 1.0, 10),
                     expected, rtol=LR_RTOL, atol=1e-15)


@check("warmup_cosine_lr")
def warmup_schedule_rejects_bad_arguments(impl):
    """total_steps <= 0, warmup_steps outside [0, total_steps), current_step outside [0, total_steps]:
    ValueError naming the argument."""
    for args, argument in [((0, 0, 1e-3, 0), "total_steps"), ((0, 10, 1e-3, -1), "warmup_steps"),
                           ((0, 10, 1e-3, 10), "warmup_steps"), ((-1, 10, 1e-3, 2), "current_step"),
                           ((11, 10, 1e-3, 2), "current_step")]:
        expect_raises(f"warmup_cosine_lr{args}", lambda: impl.warmup_cosine_lr(*args), ValueError, argument,
                      ("current_step", "total_steps", "base_lr", "warmup_steps"))
