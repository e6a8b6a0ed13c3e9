"""SFT stage assembly for lesson 17: pretrain weights -> your load_pretrained_weights -> conversations labelled by
your assistant_labels -> your sft_epoch on your lesson-16 TrainingSession -> full_sft weights.

    python impl/train_full_sft_impl.py                    # uses YOUR impl/sft.py and impl/train_session.py
    python impl/train_full_sft_impl.py --impl reference   # fine-tunes out/pretrain_128.pth on the stories chats
    python impl/train_full_sft_impl.py --impl reference --preset minimind \
        --data_path ../minimind/dataset/sft_mini_512.jsonl --tokenizer_path ../minimind/model \
        --from_weight ../minimind/out/pretrain_768.pth                        # upstream's SFT run
    python impl/train_full_sft_impl.py --impl reference --tensorboard out/runs_sft   # view: tensorboard --logdir out/runs_sft
    python -m course chat --weights out/full_sft_128.pth  # talk to the result

It starts from the weights file the pretrain stage writes (``python impl/train_pretrain_impl.py --impl reference``)
and mirrors upstream MiniMind's trainer/train_full_sft.py; before and after training it answers a few held-out
questions, and at the end it scores every held-out answer. This file is glue, not an exercise. Its MFU (the report
card, --tensorboard) uses lesson 18's reference functions: the FLOPs of every non-padding position.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch
from tqdm import tqdm

from course.implementations import add_impl_arguments, load_implementation
from course.input_errors import InputError, refusing_input_errors
from course.minimind import SFTDataset, get_lr, setup_seed
from course.minimind.sft import ADD_SYSTEM_RATIO, EMPTY_THINK_RATIO, read_state_dict, save_weights_like_upstream
from course.minimind.train_pretrain import build_tokenizer, build_training
from course.minimind.trainer_utils import Logger
from course.runs.threads import add_threads_argument, cpu_threads
from course.experiments.step_timing import Peak, device_peak
from course.trainers.pretrain import (RUN_PEAK_SECONDS, STORIES_TOKENIZER, TensorBoardLog, Throughput, advance,
                                      epoch_bar, log_directory, out_file, plot_losses, repo_relative, tokenizer_name,
                                      validation_loss, write_report)
from course.trainers.sft import (STORIES_SFT_CORPUS, STORIES_SFT_HELDOUT, AssistantMaskedDataset, answer,
                                 answers_table, config_of, exact_answers, heldout_questions, last_question,
                                 micro_batches, position_flops, score_line, sft_mfu, sft_mfu_line,
                                 validation_batches)

REPO_ROOT = Path(__file__).resolve().parents[1]

# --preset: the defaults of everything below. "stories" fine-tunes the pretrain stage's stories model (hidden size
# 128, one layer, its word-level tokenizer) on the built-in chats: lr 5e-3 (3e-3 failed one seed), 9 epochs of 100
# updates (fewer fall off fast: pooled by characters, 7 epochs answered 80-93 %, 6 epochs 48 %), max_seq_len 128
# (the longest chat has 124 tokens), upstream's empty think blocks (kept in 20 %) and no random system prompt (the
# corpus has its own). Micro-batches of similar lengths (--length_pool 8): random ones, trimmed after their last
# target, hold 1.56x the positions their samples keep, and one sampling order of them answered only 61 %; pooled by
# the positions each drawn sample keeps (a kept empty think block adds 15 tokens with this tokenizer, so pooling by
# characters left 1.37x), they hold 1.08x, and the run answered 91.6-94.3 % under three CPU kernel families and one
# or two threads. "minimind" is upstream's trainer/train_full_sft.py defaults (random micro-batches, its
# SFTDataset's randomness) on upstream's data and tokenizer, which it cannot default to.
PRESETS = {
    "stories": dict(hidden_size=128, num_hidden_layers=1, epochs=9, batch_size=16, accumulation_steps=1,
                    learning_rate=5e-3, max_seq_len=128, length_pool=8, log_interval=50, eval_interval=200,
                    data_path=str(STORIES_SFT_CORPUS), heldout_path=str(STORIES_SFT_HELDOUT),
                    tokenizer_path=str(STORIES_TOKENIZER), add_system_ratio=0.0, empty_think_ratio=EMPTY_THINK_RATIO),
    "minimind": dict(hidden_size=768, num_hidden_layers=8, epochs=2, batch_size=16, accumulation_steps=1,
                     learning_rate=1e-5, max_seq_len=768, length_pool=0, log_interval=100, eval_interval=1000,
                     data_path=None, heldout_path=None, tokenizer_path=None, add_system_ratio=ADD_SYSTEM_RATIO,
                     empty_think_ratio=EMPTY_THINK_RATIO),
}
POSITIVE_FLAGS = ("epochs", "batch_size", "accumulation_steps", "max_seq_len", "hidden_size", "num_hidden_layers",
                  "log_interval", "eval_interval", "max_new_tokens")


def parse_args(argv=None):
    preset = argparse.ArgumentParser(add_help=False)
    preset.add_argument("--preset", choices=sorted(PRESETS), default="stories")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="stories",
                        help="defaults: stories (the built-in chats, the pretrain stage's stories model) or minimind "
                             "(upstream's SFT configuration; needs --data_path, --tokenizer_path and --from_weight); "
                             "explicit flags override them")
    parser.add_argument("--data_path", help="the SFT jsonl (upstream's format: one {\"conversations\": [...]} a line)")
    parser.add_argument("--heldout_path", help="held-out chats: validation loss, answers and the exact-answer score")
    parser.add_argument("--tokenizer_path", help="a tokenizer.json or its directory (stories: the stories "
                                                 "tokenizer, labs/data/stories_tokenizer)")
    parser.add_argument("--vocab_size", type=int, default=None, help="default: the tokenizer's, and it must equal it")
    parser.add_argument("--from_weight", "--weights", dest="from_weight", default=None, metavar="PATH",
                        help="the pretrain weights (default: --out_dir's pretrain_<hidden_size>.pth, what "
                             "impl/train_pretrain_impl.py writes)")
    parser.add_argument("--out_dir", default=str(REPO_ROOT / "out"))
    for name, kind in (("epochs", int), ("batch_size", int), ("accumulation_steps", int), ("learning_rate", float),
                       ("max_seq_len", int), ("hidden_size", int), ("num_hidden_layers", int)):
        parser.add_argument(f"--{name}", type=kind)
    parser.add_argument("--length_pool", type=int, metavar="MICRO_BATCHES",
                        help="sort each run of this many micro-batches' conversations by length, then shuffle the "
                             "run's micro-batches: less padding (0: upstream's random micro-batches)")
    parser.add_argument("--use_moe", type=int, default=0, choices=[0, 1])
    parser.add_argument("--grad_clip", type=float, default=1.0)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--log_interval", type=int, help="a log line every this many updates")
    parser.add_argument("--eval_interval", type=int, metavar="UPDATES",
                        help="the validation loss every this many updates, at the start and at the end")
    parser.add_argument("--show_questions", type=int, default=3,
                        help="held-out questions answered (greedily) before and after SFT")
    parser.add_argument("--max_new_tokens", type=int, default=64,
                        help="the longest answer generated (the stories held-out answers are at most 7 tokens)")
    parser.add_argument("--metrics_json", default=None, metavar="PATH",
                        help="write the loss curves, tokens/s, answers and score to this json file")
    parser.add_argument("--report", default=None, metavar="PATH",
                        help="the markdown report card (default: --out_dir's full_sft_<hidden_size>_report.md)")
    parser.add_argument("--tensorboard", type=log_directory, default=None, metavar="DIR",
                        help="write loss, lr, grad norm, validation loss, target tokens/s and MFU for TensorBoard "
                             "into DIR (view them with: tensorboard --logdir DIR)")
    add_impl_arguments(parser, "sft.py and train_session.py")
    add_threads_argument(parser)
    parser.set_defaults(**PRESETS[preset.parse_known_args(argv)[0].preset])
    args = parser.parse_args(argv)
    if args.preset == "minimind" and (args.data_path is None or args.tokenizer_path is None
                                      or args.from_weight is None):
        raise InputError("--preset minimind fine-tunes on upstream's inputs: give --data_path (e.g. "
                         "../minimind/dataset/sft_mini_512.jsonl), --tokenizer_path (e.g. ../minimind/model) and "
                         "--from_weight (e.g. ../minimind/out/pretrain_768.pth)")
    for name in POSITIVE_FLAGS:
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.learning_rate > 0:
        raise InputError(f"--learning_rate must be > 0, got {args.learning_rate}")
    if not args.grad_clip >= 0:
        raise InputError(f"--grad_clip must be >= 0 (0: no clipping), got {args.grad_clip}")
    if args.length_pool < 0:
        raise InputError(f"--length_pool must be >= 0 (0: random micro-batches), got {args.length_pool}")
    if args.show_questions < 0:
        raise InputError(f"--show_questions must be >= 0, got {args.show_questions}")
    args.from_weight = args.from_weight or str(out_file(args, "pretrain", ".pth"))
    for flag, path in (("--from_weight", args.from_weight), ("--data_path", args.data_path),
                       ("--heldout_path", args.heldout_path)):
        if path is not None and not Path(path).is_file():
            raise InputError(f"{flag} {path}: no such file" + (
                "; write it with `python impl/train_pretrain_impl.py --impl reference`" if flag == "--from_weight"
                else ""))
    return args


@dataclass
class Stage:
    """The run: built by build_stage, advanced by train_epoch."""
    args: argparse.Namespace
    sft: ModuleType            # lesson 17's functions
    tokenizer: object
    model: torch.nn.Module
    session: object            # lesson 16's TrainingSession
    autocast_ctx: object
    train_set: AssistantMaskedDataset
    val_batches: list          # the whole held-out split, labelled by upstream's rule; empty: no validation
    questions: list            # (history, reference answer) of every held-out answer
    metrics: dict
    started: float             # time.perf_counter() when the stage was built: the report card's wall time
    peak: Peak                 # the MFU's: the GPU's datasheet bf16 peak, or this CPU's measured matmul peak
    throughput: Throughput = field(default_factory=Throughput)
    flops: int = 0             # training FLOPs of the non-padding positions trained on so far (position_flops)
    tensorboard: TensorBoardLog | None = None   # --tensorboard's scalars
    logged: tuple = (0, 0.0, 0)   # (target tokens, seconds, FLOPs) at the last log line: its tokens/s and MFU
    update: int = 0
    shown_answers: dict = field(default_factory=dict)  # "before SFT" / "after SFT" -> the shown questions' answers

    @property
    def micro_batches_per_epoch(self) -> int:
        return math.ceil(len(self.train_set) / self.args.batch_size)

    @property
    def updates_per_epoch(self) -> int:
        return math.ceil(self.micro_batches_per_epoch / self.args.accumulation_steps)

    @property
    def shown_questions(self) -> list:
        """The --show_questions held-out questions answered before and after SFT, spread over the held-out set."""
        every = max(1, len(self.questions) // max(self.args.show_questions, 1))
        return self.questions[::every][:self.args.show_questions]


@refusing_input_errors
def main(argv=None) -> int:
    args = parse_args(argv)
    with cpu_threads(args.threads):
        return train(args)


def train(args) -> int:
    """Build, answer and validate, train epoch by epoch, answer, score and save; the exit code."""
    sft = load_implementation("sft.py", args.impl, args.impl_dir)
    session_impl = load_implementation("train_session.py", args.impl, args.impl_dir)
    tokenizer = build_tokenizer(args)
    stage = None
    try:
        stage = build_stage(args, sft, session_impl, tokenizer)
        Logger(describe(stage))
        stage.tensorboard = TensorBoardLog(args.tensorboard) if args.tensorboard else None
        evaluate(stage, "before SFT")
        for epoch in range(args.epochs):
            train_epoch(stage, epoch)
        evaluate(stage, "after SFT")
    except NotImplementedError as exc:
        return report_todo(exc, sft, session_impl)
    finally:
        if stage is not None and stage.tensorboard:  # flushed and closed however the training ends
            stage.tensorboard.close()
    matches = exact_answers([answer(stage.model, tokenizer, history, args.max_new_tokens, args.max_seq_len,
                                    args.device) for history, _ in stage.questions],
                            [reference for _, reference in stage.questions]) if stage.questions else None
    if matches is not None:
        stage.metrics["exact_answers"] = [matches, len(stage.questions)]
        print(score_line(matches, len(stage.questions)))
    finish(stage)
    return 0


def vocabulary_mismatch(args) -> str:
    """Why a weights file may not fit, when the reason is its tokenizer: '' otherwise."""
    try:
        rows = config_of(read_state_dict(args.from_weight)).vocab_size
    except InputError:
        return ""
    if rows == args.vocab_size:
        return ""
    return (f" (its vocabulary has {rows} tokens, this run's tokenizer {args.vocab_size}: pretrain and fine-tune "
            f"with the same --tokenizer_path, e.g. rerun `python impl/train_pretrain_impl.py --impl reference`)")


def build_stage(args, sft: ModuleType, session_impl: ModuleType, tokenizer) -> Stage:
    """The pretrained model (through your load_pretrained_weights), your TrainingSession and the data."""
    started = time.perf_counter()
    model, optimizer, scaler, autocast_ctx = build_training(args)
    try:
        sft.load_pretrained_weights(model, args.from_weight)
    except NotImplementedError:  # a RuntimeError, but the stub's TODO, not the file's fault
        raise
    except (ValueError, RuntimeError) as exc:  # a file that does not fit the model (InputError is a ValueError)
        raise InputError(f"--from_weight {args.from_weight}: {exc}{vocabulary_mismatch(args)}") from None
    session = session_impl.TrainingSession(model, optimizer, accumulation_steps=args.accumulation_steps,
                                           scaler=scaler, autocast=autocast_ctx)
    ratios = dict(add_system_ratio=args.add_system_ratio, empty_think_ratio=args.empty_think_ratio)
    train_set = AssistantMaskedDataset(args.data_path, tokenizer, args.max_seq_len, sft.assistant_labels,
                                       random.Random(42), **ratios)
    val_batches, questions = [], []
    if args.heldout_path:
        # upstream's own labels: the measurement does not depend on the code it measures
        heldout = SFTDataset(args.heldout_path, tokenizer, args.max_seq_len, random.Random(0), **ratios)
        val_batches, questions = validation_batches(heldout, args.batch_size), heldout_questions(args.heldout_path)
        if not any((labels != -100).any() for _, labels in val_batches):
            raise InputError(f"--heldout_path {args.heldout_path}: no answer starts within --max_seq_len "
                             f"{args.max_seq_len} tokens; nothing to validate on")
    metrics = {"train_loss": [], "val_loss": [], "tokens_per_second": 0.0, "samples": [], "drawn_samples": [],
               "figure": str(out_file(args, "full_sft", "_loss.png"))}
    # CPU runs are fp32 (build_training autocasts on CUDA only)
    dtype = getattr(torch, args.dtype) if torch.device(args.device).type == "cuda" else torch.float32
    return Stage(args=args, sft=sft, tokenizer=tokenizer, model=model, session=session, autocast_ctx=autocast_ctx,
                 train_set=train_set, val_batches=val_batches, questions=questions, metrics=metrics,
                 started=started, peak=device_peak(args.device, dtype, seconds=RUN_PEAK_SECONDS))


def describe(stage: Stage) -> str:
    """The first log line: model size, data, the first sample's targets (your assistant_labels), whose code."""
    args = stage.args
    params = sum(p.numel() for p in stage.model.parameters()) / 1e6
    input_ids, labels = stage.train_set[0]
    tokens, targets = int((input_ids != stage.tokenizer.pad_token_id).sum()), int((labels != -100).sum())
    validation = f" + {len(stage.questions)} held-out answers" if stage.questions else ""
    return (f"LLM params: {params:.3f} M from {args.from_weight}, {len(stage.train_set)} conversations{validation}; "
            f"conversation 0: {targets} of {tokens} tokens are targets; sft_epoch and TrainingSession from "
            f"{args.impl_dir or args.impl}")


def evaluate(stage: Stage, when: str | None) -> None:
    """The validation loss on the held-out assistant tokens and, ``when`` named (before or after SFT), the greedy
    answers to --show_questions held-out questions."""
    args, metrics = stage.args, stage.metrics
    if stage.val_batches:
        loss = validation_loss(stage.model, stage.val_batches, args.device, stage.autocast_ctx)
        metrics["val_loss"].append([stage.update, loss])
        tqdm.write(f"update {stage.update}: val_loss {loss:.4f}", file=sys.stdout)  # beneath an epoch's bar
        if stage.tensorboard:
            stage.tensorboard.validation(stage.update, loss)
    if when is None or not stage.questions:
        return
    stage.shown_answers[when] = []
    for history, reference in stage.shown_questions:
        reply = answer(stage.model, stage.tokenizer, history, args.max_new_tokens, args.max_seq_len, args.device)
        stage.shown_answers[when].append(reply)
        metrics["samples"].append([stage.update, f"{last_question(history)} -> {reply}"])
        print(f"{when}: {last_question(history)!r} -> {reply!r} (reference {reference!r})")


def train_epoch(stage: Stage, epoch: int) -> None:
    """One epoch in a new random order, one update (K micro-batches) per sft_epoch call, so that each update gets
    its own learning rate (upstream's cosine, per update); a progress bar, log lines and validation on the way."""
    args, per_epoch = stage.args, stage.updates_per_epoch
    setup_seed(42 + epoch)
    batches = micro_batches(stage.train_set, torch.randperm(len(stage.train_set)).tolist(), args.batch_size,
                            args.length_pool)
    start = time.time()
    with epoch_bar(epoch, args.epochs, stage.micro_batches_per_epoch) as bar:
        for update_in_epoch in range(1, per_epoch + 1):
            window = list(itertools.islice(batches, args.accumulation_steps))  # the epoch's last may be shorter
            lr = get_lr(stage.update, args.epochs * per_epoch, args.learning_rate)
            stage.throughput.start()
            report, = stage.sft.sft_epoch(stage.session, window, args.accumulation_steps, lr=lr,
                                          clip_grad_norm=args.grad_clip)
            stage.throughput.stop()
            stage.throughput.tokens += sum(batch.loss_units for batch in window)
            stage.flops += position_flops(stage.model.config, window, stage.tokenizer.pad_token_id)
            stage.update += 1
            advance(bar, stage.throughput, len(window))
            if report is not None:
                stage.metrics["train_loss"].append([stage.update, float(report.loss_sum) / report.loss_units])
            log_line = update_in_epoch % args.log_interval == 0 or update_in_epoch == per_epoch
            if stage.tensorboard:
                log_to_tensorboard(stage, report, lr, log_line)
            if log_line:
                loss = f"{stage.metrics['train_loss'][-1][1]:.4f}" if report is not None else "- (no target)"
                left = (time.time() - start) / update_in_epoch * (per_epoch - update_in_epoch) / 60
                tqdm.write(f"Epoch:[{epoch + 1}/{args.epochs}]({update_in_epoch}/{per_epoch}), loss: {loss}, "
                           f"lr: {lr:.8f}, left_in_epoch: {left:.1f}min", file=sys.stdout)
            if stage.update % args.eval_interval == 0 and stage.update < args.epochs * per_epoch:
                evaluate(stage, None)


def log_to_tensorboard(stage: Stage, report, lr: float, log_line: bool) -> None:
    """The update's loss, lr and pre-clip norm (an update without a target has none); at a log line, the target
    tokens/s and the MFU since the previous one."""
    if report is not None:
        norm = float(report.grad_norm) if report.grad_norm is not None else None
        stage.tensorboard.update(stage.update, stage.metrics["train_loss"][-1][1], lr, norm)
    if log_line:
        now = (stage.throughput.tokens, stage.throughput.seconds, stage.flops)
        tokens, seconds, flops = (a - b for a, b in zip(now, stage.logged))
        if tokens and seconds > 0:
            stage.tensorboard.speed(stage.update, tokens / seconds, sft_mfu(flops, tokens, seconds, stage.peak))
        stage.logged = now


def finish(stage: Stage) -> None:
    """The SFT weights (fp16, as upstream saves them), the loss figure, the report card and --metrics_json."""
    args, metrics = stage.args, stage.metrics
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    weights = out_file(args, "full_sft", ".pth")
    save_weights_like_upstream(stage.model, weights)
    metrics["tokens_per_second"] = stage.throughput.per_second()
    throughput = stage.throughput
    metrics["mfu"] = sft_mfu(stage.flops, throughput.tokens, throughput.seconds, stage.peak)
    config = report_config(stage)
    plot_losses(metrics["train_loss"], metrics["val_loss"], Path(metrics["figure"]),
                f"Supervised fine-tuning: {config['model']}\n{config['data']}, from {config['pretrained weights']}",
                stage.tokenizer.vocab_size)
    report = Path(args.report) if args.report else out_file(args, "full_sft", "_report.md")
    score = [score_line(*metrics["exact_answers"])] if "exact_answers" in metrics else []
    mfu = sft_mfu_line(stage.flops, throughput.tokens, throughput.seconds, stage.peak)
    answers = answers_table(stage.shown_questions, stage.shown_answers) if stage.questions else []
    write_report(report, config, metrics, time.perf_counter() - stage.started, answers,
                 title="Supervised fine-tuning run", trained_in="sft_epoch", results=(mfu, *score))
    Logger(f"{metrics['tokens_per_second']:,.0f} target tokens/s in sft_epoch, MFU {metrics['mfu']:.2%}; saved "
           f"weights to {weights}; loss curves in {metrics['figure']}, report in {report}")
    if args.metrics_json:
        Path(args.metrics_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.metrics_json).write_text(json.dumps(metrics, indent=1))


def report_config(stage: Stage) -> dict:
    """The report card's settings table."""
    args = stage.args
    return {"preset": args.preset, "pretrained weights": repo_relative(args.from_weight),
            "data": repo_relative(args.data_path),
            "held-out": f"{repo_relative(args.heldout_path)} ({len(stage.questions)} answers)" if args.heldout_path
                        else "none",
            "tokenizer": f"{tokenizer_name(args.tokenizer_path)} ({stage.tokenizer.vocab_size} tokens)",
            "model": f"hidden size {args.hidden_size}, {args.num_hidden_layers} layer(s), "
                     f"{sum(p.numel() for p in stage.model.parameters()) / 1e6:.3f} M parameters",
            "schedule": f"{args.epochs} epoch(s), micro-batch {args.batch_size}, K {args.accumulation_steps}, "
                        f"{stage.updates_per_epoch * args.epochs} updates, max_seq_len {args.max_seq_len}",
            "learning rate": f"{args.learning_rate:g} (cosine), grad_clip {args.grad_clip:g}",
            "device": f"{args.device}, {torch.get_num_threads()} CPU thread(s)",
            "answers": "greedy"}


def report_todo(exc: NotImplementedError, sft: ModuleType, session_impl: ModuleType) -> int:
    """Which stub raised and what to do about it; exit code 1."""
    where = traceback.extract_tb(exc.__traceback__)[-1].filename
    lesson, module = ("16", session_impl) if where == session_impl.__file__ else ("17", sft)
    print(f"TODO: {exc}\nFill in {os.path.relpath(module.__file__)} (lesson {lesson} §5), then run "
          f"`python -m course check {lesson}`.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
