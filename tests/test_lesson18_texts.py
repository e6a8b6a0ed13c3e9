"""The numbers lesson 18's answers claim, each measured by the instrument the lesson names (FlopCounterMode on the
real model, the tensors' nbytes after a real AdamW step, saved_tensors_hooks, the fake device), not by the
reference's formulas, and each standing in the English and the Chinese answers as the measurement gives it.
"""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile
from torch.utils.flop_counter import FlopCounterMode

from course.checks import LESSONS
from course.experiments.step_timing import CONFIGS, training_step
from course.lesson_texts import section_text
from course.minimind import TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig, MiniMindForCausalLM
from course.reference.step_costs import ThroughputMeter
from course.runs.fake_device import FakeDevice
from course.runs.peak_flops import PEAK_FLOPS
from course.runs.step_costs import measured_model, random_batch, saved_activation_bytes, training_state_nbytes

TINY = dict(hidden_size=TINY_HIDDEN_SIZE, num_hidden_layers=TINY_NUM_HIDDEN_LAYERS)
BATCH = 2
ANSWERS = {language: LESSONS["18"].files()[f"answers ({language})"] for language in ("en", "zh")}


def claim(section: str, text: str, chinese: str | None = None) -> None:
    """``text`` stands in answers section ``section`` of the English text, ``chinese`` (default: the same text, a
    number or formula) in the Chinese one; line breaks read as spaces."""
    for language, path in ANSWERS.items():
        body = section_text(path, section)
        assert body is not None, f"{path}: no section {section}"
        expected = text if language == "en" or chinese is None else chinese
        assert " ".join(expected.split()) in " ".join(body.split()), (
            f"{path.name} ({language}) §{section} should say {expected!r}, what the measurement gives (a changed "
            f"model or a stale text)")


def percent(value: float) -> str:
    return f"{value * 100:.0f} %"


def counts(fields: dict, seq_len: int) -> dict:
    """FlopCounterMode's per-token counts of one training step of the real model (attention on the math backend):
    the forward and backward in all, the lm_head's, and the parameters."""
    config = MiniMindConfig(**fields)
    model = measured_model(config)
    input_ids, labels = random_batch(config, BATCH, seq_len)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        output = model(input_ids, labels=labels)
        (output.loss + output.aux_loss).backward()
    tokens = BATCH * seq_len
    per_module = counter.get_flop_counts()
    assert counter.get_total_flops() % tokens == 0, "a count that is not a whole number of FLOPs per token"
    in_matmuls = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return {"training": counter.get_total_flops() // tokens,
            "lm_head": sum(per_module["MiniMindForCausalLM.lm_head"].values()) // tokens,
            "params": sum(p.numel() for p in model.parameters()),
            "outside_matmuls": sum(p.numel() for p in model.parameters()) - in_matmuls}   # tied: the table is lm_head's


@pytest.fixture(scope="module")
def tiny():
    return {seq_len: counts(TINY, seq_len) for seq_len in (64, 128)}


def test_flops_of_the_tiny_model(tiny):
    at_64, at_128 = tiny[64], tiny[128]
    six_n = 6 * at_64["params"]
    attention = at_128["training"] - at_64["training"]   # the only term that grows with T: 12 L d T at T = 64
    claim("4.1", f"{at_64['training']:,}")
    claim("4.1", f"$6N$ = {six_n:,}")
    claim("4.1", f"{at_64['training'] - six_n:,}")
    assert at_64["training"] == 2_331_648, at_64
    claim("4.1", f"$12 L d T$ = {attention:,}")
    claim("4.1", f"$6 \\times {at_64['outside_matmuls']} = {6 * at_64['outside_matmuls']}$")
    assert at_64["training"] - six_n == attention - 6 * at_64["outside_matmuls"]
    share = percent(at_64["lm_head"] / at_64["training"])
    claim("4.1", f"$6dV$ = {at_64['lm_head']:,}")
    claim("4.1", share)
    claim("1.1", f"{at_64['lm_head']:,}")
    claim("1.1", share)
    claim("4.1", f"{2 * attention:,}")
    claim("4.1", f"{at_128['training']:,}")
    claim("4.1", f"+{(at_128['training'] / at_64['training'] - 1) * 100:.1f} %")


def test_flops_of_the_untied_and_moe_models(tiny):
    base = tiny[64]
    untied = counts({**TINY, "tie_word_embeddings": False}, 64)
    moe = counts({**TINY, "use_moe": True}, 64)
    assert untied["training"] == base["training"], "the second table is a lookup: no FLOP"
    for number in (f"$Vd$ = {untied['params'] - base['params']:,}", f"{untied['params']:,}",
                   f"{6 * (untied['params'] - base['params']):,}", f"{6 * untied['params']:,}",
                   percent(6 * untied["params"] / untied["training"] - 1),
                   f"{moe['params'] - base['params']:,}", f"{moe['params']:,}",
                   f"{moe['training'] - base['training']:,}", f"{moe['training']:,}"):
        claim("4.1", number)


def test_the_fake_device_rates():
    rates = {}
    for synchronized in (False, True):
        device = FakeDevice()
        meter = ThroughputMeter(warmup_steps=1, window=5, clock=device.clock,
                                synchronize=device.synchronize if synchronized else None)
        for _ in range(8):
            device.launch(0.010, launch_seconds=0.001)
            meter.step(1000)
        rates[synchronized] = meter.tokens_per_second()
    claim("4.1", f"{rates[False]:,.0f} tokens/s")
    claim("4.1", f"{rates[True]:,.0f} tokens/s")
    assert rates[False] == pytest.approx(11 * rates[True]), "a synchronized step: its launch, then its device time"


def test_the_training_state_of_the_tiny_model():
    config = MiniMindConfig(**TINY)
    measured = {}
    for name, optimizer, autocast in (("adamw", torch.optim.AdamW, None), ("sgd", torch.optim.SGD, None),
                                      ("adamw under bf16 autocast", torch.optim.AdamW, torch.bfloat16)):
        model = measured_model(config)
        measured[name] = training_state_nbytes(model, optimizer(model.parameters(), lr=1e-3),
                                               *random_batch(config, BATCH, 16), autocast_dtype=autocast)
    params = sum(p.numel() for p in measured_model(config).parameters())
    tensors = len(list(measured_model(config).parameters()))
    adamw = measured["adamw"]
    step_bytes = adamw["optimizer"] - 2 * adamw["weights"]
    assert step_bytes == 4 * tensors, "AdamW's step: a float32 scalar per parameter tensor"
    assert (sum(adamw.values()) - step_bytes) / params == 16
    claim("4.1", "16")
    assert sum(measured["sgd"].values()) / params == 8 and measured["sgd"]["optimizer"] == 0
    assert measured["adamw under bf16 autocast"] == adamw, "autocast changes none of the three"
    claim("1.4", f"The tiny model: {adamw['weights']:,} bytes of weights, as many of gradients, "
                 f"{adamw['optimizer']:,} of AdamW state (its {tensors} parameter tensors add {step_bytes} bytes "
                 f"of `step`)", f"小模型：权重 {adamw['weights']:,} 字节，梯度同样多，AdamW 状态 "
                 f"{adamw['optimizer']:,} 字节（它的 {tensors} 个参数张量加上 {step_bytes} 字节的 `step`）")


def test_the_activations_of_the_tiny_model():
    def saved(fields, seq_len):
        config = MiniMindConfig(**fields)
        return sum(saved_activation_bytes(measured_model(config), *random_batch(config, BATCH, seq_len)).values())

    at_64, at_128 = saved(TINY, 64), saved(TINY, 128)
    one_layer = saved({**TINY, "num_hidden_layers": 1}, 64)
    per_layer_and_token = (at_64 - one_layer) / (BATCH * 64)
    vocab = MiniMindConfig(**TINY).vocab_size
    for number in (f"{at_64:,}", f"{at_128:,}", f"{at_128 / at_64:.2f}", f"{4 * vocab:,}",
                   f"{per_layer_and_token / 1000:.1f} kB"):
        claim("1.5", number)
    assert 4 * vocab > 2 * per_layer_and_token, "the log-probabilities are no longer the largest saved tensor"
    claim("4.1", f"({at_128 / at_64:.2f})", f"（{at_128 / at_64:.2f}）")


def test_a_linear_layer_under_autocast_saves_a_bf16_copy_of_its_weight():
    linear, x = torch.nn.Linear(8, 4), torch.randn(3, 8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            linear(x)
    assert {(t.dtype, tuple(t.shape)) for t in saved} == {(torch.bfloat16, (3, 8)), (torch.bfloat16, (8, 4))}, saved
    claim("1.4", "saves its bf16 input and a bf16 copy of its weight", "保存它的 bf16 输入和它权重的一份 bf16 副本")


def test_the_peaks_the_answers_name():
    for name in ("NVIDIA H100 SXM", "NVIDIA H100 PCIe"):
        claim("5.3", f"`PEAK_FLOPS[\"{name}\"]`")
        claim("5.3", f"{PEAK_FLOPS[name].flops_per_second / 1e12:g}")


def test_a_tiny_step_runs_over_two_thousand_aten_calls():
    step = training_step(MiniMindConfig(**CONFIGS["tiny"]), batch_size=8, seq_len=64)
    step()   # the first step allocates: profile the second, as the lab does
    with profile() as prof:
        step()
    calls = sum(event.count for event in prof.key_averages() if event.key.startswith("aten::"))
    assert 2000 < calls < 3000, calls
    claim("1.7", "One step runs over two thousand aten calls (nested ones included)", "一步执行两千多次 aten 调用（包括嵌套的）")
