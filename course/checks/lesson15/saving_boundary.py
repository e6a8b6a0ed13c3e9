"""Lesson 15 checks of ``save_checkpoint`` at an update boundary, of the model itself and its one writer, and the
hardening tier's argument rules.
"""
from __future__ import annotations

import copy
import dataclasses
import tempfile
from pathlib import Path

import torch

from course.runs import full_epoch_batches, save_objects
from course.runs.scenarios import RESUME_BASE

from ..framework import check, expect_equal, expect_raises, fail, same_value
from .checks import CompiledWrapper, expect_works, fake_ddp, fake_rank, names_the_rule, trained
from .saving import files_in


# --- an update boundary ------------------------------------------------------------------------


def set_gradients(model, frozen: set, pending: dict) -> None:
    """Frozen parameters get requires_grad False and grad None, the others a zero gradient whose first entries are
    ``pending``'s values."""
    for index, param in enumerate(model.parameters()):
        param.requires_grad_(index not in frozen)
        param.grad = None if index in frozen else torch.zeros_like(param)
        if index in pending:
            values = torch.tensor(pending[index])
            param.grad.view(-1)[:len(values)] = values


ANY_PARAMETER = "look at every parameter: one with a non-zero gradient is pending, whatever the others hold"


def pending_cases(count: int):
    """(what, indices of frozen parameters, {parameter index: gradient values}, the hint when it is missed) over
    ``count`` parameters; every other parameter that is not frozen holds a zero gradient. Nothing pending (no
    values): the save must work."""
    yield "the embedding frozen (grad None) and zero gradients elsewhere", {0}, {}, ""
    yield ("the embedding frozen (fine-tuning) and a pending gradient on the next parameter", {0}, {1: (1.0,)},
           f"{ANY_PARAMETER}, also when a frozen parameter's grad is None")
    yield "a pending gradient on the last parameter only", set(), {count - 1: (0.5,)}, ANY_PARAMETER
    yield ("the embedding frozen and a pending gradient on a middle parameter only", {0}, {count // 2: (-2.0,)},
           ANY_PARAMETER)
    yield ("a pending gradient whose entries sum to zero (+1, -1)", set(), {1: (1.0, -1.0)},
           "look at every entry: a gradient with any non-zero entry is pending, also when its entries cancel")


def expect_save_refused(impl, where: str, path, objects, hint: str) -> None:
    """A save at (0, 2) raises (any error: the refusal); a save that returns is the mistake."""
    try:
        save_objects(impl, path, objects, 0, 2)
    except NotImplementedError:
        raise
    except Exception:
        return
    fail(f"save_checkpoint with {where}", "the checkpoint was written", "a refusal (an error)", f"hint: {hint}")


@check("save_checkpoint", objective="update_boundary", hidden=True)
@names_the_rule("save only at an update boundary: refuse when any parameter's gradient holds a non-zero value")
def save_checkpoint_refuses_pending_gradients(impl):
    """Zero gradients (zero_grad(set_to_none=False)) are not pending: the save works. Mid-accumulation
    (gradients of a backward, no optimizer step yet) the save is refused, writing nothing, on rank 1 of 2 too;
    so is one non-zero gradient anywhere: on a parameter behind a frozen one (grad None), on the last parameter
    only, one whose entries cancel (+1, -1)."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    model = objects.model
    input_ids, labels = full_epoch_batches(RESUME_BASE, 0)[2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        model(input_ids, labels=labels).loss.backward()
        objects.optimizer.zero_grad(set_to_none=False)
        expect_works("save_checkpoint after optimizer.zero_grad(set_to_none=False) (all gradients are zero tensors)",
                     lambda: save_objects(impl, path, objects, 0, 2), "the checkpoint is written",
                     "hint: a zero gradient is not a pending one: test for non-zero values, not for `grad is not None`")
        path.unlink()
        model(input_ids, labels=labels).loss.backward()
        expect_save_refused(impl, "pending gradients (a backward after the last update, no optimizer step yet)",
                            path, objects, "gradients accumulated since the last update are pending: a checkpoint "
                            "cannot carry them, so refuse to save (param.grad holds non-zero values)")
        with fake_rank(1, 2):   # rank 0 refuses: a rank that returned instead would go on alone
            expect_save_refused(impl, "pending gradients on rank 1 of 2", path, objects,
                                "every rank refuses a pending gradient, rank 0 and the ranks that write nothing")
        for what, frozen, pending, hint in pending_cases(len(list(model.parameters()))):
            set_gradients(model, frozen, pending)
            if pending:
                expect_save_refused(impl, what, path, objects, hint)
            else:
                expect_works(f"save_checkpoint with {what}", lambda: save_objects(impl, path, objects, 0, 2),
                             "the checkpoint is written (no gradient is pending)",
                             "hint: a frozen parameter's grad is None: nothing pending there")
                path.unlink()
        expect_equal("files written by the refused saves", files_in(tmp), [])


@check("save_checkpoint")
@names_the_rule("a gradient with any non-zero entry is pending, NaN and inf included, also when its entries sum to "
                "zero; refuse it with a ValueError naming accumulation")
def save_checkpoint_refuses_every_pending_gradient_with_a_value_error(impl):
    """A gradient whose entries sum to zero (+1, -1), a NaN or an inf gradient is pending too; every refusal, the
    plain mid-accumulation one included, is a ValueError naming 'accumulation'."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    model = objects.model
    count = len(list(model.parameters()))
    nan, inf = float("nan"), float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        for what, frozen, pending in (
                ("a pending gradient on parameter 1", set(), {1: (1.0,)}),
                ("a pending gradient whose entries sum to zero (+1, -1)", set(), {1: (1.0, -1.0)}),
                ("a NaN gradient (an fp16 overflow not yet skipped)", set(), {2: (nan,)}),
                ("an inf gradient", {0}, {count - 1: (0.0, -inf)})):
            set_gradients(model, frozen, pending)
            expect_raises(f"save_checkpoint with {what}", lambda: save_objects(impl, path, objects, 0, 2),
                          ValueError, "accumulation")
        expect_equal("files written by the refused saves", files_in(tmp), [])


# --- the model itself, one writer --------------------------------------------------------------


def unwrap_hint(saved_model: dict) -> str:
    """The wrapper whose prefix the saved keys still carry."""
    prefixes = {key.split(".")[0] for key in saved_model}
    if "_orig_mod" in prefixes:
        return "unwrap ._orig_mod (torch.compile) too, in a loop until neither wrapper is left"
    if "module" in prefixes:
        return "unwrap .module (DistributedDataParallel) before reading state_dict()"
    return "save model.state_dict() of the model itself, every key of it"


@check("save_checkpoint", objective="unwrap")
@names_the_rule("save the model itself: unwrap .module (DistributedDataParallel) and ._orig_mod (torch.compile) "
                "until neither is left, then read state_dict() and config")
def save_checkpoint_unwraps_ddp_and_compile(impl):
    """A model wrapped by DistributedDataParallel (keys 'module.'), torch.compile ('_orig_mod.') or both is
    saved as the model itself: the same keys as model.state_dict(), and its config."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    model = objects.model
    wrapped = {"DDP": fake_ddp(model), "torch.compile": CompiledWrapper(model),
               "torch.compile of DDP": CompiledWrapper(fake_ddp(model))}
    with tempfile.TemporaryDirectory() as tmp:
        for how, wrapper in wrapped.items():
            path = Path(tmp) / "resume.pth"
            impl.save_checkpoint(path, model=wrapper, optimizer=objects.optimizer, scaler=objects.scaler, epoch=0,
                                 step=2)
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if sorted(saved["model"]) != sorted(model.state_dict()):
                fail(f"model keys saved from a {how} wrapper (first 3 of {len(saved['model'])})",
                     sorted(saved["model"])[:3], sorted(model.state_dict())[:3], f"hint: {unwrap_hint(saved['model'])}")
            expect_equal(f"model_config saved from a {how} wrapper", saved.get("model_config"),
                         dataclasses.asdict(model.config))


@check("save_checkpoint", objective="one_writer", hidden=True)
@names_the_rule("under torch.distributed only rank 0 (dist.get_rank() == 0) writes; world_size is the process "
                "group's size")
def save_checkpoint_writes_on_rank_0_only(impl):
    """Under torch.distributed only rank 0 writes (every rank holds the same state); it records world_size."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        with fake_rank(1, 2):
            save_objects(impl, path, objects, 0, 2)
        expect_equal("files written by rank 1 of 2", files_in(tmp), [])
        with fake_rank(0, 2):
            save_objects(impl, path, objects, 0, 2)
        expect_equal("files written by rank 0 of 2", files_in(tmp), ["resume.pth"])
        expect_equal("world_size saved by rank 0 of 2", torch.load(path, weights_only=True)["world_size"], 2)


# --- the hardening tier's argument rules -------------------------------------------------------


SAVE_ARGUMENTS = ("path", "model", "optimizer", "scaler", "epoch", "step")


@check("save_checkpoint")
@names_the_rule("epoch and step are ints >= 0 (1.0 is a float, True a bool, 0 is valid), checked on every rank; "
                "an extra named like a checkpoint key is refused; refusals write nothing")
def save_checkpoint_rejects_bad_counters(impl):
    """An epoch or step that is not an int >= 0 (a float, a bool), or an extra named like a checkpoint key, raises
    ValueError naming it, before anything is written, on rank 1 of 2 too; epoch 0, step 0 is saved."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        for epoch, step, bad in ((-1, 2, "epoch"), (0, -1, "step"), (1.0, 2, "epoch"), (0, 2.0, "step"),
                                 (0, True, "step"), (False, 2, "epoch")):
            expect_raises(f"save_checkpoint(epoch={epoch!r}, step={step!r})",
                          lambda: save_objects(impl, path, objects, epoch, step), ValueError, bad, SAVE_ARGUMENTS)
        with fake_rank(1, 2):
            expect_raises("save_checkpoint(step=-1) on rank 1 of 2 (every rank validates)",
                          lambda: save_objects(impl, path, objects, 0, -1), ValueError, "step", SAVE_ARGUMENTS)
        for key in ("world_size", "model_config"):
            expect_raises(f"save_checkpoint(..., {key}=...) (an extra that would overwrite the saved {key})",
                          lambda: save_objects(impl, path, objects, 0, 2, **{key: 3}), ValueError, key,
                          SAVE_ARGUMENTS + (key,))
        expect_equal("files written by the refused saves", files_in(tmp), [])
        expect_works("save_checkpoint(epoch=0, step=0) (the start of a run)",
                     lambda: save_objects(impl, path, objects, 0, 0), "the checkpoint is written")
        expect_equal("files written by a save at epoch 0, step 0", files_in(tmp), [path.name])


def inputs_snapshot(model, optimizer, scaler, extra: dict) -> dict:
    """Everything a save is given, by what the caller can observe of it."""
    return {"train/eval mode of each module": {name: m.training for name, m in model.named_modules()},
            "requires_grad of each parameter": {name: p.requires_grad for name, p in model.named_parameters()},
            "gradients": {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()},
            "model state": copy.deepcopy(model.state_dict()), "optimizer state": copy.deepcopy(optimizer.state_dict()),
            "GradScaler state": scaler.state_dict(), "extras": copy.deepcopy(extra)}


def expect_same_inputs(where: str, after: dict, before: dict) -> None:
    """Each snapshot entry is a dict; its keys whose values changed are listed."""
    for what, was in before.items():
        now = after[what]
        changed = sorted(str(k) for k in was.keys() | now.keys() if not same_value(now.get(k), was.get(k)))
        if changed:
            fail(f"{what} after {where}: entries changed (first 5)", changed[:5], [],
                 "hint: a save only reads what it is given: no model.eval()/train(), no zero_grad, no "
                 "requires_grad change, no edit of the states or the extras")


@check("save_checkpoint")
@names_the_rule("a save leaves what it is given as it was: every module's train/eval mode, requires_grad, the "
                "gradients (zero tensors stay zero tensors), the model, optimizer and scaler states and the extras")
def save_checkpoint_leaves_its_inputs_unchanged(impl):
    """After a save of a model in train mode, in eval mode, or in train mode with one block in eval (wrapped in
    DDP or not), with a frozen embedding and zero gradients, every module keeps its mode, every parameter its
    requires_grad and gradient; the states and the extras are unchanged (a model left in eval mode, say, trains
    on without dropout and MoE aux loss)."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    model.model.embed_tokens.weight.requires_grad_(False)
    input_ids, labels = full_epoch_batches(RESUME_BASE, 0)[2]
    model(input_ids, labels=labels).loss.backward()
    optimizer.zero_grad(set_to_none=False)
    with tempfile.TemporaryDirectory() as tmp:
        for how, wrap, set_modes in (
                ("a model in train mode", lambda m: m, lambda m: m.train()),
                ("a model in eval mode", lambda m: m, lambda m: m.eval()),
                ("a DDP-wrapped model in train mode whose layer-0 MLP is in eval mode", fake_ddp,
                 lambda m: m.train().model.layers[0].mlp.eval())):
            set_modes(model)
            extra = {"run": {"lr": [5e-4, 1e-4], "best": None}}
            before = inputs_snapshot(model, optimizer, scaler, extra)
            where = f"save_checkpoint of {how}"
            expect_works(where, lambda: impl.save_checkpoint(Path(tmp) / "resume.pth", model=wrap(model),
                         optimizer=optimizer, scaler=scaler, epoch=0, step=2, **extra), "the checkpoint is written")
            expect_same_inputs(where, inputs_snapshot(model, optimizer, scaler, extra), before)
