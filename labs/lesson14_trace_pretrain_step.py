"""Trace one MiniMind pretrain step (or a few micro-steps of accumulation) on the tiny corpus.

    python labs/lesson14_trace_pretrain_step.py --batch_size 2 --max_length 48 --hidden_size 64 --num_hidden_layers 2
    python labs/lesson14_trace_pretrain_step.py ... --accumulation_steps 4 --micro_steps 10   # the accumulation rhythm
    python labs/lesson14_trace_pretrain_step.py ... --use_moe                                 # non-zero aux_loss
    python labs/lesson14_trace_pretrain_step.py ... --dtype float16                           # autocast + GradScaler
    python labs/lesson14_trace_pretrain_step.py ... --impl student                            # your impl/train_loop.py

The model is the oracle's (course.minimind), traced in the order of upstream's ``train_epoch``: lr ->
forward and (loss + aux) / K under autocast -> scaler.scale(...).backward() -> at a boundary unscale_ ->
clip -> scaler.step -> scaler.update -> zero_grad. ``--dtype float32`` (the default) uses no autocast and
a disabled GradScaler, so it is upstream's CPU run; bfloat16 and float16 run the forward under
``torch.autocast``, and float16 enables the GradScaler, as upstream does on CUDA. ``--impl`` chooses whose
schedule, loss scaling, step and tail-flush decisions run: the oracle's (``get_lr`` and upstream's inline
expressions) or the lesson-14 functions of the reference or of your ``impl/train_loop.py``.
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch.utils.data import DataLoader

from course.implementations import load_implementation
from course.input_errors import refusing_input_errors
from course.minimind import (TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig,
                             MiniMindForCausalLM, PretrainDataset, get_lr, setup_seed)
from course.minimind.tokenizer import load_tokenizer
from course.runs.threads import add_threads_argument, cpu_threads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return value


class LoopPieces(NamedTuple):
    """The decisions of one micro-step that lesson 14's exercises implement."""
    lr: Callable            # (current_step, total_steps, base_lr) -> float
    scale_loss: Callable    # (loss, accumulation_steps) -> loss / K
    step_now: Callable      # (step, accumulation_steps) -> bool
    flush_tail: Callable    # (last_step, start_step, accumulation_steps) -> bool


class ExerciseTodo(Exception):
    """A lesson-14 function of the traced implementation still raises NotImplementedError."""


def _todo_guard(function):
    @functools.wraps(function)
    def call(*args):
        try:
            return function(*args)
        except NotImplementedError as exc:  # only the exercise's own stub, not torch's errors
            message = str(exc) if function.__name__ in str(exc) else f"{function.__name__}: {exc}"
            raise ExerciseTodo(message) from exc
    return call


def loop_pieces(impl: str, impl_dir=None) -> LoopPieces:
    if impl == "oracle":  # get_lr and upstream's inline expressions in train_epoch
        return LoopPieces(get_lr, lambda loss, k: loss / k, lambda step, k: step % k == 0,
                          lambda last, start, k: last > start and last % k != 0)
    module = load_implementation("train_loop.py", impl, impl_dir)
    return LoopPieces(*(_todo_guard(getattr(module, name)) for name in
                        ("cosine_lr", "scale_loss_for_accumulation", "should_step_optimizer", "should_flush_tail")))


def check_precision_args(parser: argparse.ArgumentParser, args) -> None:
    if args.impl_dir is not None and args.impl != "student":
        parser.error(f"--impl-dir replaces the student's impl/ directory; use it with --impl student, "
                     f"got --impl {args.impl}")
    if args.impl_dir is not None and not (Path(args.impl_dir) / "train_loop.py").is_file():
        parser.error(f"--impl-dir {args.impl_dir}: no train_loop.py there (a directory laid out like impl/)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine; use --device cpu "
                     "(CPU autocast runs bfloat16 and float16 too)")
    if args.device == "cuda" and args.dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        parser.error("--dtype bfloat16: this GPU does not support bfloat16; use --dtype float16")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32",
                        help="float32: no autocast; bfloat16/float16: autocast, float16 with an enabled GradScaler")
    parser.add_argument("--impl", choices=["oracle", "reference", "student"], default="oracle",
                        help="whose lr / loss scaling / step / tail-flush functions run (student: impl/train_loop.py)")
    parser.add_argument("--impl-dir", default=None, metavar="DIR",
                        help="with --impl student: load train_loop.py from DIR instead of impl/")
    parser.add_argument("--batch_size", type=positive_int, default=2)
    parser.add_argument("--max_length", type=positive_int, default=48)
    parser.add_argument("--hidden_size", type=positive_int, default=TINY_HIDDEN_SIZE)
    parser.add_argument("--num_hidden_layers", type=positive_int, default=TINY_NUM_HIDDEN_LAYERS)
    parser.add_argument("--use_moe", action="store_true", help="4 experts, top-1: aux_loss > 0")
    parser.add_argument("--learning_rate", type=positive_float, default=5e-4)
    parser.add_argument("--grad_clip", type=positive_float, default=1.0)
    parser.add_argument("--accumulation_steps", type=positive_int, default=1, help="K micro-steps per update")
    parser.add_argument("--micro_steps", type=positive_int, default=1, help="micro-steps to trace")
    parser.add_argument("--data_path", default=str(TINY_CORPUS))
    parser.add_argument("--tokenizer_path", default=None,
                        help="a tokenizer.json or its directory; default: the built-in byte tokenizer")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    if args.max_length < 3:
        parser.error(f"--max_length must be >= 3 (bos + a token + eos), got {args.max_length}")
    check_precision_args(parser, args)
    return args


@refusing_input_errors
def main(argv=None) -> None:
    args = parse_args(argv)
    pieces = loop_pieces(args.impl, args.impl_dir)
    try:
        with cpu_threads(args.threads):
            trace(args, pieces)
    except ExerciseTodo as exc:
        source = f"{args.impl_dir or 'impl'}/train_loop.py" if args.impl == "student" else "the reference"
        print(f"TODO: {exc}\n--impl {args.impl} traces the lesson-14 functions of {source}; fill this one in "
              f"(lesson 14 §5), or trace --impl reference or --impl oracle meanwhile.", file=sys.stderr)
        sys.exit(1)


def trace(args, pieces: LoopPieces) -> None:
    tokenizer = load_tokenizer(args.tokenizer_path)
    setup_seed(42)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
                            use_moe=args.use_moe, vocab_size=tokenizer.vocab_size)
    model = MiniMindForCausalLM(config).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    dataset = PretrainDataset(args.data_path, tokenizer, max_length=args.max_length)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False)
    iters = len(loader)
    total_steps = max(iters, args.micro_steps)  # the schedule's T: one epoch, or the traced steps
    k = args.accumulation_steps
    print(f"config: hidden_size={config.hidden_size} layers={config.num_hidden_layers} "
          f"heads={config.num_attention_heads}/{config.num_key_value_heads}kv intermediate={config.intermediate_size} "
          f"vocab={config.vocab_size} moe={config.use_moe}")
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e6:.3f} M (tied embedding counted once)")
    print(f"data: {len(dataset)} samples, {iters} micro-batches of {args.batch_size}; K={k}, "
          f"effective batch {args.batch_size * k}")

    autocast_ctx = (nullcontext() if args.dtype == "float32"
                    else torch.autocast(args.device, dtype=DTYPES[args.dtype]))
    scaler = torch.amp.GradScaler(args.device, enabled=args.dtype == "float16")  # upstream's rule
    first_param = next(model.parameters())
    batches = iter(loader)
    for step in range(1, args.micro_steps + 1):
        try:
            input_ids, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            input_ids, labels = next(batches)
        input_ids = input_ids.to(args.device, non_blocking=True)
        labels = labels.to(args.device, non_blocking=True)
        lr = pieces.lr(step, total_steps, args.learning_rate)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast_ctx:
            out = model(input_ids, labels=labels)
            loss = out.loss + out.aux_loss
            scaled_loss = pieces.scale_loss(loss, k)
        scaler.scale(scaled_loss).backward()
        grad_dtype = first_param.grad.dtype
        boundary = pieces.step_now(step, k)
        # the lab treats its last micro-step as the end of the epoch: upstream's tail flush after the loop
        is_tail = step == args.micro_steps and pieces.flush_tail(step, 0, k)
        grad_norm = before = found_inf = None
        scale_before = scale_after = scaler.get_scale()
        if boundary or is_tail:
            scaler.unscale_(optimizer)
            if scaler.is_enabled():  # no public accessor: this is the flag scaler.step reads to skip a step
                found_inf = sum(v.item() for v in scaler._found_inf_per_device(optimizer).values())
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            before = first_param.detach().clone()
            scaler.step(optimizer)
            scaler.update()
            scale_after = scaler.get_scale()
            optimizer.zero_grad(set_to_none=True)
        if args.micro_steps == 1:
            print(f"input_ids.shape={tuple(input_ids.shape)}")
            print(f"labels.shape={tuple(labels.shape)} (valid targets after the shift: "
                  f"{int((labels[:, 1:] != -100).sum())})")
            print(f"logits.shape={tuple(out.logits.shape)}")
            print(f"loss={out.loss.item():.6f} (ln(vocab)={math.log(config.vocab_size):.4f} at random init)")
            print(f"aux_loss={out.aux_loss.item():.6f}")
            print(f"lr={lr:.8f}")
        else:
            norm_text = f" grad_norm={grad_norm.item():.4f}" if grad_norm is not None else ""
            kind = "tail flush" if is_tail else ("step" if boundary else "accumulate")
            scaler_text = (f" scale={scale_before}->{scale_after} found_inf={found_inf}"
                           if scaler.is_enabled() and grad_norm is not None else "")
            print(f"micro_step={step:>3} lr={lr:.8f} loss={loss.item():.4f} scaled_loss={scaled_loss.item():.4f} "
                  f"update_closed={boundary or is_tail} ({kind}){norm_text}{scaler_text}")
    if args.micro_steps == 1:
        print(f"grad_norm_before_clip={grad_norm.item():.6f}")
        print(f"max_first_param_delta_after_step={(first_param.detach() - before).abs().max().item():.6e}")
        disabled = "" if scaler.is_enabled() else " (disabled)"
        print(f"logits.dtype={out.logits.dtype}")
        print(f"loss.dtype={loss.dtype}")
        print(f"param.grad.dtype={grad_dtype}")
        print(f"scaler.scale_before={scale_before}{disabled}")
        print(f"scaler.scale_after={scale_after}{disabled}")
        print(f"found_inf={found_inf}" if scaler.is_enabled()
              else "found_inf=None (disabled: unscale_ checks no gradient)")


if __name__ == "__main__":
    sys.exit(main())
