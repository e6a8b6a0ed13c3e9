"""A MiniMind-style pretrain script on the lesson-16 protocol, running YOUR TrainingSession by default.

``--global-batch-size`` is the GLOBAL batch (samples per optimizer update) and ``--accumulation-steps``
the micro-steps per update, so the micro-batch is ``global_batch_size / accumulation_steps`` (lesson 16
§5.3); the stage assembly's ``--batch_size`` is the micro-batch. ``--impl`` / ``--impl-dir`` choose whose
``train_session.py`` (lesson 16) and ``checkpoint.py`` (lesson 15) run. The script saves ``train_state.pt``,
a lesson-15 resume checkpoint carrying ``batch_size_semantics="global"``, and resumes from it or from a
legacy one (``batch_size`` = micro-batch, ``step`` = micro-steps, e.g. ``impl/train_pretrain_impl.py
--save_interval``), at the last update boundary.

    python -m course.trainers.session_text                       # yours: impl/train_session.py, impl/checkpoint.py
    python -m course.trainers.session_text --impl reference --global-batch-size 8 --accumulation-steps 4
    python -m course.trainers.session_text --impl reference --resume out/lesson16/train_state.pt
    python -m course.trainers.session_text --impl reference --device cuda --dtype float16   # autocast + GradScaler
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm import tqdm

from course.implementations import add_impl_arguments, impl_root, load_implementation
from course.minimind import (TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig,
                             MiniMindForCausalLM, PretrainDataset, setup_seed)
from course.protocol.driver import LossReadback, dataset_identity, run_text_training
from course.protocol.types import TrainingRunState
from course.runs.threads import add_threads_argument, cpu_threads
from course.trainers.session_train_state import load_train_state, save_train_state

AUTOCAST_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_impl_arguments(parser, "train_session.py (lesson 16) and checkpoint.py (lesson 15)")
    parser.add_argument("--global-batch-size", type=int, default=8, help="GLOBAL batch: samples per optimizer update")
    parser.add_argument("--accumulation-steps", type=int, default=4, help="micro-steps per update")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many UPDATES (0 = no limit)")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the model lives; the step functions move each batch there")
    parser.add_argument("--dtype", choices=list(AUTOCAST_DTYPES), default="float32",
                        help="bfloat16 / float16 = autocast on --device; float16 also enables a GradScaler")
    parser.add_argument("--hidden-size", type=int, default=TINY_HIDDEN_SIZE)
    parser.add_argument("--num-hidden-layers", type=int, default=TINY_NUM_HIDDEN_LAYERS)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--data-path", default=str(TINY_CORPUS))
    parser.add_argument("--log-interval", type=int, default=5, help="log every N updates")
    parser.add_argument("--save-interval", type=int, default=0, help="also save every N updates (0 = only at the end)")
    parser.add_argument("--save-dir", default="out/lesson16")
    parser.add_argument("--resume", default=None, help="a train_state.pt of this script, or a legacy (micro-batch) lesson-15 checkpoint")
    parser.add_argument("--seed", type=int, default=42)
    add_threads_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv=None) -> list[dict]:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("global_batch_size", "accumulation_steps", "epochs", "log_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.global_batch_size % args.accumulation_steps:
        parser.error(f"--global-batch-size ({args.global_batch_size}) must be divisible by "
                     f"--accumulation-steps ({args.accumulation_steps})")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine; use --device cpu")
    try:
        impl_root(args.impl, args.impl_dir)
    except ValueError as exc:
        parser.error(str(exc))
    impl = load_implementation("train_session.py", args.impl, args.impl_dir)
    checkpoint = load_implementation("checkpoint.py", args.impl, args.impl_dir)
    try:
        with cpu_threads(args.threads):
            return train(args, impl, checkpoint)
    except NotImplementedError as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1].filename
        lesson, module = ("15", checkpoint) if where == checkpoint.__file__ else ("16", impl)
        print(f"{exc}: fill in {os.path.relpath(module.__file__)}, then run `python -m course check {lesson}`",
              file=sys.stderr)
        raise SystemExit(1) from None


def train(args, impl, checkpoint) -> list[dict]:
    """Train with ``impl``'s TrainingSession (lesson 16) and save / resume with ``checkpoint`` (lesson 15)."""
    setup_seed(args.seed)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers))
    model.to(args.device)  # in place, before the optimizer is built from its parameters
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    dtype = AUTOCAST_DTYPES[args.dtype]
    autocast = nullcontext() if dtype is None else torch.autocast(args.device, dtype=dtype)
    scaler = torch.amp.GradScaler(args.device, enabled=args.dtype == "float16")  # fp16 only, as upstream
    session = impl.TrainingSession(model, optimizer, accumulation_steps=args.accumulation_steps, scaler=scaler,
                                   autocast=autocast)
    dataset = PretrainDataset(args.data_path, max_length=args.max_seq_len)
    identity = dataset_identity(dataset, Path(args.data_path).name)
    run = TrainingRunState(dataset_identity=identity, seed=args.seed, base_lr=args.learning_rate)
    if args.resume:
        run, note = load_train_state(args.resume, session, global_batch_size=args.global_batch_size,
                                     accumulation_steps=args.accumulation_steps, sample_count=len(dataset),
                                     identity=identity, impl=impl, checkpoint=checkpoint)
        print(f"resume: {note}")
    micro = args.global_batch_size // args.accumulation_steps
    print(f"LLM params: {sum(p.numel() for p in model.parameters()) / 1e6:.3f} M; global batch "
          f"{args.global_batch_size} = {args.accumulation_steps} micro-steps x {micro} samples; "
          f"{len(dataset)} samples; TrainingSession from {args.impl_dir or args.impl}")

    save_path = Path(args.save_dir) / "train_state.pt"

    def save(run_state):
        save_train_state(save_path, session, run_state, global_batch_size=args.global_batch_size,
                         accumulation_steps=args.accumulation_steps, checkpoint=checkpoint)
    start_time = time.time()
    progress = tqdm(total=args.max_steps or None, initial=run.global_step, unit="update", disable=args.no_progress)

    def log(record):
        minutes = (time.time() - start_time) / 60
        tqdm.write(f"Epoch:[{record['epoch'] + 1}/{args.epochs}]({record['update_step']}/{record['updates_per_epoch']}), "
                   f"loss: {record['loss']:.4f}, lr: {record['lr']:.8f}, tokens: {record['normalization_units']}, "
                   f"epoch_time: {minutes:.1f}min")

    def advance(record):
        if progress.total is None:
            progress.total = args.epochs * record["updates_per_epoch"]
        progress.update(1)

    records = run_text_training(session, dataset, run, global_batch_size=args.global_batch_size,
                                accumulation_steps=args.accumulation_steps, epochs=args.epochs,
                                grad_clip=args.grad_clip, max_steps=args.max_steps,
                                save_interval=args.save_interval, save_fn=save,
                                log_interval=args.log_interval, log_fn=log, readback=LossReadback(),
                                on_update=advance, impl=impl)
    progress.close()
    save(run)
    print(f"saved {save_path} at update {run.global_step} (epoch {run.epoch}, update {run.update_step_in_epoch} "
          f"in epoch, optimizer steps {session.optimizer_step})")
    return records


if __name__ == "__main__":
    main()
