"""Lesson 15 beyond its checks (those run in tests/test_lesson_checks.py): what only the reference and
the stage assembly can show: exact resume in a NEW process, a kill during a save,
the cost of a mid-accumulation save, and ``impl/train_pretrain_impl.py --resume``.

Runs compared bitwise across processes pin ``torch.set_num_threads(1)`` on both sides: CPU kernels
may split reductions differently with another thread count.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import warm_python
from stub_copies import untouched_impl

from mistake_results import mistake_result

from course.checks import get_lesson
from course.checks.framework import HARDENING, expect_equal
from course.checks.lesson15.checks import compare_resumed
from course.implementations import REPO_ROOT, load_implementation, load_module
from course.minimind.train_pretrain import build_training
from course.minimind.trainer_utils import SkipBatchSampler as UpstreamSkipBatchSampler
from course.minimind.trainer_utils import lm_checkpoint
from course.runs import (LoopScenario, RunResult, compute_oracle, full_epoch_batches, resume_and_finish, run_oracle,
                         run_oracle_epoch, save_objects, train_until, training_objects)
from course.runs.scenarios import RESUME_BASE, RESUME_FP32, RESUME_SCALER

ROOT = REPO_ROOT
REFERENCE = load_implementation("checkpoint.py", "reference")
train_pretrain_impl = load_module(ROOT / "impl" / "train_pretrain_impl.py", "test15_stage")

CHILD_RESUME = """
import json, sys, torch
torch.set_num_threads(1)
from course.implementations import load_implementation
from course.runs import LoopScenario, resume_and_finish
reference = load_implementation("checkpoint.py", "reference")
results = [resume_and_finish(reference, LoopScenario(**fields), path) for fields, path in json.loads(sys.argv[1])]
torch.save([dict(records=r.records, params=r.params, optimizer_state=r.optimizer_state, scale=r.scale)
            for r in results], sys.argv[2])
"""


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_upstream_oracle_sampler_and_checkpoint(tmp_path, monkeypatch):
    """The oracle keeps upstream's behaviour: upstream's sampler example, fp16 weights, the step rescale."""
    expect_equal("upstream SkipBatchSampler(range(10), 3, 2)", list(UpstreamSkipBatchSampler(range(10), 3, 2)),
                 [[6, 7, 8], [9]])
    expect_equal("upstream len with a skip past the end", len(UpstreamSkipBatchSampler(range(10), 3, 9)), 0)
    objects = training_objects(RESUME_BASE)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    lm_checkpoint(model.config, model=model, optimizer=optimizer, epoch=0, step=6, save_dir=str(tmp_path),
                  scaler=scaler)
    hidden = RESUME_BASE.hidden_size
    expect_equal("files written", sorted(p.name for p in tmp_path.iterdir()),
                 [f"pretrain_{hidden}.pth", f"pretrain_{hidden}_resume.pth"])
    monkeypatch.setattr("course.minimind.trainer_utils.current_world_size", lambda: 3)
    data = lm_checkpoint(model.config, save_dir=str(tmp_path))
    expect_equal("dtype of the resume file's weights", data["model"]["lm_head.weight"].dtype, torch.float16)
    expect_equal("step saved by 1 rank at 6, loaded by 3", data["step"], 2)


def test_exact_resume_in_a_new_process(tmp_path, one_thread):
    """Interrupt here, resume in a fresh interpreter: bitwise the uninterrupted run (dense, MoE, GradScaler)."""
    cases = RESUME_FP32 + RESUME_SCALER
    jobs, firsts = [], []
    for i, (scenario, stop_epoch, stop_step) in enumerate(cases):
        objects, records = train_until(scenario, stop_epoch, stop_step)
        path = tmp_path / f"resume_{i}.pth"
        save_objects(REFERENCE, path, objects, stop_epoch, stop_step)
        jobs.append((dataclasses.asdict(scenario), str(path)))
        firsts.append(records)
    out = tmp_path / "resumed.pt"
    proc = subprocess.run([sys.executable, "-c", CHILD_RESUME, json.dumps(jobs), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for (scenario, _, _), records, resumed in zip(cases, firsts, torch.load(out, weights_only=True)):
        uninterrupted = compute_oracle(scenario)  # computed here, with one thread
        compare_resumed(f"[{scenario.name}, new process]", records, RunResult(**resumed), uninterrupted)


class Interrupted(Exception):
    pass


def interrupted_mid_window(scenario, stop_after: int):
    """Oracle training of epoch 0 killed right after micro-step ``stop_after``'s backward (before any flush)."""
    objects = training_objects(scenario)
    batches = full_epoch_batches(scenario, 0)

    def loader():
        yield from batches[:stop_after]
        raise Interrupted

    with pytest.raises(Interrupted):
        run_oracle_epoch(scenario, objects, 0, loader(), 0)
    return objects


def test_mid_accumulation_save_is_refused_and_would_cost(tmp_path):
    """K=2, interrupted after micro-step 3: the reference refuses to save; dropping the pending gradient
    and resuming from step 3 anyway changes the final parameters (by more than float noise)."""
    objects = interrupted_mid_window(RESUME_BASE, 3)
    path = tmp_path / "resume.pth"
    with pytest.raises(ValueError, match="accumulat"):
        save_objects(REFERENCE, path, objects, 0, 3)
    assert not path.exists(), "a refused save must not write the file"
    objects.optimizer.zero_grad(set_to_none=True)  # what a save that ignores pending gradients amounts to
    save_objects(REFERENCE, path, objects, 0, 3)
    resumed, uninterrupted = resume_and_finish(REFERENCE, RESUME_BASE, path), run_oracle(RESUME_BASE)
    drift = max((resumed.params[n] - p).abs().max().item() for n, p in uninterrupted.params.items())
    assert drift > 1e-5, f"dropping micro-step 3's gradient should change the run; max |diff| = {drift:.3e}"


def test_stage_assembly_refuses_saves_inside_a_window(capsys):
    """--save_interval / --stop_after must be multiples of --accumulation_steps (exit 2, named flag)."""
    for flag in ("--save_interval", "--stop_after"):
        with pytest.raises(SystemExit) as exc:
            train_pretrain_impl.parse_args([flag, "6", "--accumulation_steps", "4"])
        assert exc.value.code == 2
        assert f"{flag} must be 0 or a positive multiple of --accumulation_steps (4), got 6" in capsys.readouterr().err


def test_stage_assembly_refuses_a_stop_inside_a_window_of_a_later_epoch(tmp_path, capsys):
    """27 is a multiple of K = 3, but with 20 micro-steps per epoch it is micro-step 7 of epoch 2: the loop would
    flush that partial window at the stop, which the uninterrupted run does not (exit 2, before any training)."""
    argv = ["--impl", "reference", "--preset", "tiny", "--epochs", "2", "--batch_size", "8", "--max_seq_len", "32",
            "--accumulation_steps", "3", "--stop_after", "27", "--out_dir", str(tmp_path)]
    assert train_pretrain_impl.main(argv) == 2
    assert ("--stop_after 27 is micro-step 7 of epoch 2 (20 micro-steps per epoch), inside an accumulation window"
            in capsys.readouterr().err)
    assert not list(tmp_path.iterdir()), "nothing may be written before the refusal"


KILL_DURING_SAVE = """
import os, signal, sys, torch
from course.implementations import load_implementation
from course.runs import save_objects, train_until
from course.runs.scenarios import RESUME_BASE
reference = load_implementation("checkpoint.py", "reference")
objects, _ = train_until(RESUME_BASE, 0, 4)
def killed_mid_write(obj, f, *args, **kwargs):
    f.write(b"PK\\x03\\x04 half a checkpoint")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = killed_mid_write
save_objects(reference, sys.argv[1], objects, 0, 4)
"""


def test_kill_during_save_leaves_the_previous_checkpoint(tmp_path):
    """SIGKILL in the middle of torch.save: the previous file is byte-identical and loads (epoch 0, step 2)."""
    path = tmp_path / "resume.pth"
    objects, _ = train_until(RESUME_BASE, 0, 2)
    save_objects(REFERENCE, path, objects, 0, 2)
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_SAVE, str(path)], cwd=ROOT, capture_output=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    assert path.read_bytes() == before, "the kill changed the previous checkpoint"
    fresh = training_objects(RESUME_BASE)
    checkpoint = REFERENCE.load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer, scaler=fresh.scaler)
    expect_equal("(epoch, step) after the kill", (checkpoint["epoch"], checkpoint["step"]), (0, 2))
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "resume.pth")
    assert all(name.endswith(".tmp") for name in leftovers), f"only a stray temp file may remain, found {leftovers}"


STAGE = ["--impl", "reference", "--preset", "tiny", "--epochs", "1", "--batch_size", "16", "--max_seq_len", "32",
         "--save_interval", "4"]


def test_stage_assembly_resume_continues_exactly(tmp_path, capsys):
    """--stop_after 4 then --resume: progress restarts at 4/10 and the final weights equal a straight run."""
    interrupted, straight = tmp_path / "interrupted", tmp_path / "straight"
    assert train_pretrain_impl.main(STAGE + ["--stop_after", "4", "--out_dir", str(interrupted)]) == 0
    resume_file = interrupted / "pretrain_48_resume.pth"
    assert "stopped after 4 micro-steps" in capsys.readouterr().out
    assert train_pretrain_impl.main(STAGE + ["--resume", str(resume_file), "--out_dir", str(interrupted)]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {resume_file}: epoch 1/1, step 4/10" in out, out[-2000:]
    assert " 4/10 [" in out, f"the progress bar should start at the resumed position:\n{out[-2000:]}"
    # a line per update that crosses a multiple of --log_interval 5: update 2 closes at micro-step 8
    assert "Epoch:[1/1](8/10)" in out and "(4/10), loss" not in out, out[-2000:]
    assert train_pretrain_impl.main(STAGE + ["--out_dir", str(straight)]) == 0
    resumed = torch.load(interrupted / "pretrain_48.pth", weights_only=True)
    for name, value in torch.load(straight / "pretrain_48.pth", weights_only=True).items():
        assert torch.equal(resumed[name], value), f"{name}: resumed run differs from the straight run"


def test_stage_assembly_rejects_bad_resume_files(tmp_path, capsys):
    """A truncated file or other flags than the interrupted run: exit 2 with the reason, no training."""
    assert train_pretrain_impl.main(STAGE + ["--stop_after", "4", "--out_dir", str(tmp_path)]) == 0
    resume_file = tmp_path / "pretrain_48_resume.pth"
    capsys.readouterr()
    assert train_pretrain_impl.main(STAGE + ["--learning_rate", "1e-3", "--resume", str(resume_file),
                                             "--out_dir", str(tmp_path)]) == 2
    assert "'learning_rate': (0.001, 0.0005)" in capsys.readouterr().err
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(resume_file.read_bytes()[:1000])
    assert train_pretrain_impl.main(STAGE + ["--resume", str(truncated), "--out_dir", str(tmp_path)]) == 2
    assert f"checkpoint '{truncated}'" in capsys.readouterr().err


def test_stage_assembly_on_stubs_says_todo_for_lesson_15(tmp_path):
    """--resume with untouched lesson-15 stubs: a TODO naming lesson 15, exit 1. The stubs are an untouched
    copy of impl/ (--impl-dir), so the test holds however far the student has got."""
    untouched = untouched_impl(tmp_path / "impl")
    proc = warm_python.run(["impl/train_pretrain_impl.py", "--impl-dir", str(untouched), "--resume",
                            str(tmp_path / "x.pth")], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Fill in impl/checkpoint.py (lesson 15 §5)" in proc.stderr, proc.stderr[-2000:]


def test_resume_checkpoint_of_the_default_config_is_small(tmp_path):
    """The default tiny config (hidden 48, 2 layers, vocab 6400; the stage assembly's --preset tiny, lessons 14-16's
    run): fp32 weights + 2 AdamW moments, under 5 MB."""
    args = train_pretrain_impl.parse_args(["--preset", "tiny"])
    scenario = LoopScenario("default tiny config")
    expect_equal("stage assembly --preset tiny (hidden_size, num_hidden_layers) vs the checks' default tiny config",
                 (args.hidden_size, args.num_hidden_layers), (scenario.hidden_size, scenario.num_hidden_layers))
    model, optimizer, scaler, _ = build_training(args)
    model(torch.ones(1, 4, dtype=torch.long), labels=torch.ones(1, 4, dtype=torch.long)).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    path = tmp_path / "resume.pth"
    REFERENCE.save_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler, epoch=0, step=4)
    params = sum(p.numel() for p in model.parameters())
    size = os.path.getsize(path)
    # 3 fp32 tensors per parameter (weights, exp_avg, exp_avg_sq); the tied lm_head is stored once.
    assert 12 * params <= size <= 12 * params + 200_000, f"{size} bytes for {params} parameters"
    assert size < 5_000_000, f"resume checkpoint ACTUAL {size} bytes, EXPECTED < 5,000,000 (5 MB)"


def test_stage_assembly_creates_out_dir_for_any_save_checkpoint(tmp_path, capsys):
    """Lesson 15 §7's interrupted run into a new nested --out_dir, with a save_checkpoint that does not create
    the parent directory itself (the catalogued mistake ``no_parent_directory``): the glue creates out_dir, so the
    run saves its resume checkpoint instead of crashing with FileNotFoundError."""
    mistake = next(m for m in get_lesson("15").mistakes if m.name == "no_parent_directory")
    submission = untouched_impl(tmp_path / "submission")
    (submission / "train_loop.py").write_text((REPO_ROOT / "course" / "reference" / "train_loop.py").read_text())
    (submission / "checkpoint.py").write_text(mistake.source())
    out_dir = tmp_path / "out" / "lesson15"
    stage = [a for a in STAGE if a not in ("--impl", "reference")]
    assert train_pretrain_impl.main(stage + ["--impl-dir", str(submission), "--stop_after", "4",
                                             "--out_dir", str(out_dir)]) == 0, capsys.readouterr().err[-2000:]
    assert (out_dir / "pretrain_48_resume.pth").is_file(), sorted(p.name for p in out_dir.parent.rglob("*"))


# --- failure messages name the broken rule --------------------------------------------------------
# A core mistake states its rule in the catalogue (``rule=``, tests/test_hint_rules.py); a hardening mistake's rule
# is listed here: its failure names the convention it breaks, too.

HARDENING_RULES = {
    "accepts_a_negative_batch_size": "then batch_size (an int >= 1",
    "skip_bound_rounds_up_a_full_epoch": "an int in [0, ceil(N / batch_size)]",
    "unsized_indices_unnamed": "check indices (sized, else TypeError)",
    "accepts_a_bool_batch_size": "an int >= 1, not a bool",
    "batch_size_checked_before_indices": "check indices (sized, else TypeError), then batch_size",
    "yields_tuples": "yield each batch as a list",
    "stores_extra_objects_raw": "an extra with a state_dict() is stored by it",
    "drops_none_extras": "one entry per extra keyword, whatever its value",
    "cleanup_skips_keyboard_interrupt": "every other BaseException included",
    "cleanup_skips_system_exit": "SystemExit and every other BaseException included",
    "no_parent_directory": "path.parent.mkdir(parents=True, exist_ok=True)",
    "renames_with_os_rename": "os.replace, not os.rename",
    "makedirs_of_an_empty_dirname": "a bare file name",
    "other_ranks_skip_validation": "every rank validates",
    "extra_overwrites_checkpoint_keys": "an extra named like a checkpoint key is refused",
    "accepts_float_counters": "1.0 is a float",
    "refuses_step_zero": "0 is valid",
    "accepts_a_bool_step": "True a bool",
    "save_leaves_eval_mode": "a save only reads what it is given",
    "save_clears_gradients": "no zero_grad",
    "nan_gradient_not_pending": "NaN and inf included",
    "refusal_names_no_path": "a ValueError naming the path",
    "ignores_extra_model_keys": "model keys both ways",
    "model_entries_not_checked_as_tensors": "every entry a tensor of the model's shape",
    "config_compared_over_model_fields": "the whole model_config both ways",
    "accepts_an_empty_optimizer_entry": "the optimizer entry a state_dict",
    "optimizer_groups_compared_pairwise": "with the same groups",
    "optimizer_state_shapes_unchecked": "state shapes (the same numel is not the same shape)",
    "optimizer_shapes_checked_for_matrices_only": "state shapes (the same numel is not the same shape)",
    "optimizer_state_compared_by_numel": "the same numel is not the same shape",
    "unknown_optimizer_ids_accepted": "no state under unknown ids",
    "unreadable_file_narrow_except": "whatever torch.load raises for an unreadable path",
    "directory_reported_missing": "a directory too",
    "accepts_a_file_without_a_dict": "a non-dict",
    "accepts_a_model_entry_of_none": "a model entry that is no dict",
    "checks_only_the_model_key": "each of the six keys",
    "accepts_world_size_zero": "world_size an int >= 1",
    "world_size_validated_after_loading": "refused before anything is loaded",
    "accepts_a_bool_world_size": "an int >= 1 (not a bool)",
    "no_map_location": 'map_location="cpu"',
    "resume_position_edits_the_checkpoint": "the checkpoint dict is read, never changed",
    "step_checked_before_iters": "check iters itself",
}


def hardening_mistakes() -> list:
    lesson = get_lesson("15")
    tiers = {c.name: c.tier for c in lesson.checks}
    return [m for m in lesson.mistakes if tiers[m.caught_by] == HARDENING]


@pytest.mark.parametrize("mistake", hardening_mistakes(), ids=lambda m: m.name)
def test_a_broken_convention_is_named(mistake):
    """Each hardening mistake fails its check with a message naming the convention it breaks."""
    rule = HARDENING_RULES.get(mistake.name)
    assert rule, f"{mistake.name}: no entry in HARDENING_RULES (the words its failure must contain)"
    result = mistake_result(mistake)
    assert result.status == "FAIL", f"{mistake.name}: {mistake.caught_by} says {result.status}"
    assert rule in result.message, f"{mistake.name}\n  ACTUAL: {result.message}\n  EXPECTED: ...{rule}..."


def test_every_listed_convention_is_a_hardening_mistake():
    """No stale entry: each name in HARDENING_RULES is a hardening mistake of the catalogue."""
    names = {m.name for m in hardening_mistakes()}
    stale = sorted(set(HARDENING_RULES) - names)
    assert not stale, f"entries of HARDENING_RULES that are no hardening mistake: ACTUAL {stale}, EXPECTED []"
