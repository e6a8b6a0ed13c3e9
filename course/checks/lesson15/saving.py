"""Lesson 15 checks of ``save_checkpoint``. Core: the full state, an atomic and durable write beside the target,
no save with pending gradients, the unwrapped model, one writer. Hardening: every extra kept as given, no
litter after a failure, the parent directory created and ``os.replace``, the counters' rules, the inputs left
as they were."""
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


def files_in(directory) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir())


# --- the full state ----------------------------------------------------------------------------


@check("save_checkpoint", objective="full_state")
@names_the_rule("every entry of the contract, read with torch.load(path, weights_only=True): model (fp32 stays "
                "fp32), optimizer, scaler, epoch, step, world_size, model_config, one entry per extra keyword")
def save_checkpoint_writes_full_state(impl):
    """fp32 weights, optimizer, scaler, counters, world size, model config and the caller's extras, loadable
    weights_only; entries beyond the contract are allowed."""
    scenario, stop_epoch, stop_step = RESUME_SCALER[0]
    objects, _ = trained(scenario, stop_epoch, stop_step)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    extras = {"batch_size_semantics": "micro_batch", "accum_steps": scenario.accumulation_steps}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        save_objects(impl, path, objects, stop_epoch, stop_step, **extras)
        saved = expect_works("torch.load(checkpoint, weights_only=True)",
                             lambda: torch.load(path, map_location="cpu", weights_only=True),
                             "a dict of tensors, containers and plain values")
    keys = ["epoch", "model", "model_config", "optimizer", "scaler", "step", "world_size", *extras]
    missing = sorted(set(keys) - set(saved))
    if missing:
        fail("entries missing from the checkpoint", missing, [], "hint: one entry per extra keyword, next to model, "
             "optimizer, scaler, epoch, step, world_size and model_config")
    expect_equal("(epoch, step, world_size) and the extras",
                 (saved["epoch"], saved["step"], saved["world_size"], *(saved[k] for k in extras)),
                 (stop_epoch, stop_step, 1, *extras.values()))
    for name, want in model.state_dict().items():
        got = saved["model"][name]
        if got.dtype != want.dtype:
            fail(f"dtype of model.{name} in the checkpoint", got.dtype, want.dtype,
                 "hint: fp32 stays fp32 (fp16 weights are an export, and a resume from them is inexact)")
        expect_tensor_close(f"model.{name} in the checkpoint", got, want, rtol=0.0, atol=0.0)
    expect_optimizer_state_equal("saved optimizer state", saved["optimizer"], optimizer.state_dict())
    expect_equal("saved GradScaler state", saved["scaler"], scaler.state_dict())
    expect_equal("saved model_config", saved["model_config"], dataclasses.asdict(model.config))


def expect_optimizer_state_equal(what, actual: dict, expected: dict) -> None:
    expect_equal(f"{what}: param_groups", actual["param_groups"], expected["param_groups"])
    expect_equal(f"{what}: parameters with state", sorted(actual["state"]), sorted(expected["state"]))
    for index, state in expected["state"].items():
        for key, want in state.items():
            expect_tensor_close(f"{what}: {key} of parameter {index}", actual["state"][index][key], want,
                                rtol=0.0, atol=0.0)


class Progress:
    """An extra with a ``state_dict`` (like an lr scheduler's): the checkpoint stores that dict, not the object."""

    def state_dict(self):
        return {"samples_seen": 12, "tokens_seen": 192}


@check("save_checkpoint")
@names_the_rule("one entry per extra keyword, whatever its value (None and 0 too); an extra with a state_dict() "
                "is stored as that dict, so weights_only=True reads the file; a save leaves no other file")
def save_checkpoint_stores_every_extra(impl):
    """Extras None and 0 get their entries (upstream drops a None), an object with a state_dict is stored by it
    (upstream's rule), and the directory holds the checkpoint alone after the save."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        save_objects(impl, path, objects, 0, 2, progress=Progress(), best_val_loss=None, stalled_evals=0)
        saved = expect_works("torch.load(checkpoint, weights_only=True)",
                             lambda: torch.load(path, map_location="cpu", weights_only=True),
                             "a dict of tensors, containers and plain values",
                             "hint: an extra with a state_dict() is stored by it")
        expect_equal("files in the checkpoint directory after a save", files_in(tmp), ["resume.pth"])
    expect_equal("extras best_val_loss=None, stalled_evals=0 in the checkpoint",
                 (saved.get("best_val_loss", "missing"), saved.get("stalled_evals", "missing")), (None, 0))
    expect_equal("extra 'progress' (an object with a state_dict) in the checkpoint", saved["progress"],
                 Progress().state_dict())


# --- an atomic, durable write ------------------------------------------------------------------


class Interrupted(BaseException):
    """A BaseException that is neither Exception nor KeyboardInterrupt (like a job scheduler's own signal)."""


class CrashWhilePickled:
    """An extra that raises ``error`` when ``torch.save`` reaches it, after the model's bytes are written:
    a failure in the middle of a save (an unpicklable value, a full disk, Ctrl-C)."""

    def __init__(self, error: BaseException):
        self.error = error

    def __reduce_ex__(self, protocol):
        raise self.error


CRASHES = (OSError("simulated full disk in the middle of torch.save"), KeyboardInterrupt(), SystemExit(3),
           Interrupted("a signal handler's"))


def crash_a_save(impl, path, objects, error: BaseException) -> str:
    """A save of ``objects`` onto ``path`` that fails halfway with ``error``, which must propagate; returns what
    it was (for the messages)."""
    where = f"save_checkpoint failing halfway with {type(error).__name__}"
    try:
        save_objects(impl, path, objects, 0, 4, crash=CrashWhilePickled(error))
    except type(error):
        return where
    except NotImplementedError:
        raise
    except BaseException as exc:
        fail(where, f"{type(exc).__name__}: {exc}", f"the {type(error).__name__} propagates")
    fail(where, "returned normally", f"the {type(error).__name__} propagates",
         "hint: a failed save must not pass for a written one: re-raise after cleaning up")


@check("save_checkpoint", objective="atomic_save", hidden=True, uses=("load_checkpoint",))
@names_the_rule("write the new checkpoint to a temporary file, then rename it onto the path: the previous "
                "checkpoint is never touched until the new one replaces it; re-raise the failure")
def save_checkpoint_is_atomic(impl):
    """A save that fails halfway (OSError, KeyboardInterrupt, SystemExit, a BaseException of its own) re-raises
    and leaves the previous checkpoint byte-identical and loadable."""
    with good_checkpoint(impl) as (objects, fresh, _, path):
        before = path.read_bytes()
        for error in CRASHES:
            where = crash_a_save(impl, path, objects, error)
            after = path.read_bytes() if path.is_file() else None
            if after != before:
                fail(f"{path.name} after a {where}", "missing" if after is None else f"{len(after)} bytes, changed",
                     f"the previous checkpoint, {len(before)} bytes, unchanged",
                     "hint: write to a temporary file in the same directory, then os.replace it onto the path")
        checkpoint = impl.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer, scaler=fresh.scaler)
        expect_equal("(epoch, step) of the previous checkpoint", (checkpoint["epoch"], checkpoint["step"]), (0, 2))


@check("save_checkpoint")
@names_the_rule("on ANY failure, KeyboardInterrupt, SystemExit and every other BaseException included (catch "
                "BaseException or use finally), delete the temporary file and re-raise")
def save_checkpoint_cleans_up_after_a_failure(impl):
    """A save that fails halfway, with an Exception or any other BaseException, leaves no temporary file."""
    with good_checkpoint(impl) as (objects, _, tmp, path):
        for error in CRASHES:
            where = crash_a_save(impl, path, objects, error)
            expect_equal(f"files in the checkpoint directory after a {where}", files_in(tmp), ["good.pth"])


class FileOperations:
    """Spies on os.replace / os.rename (the rename onto the checkpoint) and os.fsync / os.fdatasync (what reached
    the disk): ``calls`` lists them in order with the file's inode and size at that moment."""

    RENAMES, SYNCS = ("replace", "rename"), ("fsync", "fdatasync")

    def __init__(self):
        self.calls = []
        self.real = {name: getattr(os, name) for name in self.RENAMES + self.SYNCS if hasattr(os, name)}

    def __enter__(self):
        for name, real in self.real.items():
            setattr(os, name, self._spy(name, real))
        return self

    def __exit__(self, *exc):
        for name, real in self.real.items():
            setattr(os, name, real)

    def _spy(self, name, real):
        def rename(src, dst, *args, **kwargs):
            self.calls.append((name, Path(src), Path(dst), (os.stat(src).st_ino, os.stat(src).st_size)))
            return real(src, dst, *args, **kwargs)

        def sync(fd):  # os.fsync takes a descriptor or an object with fileno()
            number = fd if isinstance(fd, int) else fd.fileno()
            self.calls.append((name, (os.fstat(number).st_ino, os.fstat(number).st_size)))
            return real(fd)
        return rename if name in self.RENAMES else sync

    def renames_onto(self, path: Path) -> list[tuple[int, Path, tuple[int, int]]]:
        """(position in calls, source, (inode, size) of the source) of each rename onto ``path``."""
        return [(i, call[1], call[3]) for i, call in enumerate(self.calls)
                if call[0] in self.RENAMES and call[2] == path]

    def synced_sizes(self, inode: int, before: int) -> list[int]:
        """Sizes of the file ``inode`` at each sync among the first ``before`` calls."""
        return [call[1][1] for call in self.calls[:before] if call[0] in self.SYNCS and call[1][0] == inode]


@check("save_checkpoint", objective="atomic_save", hidden=True)
@names_the_rule("a temporary file in the target's own directory (a rename is atomic only within one file system), "
                "its bytes fsync'd before it is renamed onto the path; path may be a str")
def save_checkpoint_writes_next_to_the_target(impl):
    """The new bytes go to a temporary file in the target's directory (os.replace is a rename only there), which
    is fsync'd, all its bytes on disk, before it is renamed onto the target (path given as a str)."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run" / "resume.pth"
        path.parent.mkdir()
        with FileOperations() as spy:
            expect_works(f"save_checkpoint(str path) into {path.parent}",
                         lambda: save_objects(impl, str(path), objects, 0, 2), "the checkpoint written",
                         "hint: path may be a str: Path(path) before path.parent")
        renames = spy.renames_onto(path)
        if not renames:
            fail("renames of a temporary file onto the checkpoint during the save", 0, 1,
                 "hint: torch.save into a temporary file, then os.replace(temporary, path): never write the path "
                 "itself")
        index, source, (inode, size) = renames[-1]
        if source.parent.resolve() != path.parent.resolve():
            fail("directory of the temporary file renamed onto the checkpoint", str(source.parent),
                 str(path.parent), "hint: a temporary file in the target's own directory (tempfile.mkstemp("
                 "dir=path.parent)): a rename is atomic only within one file system")
        synced = spy.synced_sizes(inode, index)
        if size not in synced:
            fail("bytes of the temporary file on disk when os.fsync'd, before it is renamed onto the checkpoint",
                 f"fsync'd with {synced} bytes" if synced else "never fsync'd", f"{size} bytes (all of it)",
                 "hint: fsync the temporary file itself: torch.save into it, handle.flush(), "
                 "os.fsync(handle.fileno()), then os.replace")


@check("save_checkpoint")
@names_the_rule("create the parent directory; rename with os.replace, not os.rename (on Windows os.rename refuses "
                "a target that exists)")
def save_checkpoint_creates_the_directory_and_uses_os_replace(impl):
    """The parent directory is created; os.rename is not used: on Windows it refuses a target that exists, i.e.
    every save after the first."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "new" / "run" / "resume.pth"
        with FileOperations() as spy:
            expect_works(f"save_checkpoint into {path.parent}, which does not exist yet",
                         lambda: save_objects(impl, path, objects, 0, 2),
                         "the directory is created and the checkpoint written",
                         "hint: path.parent.mkdir(parents=True, exist_ok=True)")
        renamed = [str(call[2]) for call in spy.calls if call[0] == "rename"]
        if renamed:
            fail("os.rename calls during the save", renamed, [],
                 "hint: os.replace, not os.rename: both are atomic on POSIX, but on Windows os.rename raises "
                 "FileExistsError when the checkpoint already exists (every save after the first)")


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
    (gradients of a backward, no optimizer step yet) the save is refused, writing nothing; so is one non-zero
    gradient anywhere: on a parameter behind a frozen one (grad None), on the last parameter only."""
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
