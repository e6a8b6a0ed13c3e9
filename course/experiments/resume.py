"""Lesson 15: interrupt a tiny run at an update boundary, resume it several ways, compare loss curves.

Every run is the oracle loop (``course.minimind``) on the CPU in fp32 with the same data and seed;
``impl`` supplies the checkpoint functions (``SkipBatchSampler``, ``save_checkpoint``,
``load_checkpoint``, ``resume_position``). Beside the exact resume, upstream's pitfalls:
  AdamW moments dropped   weights restored, AdamW restarted with empty moments  -> drift
  fp16 weights            upstream's resume file: the weights rounded to fp16    -> drift
  saved before the tail   upstream's save at step == iters, BEFORE the epoch's tail flush -> a lost update
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from course.minimind.trainer_utils import SkipBatchSampler as UpstreamSkipBatchSampler
from course.minimind.trainer_utils import lm_checkpoint
from course.runs import (LoopScenario, full_epoch_batches, resume_and_finish, run_oracle, run_oracle_epoch,
                         save_objects, train_until, training_objects)


def upstream_resume():
    """Upstream's resume as an implementation for ``resume_and_finish``: lm_checkpoint + load_state_dict."""
    def load_checkpoint(path, *, model, optimizer, scaler):
        data = lm_checkpoint(model.config, save_dir=str(Path(path).parent))
        model.load_state_dict(data["model"])  # fp16 values copied into fp32 parameters
        optimizer.load_state_dict(data["optimizer"])
        scaler.load_state_dict(data["scaler"])
        return data
    return SimpleNamespace(load_checkpoint=load_checkpoint, SkipBatchSampler=UpstreamSkipBatchSampler,
                           resume_position=lambda data, iters: (data["epoch"], data["step"]))


def without_adam_state(impl):
    """``impl``'s resume, except the optimizer state is never loaded (a weights-only resume)."""
    return SimpleNamespace(SkipBatchSampler=impl.SkipBatchSampler, resume_position=impl.resume_position,
                           load_checkpoint=lambda path, *, model, optimizer, scaler:
                           impl.load_checkpoint(path, model=model, scaler=scaler))


def upstream_file(folder: Path, scenario: LoopScenario) -> Path:
    return folder / f"pretrain_{scenario.hidden_size}{'_moe' if scenario.use_moe else ''}_resume.pth"


def drift(result, reference) -> float:
    """Largest |parameter difference| between two finished runs."""
    return max((result.params[n] - p).abs().max().item() for n, p in reference.params.items())


def tail_save_run(scenario: LoopScenario, folder: Path):
    """Epoch 0 with upstream's save at step == iters (before the tail flush), then resume from that file.

    Returns (resumed run, AdamW updates in the file, AdamW updates done in memory)."""
    objects = training_objects(scenario)
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    save_dir = folder / "tail"

    def save(epoch, step):
        lm_checkpoint(model.config, model=model, optimizer=optimizer, epoch=epoch, step=step,
                      save_dir=str(save_dir), scaler=scaler)
    batches = list(full_epoch_batches(scenario, 0))
    run_oracle_epoch(scenario, objects, 0, batches, 0, save_checkpoint=save)
    saved = torch.load(upstream_file(save_dir, scenario), map_location="cpu", weights_only=True)
    updates_in_file = int(max(s["step"] for s in saved["optimizer"]["state"].values()))
    updates_done = int(max(s["step"] for s in optimizer.state_dict()["state"].values()))
    resumed = resume_and_finish(upstream_resume(), scenario, upstream_file(save_dir, scenario))
    return resumed, updates_in_file, updates_done


def resume_runs(impl, scenario: LoopScenario, stop_epoch: int, stop_step: int, exact_label: str) -> dict:
    """The uninterrupted run and four resumes from an interruption at (stop_epoch, stop_step).

    ``scenario.iters`` must not be a multiple of its ``accumulation_steps`` (the tail-save pitfall
    needs a tail). Returns {"uninterrupted": run, "resumed": {label: run}, "tail_updates": (in file, done)}.
    """
    if scenario.iters % scenario.accumulation_steps == 0:
        raise ValueError(f"scenario.iters ({scenario.iters}) must not be a multiple of accumulation_steps "
                         f"({scenario.accumulation_steps}): the tail-flush pitfall needs a tail")
    objects, _ = train_until(scenario, stop_epoch, stop_step)
    resumed = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "resume.pth"
        save_objects(impl, path, objects, stop_epoch, stop_step)
        resumed[exact_label] = resume_and_finish(impl, scenario, path)
        resumed["AdamW moments dropped"] = resume_and_finish(without_adam_state(impl), scenario, path)
        model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
        lm_checkpoint(model.config, model=model, optimizer=optimizer, epoch=stop_epoch, step=stop_step,
                      save_dir=str(tmp), scaler=scaler)
        resumed["fp16 weights (upstream file)"] = resume_and_finish(upstream_resume(), scenario,
                                                                    upstream_file(tmp, scenario))
        tail, updates_in_file, updates_done = tail_save_run(scenario, tmp)
        resumed["saved before the tail flush (upstream)"] = tail
    return {"uninterrupted": run_oracle(scenario), "resumed": resumed,
            "tail_updates": (updates_in_file, updates_done)}


def draw_loss_curves(curves_ax, gap_ax, runs: dict, iters: int, interruption: int) -> None:
    """Left: uninterrupted and resumed loss curves over the global micro-step. Right: each resumed
    curve minus the uninterrupted one (symlog: the exact resume's 0 stays visible next to 1e-5 gaps)."""
    def step_of(record):
        return record["epoch"] * iters + record["step"]
    straight = runs["uninterrupted"]
    expected = {step_of(r): r["loss"] for r in straight.records}
    curves_ax.plot(list(expected), list(expected.values()), color="black", linewidth=3, alpha=0.35,
                   label="uninterrupted")
    for (name, result), style in zip(runs["resumed"].items(), ["-", "--", ":", "-."]):
        steps = [step_of(r) for r in result.records]
        curves_ax.plot(steps, [r["loss"] for r in result.records], style, label=f"resumed: {name}")
        gap_ax.plot(steps, [r["loss"] - expected[s] for s, r in zip(steps, result.records)], style, marker=".",
                    label=name)
    for ax in (curves_ax, gap_ax):
        ax.axvline(interruption, color="grey", linestyle=":", label="interruption (update boundary)")
        ax.set_xlabel("global micro-step (epoch * iters + step)")
        ax.legend(fontsize=8)
    gap_ax.set_yscale("symlog", linthresh=1e-6)
    gap_ax.set_xlim(curves_ax.get_xlim())
    curves_ax.set(ylabel="training loss of the micro-batch", title="Loss curves: resumed runs vs uninterrupted")
    gap_ax.set(ylabel="resumed loss - uninterrupted loss (symlog)",
               title="Difference from the uninterrupted run (exact resume: 0)")
