"""The oracle and the reference loop against numbers produced by the REAL upstream MiniMind code.

``tests/fixtures/upstream/minimind_d65ef2c.pt`` was written by ``tests/fixtures/upstream/make_fixture.py``
(its docstring says how to regenerate it) from upstream commit d65ef2c: ``get_lr``, the dense and MoE
``MiniMindForCausalLM`` at a tiny config, and upstream's own ``train_epoch``. These tests only read the
fixture: no MiniMind checkout, no ``transformers``.

Tolerances, and why they are not zero. On the machine that generated the fixture, with one CPU thread,
everything here is bitwise equal to upstream except one dense training run (3.7e-9): our ``FeedForward``
registers ``up_proj`` before ``down_proj`` (upstream: ``down_proj`` first), so ``clip_grad_norm_`` sums
the per-parameter norms in another order and the clip coefficient differs in its last bit. Elsewhere
(another CPU, another thread count) kernels split their reductions differently: with two threads the
MoE logits moved 1.2e-7 and the MoE final parameters 4.5e-6, because AdamW's ``m / (sqrt(v) + eps)``
amplifies last-bit gradient changes on small entries. The tolerances below cover that with margin and
stay far below a real difference: the old MoE, which skipped the top-1 routing normalization, was off
by 3.4e-2 in logits, 1.4e-3 in loss, 3.2e-4 in router gradients and 1.3e-3 to 1.5e-3 in final parameters.
The tests run with one thread, like the generator, to stay as close to its arithmetic as possible.
"""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import pytest
import torch

from course.checks.framework import CheckFailure, expect_close, expect_equal, expect_tensor_close, expect_tensors_close
from course.minimind import MiniMindConfig, MiniMindForCausalLM
from course.minimind.trainer_utils import get_lr
from course.reference.train_loop import cosine_lr, train_one_epoch
from course.runs.eager import eager
from course.runs.loop import LoopScenario, TrainingObjects, run_oracle_epoch

FIXTURE = Path(__file__).parent / "fixtures" / "upstream" / "minimind_d65ef2c.pt"
MODELS = ("dense", "moe")
# Absolute tolerances (module docstring: measured differences and the old MoE's errors).
LOGITS_ATOL = 1e-5          # logits of magnitude ~1
LOSS_ATOL = 1e-6            # cross entropy ~5.6
AUX_ATOL = 1e-9             # aux ~1e-3: relative 1e-6
ROUTER_GRAD_ATOL = 1e-8     # router gradients ~1e-4
PARAMS_ATOL = 2e-5          # after 2 epochs of AdamW updates of size ~lr = 5e-4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The generator ran with one thread; reductions then split the same way here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@contextlib.contextmanager
def hint(text: str):
    """Append the likely cause to a failed comparison's ACTUAL/EXPECTED message."""
    try:
        yield
    except CheckFailure as exc:
        raise CheckFailure(f"{exc}\n  hint: {text}") from None


@functools.cache
def fixture() -> dict:
    return torch.load(FIXTURE, map_location="cpu", weights_only=True)


def upstream_model(name: str) -> MiniMindForCausalLM:
    """The oracle model with upstream's initial state_dict, loaded strictly (same names and shapes)."""
    entry = fixture()["models"][name]
    model = MiniMindForCausalLM(MiniMindConfig(**entry["config"]))
    model.load_state_dict(entry["init_state"], strict=True)
    return model


def test_fixture_is_small_and_pinned():
    size = FIXTURE.stat().st_size
    assert size <= 2_000_000, f"{FIXTURE.name} is {size:,} bytes; keep it <= 2 MB (make_fixture.py's tiny config)"
    expect_equal("fixture's upstream commit", fixture()["commit"], "d65ef2c00ebc6082f9df11541e1b191655eddb00")


def test_config_defaults_match_upstream():
    """Every field both configs have resolves the same (intermediate sizes included) for the same kwargs."""
    for kwargs, upstream in fixture()["default_configs"]:
        ours = MiniMindConfig(**kwargs)
        for field, expected in upstream.items():
            expect_equal(f"MiniMindConfig(**{kwargs}).{field}", getattr(ours, field), expected)


def test_get_lr_matches_upstream_table():
    """Same expression as upstream: bitwise for the oracle's get_lr and the reference cosine_lr."""
    table = fixture()["get_lr"]
    for step, total, expected in table["table"]:
        expect_equal(f"get_lr({step}, {total}, {table['base_lr']})", get_lr(step, total, table["base_lr"]), expected)
        expect_equal(f"cosine_lr({step}, {total}, {table['base_lr']})", cosine_lr(step, total, table["base_lr"]),
                     expected)


@pytest.mark.parametrize("name", MODELS)
def test_forward_matches_upstream(name):
    expected = fixture()["models"][name]["forward"]
    batch = fixture()["batch"]
    model = upstream_model(name).train()   # training mode: upstream computes aux_loss only when training
    out = model(batch["input_ids"], labels=batch["labels"])
    expect_tensor_close(f"{name} logits", out.logits, expected["logits"], rtol=0, atol=LOGITS_ATOL)
    expect_close(f"{name} loss", out.loss.item(), expected["loss"].item(), rtol=0, atol=LOSS_ATOL)
    with hint("MoE: top-1 routing weights must be normalized (norm_topk_prob) like upstream's"):
        expect_close(f"{name} aux_loss", out.aux_loss.item(), expected["aux_loss"].item(), rtol=0, atol=AUX_ATOL)


def test_moe_router_gradient_matches_upstream():
    """With top-1 and norm_topk_prob every routing weight is exactly 1.0: the router's gradient is the aux
    loss's alone. A model that skips the normalization for k == 1 also sends it the LM loss's gradient."""
    expected = fixture()["models"]["moe"]["forward"]
    batch = fixture()["batch"]
    model = upstream_model("moe").train()
    out = model(batch["input_ids"], labels=batch["labels"])
    (out.loss + out.aux_loss).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    with hint("the top-1 routing weight must be exactly 1.0: normalize the top-k weights for any k"):
        expect_tensors_close("router gradients", grads, expected["router_grads"], rtol=0, atol=ROUTER_GRAD_ATOL)


def test_moe_unused_expert_gets_zero_not_none_gradients():
    entry = fixture()["models"]["moe"]
    expected = entry["unused_expert_forward"]
    input_ids, labels = entry["unused_expert_batch"]
    assert any(0 in counts for counts in expected["expert_token_counts"]), "the fixture batch must leave an expert unused"
    model = upstream_model("moe").train()
    out = model(input_ids, labels=labels)
    expect_tensor_close("logits (batch with an unused expert)", out.logits, expected["logits"], rtol=0,
                        atol=LOGITS_ATOL)
    (out.loss + out.aux_loss).backward()
    params = dict(model.named_parameters())
    with hint("an expert that gets no token must join the graph with a zero-valued term"):
        expect_equal("parameters whose grad is None", sorted(n for n, p in params.items() if p.grad is None),
                     expected["grad_none"])
    expect_equal("parameters whose grad is all zero",
                 sorted(n for n, p in params.items() if p.grad is not None and not p.grad.any()), expected["grad_zero"])


def run_cases():
    return [(name, index) for name in MODELS for index in range(len(fixture()["models"][name]["runs"]))]


def epoch_loader(epoch: int, skip: int) -> list:
    """The micro-batches upstream's train_epoch saw in ``epoch`` (a resume skips the first ``skip``)."""
    train = fixture()["train"]
    return list(zip(train["input_ids"][epoch], train["labels"][epoch]))[skip:]


def expect_final_params(label: str, model, run: dict) -> None:
    params = {n: p.detach() for n, p in model.named_parameters()}
    expect_equal(f"{label}: parameter names", sorted(params), sorted(run["final_params"]))
    expect_tensors_close(label, params, run["final_params"], rtol=0, atol=PARAMS_ATOL)


@pytest.mark.parametrize("name,index", run_cases())
def test_oracle_loop_reproduces_upstream_train_epoch(name, index):
    """course.minimind.train_pretrain.train_epoch, driven by course/runs/loop.py's run_oracle_epoch."""
    train, run = fixture()["train"], fixture()["models"][name]["runs"][index]
    scenario = LoopScenario(run["name"], accumulation_steps=run["accumulation_steps"], epochs=train["epochs"],
                            iters=train["iters"], start_step=run["start_step"], base_lr=train["learning_rate"],
                            grad_clip=train["grad_clip"])
    model = upstream_model(name)
    objects = TrainingObjects(model, eager(torch.optim.AdamW)(model.parameters(), lr=scenario.base_lr),
                              torch.amp.GradScaler("cpu", enabled=False), torch.autocast("cpu", enabled=False))
    for epoch in range(scenario.epochs):
        start = scenario.start_step if epoch == 0 else 0
        run_oracle_epoch(scenario, objects, epoch, epoch_loader(epoch, start), start)
    expect_final_params(f"oracle loop, {name}, {run['name']}", model, run)


@pytest.mark.parametrize("name,index", run_cases())
def test_reference_loop_reproduces_upstream_train_epoch(name, index):
    """course/reference/train_loop.py's train_one_epoch, called per epoch like upstream's __main__."""
    train, run = fixture()["train"], fixture()["models"][name]["runs"][index]
    model = upstream_model(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train["learning_rate"])
    for epoch in range(train["epochs"]):
        start = run["start_step"] if epoch == 0 else 0
        train_one_epoch(model, epoch_loader(epoch, start), optimizer, device="cpu", epoch=epoch,
                        epochs=train["epochs"], iters=train["iters"], base_lr=train["learning_rate"],
                        accumulation_steps=run["accumulation_steps"], grad_clip=train["grad_clip"],
                        start_step=start)
    expect_final_params(f"reference loop, {name}, {run['name']}", model, run)
