"""Stage assembly for lessons 14-15 and 18: dataset -> DataLoader -> model -> your train_one_epoch -> checkpoint.

    python impl/train_pretrain_impl.py                          # uses YOUR impl/train_loop.py
    python impl/train_pretrain_impl.py --impl reference         # learns the stories corpus (lesson 14 §8)
    python impl/train_pretrain_impl.py --impl reference --metrics_json out/metrics.json --eval_interval 20
    python impl/train_pretrain_impl.py --impl reference --save_interval 8 --stop_after 28   # lesson 15
    python impl/train_pretrain_impl.py --impl reference --save_interval 8 --resume out/pretrain_128_resume.pth
    python impl/train_pretrain_impl.py --impl reference --tensorboard out/runs   # view: tensorboard --logdir out/runs
    python impl/train_pretrain_impl.py --impl reference --preset minimind --data_path ../minimind/dataset/pretrain_t2t_mini.jsonl \
        --tokenizer_path ../minimind/model                                   # upstream's pretrain run
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        impl/train_pretrain_impl.py --impl reference --preset tiny             # DDP: 2 processes (lesson 14 §8)

This file is glue, not an exercise: it runs as soon as impl/train_loop.py is filled in. Its MFU (the report card,
--tensorboard) uses lesson 18's reference functions, so it needs nothing of impl/step_costs.py.
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
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset
from tqdm import tqdm

from course.implementations import add_impl_arguments, load_implementation
from course.input_errors import InputError, refuse, refusing_input_errors
from course.minimind import TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, PretrainDataset
from course.minimind.train_pretrain import build_parser as oracle_parser
from course.minimind.train_pretrain import build_tokenizer, build_training
from course.minimind.trainer_utils import Logger, setup_seed
from course.runs.distributed import process_group
from course.runs.threads import add_threads_argument, cpu_threads
from course.runs.update_plan import UpdatePlan, window_error
from course.trainers.ddp import check_ranks_agree, mean_over_ranks, sum_over_ranks, sync_only_when_closing
from course.trainers.pretrain import (STORIES_TOKENIZER, RunFlops, TensorBoardLog, Throughput, closed_updates,
                                      counted, epoch_bar, evaluation_samples, generate, log_directory, log_steps,
                                      log_updates, out_file, plot_losses, repo_relative, run_flops, split,
                                      tokenizer_name, validation_loss, write_report)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Written by labs/data/make_pretrain_stories.py: templated stories and arithmetic, 3000 lines, 0.32 MB.
STORIES_CORPUS = REPO_ROOT / "labs" / "data" / "pretrain_stories.jsonl"


# --preset: the defaults of everything below. "stories" learns to write the corpus's sentences in one epoch of 357
# updates (about half a minute on one CPU thread, lesson 14 §8) with the stories tokenizer (699 tokens, about one
# per word): hidden size 128 and one layer (a second one, measured, costs about 50 % more per step and ends higher
# after these updates), max_seq_len 96 (every text fits whole, the longest is 45 tokens, and so do the prompt and
# its 64-token sample), K = 1 and lr 2e-3 (more, smaller updates learn faster per second than accumulated ones
# here: lesson 14 notes §5 gives the measurements); "tiny" is lessons 14-16's run on the tiny corpus with the byte
# tokenizer (no validation), the defaults before the stories corpus; "minimind" is upstream's pretrain run
# (trainer/train_pretrain.py's defaults) on upstream's data and tokenizer, which it cannot default to. max_seq_len
# is 768, what upstream's README recommends for pretrain_t2t_mini.jsonl (its trainer's default is 340).
TINY_MODEL = dict(hidden_size=TINY_HIDDEN_SIZE, num_hidden_layers=TINY_NUM_HIDDEN_LAYERS, save_interval=0)
PRESETS = {
    "stories": dict(TINY_MODEL, hidden_size=128, num_hidden_layers=1, epochs=1, batch_size=8, accumulation_steps=1,
                    log_interval=100, learning_rate=2e-3, max_seq_len=96, data_path=str(STORIES_CORPUS),
                    tokenizer_path=str(STORIES_TOKENIZER), val_fraction=0.05, eval_interval=120),
    "tiny": dict(TINY_MODEL, epochs=2, batch_size=8, accumulation_steps=4, log_interval=5, learning_rate=5e-4,
                 max_seq_len=64, data_path=str(TINY_CORPUS), val_fraction=0.0),
    "minimind": dict(hidden_size=768, num_hidden_layers=8, epochs=2, batch_size=32, accumulation_steps=8,
                     learning_rate=5e-4, max_seq_len=768, log_interval=100, save_interval=1000, data_path=None,
                     val_fraction=0.0),
}


def parse_args(argv=None):
    preset = argparse.ArgumentParser(add_help=False)
    preset.add_argument("--preset", choices=sorted(PRESETS), default="stories")
    parser = oracle_parser()  # upstream's flags
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--preset", choices=sorted(PRESETS), default="stories",
                        help="defaults: stories (the built-in stories corpus and its tokenizer, with "
                             "validation), tiny (lessons 14-16's tiny corpus and the byte tokenizer, no "
                             "validation) or minimind (upstream's pretrain "
                             "configuration; needs --data_path and --tokenizer_path); explicit flags override them")
    parser.add_argument("--val_fraction", type=float,
                        help="share of the data (its last lines) held out for validation; 0: no validation")
    add_impl_arguments(parser, "train_loop.py and checkpoint.py")
    add_threads_argument(parser)
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
                        help="the samples' prompt (continued greedily, and drawn with --temperature, at each "
                             "evaluation)")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="the drawn sample's softmax temperature, beside the greedy one; 0: greedy only")
    parser.add_argument("--top_k", type=int, default=8, help="the drawn sample picks among the k likeliest tokens")
    parser.add_argument("--metrics_json", default=None, metavar="PATH",
                        help="write train/val loss curves, tokens/s and the samples to this json file")
    parser.add_argument("--report", default=None, metavar="PATH",
                        help="the markdown report card (config, tokens/s and MFU, losses, figure, samples); "
                             "default: --out_dir's pretrain_<hidden_size>_report.md")
    parser.add_argument("--tensorboard", type=log_directory, default=None, metavar="DIR",
                        help="write loss, lr, grad norm, validation loss, tokens/s and MFU for TensorBoard into "
                             "DIR (view them with: tensorboard --logdir DIR)")
    parser.set_defaults(**PRESETS[preset.parse_known_args(argv)[0].preset])  # after every add_argument: they win
    args = parser.parse_args(argv)
    if args.preset == "minimind" and (args.data_path is None or args.tokenizer_path is None):
        raise InputError("--preset minimind trains on upstream's inputs: give --data_path (e.g. "
                         "../minimind/dataset/pretrain_t2t_mini.jsonl) and --tokenizer_path (e.g. ../minimind/model)")
    for name in ("epochs", "batch_size", "accumulation_steps", "log_interval", "max_seq_len", "eval_interval",
                 "eval_batches", "max_new_tokens", "top_k"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.temperature >= 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    if not 0 <= args.val_fraction < 1:
        parser.error(f"--val_fraction must be in [0, 1), got {args.val_fraction}")
    for name in ("save_interval", "stop_after"):
        error = window_error(name, getattr(args, name), args.accumulation_steps)
        if error:
            parser.error(error)
    return args


RUN_CONFIG_FLAGS = ("epochs", "batch_size", "accumulation_steps", "learning_rate", "max_seq_len", "grad_clip",
                    "hidden_size", "num_hidden_layers", "use_moe", "val_fraction")


def run_config(args) -> dict:
    """The flags a resumed run must share with the interrupted one (they fix data order and schedule)."""
    return {name: getattr(args, name) for name in RUN_CONFIG_FLAGS}



@dataclass
class Stage:
    """One rank's run: built once by build_stage, then read and advanced by the steps below."""
    args: argparse.Namespace
    train_loop: ModuleType
    ckpt: ModuleType | None  # lesson 15's checkpoint functions, when the run saves or resumes
    tokenizer: object
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast_ctx: object
    dataset: Subset
    val_set: Subset
    val_batches: list  # the same fixed batches at every evaluation; empty: no validation
    sampler: DistributedSampler | None  # under torchrun
    plan: UpdatePlan
    metrics: dict
    started: float  # time.perf_counter() when the stage was built: the report card's wall time
    flops: RunFlops | None  # FLOPs per token and peak: the MFU (rank 0)
    throughput: Throughput = field(default_factory=Throughput)
    tensorboard: TensorBoardLog | None = None  # --tensorboard's scalars (rank 0)
    pending: list = field(default_factory=list)  # (loss, aux_loss) of an update still open when a segment ends
    trained: torch.nn.Module | None = None  # the model, or its DDP wrapper once the resume has loaded
    update: int = 0  # updates closed so far, over the whole run

    @property
    def distributed(self) -> bool:
        return self.sampler is not None

    @property
    def is_main(self) -> bool:
        return is_main_process()

    @property
    def on_cuda(self) -> bool:
        return torch.device(self.args.device).type == "cuda"

    def log(self, message: str) -> None:
        if self.is_main:
            Logger(message)


def is_main_process() -> bool:
    """Rank 0 prints, evaluates and writes files; every rank trains."""
    return not dist.is_initialized() or dist.get_rank() == 0


@refusing_input_errors
def main(argv=None) -> int:
    """One process as before; under torchrun (RANK, WORLD_SIZE and LOCAL_RANK set) one rank of a DDP run:
    nccl with one GPU per process on CUDA, gloo on the CPU. One CPU thread unless --threads or
    OMP_NUM_THREADS says otherwise (course/runs/threads.py)."""
    args = parse_args(argv)
    with cpu_threads(args.threads):
        if not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= set(os.environ):
            return train(args)
        backend = "gloo"
        if torch.device(args.device).type == "cuda":
            backend, args.device = "nccl", f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(args.device)
        with process_group(backend):
            return train(args)


def train(args) -> int:
    """Build, resume, train epoch by epoch (evaluating, logging and saving on the way), finish; the exit code."""
    train_loop = load_implementation("train_loop.py", args.impl, args.impl_dir)
    checkpointing = args.resume is not None or args.save_interval > 0 or args.stop_after > 0
    ckpt = load_implementation("checkpoint.py", args.impl, args.impl_dir) if checkpointing else None
    stage = build_stage(args, train_loop, ckpt, build_tokenizer(args))
    stop_error = stage.plan.stop_error(args.stop_after)
    if stop_error:
        return refuse(stop_error)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)  # for resume checkpoints too, whoever's save_checkpoint runs
    stage.log(describe(stage))
    if args.tensorboard and stage.is_main:
        stage.tensorboard = TensorBoardLog(args.tensorboard)
    try:
        start_epoch, start_step = resume(stage) if args.resume is not None else (0, 0)
        stage.trained = wrap_for_ddp(stage)
        stage.update = stage.plan.update_index(start_epoch, start_step)
        if stage.val_batches:
            evaluate(stage)
        for epoch in range(start_epoch, args.epochs):
            if train_epoch(stage, epoch, skip=start_step if epoch == start_epoch else 0):
                finish(stage)  # stopped by --stop_after
                return 0
    except NotImplementedError as exc:
        return report_todo(stage, exc)
    except (ValueError, FileNotFoundError) as exc:
        if args.resume is None:
            raise
        return refuse(exc)
    finally:
        if stage.tensorboard:  # flushed and closed however the training ends (a TODO, a refused resume)
            stage.tensorboard.close()
    if not stage.val_batches:
        evaluate(stage)  # the final sample
    finish(stage)
    if stage.is_main:
        torch.save(stage.model.state_dict(), out_file(args, "pretrain", ".pth"))
        stage.log(f"saved weights to {out_file(args, 'pretrain', '.pth')}")
    return 0


def build_stage(args, train_loop: ModuleType, ckpt: ModuleType | None, tokenizer) -> Stage:
    """The model, optimizer, data and update plan of this rank's run."""
    started = time.perf_counter()
    model, optimizer, scaler, autocast_ctx = build_training(args)
    dataset, val_set = split(PretrainDataset(args.data_path, tokenizer, max_length=args.max_seq_len),
                             args.val_fraction)
    val_batches = list(DataLoader(Subset(val_set, range(min(len(val_set), args.eval_batches * args.batch_size))),
                                  batch_size=args.batch_size))
    # Under DDP rank r reads positions r, r + W, r + 2W, ... of the epoch's permutation, which is the one
    # setup_seed(42 + epoch); torch.randperm(N) gives a single process (same generator, same seed): so rank
    # r's micro-batch j holds every W-th sample of the single-process micro-batch j of size W * batch_size.
    sampler = DistributedSampler(dataset, shuffle=True, seed=42) if dist.is_initialized() else None
    iters = math.ceil((len(dataset) if sampler is None else len(sampler)) / args.batch_size)  # micro-steps per rank
    metrics = {"train_loss": [], "val_loss": [], "tokens_per_second": 0.0, "mfu": 0.0, "samples": [],
               "drawn_samples": [], "figure": str(out_file(args, "pretrain", "_loss.png"))}
    # every micro-batch is padded to max_seq_len; CPU runs are fp32 (build_training autocasts on CUDA only)
    dtype = getattr(torch, args.dtype) if torch.device(args.device).type == "cuda" else torch.float32
    processes = dist.get_world_size() if dist.is_initialized() else 1
    flops = run_flops(model.config, args.max_seq_len, args.device, dtype, processes) if is_main_process() else None
    return Stage(args=args, train_loop=train_loop, ckpt=ckpt, tokenizer=tokenizer, model=model, optimizer=optimizer,
                 scaler=scaler, autocast_ctx=autocast_ctx, dataset=dataset, val_set=val_set, val_batches=val_batches,
                 sampler=sampler, plan=UpdatePlan(iters, args.accumulation_steps, args.epochs), metrics=metrics,
                 started=started, flops=flops)


def describe(stage: Stage) -> str:
    """The run's first log line: model size, data, processes, whose train_one_epoch."""
    args = stage.args
    params = sum(p.numel() for p in stage.model.parameters()) / 1e6
    validation = f" + {len(stage.val_set)} for validation" if len(stage.val_set) else ""
    processes = (f", {dist.get_world_size()} processes ({args.device}, {dist.get_backend()}) of "
                 f"{len(stage.sampler)} samples each" if stage.distributed else "")
    return (f"LLM params: {params:.3f} M, {len(stage.dataset)} samples{validation}{processes}, "
            f"train_one_epoch from {args.impl}")


def resume(stage: Stage) -> tuple[int, int]:
    """Load --resume into the model, optimizer and scaler; the (epoch, micro-step) to continue from."""
    args, ckpt = stage.args, stage.ckpt
    checkpoint = ckpt.load_checkpoint(args.resume, model=stage.model, optimizer=stage.optimizer, scaler=stage.scaler)
    saved = checkpoint.get("run_config", {})
    changed = {k: (v, saved.get(k)) for k, v in run_config(args).items() if saved.get(k) != v}
    if changed:
        raise ValueError(f"--resume {args.resume}: these flags differ from the interrupted run (now, saved): {changed}")
    start_epoch, start_step = ckpt.resume_position(checkpoint, stage.plan.iters)
    stage.log(f"resumed from {args.resume}: epoch {start_epoch + 1}/{args.epochs}, step {start_step}/"
              f"{stage.plan.iters} (skipping {start_step} trained micro-batches)")
    world_size = dist.get_world_size() if stage.distributed else 1
    if checkpoint["world_size"] != world_size:
        samples_per_update = args.batch_size * args.accumulation_steps
        stage.log(f"the checkpoint was written by {checkpoint['world_size']} processes, this run has "
                  f"{world_size}: load_checkpoint rescaled its step (lesson 15 §1.6) and the effective batch "
                  f"is now {samples_per_update * world_size} samples instead of "
                  f"{samples_per_update * checkpoint['world_size']}: a different run")
    return start_epoch, start_step


def wrap_for_ddp(stage: Stage) -> torch.nn.Module:
    """Under torchrun, the model in DistributedDataParallel; wrapped after the resume load, as DDP's constructor
    copies rank 0's weights to every rank. The RoPE tables (the only buffers) are the same constants everywhere,
    so they are not re-broadcast per forward."""
    if not stage.distributed:
        return stage.model
    return DistributedDataParallel(stage.model, device_ids=[torch.device(stage.args.device).index]
                                   if stage.on_cuda else None, forward_sync_buffers=False)


def train_epoch(stage: Stage, epoch: int, skip: int) -> bool:
    """Micro-steps skip+1..iters of ``epoch``, in segments (one train_one_epoch call each) that end where the
    run evaluates, saves or stops; True when it stopped there (--stop_after)."""
    args, plan = stage.args, stage.plan
    batches, bar = epoch_batches(stage, epoch, skip)
    stop_step = plan.stop_step(epoch, args.stop_after)
    evals = plan.eval_steps(epoch, args.eval_interval) if stage.val_batches else []
    saves = plan.save_steps(args.save_interval)
    logs = log_steps(plan, args.log_interval) if args.tensorboard else set()  # tokens/s per log line
    pauses = {plan.iters, *evals, *saves, *logs} | ({stop_step} if stop_step else set())
    start, begin = time.time(), skip
    for end in sorted(p for p in pauses if p > skip):
        tokens, seconds = stage.throughput.tokens, stage.throughput.seconds
        records = train_segment(stage, itertools.islice(batches, end - begin), epoch, begin, end)
        if end in (plan.iters, stop_step):
            bar.close()
        closed = closed_updates(records, stage.pending)
        if stage.distributed:
            check_ranks_agree(stage.model, epoch, end)
            closed = mean_over_ranks(closed, args.device)
        stage.metrics["train_loss"] += [[stage.update + i, loss] for i, (_, loss, _) in enumerate(closed, start=1)]
        stage.update += len(closed)
        if args.tensorboard:
            log_to_tensorboard(stage, closed, stage.throughput.tokens - tokens, stage.throughput.seconds - seconds)
        if stage.is_main:
            log_updates(closed, plan, epoch, begin, args.log_interval, time.time() - start, end - skip)
        if end in evals or stage.val_batches and end == plan.iters and epoch == args.epochs - 1:
            evaluate(stage)
        if end in saves or end == stop_step:
            save_resume_checkpoint(stage, epoch, end)
        if end == stop_step:
            stage.log(f"stopped after {args.stop_after} micro-steps (--stop_after); continue with "
                      f"--resume {out_file(args, 'pretrain', '_resume.pth')}")
            return True
        begin = end
    return False


def log_to_tensorboard(stage: Stage, closed, tokens: int, seconds: float) -> None:
    """The segment's closed updates (their mean loss, lr and pre-clip norm), and its tokens/s and MFU: the real
    targets of every rank over rank 0's seconds in train_one_epoch."""
    if stage.distributed:
        tokens = round(sum_over_ranks([tokens], stage.args.device)[0])
    if stage.tensorboard:
        for update, (record, loss, _) in enumerate(closed, start=stage.update - len(closed) + 1):
            stage.tensorboard.update(update, loss, record["lr"], record["grad_norm"])
        if tokens and seconds > 0:
            stage.tensorboard.speed(stage.update, tokens / seconds, stage.flops.mfu(tokens / seconds))


def epoch_batches(stage: Stage, epoch: int, skip: int):
    """(the epoch's micro-batches after the first ``skip``, counted into tokens/s, and its progress bar)."""
    args = stage.args
    setup_seed(42 + epoch)
    if stage.sampler is not None:
        stage.sampler.set_epoch(epoch)  # its permutation is seeded 42 + epoch; without this, every epoch's is epoch 0's
    order = torch.randperm(len(stage.dataset)).tolist() if stage.sampler is None else stage.sampler
    # pin_memory on CUDA lets the loop's non_blocking copies overlap
    if stage.ckpt:
        loader = DataLoader(stage.dataset, batch_sampler=stage.ckpt.SkipBatchSampler(order, args.batch_size, skip),
                            pin_memory=stage.on_cuda)
    else:
        loader = DataLoader(stage.dataset, batch_size=args.batch_size, sampler=order, pin_memory=stage.on_cuda)
    bar = epoch_bar(epoch, args.epochs, stage.plan.iters, initial=skip, disable=not stage.is_main)
    return counted(iter(loader), bar, stage.throughput), bar


def train_segment(stage: Stage, segment, epoch: int, begin: int, end: int) -> list[dict]:
    """The records of train_one_epoch over micro-steps begin+1..end (under DDP, only the micro-steps that close
    an update all-reduce their gradients)."""
    args = stage.args
    if stage.distributed:
        segment = sync_only_when_closing(segment, stage.trained, begin, end, stage.train_loop,
                                         args.accumulation_steps)
    stage.throughput.start()
    records = stage.train_loop.train_one_epoch(
        stage.trained, segment, stage.optimizer, device=args.device, epoch=epoch, epochs=args.epochs,
        iters=stage.plan.iters, base_lr=args.learning_rate, accumulation_steps=args.accumulation_steps,
        grad_clip=args.grad_clip, scaler=stage.scaler, autocast_ctx=stage.autocast_ctx, start_step=begin)
    stage.throughput.stop()
    return records


def evaluate(stage: Stage) -> None:
    """The validation loss (if any), a greedy sample and (--temperature > 0) a drawn one at the current update.
    Rank 0 alone, on the unwrapped model (the same weights on every rank): the single-process numbers, and no
    collective that the other ranks, already training on, would have to join."""
    if not stage.is_main:
        return
    args, metrics = stage.args, stage.metrics
    if stage.val_batches:
        loss = validation_loss(stage.model, stage.val_batches, args.device, stage.autocast_ctx)
        metrics["val_loss"].append([stage.update, loss])
        tqdm.write(f"update {stage.update}: val_loss {loss:.4f}", file=sys.stdout)
        if stage.tensorboard:
            stage.tensorboard.validation(stage.update, loss)
    sample = generate(stage.model, stage.tokenizer, args.prompt, args.max_new_tokens, args.max_seq_len, args.device)
    metrics["samples"].append([stage.update, sample])
    tqdm.write(f"update {stage.update} sample: {sample!r}", file=sys.stdout)
    if args.temperature > 0:  # seeded: the same weights draw the same text
        drawn = generate(stage.model, stage.tokenizer, args.prompt, args.max_new_tokens, args.max_seq_len,
                         args.device, temperature=args.temperature, top_k=args.top_k, seed=stage.update)
        metrics["drawn_samples"].append([stage.update, drawn])
        tqdm.write(f"update {stage.update} drawn:  {drawn!r}", file=sys.stdout)


def save_resume_checkpoint(stage: Stage, epoch: int, step: int) -> None:
    """Lesson 15's save_checkpoint at an update boundary. Every rank calls it (each checks its own gradients);
    it writes on rank 0 only, the unwrapped model's state."""
    args, resume_file = stage.args, out_file(stage.args, "pretrain", "_resume.pth")
    # batch_size and accum_steps make the file a legacy (micro-batch) training state for lesson 16's trainer:
    # its migrate_train_state reads the key accum_steps, so that key keeps its name
    stage.ckpt.save_checkpoint(resume_file, model=stage.trained, optimizer=stage.optimizer, scaler=stage.scaler,
                               epoch=epoch, step=step, run_config=run_config(args),
                               batch_size=args.batch_size, accum_steps=args.accumulation_steps)
    stage.log(f"saved resume checkpoint (epoch {epoch + 1}, step {step}/{stage.plan.iters}) to {resume_file}")


def finish(stage: Stage) -> None:
    """Tokens/s, the loss figure, the report card and --metrics_json (rank 0)."""
    throughput, metrics = stage.throughput, stage.metrics
    if stage.distributed:  # tokens of every rank over rank 0's time in train_one_epoch
        throughput.tokens = round(sum_over_ranks([throughput.tokens], stage.args.device)[0])
    if not stage.is_main:
        return
    metrics["tokens_per_second"] = throughput.per_second()
    metrics["mfu"] = stage.flops.mfu(metrics["tokens_per_second"])
    config = report_config(stage)
    plot_losses(metrics["train_loss"], metrics["val_loss"], Path(metrics["figure"]),
                f"Pretraining: {config['model']}\n{config['data']}: {config['samples']} samples",
                stage.tokenizer.vocab_size)
    report = Path(stage.args.report) if stage.args.report else out_file(stage.args, "pretrain", "_report.md")
    write_report(report, config, metrics, time.perf_counter() - stage.started, evaluation_samples(metrics),
                 results=(stage.flops.report_line(metrics["tokens_per_second"]),))
    Logger(f"{throughput.per_second():,.0f} tokens/s in train_one_epoch, MFU {metrics['mfu']:.2%}; loss curves in "
           f"{metrics['figure']}, report in {report}")
    if stage.args.metrics_json:
        Path(stage.args.metrics_json).parent.mkdir(parents=True, exist_ok=True)
        Path(stage.args.metrics_json).write_text(json.dumps(metrics, indent=1))


def report_config(stage: Stage) -> dict:
    """The report card's settings table."""
    args = stage.args
    processes = dist.get_world_size() if stage.distributed else 1
    return {"preset": args.preset, "data": repo_relative(args.data_path),
            "tokenizer": f"{tokenizer_name(args.tokenizer_path)} ({stage.tokenizer.vocab_size} tokens)",
            "samples": f"{len(stage.dataset)} train, {len(stage.val_set)} validation",
            "model": f"hidden size {args.hidden_size}, {counted_as(args.num_hidden_layers, 'layer')}, "
                     f"{sum(p.numel() for p in stage.model.parameters()) / 1e6:.3f} M parameters",
            "schedule": f"{counted_as(args.epochs, 'epoch')}, micro-batch {args.batch_size}, "
                        f"K {args.accumulation_steps}, "
                        f"{stage.plan.updates_per_epoch * args.epochs} updates, max_seq_len {args.max_seq_len}",
            "learning rate": f"{args.learning_rate:g} (cosine), grad_clip {args.grad_clip:g}",
            "device": f"{args.device}, {processes} process(es), {torch.get_num_threads()} CPU thread(s) each",
            "samples drawn": f"greedy, and temperature {args.temperature:g} top-k {args.top_k}"}


def counted_as(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def report_todo(stage: Stage, exc: NotImplementedError) -> int:
    """Which stub raised and what to do about it; exit code 1."""
    where = traceback.extract_tb(exc.__traceback__)[-1].filename
    lesson, path = (("15", "impl/checkpoint.py") if stage.ckpt and where == stage.ckpt.__file__
                    else ("14", "impl/train_loop.py"))
    if stage.is_main:
        print(f"TODO: {exc}\nFill in {path} (lesson {lesson} §5), then run `python -m course check {lesson}`.",
              file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
