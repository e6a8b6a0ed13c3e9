"""Lesson 15 checks of ``save_checkpoint``. Core: the full state, an atomic and durable write beside the target,
no save with pending gradients, the unwrapped model, one writer. Hardening: every extra kept as given, no
litter after a failure, the parent directory created and ``os.replace``, the counters' rules, the inputs left
as they were."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path

import torch

from course.runs import save_objects
from course.runs.scenarios import RESUME_BASE, RESUME_SCALER

from ..framework import check, expect_equal, expect_tensor_close, fail
from .checks import expect_works, good_checkpoint, names_the_rule, trained


def files_in(directory) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir())


@contextlib.contextmanager
def working_directory(directory):
    """Inside the block the current directory is ``directory`` (contextlib.chdir needs Python 3.11)."""
    before = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


# --- the full state ----------------------------------------------------------------------------


NO_SCALER = "hint: scaler may be None (a run without a GradScaler): its entry is None, there is no state to save"


@check("save_checkpoint", objective="full_state")
@names_the_rule("every entry of the contract, read with torch.load(path, weights_only=True): model (fp32 stays "
                "fp32), optimizer, scaler (None without one), epoch, step, world_size, model_config, one entry per "
                "extra keyword")
def save_checkpoint_writes_full_state(impl):
    """fp32 weights, optimizer, scaler, counters, world size, model config and the caller's extras, loadable
    weights_only; entries beyond the contract are allowed. A save with scaler=None (the contract's example) works,
    its scaler entry None (or {}, what a disabled GradScaler saves: no state either)."""
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
        without_scaler = Path(tmp) / "without_scaler.pth"
        expect_works("save_checkpoint(..., scaler=None) (a run without a GradScaler: the contract's example)",
                     lambda: impl.save_checkpoint(without_scaler, model=model, optimizer=optimizer, scaler=None,
                                                  epoch=stop_epoch, step=stop_step),
                     "the checkpoint written, its scaler entry None", NO_SCALER)
        scaler_entry = torch.load(without_scaler, map_location="cpu", weights_only=True).get("scaler", "missing")
    if scaler_entry not in (None, {}):
        fail("scaler entry of a checkpoint saved with scaler=None", scaler_entry, None, NO_SCALER)
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


class FailingRenames:
    """os.replace and os.rename (Path.replace, Path.rename and shutil.move go through them) raise OSError for a
    rename onto ``path``: the last step of a save fails (the temporary file on another file system, no
    permission, a full directory), after everything before it worked."""

    def __init__(self, path: Path):
        self.path, self.real = Path(path), {name: getattr(os, name) for name in ("replace", "rename")}

    def __enter__(self):
        for name, real in self.real.items():
            setattr(os, name, self._failing(real))
        return self

    def __exit__(self, *exc):
        for name, real in self.real.items():
            setattr(os, name, real)

    def _failing(self, real):
        def rename(src, dst, *args, **kwargs):
            if Path(dst).resolve() == self.path.resolve():
                raise OSError(f"simulated failure of the rename onto {self.path.name}")
            return real(src, dst, *args, **kwargs)
        return rename


def fail_the_rename(impl, path, objects) -> str:
    """A save of ``objects`` onto ``path`` whose final rename fails: it must raise; returns what it was."""
    where = "save_checkpoint whose rename onto the checkpoint fails (its last step)"
    with FailingRenames(path):
        try:
            save_objects(impl, path, objects, 0, 4)
        except NotImplementedError:
            raise
        except BaseException:
            return where
    fail(where, "returned normally", "the failure propagates",
         "hint: a failed save must not pass for a written one: re-raise after cleaning up")


@check("save_checkpoint", objective="atomic_save", hidden=True, uses=("load_checkpoint",))
@names_the_rule("write the new checkpoint to a temporary file, then rename it onto the path: the previous "
                "checkpoint is never touched until the new one replaces it; re-raise the failure")
def save_checkpoint_is_atomic(impl):
    """A save that fails halfway (OSError, KeyboardInterrupt, SystemExit, a BaseException of its own) or at its
    last step (the rename onto the path) re-raises and leaves the previous checkpoint byte-identical and
    loadable."""
    with good_checkpoint(impl) as (objects, fresh, _, path):
        before = path.read_bytes()
        for crash in (*(lambda error=error: crash_a_save(impl, path, objects, error) for error in CRASHES),
                      lambda: fail_the_rename(impl, path, objects)):
            where = crash()
            after = path.read_bytes() if path.is_file() else None
            if after != before:
                fail(f"{path.name} after a {where}", "missing" if after is None else f"{len(after)} bytes, changed",
                     f"the previous checkpoint, {len(before)} bytes, unchanged",
                     "hint: write to a temporary file in the same directory, then os.replace it onto the path; "
                     "never remove the previous checkpoint first: the rename replaces it in one step")
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
@names_the_rule("create the parent directory (a bare file name's is the current one); rename with os.replace, not "
                "os.rename (on Windows os.rename refuses a target that exists)")
def save_checkpoint_creates_the_directory_and_uses_os_replace(impl):
    """The parent directory is created, and a bare file name is saved in the current directory; os.rename is not
    used: on Windows it refuses a target that exists, i.e. every save after the first."""
    objects, _ = trained(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp, working_directory(tmp):
        expect_works("save_checkpoint('resume.pth') (a bare file name: in the current directory)",
                     lambda: save_objects(impl, "resume.pth", objects, 0, 2), "the checkpoint written there",
                     "hint: a bare file name's directory is the current one: Path(path).parent is '.', "
                     "os.path.dirname(path) is '', which os.makedirs refuses")
        expect_equal("files in the current directory after save_checkpoint('resume.pth')", files_in("."),
                     ["resume.pth"])
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
