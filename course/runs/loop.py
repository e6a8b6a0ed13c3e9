"""Tiny, deterministic training runs on the oracle and on an implementation under test.

A ``LoopScenario`` fixes everything a run depends on (model size, data, K, epochs, resume point,
precision, an injected gradient overflow). ``run_oracle`` drives ``course.minimind``'s upstream-faithful
``train_epoch`` (cached: its result is a pure function of the scenario, the code and torch);
``run_impl`` drives an implementation's ``train_one_epoch`` on identical inputs, so the two results
can be compared record by record and parameter by parameter.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import os
import random
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import numpy as np
import torch

from course.minimind import (TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig,
                             MiniMindForCausalLM, PretrainDataset, setup_seed)
from course.minimind.train_pretrain import train_epoch as oracle_train_epoch

from .eager import eager
from .kernels import kernel_family


@dataclass(frozen=True)
class LoopScenario:
    name: str
    use_moe: bool = False
    accumulation_steps: int = 4
    epochs: int = 2
    iters: int = 6                  # micro-batches per epoch
    batch_size: int = 2
    max_length: int = 32
    hidden_size: int = TINY_HIDDEN_SIZE
    num_hidden_layers: int = TINY_NUM_HIDDEN_LAYERS
    start_epoch: int = 0
    start_step: int = 0             # micro-steps of start_epoch already done (resume)
    base_lr: float = 5e-4
    grad_clip: float = 1.0
    autocast_dtype: Optional[str] = None    # "bfloat16" or "float16"
    scaler_enabled: bool = False
    overflow_at_backward: Optional[int] = None  # 1-based backward call that gets an inf gradient
    growth_interval: int = 2000     # GradScaler: updates without inf/NaN before the scale doubles (torch's
                                    # default; a small one lets the scale grow in a tiny run)
    loader_length: Optional[int] = None     # batches per epoch when the data runs out early (default: all left)
    two_param_groups: bool = False  # AdamW over two param groups (decay / no decay), see optimizer_param_groups
    device: str = "cpu"

    def with_(self, **changes) -> "LoopScenario":
        return replace(self, **changes)


@dataclass
class RunResult:
    records: list[dict]
    params: dict[str, torch.Tensor]
    optimizer_state: dict[str, dict[str, torch.Tensor]]
    scale: Optional[float]


def tiny_model(scenario: LoopScenario) -> MiniMindForCausalLM:
    """A freshly initialised model seeded with 42, as upstream builds one: the same weights on every call, and
    every RNG left where building it leaves them. A copy of the first build of each size (initialising costs
    ~10 times as much as copying, and the checks build hundreds)."""
    pristine, rng_after_init = _first_build(scenario.hidden_size, scenario.num_hidden_layers, scenario.use_moe)
    random.seed(42)
    np.random.seed(42)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(42)
    torch.set_rng_state(rng_after_init)   # setup_seed(42), then the init's draws from the CPU generator
    return _copied(pristine, {}).to(scenario.device)


def _copied(module: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """What copy.deepcopy(module) returns, 4 times faster (the checks copy hundreds of models): every module,
    parameter and buffer a new object (shared ones shared once, like the tied lm_head), containers copied,
    other objects (the config) deep-copied. The pristine builds hold no gradients and no hooks."""
    if id(module) in memo:
        return memo[id(module)]
    copied = memo[id(module)] = module.__class__.__new__(module.__class__)
    state = {}
    for key, value in module.__dict__.items():
        if key == "_modules":
            value = {name: None if child is None else _copied(child, memo) for name, child in value.items()}
        elif key in ("_parameters", "_buffers"):
            value = {name: None if tensor is None else _copied_tensor(tensor, memo) for name, tensor in value.items()}
        elif isinstance(value, (dict, set, list)):   # hooks, the non-persistent buffers' names
            value = type(value)(value)
        elif not isinstance(value, (bool, int, float, str, type(None))):
            value = copy.deepcopy(value, memo)
        state[key] = value
    copied.__dict__.update(state)
    return copied


def _copied_tensor(tensor: torch.Tensor, memo: dict) -> torch.Tensor:
    if id(tensor) not in memo:
        data = tensor.detach().clone()
        memo[id(tensor)] = (torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
                            if isinstance(tensor, torch.nn.Parameter) else data)
    return memo[id(tensor)]


@functools.lru_cache(maxsize=None)
def _first_build(hidden_size: int, num_hidden_layers: int, use_moe: bool) -> tuple[MiniMindForCausalLM, torch.Tensor]:
    setup_seed(42)
    config = MiniMindConfig(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, use_moe=use_moe)
    return MiniMindForCausalLM(config), torch.get_rng_state()


@functools.lru_cache(maxsize=8)
def tiny_batches(batch_size: int, max_length: int, count: int, seed: int) -> tuple:
    """``count`` micro-batches drawn in a fixed shuffled order from the built-in corpus."""
    dataset = PretrainDataset(TINY_CORPUS, max_length=max_length)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    needed = count * batch_size
    order = (order * (needed // len(order) + 1))[:needed]
    batches = []
    for b in range(count):
        items = [dataset[i] for i in order[b * batch_size:(b + 1) * batch_size]]
        batches.append((torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])))
    return tuple(batches)


def full_epoch_batches(scenario: LoopScenario, epoch: int) -> tuple:
    """All ``iters`` micro-batches of ``epoch``, in that epoch's order (seed 42 + epoch, like upstream)."""
    return tiny_batches(scenario.batch_size, scenario.max_length, scenario.iters, seed=42 + epoch)


def epoch_batches(scenario: LoopScenario, epoch: int) -> list:
    """What the loop sees in ``epoch``: the full epoch minus the batches a resume already trained, cut to
    ``loader_length`` batches when the scenario's data runs out early."""
    batches = full_epoch_batches(scenario, epoch)
    skip = scenario.start_step if epoch == scenario.start_epoch else 0
    return list(batches[skip:])[:scenario.loader_length]


@dataclass
class TrainingObjects:
    """Everything a run trains with; ``autocast_ctx`` is entered around each forward pass."""
    model: MiniMindForCausalLM
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast_ctx: object


def training_objects(scenario: LoopScenario) -> TrainingObjects:
    """A seeded tiny model, AdamW, a GradScaler and the autocast context of ``scenario`` (with the
    injected overflow hook when the scenario asks for one)."""
    model = tiny_model(scenario)
    optimizer = eager(torch.optim.AdamW)(optimizer_param_groups(model, scenario), lr=scenario.base_lr)
    device_type = torch.device(scenario.device).type
    scaler = torch.amp.GradScaler(device_type, enabled=scenario.scaler_enabled,
                                  growth_interval=scenario.growth_interval)
    autocast_ctx = (torch.autocast(device_type, dtype=getattr(torch, scenario.autocast_dtype))
                    if scenario.autocast_dtype else nullcontext())
    if scenario.overflow_at_backward is not None:
        inject_overflow(model, scenario.overflow_at_backward)
    return TrainingObjects(model, optimizer, scaler, autocast_ctx)


def optimizer_param_groups(model: MiniMindForCausalLM, scenario: LoopScenario):
    """``model.parameters()`` (upstream's one group), or with ``two_param_groups`` two groups as a decay / no-decay
    split makes them: every other parameter each, weight decay 0.1 and 0.0 (a rule that reads one group only shows
    in the other)."""
    if not scenario.two_param_groups:
        return model.parameters()
    params = list(model.parameters())
    return [{"params": params[::2], "weight_decay": 0.1}, {"params": params[1::2], "weight_decay": 0.0}]


def inject_overflow(model: MiniMindForCausalLM, at_backward: int):
    """An inf in the final norm's gradient on the ``at_backward``-th (1-based) backward through ``model``;
    returns the hook's handle."""
    calls = {"n": 0}

    def add_inf(grad):
        calls["n"] += 1
        return grad + float("inf") if calls["n"] == at_backward else grad
    return model.model.norm.weight.register_hook(add_inf)


def run_result(objects: TrainingObjects, records: list[dict]) -> RunResult:
    """Records plus detached copies of the parameters, AdamW state and GradScaler scale."""
    model, optimizer, scaler = objects.model, objects.optimizer, objects.scaler
    names = {id(p): n for n, p in model.named_parameters()}
    opt_state = {names[id(p)]: {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v)
                                for k, v in st.items()}
                 for p, st in optimizer.state.items()}
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return RunResult(records, params, opt_state, scaler.get_scale() if scaler.is_enabled() else None)


def _plain(value):
    return float(value) if torch.is_tensor(value) else value


def run_oracle_epoch(scenario: LoopScenario, objects: TrainingObjects, epoch: int, loader, start_step: int,
                     save_checkpoint=None, save_interval: int = 10 ** 9) -> list[dict]:
    """One call of the oracle's ``train_epoch`` on ``objects``; returns its trace records tagged with
    ``epoch``. ``save_checkpoint(epoch, step)`` runs where upstream saves."""
    args = SimpleNamespace(device=scenario.device, epochs=scenario.epochs, learning_rate=scenario.base_lr,
                           accumulation_steps=scenario.accumulation_steps, grad_clip=scenario.grad_clip,
                           log_interval=10 ** 9, save_interval=save_interval)
    trace = []
    # Upstream logs at step == iters; silence it here, tests compare the trace instead.
    with contextlib.redirect_stdout(io.StringIO()):
        oracle_train_epoch(epoch, loader, scenario.iters, start_step, model=objects.model,
                           optimizer=objects.optimizer, scaler=objects.scaler, autocast_ctx=objects.autocast_ctx, args=args,
                           save_checkpoint=save_checkpoint, trace=trace)
    return [dict({k: _plain(v) for k, v in r.items()}, epoch=epoch) for r in trace]


def compute_oracle(scenario: LoopScenario) -> RunResult:
    """The oracle's run of ``scenario``, computed now."""
    objects = training_objects(scenario)
    records = []
    for epoch in range(scenario.start_epoch, scenario.epochs):
        start = scenario.start_step if epoch == scenario.start_epoch else 0
        records += run_oracle_epoch(scenario, objects, epoch, epoch_batches(scenario, epoch), start)
    return run_result(objects, records)


# Everything an oracle run's bits depend on besides the scenario: the code, the data, torch, the CPU kernel
# family and the thread count (each splits reductions its own way).
ORACLE_INPUTS = (sorted((Path(__file__).parents[1] / "minimind").glob("*.py"))
                 + [Path(__file__), Path(__file__).with_name("eager.py"), TINY_CORPUS])


@functools.lru_cache(maxsize=1)
def _inputs_digest() -> str:
    digest = hashlib.sha256(f"torch {torch.__version__}".encode())
    for path in ORACLE_INPUTS:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def oracle_cache_path(scenario: LoopScenario) -> Optional[Path]:
    """Where ``run_oracle`` keeps ``scenario``'s CPU run between processes, or None (no disk cache).

    ``MINIMIND_COURSE_CACHE`` names the folder (default ``~/.cache/minimind-course``); ``off`` disables it.
    Entries live in a subfolder named after the code, data and torch version that computed them, and are
    named after the scenario, the CPU kernel family and the thread count in use: a run read back under another
    family or count would differ from a fresh one in its last bits (course/runs/kernels.py).
    """
    folder = os.environ.get("MINIMIND_COURSE_CACHE", str(Path.home() / ".cache" / "minimind-course"))
    if folder == "off" or torch.device(scenario.device).type != "cpu":
        return None
    key = f"{scenario!r} threads {torch.get_num_threads()} kernels {kernel_family()}"
    entry = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(folder) / f"oracle-{_inputs_digest()}" / f"{entry}.pt"


def _save_cache_entry(path: Path, result: RunResult) -> None:
    """Write atomically; entries of other code versions are removed (they can never be read again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.parent.glob("oracle-*"):
        if stale != path.parent:
            shutil.rmtree(stale, ignore_errors=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as handle:
        torch.save(_packed(result), handle)
    os.replace(tmp_name, path)


def _packed(result: RunResult) -> dict:
    """``result`` with every tensor in one flat buffer: one storage loads much faster than hundreds."""
    tensors = [("params", name, "", t) for name, t in result.params.items()]
    tensors += [("optimizer_state", name, key, t) for name, state in result.optimizer_state.items()
                for key, t in state.items()]
    wide = functools.reduce(torch.promote_types, (t.dtype for *_, t in tensors))   # holds every value exactly
    return {"records": result.records, "scale": result.scale,
            "index": [(kind, name, key, tuple(t.shape), str(t.dtype)) for kind, name, key, t in tensors],
            "flat": torch.cat([t.reshape(-1).to(wide) for *_, t in tensors])}


def _unpacked(packed: dict) -> RunResult:
    params, optimizer_state, offset = {}, {}, 0
    for kind, name, key, shape, dtype in packed["index"]:
        size = int(torch.Size(shape).numel())
        value = packed["flat"][offset:offset + size].reshape(shape).to(getattr(torch, dtype.split(".")[1]))
        offset += size
        if kind == "params":
            params[name] = value
        else:
            optimizer_state.setdefault(name, {})[key] = value
    return RunResult(packed["records"], params, optimizer_state, packed["scale"])


def run_oracle(scenario: LoopScenario) -> RunResult:
    """``compute_oracle``, cached in memory and on disk: graders run the same scenarios again and again.

    Both caches are keyed by the thread count in use (CPU results depend on it, and a process may change it
    between two runs); the disk entry also by the CPU kernel family (fixed for a process). A file that cannot be
    read is recomputed; a cache folder that cannot be written is skipped.
    """
    return oracle_run_at(scenario, torch.get_num_threads())


@functools.lru_cache(maxsize=32)
def oracle_run_at(scenario: LoopScenario, threads: int) -> RunResult:
    path = oracle_cache_path(scenario)
    if path is not None and path.is_file():
        try:
            return _unpacked(torch.load(path, map_location="cpu", weights_only=True))
        except Exception:  # a damaged or foreign entry: compute it again
            pass
    result = compute_oracle(scenario)
    if path is not None:
        try:
            _save_cache_entry(path, result)
        except OSError:   # a read-only or full cache folder: grade without it
            pass
    return result


def run_impl(train_one_epoch, scenario: LoopScenario) -> RunResult:
    objects = training_objects(scenario)
    records = []
    for epoch in range(scenario.start_epoch, scenario.epochs):
        start = scenario.start_step if epoch == scenario.start_epoch else 0
        out = train_one_epoch(objects.model, epoch_batches(scenario, epoch), objects.optimizer, device=scenario.device,
                              epoch=epoch, epochs=scenario.epochs, iters=scenario.iters,
                              base_lr=scenario.base_lr, accumulation_steps=scenario.accumulation_steps,
                              grad_clip=scenario.grad_clip, scaler=objects.scaler, autocast_ctx=objects.autocast_ctx,
                              start_step=start)
        if not isinstance(out, list):
            raise TypeError(f"train_one_epoch must return a list of dicts, got {type(out).__name__}")
        records += [dict(r, epoch=epoch) for r in out]
    return run_result(objects, records)
