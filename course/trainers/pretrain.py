"""The stage assembly's reusable pieces (``impl/train_pretrain_impl.py``, lessons 14-15 and 18): the
train/validation split, tokens/s and the progress bar, the run's MFU, the validation loss, greedy samples, the loss
figure and the report card, the per-update train loss and log, and the TensorBoard scalars of ``--tensorboard``."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Subset
from tqdm import tqdm

from course.experiments.step_timing import Peak, device_peak
from course.implementations import REPO_ROOT
from course.minimind import IGNORE_INDEX, MiniMindConfig
from course.reference import step_costs as lesson18
from course.runs.update_plan import UpdatePlan

# The stories models' own tokenizer, both stages of the main job (labs/data/make_stories_tokenizer.py: upstream's
# BPE recipe on the stories corpora, 699 tokens, about one a word).
STORIES_TOKENIZER = REPO_ROOT / "labs" / "data" / "stories_tokenizer" / "tokenizer.json"


def out_file(args, stage: str, suffix: str) -> Path:
    """--out_dir's <stage>_<hidden_size>[_moe]<suffix>, upstream's naming ("pretrain", "full_sft"): the SFT stage
    finds the pretrain stage's weights by it."""
    return Path(args.out_dir) / f"{stage}_{args.hidden_size}{'_moe' if args.use_moe else ''}{suffix}"


def split(dataset, val_fraction: float):
    """(train, validation) subsets: the validation set is the last ceil(val_fraction * N) lines."""
    n_val = math.ceil(len(dataset) * val_fraction)
    if n_val >= len(dataset):
        raise ValueError(f"--val_fraction {val_fraction} leaves no training sample of {len(dataset)}")
    n_train = len(dataset) - n_val
    return Subset(dataset, range(n_train)), Subset(dataset, range(n_train, len(dataset)))


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


@dataclass(frozen=True)
class RunFlops:
    """What the run's MFU needs: lesson 18's training FLOPs per token (the reference ``flops_per_token``: a
    student's lesson-14 run does not need lesson 18) at the length every micro-batch is padded to, and the peak."""
    flops_per_token: int
    seq_len: int
    peak: Peak

    def mfu(self, tokens_per_second: float) -> float:
        """The share of the peak that ``tokens_per_second`` real target tokens use (padding counts as waste)."""
        return lesson18.mfu(self.flops_per_token, tokens_per_second, self.peak.flops_per_second)

    def report_line(self, tokens_per_second: float) -> str:
        return (f"MFU {self.mfu(tokens_per_second):.2%}: {self.flops_per_token:,} training FLOPs per token "
                f"(lesson 18's flops_per_token at max_seq_len {self.seq_len}) x {tokens_per_second:,.0f} tokens/s, "
                f"against {self.peak.flops_per_second / 1e9:,.1f} GFLOP/s ({self.peak.source})")


# The peak's measurement on a CPU, at the start of every run (measured here: 0.15 s finds what 1 s finds, 102 GFLOP/s).
RUN_PEAK_SECONDS = 0.15


def run_flops(config: MiniMindConfig, seq_len: int, device, dtype, processes: int = 1) -> RunFlops:
    """The run's FLOPs per token and peak: the GPU's datasheet bf16 peak, or this CPU's matmul peak measured now
    (at the run's thread count) in ``dtype``; times ``processes`` under DDP (the tokens/s are every rank's)."""
    peak = device_peak(device, dtype, seconds=RUN_PEAK_SECONDS)
    if processes > 1:
        peak = Peak(processes * peak.flops_per_second, f"{processes} processes x {peak.source}")
    return RunFlops(lesson18.flops_per_token(config, seq_len, training=True), seq_len, peak)


class TensorBoardLog:
    """``--tensorboard DIR``: the run's scalars for TensorBoard (``tensorboard --logdir DIR``), one event file per
    run, against the run's update number: ``train/loss``, ``train/lr`` and ``train/grad_norm`` (before clipping) of
    every update, ``val/loss`` at each evaluation, ``perf/tokens_per_second`` and ``perf/mfu`` at each log line."""

    def __init__(self, log_dir):
        from torch.utils.tensorboard import SummaryWriter  # only for runs that ask for it
        self.writer = SummaryWriter(str(log_dir))

    def update(self, update: int, loss: float, lr: float, grad_norm: float | None) -> None:
        self.writer.add_scalar("train/loss", loss, update)
        self.writer.add_scalar("train/lr", lr, update)
        if grad_norm is not None:
            self.writer.add_scalar("train/grad_norm", grad_norm, update)

    def validation(self, update: int, loss: float) -> None:
        self.writer.add_scalar("val/loss", loss, update)

    def speed(self, update: int, tokens_per_second: float, mfu: float) -> None:
        self.writer.add_scalar("perf/tokens_per_second", tokens_per_second, update)
        self.writer.add_scalar("perf/mfu", mfu, update)

    def close(self) -> None:
        self.writer.close()


def log_directory(text: str) -> str:
    """``--tensorboard DIR``'s argument type: a directory, or a path where one can be made."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: a file is there, not a directory")
    return text


def log_steps(plan: UpdatePlan, log_interval: int) -> set[int]:
    """The micro-steps of an epoch whose closed update ``log_updates`` logs (``plan.log_due``)."""
    closing = [step for step in range(1, plan.iters + 1) if plan.closes_update(step)]
    return {step for previous, step in zip([0] + closing, closing) if plan.log_due(previous, step, log_interval)}


def epoch_bar(epoch: int, epochs: int, total: int, **options) -> tqdm:
    """The epoch's progress bar in micro-batches, on stdout with the stage's log (``options``: tqdm's)."""
    return tqdm(desc=f"epoch {epoch + 1}/{epochs}", file=sys.stdout, total=total, **options)


def advance(bar: tqdm, throughput: Throughput, micro_batches: int = 1) -> None:
    bar.update(micro_batches)
    bar.set_postfix_str(f"{throughput.per_second():,.0f} tok/s")


def counted(batches, bar, throughput):
    """Advance the progress bar (with tokens/s) as each micro-batch is fetched (a paused epoch still shows
    where it is)."""
    for batch in batches:
        throughput.tokens += int((batch[1][:, 1:] != IGNORE_INDEX).sum())
        advance(bar, throughput)
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
def generate_ids(model, ids: list[int], max_new_tokens: int, max_seq_len: int, device, stop_id: int,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> list[int]:
    """The ids that continue ``ids`` (no KV cache), up to max_new_tokens or ``stop_id`` (not returned); the model
    sees at most the last max_seq_len tokens, the length it was trained on, and the output layer runs on the last
    position alone (the 6400-way projection of every position is most of a forward pass; only the last predicts
    the next token). temperature 0: greedy (argmax at each position); else a draw from softmax(logits /
    temperature) over the top_k most likely tokens (0: all), then over the fewest of those whose probabilities
    sum to top_p (1.0: all), by a generator seeded with ``seed``, so the same weights give the same sample."""
    model.eval()
    new = []
    generator = torch.Generator().manual_seed(seed)
    for _ in range(max_new_tokens):
        context = torch.tensor([(ids + new)[-max_seq_len:]], device=device)
        hidden, _ = model.model(context)
        logits = model.lm_head(hidden[0, -1]).float().cpu()
        if temperature > 0:
            kept = torch.topk(logits, top_k) if top_k else torch.sort(logits, descending=True)
            probs = torch.softmax(kept.values / temperature, dim=-1)
            if top_p < 1.0:  # the nucleus: each token whose more likely ones sum to less than top_p
                probs[1:][torch.cumsum(probs, 0)[:-1] >= top_p] = 0.0
            token = int(kept.indices[torch.multinomial(probs, 1, generator=generator)])
        else:
            token = int(logits.argmax())
        if token == stop_id:
            break
        new.append(token)
    model.train()
    return new


def generate(model, tokenizer, prompt: str, max_new_tokens: int, max_seq_len: int, device, temperature: float = 0.0,
             top_k: int = 0, seed: int = 0) -> str:
    """The prompt and its continuation after bos, up to max_new_tokens or eos (``generate_ids``)."""
    new = generate_ids(model, [tokenizer.bos_token_id] + tokenizer.encode(prompt), max_new_tokens, max_seq_len,
                       device, tokenizer.eos_token_id, temperature=temperature, top_k=top_k, seed=seed)
    return prompt + decode(tokenizer, new)


def plot_losses(train_loss, val_loss, path: Path, title: str, vocab_size: int):
    """Draw the train curve, the validation losses and the chance level ln ``vocab_size`` (the loss of a uniform
    guess over the tokenizer's vocabulary) into the PNG ``path``; the matplotlib Figure."""
    from matplotlib.figure import Figure  # not pyplot: no display, no global figure to close
    fig = Figure(figsize=(6.4, 4.4), layout="tight")
    ax = fig.subplots()
    if train_loss:
        ax.plot(*zip(*train_loss), label="train (mean over each update's micro-batches)")
    if val_loss:  # points: straight segments between far-apart evaluations would read as a generalization gap
        ax.plot(*zip(*val_loss), linestyle="none", marker="o", label="validation")
    ax.axhline(math.log(vocab_size), color="gray", linestyle="--",
               label=f"chance: ln {vocab_size} = {math.log(vocab_size):.2f}")
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=100)
    return fig


def repo_relative(path) -> str:
    """``path`` relative to the repository root when it lies inside it (a report card reads the same on every
    clone), else as given."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def tokenizer_name(tokenizer_path) -> str:
    """How a card or a banner names the tokenizer of ``--tokenizer_path`` (None: the built-in byte tokenizer)."""
    return repo_relative(tokenizer_path) if tokenizer_path else "the built-in byte tokenizer"


def write_report(path: Path, config: dict, metrics: dict, wall_seconds: float, samples: list[str],
                 title: str = "Pretraining run", trained_in: str = "train_one_epoch",
                 results: tuple[str, ...] = ()) -> None:
    """A markdown report card of the run: its configuration, wall time, tokens/s (in the ``trained_in``
    function), the ``results`` lines (the MFU's first), the losses at each evaluation, the loss figure (linked
    relative to ``path``) and the ``samples`` section's markdown lines."""
    train, val = dict(metrics["train_loss"]), dict(metrics["val_loss"])
    figure = os.path.relpath(metrics["figure"], path.parent)
    lines = [f"# {title}", "", "| setting | value |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in config.items()]
    lines += ["", f"wall time {wall_seconds:.1f} s; {metrics['tokens_per_second']:,.0f} tokens/s in {trained_in}",
              ""]
    lines += [line for result in results for line in (result, "")]
    lines += ["| update | train loss | val loss |", "| ---: | ---: | ---: |"]
    evaluated = sorted(set(val) | {update for update, _ in metrics["samples"]})
    lines += [f"| {update} | {_cell(train, update)} | {_cell(val, update)} |" for update in evaluated]
    lines += ["", f"![train and validation loss]({figure})", "", "## Samples", ""]
    lines += samples
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def evaluation_samples(metrics: dict) -> list[str]:
    """The pretrain card's samples: each evaluation's greedy one, and its drawn one (if any)."""
    drawn, lines = dict(metrics["drawn_samples"]), []
    for update, text in metrics["samples"]:
        lines.append(f"- update {update}, greedy: `{text}`")
        if update in drawn:
            lines.append(f"- update {update}, drawn: `{drawn[update]}`")
    return lines


def _cell(losses: dict, update: int) -> str:
    return f"{losses[update]:.4f}" if update in losses else ""


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


def log_updates(closed, plan: UpdatePlan, epoch: int, begin: int, log_interval: int, seconds: float,
                micro_steps: int) -> None:
    """MiniMind-style lines for the updates closed after micro-step ``begin``, where ``plan.log_due``; the loss
    is the update's mean over its micro-batches, not the last micro-batch's. ``left_in_epoch`` is upstream's
    ``epoch_time``, renamed for what it is: the minutes the epoch's remaining micro-steps should take at the
    pace of the ``micro_steps`` run in ``seconds``."""
    per_step = seconds / max(micro_steps, 1)
    previous = begin
    for r, loss, aux_loss in closed:
        if plan.log_due(previous, r["step"], log_interval):  # tqdm.write: beneath the epoch's bar, if still open
            tqdm.write(f"Epoch:[{epoch + 1}/{plan.epochs}]({r['step']}/{plan.iters}), loss: {loss:.4f}, "
                       f"logits_loss: {loss - aux_loss:.4f}, aux_loss: {aux_loss:.4f}, "
                       f"lr: {r['lr']:.8f}, left_in_epoch: {per_step * (plan.iters - r['step']) / 60:.1f}min",
                       file=sys.stdout)
        previous = r["step"]
