"""Stage assembly for lessons 14-15: dataset -> DataLoader -> model -> your train_one_epoch -> checkpoint.

    python impl/train_pretrain_impl.py                          # uses YOUR impl/train_loop.py
    python impl/train_pretrain_impl.py --impl reference         # learns the stories corpus, ~3 min on 2 CPU cores
    python impl/train_pretrain_impl.py --impl reference --metrics_json out/metrics.json --eval_interval 20
    python impl/train_pretrain_impl.py --impl reference --save_interval 8 --stop_after 28   # lesson 15
    python impl/train_pretrain_impl.py --impl reference --save_interval 8 --resume out/pretrain_48_resume.pth
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        impl/train_pretrain_impl.py --impl reference --preset tiny             # DDP: 2 processes (lesson 14 §8)

This file is glue, not an exercise: it runs as soon as impl/train_loop.py is filled in.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset
from tqdm import tqdm

from course.implementations import add_impl_arguments, load_implementation
from course.minimind import IGNORE_INDEX, TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, PretrainDataset
from course.minimind.train_pretrain import build_parser as oracle_parser
from course.minimind.train_pretrain import build_tokenizer, build_training
from course.minimind.trainer_utils import Logger, setup_seed
from course.runs.distributed import process_group

REPO_ROOT = Path(__file__).resolve().parents[1]
# Written by labs/data/make_pretrain_stories.py: templated stories and arithmetic, 3000 lines, 0.32 MB.
STORIES_CORPUS = REPO_ROOT / "labs" / "data" / "pretrain_stories.jsonl"
LEARNING_RATE = 5e-3  # a tiny model tolerates (and needs) a larger lr than upstream's 5e-4 for 64M parameters
MAX_SEQ_LEN = 128     # holds 72 % of the stories corpus's texts whole (bos + bytes + eos); the rest are cut


# --preset: the defaults of everything below. "stories" learns visibly in about 3 minutes on 2 CPU cores;
# "tiny" is lessons 14-16's run on the tiny corpus (no validation), the defaults before the stories corpus.
PRESETS = {
    "stories": dict(epochs=1, batch_size=8, accumulation_steps=2, log_interval=100, learning_rate=LEARNING_RATE,
                    max_seq_len=MAX_SEQ_LEN, data_path=str(STORIES_CORPUS), val_fraction=0.05),
    "tiny": dict(epochs=2, batch_size=8, accumulation_steps=4, log_interval=5, learning_rate=5e-4,
                 max_seq_len=64, data_path=str(TINY_CORPUS), val_fraction=0.0),
}


def parse_args(argv=None):
    preset = argparse.ArgumentParser(add_help=False)
    preset.add_argument("--preset", choices=sorted(PRESETS), default="stories")
    parser = oracle_parser()  # upstream's flags
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--preset", choices=sorted(PRESETS), default="stories",
                        help="defaults: stories (the built-in stories corpus, with validation) or tiny "
                             "(lessons 14-16's tiny corpus, no validation); explicit flags override them")
    parser.add_argument("--val_fraction", type=float,
                        help="share of the data (its last lines) held out for validation; 0: no validation")
    parser.set_defaults(hidden_size=TINY_HIDDEN_SIZE, num_hidden_layers=TINY_NUM_HIDDEN_LAYERS, save_interval=0,
                        **PRESETS[preset.parse_known_args(argv)[0].preset])
    add_impl_arguments(parser, "train_loop.py and checkpoint.py")
    parser.add_argument("--out_dir", default=str(REPO_ROOT / "out"))
    # Lesson 15. --save_interval (upstream's flag) counts micro-steps; 0 writes no resume checkpoint.
    parser.add_argument("--resume", default=None, metavar="PATH",
                        help="continue from a resume checkpoint written by save_checkpoint (lesson 15)")
    parser.add_argument("--stop_after", type=int, default=0, metavar="STEPS",
                        help="stop after this many micro-steps of the whole run, as if interrupted, "
                             "saving a resume checkpoint first (0: run to the end)")
    parser.add_argument("--eval_interval", type=int, default=30, metavar="UPDATES",
                        help="validation loss and a sample every this many optimizer updates, at the start "
                             "and at the end")
    parser.add_argument("--eval_batches", type=int, default=8,
                        help="validation batches (of --batch_size) per evaluation, always the same ones")
    parser.add_argument("--prompt", default="One day Tom went to the",
                        help="the sample's prompt (greedy continuation at each evaluation)")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--metrics_json", default=None, metavar="PATH",
                        help="write train/val loss curves, tokens/s and the samples to this json file")
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "accumulation_steps", "log_interval", "max_seq_len", "eval_interval",
                 "eval_batches", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.val_fraction < 1:
        parser.error(f"--val_fraction must be in [0, 1), got {args.val_fraction}")
    # A checkpoint cannot hold accumulated gradients, so saves happen only at update boundaries.
    for name in ("save_interval", "stop_after"):
        value = getattr(args, name)
        if value < 0 or value % args.accumulation_steps:
            parser.error(f"--{name} must be 0 or a positive multiple of --accumulation_steps "
                         f"({args.accumulation_steps}), got {value}")
    return args


RUN_CONFIG_FLAGS = ("epochs", "batch_size", "accumulation_steps", "learning_rate", "max_seq_len", "grad_clip",
                    "hidden_size", "num_hidden_layers", "use_moe", "val_fraction")


def run_config(args) -> dict:
    """The flags a resumed run must share with the interrupted one (they fix data order and schedule)."""
    return {name: getattr(args, name) for name in RUN_CONFIG_FLAGS}


def segment_ends(start_step: int, iters: int, save_interval: int, stop_step: int, evals=()) -> list[int]:
    """Micro-steps of one epoch where training pauses to save or evaluate: multiples of save_interval,
    evals, the stop point and the epoch end (after its tail flush)."""
    ends = set(range(save_interval, iters, save_interval)) if save_interval else set()
    ends |= {iters} | set(evals) | ({stop_step} if 0 < stop_step < iters else set())
    return sorted(e for e in ends if e > start_step)


def eval_steps(epoch: int, iters: int, accumulation_steps: int, eval_interval: int) -> list[int]:
    """The micro-steps of this epoch that close global update k * eval_interval."""
    updates_per_epoch = math.ceil(iters / accumulation_steps)
    return [s for s in range(accumulation_steps, iters, accumulation_steps)
            if (epoch * updates_per_epoch + s // accumulation_steps) % eval_interval == 0]


def closed_updates(records, pending: list) -> list[tuple[dict, float, float]]:
    """(closing record, mean loss, mean aux_loss) over each closed update's micro-batches; ``pending`` carries
    the (loss, aux_loss) of an update still open after the last record into the next call."""
    closed = []
    for r in records:
        pending.append((r["loss"], r["aux_loss"]))
        if r["update_closed"]:
            closed.append((r, sum(p[0] for p in pending) / len(pending), sum(p[1] for p in pending) / len(pending)))
            pending.clear()
    return closed


def log_updates(closed, begin, epoch, epochs, iters, log_interval, seconds, micro_steps) -> None:
    """MiniMind-style lines, one per closed update that crosses a multiple of log_interval micro-steps (and the
    epoch's last); the loss is the update's mean over its micro-batches, not the last micro-batch's.
    epoch_time is upstream's estimate of the minutes left in the epoch."""
    per_step = seconds / max(micro_steps, 1)
    previous = begin
    for r, loss, aux_loss in closed:
        if r["step"] // log_interval > previous // log_interval or r["step"] == iters:
            Logger(f"Epoch:[{epoch + 1}/{epochs}]({r['step']}/{iters}), loss: {loss:.4f}, "
                   f"logits_loss: {loss - aux_loss:.4f}, aux_loss: {aux_loss:.4f}, "
                   f"lr: {r['lr']:.8f}, epoch_time: {per_step * (iters - r['step']) / 60:.1f}min")
        previous = r["step"]


class Throughput:
    """Real (non-padding) target tokens over the seconds spent inside train_one_epoch."""

    def __init__(self):
        self.tokens, self.seconds, self.started = 0, 0.0, None

    def start(self):
        self.started = time.perf_counter()

    def stop(self):
        self.seconds += time.perf_counter() - self.started
        self.started = None

    def per_second(self) -> float:
        running = time.perf_counter() - self.started if self.started is not None else 0.0
        return self.tokens / max(self.seconds + running, 1e-9)


def counted(batches, bar, throughput):
    """Advance the progress bar (with tokens/s) as each micro-batch is fetched (a paused epoch still shows
    where it is)."""
    for batch in batches:
        throughput.tokens += int((batch[1][:, 1:] != IGNORE_INDEX).sum())
        bar.update(1)
        bar.set_postfix_str(f"{throughput.per_second():,.0f} tok/s")
        yield batch


@torch.no_grad()
def validation_loss(model, batches, device, autocast_ctx) -> float:
    """Mean loss per real target token over the fixed validation batches, in eval mode."""
    model.eval()
    total, count = 0.0, 0
    for input_ids, labels in batches:
        input_ids, labels = input_ids.to(device), labels.to(device)
        with autocast_ctx:
            loss = model(input_ids, labels=labels).loss
        targets = int((labels[:, 1:] != IGNORE_INDEX).sum())
        total, count = total + float(loss) * targets, count + targets
    model.train()
    return total / count


def decode(tokenizer, ids) -> str:
    """The text of ids; an id the tokenizer cannot decode (an untrained model may pick one of the byte
    tokenizer's unused ids) becomes U+FFFD."""
    try:
        return tokenizer.decode(ids)
    except ValueError:
        return "".join(decode(tokenizer, [token]) if len(ids) > 1 else "\ufffd" for token in ids)


@torch.no_grad()
def generate(model, tokenizer, prompt: str, max_new_tokens: int, max_seq_len: int, device) -> str:
    """The prompt and its greedy continuation (argmax at each position, no KV cache), up to max_new_tokens
    or eos; the model sees at most the last max_seq_len tokens, the length it was trained on."""
    model.eval()
    ids = [tokenizer.bos_token_id] + tokenizer.encode(prompt)
    new = []
    for _ in range(max_new_tokens):
        context = torch.tensor([(ids + new)[-max_seq_len:]], device=device)
        token = int(model(context).logits[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        new.append(token)
    model.train()
    return prompt + decode(tokenizer, new)


def plot_losses(train_loss, val_loss, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4))
    if train_loss:
        ax.plot(*zip(*train_loss), label="train (mean over each update's micro-batches)")
    if val_loss:
        ax.plot(*zip(*val_loss), marker="o", label="validation")
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def split(dataset, val_fraction: float):
    """(train, validation) subsets: the validation set is the last ceil(val_fraction * N) lines."""
    n_val = math.ceil(len(dataset) * val_fraction)
    if n_val >= len(dataset):
        raise ValueError(f"--val_fraction {val_fraction} leaves no training sample of {len(dataset)}")
    n_train = len(dataset) - n_val
    return Subset(dataset, range(n_train)), Subset(dataset, range(n_train, len(dataset)))


# --- several processes (torchrun): lesson 14 §8 "Several processes: torchrun" -----------------------------

def sync_only_when_closing(segment, ddp_model, begin: int, end: int, train_loop, accumulation_steps: int):
    """Hand out micro-steps begin+1..end, each inside DDP's ``no_sync()`` unless it closes an update.

    train_one_epoch (yours, with no DDP in it) runs a micro-batch's forward and backward before it asks for
    the next one, so the context held across ``yield`` spans exactly that micro-step: a non-closing
    backward only accumulates this rank's gradient, and the closing backward all-reduces the accumulated
    sum once per update (DDP then divides by the world size). Which micro-steps close is decided by your
    own should_step_optimizer and, for the segment's last micro-step, should_flush_tail (the loop flushes
    the tail when its loader ends inside a window), so the sync lands where your loop steps the optimizer.
    Upstream syncs every backward: the same gradients up to rounding, K times the communication. A GradScaler
    scales every rank's loss by the same factor, so every rank unscales the same averaged gradients and
    skips (or not) the same update.
    """
    for step, batch in enumerate(segment, start=begin + 1):
        closes = (train_loop.should_step_optimizer(step, accumulation_steps)
                  or step == end and train_loop.should_flush_tail(end, begin, accumulation_steps))
        with nullcontext() if closes else ddp_model.no_sync():
            yield batch


def sum_over_ranks(values: list[float], device) -> list[float]:
    """Each value summed over the ranks (one all-reduce for the whole list)."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


def check_ranks_agree(model, epoch: int, step: int) -> None:
    """Every rank must hold the same weights at an update boundary; raise on every rank if not (a rank
    that raised alone would leave the others waiting). One sum per parameter tensor, two small all-reduces."""
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    low, high = sums.clone(), sums.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        raise RuntimeError(f"epoch {epoch + 1}, micro-step {step}: the ranks hold different weights (largest "
                           f"spread of a parameter sum: {float((high - low).max()):.3e}). An optimizer step ran on "
                           "gradients that were not all-reduced: does train_one_epoch step exactly where "
                           "should_step_optimizer and should_flush_tail say?")


def main(argv=None) -> int:
    """One process as before; under torchrun (RANK, WORLD_SIZE and LOCAL_RANK set) one rank of a DDP run:
    nccl with one GPU per process on CUDA, gloo on the CPU."""
    args = parse_args(argv)
    if not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= set(os.environ):
        return train(args)
    backend = "gloo"
    if torch.device(args.device).type == "cuda":
        backend, args.device = "nccl", f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(args.device)
    with process_group(backend):
        return train(args)


def train(args) -> int:
    distributed = dist.is_initialized()
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    is_main = rank == 0  # prints, evaluates and writes files; every rank trains
    log = Logger if is_main else (lambda _: None)
    train_loop = load_implementation("train_loop.py", args.impl, args.impl_dir)
    checkpointing = args.resume is not None or args.save_interval > 0 or args.stop_after > 0
    ckpt = load_implementation("checkpoint.py", args.impl, args.impl_dir) if checkpointing else None
    try:
        tokenizer = build_tokenizer(args)
    except ValueError as exc:
        if is_main:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    model, optimizer, scaler, autocast_ctx = build_training(args)
    dataset, val_set = split(PretrainDataset(args.data_path, tokenizer, max_length=args.max_seq_len),
                             args.val_fraction)
    val_batches = list(DataLoader(Subset(val_set, range(min(len(val_set), args.eval_batches * args.batch_size))),
                                  batch_size=args.batch_size))
    # Under DDP rank r reads positions r, r + W, r + 2W, ... of the epoch's permutation, which is the one
    # setup_seed(42 + epoch); torch.randperm(N) gives a single process (same generator, same seed): so rank
    # r's micro-batch j holds every W-th sample of the single-process micro-batch j of size W * batch_size.
    sampler = DistributedSampler(dataset, shuffle=True, seed=42) if distributed else None
    iters = math.ceil((len(dataset) if sampler is None else len(sampler)) / args.batch_size)  # micro-steps per rank
    updates_per_epoch = math.ceil(iters / args.accumulation_steps)
    stop_epoch, stop_index = divmod(args.stop_after - 1, iters)  # the stop's epoch and micro-step, 0-based
    if (args.stop_after and stop_epoch < args.epochs and (stop_index + 1) % args.accumulation_steps
            and stop_index + 1 < iters):
        if is_main:  # windows restart with each epoch: the loop would flush a partial window at the stop
            print(f"error: --stop_after {args.stop_after} is micro-step {stop_index + 1} of epoch {stop_epoch + 1} "
                  f"({iters} micro-steps per epoch), inside an accumulation window; stop at a multiple of "
                  f"--accumulation_steps ({args.accumulation_steps}) within the epoch or at its end", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)  # for resume checkpoints too, whoever's save_checkpoint runs
    moe = "_moe" if args.use_moe else ""
    resume_file = out_dir / f"pretrain_{args.hidden_size}{moe}_resume.pth"
    log(f"LLM params: {sum(p.numel() for p in model.parameters()) / 1e6:.3f} M, "
        f"{len(dataset)} samples" + (f" + {len(val_set)} for validation" if len(val_set) else "") +
        (f", {world_size} processes ({args.device}, {dist.get_backend()}) of {len(sampler)} samples each"
         if distributed else "") + f", train_one_epoch from {args.impl}")
    metrics = {"train_loss": [], "val_loss": [], "tokens_per_second": 0.0, "samples": [],
               "figure": str(out_dir / f"pretrain_{args.hidden_size}{moe}_loss.png")}
    throughput, pending = Throughput(), []

    def evaluate(update: int) -> None:
        # rank 0 alone, on the unwrapped model (the same weights on every rank): the single-process numbers,
        # and no collective that the other ranks, already training on, would have to join
        if not is_main:
            return
        if val_batches:
            metrics["val_loss"].append([update, validation_loss(model, val_batches, args.device, autocast_ctx)])
            tqdm.write(f"update {update}: val_loss {metrics['val_loss'][-1][1]:.4f}", file=sys.stdout)
        metrics["samples"].append([update, generate(model, tokenizer, args.prompt, args.max_new_tokens,
                                                    args.max_seq_len, args.device)])
        tqdm.write(f"update {update} sample: {metrics['samples'][-1][1]!r}", file=sys.stdout)

    def finish() -> None:
        if distributed:  # tokens of every rank over rank 0's time in train_one_epoch
            throughput.tokens = round(sum_over_ranks([throughput.tokens], args.device)[0])
        if not is_main:
            return
        metrics["tokens_per_second"] = throughput.per_second()
        plot_losses(metrics["train_loss"], metrics["val_loss"], Path(metrics["figure"]))
        Logger(f"{throughput.per_second():,.0f} tokens/s in train_one_epoch; loss curves in {metrics['figure']}")
        if args.metrics_json:
            Path(args.metrics_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.metrics_json).write_text(json.dumps(metrics, indent=1))

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
            log(f"resumed from {args.resume}: epoch {start_epoch + 1}/{args.epochs}, step {start_step}/{iters} "
                f"(skipping {start_step} trained micro-batches)")
            if checkpoint["world_size"] != world_size:
                log(f"the checkpoint was written by {checkpoint['world_size']} processes, this run has "
                    f"{world_size}: load_checkpoint rescaled its step (lesson 15 §1.6) and the effective batch "
                    f"is now {args.batch_size * args.accumulation_steps * world_size} samples instead of "
                    f"{args.batch_size * args.accumulation_steps * checkpoint['world_size']}: a different run")
        # Wrapped after the resume load: DDP's constructor copies rank 0's weights to every rank. The RoPE
        # tables (the only buffers) are the same constants everywhere, so they are not re-broadcast per forward.
        on_cuda = torch.device(args.device).type == "cuda"
        trained = DistributedDataParallel(model, device_ids=[torch.device(args.device).index] if on_cuda else None,
                                          forward_sync_buffers=False) if distributed else model
        update = start_epoch * updates_per_epoch + math.ceil(start_step / args.accumulation_steps)
        if val_batches:
            evaluate(update)
        for epoch in range(start_epoch, args.epochs):
            setup_seed(42 + epoch)
            if sampler is not None:
                sampler.set_epoch(epoch)  # its permutation is seeded 42 + epoch; without this, every epoch's is epoch 0's
            order = torch.randperm(len(dataset)).tolist() if sampler is None else sampler
            skip = start_step if epoch == start_epoch else 0
            # pin_memory on CUDA lets the loop's non_blocking copies overlap
            loader = (DataLoader(dataset, batch_sampler=ckpt.SkipBatchSampler(order, args.batch_size, skip),
                                 pin_memory=on_cuda)
                      if ckpt else DataLoader(dataset, batch_size=args.batch_size, sampler=order, pin_memory=on_cuda))
            bar = tqdm(desc=f"epoch {epoch + 1}/{args.epochs}", file=sys.stdout, initial=skip, total=iters,
                       disable=not is_main)
            batches = counted(iter(loader), bar, throughput)
            stop_step = args.stop_after - epoch * iters if args.stop_after else 0
            evals = eval_steps(epoch, iters, args.accumulation_steps, args.eval_interval) if val_batches else []
            start, begin = time.time(), skip
            for end in segment_ends(skip, iters, args.save_interval, stop_step, evals):
                segment = itertools.islice(batches, end - begin)
                if distributed:
                    segment = sync_only_when_closing(segment, trained, begin, end, train_loop,
                                                     args.accumulation_steps)
                throughput.start()
                records = train_loop.train_one_epoch(
                    trained, segment, optimizer, device=args.device, epoch=epoch,
                    epochs=args.epochs, iters=iters, base_lr=args.learning_rate,
                    accumulation_steps=args.accumulation_steps, grad_clip=args.grad_clip, scaler=scaler,
                    autocast_ctx=autocast_ctx, start_step=begin)
                throughput.stop()
                if end == iters or end == stop_step:
                    bar.close()
                closed = closed_updates(records, pending)
                if distributed:  # the update's loss over the whole global batch, not rank 0's share of it
                    check_ranks_agree(model, epoch, end)
                    sums = sum_over_ranks([value for _, loss, aux in closed for value in (loss, aux)], args.device)
                    closed = [(r, loss / world_size, aux / world_size)
                              for (r, _, _), loss, aux in zip(closed, sums[::2], sums[1::2])]
                metrics["train_loss"] += [[update + i, loss] for i, (_, loss, _) in enumerate(closed, start=1)]
                update += len(closed)
                if is_main:
                    log_updates(closed, begin, epoch, args.epochs, iters, args.log_interval, time.time() - start,
                                end - skip)
                begin = end
                if end in evals or val_batches and end == iters and epoch == args.epochs - 1:
                    evaluate(update)
                if args.save_interval and (end % args.save_interval == 0 or end == iters) or end == stop_step:
                    # every rank calls it (each checks its own gradients); lesson 15's save_checkpoint writes on
                    # rank 0 only, the unwrapped model's state. batch_size / accum_steps: a legacy (micro-batch)
                    # training state for lesson 16's trainer (``accum_steps`` is that format's key for K)
                    ckpt.save_checkpoint(resume_file, model=trained, optimizer=optimizer, scaler=scaler,
                                         epoch=epoch, step=end, run_config=run_config(args),
                                         batch_size=args.batch_size, accum_steps=args.accumulation_steps)
                    log(f"saved resume checkpoint (epoch {epoch + 1}, step {end}/{iters}) to {resume_file}")
                if end == stop_step:
                    log(f"stopped after {args.stop_after} micro-steps (--stop_after); continue with "
                        f"--resume {resume_file}")
                    finish()
                    return 0
    except NotImplementedError as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1].filename
        lesson, path = ("15", "impl/checkpoint.py") if ckpt and where == ckpt.__file__ \
            else ("14", "impl/train_loop.py")
        if is_main:
            print(f"TODO: {exc}\nFill in {path} (lesson {lesson} §5), then run "
                  f"`python -m course check {lesson}`.", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        if args.resume is None:
            raise
        if is_main:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    if not val_batches:
        evaluate(update)  # the final sample
    finish()
    if is_main:
        weights = out_dir / f"pretrain_{args.hidden_size}{moe}.pth"
        torch.save(model.state_dict(), weights)
        log(f"saved weights to {weights}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
