"""Lesson 15 checks of ``load_checkpoint``. Core: everything restored bit for bit, no code run from the file, a
refusal that changes nothing for a file an exact resume cannot start from (the lesson's list), the step rescaled
for a new world size. Hardening: the refusals' type and wording, the longer catalogue of foreign entries,
unreadable files, missing keys, bad counters, a file from another device."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import tempfile
from pathlib import Path

import torch

from course.minimind.model import MiniMindForCausalLM
from course.minimind.trainer_utils import lm_checkpoint
from course.runs import save_objects, training_objects
from course.runs.eager import eager
from course.runs.scenarios import RESUME_BASE, RESUME_SCALER

from ..framework import CheckFailure, check, expect_equal, expect_tensors_close, fail
from .checks import (CHECKPOINT_KEYS, NotATensor, expect_raises_naming, expect_works, good_checkpoint, names_the_rule,
                     trained)
from .saving import expect_optimizer_state_equal


# --- restoring everything ----------------------------------------------------------------------


@check("load_checkpoint", objective="full_state", uses=("save_checkpoint",))
@names_the_rule("restore everything given, bit for bit; path may be a str; optimizer and scaler may be None: "
                "restore only what is given")
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
            str(path), model=fresh_model, optimizer=fresh_optimizer, scaler=fresh_scaler), "the checkpoint dict",
            "hint: path may be a str: Path(path) first")
        weights_only_target = training_objects(scenario).model  # e.g. for an evaluation: no optimizer, no scaler
        expect_works("load_checkpoint(path, model=model) (no optimizer, no scaler)",
                     lambda: impl.load_checkpoint(path, model=weights_only_target), "the model restored",
                     "hint: optimizer and scaler may be None: restore only what is given")
    expect_tensors_close("model restored without optimizer and scaler", weights_only_target.state_dict(),
                         model.state_dict(), rtol=0.0, atol=0.0)
    expect_equal("(epoch, step, batch_size_semantics) returned",
                 (checkpoint["epoch"], checkpoint["step"], checkpoint.get("batch_size_semantics")),
                 (stop_epoch, stop_step, "micro_batch"))
    expect_tensors_close("restored model", fresh_model.state_dict(), model.state_dict(), rtol=0.0, atol=0.0)
    expect_optimizer_state_equal("restored optimizer", fresh_optimizer.state_dict(), optimizer.state_dict())
    expect_equal("restored GradScaler state", fresh_scaler.state_dict(), scaler.state_dict())


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
@names_the_rule("restore the GradScaler with scaler.load_state_dict(saved state): its scale, growth tracker AND "
                "hyper-parameters (growth_factor, backoff_factor, growth_interval)")
def load_checkpoint_restores_the_whole_grad_scaler(impl):
    """A GradScaler with non-default growth_factor, backoff_factor and growth_interval, saved between two
    growths, loaded into a default one: its state_dict equals the saved one, and it grows and backs off at the
    same updates by the same factors as the saved scaler."""
    with good_checkpoint(impl) as (objects, _, tmp, _):
        target = training_objects(RESUME_BASE.with_(scaler_enabled=True))
        for init_scale, growth, backoff, interval in SCALER_SETTINGS:
            tuned = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth, backoff_factor=backoff,
                                         growth_interval=interval)
            scale_schedule(tuned)  # its scale and growth tracker move off their initial values
            path = save_with(impl, Path(tmp) / "tuned_scaler.pth", objects, scaler=tuned)
            where = (f"a GradScaler(growth_factor={growth}, backoff_factor={backoff}, growth_interval={interval}) "
                     "loaded into a default one")
            expect_works(f"load_checkpoint of {where}", lambda: impl.load_checkpoint(
                path, model=target.model, optimizer=target.optimizer, scaler=target.scaler), "the scaler restored")
            expect_equal(f"state_dict() of {where}", target.scaler.state_dict(), tuned.state_dict())
            expect_equal(f"scales of {where} over updates overflowing at {OVERFLOWS}", scale_schedule(target.scaler),
                         scale_schedule(tuned))


# --- no code from the file ---------------------------------------------------------------------


CODE_RUN_BY_FILES: list[str] = []


def run_code_from_a_file(message: str) -> str:
    """Stands for any importable callable a pickle can name (os.system, say): unpickling calls it. Here it only
    records that it ran."""
    CODE_RUN_BY_FILES.append(message)
    return message


class RunsCodeWhenLoaded:
    """Pickled as a call of ``run_code_from_a_file``: unpickled without weights_only, the call runs."""

    def __reduce__(self):
        return run_code_from_a_file, ("a call the checkpoint file named ran while it was loaded",)


@check("load_checkpoint", objective="safe_load", uses=("save_checkpoint",))
@names_the_rule("torch.load(path, map_location='cpu', weights_only=True): unpickling without weights_only runs any "
                "function the file names")
def load_checkpoint_never_runs_code_from_the_file(impl):
    """A checkpoint whose pickle names a function to call (here a harmless recorder; os.system in an attack): the
    load never calls it (weights_only=True refuses the file), and a refused load changes nothing."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        hostile = Path(tmp) / "hostile.pth"
        torch.save(dict(torch.load(good, weights_only=True), note=RunsCodeWhenLoaded()), hostile)
        CODE_RUN_BY_FILES.clear()
        before = snapshot(target)
        with contextlib.suppress(Exception):  # a refusal, of any type, is right here
            impl.load_checkpoint(hostile, model=target.model, optimizer=target.optimizer, scaler=target.scaler)
        if CODE_RUN_BY_FILES:
            fail("calls the checkpoint file made while it was loaded", CODE_RUN_BY_FILES, [],
                 "hint: torch.load(path, map_location='cpu', weights_only=True): weights_only rebuilds tensors, "
                 "containers and plain values and refuses everything else")
        expect_untouched("load_checkpoint of a file whose pickle calls a function", before, target)


# --- refusing what an exact resume cannot start from -------------------------------------------


def snapshot(objects):
    return (copy.deepcopy(objects.model.state_dict()), copy.deepcopy(objects.optimizer.state_dict()),
            objects.scaler.state_dict())


def expect_untouched(what: str, before, objects, hint: str = "") -> None:
    """Nothing partially loaded: model, optimizer and scaler are exactly as before the failed load; ``hint`` ends
    a failure's message."""
    model_before, optimizer_before, scaler_before = before
    try:
        expect_tensors_close(f"{what}: model after the refused load", objects.model.state_dict(), model_before,
                             rtol=0.0, atol=0.0)
        expect_optimizer_state_equal(f"{what}: optimizer after the refused load", objects.optimizer.state_dict(),
                                     optimizer_before)
        expect_equal(f"{what}: GradScaler after the refused load", objects.scaler.state_dict(), scaler_before)
    except CheckFailure as exc:
        if not hint:
            raise
        raise CheckFailure(f"{exc}\n  hint: {hint}") from None


def expect_refused(impl, what: str, path, objects, exc_type, mentions, world_size=None) -> None:
    """Loading ``path`` raises ``exc_type`` naming every item of ``mentions`` (a tuple: any of it); nothing changes."""
    before = snapshot(objects)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    expect_raises_naming(what, lambda: impl.load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler,
                                                            world_size=world_size), exc_type, mentions)
    expect_untouched(what, before, objects)


BEFORE_LOADING = ("before the first load_state_dict: a refusal leaves model, optimizer and scaler as they were "
                  "(torch's own errors come after your code has loaded the model)")


@dataclasses.dataclass(frozen=True)
class ForeignFile:
    """A file an exact resume cannot start from: ``what`` it is, its ``path``, the ``scenario`` of the objects it
    is loaded into, what a refusal's message names (``mentions``, a tuple: any of it) and the ``rule`` that
    refuses it."""
    what: str
    path: Path
    scenario: object
    mentions: tuple
    rule: str


def save_with(impl, path: Path, objects, **replaced) -> Path:
    """``impl.save_checkpoint`` of ``objects`` at (0, 2) with some of them ``replaced`` (another optimizer, say):
    a file written the way a real run would write it."""
    save_objects(impl, path, dataclasses.replace(objects, **replaced), 0, 2)
    return path


def foreign_files(impl, tmp: str, objects):
    """The lesson's list (§5.3), each file written as a real run would write it: a weights-only file, fp16
    weights (upstream's resume file) or bf16 ones, another model's shapes or config, another optimizer's state, no
    scaler state ({} or None) for an enabled scaler."""
    tmp = Path(tmp)
    parameter_names = tuple(objects.model.state_dict())
    weights = tmp / "weights.pth"
    torch.save(objects.model.state_dict(), weights)
    yield ForeignFile("a plain weights file (model.state_dict() alone)", weights, RESUME_BASE, (CHECKPOINT_KEYS,),
                      "a weights file is no resume checkpoint: require model, optimizer, scaler, epoch, step and "
                      "world_size")
    upstream_dir = tmp / "upstream"
    lm_checkpoint(objects.model.config, model=objects.model, optimizer=objects.optimizer, epoch=0, step=2,
                  save_dir=str(upstream_dir), scaler=objects.scaler)
    yield ForeignFile("upstream's resume file (fp16 weights, no model_config: naming either is right)",
                      upstream_dir / f"pretrain_{RESUME_BASE.hidden_size}_resume.pth", RESUME_BASE,
                      (("float16", "model_config") + parameter_names,),
                      "fp16 weights are an export, not a resume checkpoint: compare each tensor's dtype with "
                      "model.state_dict()'s")
    good = torch.load(save_with(impl, tmp / "fp32.pth", objects), weights_only=True)
    bf16 = tmp / "bf16_weights.pth"
    torch.save(dict(good, model={k: v.to(torch.bfloat16) for k, v in good["model"].items()}), bf16)
    yield ForeignFile("a resume checkpoint whose weights were exported in bf16 (as lossy as fp16)", bf16, RESUME_BASE,
                      (("bfloat16",) + parameter_names,),
                      "bf16 weights are a lossy export too: compare each tensor's dtype with model.state_dict()'s, "
                      "not with float16 alone")
    config = dataclasses.asdict(objects.model.config)
    for other in (RESUME_BASE.with_(use_moe=True), RESUME_BASE.with_(num_hidden_layers=3),
                  RESUME_BASE.with_(hidden_size=48)):
        other_objects = training_objects(other)
        other_file = save_with(impl, tmp / f"other_{other.hidden_size}_{other.num_hidden_layers}_{other.use_moe}.pth",
                               other_objects)
        other_config = dataclasses.asdict(other_objects.model.config)
        differing = tuple(k for k in config if other_config.get(k) != config[k])
        yield ForeignFile(f"a checkpoint of another model (hidden_size={other.hidden_size}, "
                          f"layers={other.num_hidden_layers}, use_moe={other.use_moe})", other_file, RESUME_BASE,
                          (differing + parameter_names,), "another model: compare model_config with "
                          "dataclasses.asdict(model.config), and the model keys and shapes")
    with torch.random.fork_rng(devices=[]):  # its initialisation leaves the global RNG where it was
        rope_model = MiniMindForCausalLM(dataclasses.replace(objects.model.config, rope_theta=1e4))
    rope = save_with(impl, tmp / "other_rope_theta.pth", objects, model=rope_model,
                     optimizer=eager(torch.optim.AdamW)(rope_model.parameters()))
    yield ForeignFile("a checkpoint of a model with rope_theta=1e4 (this one: 1e6), the same shapes", rope,
                      RESUME_BASE, ("rope_theta",), "compare the whole model_config with dataclasses.asdict("
                      "model.config), not only the shapes: rope_theta shows in no shape")
    params = list(objects.model.parameters())
    for what, optimizer, rule in (
            ("an SGD state for an AdamW optimizer", eager(torch.optim.SGD)(params),
             "another optimizer type: compare the hyper-parameter keys of the saved param groups with "
             "optimizer.param_groups'"),
            ("the state of an AdamW over the same parameters in 2 param groups (decay / no decay)",
             training_objects(RESUME_BASE.with_(two_param_groups=True)).optimizer,
             "another optimizer: compare the number of param groups and of parameters in each"),
            ("the state of an AdamW without the last parameter (frozen)", eager(torch.optim.AdamW)(params[:-1]),
             "another optimizer: compare the number of param groups and of parameters in each")):
        other_optimizer = save_with(impl, tmp / f"optimizer_{len(what)}.pth", objects, optimizer=optimizer)
        yield ForeignFile(what, other_optimizer, RESUME_BASE, ("optimizer",), rule)
    yield ForeignFile("a checkpoint of a run without a GradScaler (its state {}) into an enabled GradScaler",
                      save_with(impl, tmp / "no_scaler.pth", objects), RESUME_BASE.with_(scaler_enabled=True),
                      ("scaler",), "an enabled scaler needs a non-empty saved scaler state (a disabled GradScaler "
                      "saves {})")
    scaler_none = tmp / "scaler_none.pth"
    torch.save(dict(good, scaler=None), scaler_none)
    yield ForeignFile("a checkpoint of a run saved with scaler=None (its scaler entry None) into an enabled GradScaler",
                      scaler_none, RESUME_BASE.with_(scaler_enabled=True), ("scaler",),
                      "an enabled scaler needs a saved scaler state: refuse an empty one, None (saved with "
                      "scaler=None) as well as {} (a disabled GradScaler's)")


@check("load_checkpoint", objective="refuse_foreign", hidden=True, uses=("save_checkpoint",))
@names_the_rule("refuse, before the first load_state_dict, a file an exact resume cannot start from")
def load_checkpoint_rejects_foreign_checkpoints(impl):
    """A weights-only file, upstream's fp16 resume file, a bf16 export, another model's checkpoint (other shapes, or
    only another rope_theta), another optimizer's state (SGD, other param groups, other parameters), an empty
    scaler state ({} or None) for an enabled scaler: the load is refused (any error), and model, optimizer and
    scaler are as before."""
    with good_checkpoint(impl) as (objects, _, tmp, _):
        for foreign in foreign_files(impl, tmp, objects):
            target = training_objects(foreign.scenario)
            before = snapshot(target)
            where = f"load_checkpoint of {foreign.what}"
            try:
                impl.load_checkpoint(foreign.path, model=target.model, optimizer=target.optimizer,
                                     scaler=target.scaler)
            except NotImplementedError:
                raise
            except Exception:
                expect_untouched(where, before, target, f"{foreign.rule}, {BEFORE_LOADING}")
            else:
                fail(where, "loaded", "a refusal (an error), nothing changed", f"hint: {foreign.rule}")


@check("load_checkpoint", uses=("save_checkpoint",))
@names_the_rule("each refusal of a file an exact resume cannot start from is a ValueError naming the path and "
                "the offending key (a missing key, the parameter, a config field, optimizer, scaler)")
def load_checkpoint_names_the_path_and_the_problem(impl):
    """The core's foreign files again: each refusal is a ValueError naming the path and what is wrong."""
    with good_checkpoint(impl) as (objects, _, tmp, _):
        for foreign in foreign_files(impl, tmp, objects):
            expect_refused(impl, f"load_checkpoint of {foreign.what}", foreign.path, training_objects(foreign.scenario),
                           ValueError, [str(foreign.path), *foreign.mentions])


@check("load_checkpoint", uses=("save_checkpoint",))
@names_the_rule("validate everything before the first load_state_dict: model keys both ways, every entry a tensor "
                "of the model's shape, the whole model_config both ways (name the field), the optimizer entry a "
                "state_dict with the same groups, no state under unknown ids, state shapes (the same numel is not "
                "the same shape); each ValueError names the path")
def load_checkpoint_rejects_every_foreign_entry(impl):
    """Beyond the lesson's list: an extra or missing model key, an entry that is not a tensor of its shape, a
    model_config with a field more or less, an optimizer entry that is no state_dict or holds an empty extra
    group, moments of another parameter order or shape, state under an id no group holds: ValueError naming
    the path and the key, nothing loaded."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        saved = torch.load(good, weights_only=True)
        entry = Path(tmp) / "foreign_entry.pth"
        for what, model_state, names in (
                ("an extra model key lm_head.bias", dict(saved["model"], **{"lm_head.bias": torch.zeros(6400)}),
                 ("lm_head.bias",)),
                ("no model.norm.weight", {k: v for k, v in saved["model"].items() if k != "model.norm.weight"},
                 ("model.norm.weight",))):
            torch.save(dict(saved, model=model_state), entry)
            expect_refused(impl, f"load_checkpoint with {what}", entry, target, ValueError, [str(entry), names])
        for name, value in (("model.layers.0.self_attn.q_proj.weight", torch.zeros(32, 64)),
                            ("model.norm.weight", [1.0] * 32), ("model.embed_tokens.weight", None)):
            torch.save(dict(saved, model=dict(saved["model"], **{name: value})), entry)
            shown = f"of shape {tuple(value.shape)}" if torch.is_tensor(value) else f"a {type(value).__name__}"
            expect_refused(impl, f"load_checkpoint with {name} {shown}, not a tensor of its shape", entry, target,
                           ValueError, [str(entry), name])
        config = saved["model_config"]
        for what, field, other in (
                ("an extra field sliding_window=64", "sliding_window", dict(config, sliding_window=64)),
                ("no field norm_topk_prob", "norm_topk_prob",
                 {k: v for k, v in config.items() if k != "norm_topk_prob"})):
            torch.save(dict(saved, model_config=other), entry)
            expect_refused(impl, f"load_checkpoint of a checkpoint whose model_config has {what}", entry, target,
                           ValueError, [str(entry), field])
        for what, optimizer_state in odd_optimizer_states(saved["optimizer"]):
            torch.save(dict(saved, optimizer=optimizer_state), entry)
            expect_refused(impl, f"load_checkpoint with {what}", entry, target, ValueError, [str(entry), "optimizer"])


def odd_optimizer_states(saved: dict):
    """(what, an optimizer state_dict that does not fit the AdamW it was saved from): beyond another optimizer."""
    group = saved["param_groups"][0]
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


@check("load_checkpoint", uses=("save_checkpoint",))
@names_the_rule("a missing file is a FileNotFoundError; whatever torch.load raises for an unreadable path, a "
                "directory too (EOFError, RuntimeError, UnpicklingError, OSError, ...), a non-dict or a model entry "
                "that is no dict is a ValueError, each naming the path, before anything is loaded")
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


@check("load_checkpoint", uses=("save_checkpoint",))
@names_the_rule("each of the six keys (model, optimizer, scaler, epoch, step, world_size) is required: a good "
                "checkpoint lacking any one is a ValueError naming the path and that key, before anything is loaded")
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
