"""Lesson 16: the acceptance matrix of the single-step protocol, mixed precision and DDP.

Exercise items run a check of ``course.checks.lesson16`` through the ``graded`` fixture (student
stubs skip as TODO, the reference must pass). Items about the runtime (run driver, trainer script,
resume, DDP) test ``course.protocol`` and ``course.trainers`` directly; the mistake catalogue is tests/test_mistakes.py.
"""
from __future__ import annotations

import gc
import math
import shutil
import weakref
from pathlib import Path

import pytest
import torch
from stub_copies import untouched_impl

from course.checks import get_lesson
from course.checks.catalogue import Mistake
from course.checks.framework import FAIL, expect_equal, expect_tensors_close, run_check
from course.checks.lesson16.checks import GRAD_ATOL, GRAD_RTOL
from course.implementations import REFERENCE_DIR, load_module
from course.minimind import TINY_CORPUS, PretrainDataset
from course.protocol.driver import LossReadback, run_text_training
from course.protocol.text import collate, token_weighted_step
from course.protocol.types import TrainingRunState
from course.reference import train_session as ref
from course.reference.checkpoint import save_checkpoint
from course.reference.train_loop import cosine_lr
from course.runs import (SESSION_SCENARIO, global_batch_gradients, grads_of, masked_micro_batches, new_session,
                         params_of, run_update, tiny_batches)
from course.trainers import session_text
from course.trainers.session_train_state import load_train_state, save_train_state

ROOT = Path(__file__).resolve().parents[1]
LESSON = get_lesson("16")

ACCEPTANCE_MATRIX = {  # protocol requirement -> the check that proves it for student and reference
    "unit: 2 micro-steps give exactly 1 optimizer step": "session_two_microsteps_one_optimizer_step",
    "unit: parameters_updated is False before the boundary": "session_two_microsteps_one_optimizer_step",
    "unit: force_update commits a tail": "session_force_update_commits_a_tail",
    "unit: global normalization equals one hand-built global-batch backward":
        "session_global_normalization_matches_one_backward",
    "unit: an error never lets a half update be reused": "session_error_invalidates_the_accumulation",
    "unit: a before_update abort never lets a half update be reused": "session_abort_discards_the_update",
    "unit: optimizer references stay the model's own parameters (Python's 'move')":
        "session_rejects_an_optimizer_on_other_tensors",
    "unit: normalization_units == 0 is an explicit error": "session_rejects_zero_normalization_units",
    "unit: loss sums stay on the device between boundaries": "session_keeps_loss_sums_on_device",
    "data: loss units count the shifted, unmasked targets": "count_loss_units_sees_the_shift",
    "integration: global 8 / accum 4 splits into 4 micro-batches of 2": "split_global_batch_micro_sizes",
    "integration: global % accum != 0 fails fast": "split_global_batch_fails_fast",
    "integration: steps_per_epoch = ceil(samples / 8)": "steps_per_epoch_is_ceil",
    "integration: the driver runs the implementation update by update": "session_drives_the_text_run",
    "compat: legacy state -> global semantics at the last update boundary": "migrate_legacy_state_to_global_semantics",
    "compat: new states pass": "migrate_legacy_state_to_global_semantics",
    "compat: unknown semantics and bad legacy values fail": "migrate_rejects_bad_states",
    "compat: the input is kept, the legacy keys dropped, the note says where": (
        "migrate_leaves_its_input_and_names_the_old_keys"),
    "compat: a legacy epoch end resumes at the next epoch": "migrate_resumes_an_epoch_end_at_the_next_epoch",
    "compat: missing legacy keys take their documented defaults": "migrate_fills_documented_legacy_defaults",
    "unit: clipping is applied; grad_norm is None without it": "session_clips_the_update",
    "unit: an error in backward or a hook also invalidates the accumulation":
        "session_error_anywhere_invalidates_the_accumulation",
    "unit: lr lands in every param group": "session_sets_lr_in_every_group",
    "unit: normalization_units is fixed within an update": "session_keeps_normalization_units_within_an_update",
    "unit: state() / load_state() round trip at a boundary": "session_state_round_trip_at_a_boundary",
    "unit: load_state refused inside an update": "session_load_state_only_at_a_boundary",
    "unit: an invalid accumulation is named, a KeyboardInterrupt included": "session_names_the_invalid_accumulation",
    "unit: closing, aborting and resetting leave no gradient tensors": "session_leaves_no_gradient_tensors",
    "amp: a skipped update runs no after_update": "session_skipped_update_calls_no_after_update",
    "amp: bf16 autocast wraps the step function": "session_runs_step_fn_under_autocast",
    "amp: GradScaler('cpu') overflow skips, unscale before clip": "session_amp_scaler_overflow_and_unscale_before_clip",
    "ddp: no_sync on every micro-step but the last": "session_uses_no_sync_before_the_last_microstep",
    "ddp: the closing micro-step runs outside no_sync (its backward all-reduces)":
        "session_closing_microstep_all_reduces_under_ddp",
    "unit: K=1 makes every micro-step an update": "session_k1_every_microstep_is_an_update",
    "unit: updates in a row start clean (K, lr, clip, a micro-batch without targets, an abort)":
        "session_consecutive_updates_start_clean",
    "unit: loss sums are accumulated detached": "session_accumulates_detached_loss_sums",
    "unit: a step_fn output of the wrong type or negative units is refused": "session_rejects_a_bad_step_output",
    "amp: a GradScaler scale that grew is no skip": "session_scaler_growth_is_no_skip",
    "compat: legacy states at the edges of their range": "migrate_handles_legacy_boundaries",
}


@pytest.mark.parametrize("item", list(ACCEPTANCE_MATRIX))
def test_acceptance_matrix(graded, item):
    graded(LESSON, ACCEPTANCE_MATRIX[item])


# --- hints: a failure that only shows a consequence names its likely cause -----------------

def catalogued(name: str):
    return next(m for m in LESSON.mistakes if m.name == name).build()


def variant(function: str, old: str, new: str):
    """The reference with one uncatalogued edit (a bug whose hint is computed from its numbers)."""
    return Mistake("hint_variant", "", function, old, new, lesson="16", module_file="train_session.py").build()


WEIGHT = "weight = output.gradient_units / options.normalization_units"
HINTS = [  # (check, wrong implementation, text its failure must contain)
    ("session_global_normalization_matches_one_backward", lambda: catalogued("loss_over_k"),
     "mean of micro-batch means (loss / K)"),
    ("session_consecutive_updates_start_clean", lambda: catalogued("loss_over_k"), "mean of micro-batch means"),
    ("session_global_normalization_matches_one_backward",
     lambda: variant("TrainingSession._train_step", WEIGHT, "weight = output.gradient_units"),
     "42 x the expected one (K=4, N=42): the loss was not divided by normalization_units"),
    ("session_global_normalization_matches_one_backward",
     lambda: variant("TrainingSession._train_step", WEIGHT, WEIGHT + " / self.accumulation_steps"),
     "0.25 x the expected one (K=4, N=42): the loss was divided by K on top"),
    ("session_global_normalization_matches_one_backward",
     lambda: variant("TrainingSession._train_step", "            self.scaler.scale(",
                     "            self.optimizer.zero_grad()\n            self.scaler.scale("),
     "only the last micro-batch's gradient is left"),
    ("count_loss_units_sees_the_shift", lambda: catalogued("counts_unshifted_labels"), "without the shift"),
    ("count_loss_units_sees_the_shift", lambda: catalogued("counts_masked_targets"), "counted masked targets"),
    ("session_drives_the_text_run", lambda: catalogued("counts_unshifted_labels"), "without the shift"),
    ("session_drives_the_text_run", lambda: catalogued("counts_masked_targets"), "counted masked targets"),
    ("session_clips_the_update", lambda: catalogued("norm_without_clipping"),
     "no clipping, the update is larger than clip_grad_norm allows"),
    ("session_clips_the_update", lambda: catalogued("clip_hard_coded"), "clipped to a norm of 1, not clip_grad_norm"),
    ("session_consecutive_updates_start_clean", lambda: catalogued("lr_from_the_constructor"), "options.lr"),
    ("session_skipped_update_calls_no_after_update", lambda: catalogued("after_update_on_skipped_step"),
     "after_update runs only when the optimizer stepped"),
    ("session_accumulates_detached_loss_sums", lambda: catalogued("loss_sum_kept_attached"),
     "output.loss_sum.detach()"),
]


@pytest.mark.parametrize("check_name, wrong, hint", HINTS, ids=[f"{c}-{h[:30]}" for c, _, h in HINTS])
def test_a_failure_names_the_cause_behind_its_numbers(check_name, wrong, hint):
    check = next(c for c in LESSON.checks if c.name == check_name)
    result = run_check(check, wrong())
    assert result.status == FAIL and "ACTUAL" in result.message, result.message
    assert "hint: " in result.message and hint in result.message, result.message


# --- data: masks per sample, token-weighted gradient on real padded samples ------------------

def padded_samples(count: int, max_length: int = 64) -> list:
    dataset = PretrainDataset(TINY_CORPUS, max_length=max_length)
    return [dataset[i] for i in range(count)]


def test_mask_is_decided_per_sample_and_carried_per_position():
    samples = padded_samples(6)
    batch = collate(samples, ref.count_loss_units)
    for i, (input_ids, labels) in enumerate(samples):
        expect_equal(f"sample {i}: -100 exactly at pad positions", (labels == -100).tolist(),
                     (input_ids == 0).tolist())
        expect_equal(f"batch row {i} carries sample {i}'s labels", batch.labels[i].tolist(), labels.tolist())
    per_sample = [ref.count_loss_units(labels) for _, labels in samples]
    expect_equal("batch loss_units = sum of per-sample counts", batch.loss_units, sum(per_sample))
    assert len(set(per_sample)) > 1, f"the corpus should give unequal valid lengths, got {per_sample}"


def test_unequal_micro_token_counts_give_the_global_batch_gradient():
    samples = sorted(padded_samples(8, max_length=16 * 4), key=lambda s: -ref.count_loss_units(s[1]))
    batches = [collate(m, ref.count_loss_units) for m in ref.split_global_batch(samples, 8, 4)]
    units = [b.loss_units for b in batches]
    assert len(set(units)) > 1, f"micro-batches must hold unequal token counts, got {units}"
    expected, _, _ = global_batch_gradients(batches)
    session = new_session(ref, 4)
    captured: dict = {}
    run_update(session, batches, before_update=lambda: captured.update(grads_of(session.model)) or False)
    expect_tensors_close(f"token-weighted gradient, micro units {units}", captured, expected,
                         rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_a_micro_batch_without_valid_tokens_contributes_nothing():
    batches = masked_micro_batches(cuts=((16, 15), (9, 3), (1, 0)))
    assert batches[-1].loss_units == 0
    expected, _, _ = global_batch_gradients(batches[:2])
    session = new_session(ref, 3)
    captured: dict = {}
    run_update(session, batches, before_update=lambda: captured.update(grads_of(session.model)) or False)
    expect_tensors_close("gradient with an all-masked 3rd micro-batch", captured, expected,
                         rtol=GRAD_RTOL, atol=GRAD_ATOL)


# --- integration: the run driver counts UPDATES ----------------------------------------------

def small_dataset(count: int = 20) -> list:
    input_ids, labels = tiny_batches(count, SESSION_SCENARIO.max_length, 1, 3)[0]
    return list(zip(input_ids, labels))


def drive(dataset, **kwargs):
    session = new_session(ref, 4, optimizer_cls=torch.optim.AdamW)
    run = kwargs.pop("run", None) or TrainingRunState(base_lr=1e-3)
    return session, run, run_text_training(session, dataset, run, global_batch_size=8, accumulation_steps=4, impl=ref,
                                           **kwargs)


def test_global_8_accum_4_feeds_8_samples_per_update():
    seen: list = []

    def counting_step(model, batch):
        seen.append(batch.input_ids.shape[0])
        return token_weighted_step(model, batch)
    session, _, records = drive(small_dataset(16), epochs=1, step_fn=counting_step)
    expect_equal("micro-batch sizes seen by step_fn", seen, [2] * 8)
    expect_equal("samples per update", [r["samples"] for r in records], [8, 8])
    expect_equal("optimizer steps", session.optimizer_step, 2)


def test_steps_per_epoch_and_the_short_tail_update():
    session, run, records = drive(small_dataset(20), epochs=2)
    expect_equal("(epoch, update_step, samples, microsteps) per update",
                 [(r["epoch"], r["update_step"], r["samples"], r["microsteps"]) for r in records],
                 [(0, 1, 8, 4), (0, 2, 8, 4), (0, 3, 4, 2), (1, 1, 8, 4), (1, 2, 8, 4), (1, 3, 4, 2)])
    expect_equal("optimizer steps = updates (tail included)", session.optimizer_step, 6)
    expect_equal("run state after 2 epochs", (run.epoch, run.update_step_in_epoch, run.global_step), (2, 0, 6))


def test_max_steps_checkpoint_and_lr_count_updates():
    saved = []
    session, run, records = drive(small_dataset(20), epochs=2, max_steps=4, save_interval=2,
                                  save_fn=lambda run_state: saved.append(run_state.global_step))
    expect_equal("global steps run with max_steps=4", [r["global_step"] for r in records], [1, 2, 3, 4])
    expect_equal("checkpoints at every 2nd UPDATE", saved, [2, 4])
    for r in records:
        expected_lr = cosine_lr(r["global_step"], 6, 1e-3)
        assert r["lr"] == expected_lr, f"update {r['global_step']}: ACTUAL lr {r['lr']!r} EXPECTED {expected_lr!r}"
        assert session.optimizer.param_groups[0]["lr"] == records[-1]["lr"]
    expect_equal("run state at max_steps", (run.epoch, run.update_step_in_epoch, run.global_step), (1, 1, 4))


class PushRecorder(LossReadback):
    def __init__(self):
        super().__init__()
        self.pushed: list[int] = []

    def push(self, global_step, loss_sum, loss_units):
        self.pushed.append(global_step)
        super().push(global_step, loss_sum, loss_units)


def test_one_loss_readback_per_update():
    readback = PushRecorder()
    _, _, records = drive(small_dataset(20), epochs=2, readback=readback, log_interval=2)
    expect_equal("global steps pushed to the readback, in order (6 updates: 3 per epoch)", readback.pushed,
                 list(range(1, 7)))
    expect_equal("values read back", readback.values_read, 6)
    losses = [r["loss"] for r in records]
    assert all(isinstance(v, float) and math.isfinite(v) and 5 < v < 12 for v in losses), (
        f"per-update mean token loss: ACTUAL {losses}, EXPECTED finite floats near ln(6400)=8.76")


@pytest.mark.parametrize("steps, bad", [([1, 2, 2], "2 pushed after 2"), ([1, 3], "3 pushed after 1")])
def test_loss_readback_refuses_a_duplicate_or_a_missing_push(steps, bad):
    readback = LossReadback()
    with pytest.raises(ValueError, match=bad):
        for step in steps:
            readback.push(step, torch.tensor(1.0), 1)


class UnitsRecorder(ref.TrainingSession):
    """The reference session, recording what the driver passes per micro-step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []

    def train_step(self, batch, options, step_fn):
        self.calls.append((batch.input_ids, options.normalization_units, options.force_update))
        return super().train_step(batch, options, step_fn)


def test_the_driver_passes_each_update_its_own_valid_target_count():
    dataset = padded_samples(20, max_length=32)
    # counted here, without the lesson's code: targets are positions 1.. whose label is not -100
    targets_of = {}
    for input_ids, labels in dataset:
        targets_of.setdefault(tuple(input_ids.tolist()), sum(1 for t in labels.tolist()[1:] if t != -100))
    model_session = new_session(ref, 4)
    session = UnitsRecorder(model_session.model, model_session.optimizer, accumulation_steps=4)
    run_text_training(session, dataset, TrainingRunState(), global_batch_size=8, accumulation_steps=4, epochs=1, impl=ref)
    updates, current = [], []
    for input_ids, units, closes in session.calls:
        current.append((input_ids, units))
        if closes:
            updates.append(current)
            current = []
    expect_equal("micro-steps per update (20 samples, global 8 / accum 4)", [len(u) for u in updates], [4, 4, 2])
    seen = sorted(tuple(row.tolist()) for update in updates for ids, _ in update for row in ids)
    expect_equal("samples trained in the epoch (each once)", seen, sorted(tuple(x.tolist()) for x, _ in dataset))
    passed = [sorted({units for _, units in update}) for update in updates]
    counted = [[sum(targets_of[tuple(row.tolist())] for ids, _ in update for row in ids)] for update in updates]
    assert len({c[0] for c in counted}) > 1, f"the updates should hold unequal target counts, got {counted}"
    expect_equal("normalization_units passed on every micro-step of each update vs valid shifted targets of "
                 "its samples counted by hand", passed, counted)


# --- compatibility: resume from new and legacy states ----------------------------------------

def test_resume_from_a_new_state_matches_the_straight_run(tmp_path):
    dataset = small_dataset(20)
    straight, _, _ = drive(dataset, epochs=2)
    first, run, _ = drive(dataset, epochs=2, max_steps=4)
    path = save_train_state(tmp_path / "s.pt", first, run, global_batch_size=8, accumulation_steps=4)
    resumed = new_session(ref, 4, optimizer_cls=torch.optim.AdamW)
    run2, note = load_train_state(path, resumed, global_batch_size=8, accumulation_steps=4, sample_count=20, identity="")
    expect_equal("restored run state", (run2.epoch, run2.update_step_in_epoch, run2.global_step, resumed.optimizer_step),
                 (1, 1, 4, 4))
    run_text_training(resumed, dataset, run2, global_batch_size=8, accumulation_steps=4, epochs=2, impl=ref)
    expect_tensors_close("parameters: resumed run vs straight run (bitwise, same process)",
                         params_of(resumed.model), params_of(straight.model), rtol=0.0, atol=0.0)


def test_resume_from_a_legacy_state_restarts_at_the_update_boundary(tmp_path):
    dataset = small_dataset(20)
    straight, _, _ = drive(dataset, epochs=1)
    one_update, _, _ = drive(dataset, epochs=1, max_steps=1)
    # a lesson-15 checkpoint in micro-batch semantics, labelled as saved mid-way through update 2
    # (``accum_steps``: that format's key for K)
    save_checkpoint(tmp_path / "legacy.pt", model=one_update.model, optimizer=one_update.optimizer, scaler=None,
                    epoch=0, step=7, batch_size=2, accum_steps=4)
    resumed = new_session(ref, 4, optimizer_cls=torch.optim.AdamW)
    run, note = load_train_state(tmp_path / "legacy.pt", resumed, global_batch_size=8, accumulation_steps=4, sample_count=20,
                                 identity="")
    assert "boundary" in note, note
    expect_equal("legacy resume point", (run.epoch, run.update_step_in_epoch, run.sample_position, run.global_step),
                 (0, 1, 8, 1))
    run.base_lr = 1e-3
    run_text_training(resumed, dataset, run, global_batch_size=8, accumulation_steps=4, epochs=1, impl=ref)
    expect_tensors_close("parameters: legacy resume vs straight run", params_of(resumed.model),
                         params_of(straight.model), rtol=0.0, atol=0.0)


def test_resume_from_a_legacy_state_saved_at_the_epoch_end_starts_the_next_epoch(tmp_path):
    """Micro-batch 2 x accum 4 over 20 samples is 10 micro-steps: step 10 was saved after the tail flush applied
    micro-steps 9-10, so nothing of epoch 0 may be trained again."""
    dataset = small_dataset(20)
    straight, _, _ = drive(dataset, epochs=2)
    first_epoch, _, _ = drive(dataset, epochs=2, max_steps=3)   # epoch 0: updates of 8, 8 and 4 samples
    save_checkpoint(tmp_path / "legacy.pt", model=first_epoch.model, optimizer=first_epoch.optimizer, scaler=None,
                    epoch=0, step=10, batch_size=2, accum_steps=4)
    resumed = new_session(ref, 4, optimizer_cls=torch.optim.AdamW)
    run, note = load_train_state(tmp_path / "legacy.pt", resumed, global_batch_size=8, accumulation_steps=4,
                                 sample_count=20, identity="")
    expect_equal("legacy epoch-end resume point: (epoch, update_step_in_epoch, sample_position, global_step, "
                 "optimizer_step)", (run.epoch, run.update_step_in_epoch, run.sample_position, run.global_step,
                                     resumed.optimizer_step), (1, 0, 0, 3, 3))
    assert "start of the next epoch" in note, note
    run.base_lr = 1e-3
    run_text_training(resumed, dataset, run, global_batch_size=8, accumulation_steps=4, epochs=2, impl=ref)
    expect_tensors_close("parameters: legacy epoch-end resume vs straight 2-epoch run (bitwise, same process)",
                         params_of(resumed.model), params_of(straight.model), rtol=0.0, atol=0.0)


def test_restore_rejects_a_legacy_state_of_another_sample_count(tmp_path):
    one_update, _, _ = drive(small_dataset(20), epochs=1, max_steps=1)
    save_checkpoint(tmp_path / "legacy.pt", model=one_update.model, optimizer=one_update.optimizer, scaler=None,
                    epoch=0, step=4, batch_size=2, accum_steps=4, sample_count=24)
    fresh = new_session(ref, 4, optimizer_cls=torch.optim.AdamW)
    params_before = params_of(fresh.model)
    with pytest.raises(ValueError, match="sample_count of the checkpoint is 24, this run reads 20"):
        load_train_state(tmp_path / "legacy.pt", fresh, global_batch_size=8, accumulation_steps=4, sample_count=20,
                         identity="")
    expect_tensors_close("parameters after a refused resume vs before it", params_of(fresh.model), params_before,
                         rtol=0.0, atol=0.0)


@pytest.mark.parametrize("mismatch", ["global_batch_size", "dataset_identity"])
def test_restore_rejects_a_different_run_and_leaves_the_session_untouched(tmp_path, mismatch):
    session, run, _ = drive(small_dataset(20), epochs=1, max_steps=1)
    run.dataset_identity = "tiny corpus, 20 samples"
    path = save_train_state(tmp_path / "s.pt", session, run, global_batch_size=8, accumulation_steps=4)
    fresh = new_session(ref, 4, optimizer_cls=torch.optim.AdamW)
    params_before = {name: value.clone() for name, value in params_of(fresh.model).items()}
    asked = {"global_batch_size": 4 if mismatch == "global_batch_size" else 8,
             "identity": "another corpus" if mismatch == "dataset_identity" else run.dataset_identity}
    with pytest.raises(ValueError, match=mismatch):
        load_train_state(path, fresh, accumulation_steps=4, sample_count=20, **asked)
    expect_tensors_close("parameters after a refused resume vs before it", params_of(fresh.model), params_before,
                         rtol=0.0, atol=0.0)
    expect_equal("AdamW state after a refused resume", fresh.optimizer.state_dict()["state"], {})


TRAINER_ARGS = ["--impl", "reference", "--global-batch-size", "8", "--accumulation-steps", "4", "--hidden-size", "32",
                "--num-hidden-layers", "1", "--max-seq-len", "16", "--no-progress", "--log-interval", "1"]


def test_trainer_script_saves_and_resumes_own_and_legacy(tmp_path, capsys):
    args = TRAINER_ARGS + ["--save-dir", str(tmp_path)]
    first = session_text.main(args + ["--max-steps", "2"])
    out = capsys.readouterr().out
    assert "Epoch:[1/1](2/20), loss:" in out, out
    expect_equal("first run: global steps", [r["global_step"] for r in first], [1, 2])
    state = torch.load(tmp_path / "train_state.pt", weights_only=True)
    expect_equal("saved semantics and position", (state["batch_size_semantics"], state["global_batch_size"],
                                                   state["global_step"]), ("global", 8, 2))
    resumed = session_text.main(args + ["--max-steps", "3", "--resume", str(tmp_path / "train_state.pt")])
    expect_equal("resumed run: global steps", [r["global_step"] for r in resumed], [3])
    legacy = {"epoch": 0, "step": 5, "batch_size": 2, "accum_steps": 4, "model": state["model"],
              "optimizer": state["optimizer"], "scaler": state["scaler"], "world_size": 1}
    torch.save(legacy, tmp_path / "legacy.pt")
    capsys.readouterr()
    from_legacy = session_text.main(args + ["--max-steps", "2", "--resume", str(tmp_path / "legacy.pt")])
    out = capsys.readouterr().out
    assert "legacy micro-batch semantics" in out and "update boundary" in out, out
    expect_equal("legacy resume: global steps", [r["global_step"] for r in from_legacy], [2])


def test_trainer_resumes_a_lesson15_stage_assembly_checkpoint(tmp_path, capsys):
    """The real legacy path: micro-batch 8 x accum 4, stopped after 8 micro-steps -> global 32, update 2."""
    stage = load_module(ROOT / "impl" / "train_pretrain_impl.py", "test16_stage")
    model_args = ["--hidden_size", "32", "--num_hidden_layers", "1", "--max_seq_len", "16"]
    assert stage.main(["--impl", "reference", "--preset", "tiny", "--epochs", "1", "--batch_size", "8",
                       "--accumulation_steps", "4",
                       "--save_interval", "8", "--stop_after", "8", "--out_dir", str(tmp_path)] + model_args) == 0
    capsys.readouterr()
    records = session_text.main([a.replace("_", "-") for a in model_args] + [
        "--impl", "reference", "--global-batch-size", "32", "--accumulation-steps", "4", "--max-steps", "3", "--no-progress", "--log-interval", "1",
        "--save-dir", str(tmp_path), "--resume", str(tmp_path / "pretrain_32_resume.pth")])
    out = capsys.readouterr().out
    assert "legacy micro-batch semantics" in out and "resumed at update 2 of epoch 0" in out, out
    expect_equal("global steps after resuming the stage assembly", [r["global_step"] for r in records], [3])
    state = torch.load(tmp_path / "train_state.pt", weights_only=True)
    expect_equal("saved (semantics, global batch, epoch, step = updates, global step)",
                 tuple(state[k] for k in ("batch_size_semantics", "global_batch_size", "epoch", "step", "global_step")),
                 ("global", 32, 0, 3, 3))


def test_trainer_resumes_a_stage_assembly_epoch_end_at_the_next_epoch(tmp_path, capsys):
    """160 samples in micro-batches of 6 with accum 4: the epoch ends at micro-step 27 = ceil(160 / 6), after a tail
    flush of micro-steps 25-27; as global batch 24 that is 7 updates, so the resume trains update 8 = update 1 of
    epoch 1."""
    stage = load_module(ROOT / "impl" / "train_pretrain_impl.py", "test16_stage_epoch_end")
    model_args = ["--hidden_size", "32", "--num_hidden_layers", "1", "--max_seq_len", "16"]
    assert stage.main(["--impl", "reference", "--preset", "tiny", "--epochs", "1", "--batch_size", "6",
                       "--accumulation_steps", "4",
                       "--save_interval", "4", "--out_dir", str(tmp_path)] + model_args) == 0
    saved = torch.load(tmp_path / "pretrain_32_resume.pth", weights_only=True)
    expect_equal("stage assembly's epoch-end checkpoint: (epoch, step)", (saved["epoch"], saved["step"]), (0, 27))
    capsys.readouterr()
    records = session_text.main([a.replace("_", "-") for a in model_args] + [
        "--impl", "reference", "--global-batch-size", "24", "--accumulation-steps", "4", "--epochs", "2",
        "--max-steps", "8", "--no-progress",
        "--log-interval", "1", "--save-dir", str(tmp_path), "--resume", str(tmp_path / "pretrain_32_resume.pth")])
    out = capsys.readouterr().out
    assert "resumed at update 0 of epoch 1" in out, out
    expect_equal("(epoch, update_step, samples) trained after the resume",
                 [(r["epoch"], r["update_step"], r["samples"]) for r in records], [(1, 1, 24)])


def test_trainer_rejects_a_global_batch_not_divisible_by_accumulation_steps(capsys):
    with pytest.raises(SystemExit) as exc:
        session_text.main(["--global-batch-size", "8", "--accumulation-steps", "3"])
    assert exc.value.code == 2
    assert "--global-batch-size (8)" in capsys.readouterr().err


def test_trainer_runs_the_implementation_of_impl_dir(tmp_path, capsys):
    """--impl-dir: a copy of the reference trains exactly like --impl reference."""
    submission = shutil.copytree(REFERENCE_DIR, tmp_path / "submission", ignore=shutil.ignore_patterns("__pycache__"))
    one_update = ["--max-steps", "1"]
    expected = session_text.main(TRAINER_ARGS + one_update + ["--save-dir", str(tmp_path / "reference")])
    actual = session_text.main(TRAINER_ARGS + one_update + ["--impl-dir", str(submission),
                                                             "--save-dir", str(tmp_path / "dir")])
    assert f"TrainingSession from {submission}" in capsys.readouterr().out
    expect_equal("--impl-dir copy of the reference: update records", actual, expected)
    assert (tmp_path / "dir" / "train_state.pt").is_file()


def test_trainer_on_untouched_stubs_prints_one_todo_line_and_exits_1(tmp_path, capsys):
    stubs = untouched_impl(tmp_path / "impl")
    with pytest.raises(SystemExit) as exc:
        session_text.main(["--impl-dir", str(stubs), "--save-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 1, err
    assert err.count("\n") == 1 and "lesson 16 §4.3" in err and "train_session.py" in err \
        and "`python -m course check 16`" in err, err
    assert not (tmp_path / "out").exists(), "a TODO run must not write a training state"


def test_trainer_refuses_a_missing_impl_dir_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        session_text.main(["--impl-dir", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--impl-dir" in err, err


# --- mixed precision ----------------------------------------------------------------------

def test_bf16_autocast_update_points_like_fp32():
    batches = masked_micro_batches()
    expected, _, _ = global_batch_gradients(batches)
    session = new_session(ref, 4, autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    captured: dict = {}
    run_update(session, batches, before_update=lambda: captured.update(grads_of(session.model)) or False)
    flat = lambda g: torch.cat([t.flatten() for _, t in sorted(g.items())]).double()  # noqa: E731
    cosine = float(torch.nn.functional.cosine_similarity(flat(captured), flat(expected), dim=0))
    # bf16 keeps 8 mantissa bits: the gradient is not bitwise fp32, but must point the same way.
    assert cosine > 0.999, f"bf16 vs fp32 global-batch gradient cosine: ACTUAL {cosine:.6f}, EXPECTED > 0.999"


def test_grad_scaler_overflow_keeps_the_scale_during_accumulation():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    session = new_session(ref, 4, scaler=scaler)
    scales = []
    batches = masked_micro_batches()
    units = sum(b.loss_units for b in batches)
    hook = session.model.model.norm.weight.register_hook(lambda g: g + float("inf"))
    for i, b in enumerate(batches):
        report = session.train_step(b, ref.TrainingStepOptions(normalization_units=units, clip_grad_norm=1.0,
                                                               force_update=i == 3), token_weighted_step)
        scales.append(scaler.get_scale())
    hook.remove()
    expect_equal("scale after each micro-step (halved only at the boundary)", scales, [1024.0] * 3 + [512.0])
    expect_equal("overflow report", (report.overflow_skipped, report.parameters_updated), (True, False))


# --- DDP ----------------------------------------------------------------------------------

@pytest.mark.ddp
def test_ddp_gradients_equal_the_single_process_global_batch():
    from course.trainers.session_ddp import spawn_ddp_update
    ranks = spawn_ddp_update(2)
    expected, _, _ = global_batch_gradients(masked_micro_batches())
    for rank, result in enumerate(ranks):
        expect_tensors_close(f"rank {rank}: token-weighted DDP gradient vs single-process global batch",
                             result["token_weighted"], expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    worst = max(float((ranks[0]["naive_mean"][n] - g).abs().max()) for n, g in expected.items())
    assert worst > 1e-2, f"naive loss/K under DDP should differ from the global batch: max |diff| {worst:.3e}"



@pytest.mark.ddp
def test_gloo_process_group_frees_ddp_objects_before_teardown():
    # DDP sits in reference cycles; if only interpreter shutdown frees it, the gloo teardown
    # aborts now and then (SIGABRT, seen in CI), so the context manager must collect first.
    from torch.nn.parallel import DistributedDataParallel
    from course.runs.distributed import free_port, process_group
    collector_was_enabled = gc.isenabled()
    gc.disable()   # keep the automatic collector from doing the context manager's job
    try:
        with process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1):
            model = DistributedDataParallel(torch.nn.Linear(2, 2))
            model.in_a_cycle = [model]   # DDP often sits in one (how often depends on torch's state)
            ddp = weakref.ref(model)
            del model
            assert ddp() is not None, "the cycle should keep the DDP object alive until collected"
        assert ddp() is None, "ACTUAL: DDP object alive after process_group; EXPECTED: freed before destroy"
    finally:
        if collector_was_enabled:
            gc.enable()


def run_trainer(tmp_path, capsys, *flags) -> tuple[list[float], dict]:
    records = session_text.main(TRAINER_ARGS + ["--max-steps", "3", "--save-dir", str(tmp_path / "_".join(flags))]
                              + list(flags))
    capsys.readouterr()
    state = torch.load(tmp_path / "_".join(flags) / "train_state.pt", weights_only=True)
    return [r["loss"] for r in records], state["scaler"]


# Autocast rounds each matmul to eps 7.8e-3 (bf16) / 9.8e-4 (fp16); the mean losses over 120 tokens of a
# random-init model stay far closer to fp32 than that (measured <= 1.4e-4 for 3 updates).
AUTOCAST_LOSS_ATOL = 1e-2


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_trainer_dtype_flag_autocasts_and_scales_fp16_only(tmp_path, capsys, dtype):
    fp32_losses, fp32_scaler = run_trainer(tmp_path, capsys, "--device", "cpu")
    losses, scaler = run_trainer(tmp_path, capsys, "--device", "cpu", "--dtype", dtype)
    expect_equal("--dtype float32: a disabled GradScaler saves an empty state", fp32_scaler, {})
    for step, (actual, expected) in enumerate(zip(losses, fp32_losses), start=1):
        assert abs(actual - expected) <= AUTOCAST_LOSS_ATOL, (
            f"--dtype {dtype}, update {step}: loss ACTUAL {actual!r} vs fp32 EXPECTED {expected!r} "
            f"(atol {AUTOCAST_LOSS_ATOL}: autocast rounding)")
    # One mean over 120 tokens can round to the fp32 bits by chance (seen for fp16 on an AMD EPYC); three cannot.
    assert losses != fp32_losses, f"--dtype {dtype}: every loss is fp32's bit for bit ({losses}): autocast did not run"
    if dtype == "bfloat16":
        expect_equal("--dtype bfloat16: GradScaler state (disabled: bf16 has fp32's range)", scaler, {})
    else:
        fresh = torch.amp.GradScaler("cpu")
        expect_equal("--dtype float16: enabled GradScaler (scale, clean steps counted)",
                     (scaler.get("scale"), scaler.get("_growth_tracker")), (fresh.get_scale(), len(losses)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_trainer_device_cuda_without_cuda_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        session_text.main(TRAINER_ARGS + ["--device", "cuda"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--device cuda" in err, f"exit {exit_info.value.code}:\n{err}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_trainer_on_cuda_tracks_the_cpu_run(tmp_path, capsys, dtype):
    cpu_losses, _ = run_trainer(tmp_path, capsys, "--device", "cpu")
    losses, scaler = run_trainer(tmp_path, capsys, "--device", "cuda", "--dtype", dtype)
    for step, (actual, expected) in enumerate(zip(losses, cpu_losses), start=1):
        assert abs(actual - expected) <= AUTOCAST_LOSS_ATOL, (
            f"--device cuda --dtype {dtype}, update {step}: loss ACTUAL {actual!r} vs CPU fp32 EXPECTED {expected!r} "
            f"(atol {AUTOCAST_LOSS_ATOL}: other kernels and autocast rounding)")
    expect_equal("GradScaler enabled for float16 only", bool(scaler), dtype == "float16")
