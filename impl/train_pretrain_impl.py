"""Stage assembly for lessons 14-15: dataset -> DataLoader -> model -> your train_one_epoch -> checkpoint.

    python impl/train_pretrain_impl.py                          # uses YOUR impl/train_loop.py
    python impl/train_pretrain_impl.py --impl reference --epochs 1
    python impl/train_pretrain_impl.py --impl reference --save_interval 8 --stop_after 28   # lesson 15
    python impl/train_pretrain_impl.py --impl reference --save_interval 8 --resume out/pretrain_48_resume.pth

This file is glue, not an exercise: it runs as soon as impl/train_loop.py is filled in.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from course.implementations import load_implementation
from course.minimind import TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, PretrainDataset
from course.minimind.train_pretrain import build_parser as oracle_parser
from course.minimind.train_pretrain import build_tokenizer, build_training
from course.minimind.trainer_utils import Logger, setup_seed

REPO_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    # Upstream's flags, with defaults small enough for the built-in corpus on a CPU.
    parser = oracle_parser()
    parser.description = __doc__.splitlines()[0]
    parser.set_defaults(epochs=2, batch_size=8, accumulation_steps=4, log_interval=5,
                        hidden_size=TINY_HIDDEN_SIZE, num_hidden_layers=TINY_NUM_HIDDEN_LAYERS, max_seq_len=64,
                        data_path=str(TINY_CORPUS), save_interval=0)
    parser.add_argument("--impl", choices=["student", "reference"], default="student",
                        help="whose train_one_epoch to run (default: yours, impl/train_loop.py)")
    parser.add_argument("--impl-dir", dest="impl_dir", default=None, metavar="DIR",
                        help="run a submission laid out like impl/ (its train_loop.py and checkpoint.py) instead")
    parser.add_argument("--out_dir", default=str(REPO_ROOT / "out"))
    # Lesson 15. --save_interval (upstream's flag) counts micro-steps; 0 writes no resume checkpoint.
    parser.add_argument("--resume", default=None, metavar="PATH",
                        help="continue from a resume checkpoint written by save_checkpoint (lesson 15)")
    parser.add_argument("--stop_after", type=int, default=0, metavar="STEPS",
                        help="stop after this many micro-steps of the whole run, as if interrupted, "
                             "saving a resume checkpoint first (0: run to the end)")
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "accumulation_steps", "log_interval", "max_seq_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    # A checkpoint cannot hold accumulated gradients, so saves happen only at update boundaries.
    for name in ("save_interval", "stop_after"):
        value = getattr(args, name)
        if value < 0 or value % args.accumulation_steps:
            parser.error(f"--{name} must be 0 or a positive multiple of --accumulation_steps "
                         f"({args.accumulation_steps}), got {value}")
    return args


RUN_CONFIG_FLAGS = ("epochs", "batch_size", "accumulation_steps", "learning_rate", "max_seq_len", "grad_clip",
                    "hidden_size", "num_hidden_layers", "use_moe")


def run_config(args) -> dict:
    """The flags a resumed run must share with the interrupted one (they fix data order and schedule)."""
    return {name: getattr(args, name) for name in RUN_CONFIG_FLAGS}


def segment_ends(start_step: int, iters: int, save_interval: int, stop_step: int) -> list[int]:
    """Micro-steps of one epoch where training pauses to save: multiples of save_interval, the stop
    point and the epoch end (after its tail flush)."""
    ends = set(range(save_interval, iters, save_interval)) if save_interval else set()
    ends |= {iters} | ({stop_step} if 0 < stop_step < iters else set())
    return sorted(e for e in ends if e > start_step)


def log_records(records, epoch, epochs, iters, log_interval, seconds) -> None:
    """MiniMind-style lines at upstream's cadence (every log_interval micro-steps and the last);
    epoch_time is upstream's estimate of the minutes left in the epoch."""
    per_step = seconds / max(len(records), 1)
    for r in records:
        if r["step"] % log_interval == 0 or r["step"] == iters:
            Logger(f"Epoch:[{epoch + 1}/{epochs}]({r['step']}/{iters}), loss: {r['loss']:.4f}, "
                   f"logits_loss: {r['loss'] - r['aux_loss']:.4f}, aux_loss: {r['aux_loss']:.4f}, "
                   f"lr: {r['lr']:.8f}, epoch_time: {per_step * (iters - r['step']) / 60:.1f}min")


def counted(batches, bar):
    """Advance the progress bar as each micro-batch is fetched (a paused epoch still shows where it is)."""
    for batch in batches:
        bar.update(1)
        yield batch


def main(argv=None) -> int:
    args = parse_args(argv)
    train_loop = load_implementation("train_loop.py", args.impl, args.impl_dir)
    checkpointing = args.resume is not None or args.save_interval > 0 or args.stop_after > 0
    ckpt = load_implementation("checkpoint.py", args.impl, args.impl_dir) if checkpointing else None
    try:
        tokenizer = build_tokenizer(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model, optimizer, scaler, autocast_ctx = build_training(args)
    dataset = PretrainDataset(args.data_path, tokenizer, max_length=args.max_seq_len)
    iters = math.ceil(len(dataset) / args.batch_size)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)  # for resume checkpoints too, whoever's save_checkpoint runs
    moe = "_moe" if args.use_moe else ""
    resume_file = out_dir / f"pretrain_{args.hidden_size}{moe}_resume.pth"
    Logger(f"LLM params: {sum(p.numel() for p in model.parameters()) / 1e6:.3f} M, "
           f"{len(dataset)} samples, train_one_epoch from {args.impl}")
    try:
        start_epoch, start_step = 0, 0
        if args.resume is not None:
            checkpoint = ckpt.load_checkpoint(args.resume, model=model, optimizer=optimizer, scaler=scaler)
            changed = {k: (v, checkpoint.get("run_config", {}).get(k)) for k, v in run_config(args).items()
                       if checkpoint.get("run_config", {}).get(k) != v}
            if changed:
                raise ValueError(f"--resume {args.resume}: these flags differ from the interrupted run "
                                 f"(now, saved): {changed}")
            start_epoch, start_step = ckpt.resume_position(checkpoint, iters)
            Logger(f"resumed from {args.resume}: epoch {start_epoch + 1}/{args.epochs}, step {start_step}/{iters} "
                   f"(skipping {start_step} trained micro-batches)")
        for epoch in range(start_epoch, args.epochs):
            setup_seed(42 + epoch)
            order = torch.randperm(len(dataset)).tolist()
            skip = start_step if epoch == start_epoch else 0
            pinned = torch.device(args.device).type == "cuda"  # lets the loop's non_blocking copies overlap
            loader = (DataLoader(dataset, batch_sampler=ckpt.SkipBatchSampler(order, args.batch_size, skip),
                                 pin_memory=pinned)
                      if ckpt else DataLoader(dataset, batch_size=args.batch_size, sampler=order, pin_memory=pinned))
            bar = tqdm(desc=f"epoch {epoch + 1}/{args.epochs}", file=sys.stdout, initial=skip, total=iters)
            batches = counted(iter(loader), bar)
            stop_step = args.stop_after - epoch * iters if args.stop_after else 0
            start, begin = time.time(), skip
            for end in segment_ends(skip, iters, args.save_interval, stop_step):
                records = train_loop.train_one_epoch(
                    model, itertools.islice(batches, end - begin), optimizer, device=args.device, epoch=epoch,
                    epochs=args.epochs, iters=iters, base_lr=args.learning_rate,
                    accumulation_steps=args.accumulation_steps, grad_clip=args.grad_clip, scaler=scaler,
                    autocast_ctx=autocast_ctx, start_step=begin)
                if end == iters or end == stop_step:
                    bar.close()
                log_records(records, epoch, args.epochs, iters, args.log_interval, time.time() - start)
                begin = end
                if args.save_interval and (end % args.save_interval == 0 or end == iters) or end == stop_step:
                    # batch_size / accum_steps: a legacy (micro-batch) training state for lesson 16's trainer
                    ckpt.save_checkpoint(resume_file, model=model, optimizer=optimizer, scaler=scaler,
                                         epoch=epoch, step=end, run_config=run_config(args),
                                         batch_size=args.batch_size, accum_steps=args.accumulation_steps)
                    Logger(f"saved resume checkpoint (epoch {epoch + 1}, step {end}/{iters}) to {resume_file}")
                if end == stop_step:
                    Logger(f"stopped after {args.stop_after} micro-steps (--stop_after); continue with "
                           f"--resume {resume_file}")
                    return 0
    except NotImplementedError as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1].filename
        lesson, path = ("15", "impl/checkpoint.py") if ckpt and where == ckpt.__file__ \
            else ("14", "impl/train_loop.py")
        print(f"TODO: {exc}\nFill in {path} (lesson {lesson} §5), then run "
              f"`python -m course check {lesson}`.", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        if args.resume is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    weights = out_dir / f"pretrain_{args.hidden_size}{moe}.pth"
    torch.save(model.state_dict(), weights)
    Logger(f"saved weights to {weights}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
