"""The lesson-14 trace lab: precision fields under fp32, CPU autocast bf16 and fp16 + GradScaler, the
three implementations it can trace, and its argument checks.

The expected dtypes are asked of torch itself (a Linear and a cross-entropy under the same autocast),
not written down, so the tests follow torch's autocast policy rather than a copy of it.
"""
from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from course.implementations import REPO_ROOT, load_implementation, load_module

LAB = load_module(REPO_ROOT / "labs" / "lesson14_trace_pretrain_step.py", "trace_lab")
SMALL = ["--batch_size", "2", "--max_length", "16", "--hidden_size", "32", "--num_hidden_layers", "1"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STUB = '''
def cosine_lr(current_step, total_steps, base_lr):
    raise NotImplementedError("cosine_lr: TODO - see lesson 14 §5.1 (aligns with get_lr)")


def scale_loss_for_accumulation(loss, accumulation_steps):
    raise NotImplementedError("scale_loss_for_accumulation: TODO - see lesson 14 §5.2")


def should_step_optimizer(step, accumulation_steps):
    raise NotImplementedError("should_step_optimizer: TODO - see lesson 14 §5.3")


def should_flush_tail(last_step, start_step, accumulation_steps):
    raise NotImplementedError("should_flush_tail: TODO - see lesson 14 §5.4")
'''


def run_lab(capsys, args) -> str:
    LAB.main(args)
    return capsys.readouterr().out


def fields(output: str) -> dict:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line and " " not in line.split("=")[0])


def torch_says(device: str, dtype: str) -> dict:
    """What torch gives a Linear's output, a cross-entropy of it and the Linear's weight.grad under the
    autocast the lab uses for ``dtype`` (none for float32)."""
    layer = torch.nn.Linear(4, 4).to(device)
    ctx = nullcontext() if dtype == "float32" else torch.autocast(device, dtype=DTYPES[dtype])
    with ctx:
        logits = layer(torch.randn(2, 4, device=device))
        loss = F.cross_entropy(logits.float(), torch.tensor([0, 1], device=device))
    loss.backward()
    return {"logits.dtype": str(logits.dtype), "loss.dtype": str(loss.dtype),
            "param.grad.dtype": str(layer.weight.grad.dtype)}


def check_precision_fields(output: str, device: str, dtype: str) -> None:
    printed = fields(output)
    for name, expected in torch_says(device, dtype).items():
        assert printed.get(name) == expected, (
            f"--dtype {dtype}: {name}\n  ACTUAL:   {printed.get(name)}\n"
            f"  EXPECTED: {expected} (what torch gives under the same autocast)")
    scaler = torch.amp.GradScaler(device, enabled=dtype == "float16")  # upstream's rule: fp16 only
    expected_scale = str(scaler.get_scale())
    suffix = "" if scaler.is_enabled() else " (disabled)"
    for name in ("scaler.scale_before", "scaler.scale_after"):  # one clean step is far from growth_interval
        assert printed.get(name) == expected_scale + suffix, (
            f"--dtype {dtype}: {name}\n  ACTUAL:   {printed.get(name)}\n  EXPECTED: {expected_scale + suffix}")
    expected_inf = "0.0" if scaler.is_enabled() else "None (disabled: unscale_ checks no gradient)"
    assert printed.get("found_inf") == expected_inf, (
        f"--dtype {dtype}: found_inf\n  ACTUAL:   {printed.get('found_inf')}\n  EXPECTED: {expected_inf}")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_precision_fields_on_cpu(capsys, dtype):
    output = run_lab(capsys, SMALL + ["--dtype", dtype, "--impl", "reference"])
    check_precision_fields(output, "cpu", dtype)
    for name in ("logits.shape", "loss", "aux_loss", "lr", "grad_norm_before_clip", "max_first_param_delta_after_step"):
        assert name in fields(output), f"--dtype {dtype}: today's field {name}= is missing:\n{output}"


def test_the_float32_default_is_the_unchanged_fp32_trace(capsys):
    """No autocast and a disabled scaler are pass-throughs: --dtype float32 prints the trace without it."""
    default = run_lab(capsys, SMALL)
    explicit = run_lab(capsys, SMALL + ["--dtype", "float32", "--device", "cpu", "--impl", "oracle"])
    assert default == explicit, f"ACTUAL (explicit flags):\n{explicit}\nEXPECTED (defaults):\n{default}"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reference_traces_exactly_like_the_oracle(capsys, dtype):
    """Same kernels, same order: the reference's lesson-14 functions reproduce the oracle's trace character
    for character (K=3 over 5 micro-steps: accumulate, step, tail flush)."""
    args = SMALL + ["--dtype", dtype, "--accumulation_steps", "3", "--micro_steps", "5"]
    oracle = run_lab(capsys, args + ["--impl", "oracle"])
    reference = run_lab(capsys, args + ["--impl", "reference"])
    assert reference == oracle, f"ACTUAL (reference):\n{reference}\nEXPECTED (oracle):\n{oracle}"
    scaled = "scale=" in oracle
    assert scaled == (dtype == "float16"), f"--dtype {dtype}: scaler fields printed={scaled}, expected only for fp16"


def test_a_student_stub_gives_a_todo_and_exit_1(capsys, tmp_path):
    (tmp_path / "train_loop.py").write_text(STUB, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        LAB.main(SMALL + ["--impl", "student", "--impl-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1, f"ACTUAL exit: {exit_info.value.code}\nEXPECTED exit: 1\n{err}"
    assert "TODO" in err and "cosine_lr" in err and "lesson 14" in err, err


def test_untouched_impl_gives_a_todo(capsys):
    try:
        load_implementation("train_loop.py", "student").cosine_lr(1, 2, 1.0)
    except NotImplementedError:
        pass
    else:
        pytest.skip("impl/train_loop.py::cosine_lr is filled in")
    with pytest.raises(SystemExit) as exit_info:
        LAB.main(SMALL + ["--impl", "student"])
    assert exit_info.value.code == 1
    assert "TODO" in capsys.readouterr().err


BAD_ARGS = [(["--device", "tpu"], "--device"), (["--dtype", "half"], "--dtype"), (["--impl", "mine"], "--impl"),
            (["--impl-dir", "."], "--impl-dir"), (["--impl", "student", "--impl-dir", "nowhere"], "--impl-dir"),
            (["--grad_clip", "0"], "--grad_clip"), (["--learning_rate", "nan"], "--learning_rate"),
            (["--micro_steps", "0"], "--micro_steps")]
if not torch.cuda.is_available():
    BAD_ARGS.append((["--device", "cuda"], "--device"))


@pytest.mark.parametrize("args,name", BAD_ARGS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_arguments_exit_2_naming_the_argument(capsys, args, name):
    with pytest.raises(SystemExit) as exit_info:
        LAB.main(SMALL + args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, f"{args}: ACTUAL exit {exit_info.value.code}, EXPECTED 2\n{err}"
    assert f"error: argument {name}" in err or f"error: {name}" in err, f"{args}: the error must name {name}:\n{err}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_precision_fields_on_cuda(capsys, dtype):
    output = run_lab(capsys, SMALL + ["--device", "cuda", "--dtype", dtype, "--impl", "reference"])
    check_precision_fields(output, "cuda", dtype)
