"""Lesson 15 checks: shared helpers (fake DDP / compile wrappers, fake ranks, the bitwise resume comparison,
a good checkpoint) and ``SkipBatchSampler``.

Saving and loading do no arithmetic, so resume is graded BITWISE: a run interrupted at an update
boundary, saved, loaded into fresh objects and continued must give the very same records, parameters,
AdamW state and GradScaler scale as the uninterrupted oracle run. Training itself always runs on the
oracle loop (``course.minimind.train_pretrain.train_epoch``), so lesson 15 does not depend on lesson 14.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from course.minimind.trainer_utils import SkipBatchSampler as UpstreamSkipBatchSampler
from course.runs import RunResult, resume_and_finish, run_oracle, save_objects, train_until, training_objects
from course.runs.loop import LoopScenario
from course.runs.scenarios import RESUME_BASE

from ..framework import (CheckFailure, check, expect_equal, expect_raises, expect_tensor_close, expect_tensors_close,
                         fail)


def names_the_rule(rule: str):
    """Decorator (under ``@check``): a failure of the check ends with ``hint: <rule>``, the rule it grades, unless
    the failure already carries a more specific hint."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(impl):
            try:
                return fn(impl)
            except CheckFailure as exc:
                if "hint:" in str(exc):
                    raise
                raise CheckFailure(f"{exc}\n  hint: {rule}") from None
        return run
    return wrap


class NotATensor:
    """Stands for any pickled object: ``weights_only=True`` must refuse to rebuild it."""


# The keys every resume checkpoint holds (the stub's docstring lists them).
CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size")


def expect_raises_naming(what: str, fn, exc_type, names) -> None:
    """``fn()`` raises ``exc_type`` whose message contains every item of ``names``; an item that is a
    tuple is satisfied by any one of its strings (e.g. any parameter name)."""
    def shown(options) -> str:
        return " or ".join(repr(o) for o in options[:3]) + (f" or one of {len(options) - 3} more"
                                                              if len(options) > 3 else "")

    def wanted(options) -> str:
        return f"{exc_type.__name__} naming {shown(options)}"
    every = f"{exc_type.__name__} naming " + " and ".join(
        f"({shown(name)})" if isinstance(name, tuple) else repr(name) for name in names)
    try:
        fn()
    except NotImplementedError:
        raise
    except exc_type as exc:
        for name in names:
            options = name if isinstance(name, tuple) else (name,)
            if not any(option in str(exc) for option in options):
                fail(f"{what}: the error message should name the path and the offending key", str(exc),
                     wanted(options))
        return
    except Exception as exc:  # wrong type of error
        fail(what, f"{type(exc).__name__}: {exc}", every)
    fail(what, "no exception", every)


def expect_works(what: str, fn, expected: str, hint: str = ""):
    """``fn()``'s result; an exception it raises fails the check with ``expected`` (what should have happened)."""
    try:
        return fn()
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(what, f"{type(exc).__name__}: {str(exc)[:300]}", expected, hint)


def fake_ddp(model):
    """A DistributedDataParallel wrapper without a process group: the same type and ``module.`` keys."""
    wrapper = DistributedDataParallel.__new__(DistributedDataParallel)
    torch.nn.Module.__init__(wrapper)
    wrapper.module = model
    return wrapper


class CompiledWrapper(torch.nn.Module):
    """What torch.compile returns, for saving purposes: the model as ``_orig_mod`` (keys ``_orig_mod.``)."""

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int):
    """torch.distributed answers as rank ``rank`` of an initialized group of ``world_size``."""
    saved = {name: getattr(dist, name) for name in ("is_initialized", "get_rank", "get_world_size")}
    dist.is_initialized = lambda: True
    dist.get_rank = lambda group=None: rank
    dist.get_world_size = lambda group=None: world_size
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(dist, name, value)


# --- the trained objects every check saves --------------------------------------------------


@functools.lru_cache(maxsize=None)
def trained_states(scenario: LoopScenario, stop_epoch: int, stop_step: int):
    """Model, optimizer and scaler states and the records of oracle training up to a stop point: trained once
    per stop point, not once per check."""
    objects, records = train_until(scenario, stop_epoch, stop_step)
    return objects.model.state_dict(), objects.optimizer.state_dict(), objects.scaler.state_dict(), records


def trained(scenario: LoopScenario, stop_epoch: int, stop_step: int):
    """(fresh objects holding ``trained_states``, the records): what ``train_until`` returns, without training.
    Copies, so a check may change them; no injected overflow (the states already hold its effect)."""
    model_state, optimizer_state, scaler_state, records = trained_states(scenario, stop_epoch, stop_step)
    objects = training_objects(scenario.with_(overflow_at_backward=None))
    objects.model.load_state_dict(model_state)
    objects.optimizer.load_state_dict(copy.deepcopy(optimizer_state))
    objects.scaler.load_state_dict(scaler_state)
    return objects, copy.deepcopy(records)


# --- comparing a resumed run with the uninterrupted one ----------------------------------------


def compare_resumed(where: str, records_before, resumed: RunResult, uninterrupted: RunResult) -> None:
    """Bitwise: records, parameters, AdamW state and GradScaler scale (no arithmetic to excuse a difference)."""
    expect_equal(f"{where} (epoch, step) of the records before + after the interruption",
                 [(r["epoch"], r["step"]) for r in records_before + resumed.records],
                 [(r["epoch"], r["step"]) for r in uninterrupted.records])
    for got, want in zip(records_before + resumed.records, uninterrupted.records):
        expect_equal(f"{where} record of epoch {want['epoch']} step {want['step']}", got, want)
    expect_equal(f"{where} GradScaler scale at the end", resumed.scale, uninterrupted.scale)
    expect_tensors_close(f"{where} parameters", resumed.params, uninterrupted.params, rtol=0.0, atol=0.0)
    for name, state in uninterrupted.optimizer_state.items():
        for key, want in state.items():
            got = resumed.optimizer_state.get(name, {}).get(key)
            if got is None:
                fail(f"{where} AdamW {key} of {name}", None, "a tensor (restored from the checkpoint)")
            expect_tensor_close(f"{where} AdamW {key} of {name}", got.reshape(want.shape), want, rtol=0.0, atol=0.0)


def check_exact_resume(impl, cases) -> None:
    for scenario, stop_epoch, stop_step in cases:
        objects, records_before = trained(scenario, stop_epoch, stop_step)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "resume.pth"
            save_objects(impl, path, objects, stop_epoch, stop_step)
            resumed = resume_and_finish(impl, scenario, path)
        compare_resumed(f"[{scenario.name}]", records_before, resumed, run_oracle(scenario))


@contextlib.contextmanager
def good_checkpoint(impl):
    """(trained objects, fresh target objects, temp dir, a good checkpoint of the trained ones there)."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        good = Path(tmp) / "good.pth"
        save_objects(impl, good, objects, 0, 2)
        yield objects, training_objects(RESUME_BASE), tmp, good


# --- SkipBatchSampler --------------------------------------------------------------------------


SAMPLER_ARGUMENTS = ("indices", "batch_size", "skip_batches")


def sampler_hint(batches: list, when_yielded: list, expected: list, whole_epoch: list) -> str:
    """The rule a wrong ``list(sampler)`` breaks, read from what it holds, what each batch held when it was
    yielded and ``whole_epoch`` (the batches with no skip); "" when none shows (the check's own rule then ends
    the message)."""
    got = [list(b) for b in batches]
    if got != when_yielded:
        return "start a new list for every batch: a yielded batch is never changed afterwards"
    if got == whole_epoch != expected:
        return "drop the first skip_batches batches of the epoch: they were trained before the checkpoint"
    if expected and got == expected[:-1]:
        return "the last, short batch is kept: the epoch's last samples are trained too"
    return ""


def expect_sampler_batches(where: str, sampler, expected: list, whole_epoch: list) -> None:
    """``list(sampler)`` taken whole, twice, holds the batches ``expected`` (compared as lists, so a tuple
    batch is the same batch); so does len."""
    for attempt in ("", " (second pass)"):
        batches, when_yielded = [], []
        for batch in sampler:
            batches.append(batch)
            when_yielded.append(list(batch))
        if [list(b) for b in batches] != expected:
            hint = sampler_hint(batches, when_yielded, expected, whole_epoch)
            fail(f"{where} batches{attempt}", [list(b) for b in batches], expected, f"hint: {hint}" if hint else "")
    expect_equal(f"len({where})", len(sampler), len(expected))


@check("SkipBatchSampler", objective="skip_batches")
@names_the_rule("the epoch cut into batches in order, minus the first skip_batches; the last, short batch is kept")
def skip_batch_sampler_matches_upstream(impl):
    """Same batches and len as upstream's sampler for every skip in [0, ceil(N / bs)] (with and without a
    partial last batch), on every pass; the lesson's example; skip_batches defaults to 0."""
    expect_sampler_batches("SkipBatchSampler(range(10), 3, 2) (upstream example)", impl.SkipBatchSampler(
        range(10), 3, 2), [[6, 7, 8], [9]], [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]])
    for n in (1, 9, 10, 12):
        for batch_size in (1, 3, 4):
            whole_epoch = list(UpstreamSkipBatchSampler(list(range(100, 100 + n)), batch_size, 0))
            for skip in range(len(whole_epoch) + 1):
                sampler = impl.SkipBatchSampler(list(range(100, 100 + n)), batch_size, skip)
                upstream = UpstreamSkipBatchSampler(list(range(100, 100 + n)), batch_size, skip)
                expect_sampler_batches(f"SkipBatchSampler(N={n}, batch_size={batch_size}, skip_batches={skip})",
                                       sampler, list(upstream), whole_epoch)
    default = [[0, 1], [2, 3], [4]]
    if [list(b) for b in impl.SkipBatchSampler(range(5), 2)] != default:
        fail("list(SkipBatchSampler(range(5), 2)) (skip_batches left at its default)",
             [list(b) for b in impl.SkipBatchSampler(range(5), 2)], default,
             "hint: skip_batches defaults to 0: a fresh epoch trains every batch")


@check("SkipBatchSampler", objective="skip_batches", hidden=True)
@names_the_rule("read indices afresh on every pass (keep the sampler itself, not list(indices)): set_epoch "
                "changes its order")
def skip_batch_sampler_follows_a_reshuffled_sampler(impl):
    """Over a DistributedSampler, each pass batches the order of the sampler's current epoch (set_epoch
    reshuffles it): the indices are read afresh on every pass, not copied once."""
    shards = DistributedSampler(range(11), num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler = impl.SkipBatchSampler(shards, 2, 1)
    for epoch in (0, 1):
        shards.set_epoch(epoch)
        expect_sampler_batches(f"SkipBatchSampler(DistributedSampler(11 samples, rank 1 of 2) after "
                               f"set_epoch({epoch}), batch_size=2, skip_batches=1)", sampler,
                               list(UpstreamSkipBatchSampler(list(shards), 2, 1)),
                               list(UpstreamSkipBatchSampler(list(shards), 2, 0)))


@check("SkipBatchSampler")
@names_the_rule("yield each batch as a list, as a DataLoader's batch_sampler is expected to")
def skip_batch_sampler_yields_lists(impl):
    """Every batch, the last short one too, is a ``list`` (a tuple batch trains the same samples: the
    convention of torch's own BatchSampler)."""
    for n, batch_size, skip in ((5, 2, 0), (10, 3, 1), (12, 4, 2)):
        batches = list(impl.SkipBatchSampler(range(n), batch_size, skip))
        expect_equal(f"types of the batches of SkipBatchSampler(range({n}), {batch_size}, {skip})",
                     sorted({type(b).__name__ for b in batches}), ["list"])


@check("SkipBatchSampler")
@names_the_rule('check indices (sized, else TypeError), then batch_size (an int >= 1, not a bool), then '
                'skip_batches (an int in [0, ceil(N / batch_size)], not a bool), each error naming its argument')
def skip_batch_sampler_rejects_bad_arguments(impl):
    """A batch_size that is not an int >= 1 (True is a bool), a skip outside [0, ceil(N / bs)] raise ValueError
    naming the argument; indices without len() (a generator, an iterator) raise TypeError naming 'indices';
    with several bad arguments, the first in the order indices, batch_size, skip_batches is named."""
    for indices, batch_size, skip, exc_type, bad in [
            (range(10), 0, 0, ValueError, "batch_size"), (range(10), -2, 0, ValueError, "batch_size"),
            (range(10), 2.0, 0, ValueError, "batch_size"), (range(10), 3, -1, ValueError, "skip_batches"),
            (range(10), 3, 5, ValueError, "skip_batches"), (range(9), 3, 4, ValueError, "skip_batches"),
            (range(10), 3, 1.0, ValueError, "skip_batches"), (range(10), True, 0, ValueError, "batch_size"),
            (range(10), 3, True, ValueError, "skip_batches"), (range(10), 0, 99, ValueError, "batch_size"),
            ((i for i in range(10)), 3, 0, TypeError, "indices"), (iter(range(10)), 3, 5, TypeError, "indices"),
            ((i for i in range(10)), 0, -1, TypeError, "indices")]:
        expect_raises(f"SkipBatchSampler({type(indices).__name__} of 10, {batch_size!r}, {skip!r})",
                      lambda: impl.SkipBatchSampler(indices, batch_size, skip), exc_type, bad, SAMPLER_ARGUMENTS)
