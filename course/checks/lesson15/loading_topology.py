"""Lesson 15 checks of ``load_checkpoint`` on another topology: a checkpoint written by another world size, and
one written on another device.
"""
from __future__ import annotations

import contextlib
import io
import zipfile
from pathlib import Path

import torch

from course.runs import save_objects, training_objects
from course.runs.scenarios import RESUME_BASE

from ..framework import check, expect_equal, expect_tensors_close, fail
from .checks import expect_works, fake_rank, good_checkpoint, names_the_rule
from .loading import expect_refused
from .saving import expect_optimizer_state_equal


# --- another world size ------------------------------------------------------------------------

RESCALES = (  # (saved world size, saved step, world_size argument, the step returned); (rank, size): None in a group
    (2, 2, 2, 2), (2, 2, 1, 4), (2, 2, 4, 1), (2, 2, 3, 1), (2, 3, 4, 1), (4, 3, 8, 1), (3, 5, 2, 7), (1, 5, 2, 2),
    (2, 2, None, 4), (2, 3, (0, 4), 1), (4, 1, (0, 2), 2))


PROCESS_GROUP = "the current process group's size: dist.get_world_size() when dist.is_initialized(), else 1"


def rescaled_steps(impl, path, objects):
    """(what, the value, the expected one, the hint for a wrong one) of the world size each file of RESCALES
    records (saved by ``impl.save_checkpoint`` on rank 0 of the saved world size) and of the step load_checkpoint
    returns for it."""
    fresh = training_objects(RESUME_BASE)  # each load overwrites all of it
    for saved_world_size, step, world_size, expected in RESCALES:
        with fake_rank(0, saved_world_size):
            save_objects(impl, path, objects, 0, step)
        yield (f"world_size saved by rank 0 of {saved_world_size}", torch.load(path, weights_only=True)["world_size"],
               saved_world_size, f"{PROCESS_GROUP}, on saving as on loading")
        in_group = isinstance(world_size, tuple)
        with fake_rank(*world_size) if in_group else contextlib.nullcontext():
            checkpoint = impl.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer, scaler=fresh.scaler,
                                              world_size=None if in_group else world_size)
        current = world_size[1] if in_group else world_size or 1
        got = checkpoint["step"]
        if in_group and got == step * saved_world_size:
            hint = f"world_size=None is {PROCESS_GROUP}"
        elif got == step and saved_world_size != current:
            hint = "when the world size changed, rescale the step: step * saved_world_size // world_size"
        elif got == round(step * saved_world_size / current):
            hint = "the floor, as upstream: step * saved_world_size // world_size, not a rounded quotient"
        else:
            hint = "step * saved_world_size // world_size when they differ (upstream's floor)"
        loaded = f"world_size=None in a group of {world_size[1]}" if in_group else f"world_size={world_size}"
        yield (f"step of a checkpoint saved at step {step} by {saved_world_size} rank(s), loaded with {loaded}", got,
               expected, hint)


@check("load_checkpoint", objective="world_size", hidden=True, uses=("save_checkpoint",))
@names_the_rule("when the world size changes, the returned step is the floor of step * saved_world_size / "
                "world_size; world_size=None is the current process group's size (1 without one)")
def load_checkpoint_rescales_step_for_world_size(impl):
    """Upstream's rule: step * saved_world_size // world_size when the world size changed (more ranks and
    fewer); world_size=None is the current process group's size (1 without one)."""
    with good_checkpoint(impl) as (objects, _, tmp, _):
        for what, got, expected, hint in rescaled_steps(impl, Path(tmp) / "rescaled.pth", objects):
            if got != expected:
                fail(what, got, expected, f"hint: {hint}")


@check("load_checkpoint", uses=("save_checkpoint",))
@names_the_rule("saved epoch and step are ints >= 0, world_size an int >= 1, bools refused (name the key, and the "
                "path); the world_size argument is None or an int >= 1 (not a bool), refused before anything is "
                "loaded; the rescaled step is an int")
def load_checkpoint_rejects_bad_counters(impl):
    """A saved epoch/step that is not an int >= 0 or world_size not an int >= 1 (True is a bool): ValueError
    naming the path and the key, nothing loaded; a world_size argument that is not an int >= 1 (0, 2.0, True):
    ValueError naming it, nothing loaded; a rescaled step is an int, not a float of the same value."""
    with good_checkpoint(impl) as (objects, target, tmp, good):
        saved = torch.load(good, weights_only=True)
        for key, value in (("step", -1), ("epoch", 0.5), ("world_size", 0), ("step", "2"), ("step", True)):
            bad = Path(tmp) / f"bad_{key}.pth"
            torch.save(dict(saved, **{key: value}), bad)
            expect_refused(impl, f"load_checkpoint of a checkpoint with {key}={value!r}", bad, target, ValueError,
                           [str(bad), key])
        for world_size in (0, 2.0, True):
            expect_refused(impl, f"load_checkpoint(good checkpoint, world_size={world_size!r})", good, target,
                           ValueError, ["world_size"], world_size=world_size)
        for what, got, _, _ in rescaled_steps(impl, Path(tmp) / "rescaled.pth", objects):
            expect_equal(f"type of the {what}", type(got).__name__, "int")


# --- another device ----------------------------------------------------------------------------


@check("load_checkpoint", uses=("save_checkpoint",))
@names_the_rule('load onto the CPU whatever device wrote the file: torch.load(path, map_location="cpu", '
                'weights_only=True)')
def load_checkpoint_reads_a_file_from_another_device(impl):
    """A checkpoint whose tensors were saved on another device (here an Apple mps GPU, absent on this machine)
    loads onto the CPU: torch.load(..., map_location="cpu"), everything restored bit for bit."""
    with good_checkpoint(impl) as (objects, target, tmp, good):
        elsewhere = Path(tmp) / "saved_on_mps.pth"
        elsewhere.write_bytes(saved_on_device(good.read_bytes(), b"mps"))
        expect_works("load_checkpoint of a checkpoint saved on an mps device, on a CPU-only machine",
                     lambda: impl.load_checkpoint(elsewhere, model=target.model, optimizer=target.optimizer,
                                                  scaler=target.scaler),
                     "loaded onto the CPU", 'hint: torch.load(path, map_location="cpu", weights_only=True)')
        expect_tensors_close("model restored from the mps checkpoint", target.model.state_dict(),
                             objects.model.state_dict(), rtol=0.0, atol=0.0)
        expect_optimizer_state_equal("optimizer restored from the mps checkpoint", target.optimizer.state_dict(),
                                     objects.optimizer.state_dict())


def saved_on_device(data: bytes, device: bytes) -> bytes:
    """``torch.save`` bytes of CPU tensors rewritten as if saved on ``device`` (a 3-letter name like ``cpu``):
    the pickled storage location is the only difference."""
    cpu, moved = b"X\x03\x00\x00\x00cpu", b"X\x03\x00\x00\x00" + device
    archive, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as rewritten:
        for info in archive.infolist():
            content = archive.read(info)
            rewritten.writestr(info, content.replace(cpu, moved) if info.filename.endswith("/data.pkl") else content)
    return out.getvalue()
