"""Lesson 17 checks of SFT on lesson 16's session: ``update_normalization_units`` and ``sft_epoch``.

The oracle of an update is ONE backward of the model's own loss (its token mean over the shifted targets) on all
of the update's micro-batches at once (``course/runs/sft.py::sft_update_gradients``). ``sft_epoch`` drives the
reference ``TrainingSession`` of lesson 16 (so lesson 17 does not depend on your lesson 16), wrapped by
``RecordingSession``, which keeps every micro-step's options and each update's gradients at its close. The
micro-batches are the built-in chat corpus's (``sft_micro_batches``): 9, 0, 26 | 0, 0, 0 | 14, 19, 19 | 18 shifted
assistant targets, K = 3. Gradients are compared with lesson 16's tolerances (a different summation order moves
them by ~1e-8; the mean of micro-batch means by ~1e-2). Counts are compared exactly.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from course.minimind import IGNORE_INDEX
from course.protocol.text import token_weighted_step
from course.reference import train_session as lesson16
from course.runs import grads_of, params_of, session_model
from course.runs.eager import eager
from course.runs.sft import sft_micro_batches, sft_sample, sft_update_gradients

from ..framework import check, expect_equal, expect_raises, expect_tensors_close, expect_type, fail
from ..lesson16.checks import GRAD_ATOL, GRAD_RTOL, rule
from .checks import END_OF_TEXT


def labels_with(counts: list[int], seq: int = 8) -> torch.Tensor:
    """Labels of a micro-batch of ``len(counts)`` samples, sample i holding counts[i] shifted targets: a valid
    label at position 0 (never a target), then counts[i] valid labels, then -100."""
    labels = torch.full((len(counts), seq), IGNORE_INDEX)
    for row, count in enumerate(counts):
        labels[row, :count + 1] = torch.arange(5, 6 + count)
    return labels


# (targets per sample of each micro-batch, K, the expected units per micro-batch)
UNIT_CASES = (
    ([[1, 2], [5], [0, 4]], 2, [8, 8, 4]),                 # the epoch's tail is an update of its own
    ([[3], [5], [4]], 1, [3, 5, 4]),
    ([[3], [5], [4], [1], [2], [6], [7]], 3, [12, 12, 12, 9, 9, 9, 7]),
    ([[3, 1], [5]], 4, [9, 9]),                            # K larger than the epoch: one update
    ([[0], [0, 0], [5], [2]], 2, [0, 0, 7, 7]),            # an update without a target
    ([], 2, []),
)


def units_hint(counts: list[int], k: int, got, expected: list[int]) -> str:
    """The cause a wrong list of units points at."""
    windows = [counts[i:i + k] for i in range(0, len(counts), k)]
    if got == counts:
        return "each micro-batch got its own count: the units are those of its whole update (K micro-batches)"
    if got == [sum(counts)] * len(counts) and len(windows) > 1:
        return "every micro-batch got the epoch's total: the units are those of its own update only"
    if isinstance(got, list) and len(got) == len(counts) and all(g >= e for g, e in zip(got, expected)):
        return ("count only the targets the loss averages over: a label at position >= 1 (labels[..., 1:]) that "
                "is not -100")
    if isinstance(got, list) and len(got) == len(expected) and all(g <= e for g, e in zip(got, expected)):
        return ("a target is any label that is not -100, id 0 too: an answer may hold the pad id 0 (the text "
                "<|endoftext|> is that one token), and the loss trains on it")
    return ("windows of K consecutive micro-batches from the first; the last window holds what remains; one "
            "entry per micro-batch")


@check("update_normalization_units", objective="normalization_units")
def units_are_each_updates_shifted_targets(impl):
    """Per micro-batch, the shifted targets (labels[..., 1:] != -100) of its window of K: a short tail is its own
    update, K = 1 and a K larger than the epoch too, an update may hold none; and on real SFT masks, one whose
    answers hold id 0 (the text <|endoftext|>: a target like any id)."""
    cases = [([labels_with(c) for c in batches], k, expected) for batches, k, expected in UNIT_CASES]
    cases.append(([b.labels for b in sft_micro_batches()], 3, [35] * 3 + [0] * 3 + [52] * 3 + [18]))
    # 28 shifted targets, 2 of them id 0, then a micro-batch of 3
    cases.append(([torch.tensor([sft_sample(END_OF_TEXT, 96).labels]), labels_with([3])], 2, [31, 31]))
    for labels, k, expected in cases:
        counts = [int((lab[..., 1:] != IGNORE_INDEX).sum()) for lab in labels]
        got = impl.update_normalization_units(labels, k)
        if got != expected:
            fail(f"update_normalization_units(micro-batches holding {counts} shifted targets, accumulation_steps={k})",
                 got, expected, f"hint: the rule: {units_hint(counts, k, got, expected)}")


@check("update_normalization_units")
def units_are_python_ints(impl):
    """Each entry is a Python int: a count the session divides by, taken on the host (not a 0-dim tensor)."""
    for entry in impl.update_normalization_units([labels_with([2, 3]), labels_with([1])], 2):
        expect_type("an entry of update_normalization_units(...)", entry, int)


@check("update_normalization_units")
def units_reject_a_bad_accumulation_steps(impl):
    """accumulation_steps below 1 is a ValueError naming it."""
    for k in (0, -2):
        expect_raises(f"update_normalization_units([...], accumulation_steps={k})",
                      lambda: impl.update_normalization_units([labels_with([2])], k), ValueError,
                      "accumulation_steps")


class RecordingSession:
    """Lesson 16's reference ``TrainingSession`` (tiny model, SGD at lr 0.1), recording what ``sft_epoch`` does:
    every micro-step's micro-batch and options, and for each update that closes its micro-batches, the weights
    before it and the gradients at its close (a ``before_update`` hook, then the caller's own), and what the
    session applies at that close: the optimizer's lr and the closing micro-step's clip_grad_norm."""

    def __init__(self, accumulation_steps: int):
        model = session_model()
        self.session = lesson16.TrainingSession(model, eager(torch.optim.SGD)(model.parameters(), lr=0.1),
                                                accumulation_steps=accumulation_steps)
        self.model, self.optimizer = self.session.model, self.session.optimizer
        self.calls, self.updates, self.applied, self._pending = [], [], [], []

    def __getattr__(self, name):
        return getattr(self.session, name)

    def train_step(self, batch, options, step_fn):
        if not self._pending:
            self._before = params_of(self.model)
        self._pending.append(batch)
        self.calls.append((batch, options, step_fn))
        callers = options.before_update

        def capture():
            self.updates.append((self._before, list(self._pending), grads_of(self.model)))
            self.applied.append((self.optimizer.param_groups[0]["lr"], options.clip_grad_norm))
            self._pending = []
            return bool(callers()) if callers is not None else False
        report = self.session.train_step(batch, replace(options, before_update=capture), step_fn)
        return report


def run_epoch(impl, k: int = 3, batches=None, **options) -> tuple[RecordingSession, list, list]:
    """``sft_epoch`` over the SFT micro-batches; its failure is the check's, with the rule it likely broke."""
    batches = sft_micro_batches() if batches is None else batches
    given = [(batch, batch.input_ids.clone(), batch.labels.clone()) for batch in batches]
    session = RecordingSession(k)
    try:
        result = impl.sft_epoch(session, batches, k, **options)
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(f"sft_epoch(session, {len(given)} micro-batches, {k}) raised", f"{type(exc).__name__}: {exc}",
             "one entry per update", f"hint: the rule: {epoch_error_hint(exc)}")
    # The oracle trains on these batches: they must be the caller's, as given.
    if len(batches) != len(given) or not all(batch is b and torch.equal(batch.input_ids, ids) and
                                             torch.equal(batch.labels, labels)
                                             for batch, (b, ids, labels) in zip(batches, given)):
        fail(f"sft_epoch(session, {len(given)} micro-batches, {k}): the caller's micro-batches afterwards",
             f"{len(batches)} micro-batches, changed", f"the {len(given)} micro-batches as given",
             "hint: the rule: leave the caller's micro-batches as they were (the list, each batch's input_ids "
             "and labels): take each window as a slice, do not pop, clear or edit them")
    return session, batches, result


def epoch_error_hint(exc: Exception) -> str:
    """The rule an error of lesson 16's session (its wording) points at."""
    if "changed inside an update" in str(exc):
        return ("every micro-step of an update gets the same normalization_units: the assistant tokens of the WHOLE "
                "update, counted before its first micro-step; and each update closes (force_update) on the last "
                "micro-batch it sends, or the next update's micro-steps join it")
    if "normalization_units" in str(exc) or isinstance(exc, ZeroDivisionError):
        return "an update without any assistant token is not trained (its normalization units would be 0)"
    return "drive the session with train_step(batch, TrainingStepOptions(...), step_fn), one call per micro-batch"


def windows(batches: list, k: int) -> list[list]:
    return [batches[i:i + k] for i in range(0, len(batches), k)]


def numbered(batches: list, chosen: list) -> list[int]:
    """The 1-based positions in ``batches`` of the micro-batches ``chosen`` (by identity)."""
    return [next(i for i, batch in enumerate(batches, start=1) if batch is b) for b in chosen]


def holds_targets(window: list) -> bool:
    return sum(b.loss_units for b in window) > 0


def trained_windows(batches: list, k: int) -> list[list]:
    """The windows of K that hold an assistant token: the updates sft_epoch trains."""
    return [window for window in windows(batches, k) if holds_targets(window)]


def sent_numbers(session, batches: list) -> list[int]:
    """The micro-batches sft_epoch sent to train_step, in order, numbered from 1."""
    return numbered(batches, [batch for batch, _, _ in session.calls])


def window_of(batches: list, k: int, update: list) -> list:
    """The window of K that the micro-batches of a closed update came from (its first micro-batch's). A micro-batch
    without a target may be left out of an update without changing its gradient, so the oracle of an update is
    its whole window."""
    return windows(batches, k)[(numbered(batches, update[:1])[0] - 1) // k]


@check("sft_epoch", objective="sft_updates")
def sft_epoch_update_is_one_backward_of_its_assistant_tokens(impl):
    """Each update's accumulated gradient equals ONE backward of the model's own loss on all of the update's
    micro-batches at once (the token mean over all its assistant tokens), at the weights it started from, also
    with a micro-batch that holds no target."""
    session, all_batches, _ = run_epoch(impl)
    for number, (before, batches, grads) in enumerate(session.updates, start=1):
        units = [b.loss_units for b in batches]
        expected = sft_update_gradients(window_of(all_batches, 3, batches), before)
        with rule(gradient_hint(grads, naive_gradients(batches, before))):
            expect_tensors_close(f"update {number} (micro-batches holding {units} shifted assistant targets): "
                                 "accumulated gradient vs one backward of the whole update", grads, expected,
                                 rtol=GRAD_RTOL, atol=GRAD_ATOL)


TOKEN_MEAN = ("an update's gradient is ONE token mean over all its assistant tokens: the sum of its per-token "
              "losses / the update's total targets (normalization_units), whatever each micro-batch holds")


def gradient_hint(grads: dict, naive: dict) -> str:
    """The rule a wrong update gradient points at, with what the numbers show: NaN from a micro-batch without
    targets, the mean of micro-batch means, or another weighting."""
    if any(grad.isnan().any() for grad in grads.values()):
        return (f"{TOKEN_MEAN}. The gradient holds NaN: a micro-batch without an assistant token has no mean "
                "(0 / 0), which the mean of micro-batch means (loss / K, naive_mean_step) takes; weighted by its "
                "tokens (token_weighted_step) it adds 0")
    if all(torch.allclose(grads[n], naive[n], rtol=GRAD_RTOL, atol=GRAD_ATOL) for n in grads):
        return (f"{TOKEN_MEAN}. This gradient is the mean of micro-batch means (loss / K) instead: weight each "
                "micro-batch by its assistant tokens, gradient_units / normalization_units (token_weighted_step)")
    return ("each micro-step backpropagates its loss * gradient_units / normalization_units, normalization_units the "
            "assistant tokens of the WHOLE update (token_weighted_step)")


def naive_gradients(batches, params) -> dict:
    """Lesson 14's objective on the same micro-batches, the hint's comparison: each micro-batch's mean / K (a
    micro-batch without a target adds 0, as it does through the session)."""
    model = session_model(params)
    for batch in batches:
        token_weighted_step(model, batch).loss.div(len(batches)).backward()
    return grads_of(model)


@check("sft_epoch", objective="sft_updates")
def sft_epoch_closes_each_update_once(impl):
    """Windows of K micro-batches in order are the updates, the tail of one micro-batch too: each closes with one
    optimizer step on the last micro-batch it sends; every micro-batch holding a target is sent; the update without
    a target (micro-batches 4 to 6) is not sent to the session and its entry is None; the others are the reports
    that closed them. (Whether a micro-batch without a target inside a trained update is sent is §5.5's.)"""
    session, batches, result = run_epoch(impl)
    groups = windows(batches, 3)
    sent = sent_numbers(session, batches)
    untrained = {i for group in groups if not holds_targets(group) for i in numbered(batches, group)}
    with rule("an update without any assistant token is not trained: none of its micro-batches goes to the session"):
        expect_equal("micro-batches of the update without an assistant token sent to train_step, numbered from 1",
                     [i for i in sent if i in untrained], [])
    holding = [i for i, batch in enumerate(batches, start=1) if batch.loss_units]
    with rule("every micro-batch that holds an assistant token goes to the session, in order, the epoch's short "
              "last update's too"):
        expect_equal("micro-batches holding assistant tokens sent to train_step, numbered from 1",
                     [i for i in sent if i in holding], holding)
    expected_closed = [[i for i in sent if i in numbered(batches, group)]
                       for group in trained_windows(batches, 3)]
    with rule("every K consecutive micro-batches are one update, the last one possibly shorter; each closes once, "
              "on the last micro-batch it sends (force_update)"):
        expect_equal("the micro-batches of each update that closed, numbered from 1",
                     [numbered(batches, update) for _, update, _ in session.updates], expected_closed)
    reports = [r if r is None else (r.parameters_updated, r.microsteps_accumulated, r.optimizer_step)
               for r in result] if isinstance(result, list) else result
    closing = iter((True, len(update), step) for step, update in enumerate(expected_closed, start=1))
    expected = [next(closing) if holds_targets(group) else None for group in groups]
    with rule("one entry per update: the report of the micro-step that closed it, None for an update not trained"):
        expect_equal("sft_epoch's result: (parameters_updated, microsteps_accumulated, optimizer_step) per update",
                     reports, expected)
    expect_equal("session.optimizer_step after the epoch", session.optimizer_step, 3)


@check("sft_epoch")
def sft_epoch_sends_every_micro_batch_of_a_trained_update(impl):
    """The convention (lesson 17 §5.5): a trained update sends all of its window's micro-batches, one without an
    assistant token too. It adds nothing to the gradient, so the core does not grade it; the update stays the K
    micro-batches the run cut, and its report counts them."""
    session, batches, _ = run_epoch(impl)
    with rule("every micro-batch of a trained update goes to the session, one without an assistant token too: the "
              "update is the K micro-batches the run cut"):
        expect_equal("micro-batches sent to train_step, numbered from 1", sent_numbers(session, batches),
                     [i for group in trained_windows(batches, 3) for i in numbered(batches, group)])


LR_RULE = ("each update steps at the lr sft_epoch got (None: the optimizer's own): lesson 16's session writes an "
           "lr that is not None into every param group at the micro-step that carries it, and it stays there")
CLIP_RULE = ("each update is clipped at the clip_grad_norm sft_epoch got (0.0: not clipped): lesson 16's session "
             "clips with the clip_grad_norm of the micro-step that closes the update")


@check("sft_epoch", objective="sft_updates")
def sft_epoch_passes_lr_and_clipping(impl):
    """Each update the session closes steps at sft_epoch's lr and is clipped at its clip_grad_norm: the lr in the
    optimizer's param groups and the closing micro-step's clip_grad_norm, which is what lesson 16's session
    applies there. Their defaults, None and 0.0, keep the optimizer's lr (0.1) and do not clip."""
    for options, (lr, clip) in (({"lr": 0.05, "clip_grad_norm": 0.5}, (0.05, 0.5)), ({}, (0.1, 0.0))):
        session, _, _ = run_epoch(impl, **options)
        count = len(session.applied)
        with rule(LR_RULE):
            expect_equal(f"sft_epoch(..., {options}): the optimizer's lr at each update's step",
                         [lr for lr, _ in session.applied], [lr] * count)
        with rule(CLIP_RULE):
            expect_equal(f"sft_epoch(..., {options}): clip_grad_norm of the micro-step that closed each update",
                         [clip for _, clip in session.applied], [clip] * count)
        with rule(LR_RULE):
            expect_equal(f"sft_epoch(..., {options}): the optimizer's lr afterwards",
                         session.optimizer.param_groups[0]["lr"], lr)


@check("sft_epoch")
def sft_epoch_options_carry_lr_and_clipping_every_micro_step(impl):
    """The convention (lesson 17 §5.5): every micro-step's TrainingStepOptions carries lr and clip_grad_norm as
    sft_epoch got them, not only the micro-steps where lesson 16's session reads them: another session (or a
    later change of this one) may read them at any micro-step."""
    for options, expected in (({"lr": 0.05, "clip_grad_norm": 0.5}, (0.05, 0.5)), ({}, (None, 0.0))):
        session, _, _ = run_epoch(impl, **options)
        seen = [(o.lr, o.clip_grad_norm) for _, o, _ in session.calls]
        wrong = [i for i, pair in enumerate(seen) if pair != expected]
        with rule("every micro-step's TrainingStepOptions carries lr and clip_grad_norm as sft_epoch got them"):
            expect_equal(f"sft_epoch(..., {options}): (lr, clip_grad_norm) of every micro-step"
                         + (f" (micro-step {wrong[0] + 1} of {len(seen)} differs)" if wrong else ""),
                         seen[wrong[0]] if wrong else expected, expected)


@check("sft_epoch", objective="sft_updates", hidden=True)
def sft_epoch_with_other_windows(impl):
    """The same micro-batches with K = 4 (updates of 4, 4 and 2 micro-batches) and with K = 12, larger than the
    epoch (one update of all 10): each update's gradient is one backward of its micro-batches."""
    for k, sizes in ((4, [4, 4, 2]), (12, [10])):
        session, all_batches, _ = run_epoch(impl, k)
        with rule("every K consecutive micro-batches are one update, the last one possibly shorter"):
            expect_equal(f"K = {k}: micro-batches of the window each closed update came from",
                         [len(window_of(all_batches, k, u)) for _, u, _ in session.updates], sizes)
        for number, (before, batches, grads) in enumerate(session.updates, start=1):
            with rule("each micro-step backpropagates loss * gradient_units / normalization_units, "
                      "normalization_units the assistant tokens of the WHOLE update"):
                expect_tensors_close(f"K = {k}, update {number}: accumulated gradient vs one backward of the update",
                                     grads, sft_update_gradients(window_of(all_batches, k, batches), before),
                                     rtol=GRAD_RTOL, atol=GRAD_ATOL)
