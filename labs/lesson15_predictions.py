"""The answers to lesson 15 §4.1's predictions, measured with the lesson-15 reference and upstream's code.

    python labs/lesson15_predictions.py

Each block runs real code on the course's tiny model (CPU, fp32) and prints what the prediction asked for:
  1. SkipBatchSampler(range(11), 4, skip) for skip = 2, 3, 4: the batches and len, or the error;
  2. a checkpoint saved at a step by some ranks, loaded on another number of ranks: the step load_checkpoint
     returns, and, over a DistributedSampler of 48 samples (per-rank batch size 2), how many samples the
     resumed epoch trains a second time and how many it never trains;
  3. a resume from upstream's fp16-weights file: how far the parameters are from the interrupted run's right
     after loading, and from the uninterrupted run after the remaining AdamW updates;
  4. a save that crashes halfway (an OSError while torch.save writes): what is left on disk, with the
     reference save_checkpoint and with torch.save straight onto the path.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler

from course.experiments.resume import drift, upstream_file, upstream_resume
from course.implementations import load_implementation
from course.minimind.trainer_utils import lm_checkpoint
from course.runs import (LoopScenario, resume_and_finish, run_oracle, save_objects, train_until,
                         training_objects)
from course.runs.threads import cpu_threads

REFERENCE = load_implementation("checkpoint.py", "reference")
SAMPLES, PER_RANK_BATCH = 48, 2
# 2 epochs x 6 micro-batches, K = 4, interrupted at epoch 0 step 4 (labs/lesson15_resume.py's run)
SCENARIO = LoopScenario("resume lab", epochs=2, iters=6, batch_size=2, accumulation_steps=4)
STOP_EPOCH, STOP_STEP = 0, 4


class CrashWhilePickled:
    """An extra that raises an OSError when torch.save reaches it: a failure in the middle of a save."""

    def __reduce_ex__(self, protocol):
        raise OSError("simulated full disk in the middle of torch.save")


def sampler_answer(skip: int) -> str:
    try:
        sampler = REFERENCE.SkipBatchSampler(range(11), 4, skip)
    except ValueError as exc:
        return f"ValueError ({str(exc).split(' must')[0]})"
    return f"{[list(b) for b in sampler]}, len {len(sampler)}"


def shard_batches(world_size: int, rank: int):
    return DistributedSampler(range(SAMPLES), num_replicas=world_size, rank=rank, shuffle=True, seed=0)


def samples_of(world_size: int, step: int) -> tuple[set, set]:
    """(samples trained in the first ``step`` micro-steps on ``world_size`` ranks, samples a resumed epoch
    at ``step`` trains), each rank batching its DistributedSampler shard with SkipBatchSampler."""
    trained, rest = set(), set()
    for rank in range(world_size):
        shard = list(shard_batches(world_size, rank))
        trained |= set(shard[:step * PER_RANK_BATCH])
        rest |= {i for batch in REFERENCE.SkipBatchSampler(shard, PER_RANK_BATCH, step) for i in batch}
    return trained, rest


def rescale_answers(good: dict, folder: Path, target) -> list[str]:
    lines = []
    for saved_world, step, world in ((2, 6, 3), (2, 3, 4)):
        path = folder / f"saved_by_{saved_world}.pth"
        torch.save(dict(good, world_size=saved_world, step=step), path)
        loaded = REFERENCE.load_checkpoint(path, model=target.model, optimizer=target.optimizer,
                                           scaler=target.scaler, world_size=world)["step"]
        trained, _ = samples_of(saved_world, step)
        _, resumed = samples_of(world, loaded)
        lines.append(f"   saved at step {step} by {saved_world} ranks, loaded on {world}: step {loaded}; samples "
                     f"trained twice {len(trained & resumed)}, never trained {SAMPLES - len(trained | resumed)}")
    return lines


def fp16_answers(folder: Path) -> list[str]:
    objects, _ = train_until(SCENARIO, STOP_EPOCH, STOP_STEP)
    model = objects.model
    lm_checkpoint(model.config, model=model, optimizer=objects.optimizer, epoch=STOP_EPOCH, step=STOP_STEP,
                  save_dir=str(folder), scaler=objects.scaler)
    file = upstream_file(folder, SCENARIO)
    restored = training_objects(SCENARIO).model
    restored.load_state_dict(torch.load(file, map_location="cpu", weights_only=True)["model"])  # fp16 -> fp32
    at_load = max((restored.state_dict()[n] - p).abs().max().item() for n, p in model.state_dict().items())
    straight = run_oracle(SCENARIO)
    resumed = resume_and_finish(upstream_resume(), SCENARIO, file)
    updates = sum(r["update_closed"] for r in resumed.records)
    exact = resume_and_finish(REFERENCE, SCENARIO, save_exact(objects, folder))
    return [f"   right after loading: max |param - interrupted run| = {at_load:.3e}",
            f"   after {updates} more AdamW updates: max |param - uninterrupted| = {drift(resumed, straight):.3e} "
            f"(the fp32 checkpoint: {drift(exact, straight):.3e})"]


def save_exact(objects, folder: Path) -> Path:
    path = folder / "exact.pth"
    save_objects(REFERENCE, path, objects, STOP_EPOCH, STOP_STEP)
    return path


def loads(path: Path) -> str:
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        return f"no ({type(exc).__name__})"
    return "yes"


def crash_answers(objects, folder: Path) -> list[str]:
    lines = []
    for how in ("save_checkpoint (reference)", "torch.save onto the path"):
        directory = folder / how.split()[0]
        directory.mkdir()
        path = directory / "resume.pth"
        save_objects(REFERENCE, path, objects, 0, 2)
        before = path.read_bytes()
        try:
            if how.startswith("torch.save"):
                torch.save({"model": objects.model.state_dict(), "crash": CrashWhilePickled()}, path)
            else:
                save_objects(REFERENCE, path, objects, 0, 4, crash=CrashWhilePickled())
        except OSError:
            pass
        after = path.read_bytes() if path.exists() else b""
        lines.append(f"   {how:<28} files {sorted(p.name for p in directory.iterdir())}, "
                     f"{len(after)} of {len(before)} bytes, unchanged {after == before}, loads {loads(path)}")
    return lines


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main() -> None:
    print("1. SkipBatchSampler(range(11), batch_size=4, skip_batches=s):")
    for skip in (2, 3, 4):
        print(f"   s = {skip}: {sampler_answer(skip)}")
    print(f"2. world size change, {SAMPLES} samples, DistributedSampler(shuffle=True), per-rank batch size "
          f"{PER_RANK_BATCH}:")
    objects, _ = train_until(SCENARIO, 0, 4)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        good_path = save_exact(objects, tmp)
        good = torch.load(good_path, map_location="cpu", weights_only=True)
        for line in rescale_answers(good, tmp, training_objects(SCENARIO)):
            print(line)
    print(f"3. upstream's fp16-weights resume file, {SCENARIO.epochs} epochs x {SCENARIO.iters} micro-batches, "
          f"K = {SCENARIO.accumulation_steps}, interrupted at epoch {STOP_EPOCH} step {STOP_STEP}:")
    with tempfile.TemporaryDirectory() as tmp_name:
        for line in fp16_answers(Path(tmp_name)):
            print(line)
    print("4. a save that fails halfway (OSError inside torch.save) over a good checkpoint:")
    with tempfile.TemporaryDirectory() as tmp_name:
        for line in crash_answers(objects, Path(tmp_name)):
            print(line)


if __name__ == "__main__":
    main()
