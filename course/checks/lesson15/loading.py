"""Lesson 15 checks of ``load_checkpoint``: everything restored, or a clear refusal that changes
nothing (unreadable, foreign, another config, a disabled scaler's state); the step rescaled for a new world size."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import tempfile
import zipfile
from pathlib import Path

import torch

from course.minimind.trainer_utils import lm_checkpoint
from course.runs import save_objects, training_objects
from course.runs.eager import eager
from course.runs.scenarios import RESUME_BASE, RESUME_SCALER

from ..framework import check, expect_equal, expect_tensors_close
from .checks import (CHECKPOINT_KEYS, NotATensor, expect_raises_naming, expect_works, fake_rank, good_checkpoint,
                     names_the_rule, trained)
from .saving import expect_optimizer_state_equal


# --- load_checkpoint ---------------------------------------------------------------------------


@check("load_checkpoint", objective="full_state", uses=("save_checkpoint",))
@names_the_rule('restore everything given, bit for bit; path may be a str; optimizer and scaler may be None: restore only what is given')
def load_checkpoint_restores_everything(impl):
    """Fresh model, optimizer and scaler get the saved state bit for bit (path a str or a Path); the dict carries
    counters and extras; a load with the model alone restores the model."""
    scenario, stop_epoch, stop_step = RESUME_SCALER[0]
    objects, _ = trained(scenario, stop_epoch, stop_step)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    fresh = training_objects(scenario)
    fresh_model, fresh_optimizer, fresh_scaler = fresh.model, fresh.optimizer, fresh.scaler
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        save_objects(impl, path, objects, stop_epoch, stop_step, batch_size_semantics="micro_batch")
        checkpoint = expect_works("load_checkpoint(str path, model, optimizer, scaler)", lambda: impl.load_checkpoint(
            str(path), model=fresh_model, optimizer=fresh_optimizer, scaler=fresh_scaler), "the checkpoint dict")
        weights_only_target = training_objects(scenario).model  # e.g. for an evaluation: no optimizer, no scaler
        expect_works("load_checkpoint(path, model=model) (no optimizer, no scaler)",
                     lambda: impl.load_checkpoint(path, model=weights_only_target), "the model restored")
    expect_tensors_close("model restored without optimizer and scaler", weights_only_target.state_dict(),
                         model.state_dict(), rtol=0.0, atol=0.0)
    expect_equal("(epoch, step, batch_size_semantics) returned",
                 (checkpoint["epoch"], checkpoint["step"], checkpoint.get("batch_size_semantics")),
                 (stop_epoch, stop_step, "micro_batch"))
    expect_tensors_close("restored model", fresh_model.state_dict(), model.state_dict(), rtol=0.0, atol=0.0)
    expect_optimizer_state_equal("restored optimizer", fresh_optimizer.state_dict(), optimizer.state_dict())
    expect_equal("restored GradScaler state", fresh_scaler.state_dict(), scaler.state_dict())


def snapshot(objects):
    return (copy.deepcopy(objects.model.state_dict()), copy.deepcopy(objects.optimizer.state_dict()),
            objects.scaler.state_dict())


def expect_untouched(what: str, before, objects) -> None:
    """Nothing partially loaded: model, optimizer and scaler are exactly as before the failed load."""
    model_before, optimizer_before, scaler_before = before
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    expect_tensors_close(f"{what}: model after the refused load", model.state_dict(), model_before,
                         rtol=0.0, atol=0.0)
    expect_optimizer_state_equal(f"{what}: optimizer after the refused load", optimizer.state_dict(), optimizer_before)
    expect_equal(f"{what}: GradScaler after the refused load", scaler.state_dict(), scaler_before)


def expect_refused(impl, what: str, path, objects, exc_type, mentions, world_size=None) -> None:
    """Loading ``path`` raises ``exc_type`` naming every item of ``mentions`` (a tuple: any of it); nothing changes."""
    before = snapshot(objects)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    expect_raises_naming(what, lambda: impl.load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler,
                                                            world_size=world_size), exc_type, mentions)
    expect_untouched(what, before, objects)


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
@names_the_rule('read with torch.load(..., weights_only=True); a missing file is a FileNotFoundError; whatever torch.load raises for an unreadable path, a directory too (EOFError, RuntimeError, UnpicklingError, OSError, ...), a non-dict or a model entry that is no dict is a ValueError, each naming the path, before anything is loaded')
def load_checkpoint_rejects_unreadable_files(impl):
    """Missing, empty, truncated (at several lengths), garbage, a directory, arbitrary-object files and ones
    holding no checkpoint dict: a clear error naming the path, nothing loaded."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        missing = Path(tmp) / "missing.pth"
        expect_refused(impl, "load_checkpoint of a missing file", missing, target, FileNotFoundError, [str(missing)])
        data = good.read_bytes()
        for what, content in unreadable_contents(data):
            unreadable = Path(tmp) / "unreadable.pth"
            unreadable.write_bytes(content)
            expect_refused(impl, f"load_checkpoint of {what}", unreadable, target, ValueError, [str(unreadable)])
        directory = Path(tmp) / "a_directory.pth"
        directory.mkdir()
        expect_refused(impl, "load_checkpoint of a directory", directory, target, ValueError, [str(directory)])
        for what, content in (("a plain tensor", torch.zeros(3)), ("a model entry of None", dict(
                torch.load(good, weights_only=True), model=None))):
            other = Path(tmp) / "other_content.pth"
            torch.save(content, other)
            expect_refused(impl, f"load_checkpoint of a file holding {what}", other, target, ValueError, [str(other)])
        pickled = Path(tmp) / "pickled.pth"
        torch.save(dict(torch.load(good, weights_only=True), surprise=NotATensor()), pickled)
        expect_refused(impl, "load_checkpoint of a file holding a pickled object (needs weights_only=True)", pickled,
                       target, ValueError, [str(pickled)])


@check("load_checkpoint", objective="refuse_foreign", hidden=True, uses=("save_checkpoint",))
@names_the_rule("validate everything before the first load_state_dict: the six keys, model keys, shapes and dtypes of tensors (a non-tensor is refused; name the parameter), the optimizer's groups, parameters (no state under unknown ids), hyper-parameter keys and state shapes (name optimizer; the same numel is not the same shape); each ValueError names the path")
def load_checkpoint_rejects_foreign_checkpoints(impl):
    """Weights-only files, wrong shapes, another model config, fp16 weights, another optimizer: ValueError
    naming the path and the offending key (a missing key, the parameter, a config field, 'optimizer')."""
    with good_checkpoint(impl) as (objects, target, tmp, good):
        saved = torch.load(good, weights_only=True)
        parameter_names = tuple(objects.model.state_dict())

        weights_only_file = Path(tmp) / "weights.pth"
        torch.save(objects.model.state_dict(), weights_only_file)
        expect_refused(impl, "load_checkpoint of a plain weights file", weights_only_file, target, ValueError,
                       [str(weights_only_file), CHECKPOINT_KEYS])

        for what, model_state, names in (
                ("an extra model key lm_head.bias", dict(saved["model"], **{"lm_head.bias": torch.zeros(6400)}),
                 ("lm_head.bias",)),
                ("no model.norm.weight", {k: v for k, v in saved["model"].items() if k != "model.norm.weight"},
                 ("model.norm.weight",))):
            other_keys = Path(tmp) / "other_keys.pth"
            torch.save(dict(saved, model=model_state), other_keys)
            expect_refused(impl, f"load_checkpoint with {what}", other_keys, target, ValueError,
                           [str(other_keys), names])

        wrong_value = Path(tmp) / "wrong_value.pth"
        for name, value in (("model.layers.0.self_attn.q_proj.weight", torch.zeros(32, 64)),
                            ("model.norm.weight", [1.0] * 32), ("model.embed_tokens.weight", None)):
            torch.save(dict(saved, model=dict(saved["model"], **{name: value})), wrong_value)
            shown = f"of shape {tuple(value.shape)}" if torch.is_tensor(value) else f"a {type(value).__name__}"
            expect_refused(impl, f"load_checkpoint with {name} {shown}, not a tensor of its shape", wrong_value,
                           target, ValueError, [str(wrong_value), name])

        config = dataclasses.asdict(objects.model.config)
        for other in (RESUME_BASE.with_(use_moe=True), RESUME_BASE.with_(num_hidden_layers=3),
                      RESUME_BASE.with_(hidden_size=48)):
            other_file = Path(tmp) / f"other_{other.hidden_size}_{other.num_hidden_layers}_{other.use_moe}.pth"
            other_objects = training_objects(other)
            save_objects(impl, other_file, other_objects, 0, 0)
            other_config = dataclasses.asdict(other_objects.model.config)
            differing = tuple(k for k in config if other_config.get(k) != config[k])
            expect_refused(impl, f"load_checkpoint of a checkpoint from hidden_size={other.hidden_size}, "
                                 f"layers={other.num_hidden_layers}, use_moe={other.use_moe}",
                           other_file, target, ValueError, [str(other_file), differing + parameter_names])

        upstream_dir = Path(tmp) / "upstream"
        model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
        lm_checkpoint(model.config, model=model, optimizer=optimizer, epoch=0, step=2, save_dir=str(upstream_dir),
                      scaler=scaler)
        upstream_file = upstream_dir / f"pretrain_{RESUME_BASE.hidden_size}_resume.pth"
        expect_refused(impl, "load_checkpoint of upstream's resume file (fp16 weights, no model_config: naming "
                             "either is right)", upstream_file, target, ValueError,
                       [str(upstream_file), ("float16", "model_config") + parameter_names])

        for what, optimizer_state in foreign_optimizer_states(objects.model, saved["optimizer"]):
            other_optimizer = Path(tmp) / "other_optimizer.pth"
            torch.save(dict(saved, optimizer=optimizer_state), other_optimizer)
            expect_refused(impl, f"load_checkpoint with {what}", other_optimizer, target, ValueError,
                           [str(other_optimizer), "optimizer"])


def unreadable_contents(data: bytes):
    """(what, bytes) of files torch.load cannot read; it raises EOFError, RuntimeError, UnpicklingError,
    IndexError or struct.error for them."""
    yield "an empty file (a crash right after open(path, 'wb'))", b""
    for length in (1, 10, len(data) // 2, len(data) - 1):
        yield f"a file truncated to {length} of its {len(data)} bytes", data[:length]
    yield "a file of text", b"not a checkpoint\n"
    yield "a file of binary garbage", bytes(range(256)) * 4
    yield "a pickle that stops on an empty stack (IndexError)", b"\x80\x02."
    yield "a pickle cut inside a string (struct.error)", b"\x80\x02}q\x00(X"


def foreign_optimizer_states(model, saved: dict):
    """(what, an optimizer state_dict that does not fit an AdamW over all of ``model``'s parameters)."""
    params = list(model.parameters())
    yield "an SGD state for an AdamW optimizer", eager(torch.optim.SGD)(params).state_dict()
    split = eager(torch.optim.AdamW)([{"params": params[:2]}, {"params": params[2:]}]).state_dict()
    yield "the state of an AdamW over the same parameters in 2 param groups (decay / no decay)", split
    group = saved["param_groups"][0]
    yield ("the state of an AdamW without the last parameter (frozen)",
           {"state": {i: v for i, v in saved["state"].items() if i != group["params"][-1]},
            "param_groups": [dict(group, params=group["params"][:-1])]})
    yield "an empty optimizer entry", {}
    yield ("the AdamW state plus a second param group holding no parameters (same parameter count, 2 groups)",
           dict(saved, param_groups=[group, dict(group, params=[])]))
    first, second = group["params"][6:8]  # k_norm (4,) and input_layernorm (32,): 1-D, another length
    yield ("AdamW moments of parameters 6 and 7 swapped (another parameter order)",
           dict(saved, state={**saved["state"], first: saved["state"][second], second: saved["state"][first]}))
    for index, key, reshaped in ((2, "exp_avg", lambda t: t.t()), (7, "exp_avg_sq", lambda t: t.reshape(-1, 1))):
        pid = group["params"][index]  # k_proj (16, 32), input_layernorm (32,)
        moment = reshaped(saved["state"][pid][key])
        yield (f"AdamW {key} of parameter {index} reshaped to {tuple(moment.shape)} (as many elements, another "
               "shape)", dict(saved, state={**saved["state"], pid: dict(saved["state"][pid], **{key: moment})}))
    yield ("the AdamW state plus the state of a parameter id no param group holds",
           dict(saved, state={**saved["state"], max(group["params"]) + 1: saved["state"][group["params"][0]]}))


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
@names_the_rule("each of the six keys (model, optimizer, scaler, epoch, step, world_size) is required: a good checkpoint lacking any one is a ValueError naming the path and that key, before anything is loaded")
def load_checkpoint_rejects_a_missing_key(impl):
    """A good checkpoint without one of its six keys, each in turn, loaded with model, optimizer and scaler:
    ValueError naming the path and the missing key, nothing loaded (not a KeyError from a later lookup)."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        saved = torch.load(good, weights_only=True)
        for key in CHECKPOINT_KEYS:
            lacking = Path(tmp) / f"without_{key}.pth"
            torch.save({k: v for k, v in saved.items() if k != key}, lacking)
            expect_refused(impl, f"load_checkpoint of a checkpoint without its {key!r} entry", lacking, target,
                           ValueError, [str(lacking), key])


@check("load_checkpoint", objective="refuse_foreign", hidden=True, uses=("save_checkpoint",))
@names_the_rule('compare the whole model_config with dataclasses.asdict(model.config), not only the shapes, in both directions: name the field that differs, is missing or is extra')
def load_checkpoint_rejects_another_config_with_the_same_shapes(impl):
    """A checkpoint whose model_config differs only where no shape shows it (rope_theta), lacks a field
    or has one more (a config class of another version): ValueError naming the path and the field, nothing
    loaded."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        saved = torch.load(good, weights_only=True)
        config = saved["model_config"]
        other_config = Path(tmp) / "other_config.pth"
        for what, field, other in (
                ("rope_theta=1e4 into a model with rope_theta=1e6", "rope_theta", dict(config, rope_theta=1e4)),
                ("an extra field sliding_window=64", "sliding_window", dict(config, sliding_window=64)),
                ("no field norm_topk_prob", "norm_topk_prob",
                 {k: v for k, v in config.items() if k != "norm_topk_prob"})):
            torch.save(dict(saved, model_config=other), other_config)
            expect_refused(impl, f"load_checkpoint of a checkpoint whose model_config has {what}", other_config,
                           target, ValueError, [str(other_config), field])


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
@names_the_rule('an enabled scaler needs a non-empty saved scaler state: refuse an empty one (naming scaler) before loading anything')
def load_checkpoint_rejects_a_disabled_scaler_state(impl):
    """A disabled GradScaler's (empty) state into an enabled scaler: ValueError naming the path and 'scaler'
    BEFORE the model or optimizer change (torch itself raises only inside scaler.load_state_dict)."""
    with good_checkpoint(impl) as (_, _, tmp, good):
        enabled = training_objects(RESUME_BASE.with_(scaler_enabled=True))
        expect_refused(impl, "load_checkpoint of a run without a GradScaler into an enabled GradScaler", good,
                       enabled, ValueError, [str(good), "scaler"])


SCALER_SETTINGS = (  # (init_scale, growth_factor, backoff_factor, growth_interval), none of them torch's default
    (2.0 ** 10, 3.0, 0.25, 2), (2.0 ** 4, 1.5, 0.75, 1))
OVERFLOWS = (False, True, False, False, False, True, False, False)  # a non-finite gradient at these updates


def scale_schedule(scaler) -> list:
    """The scale after each of a few updates of one parameter, overflowing at ``OVERFLOWS``: how the scaler
    grows and backs off."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = eager(torch.optim.SGD)([param], lr=0.0)
    scales = []
    for overflow in OVERFLOWS:
        scaler.scale(torch.ones(()))  # creates the scale tensors a fresh scaler makes lazily
        param.grad = torch.full((1,), float("inf") if overflow else 1.0)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


@check("load_checkpoint", objective="full_state", hidden=True, uses=("save_checkpoint",))
@names_the_rule("restore the GradScaler with scaler.load_state_dict(saved state): its scale, growth tracker AND hyper-parameters (growth_factor, backoff_factor, growth_interval)")
def load_checkpoint_restores_the_whole_grad_scaler(impl):
    """A GradScaler with non-default growth_factor, backoff_factor and growth_interval, saved between two
    growths, loaded into a default one: its state_dict equals the saved one, and it grows and backs off at the
    same updates by the same factors as the saved scaler."""
    with good_checkpoint(impl) as (_, _, tmp, good):
        saved = torch.load(good, weights_only=True)
        target = training_objects(RESUME_BASE.with_(scaler_enabled=True))
        path = Path(tmp) / "tuned_scaler.pth"
        for init_scale, growth, backoff, interval in SCALER_SETTINGS:
            tuned = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth, backoff_factor=backoff,
                                         growth_interval=interval)
            scale_schedule(tuned)  # its scale and growth tracker move off their initial values
            torch.save(dict(saved, scaler=tuned.state_dict()), path)
            where = (f"a GradScaler(growth_factor={growth}, backoff_factor={backoff}, growth_interval={interval}) "
                     "loaded into a default one")
            expect_works(f"load_checkpoint of {where}", lambda: impl.load_checkpoint(
                path, model=target.model, optimizer=target.optimizer, scaler=target.scaler), "the scaler restored")
            expect_equal(f"state_dict() of {where}", target.scaler.state_dict(), tuned.state_dict())
            expect_equal(f"scales of {where} over updates overflowing at {OVERFLOWS}", scale_schedule(target.scaler),
                         scale_schedule(tuned))


@check("load_checkpoint", objective="world_size", hidden=True, uses=("save_checkpoint",))
@names_the_rule("when the world size changes, the returned step is the floor of step * saved_world_size / world_size, an int; world_size=None is the current process group's size (1 without one)")
def load_checkpoint_rescales_step_for_world_size(impl):
    """Upstream's rule, floored to an int: step * saved_world_size // world_size when the world size changed
    (more ranks and fewer); world_size=None is the current process group's size (1 without one)."""
    with good_checkpoint(impl) as (_, _, _, path):
        good = torch.load(path, weights_only=True)
        fresh = training_objects(RESUME_BASE)  # each load overwrites all of it
        for saved_world_size, step, world_size, expected in (
                (2, 2, 2, 2), (2, 2, 1, 4), (2, 2, 4, 1), (2, 2, 3, 1), (2, 3, 4, 1), (4, 3, 8, 1), (3, 5, 2, 7),
                (1, 5, 2, 2), (2, 2, None, 4), (2, 3, (0, 4), 1), (4, 1, (0, 2), 2)):
            torch.save(dict(good, world_size=saved_world_size, step=step), path)
            in_group = isinstance(world_size, tuple)  # (rank, size): world_size=None inside that process group
            with fake_rank(*world_size) if in_group else contextlib.nullcontext():
                checkpoint = impl.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer,
                                                  scaler=fresh.scaler, world_size=None if in_group else world_size)
            loaded = f"world_size=None in a group of {world_size[1]}" if in_group else f"world_size={world_size}"
            expect_equal(f"step of a checkpoint saved at step {step} by {saved_world_size} rank(s), loaded with "
                         f"{loaded} (type, value)", (type(checkpoint["step"]), checkpoint["step"]), (int, expected))


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
@names_the_rule('saved epoch and step are ints >= 0, world_size an int >= 1, bools refused (name the key, and the path); the world_size argument is None or an int >= 1 (not a bool), refused before anything is loaded')
def load_checkpoint_rejects_bad_counters(impl):
    """A saved epoch/step that is not an int >= 0 or world_size not an int >= 1 (True is a bool): ValueError
    naming the path and the key, nothing loaded; a world_size argument that is not an int >= 1 (0, -1, 2.0,
    True): ValueError naming it, nothing loaded."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        saved = torch.load(good, weights_only=True)
        for key, value in (("step", -1), ("epoch", 0.5), ("world_size", 0), ("step", "2"), ("step", True)):
            bad = Path(tmp) / f"bad_{key}.pth"
            torch.save(dict(saved, **{key: value}), bad)
            expect_refused(impl, f"load_checkpoint of a checkpoint with {key}={value!r}", bad, target, ValueError,
                           [str(bad), key])
        for world_size in (0, 2.0, True):
            expect_refused(impl, f"load_checkpoint(good checkpoint, world_size={world_size!r})", good, target,
                           ValueError, ["world_size"], world_size=world_size)


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
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
