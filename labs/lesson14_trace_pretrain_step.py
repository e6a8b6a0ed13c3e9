"""Trace one MiniMind pretrain step (or a few micro-steps of accumulation) on the tiny corpus.

    python labs/lesson14_trace_pretrain_step.py --batch_size 2 --max_length 48 --hidden_size 64 --num_hidden_layers 2
    python labs/lesson14_trace_pretrain_step.py ... --accumulation_steps 4 --micro_steps 10   # the accumulation rhythm
    python labs/lesson14_trace_pretrain_step.py ... --use_moe                                 # non-zero aux_loss

Everything runs on the oracle (course.minimind) in fp32 on the CPU, in the order of upstream's
``train_epoch``: lr -> forward -> (loss + aux) / K -> backward -> at a boundary clip -> step -> zero_grad.
"""
from __future__ import annotations

import argparse
import math

import torch
from torch.utils.data import DataLoader

from course.minimind import (TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig,
                             MiniMindForCausalLM, PretrainDataset, get_lr, setup_seed)
from course.minimind.tokenizer import load_tokenizer


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=positive_int, default=2)
    parser.add_argument("--max_length", type=positive_int, default=48)
    parser.add_argument("--hidden_size", type=positive_int, default=TINY_HIDDEN_SIZE)
    parser.add_argument("--num_hidden_layers", type=positive_int, default=TINY_NUM_HIDDEN_LAYERS)
    parser.add_argument("--use_moe", action="store_true", help="4 experts, top-1: aux_loss > 0")
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--grad_clip", type=float, default=1.0)
    parser.add_argument("--accumulation_steps", type=positive_int, default=1, help="K micro-steps per update")
    parser.add_argument("--micro_steps", type=positive_int, default=1, help="micro-steps to trace")
    parser.add_argument("--data_path", default=str(TINY_CORPUS))
    parser.add_argument("--tokenizer_path", default=None,
                        help="a tokenizer.json or its directory; default: the built-in byte tokenizer")
    args = parser.parse_args(argv)
    if args.max_length < 3:
        parser.error(f"--max_length must be >= 3 (bos + a token + eos), got {args.max_length}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer_path)
    setup_seed(42)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
                            use_moe=args.use_moe, vocab_size=tokenizer.vocab_size)
    model = MiniMindForCausalLM(config)
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

    first_param = next(model.parameters())
    batches = iter(loader)
    for step in range(1, args.micro_steps + 1):
        try:
            input_ids, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            input_ids, labels = next(batches)
        lr = get_lr(step, total_steps, args.learning_rate)
        for group in optimizer.param_groups:
            group["lr"] = lr
        out = model(input_ids, labels=labels)
        loss = out.loss + out.aux_loss
        scaled_loss = loss / k
        scaled_loss.backward()
        boundary = step % k == 0
        is_tail = not boundary and step == args.micro_steps  # upstream's tail flush after the loop
        grad_norm = before = None
        if boundary or is_tail:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            before = first_param.detach().clone()
            optimizer.step()
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
            print(f"micro_step={step:>3} lr={lr:.8f} loss={loss.item():.4f} scaled_loss={scaled_loss.item():.4f} "
                  f"optimizer_step={boundary or is_tail} ({kind}){norm_text}")
    if args.micro_steps == 1:
        print(f"grad_norm_before_clip={grad_norm.item():.6f}")
        print(f"max_first_param_delta_after_step={(first_param.detach() - before).abs().max().item():.6e}")


if __name__ == "__main__":
    main()
