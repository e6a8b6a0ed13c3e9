"""Lesson 15 checks of ``save_checkpoint``: full state, atomic write next to the target, no pending
gradients, unwrapped DDP / compile state, rank 0 only, valid counters."""
from __future__ import annotations

import copy
import dataclasses
import os
import tempfile
from pathlib import Path

import torch

from course.runs import full_epoch_batches, save_objects
from course.runs.scenarios import RESUME_BASE, RESUME_SCALER

from ..framework import check, expect_equal, expect_raises, expect_tensor_close, fail, same_value
from .checks import CompiledWrapper, expect_works, fake_ddp, fake_rank, good_checkpoint, names_the_rule, trained


# --- save_checkpoint ---------------------------------------------------------------------------


@check("save_checkpoint", objective="full_state")
@names_the_rule('every key of the contract; tensors keep their dtype and value (fp32 stays fp32: fp16 weights are an export); one entry per extra keyword, None and 0 included; an extra with a state_dict() is stored as that dict, so weights_only=True reads the file')
def save_checkpoint_writes_full_state(impl):
    """fp32 weights, optimizer, scaler, counters, world size, model config and extras (also None and 0: one entry
    per extra keyword), loadable weights_only."""
    scenario, stop_epoch, stop_step = RESUME_SCALER[0]
    objects, _ = trained(scenario, stop_epoch, stop_step)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        save_objects(impl, path, objects, stop_epoch, stop_step, batch_size_semantics="micro_batch",
                     progress=Progress(), best_val_loss=None, stalled_evals=0)
        saved = expect_works("torch.load(checkpoint, weights_only=True)",
                             lambda: torch.load(path, map_location="cpu", weights_only=True),
                             "a dict of tensors, containers and plain values",
                             "hint: an extra with a state_dict() is stored by it")
        expect_equal("files in the checkpoint directory after a save", sorted(p.name for p in Path(tmp).iterdir()),
                     ["resume.pth"])
    keys = ["batch_size_semantics", "best_val_loss", "epoch", "model", "model_config", "optimizer", "progress",
            "scaler", "stalled_evals", "step", "world_size"]
    if sorted(saved) != keys:
        fail("checkpoint keys", sorted(saved), keys, "hint: one entry per extra keyword, whatever its value (upstream "
             "drops an extra whose value is None)")
    expect_equal("extras best_val_loss=None, stalled_evals=0 in the checkpoint",
                 (saved["best_val_loss"], saved["stalled_evals"]), (None, 0))
    expect_equal("extra 'progress' (an object with a state_dict) in the checkpoint", saved["progress"],
                 Progress().state_dict())
    expect_equal("(epoch, step, world_size, batch_size_semantics)",
                 (saved["epoch"], saved["step"], saved["world_size"], saved["batch_size_semantics"]),
                 (stop_epoch, stop_step, 1, "micro_batch"))
    for name, want in model.state_dict().items():
        got = saved["model"][name]
        expect_equal(f"dtype of model.{name} in the checkpoint", got.dtype, want.dtype)
        expect_tensor_close(f"model.{name} in the checkpoint", got, want, rtol=0.0, atol=0.0)
    expect_optimizer_state_equal("saved optimizer state", saved["optimizer"], optimizer.state_dict())
    expect_equal("saved GradScaler state", saved["scaler"], scaler.state_dict())
    expect_equal("saved model_config hidden_size/use_moe",
                 (saved["model_config"]["hidden_size"], saved["model_config"]["use_moe"]),
                 (scenario.hidden_size, scenario.use_moe))


class Progress:
    """An extra with a ``state_dict`` (like an lr scheduler's): the checkpoint stores that dict, not the object."""

    def state_dict(self):
        return {"samples_seen": 12, "tokens_seen": 192}


def expect_optimizer_state_equal(what, actual: dict, expected: dict) -> None:
    expect_equal(f"{what}: param_groups", actual["param_groups"], expected["param_groups"])
    expect_equal(f"{what}: parameters with state", sorted(actual["state"]), sorted(expected["state"]))
    for index, state in expected["state"].items():
        for key, want in state.items():
            expect_tensor_close(f"{what}: {key} of parameter {index}", actual["state"][index][key], want,
                                rtol=0.0, atol=0.0)


class Interrupted(BaseException):
    """A BaseException that is neither Exception nor KeyboardInterrupt (like a job scheduler's own signal)."""


class CrashWhilePickled:
    """An extra that raises ``error`` when ``torch.save`` reaches it, after the model's bytes are written:
    a failure in the middle of a save (an unpicklable value, a full disk, Ctrl-C)."""

    def __init__(self, error: BaseException):
        self.error = error

    def __reduce_ex__(self, protocol):
        raise self.error


@check("save_checkpoint", objective="atomic_save", hidden=True, uses=("load_checkpoint",))
@names_the_rule('on ANY failure, KeyboardInterrupt, SystemExit and every other BaseException included (catch BaseException), delete the temporary file and re-raise; the previous checkpoint is never touched until the new one replaces it')
def save_checkpoint_is_atomic(impl):
    """A save that fails halfway (OSError, KeyboardInterrupt, SystemExit, a BaseException of its own) re-raises
    and leaves the previous checkpoint byte-identical and loadable, and no temporary file."""
    with good_checkpoint(impl) as (objects, fresh, tmp, path):
        before = path.read_bytes()
        for error in (OSError("simulated full disk in the middle of torch.save"), KeyboardInterrupt(), SystemExit(3),
                      Interrupted("a signal handler's")):
            where = f"save_checkpoint failing halfway with {type(error).__name__}"
            try:
                save_objects(impl, path, objects, 0, 4, crash=CrashWhilePickled(error))
            except type(error):
                pass
            except NotImplementedError:
                raise
            except BaseException as exc:
                fail(where, f"{type(exc).__name__}: {exc}", f"the {type(error).__name__} propagates")
            else:
                fail(where, "returned normally", f"the {type(error).__name__} propagates")
            after = path.read_bytes() if path.is_file() else None
            if after != before:
                fail(f"{path.name} after a {where}", "missing" if after is None else f"{len(after)} bytes, changed",
                     f"the previous checkpoint, {len(before)} bytes, unchanged",
                     "write to a temporary file in the same directory, then os.replace it onto the path")
            expect_equal(f"files in the checkpoint directory after a {where}",
                         sorted(p.name for p in Path(tmp).iterdir()), ["good.pth"])
        checkpoint = impl.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer, scaler=fresh.scaler)
        expect_equal("(epoch, step) of the previous checkpoint", (checkpoint["epoch"], checkpoint["step"]), (0, 2))


@check("save_checkpoint", objective="update_boundary", hidden=True)
@names_the_rule('save only at an update boundary: a gradient with any non-zero entry (NaN and inf included) on ANY parameter is pending (ValueError naming accumulation); None (a frozen parameter) or zero gradients are not')
def save_checkpoint_refuses_pending_gradients(impl):
    """Zero gradients (zero_grad(set_to_none=False)) are not pending: the save works. Mid-accumulation
    (non-zero gradients, no optimizer step yet) a save raises ValueError naming 'accumulation', writing nothing;
    so does one non-zero gradient anywhere: on a later parameter behind a frozen one (grad None), on the last
    parameter only, with entries that sum to zero, NaN or inf."""
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
        expect_raises("save_checkpoint with pending gradients (micro-step 3 of a K=2 window)",
                      lambda: save_objects(impl, path, objects, 0, 3), ValueError, "accumulation")
        for what, frozen, pending in gradient_cases(len(list(model.parameters()))):
            set_gradients(model, frozen, pending)
            if pending:
                expect_raises(f"save_checkpoint with {what}", lambda: save_objects(impl, path, objects, 0, 2),
                              ValueError, "accumulation")
            else:
                expect_works(f"save_checkpoint with {what}", lambda: save_objects(impl, path, objects, 0, 2),
                             "the checkpoint is written (no gradient is pending)")
                path.unlink()
        expect_equal("files written by the refused saves", sorted(p.name for p in Path(tmp).iterdir()), [])


def gradient_cases(count: int):
    """(what, indices of frozen parameters, {parameter index: gradient values}) over ``count`` parameters; every
    other parameter that is not frozen holds a zero gradient. No pending gradient: the save must work."""
    nan, inf = float("nan"), float("inf")
    yield "the embedding frozen (grad None) and zero gradients elsewhere", {0}, {}
    yield "the embedding frozen (fine-tuning) and a pending gradient on the next parameter", {0}, {1: (1.0,)}
    yield "a pending gradient on the last parameter only", set(), {count - 1: (0.5,)}
    yield "the embedding frozen and a pending gradient on a middle parameter only", {0}, {count // 2: (-2.0,)}
    yield "a pending gradient whose entries sum to zero (+1, -1)", set(), {1: (1.0, -1.0)}
    yield "a NaN gradient (an fp16 overflow not yet skipped)", set(), {2: (nan,)}
    yield "an inf gradient", {0}, {count - 1: (0.0, -inf)}


def set_gradients(model, frozen: set, pending: dict) -> None:
    """Frozen parameters get requires_grad False and grad None, the others a zero gradient whose first entries are
    ``pending``'s values."""
    for index, param in enumerate(model.parameters()):
        param.requires_grad_(index not in frozen)
        param.grad = None if index in frozen else torch.zeros_like(param)
        if index in pending:
            values = torch.tensor(pending[index])
            param.grad.view(-1)[:len(values)] = values


@check("save_checkpoint", objective="atomic_save", hidden=True)
@names_the_rule("create the parent directory (path may be a str); os.replace is an atomic rename only within one file system, so the temporary file lies in the target's directory, and its bytes are fsync'd before the name switches")
def save_checkpoint_writes_next_to_the_target(impl):
    """The parent directory (of a str path) is created; the temporary file lies in the target's directory
    (os.replace is a rename only there) and is fsync'd, all its bytes flushed, before os.replace puts it onto
    the target. os.rename does not do: on Windows it refuses a target that exists, i.e. every save after the
    first."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    calls = []
    real_replace, real_fsync, real_rename = os.replace, os.fsync, os.rename

    def spy_rename(src, dst, *args, **kwargs):
        calls.append(("rename", Path(src), Path(dst)))
        return real_rename(src, dst, *args, **kwargs)

    def spy_replace(src, dst, *args, **kwargs):
        calls.append(("replace", Path(src), Path(dst), (os.stat(src).st_ino, os.stat(src).st_size)))
        return real_replace(src, dst, *args, **kwargs)

    def spy_fsync(fd):  # the file (inode) and the bytes it holds on disk when fsync'd
        calls.append(("fsync", (os.fstat(fd).st_ino, os.fstat(fd).st_size)))
        return real_fsync(fd)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "new" / "run" / "resume.pth"
        os.replace, os.fsync, os.rename = spy_replace, spy_fsync, spy_rename
        try:
            expect_works(f"save_checkpoint(str path) into {path.parent}, which does not exist yet",
                         lambda: save_objects(impl, str(path), objects, 0, 2),
                         "the directory is created and the checkpoint written")
        finally:
            os.replace, os.fsync, os.rename = real_replace, real_fsync, real_rename
        replaces = [(i, call[1], call[3]) for i, call in enumerate(calls) if call[0] == "replace" and call[2] == path]
        if any(call[0] == "rename" for call in calls):
            fail("os.rename calls during the save", [str(call[2]) for call in calls if call[0] == "rename"], [],
                 "hint: os.replace, not os.rename: both are atomic on POSIX, but on Windows os.rename raises "
                 "FileExistsError when the checkpoint already exists (every save after the first)")
        if len(replaces) != 1:
            fail("os.replace(temporary file, path) calls during the save", len(replaces), 1,
                 "hint: os.replace from the os module (shutil.move may copy instead of renaming)")
        index, source, (inode, size) = replaces[0]
        expect_equal("directory of the temporary file that os.replace moves onto the checkpoint",
                     str(source.parent.resolve()), str(path.parent.resolve()))
        synced = [call[1][1] for call in calls[:index] if call[0] == "fsync" and call[1][0] == inode]
        if size not in synced:
            fail("bytes of the temporary file on disk when os.fsync'd, before os.replace moves it onto the checkpoint",
                 f"fsync'd with {synced} bytes" if synced else "never fsync'd", f"{size} bytes (all of it)",
                 "torch.save into the temporary file, handle.flush(), os.fsync(handle.fileno()), then os.replace")


@check("save_checkpoint", objective="unwrap")
@names_the_rule('save the model itself: unwrap .module (DistributedDataParallel) and ._orig_mod (torch.compile) until neither is left, then read state_dict() and config')
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
            expect_equal(f"model keys saved from a {how} wrapper (first 3 of {len(saved['model'])})",
                         sorted(saved["model"])[:3], sorted(model.state_dict())[:3])
            expect_equal(f"all model keys saved from a {how} wrapper", sorted(saved["model"]),
                         sorted(model.state_dict()))
            expect_equal(f"model_config saved from a {how} wrapper", saved.get("model_config"),
                         dataclasses.asdict(model.config))


@check("save_checkpoint", objective="unwrap", hidden=True)
@names_the_rule("every rank validates; only rank 0 (dist.get_rank() == 0) writes; world_size is the process group's size")
def save_checkpoint_writes_on_rank_0_only(impl):
    """Under torch.distributed only rank 0 writes (every rank holds the same state); it records world_size."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        with fake_rank(1, 2):
            save_objects(impl, path, objects, 0, 2)
            expect_raises("save_checkpoint(step=-1) on rank 1 of 2 (every rank validates)",
                          lambda: save_objects(impl, path, objects, 0, -1), ValueError, "step", SAVE_ARGUMENTS)
        expect_equal("files written by rank 1 of 2", sorted(p.name for p in Path(tmp).iterdir()), [])
        with fake_rank(0, 2):
            save_objects(impl, path, objects, 0, 2)
        expect_equal("files written by rank 0 of 2", sorted(p.name for p in Path(tmp).iterdir()), ["resume.pth"])
        expect_equal("world_size saved by rank 0 of 2", torch.load(path, weights_only=True)["world_size"], 2)


SAVE_ARGUMENTS = ("path", "model", "optimizer", "scaler", "epoch", "step")


@check("save_checkpoint", hidden=True)
@names_the_rule('epoch and step are ints >= 0 (1.0 is a float, True a bool, 0 is valid); an extra named like a checkpoint key is refused; refusals write nothing')
def save_checkpoint_rejects_bad_counters(impl):
    """An epoch or step that is not an int >= 0 (a float, a bool), or an extra named like a checkpoint key, raises
    ValueError naming it, before anything is written; epoch 0, step 0 is saved."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        for epoch, step, bad in ((-1, 2, "epoch"), (0, -1, "step"), (1.0, 2, "epoch"), (0, 2.0, "step"),
                                 (0, True, "step"), (False, 2, "epoch")):
            expect_raises(f"save_checkpoint(epoch={epoch!r}, step={step!r})",
                          lambda: save_objects(impl, path, objects, epoch, step), ValueError, bad, SAVE_ARGUMENTS)
        for key in ("world_size", "model_config"):
            expect_raises(f"save_checkpoint(..., {key}=...) (an extra that would overwrite the saved {key})",
                          lambda: save_objects(impl, path, objects, 0, 2, **{key: 3}), ValueError, key,
                          SAVE_ARGUMENTS + (key,))
        expect_equal("files written by the refused saves", sorted(p.name for p in Path(tmp).iterdir()), [])
        expect_works("save_checkpoint(epoch=0, step=0) (the start of a run)",
                     lambda: save_objects(impl, path, objects, 0, 0), "the checkpoint is written")
        expect_equal("files written by a save at epoch 0, step 0", sorted(p.name for p in Path(tmp).iterdir()),
                     [path.name])


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


@check("save_checkpoint", hidden=True)
@names_the_rule("a save leaves what it is given as it was: every module's train/eval mode, requires_grad, the gradients (zero tensors stay zero tensors), the model, optimizer and scaler states and the extras")
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
