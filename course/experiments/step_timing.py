"""Timing a MiniMind training step (lesson 18): this machine's matmul peak, a training step to time (eager or
compiled), tokens/s and MFU, the compile break-even and the cost of a host sync. Shared by the lesson-18 labs,
the stage assembly's MFU, the prepared GPU script and the notebook.

Each function that measures takes the lesson-18 implementation as ``impl`` (the reference module, a student's
``impl/step_costs.py`` or a notebook's globals): tokens/s come from its ``ThroughputMeter``, FLOPs from its
``flops_per_token``, MFU from its ``mfu`` and the deferred loss from its ``RunningLoss``. Every time is a
measurement of this machine at this moment (a second process on the cores slows it); shapes, parameter counts,
token counts and FLOPs are exact.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from course.implementations import load_implementation
from course.minimind import TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig, MiniMindForCausalLM
from course.runs.peak_flops import peak_flops_of
from course.runs.threads import add_threads_argument, positive_integer

# The course's tiny model, and upstream's MiniMind2-Small shape (hidden 512, 8 layers, its FFN width
# 64 * ceil(8/3 * 512 / 64) = 1408; upstream's README calls it 26M): 26,879,488 parameters with the 6400-token
# vocabulary.
CONFIGS = {"tiny": dict(hidden_size=TINY_HIDDEN_SIZE, num_hidden_layers=TINY_NUM_HIDDEN_LAYERS),
           "26m": dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1408)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FIRST_TOKEN_ID = 3   # ids 0-2 are pad, bos and eos: a random batch draws from the others


def device_argument(text: str) -> str:
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu or cuda, got {text!r}")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("cuda: torch.cuda.is_available() is False on this machine")
    return text


def hidden_size_argument(text: str) -> int:
    value = positive_integer(text)
    if value % MiniMindConfig.num_attention_heads:
        raise argparse.ArgumentTypeError(f"must be a multiple of {MiniMindConfig.num_attention_heads} (the "
                                         f"attention heads), got {value}")
    return value


def non_negative_integer(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return int(text)


def seq_len_argument(text: str) -> int:
    value = positive_integer(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2 (a target needs a token before it), got {value}")
    return value


def add_step_arguments(parser: argparse.ArgumentParser, *, batch_size: int = 8, seq_len: int = 64,
                       model: bool = True) -> None:
    """The arguments of the training step a lesson-18 lab times: --threads, --device, --dtype, --batch_size,
    --seq_len and, with ``model``, --hidden_size and --num_hidden_layers (the tiny model's by default). A bad value
    ends the lab with one line naming its argument."""
    add_threads_argument(parser)
    parser.add_argument("--device", type=device_argument, default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="autocast dtype (float32: none)")
    parser.add_argument("--batch_size", type=positive_integer, default=batch_size)
    parser.add_argument("--seq_len", type=seq_len_argument, default=seq_len)
    if model:
        parser.add_argument("--hidden_size", type=hidden_size_argument, default=TINY_HIDDEN_SIZE)
        parser.add_argument("--num_hidden_layers", type=positive_integer, default=TINY_NUM_HIDDEN_LAYERS)


def step_shape(config: MiniMindConfig, args) -> str:
    """A lab's model and batch in words, for its figure's title: "hidden 48, 2 layers, batch 8 x 64, cpu"."""
    return (f"hidden {config.hidden_size}, {config.num_hidden_layers} layers, batch {args.batch_size} x "
            f"{args.seq_len}, {args.device}")


def lesson18_impl(args):
    """The lesson-18 module a lab measures with: ``--impl`` / ``--impl-dir``'s step_costs.py."""
    return load_implementation("step_costs.py", args.impl, args.impl_dir)


def exit_on_todo(run: Callable, impl):
    """``run()``; when one of ``impl``'s lesson-18 functions still raises its stub's NotImplementedError, a TODO
    line naming it on stderr and exit code 1 instead of a traceback (another NotImplementedError propagates)."""
    try:
        return run()
    except NotImplementedError as exc:
        if traceback.extract_tb(exc.__traceback__)[-1].filename != impl.__file__:
            raise
        print(f"TODO: {exc}\nthis lab measures with the lesson-18 functions of {impl.__file__}; write this one "
              f"(lesson 18 §5), or run the lab with --impl reference meanwhile.", file=sys.stderr)
        raise SystemExit(1) from None


def synchronizer(device) -> Optional[Callable[[], None]]:
    """What waits for the device's queued work before a clock read: torch.cuda.synchronize on CUDA; None on the
    CPU, whose kernels have finished when the call that launched them returns."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else None


def wait(device) -> None:
    sync = synchronizer(device)
    if sync is not None:
        sync()


class Peak(NamedTuple):
    flops_per_second: float
    source: str


def matmul_peak(device="cpu", dtype=torch.float32, sizes=(256, 512, 1024), seconds: float = 0.3) -> Peak:
    """The fastest square matmul of ``sizes`` on ``device`` in ``dtype`` (2 n^3 FLOPs each), the best of the calls
    that fit in about ``seconds`` shared by the sizes, at the current torch thread count: what this machine's
    matmuls reach, the denominator of a CPU's MFU (no datasheet gives a CPU's peak for torch's kernels and this
    thread count)."""
    best, best_size = 0.0, sizes[0]
    for n in sizes:
        generator = torch.Generator().manual_seed(n)
        a, b = (torch.randn(n, n, generator=generator).to(device, dtype) for _ in range(2))
        a @ b   # the first call allocates and picks a kernel
        deadline = time.perf_counter() + seconds / len(sizes)
        while True:
            wait(device)
            start = time.perf_counter()
            a @ b
            wait(device)
            rate = 2 * n ** 3 / max(time.perf_counter() - start, 1e-9)
            if rate > best:
                best, best_size = rate, n
            if time.perf_counter() > deadline:
                break
    threads = f", {torch.get_num_threads()} thread(s)" if torch.device(device).type == "cpu" else ""
    return Peak(best, f"measured: the fastest {best_size}x{best_size} {str(dtype).removeprefix('torch.')} matmul "
                      f"on {device}{threads}")


def device_peak(device="cpu", dtype=torch.float32, seconds: float = 0.3) -> Peak:
    """The peak an MFU divides by: a GPU's dense bf16 datasheet peak (course/runs/peak_flops.py) when the table
    knows it, else this machine's matmul peak measured for about ``seconds`` (a CPU always)."""
    if torch.device(device).type == "cuda":
        known = peak_flops_of(torch.cuda.get_device_name(device))
        if known is not None:
            return Peak(known.flops_per_second, f"{known.name} dense bf16 peak ({known.source})")
    return matmul_peak(device, dtype, seconds=seconds)


def compile_unavailable(device="cpu") -> Optional[str]:
    """Why ``torch.compile`` cannot build kernels for ``device`` here (one line), or None when it can: on a CPU its
    inductor backend writes C++ and needs a compiler, on CUDA it writes Triton kernels."""
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile skipped: inductor writes Triton kernels for CUDA and triton is not installed"
        return None
    from torch._inductor import config
    tried = [name for name in config.cpp.cxx if name]
    if not any(shutil.which(name) for name in tried):
        return (f"torch.compile skipped: on a CPU inductor compiles the graph to C++ and found no C++ compiler "
                f"(looked for {', '.join(tried)}); install one (Debian/Ubuntu: apt-get install g++) to measure it")
    return None


def parameter_count(model: torch.nn.Module) -> int:
    """Unique parameters: the tied embedding and lm_head once."""
    return sum(p.numel() for p in model.parameters())


def parameter_count_of(config: MiniMindConfig) -> int:
    """``parameter_count`` of a model of ``config``, built on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        return parameter_count(MiniMindForCausalLM(config))


@dataclass
class TrainingStep:
    """A model, its AdamW and one fixed batch of random token ids without padding; calling it runs one training
    step (forward under ``autocast_ctx``, backward, optimizer step, zero_grad) and returns the detached loss,
    still on the device (no host sync)."""
    model: torch.nn.Module   # what runs: the compiled wrapper when compiled
    config: MiniMindConfig
    optimizer: torch.optim.Optimizer
    input_ids: torch.Tensor
    autocast_ctx: object
    params: int

    @property
    def tokens(self) -> int:
        """Targets trained on per step: every position but each row's last, which predicts nothing."""
        batch, seq_len = self.input_ids.shape
        return batch * (seq_len - 1)

    def __call__(self) -> torch.Tensor:
        with self.autocast_ctx:
            out = self.model(self.input_ids, labels=self.input_ids)
            loss = out.loss + out.aux_loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def training_step(config: MiniMindConfig, *, batch_size: int, seq_len: int, device="cpu", dtype=torch.float32,
                  compiled: bool = False, seed: int = 0) -> TrainingStep:
    """A ``TrainingStep`` of a fresh model of ``config`` (seeded): fp32 weights, autocast to ``dtype`` unless it is
    float32, ``torch.compile`` around the model when ``compiled`` (compiling happens in its first call)."""
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(config).to(device)
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(FIRST_TOKEN_ID, config.vocab_size, (batch_size, seq_len), generator=generator)
    autocast_ctx = nullcontext() if dtype == torch.float32 else torch.autocast(torch.device(device).type, dtype)
    return TrainingStep(model=torch.compile(model) if compiled else model, config=config,
                        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), input_ids=input_ids.to(device),
                        autocast_ctx=autocast_ctx, params=parameter_count(model))


def step_seconds(step: Callable[[], object], steps: int, device="cpu") -> list[float]:
    """The wall seconds of each of ``steps`` calls of ``step``, the device synchronized before each clock read."""
    seconds = []
    for _ in range(steps):
        wait(device)
        start = time.perf_counter()
        step()
        wait(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def tokens_per_second(impl, step: TrainingStep, *, steps: int, warmup_steps: int, device="cpu") -> float:
    """Tokens/s of ``steps`` training steps after ``warmup_steps`` left out, by ``impl.ThroughputMeter``."""
    meter = impl.ThroughputMeter(warmup_steps=warmup_steps, window=steps, synchronize=synchronizer(device))
    for _ in range(warmup_steps + steps):
        step()
        meter.step(step.tokens)
    return meter.tokens_per_second()


@dataclass
class Speed:
    """One configuration's measured speed: tokens/s, and the MFU its FLOPs per token give against ``peak``."""
    label: str
    params: int
    flops_per_token: int     # training: forward + backward, at the step's sequence length
    tokens_per_second: float
    mfu: float
    tokens_per_step: int

    @property
    def seconds_per_step(self) -> float:
        return self.tokens_per_step / self.tokens_per_second


def measure_speed(impl, label: str, config: MiniMindConfig, *, batch_size: int, seq_len: int, peak: Peak,
                  device="cpu", dtype=torch.float32, compiled: bool = False, steps: int = 3,
                  warmup_steps: int = 2) -> Speed:
    """Train ``warmup_steps + steps`` steps of a fresh ``config`` model on one batch and measure its tokens/s
    (the warm-up, where a compiled model compiles, left out) and MFU against ``peak``."""
    step = training_step(config, batch_size=batch_size, seq_len=seq_len, device=device, dtype=dtype,
                         compiled=compiled)
    rate = tokens_per_second(impl, step, steps=steps, warmup_steps=warmup_steps, device=device)
    flops = impl.flops_per_token(config, seq_len, training=True)
    return Speed(label, step.params, flops, rate, impl.mfu(flops, rate, peak.flops_per_second), step.tokens)


def break_even_steps(first_compiled: float, compiled: float, eager: float) -> Optional[int]:
    """The fewest steps n after which a compiled run, whose first step (compiling) takes ``first_compiled``
    seconds and every later one ``compiled``, has spent no more time than n eager steps of ``eager`` seconds:
    first_compiled + (n - 1) * compiled <= n * eager. None when compiled steps are not faster (never)."""
    if compiled >= eager:
        return None
    n = max(1, -(-(first_compiled - compiled) // (eager - compiled)))   # ceil of a float division
    while first_compiled + (n - 1) * compiled > n * eager:   # the float ceil can land one short
        n += 1
    return int(n)


def item_seconds(device="cpu", calls: int = 2000) -> float:
    """Mean seconds of one ``.item()`` of a computed scalar with nothing else queued: the bare price of a copy to
    the host (on a GPU a device-to-host copy and a wait on an idle stream; on a CPU a function call)."""
    value = torch.ones((), device=device) * 2
    value.item()
    wait(device)
    start = time.perf_counter()
    for _ in range(calls):
        value.item()
    return (time.perf_counter() - start) / calls


def logging_seconds(impl, step: TrainingStep, *, steps: int, rounds: int = 3, device="cpu") -> dict[str, list[float]]:
    """Per-step seconds of ``steps`` training steps logged two ways, alternated ``rounds`` times after a warm-up
    round: ``loss.item()`` after every step (a host sync per step), and ``impl.RunningLoss`` (add per step, one
    pop_mean at the end: one sync). Each round is timed whole, so a GPU's queue may run ahead between syncs."""
    def every_step():
        for _ in range(steps):
            step().item()

    def running():
        losses = impl.RunningLoss()
        for _ in range(steps):
            losses.add(step())
        losses.pop_mean()

    ways = {"item_every_step": every_step, "running_loss": running}
    for run in ways.values():   # warm-up: the allocator and the kernels' first calls
        run()
    seconds = {name: [] for name in ways}
    for _ in range(rounds):
        for name, run in ways.items():
            wait(device)
            start = time.perf_counter()
            run()
            wait(device)
            seconds[name].append((time.perf_counter() - start) / steps)
    return seconds
