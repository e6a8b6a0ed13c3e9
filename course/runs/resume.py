"""Lesson 15's tiny runs: train up to a stop point, save, resume with an implementation, finish.

Training always runs on the oracle loop (``course.minimind``); ``impl`` supplies only the checkpoint
functions (``save_checkpoint``, ``load_checkpoint``, ``resume_position``, ``SkipBatchSampler``), so a
resume can be compared bit for bit with the run that never stopped.
"""
from __future__ import annotations

from torch.utils.data import DataLoader

from .loop import (LoopScenario, RunResult, TrainingObjects, full_epoch_batches, run_oracle_epoch, run_result,
                   training_objects)


def sample_dataset(scenario: LoopScenario, epoch: int) -> list:
    """The epoch's micro-batches as single samples, so a batch sampler over ``range(len)`` rebuilds them."""
    return [(x[j], y[j]) for x, y in full_epoch_batches(scenario, epoch) for j in range(len(x))]


def train_until(scenario: LoopScenario, stop_epoch: int, stop_step: int) -> tuple[TrainingObjects, list[dict]]:
    """Oracle training from scratch up to micro-step ``stop_step`` of ``stop_epoch``; (objects, records)."""
    objects = training_objects(scenario)
    records = []
    for epoch in range(stop_epoch + 1):
        stop = stop_step if epoch == stop_epoch else scenario.iters
        records += run_oracle_epoch(scenario, objects, epoch, list(full_epoch_batches(scenario, epoch)[:stop]), 0)
    return objects, records


def save_objects(impl, path, objects: TrainingObjects, epoch: int, step: int, **extra) -> None:
    """``impl.save_checkpoint`` of ``objects`` at (epoch, step), with ``extra`` keys."""
    impl.save_checkpoint(path, model=objects.model, optimizer=objects.optimizer, scaler=objects.scaler,
                         epoch=epoch, step=step, **extra)


def resume_and_finish(impl, scenario: LoopScenario, path) -> RunResult:
    """Fresh objects, ``impl.load_checkpoint`` + ``impl.resume_position``, batches from ``impl.SkipBatchSampler``."""
    objects = training_objects(scenario.with_(overflow_at_backward=None))  # the overflow already happened
    checkpoint = impl.load_checkpoint(path, model=objects.model, optimizer=objects.optimizer, scaler=objects.scaler)
    start_epoch, start_step = impl.resume_position(checkpoint, scenario.iters)
    records = []
    for epoch in range(start_epoch, scenario.epochs):
        skip = start_step if epoch == start_epoch else 0
        samples = sample_dataset(scenario, epoch)
        sampler = impl.SkipBatchSampler(range(len(samples)), scenario.batch_size, skip)
        records += run_oracle_epoch(scenario, objects, epoch, DataLoader(samples, batch_sampler=sampler), skip)
    return run_result(objects, records)
