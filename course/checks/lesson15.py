"""Grading checks for lesson 15: checkpoint and exact resume.

Saving and loading do no arithmetic, so resume is graded BITWISE: a run interrupted at an update
boundary, saved, loaded into fresh objects and continued must give the very same records, parameters,
AdamW state and GradScaler scale as the uninterrupted oracle run. Training itself always runs on the
oracle loop (``course.minimind.train_pretrain.train_epoch``), so lesson 15 does not depend on lesson 14.
"""
from __future__ import annotations

import contextlib
import copy
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from course.minimind.trainer_utils import SkipBatchSampler as UpstreamSkipBatchSampler
from course.minimind.trainer_utils import lm_checkpoint

from .framework import (Exercise, Lesson, expect_equal, expect_raises, expect_tensor_close, expect_tensors_close,
                        fail)
from .tiny_runs import (LoopScenario, RunResult, _result, _training_objects, full_epoch_batches, run_oracle,
                        run_oracle_epoch)

LESSON = Lesson(
    lesson_id="15",
    title="Checkpoint and exact resume",
    module_path="core/checkpoint.py",
    lesson_file="15_checkpoint_resume.md",
    exercises=[
        Exercise("SkipBatchSampler", "15 §5.1"),
        Exercise("save_checkpoint", "15 §5.2"),
        Exercise("load_checkpoint", "15 §5.3"),
        Exercise("resume_position", "15 §5.4"),
    ],
)
check = LESSON.check

# A run of 2 epochs x 6 micro-batches; the stop points are update boundaries (multiples of K, or an
# epoch end after the tail flush).
BASE = LoopScenario("dense, K=2, stopped at epoch 0 step 4", accumulation_steps=2)
RESUME_FP32 = [
    (BASE, 0, 4),
    (BASE.with_(name="dense, K=4, stopped at the end of epoch 0 (after the tail flush)", accumulation_steps=4), 0, 6),
    (BASE.with_(name="MoE, K=2, stopped at epoch 1 step 2", use_moe=True), 1, 2),
]
RESUME_SCALER = [
    (BASE.with_(name="enabled GradScaler('cpu'), overflow in micro-step 2 halves the scale, stopped at epoch 0 "
                     "step 4", scaler_enabled=True, overflow_at_backward=2), 0, 4),
]


class NotATensor:
    """Stands for any pickled object: ``weights_only=True`` must refuse to rebuild it."""


# --- running an interrupted and a resumed run --------------------------------------------------


def sample_dataset(scenario: LoopScenario, epoch: int) -> list:
    """The epoch's micro-batches as single samples, so a batch sampler over ``range(len)`` rebuilds them."""
    return [(x[j], y[j]) for x, y in full_epoch_batches(scenario, epoch) for j in range(len(x))]


def train_until(scenario: LoopScenario, stop_epoch: int, stop_step: int):
    """Oracle training from scratch up to micro-step ``stop_step`` of ``stop_epoch``; (objects, records)."""
    objects = _training_objects(scenario)
    records = []
    for epoch in range(stop_epoch + 1):
        stop = stop_step if epoch == stop_epoch else scenario.iters
        records += run_oracle_epoch(scenario, objects, epoch, list(full_epoch_batches(scenario, epoch)[:stop]), 0)
    return objects, records


def save_objects(impl, path, objects, epoch: int, step: int, **extra) -> None:
    model, optimizer, scaler, _ = objects
    impl.save_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler, epoch=epoch, step=step, **extra)


def resume_and_finish(impl, scenario: LoopScenario, path) -> RunResult:
    """Fresh objects, ``impl.load_checkpoint`` + ``impl.resume_position``, batches from ``impl.SkipBatchSampler``."""
    objects = _training_objects(scenario.with_(overflow_at_backward=None))  # the overflow already happened
    model, optimizer, scaler, _ = objects
    checkpoint = impl.load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler)
    start_epoch, start_step = impl.resume_position(checkpoint, scenario.iters)
    records = []
    for epoch in range(start_epoch, scenario.epochs):
        skip = start_step if epoch == start_epoch else 0
        samples = sample_dataset(scenario, epoch)
        sampler = impl.SkipBatchSampler(range(len(samples)), scenario.batch_size, skip)
        records += run_oracle_epoch(scenario, objects, epoch, DataLoader(samples, batch_sampler=sampler), skip)
    return _result(model, optimizer, scaler, records)


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
    objects, _ = train_until(BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        good = Path(tmp) / "good.pth"
        save_objects(impl, good, objects, 0, 2)
        yield objects, _training_objects(BASE), tmp, good


# --- SkipBatchSampler --------------------------------------------------------------------------


@check("SkipBatchSampler")
def skip_batch_sampler_matches_upstream(impl):
    """Same batches and len as upstream's sampler for every skip in [0, ceil(N / bs)]; the notes' example."""
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


@check("SkipBatchSampler")
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
    model, optimizer, scaler, _ = objects
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


@check("save_checkpoint")
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
        checkpoint = impl.load_checkpoint(path, model=fresh[0], optimizer=fresh[1], scaler=fresh[2])
        expect_equal("(epoch, step) of the previous checkpoint", (checkpoint["epoch"], checkpoint["step"]), (0, 2))


@check("save_checkpoint")
def save_checkpoint_refuses_pending_gradients(impl):
    """Mid-accumulation (gradients accumulated, no optimizer step yet) a save raises ValueError."""
    objects, _ = train_until(BASE, 0, 2)
    model = objects[0]
    input_ids, labels = full_epoch_batches(BASE, 0)[2]
    model(input_ids, labels=labels).loss.backward()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        expect_raises("save_checkpoint with pending gradients (micro-step 3 of a K=2 window)",
                      lambda: save_objects(impl, path, objects, 0, 3), ValueError, "accumulation")
        expect_equal("files written by the refused save", sorted(p.name for p in Path(tmp).iterdir()), [])


@check("save_checkpoint")
def save_checkpoint_rejects_bad_counters(impl):
    """A negative epoch or step raises ValueError naming it."""
    objects, _ = train_until(BASE, 0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resume.pth"
        expect_raises("save_checkpoint(epoch=-1)", lambda: save_objects(impl, path, objects, -1, 2), ValueError,
                      "epoch")
        expect_raises("save_checkpoint(step=-1)", lambda: save_objects(impl, path, objects, 0, -1), ValueError,
                      "step")

# --- load_checkpoint ---------------------------------------------------------------------------


@check("load_checkpoint")
def load_checkpoint_restores_everything(impl):
    """Fresh model, optimizer and scaler get the saved state bit for bit; the dict carries counters and extras."""
    scenario, stop_epoch, stop_step = RESUME_SCALER[0]
    objects, _ = train_until(scenario, stop_epoch, stop_step)
    model, optimizer, scaler, _ = objects
    fresh_model, fresh_optimizer, fresh_scaler, _ = _training_objects(scenario)
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
    model, optimizer, scaler, _ = objects
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()), scaler.state_dict()


def expect_untouched(what: str, before, objects) -> None:
    """Nothing partially loaded: model, optimizer and scaler are exactly as before the failed load."""
    model_before, optimizer_before, scaler_before = before
    model, optimizer, scaler, _ = objects
    expect_tensors_close(f"{what}: model after the refused load", model.state_dict(), model_before,
                         rtol=0.0, atol=0.0)
    expect_optimizer_state_equal(f"{what}: optimizer after the refused load", optimizer.state_dict(), optimizer_before)
    expect_equal(f"{what}: GradScaler after the refused load", scaler.state_dict(), scaler_before)


def expect_refused(impl, what: str, path, objects, exc_type, mentions) -> None:
    """Loading ``path`` raises ``exc_type`` naming every item of ``mentions``; nothing changes."""
    before = snapshot(objects)
    model, optimizer, scaler, _ = objects
    for mention in mentions:
        expect_raises(what, lambda: impl.load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler),
                      exc_type, mention)
    expect_untouched(what, before, objects)


@check("load_checkpoint")
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


@check("load_checkpoint")
def load_checkpoint_rejects_foreign_checkpoints(impl):
    """Weights-only files, wrong shapes, another model config, fp16 weights, another optimizer: ValueError."""
    with good_checkpoint(impl) as (objects, target, tmp, good):
        saved = torch.load(good, weights_only=True)

        weights_only_file = Path(tmp) / "weights.pth"
        torch.save(objects[0].state_dict(), weights_only_file)
        expect_refused(impl, "load_checkpoint of a plain weights file", weights_only_file, target, ValueError,
                       [str(weights_only_file), "optimizer"])

        wrong_shape = Path(tmp) / "wrong_shape.pth"
        name = "model.layers.0.self_attn.q_proj.weight"
        model_state = dict(saved["model"], **{name: torch.zeros(32, 64)})
        torch.save(dict(saved, model=model_state), wrong_shape)
        expect_refused(impl, f"load_checkpoint with {name} of shape (32, 64)", wrong_shape, target, ValueError,
                       [str(wrong_shape), name])

        for other in (BASE.with_(use_moe=True), BASE.with_(num_hidden_layers=3), BASE.with_(hidden_size=32)):
            other_file = Path(tmp) / f"other_{other.hidden_size}_{other.num_hidden_layers}_{other.use_moe}.pth"
            save_objects(impl, other_file, train_until(other, 0, 2)[0], 0, 2)
            expect_refused(impl, f"load_checkpoint of a checkpoint from hidden_size={other.hidden_size}, "
                                 f"layers={other.num_hidden_layers}, use_moe={other.use_moe}",
                           other_file, target, ValueError, [str(other_file)])

        upstream_dir = Path(tmp) / "upstream"
        model, optimizer, scaler, _ = objects
        lm_checkpoint(model.config, model=model, optimizer=optimizer, epoch=0, step=2, save_dir=str(upstream_dir),
                      scaler=scaler)
        upstream_file = upstream_dir / f"pretrain_{BASE.hidden_size}_resume.pth"
        expect_refused(impl, "load_checkpoint of upstream's resume file (fp16 weights)", upstream_file, target,
                       ValueError, [str(upstream_file), "float16"])

        other_optimizer = Path(tmp) / "other_optimizer.pth"
        torch.save(dict(saved, optimizer=torch.optim.SGD(objects[0].parameters()).state_dict()), other_optimizer)
        expect_refused(impl, "load_checkpoint with an SGD state for an AdamW optimizer", other_optimizer, target,
                       ValueError, [str(other_optimizer)])


@check("load_checkpoint")
def load_checkpoint_rescales_step_for_world_size(impl):
    """Upstream's rule: step * saved_world_size // world_size when the world size changed."""
    with good_checkpoint(impl) as (_, _, _, path):
        torch.save(dict(torch.load(path, weights_only=True), world_size=2), path)
        for world_size, expected in ((2, 2), (1, 4), (4, 1), (3, 1)):
            fresh = _training_objects(BASE)
            checkpoint = impl.load_checkpoint(path, model=fresh[0], optimizer=fresh[1], scaler=fresh[2],
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


@check("resume_position")
def exact_resume_fp32(impl):
    """Stop at an update boundary, save, load into fresh objects, finish: bitwise the uninterrupted run."""
    check_exact_resume(impl, RESUME_FP32)


@check("resume_position")
def exact_resume_with_grad_scaler(impl):
    """Same with an enabled CPU GradScaler whose scale was halved before the stop: the scale must survive."""
    check_exact_resume(impl, RESUME_SCALER)
