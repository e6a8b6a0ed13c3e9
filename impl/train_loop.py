"""Lesson 14 exercises: learning rate, gradient accumulation, mixed precision, clipping.

Read course/lessons/14_lr_grad_accum_amp.md (Chinese: course/lessons/zh/14_lr_grad_accum_amp.md),
replace each ``raise NotImplementedError`` with your code, then run ``python -m course check 14``.
"""
from __future__ import annotations

import math  # noqa: F401 - you will need it
from contextlib import nullcontext  # noqa: F401 - for autocast_ctx=None

import torch

from course.runs import LoopScenario, tiny_batches, tiny_model  # noqa: F401 - for your test (§5.6)


def cosine_lr(current_step: int, total_steps: int, base_lr: float) -> float:
    """TODO (lesson 14 §5.1): MiniMind's learning-rate schedule at micro-step ``current_step`` of ``total_steps``.

    Aligns with ``course/minimind/trainer_utils.py::get_lr`` (upstream ``trainer/trainer_utils.py``); the
    schedule and its derivation are in lesson 14 §1.2. Contract:
    - Returns a Python ``float`` (not a tensor), equal to get_lr to a relative 1e-12 for every valid input.
      Write it yourself: importing or calling get_lr is not the exercise.
    - Shape: half a cosine wave over [0, T], no warmup, no decay to 0. It starts at ``base_lr`` (s = 0),
      passes 0.55 x base_lr at s = T / 2, ends at 0.1 x base_lr (s = T), and never rises: s < s' gives
      lr(s) >= lr(s'). Proportional to ``base_lr``.
    - Examples: (0, 100, 1.0) -> 1.0; (50, 100, 1.0) -> 0.55; (100, 100, 1.0) -> 0.1;
      (1, 20, 5e-4) -> 0.00049723 (to 8 digits); (10, 20, 5e-4) -> 0.000275.
    Argument rules (lesson 14 §5.7), checked before any arithmetic and in this order: ``ValueError``
    naming ``total_steps`` when ``total_steps <= 0``; naming ``current_step`` when it is outside
    ``[0, total_steps]`` (both ends valid). E.g. (0, 0, 1e-3) and (11, 10, 1e-3) raise.
    """
    raise NotImplementedError("cosine_lr: TODO - see lesson 14 §5.1 (aligns with get_lr)")


def scale_loss_for_accumulation(loss: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
    """TODO (lesson 14 §5.2): the loss each micro-step backpropagates, so that K of them average (§1.3).

    Aligns with the loss division in ``course/minimind/train_pretrain.py::train_epoch``.
    Contract: returns a tensor worth the loss divided by K = ``accumulation_steps`` that stays in the
    autograd graph: backpropagating the result gives ``loss`` a gradient of exactly 1 / K. Nothing that
    leaves the graph (a value read on the host, a detached copy, a new tensor built from the value).
    Examples: (tensor(8.), 4) -> tensor(2.); (tensor(3.), 1) -> tensor(3.); (tensor(2.5), 8) -> 0.3125
    with d(result)/d(loss) = 0.125.
    Argument rules (lesson 14 §5.7): ``ValueError`` naming ``accumulation_steps`` when it is <= 0.
    """
    raise NotImplementedError("scale_loss_for_accumulation: TODO - see lesson 14 §5.2")


def should_step_optimizer(step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.3): whether the 1-based micro-step ``step`` closes an accumulation window.

    Aligns with the condition that guards the optimizer block of ``train_epoch``. Windows hold K =
    ``accumulation_steps`` consecutive micro-steps and count from micro-step 1 (the first window is
    1..K); a window closes on its last micro-step. Returns a bool.
    Examples: K = 4 over micro-steps 1..8 -> True at 4 and 8 only; K = 3 over 1..10 -> True at 3, 6, 9;
    K = 1 -> True at every micro-step; (3, 4) -> False; (4, 4) -> True.
    Argument rules (lesson 14 §5.7), in this order: ``ValueError`` naming ``accumulation_steps`` when it is
    <= 0, then naming ``step`` when ``step <= 0`` (micro-steps are 1-based: a 0-based counter is a bug,
    not an input). E.g. (0, 0) names accumulation_steps.
    """
    raise NotImplementedError("should_step_optimizer: TODO - see lesson 14 §5.3")


def should_flush_tail(last_step: int, start_step: int, accumulation_steps: int) -> bool:
    """TODO (lesson 14 §5.4): whether the epoch left gradients accumulated that no update applied yet.

    Aligns with the condition of the tail flush after the loop of ``train_epoch``. ``last_step`` is the
    last micro-step this call ran (``start_step`` when it ran none), ``start_step`` the micro-steps done
    before a resume, K = ``accumulation_steps``. Rules: flush only if this call ran at least one
    micro-step AND the last one did not close a window; windows count from micro-step 1 of the epoch,
    as in ``should_step_optimizer``, never from ``start_step``. Returns a bool.
    Examples (last_step, start_step, K) -> result: (10, 0, 4) True (2 micro-steps left over);
    (8, 0, 4) False; (0, 0, 4) False; (5, 0, 1) False; (10, 8, 4) True; (8, 8, 4) False;
    (12, 9, 4) False (the window 9..12 closed at 12); (13, 12, 4) True; (6, 6, 4) False.
    Argument rules (lesson 14 §5.7), checked in this order: ``ValueError`` naming ``accumulation_steps``
    when it is <= 0, naming ``start_step`` when ``start_step < 0``, naming ``last_step`` when
    ``last_step < start_step``.
    """
    raise NotImplementedError("should_flush_tail: TODO - see lesson 14 §5.4")


def train_one_epoch(model, loader, optimizer, *, device, epoch, epochs, iters, base_lr,
                    accumulation_steps, grad_clip, scaler=None, autocast_ctx=None,
                    start_step=0) -> list[dict]:
    """TODO (lesson 14 §5.5): one epoch of MiniMind's pretrain loop, without logging/saving/DDP.

    Aligns with ``course/minimind/train_pretrain.py::train_epoch``; use your four functions above.
    Graded against that oracle: the records, the final parameters, the AdamW state and the GradScaler's
    scale; on CPU fp32 the reference matches the oracle bit for bit, so any order of operations other than
    the oracle's shows up (tolerances in §6.3). Lesson 14 §1 explains why each order is the only right one.

    Inputs: ``loader`` is any iterable of ``(input_ids, labels)`` pairs (a list or a one-shot generator in
    the checks; never call ``len(loader)``). ``epoch`` is 0-based of ``epochs``; ``iters`` the micro-batches of a FULL epoch (also
    on a resume, when the loader yields only the rest); ``start_step`` the micro-steps of this epoch done
    before a resume. ``scaler=None`` means a disabled ``torch.amp.GradScaler`` for
    ``torch.device(device).type``; ``autocast_ctx=None`` means no autocast (``nullcontext()``).

    Rules (each one graded):
    - Micro-steps are 1-based and continue after a resume: this call's first batch is micro-step
      ``start_step + 1``. The lr follows ``cosine_lr`` with the ``base_lr`` passed (the checks vary it) over the
      GLOBAL micro-step of the whole run (all epochs), so it restarts neither at an epoch nor at a resume.
    - Every micro-step runs at its own lr, in EVERY param group, including the micro-steps that close no
      window: the optimizer holds that lr from before the micro-step's forward pass (a model may have several
      groups; the checks read the groups' lr at every forward and at every optimizer step).
    - The training loss is the LM loss plus the MoE aux loss, always both; what is backpropagated is that
      loss made 1/K by ``scale_loss_for_accumulation``, through the scaler. Gradients add up over a window.
    - Each window's accumulated gradient is applied exactly once, by one optimizer step through the
      scaler, at the micro-step that closes it (``should_step_optimizer``). Invariants of that update:
      the norm measured and clipped is the TRUE gradient's, never the scaled one's, over every parameter
      (all param groups); the clip threshold is the ``grad_clip`` passed, whatever its value (the checks use
      0.05, 1.0 and 1e3); the optimizer steps on the clipped gradients; the scale stays constant within a
      window and adapts once per update; afterwards every ``.grad`` is None (not zeros), so the next window
      starts empty. Lesson 14 §1.5 shows why these rules leave one order only.
    - The tail flush: after the last batch, when ``should_flush_tail`` says so, the partial window gets
      that same update once. It follows the last micro-step this call actually ran: the loader may yield
      fewer than ``iters - start_step`` batches, and then ``iters`` says nothing about the tail.
    - An epoch that runs no micro-step (e.g. a resume at ``start_step == iters``) returns ``[]`` and
      changes nothing. An update whose gradients hold inf/NaN is skipped by an enabled scaler: the weights
      and AdamW's state do not move (lesson 14 §3 prediction 4 and §6.5 say what the scale does).
    - No device-to-host sync per micro-step (``.item()``, ``float()``, ``.tolist()``, ...) and no host copy
      (``.cpu()``, ``.numpy()``): an epoch of 5 micro-steps may convert or copy tensors to the host no more
      often than one of 2 with the same single update.
    - The loop emits no warnings (the checks record them): a warning there means a misconfigured part, e.g. a
      GradScaler built for another device type than ``device``'s.

    Returns one dict per micro-step run, in order: ``step`` (1-based); ``lr`` (the lr the optimizer held at
    that micro-step); ``loss`` (the unscaled training loss, aux included, not divided by K); ``aux_loss``;
    ``update_closed`` (this micro-step closed a window: the optimizer was asked to step, tail flush and
    skipped updates included); ``overflow_skipped`` (True iff an enabled scaler skipped ``optimizer.step``
    there; a scale that GREW after ``growth_interval`` clean updates is no skip; always False with
    ``scaler=None``); ``grad_norm`` (the global norm before clipping where ``update_closed``, inf or nan where
    the scaler skipped the update, else None); ``tail_flush`` (True only on the record whose partial window the
    tail flush closed, never on a window closed on its K-th micro-step, even at ``iters``). Values are Python
    values, never tensors: ``step`` an int, ``lr``, ``loss``, ``aux_loss`` floats, ``grad_norm`` a float or
    None, the flags bools. E.g. 6 micro-batches, K = 4, start 0: updates close at steps 4 and 6,
    and only the record of step 6 has ``tail_flush`` True.

    Argument rules (lesson 14 §5.7), all checked in this order before any work (before the loader is
    touched): ``ValueError`` naming the bad argument first when ``accumulation_steps``, ``iters`` or
    ``epochs`` is <= 0, ``epoch`` is outside ``[0, epochs)``, or ``start_step`` is outside ``[0, iters]``.
    Each argument is checked itself (``epochs=0`` must not be reported as a bad ``epoch``).
    """
    raise NotImplementedError("train_one_epoch: TODO - see lesson 14 §5.5 (aligns with train_epoch)")


def test_accumulation_matches_big_batch(accumulate_gradients) -> None:
    """TODO (lesson 14 §5.6): write a test that K accumulated micro-batches give one big batch's gradient.

    ``accumulate_gradients(model, micro_batches, accumulation_steps)`` is the implementation under test:
    it runs ``model(input_ids, labels=labels)`` on each ``(input_ids, labels)`` of ``micro_batches`` (exactly
    ``accumulation_steps`` of them), backpropagates that output's ``(loss + aux_loss) / K`` and leaves the
    summed gradients in each parameter's ``.grad`` (no optimizer step). A correct version is
    ``course.runs.accumulate_gradients``.
    What your test must prove: for the same samples, the accumulated gradient of EVERY parameter equals the
    gradient of one backward of the whole batch's loss, up to float rounding (~1e-8 here). It returns
    nothing when the implementation is right and raises ``AssertionError`` when it is wrong.
    What the grader runs it on (§5.6 has the table): the correct version and the same in float64 must
    pass; five wrong accumulations (no division by K, division twice, gradients zeroed every micro-batch,
    the first micro-batch alone, division by the micro-batch size), one per large parameter tensor a
    gradient 1 % off in that tensor alone, gradients with the right norms, sums and absolute values but
    the wrong signs, places or parameters, one element of each tensor wrong, and the smallest gradient
    tensor zeroed must each fail it with ``AssertionError`` (a crash is no verdict); a parameter left
    without a gradient (``.grad`` None) and an implementation that raises must fail it with any exception.
    Choose inputs under which each wrong one differs from the right one, and a tolerance between float
    rounding and the smallest gradient's 1 % error (the norm weights' elements are ~6e-4, so their 1 % error
    hides under ``assert_close``'s default ``atol=1e-5``). Tools (already imported here):
    ``tiny_model(LoopScenario(...))`` is a seeded MiniMind (the same weights every call) and
    ``tiny_batches(batch_size, max_length, 1, seed)[0]`` one ``(input_ids, labels)`` batch, unpadded at
    ``max_length`` 16 or 32.
    """
    raise NotImplementedError("test_accumulation_matches_big_batch: TODO - see lesson 14 §5.6")


# --- Extensions: fix upstream (optional; lesson 14 §10; graded by ``python -m course check 14 --all``) ---


def accumulation_divisor(step: int, iters: int, accumulation_steps: int) -> int:
    """TODO (lesson 14 §10.1, optional): the number micro-step ``step`` divides its loss by.

    Upstream divides every micro-batch loss by K, also in an epoch's last, partial window, so the tail
    update applies only r/K of the mean of its r gradients. Contract: every update's gradient is the MEAN
    of its own micro-batch gradients, the tail's included. Windows of K = ``accumulation_steps`` count from
    micro-step 1 (1-based ``step``); a full window's micro-steps return K, the partial window's (if any)
    return its size r; when K divides ``iters`` there is none. Returns an int.
    Examples, steps 1..iters: iters=6, K=4 -> 4, 4, 4, 4, 2, 2; iters=3, K=8 -> 3, 3, 3; iters=8, K=4 -> all
    4; iters=7, K=3 -> 3 (x6), 1. Graded also by accumulating a real epoch with it (the tail's gradient).
    Argument rules, in this order: ``ValueError`` naming ``accumulation_steps`` or ``iters`` when it is
    <= 0, naming ``step`` when it is outside ``[1, iters]``.
    """
    raise NotImplementedError("accumulation_divisor: TODO - see lesson 14 §10.1 (optional)")


def lr_per_update(epoch: int, step: int, iters: int, epochs: int, accumulation_steps: int,
                  base_lr: float) -> float:
    """TODO (lesson 14 §10.2, optional): the lr of the optimizer update that micro-step ``step`` belongs to.

    Upstream evaluates the cosine at every micro-step; here the same schedule (``cosine_lr``'s, to a
    relative 1e-12) runs over optimizer UPDATES of the whole run instead. Contract: count the updates of an
    epoch with its tail flush included; number them from 1 over all epochs; every micro-step of a window
    gets the lr of the update that window makes, so the lr is constant within a window, and the run's last
    update gets exactly 0.1 x base_lr. ``epoch`` is 0-based, ``step`` 1-based.
    Examples (base_lr = 1.0): iters=6, K=4, epochs=2 -> 4 updates in all; epoch 0 steps 1..4 share update 1
    (lr 0.86820, to 5 digits), steps 5..6 share update 2 (0.55); epoch 1 step 6 is update 4 -> 0.1.
    Argument rules, in this order: ``ValueError`` naming the argument when ``accumulation_steps``, ``iters``
    or ``epochs`` is <= 0, ``epoch`` is outside ``[0, epochs)`` or ``step`` is outside ``[1, iters]``.
    """
    raise NotImplementedError("lr_per_update: TODO - see lesson 14 §10.2 (optional)")


def update_cadence_due(step: int, iters: int, accumulation_steps: int, interval: int) -> bool:
    """TODO (lesson 14 §10.2, optional): whether a log or a save counted in UPDATES is due at ``step``.

    Upstream logs and saves every ``interval`` MICRO-steps (and at the epoch's last), so a save can fall
    inside a window whose gradients are not in the checkpoint. Contract: due only on a micro-step that
    closes a window (1-based, windows of K from micro-step 1), when the number of updates closed so far in
    the epoch is a multiple of ``interval``; and always at ``step == iters`` (the epoch's last update, a
    full window or the tail flush). Returns a bool.
    Examples, the due steps of 1..iters: iters=10, K=2, interval=2 -> 4, 8, 10; iters=12, K=4, interval=2
    -> 8, 12; iters=7, K=1, interval=3 -> 3, 6, 7; iters=3, K=8, interval=5 -> 3.
    Argument rules, in this order: ``ValueError`` naming the argument when ``accumulation_steps``,
    ``iters`` or ``interval`` is <= 0, or ``step`` is outside ``[1, iters]``.
    """
    raise NotImplementedError("update_cadence_due: TODO - see lesson 14 §10.2 (optional)")


def adamw_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """TODO (lesson 14 §10.3, optional): AdamW parameter groups with no weight decay on norms and embeddings.

    Upstream passes ``model.parameters()`` to AdamW, so every parameter gets the same decay. Contract:
    returns exactly two dicts, the decayed group first (``"weight_decay": weight_decay``) and the exempt
    group second (``"weight_decay": 0.0``), each with its ``"params"`` list, ready for
    ``torch.optim.AdamW(groups, lr=...)``. Exempt: every parameter with fewer than 2 dimensions (norm
    weights, biases) and every ``torch.nn.Embedding``'s weight; all other parameters decay. Parameters
    with ``requires_grad=False`` appear in neither group; every trainable one appears exactly once (MiniMind
    ties ``lm_head.weight`` to the embedding: one ``Parameter``, one entry, exempt); within a group, the
    order of ``model.named_parameters()``.
    Argument rules: ``ValueError`` naming ``weight_decay`` when it is negative or NaN; 0.0 and values
    >= 1 are valid.
    """
    raise NotImplementedError("adamw_param_groups: TODO - see lesson 14 §10.3 (optional)")


def warmup_cosine_lr(current_step: int, total_steps: int, base_lr: float, warmup_steps: int) -> float:
    """TODO (lesson 14 §10.4, optional): a linear warmup of W = ``warmup_steps`` steps, then MiniMind's cosine.

    Contract, with s = ``current_step`` and T = ``total_steps``: during the warmup (s < W) the lr rises
    linearly from 0 at s = 0 towards ``base_lr``, reaching it exactly at s = W; from s = W to s = T it is
    ``cosine_lr``'s schedule run over the remaining T - W steps (``base_lr`` at W, 0.1 x base_lr at T).
    W = 0 is ``cosine_lr`` itself. Graded against that to a relative 1e-12. Returns a Python float.
    Examples (T=100, base_lr=1.0, W=10): s=0 -> 0.0; s=5 -> 0.5; s=10 -> 1.0; s=55 -> 0.55; s=100 -> 0.1.
    Argument rules, in this order: ``ValueError`` naming the argument when ``total_steps <= 0``,
    ``warmup_steps`` is outside ``[0, total_steps)`` or ``current_step`` is outside ``[0, total_steps]``.
    """
    raise NotImplementedError("warmup_cosine_lr: TODO - see lesson 14 §10.4 (optional)")
