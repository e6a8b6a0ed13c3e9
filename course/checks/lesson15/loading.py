"""Lesson 15 checks of ``load_checkpoint``: everything restored, or a clear refusal that changes
nothing (unreadable, foreign, another config, a disabled scaler's state); the step rescaled for a new world size."""
from __future__ import annotations

import copy
import dataclasses
import tempfile
from pathlib import Path

import torch

from course.minimind.trainer_utils import lm_checkpoint
from course.runs import save_objects, train_until, training_objects
from course.runs.scenarios import RESUME_BASE, RESUME_SCALER

from ..framework import check, expect_equal, expect_tensors_close
from .checks import CHECKPOINT_KEYS, NotATensor, expect_raises_naming, good_checkpoint
from .saving import expect_optimizer_state_equal


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
