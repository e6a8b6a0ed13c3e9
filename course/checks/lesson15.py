"""Lesson 15: checkpoint and exact resume - descriptor, checks, mistakes.

Saving and loading do no arithmetic, so resume is graded BITWISE: a run interrupted at an update
boundary, saved, loaded into fresh objects and continued must give the very same records, parameters,
AdamW state and GradScaler scale as the uninterrupted oracle run. Training itself always runs on the
oracle loop (``course.minimind.train_pretrain.train_epoch``), so lesson 15 does not depend on lesson 14.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from course.minimind.trainer_utils import SkipBatchSampler as UpstreamSkipBatchSampler
from course.minimind.trainer_utils import lm_checkpoint
from course.runs import (RunResult, full_epoch_batches, resume_and_finish, run_oracle, save_objects, train_until,
                         training_objects)
from course.runs.scenarios import RESUME_BASE, RESUME_FP32, RESUME_SCALER

from .framework import (Exercise, Lesson, expect_equal, expect_raises, expect_tensor_close, expect_tensors_close,
                        fail)

LESSON = Lesson(
    lesson_id="15",
    slug="checkpoint_resume",
    title="Checkpoint and exact resume",
    module="checkpoint",
    exercises=[
        Exercise("SkipBatchSampler", "15 §5.1", points=2, hidden_points=1),
        Exercise("save_checkpoint", "15 §5.2", points=2, hidden_points=2),
        Exercise("load_checkpoint", "15 §5.3", points=2, hidden_points=2),
        Exercise("resume_position", "15 §5.4", points=2, hidden_points=1),
    ],
    labs=("lesson15_resume.py", "lesson15_checkpoint_size.py"),
    notebook_mistake="non_atomic_write",
)
check = LESSON.check


class NotATensor:
    """Stands for any pickled object: ``weights_only=True`` must refuse to rebuild it."""


# The keys every resume checkpoint holds (the stub's docstring lists them).
CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "world_size")


def expect_raises_naming(what: str, fn, exc_type, names) -> None:
    """``fn()`` raises ``exc_type`` whose message contains every item of ``names``; an item that is a
    tuple is satisfied by any one of its strings (e.g. any parameter name)."""
    def wanted(options):
        shown = " or ".join(repr(o) for o in options[:3]) + (f" or one of {len(options) - 3} more"
                                                              if len(options) > 3 else "")
        return f"{exc_type.__name__} naming {shown}"
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
        fail(what, f"{type(exc).__name__}: {exc}", wanted(tuple(str(n) for n in names)))
    fail(what, "no exception", wanted(tuple(str(n) for n in names)))


def _fake_ddp(model):
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
        objects, records_before = train_until(scenario, stop_epoch, stop_step)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "resume.pth"
            save_objects(impl, path, objects, stop_epoch, stop_step)
            resumed = resume_and_finish(impl, scenario, path)
        compare_resumed(f"[{scenario.name}]", records_before, resumed, run_oracle(scenario))


@contextlib.contextmanager
def good_checkpoint(impl):
    """(trained objects, fresh target objects, temp dir, a good checkpoint of the trained ones there)."""
    objects, _ = train_until(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        good = Path(tmp) / "good.pth"
        save_objects(impl, good, objects, 0, 2)
        yield objects, training_objects(RESUME_BASE), tmp, good


# --- SkipBatchSampler --------------------------------------------------------------------------


@check("SkipBatchSampler")
def skip_batch_sampler_matches_upstream(impl):
    """Same batches and len as upstream's sampler for every skip in [0, ceil(N / bs)]; the lesson's example."""
    expect_equal("list(SkipBatchSampler(range(10), 3, 2)) (upstream example)",
                 [list(b) for b in impl.SkipBatchSampler(range(10), 3, 2)], [[6, 7, 8], [9]])
    for n in (1, 9, 10, 12):
        for batch_size in (1, 3, 4):
            for skip in range((n + batch_size - 1) // batch_size + 1):
                sampler = impl.SkipBatchSampler(list(range(100, 100 + n)), batch_size, skip)
                upstream = UpstreamSkipBatchSampler(list(range(100, 100 + n)), batch_size, skip)
                where = f"SkipBatchSampler(N={n}, batch_size={batch_size}, skip_batches={skip})"
                expect_equal(f"{where} batches", [list(b) for b in sampler], list(upstream))
                expect_equal(f"len({where})", len(sampler), len(upstream))


@check("SkipBatchSampler", hidden=True)
def skip_batch_sampler_rejects_bad_arguments(impl):
    """batch_size < 1, a negative skip, or a skip past the epoch raise ValueError naming the argument."""
    expect_raises("SkipBatchSampler(range(10), 0, 0)", lambda: impl.SkipBatchSampler(range(10), 0, 0), ValueError,
                  "batch_size")
    expect_raises("SkipBatchSampler(range(10), 3, -1)", lambda: impl.SkipBatchSampler(range(10), 3, -1),
                  ValueError, "skip_batches")
    expect_raises("SkipBatchSampler(range(10), 3, 5) (the epoch has 4 batches)",
                  lambda: impl.SkipBatchSampler(range(10), 3, 5), ValueError, "skip_batches")

# --- save_checkpoint ---------------------------------------------------------------------------


@check("save_checkpoint")
def save_checkpoint_writes_full_state(impl):
    """fp32 weights, optimizer, scaler, counters, world size, model config and extras, loadable weights_only."""
    scenario, stop_epoch, stop_step = RESUME_SCALER[0]
    objects, _ = train_until(scenario, stop_epoch, stop_step)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        save_objects(impl, path, objects, stop_epoch, stop_step, batch_size_semantics="micro_batch")
        saved = torch.load(path, map_location="cpu", weights_only=True)
        expect_equal("files in the checkpoint directory after a save", sorted(p.name for p in Path(tmp).iterdir()),
                     ["resume.pth"])
    keys = ["batch_size_semantics", "epoch", "model", "model_config", "optimizer", "scaler", "step", "world_size"]
    expect_equal("checkpoint keys", sorted(saved), keys)
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


def expect_optimizer_state_equal(what, actual: dict, expected: dict) -> None:
    expect_equal(f"{what}: param_groups", actual["param_groups"], expected["param_groups"])
    expect_equal(f"{what}: parameters with state", sorted(actual["state"]), sorted(expected["state"]))
    for index, state in expected["state"].items():
        for key, want in state.items():
            expect_tensor_close(f"{what}: {key} of parameter {index}", actual["state"][index][key], want,
                                rtol=0.0, atol=0.0)


def exploding_save(obj, f, *args, **kwargs):
    """Stands for a crash in the middle of ``torch.save``: some bytes reach the target, then an error."""
    if isinstance(f, (str, Path)):
        Path(f).write_bytes(b"PK\x03\x04 half-written checkpoint")
    else:
        f.write(b"PK\x03\x04 half-written checkpoint")
    raise OSError("simulated crash in the middle of torch.save")


@check("save_checkpoint", hidden=True, uses=("load_checkpoint",))
def save_checkpoint_is_atomic(impl):
    """A crash during a save leaves the previous checkpoint byte-identical and loadable, and no temp file."""
    with good_checkpoint(impl) as (objects, fresh, tmp, path):
        before = path.read_bytes()
        real_save = torch.save
        torch.save = exploding_save
        try:
            save_objects(impl, path, objects, 0, 2)
        except OSError:
            pass
        else:
            fail("save_checkpoint while torch.save crashes", "returned normally", "the OSError propagates")
        finally:
            torch.save = real_save
        after = path.read_bytes() if path.is_file() else None
        if after != before:
            fail(f"{path.name} after a crashed save", "missing" if after is None else f"{len(after)} bytes, changed",
                 f"the previous checkpoint, {len(before)} bytes, unchanged",
                 "write to a temporary file in the same directory, then os.replace it onto the path")
        expect_equal("files in the checkpoint directory after the crash", sorted(p.name for p in Path(tmp).iterdir()),
                     ["good.pth"])
        checkpoint = impl.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer, scaler=fresh.scaler)
        expect_equal("(epoch, step) of the previous checkpoint", (checkpoint["epoch"], checkpoint["step"]), (0, 2))


@check("save_checkpoint", hidden=True)
def save_checkpoint_refuses_pending_gradients(impl):
    """Zero gradients (zero_grad(set_to_none=False)) are not pending: the save works. Mid-accumulation
    (non-zero gradients, no optimizer step yet) a save raises ValueError naming 'accumulation', writing nothing."""
    objects, _ = train_until(RESUME_BASE, 0, 2)
    model = objects.model
    input_ids, labels = full_epoch_batches(RESUME_BASE, 0)[2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        model(input_ids, labels=labels).loss.backward()
        objects.optimizer.zero_grad(set_to_none=False)
        try:
            save_objects(impl, path, objects, 0, 2)
        except NotImplementedError:
            raise
        except Exception as exc:
            fail("save_checkpoint after optimizer.zero_grad(set_to_none=False) (all gradients are zero tensors)",
                 f"{type(exc).__name__}: {exc}", "the checkpoint is written",
                 "hint: a zero gradient is not a pending one: test for non-zero values, not for `grad is not None`")
        path.unlink()
        model(input_ids, labels=labels).loss.backward()
        expect_raises("save_checkpoint with pending gradients (micro-step 3 of a K=2 window)",
                      lambda: save_objects(impl, path, objects, 0, 3), ValueError, "accumulation")
        expect_equal("files written by the refused save", sorted(p.name for p in Path(tmp).iterdir()), [])


@check("save_checkpoint", hidden=True)
def save_checkpoint_writes_next_to_the_target(impl):
    """The parent directory is created; the temporary file lies in the target's directory (os.replace is a
    rename only there) and is fsync'd before os.replace puts it onto the target."""
    objects, _ = train_until(RESUME_BASE, 0, 2)
    calls = []
    real_replace, real_fsync = os.replace, os.fsync

    def spy_replace(src, dst, *args, **kwargs):
        calls.append(("replace", Path(src), Path(dst)))
        return real_replace(src, dst, *args, **kwargs)

    def spy_fsync(fd):
        calls.append(("fsync",))
        return real_fsync(fd)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "new" / "run" / "resume.pth"
        os.replace, os.fsync = spy_replace, spy_fsync
        try:
            save_objects(impl, path, objects, 0, 2)
        except NotImplementedError:
            raise
        except Exception as exc:
            fail(f"save_checkpoint into {path.parent}, which does not exist yet", f"{type(exc).__name__}: {exc}",
                 "the directory is created and the checkpoint written")
        finally:
            os.replace, os.fsync = real_replace, real_fsync
        replaces = [(i, call[1]) for i, call in enumerate(calls) if call[0] == "replace" and call[2] == path]
        if len(replaces) != 1:
            fail("os.replace(temporary file, path) calls during the save", len(replaces), 1)
        index, source = replaces[0]
        expect_equal("directory of the temporary file that os.replace moves onto the checkpoint",
                     str(source.parent.resolve()), str(path.parent.resolve()))
        expect_equal("os.fsync calls before os.replace", min(1, sum(call[0] == "fsync" for call in calls[:index])), 1)


@check("save_checkpoint")
def save_checkpoint_unwraps_ddp_and_compile(impl):
    """A model wrapped by DistributedDataParallel (keys 'module.'), torch.compile ('_orig_mod.') or both is
    saved as the model itself: the same keys as model.state_dict(), and its config."""
    objects, _ = train_until(RESUME_BASE, 0, 2)
    model = objects.model
    wrapped = {"DDP": _fake_ddp(model), "torch.compile": CompiledWrapper(model),
               "torch.compile of DDP": CompiledWrapper(_fake_ddp(model))}
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


@check("save_checkpoint", hidden=True)
def save_checkpoint_writes_on_rank_0_only(impl):
    """Under torch.distributed only rank 0 writes (every rank holds the same state); it records world_size."""
    objects, _ = train_until(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        with fake_rank(1, 2):
            save_objects(impl, path, objects, 0, 2)
        expect_equal("files written by rank 1 of 2", sorted(p.name for p in Path(tmp).iterdir()), [])
        with fake_rank(0, 2):
            save_objects(impl, path, objects, 0, 2)
        expect_equal("files written by rank 0 of 2", sorted(p.name for p in Path(tmp).iterdir()), ["resume.pth"])
        expect_equal("world_size saved by rank 0 of 2", torch.load(path, weights_only=True)["world_size"], 2)


@check("save_checkpoint", hidden=True)
def save_checkpoint_rejects_bad_counters(impl):
    """A negative epoch or step raises ValueError naming it."""
    objects, _ = train_until(RESUME_BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        expect_raises("save_checkpoint(epoch=-1)", lambda: save_objects(impl, path, objects, -1, 2), ValueError,
                      "epoch")
        expect_raises("save_checkpoint(step=-1)", lambda: save_objects(impl, path, objects, 0, -1), ValueError,
                      "step")

# --- load_checkpoint ---------------------------------------------------------------------------


@check("load_checkpoint", uses=("save_checkpoint",))
def load_checkpoint_restores_everything(impl):
    """Fresh model, optimizer and scaler get the saved state bit for bit; the dict carries counters and extras."""
    scenario, stop_epoch, stop_step = RESUME_SCALER[0]
    objects, _ = train_until(scenario, stop_epoch, stop_step)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    fresh = training_objects(scenario)
    fresh_model, fresh_optimizer, fresh_scaler = fresh.model, fresh.optimizer, fresh.scaler
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        save_objects(impl, path, objects, stop_epoch, stop_step, batch_size_semantics="micro_batch")
        checkpoint = impl.load_checkpoint(path, model=fresh_model, optimizer=fresh_optimizer, scaler=fresh_scaler)
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


def expect_refused(impl, what: str, path, objects, exc_type, mentions) -> None:
    """Loading ``path`` raises ``exc_type`` naming every item of ``mentions`` (a tuple: any of it); nothing changes."""
    before = snapshot(objects)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    expect_raises_naming(what, lambda: impl.load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler),
                         exc_type, mentions)
    expect_untouched(what, before, objects)


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
def load_checkpoint_rejects_unreadable_files(impl):
    """Missing, truncated and arbitrary-object files: a clear error naming the path, nothing loaded."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        missing = Path(tmp) / "missing.pth"
        expect_refused(impl, "load_checkpoint of a missing file", missing, target, FileNotFoundError, [str(missing)])
        truncated = Path(tmp) / "truncated.pth"
        truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
        expect_refused(impl, "load_checkpoint of a truncated file", truncated, target, ValueError, [str(truncated)])
        pickled = Path(tmp) / "pickled.pth"
        torch.save(dict(torch.load(good, weights_only=True), surprise=NotATensor()), pickled)
        expect_refused(impl, "load_checkpoint of a file holding a pickled object (needs weights_only=True)", pickled,
                       target, ValueError, [str(pickled)])


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
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

        wrong_shape = Path(tmp) / "wrong_shape.pth"
        name = "model.layers.0.self_attn.q_proj.weight"
        model_state = dict(saved["model"], **{name: torch.zeros(32, 64)})
        torch.save(dict(saved, model=model_state), wrong_shape)
        expect_refused(impl, f"load_checkpoint with {name} of shape (32, 64)", wrong_shape, target, ValueError,
                       [str(wrong_shape), name])

        config = dataclasses.asdict(objects.model.config)
        for other in (RESUME_BASE.with_(use_moe=True), RESUME_BASE.with_(num_hidden_layers=3), RESUME_BASE.with_(hidden_size=32)):
            other_file = Path(tmp) / f"other_{other.hidden_size}_{other.num_hidden_layers}_{other.use_moe}.pth"
            other_objects = train_until(other, 0, 2)[0]
            save_objects(impl, other_file, other_objects, 0, 2)
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
        expect_refused(impl, "load_checkpoint of upstream's resume file (fp16 weights)", upstream_file, target,
                       ValueError, [str(upstream_file), ("float16",) + parameter_names])

        other_optimizer = Path(tmp) / "other_optimizer.pth"
        torch.save(dict(saved, optimizer=torch.optim.SGD(objects.model.parameters()).state_dict()), other_optimizer)
        expect_refused(impl, "load_checkpoint with an SGD state for an AdamW optimizer", other_optimizer, target,
                       ValueError, [str(other_optimizer), "optimizer"])


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
def load_checkpoint_rejects_another_config_with_the_same_shapes(impl):
    """A checkpoint whose model_config differs only where no shape shows it (rope_theta): ValueError naming
    the path and 'rope_theta', nothing loaded."""
    with good_checkpoint(impl) as (_, target, tmp, good):
        saved = torch.load(good, weights_only=True)
        other_rope = Path(tmp) / "other_rope_theta.pth"
        torch.save(dict(saved, model_config=dict(saved["model_config"], rope_theta=1e4)), other_rope)
        expect_refused(impl, "load_checkpoint of a checkpoint with rope_theta=1e4 into a model with rope_theta=1e6",
                       other_rope, target, ValueError, [str(other_rope), "rope_theta"])


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
def load_checkpoint_rejects_a_disabled_scaler_state(impl):
    """A disabled GradScaler's (empty) state into an enabled scaler: ValueError naming the path and 'scaler'
    BEFORE the model or optimizer change (torch itself raises only inside scaler.load_state_dict)."""
    with good_checkpoint(impl) as (_, _, tmp, good):
        enabled = training_objects(RESUME_BASE.with_(scaler_enabled=True))
        expect_refused(impl, "load_checkpoint of a run without a GradScaler into an enabled GradScaler", good,
                       enabled, ValueError, [str(good), "scaler"])


@check("load_checkpoint", hidden=True, uses=("save_checkpoint",))
def load_checkpoint_rescales_step_for_world_size(impl):
    """Upstream's rule: step * saved_world_size // world_size when the world size changed."""
    with good_checkpoint(impl) as (_, _, _, path):
        torch.save(dict(torch.load(path, weights_only=True), world_size=2), path)
        for world_size, expected in ((2, 2), (1, 4), (4, 1), (3, 1)):
            fresh = training_objects(RESUME_BASE)
            checkpoint = impl.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer, scaler=fresh.scaler,
                                              world_size=world_size)
            expect_equal(f"step of a checkpoint saved at step 2 by 2 ranks, loaded with world_size={world_size}",
                         checkpoint["step"], expected)

# --- resume_position ---------------------------------------------------------------------------


@check("resume_position")
def resume_position_cases(impl):
    """Mid-epoch resumes where it stopped; an epoch-end checkpoint resumes at the next epoch's start."""
    for (epoch, step, iters), expected in [((0, 4, 6), (0, 4)), ((0, 6, 6), (1, 0)), ((1, 0, 6), (1, 0)),
                                           ((2, 1, 3), (2, 1)), ((0, 1, 1), (1, 0))]:
        expect_equal(f"resume_position({{'epoch': {epoch}, 'step': {step}}}, iters={iters})",
                     tuple(impl.resume_position({"epoch": epoch, "step": step}, iters)), expected)
    expect_raises("resume_position(step=7, iters=6)", lambda: impl.resume_position({"epoch": 0, "step": 7}, 6),
                  ValueError, "step")
    expect_raises("resume_position(iters=0)", lambda: impl.resume_position({"epoch": 0, "step": 0}, 0),
                  ValueError, "iters")


@check("resume_position", uses=("SkipBatchSampler", "save_checkpoint", "load_checkpoint"))
def exact_resume_fp32(impl):
    """Stop at an update boundary, save, load into fresh objects, finish: bitwise the uninterrupted run."""
    check_exact_resume(impl, RESUME_FP32)


@check("resume_position", hidden=True, uses=("SkipBatchSampler", "save_checkpoint", "load_checkpoint"))
def exact_resume_with_grad_scaler(impl):
    """Same with an enabled CPU GradScaler whose scale was halved before the stop: the scale must survive."""
    check_exact_resume(impl, RESUME_SCALER)


# --- mistake catalogue: each wrong variant FAILS the check named; equivalents PASS every check ----

LESSON.mistake("drops_optimizer_state", "restores the weights only: AdamW restarts with empty moments",
               '        optimizer.load_state_dict(checkpoint["optimizer"])\n', "        pass\n", exact_resume_fp32)
LESSON.mistake("saves_fp16_weights", "stores the model in fp16 like upstream's resume file: resume is inexact",
               '"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}',
               '"model": {k: v.detach().half().cpu() for k, v in model.state_dict().items()}',
               save_checkpoint_writes_full_state)
LESSON.mistake("does_not_skip_trained_batches", "the sampler ignores skip_batches: a resumed epoch retrains them",
               "            if position < skipped_samples:\n                continue\n", "",
               skip_batch_sampler_matches_upstream)
LESSON.mistake("drops_final_partial_batch", "the sampler drops the epoch's last, partial batch",
               "        if batch:\n            yield batch\n", "", skip_batch_sampler_matches_upstream)
LESSON.mistake("non_atomic_write", "torch.save straight onto the path: a crash mid-save destroys the last checkpoint",
               'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
               "fd, tmp_name = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), str(path)",
               save_checkpoint_is_atomic)
LESSON.mistake("forgets_the_scaler", "never restores the GradScaler: the scale restarts at 65536",
               "        scaler.load_state_dict(scaler_state)\n", "        pass\n", exact_resume_with_grad_scaler)
LESSON.mistake("saves_mid_accumulation", "saves while gradients are pending: the file silently lacks them",
               "    if any(p.grad is not None and bool(p.grad.ne(0).any()) for p in model.parameters()):\n",
               "    if False:\n", save_checkpoint_refuses_pending_gradients)
LESSON.mistake("weights_only_false", "torch.load(weights_only=False): a checkpoint can run arbitrary code",
               'torch.load(path, map_location="cpu", weights_only=True)',
               'torch.load(path, map_location="cpu", weights_only=False)', load_checkpoint_rejects_unreadable_files)
LESSON.mistake("loads_model_before_validating", "loads the weights, then finds the optimizer state is foreign",
               '    if optimizer is not None:\n        _validate_optimizer_state(path, checkpoint["optimizer"], optimizer)\n'
               '    scaler_state = checkpoint["scaler"]\n',
               '    model.load_state_dict(checkpoint["model"])\n    if optimizer is not None:\n'
               '        _validate_optimizer_state(path, checkpoint["optimizer"], optimizer)\n'
               '    scaler_state = checkpoint["scaler"]\n',
               load_checkpoint_rejects_foreign_checkpoints)
LESSON.mistake("no_world_size_rescale", "keeps the saved step after a world-size change (upstream rescales it)",
               '    if checkpoint["world_size"] != current:\n', "    if False:\n",
               load_checkpoint_rescales_step_for_world_size)
LESSON.mistake("resumes_one_step_late", "start_step = step + 1: the micro-batch after the checkpoint is skipped",
               "return (epoch + 1, 0) if step == iters else (epoch, step)",
               "return (epoch + 1, 0) if step == iters else (epoch, step + 1)", resume_position_cases)

LESSON.mistake("zero_grads_count_as_pending", "refuses any gradient tensor, also the zeros of zero_grad(set_to_none=False)",
               "    if any(p.grad is not None and bool(p.grad.ne(0).any()) for p in model.parameters()):\n",
               "    if any(p.grad is not None for p in model.parameters()):\n", save_checkpoint_refuses_pending_gradients)
LESSON.mistake("temp_file_in_system_tmp", "the temporary file goes to the system temp dir: os.replace is no longer a "
               "rename within one directory (and fails across file systems)",
               'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
               'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp")',
               save_checkpoint_writes_next_to_the_target)
LESSON.mistake("no_fsync", "os.replace of a file whose bytes may still sit in the page cache: a power cut can "
               "leave an empty checkpoint", "            os.fsync(handle.fileno())\n", "",
               save_checkpoint_writes_next_to_the_target)
LESSON.mistake("no_parent_directory", "writes into out_dir without creating it: FileNotFoundError on a first run",
               "    path.parent.mkdir(parents=True, exist_ok=True)\n", "", save_checkpoint_writes_next_to_the_target)
LESSON.mistake("keeps_wrapper_prefixes", "saves the wrapper's state_dict: keys 'module.' / '_orig_mod.' fit no "
               "plain model", "    model = _unwrapped(model)\n", "", save_checkpoint_unwraps_ddp_and_compile)
LESSON.mistake("unwraps_ddp_only", "strips DDP's 'module.' but keeps torch.compile's '_orig_mod.'",
               'while isinstance(model, DistributedDataParallel) or hasattr(model, "_orig_mod"):',
               "while isinstance(model, DistributedDataParallel):", save_checkpoint_unwraps_ddp_and_compile)
LESSON.mistake("every_rank_writes", "every rank writes the same file at once",
               "    if dist.is_initialized() and dist.get_rank() != 0:\n", "    if False:\n",
               save_checkpoint_writes_on_rank_0_only)
LESSON.mistake("config_compared_by_shapes_only", "accepts another model config when the shapes fit (rope_theta)",
               "    if saved_config is not None and config is not None and saved_config != config:\n",
               "    if False:\n", load_checkpoint_rejects_another_config_with_the_same_shapes)
LESSON.mistake("loads_a_disabled_scaler_state", "accepts a disabled scaler's empty state for an enabled scaler",
               "    if scaler is not None and scaler.is_enabled() and not scaler_state:\n", "    if False:\n",
               load_checkpoint_rejects_a_disabled_scaler_state)

LESSON.equivalent("ceil_by_negation", "-(-N // bs) instead of (N + bs - 1) // bs in __len__",
                  "(len(self.indices) + self.batch_size - 1) // self.batch_size - self.skip_batches",
                  "-(-len(self.indices) // self.batch_size) - self.skip_batches")
LESSON.equivalent("fixed_tmp_name", "upstream's fixed path + '.tmp' instead of a mkstemp name",
                  'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
                  'tmp_name = f"{path}.tmp"\n    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)')
