"""Stage assembly for lesson 14: dataset -> DataLoader -> model -> your train_one_epoch -> checkpoint.

    python impl/train_pretrain_impl.py                          # uses YOUR impl/core/train_loop.py
    python impl/train_pretrain_impl.py --impl reference --epochs 1

This file is glue, not an exercise: it runs as soon as impl/core/train_loop.py is filled in.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from course.checks import get_lesson, load_impl
from course.minimind import TINY_CORPUS, PretrainDataset
from course.minimind.train_pretrain import build_parser as oracle_parser
from course.minimind.train_pretrain import build_training
from course.minimind.trainer_utils import Logger, setup_seed

REPO_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    # Upstream's flags, with defaults small enough for the built-in corpus on a CPU.
    parser = oracle_parser()
    parser.description = __doc__.splitlines()[0]
    parser.set_defaults(epochs=2, batch_size=8, accumulation_steps=4, log_interval=5, hidden_size=64,
                        num_hidden_layers=2, max_seq_len=64, data_path=str(TINY_CORPUS))
    parser.add_argument("--impl", choices=["student", "reference"], default="student",
                        help="whose train_one_epoch to run (default: yours, impl/core/train_loop.py)")
    parser.add_argument("--out_dir", default=str(REPO_ROOT / "out"))
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "accumulation_steps", "log_interval", "max_seq_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def log_records(records, epoch, epochs, iters, log_interval, seconds) -> None:
    """MiniMind-style lines at upstream's cadence (every log_interval micro-steps and the last)."""
    for r in records:
        if r["step"] % log_interval == 0 or r["step"] == iters:
            Logger(f"Epoch:[{epoch + 1}/{epochs}]({r['step']}/{iters}), loss: {r['loss']:.4f}, "
                   f"logits_loss: {r['loss'] - r['aux_loss']:.4f}, aux_loss: {r['aux_loss']:.4f}, "
                   f"lr: {r['lr']:.8f}, epoch_time: {seconds / 60:.1f}min")


def main(argv=None) -> int:
    args = parse_args(argv)
    train_loop = load_impl(get_lesson("14"), args.impl)
    model, optimizer, scaler, autocast_ctx = build_training(args)
    dataset = PretrainDataset(args.data_path, max_length=args.max_seq_len)
    Logger(f"LLM params: {sum(p.numel() for p in model.parameters()) / 1e6:.3f} M, "
           f"{len(dataset)} samples, train_one_epoch from {args.impl}")
    for epoch in range(args.epochs):
        setup_seed(42 + epoch)
        order = torch.randperm(len(dataset)).tolist()
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=order)
        iters = len(loader)
        start = time.time()
        try:
            records = train_loop.train_one_epoch(
                model, tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", file=sys.stdout), optimizer,
                device=args.device, epoch=epoch, epochs=args.epochs, iters=iters, base_lr=args.learning_rate,
                accumulation_steps=args.accumulation_steps, grad_clip=args.grad_clip, scaler=scaler,
                autocast_ctx=autocast_ctx)
        except NotImplementedError as exc:
            print(f"TODO: {exc}\nFill in impl/core/train_loop.py (lesson 14 §5), then run "
                  f"`python -m course check 14`.", file=sys.stderr)
            return 1
        log_records(records, epoch, args.epochs, iters, args.log_interval, time.time() - start)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    moe = "_moe" if args.use_moe else ""
    weights = out_dir / f"pretrain_{args.hidden_size}{moe}.pth"
    torch.save(model.state_dict(), weights)
    Logger(f"saved weights to {weights}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
