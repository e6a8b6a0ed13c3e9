"""The upstream-faithful pretrain loop: the oracle that lesson 14 aligns with.

Mirrors upstream ``trainer/train_pretrain.py``: ``train_epoch`` keeps upstream's order of
operations, counters and quirks (the logged loss is the last micro-batch only; the epoch-end save
runs before the tail flush; the tail is still divided by ``accumulation_steps``). Upstream reads
``model``, ``optimizer``, ``scaler``, ``autocast_ctx`` and ``args`` from module globals; here they
are passed in. ``trace``, when given, receives one record per micro-step so tests can compare
runs; it observes and never changes what the loop does.

Run it: ``python -m course.minimind.train_pretrain --epochs 1 --hidden_size 64 --num_hidden_layers 2``.
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext

import torch
from torch import optim
from torch.utils.data import DataLoader

from course.input_errors import InputError, refusing_input_errors

from .config import MiniMindConfig
from .dataset import TINY_CORPUS, PretrainDataset
from .model import MiniMindForCausalLM
from .tokenizer import ByteTokenizer, load_tokenizer
from .trainer_utils import Logger, get_lr, setup_seed


def optimizer_update(model, optimizer, scaler, grad_clip):
    """The block upstream writes twice (at each boundary and in the tail flush): unscale -> clip ->
    step -> update -> zero_grad. Returns clip_grad_norm_'s pre-clip norm, which upstream discards."""
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def traced_update(model, optimizer, scaler, grad_clip):
    """``optimizer_update`` plus what the trace records: (pre-clip norm, whether the GradScaler skipped
    ``optimizer.step`` for inf/NaN). Upstream never asks; ``update()`` backs the scale off exactly then."""
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    grad_norm = optimizer_update(model, optimizer, scaler, grad_clip)
    return grad_norm, scale_before is not None and scaler.get_scale() < scale_before


def train_epoch(epoch, loader, iters, start_step=0, *, model, optimizer, scaler, autocast_ctx,
                args, save_checkpoint=None, trace=None):
    start_time = time.time()
    last_step = start_step
    for step, (input_ids, labels) in enumerate(loader, start=start_step + 1):
        input_ids = input_ids.to(args.device)
        labels = labels.to(args.device)
        last_step = step
        lr = get_lr(epoch * iters + step, args.epochs * iters, args.learning_rate)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        with autocast_ctx:
            res = model(input_ids, labels=labels)
            loss = res.loss + res.aux_loss
            loss = loss / args.accumulation_steps

        scaler.scale(loss).backward()

        grad_norm, skipped = None, False
        if step % args.accumulation_steps == 0:
            if trace is None:
                grad_norm = optimizer_update(model, optimizer, scaler, args.grad_clip)
            else:
                grad_norm, skipped = traced_update(model, optimizer, scaler, args.grad_clip)
        if trace is not None:
            trace.append({"step": step, "lr": lr, "loss": res.loss.detach() + res.aux_loss.detach(),
                          "aux_loss": res.aux_loss.detach(), "update_closed": grad_norm is not None,
                          "overflow_skipped": skipped, "grad_norm": grad_norm, "tail_flush": False})

        if step % args.log_interval == 0 or step == iters:
            spend_time = time.time() - start_time
            current_loss = loss.item() * args.accumulation_steps
            current_aux_loss = res.aux_loss.item() if res.aux_loss is not None else 0.0
            current_logits_loss = current_loss - current_aux_loss
            current_lr = optimizer.param_groups[-1]["lr"]
            eta_min = spend_time / max(step - start_step, 1) * (iters - step) // 60  # upstream: whole minutes
            Logger(f"Epoch:[{epoch + 1}/{args.epochs}]({step}/{iters}), loss: {current_loss:.4f}, "
                   f"logits_loss: {current_logits_loss:.4f}, aux_loss: {current_aux_loss:.4f}, "
                   f"lr: {current_lr:.8f}, epoch_time: {eta_min:.1f}min")

        # Upstream quirk: at step == iters this saves BEFORE the tail flush below.
        if save_checkpoint is not None and (step % args.save_interval == 0 or step == iters):
            save_checkpoint(epoch, step)

    if last_step > start_step and last_step % args.accumulation_steps != 0:
        if trace is None:
            optimizer_update(model, optimizer, scaler, args.grad_clip)
        else:
            grad_norm, skipped = traced_update(model, optimizer, scaler, args.grad_clip)
            trace[-1].update(update_closed=True, overflow_skipped=skipped, grad_norm=grad_norm, tail_flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="MiniMind-style pretraining (course oracle)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--device", type=str, default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", type=str, default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--accumulation_steps", type=int, default=8)
    parser.add_argument("--grad_clip", type=float, default=1.0)
    parser.add_argument("--log_interval", type=int, default=100)
    parser.add_argument("--save_interval", type=int, default=1000)
    parser.add_argument("--hidden_size", type=int, default=768)
    parser.add_argument("--num_hidden_layers", type=int, default=8)
    parser.add_argument("--max_seq_len", type=int, default=340)
    parser.add_argument("--use_moe", type=int, default=0, choices=[0, 1])
    parser.add_argument("--data_path", type=str, default=str(TINY_CORPUS))
    # Upstream loads its tokenizer from ../model; here the built-in ByteTokenizer unless given one.
    parser.add_argument("--tokenizer_path", type=str, default=None,
                        help="a tokenizer.json or its directory (MiniMind's model/); default: the built-in "
                             "byte tokenizer (the stage assembly: its --preset's)")
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="the model's vocabulary; default: the tokenizer's, and it must equal it")
    return parser


def build_tokenizer(args):
    """The run's tokenizer (--tokenizer_path or the built-in one); sets args.vocab_size to its vocabulary
    and refuses a --vocab_size that differs."""
    tokenizer = load_tokenizer(args.tokenizer_path)
    if args.vocab_size is not None and args.vocab_size != tokenizer.vocab_size:
        source = args.tokenizer_path or "the built-in byte tokenizer"
        raise InputError(f"--vocab_size {args.vocab_size} differs from the tokenizer's vocabulary "
                         f"({tokenizer.vocab_size}, {source}); omit --vocab_size or give "
                         f"{tokenizer.vocab_size}")
    args.vocab_size = tokenizer.vocab_size
    return tokenizer


def build_training(args):
    """Upstream's setup: seed, model, AdamW with torch defaults, GradScaler only for fp16, and
    autocast only on CUDA (CPU runs fp32 under a ``nullcontext``). The vocabulary is
    ``args.vocab_size`` (set by ``build_tokenizer``), else the built-in tokenizer's 6400."""
    setup_seed(42)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
                            use_moe=bool(args.use_moe), vocab_size=args.vocab_size or ByteTokenizer.vocab_size)
    model = MiniMindForCausalLM(config).to(args.device)
    device_type = "cuda" if "cuda" in args.device else "cpu"
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float16
    autocast_ctx = nullcontext() if device_type == "cpu" else torch.autocast(device_type, dtype=dtype)
    scaler = torch.amp.GradScaler(device_type, enabled=(args.dtype == "float16" and device_type == "cuda"))
    optimizer = optim.AdamW(model.parameters(), lr=args.learning_rate)
    return model, optimizer, scaler, autocast_ctx


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    tokenizer = build_tokenizer(args)
    model, optimizer, scaler, autocast_ctx = build_training(args)
    dataset = PretrainDataset(args.data_path, tokenizer, max_length=args.max_seq_len)
    Logger(f"LLM params: {sum(p.numel() for p in model.parameters()) / 1e6:.3f} M")
    for epoch in range(args.epochs):
        setup_seed(42 + epoch)
        order = torch.randperm(len(dataset)).tolist()
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=order)
        train_epoch(epoch, loader, len(loader), model=model, optimizer=optimizer, scaler=scaler,
                    autocast_ctx=autocast_ctx, args=args)


if __name__ == "__main__":
    # Upstream would end in a traceback; the course prints a bad data line or tokenizer as one line, exit code 2.
    sys.exit(refusing_input_errors(main)())
