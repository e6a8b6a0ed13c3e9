"""The lesson-18 labs and benches on tiny inputs: what each prints and writes, checked against what torch itself
measures or counts (the profiler's matmuls against the model's Linear layers, FLOPs against FlopCounterMode, syncs
against the course's host-sync counter) and against the arithmetic of their own printed numbers. The times are
measurements: the tests check their consistency, never their values."""
from __future__ import annotations

import json
import random
import re
import sys
from contextlib import nullcontext

import pytest
import torch

from course.checks.framework import expect_equal
from course.checks.host_syncs import count_host_syncs
from course.experiments import step_timing
from course.implementations import REPO_ROOT, load_module
from course.minimind import MiniMindConfig, MiniMindForCausalLM
from course.reference import step_costs as reference
from course.runs.step_costs import counted_flops, measured_model, random_batch

sys.path.insert(0, str(REPO_ROOT / "labs"))   # as when a lab runs as a script: the GPU script imports the bench
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = ["--batch_size", "2", "--seq_len", "8"]
STUB = '''
def flops_per_token(config, seq_len, *, training=False):
    raise NotImplementedError("flops_per_token: TODO - see lesson 18 §5.1")
'''


def lab(name: str):
    return load_module(REPO_ROOT / "labs" / f"{name}.py", f"test_{name}")


def run(module, capsys, argv) -> str:
    expect_equal(f"{module.__name__} exit code", module.main(argv), 0)
    return capsys.readouterr().out


def number(text: str) -> float:
    return float(text.replace(",", ""))


def linear_layers(config: MiniMindConfig) -> list[torch.nn.Linear]:
    with torch.device("meta"):
        model = MiniMindForCausalLM(config)
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def parameters(config: MiniMindConfig) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in MiniMindForCausalLM(config).parameters())


def training_flops_per_position(config: MiniMindConfig, seq_len: int) -> float:
    """FlopCounterMode's count of one training step of the real model, per position of the batch."""
    return counted_flops(measured_model(config), *random_batch(config, 1, seq_len))[1] / seq_len


def expect_png(path) -> None:
    assert path.is_file() and path.read_bytes()[:8] == PNG_SIGNATURE, f"{path}: ACTUAL not a PNG, EXPECTED a figure"


def test_profile_lab_counts_three_matmuls_per_linear_and_writes_a_trace(tmp_path, capsys):
    """Hidden 16, 1 layer, batch 2 x 8: every Linear (q, k, v, o, the SwiGLU's three, the lm_head) runs one aten::mm
    forward and two backward (its input's and its weight's gradients); the profiler's matmul FLOPs are 2 x in x out
    per position for each, x 3; the Chrome trace holds the three phases and every one of those matmuls."""
    figure = tmp_path / "profile.png"
    out = run(lab("lesson18_profile_step"), capsys, ["--hidden_size", "16", "--num_hidden_layers", "1", *TINY,
                                                    "--out", str(figure)])
    config = MiniMindConfig(hidden_size=16, num_hidden_layers=1)
    layers = linear_layers(config)
    calls = int(re.search(r"^matmuls: aten::mm (\d+) calls", out, re.M)[1])
    expect_equal("aten::mm calls in one training step (ACTUAL the lab's) vs 3 per Linear layer of the model",
                 calls, 3 * len(layers))
    counted, formula, difference = map(number, re.search(
        r"matmul FLOPs the profiler counted: ([\d,]+); flops_per_token\(training\) x 16 positions = ([\d,]+); "
        r"the difference ([\d,]+) is", out).groups())
    expect_equal("profiler's matmul FLOPs vs 3 x 2 x in x out x 16 positions over the Linear layers",
                 counted, 3 * 2 * sum(m.in_features * m.out_features for m in layers) * 16)
    expect_equal("flops_per_token(training) x positions vs FlopCounterMode's count of the real model",
                 formula, training_flops_per_position(config, 8) * 16)
    expect_equal("the printed difference", difference, formula - counted)
    shares = [int(s) for s in re.findall(r"(?:forward|backward|optimizer\.step) [\d.]+ ms \((\d+)%\)", out)]
    assert len(shares) == 3 and abs(sum(shares) - 100) <= 2, f"phase shares ACTUAL {shares}, EXPECTED 3 summing to 100"
    trace = json.loads((tmp_path / "profile_trace.json").read_text(encoding="utf-8"))
    names = [event.get("name") for event in trace["traceEvents"]]
    missing = [phase for phase in ("forward", "backward", "optimizer.step") if phase not in names]
    expect_equal("phases missing from the trace", missing, [])
    expect_equal("aten::mm events in the trace", names.count("aten::mm"), calls)
    expect_png(figure)


def test_host_sync_lab_prints_its_medians_and_their_difference(tmp_path, capsys):
    figure = tmp_path / "sync.png"
    out = run(lab("lesson18_host_sync_cost"), capsys, ["--steps", "3", "--rounds", "2", *TINY, "--out", str(figure)])
    item = re.search(r"^one \.item\(\) of a computed scalar, nothing queued: ([\d.]+) µs", out, re.M)
    assert item and float(item[1]) > 0, out
    every = re.search(r"loss\.item\(\) every step +3 sync\(s\) per round: ([\d.]+) ms per step", out)
    running = re.search(r"RunningLoss, one pop_mean +1 sync\(s\) per round: ([\d.]+) ms per step", out)
    assert every and running, f"ACTUAL output lacks the two ways' lines:\n{out}"
    difference = float(re.search(r"a sync per step costs ([+-][\d.]+) ms per step", out)[1])
    expected = float(every[1]) - float(running[1])
    assert abs(difference - expected) <= 0.011, (
        f"difference ACTUAL {difference} ms, EXPECTED {expected:.3f} = the printed medians' (their 2 decimals)")
    expect_png(figure)


def test_logging_seconds_syncs_once_per_step_one_way_and_once_per_round_the_other():
    """Counted by the course's host-sync counter: a training step's own conversions (AdamW's step counters on the
    CPU) aside, the .item() way adds one per step and the RunningLoss way one per round (the warm-up round too)."""
    step = step_timing.training_step(MiniMindConfig(hidden_size=16, num_hidden_layers=1), batch_size=2, seq_len=8)
    step()
    bare = []
    with count_host_syncs(bare):
        step()
    syncs, steps, rounds = [], 3, 1
    with count_host_syncs(syncs):
        seconds = step_timing.logging_seconds(reference, step, steps=steps, rounds=rounds)
    expect_equal("measured rounds per way", {k: len(v) for k, v in seconds.items()},
                 {"item_every_step": rounds, "running_loss": rounds})
    logging = len(syncs) - (rounds + 1) * 2 * steps * len(bare)
    expect_equal("syncs of the logging itself over the warm-up and measured rounds", logging,
                 (rounds + 1) * (steps + 1))


def test_compile_lab_without_a_compiler_says_why_in_one_line(tmp_path, capsys, monkeypatch):
    from torch._inductor import config
    monkeypatch.setattr(config.cpp, "cxx", (None, "no-such-compiler-l18"))
    out = run(lab("lesson18_compile_break_even"), capsys, ["--hidden_size", "16", "--num_hidden_layers", "1", *TINY,
                                                          "--steps", "3", "--out", str(tmp_path / "c.png")])
    lines = out.splitlines()
    assert re.fullmatch(r"eager: first step [\d.]+ ms, steady [\d.]+ ms per step \(median of 2, measured\)",
                        lines[1]), out
    expect_equal("the skip line", lines[2],
                 "torch.compile skipped: on a CPU inductor compiles the graph to C++ and found no C++ compiler "
                 "(looked for no-such-compiler-l18); install one (Debian/Ubuntu: apt-get install g++) to measure it")
    expect_equal("lines printed", len(lines), 3)


def test_break_even_is_the_first_step_where_the_compiled_run_catches_up():
    """Against a brute-force count of the steps, over random times, and the two edges."""
    rng = random.Random(18)
    for _ in range(300):
        eager = rng.uniform(0.01, 1.0)
        compiled = eager * rng.uniform(0.3, 0.999)
        first = compiled + rng.uniform(0.0, 50.0)
        n = 1
        while first + (n - 1) * compiled > n * eager:
            n += 1
        expect_equal(f"break-even of first={first!r}, compiled={compiled!r}, eager={eager!r}",
                     step_timing.break_even_steps(first, compiled, eager), n)
    expect_equal("compiled steps as slow as eager ones", step_timing.break_even_steps(5.0, 0.2, 0.2), None)
    expect_equal("a first step no slower than an eager one", step_timing.break_even_steps(0.1, 0.05, 0.2), 1)


def test_compile_lab_figure_draws_the_measured_steps_and_the_crossing(tmp_path):
    figure = tmp_path / "c.png"
    lab("lesson18_compile_break_even").plot([0.1, 0.05, 0.05], [2.0, 0.04, 0.04], 196, "title", figure)
    expect_png(figure)


def check_speed_row(row: str, config: MiniMindConfig, seq_len: int, peak_flops: float, peak_digits: float) -> None:
    """A printed (parameters, FLOPs/token, ms/step, tokens/s, MFU) row: parameters of the real model,
    FlopCounterMode's FLOPs, and an MFU that is FLOPs x tokens/s / peak to the printed digits."""
    params, flops, ms, rate, mfu = row
    expect_equal("parameters", params, parameters(config))
    expect_equal("training FLOPs per token vs FlopCounterMode's per position", flops,
                 training_flops_per_position(config, seq_len))
    expected = 100 * flops * rate / peak_flops
    assert abs(mfu - expected) <= 0.05 + (peak_digits + 1e-4) * expected, (
        f"MFU ACTUAL {mfu}%, EXPECTED {expected:.3f}% = {flops:,.0f} x {rate:,.0f} tokens/s / {peak_flops:.4g}")
    assert ms > 0 and rate > 0, row


def test_mfu_vs_size_lab_rows_are_the_real_models(tmp_path, capsys):
    figure = tmp_path / "size.png"
    out = run(lab("lesson18_mfu_vs_size"), capsys, ["--hidden_sizes", "16", "32", "--num_hidden_layers", "1", *TINY,
                                                   "--steps", "2", "--warmup_steps", "1", "--out", str(figure)])
    peak = number(re.search(r"^peak: ([\d,.]+) GFLOP/s \(measured: the fastest \d+x\d+ float32 matmul on cpu, "
                            r"\d+ thread\(s\)\)$", out, re.M)[1]) * 1e9
    sizes = re.findall(r"^ +(\d+) +([\d,]+) +([\d,]+)$", out, re.M)
    measured = re.findall(r"^  hidden (\d+): ([\d.]+) ms/step, ([\d,]+) tokens/s, MFU ([\d.]+)%$", out, re.M)
    expect_equal("hidden sizes of the exact and of the measured rows", ([int(r[0]) for r in sizes],
                 [int(r[0]) for r in measured]), ([16, 32], [16, 32]))
    for (hidden, params, flops), (_, *speed) in zip(sizes, measured):
        check_speed_row([number(v) for v in (params, flops, *speed)],
                        MiniMindConfig(hidden_size=int(hidden), num_hidden_layers=1), 8, peak, 0.05 / (peak / 1e9))
    expect_png(figure)


def test_mfu_bench_eager_row_and_the_26m_config(capsys, monkeypatch):
    """The tiny model's eager row; compiling turned off by a missing compiler says so and leaves only eager rows;
    the ~26 M config has the parameters the bench's docstring states."""
    from torch._inductor import config
    monkeypatch.setattr(config.cpp, "cxx", (None, "no-such-compiler-l18"))
    bench = lab("bench_lesson18_mfu")
    out = run(bench, capsys, ["--configs", "tiny", *TINY, "--steps", "1", "--warmup_steps", "1"])
    peak = number(re.search(r"^peak: ([\d.]+) TFLOP/s", out, re.M)[1]) * 1e12
    assert "torch.compile skipped: on a CPU inductor compiles the graph to C++" in out, out
    rows = re.findall(r"^ *(\w+) +(\w+): +([\d,]+) parameters, +([\d,]+) training FLOPs/token, +([\d.]+) ms/step, "
                      r"+([\d,]+) tokens/s, MFU ([\d.]+)%$", out, re.M)
    expect_equal("(config, mode) rows", [r[:2] for r in rows], [("tiny", "eager")])
    check_speed_row([number(v) for v in rows[0][2:]], MiniMindConfig(**step_timing.CONFIGS["tiny"]), 8, peak,
                    0.0005 / (peak / 1e12))
    shown = f"{parameters(MiniMindConfig(**step_timing.CONFIGS['26m'])) / 1e6:.1f} M parameters"
    assert shown in bench.__doc__, f"the bench's docstring should state the 26m config's {shown}"


def test_a_lab_on_a_stub_says_todo_and_exits_1(tmp_path, capsys):
    (tmp_path / "step_costs.py").write_text(STUB, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        lab("lesson18_profile_step").main(["--impl", "student", "--impl-dir", str(tmp_path), *TINY,
                                           "--out", str(tmp_path / "p.png")])
    err = capsys.readouterr().err
    expect_equal("exit code", exit_info.value.code, 1)
    assert err.startswith("TODO: flops_per_token: TODO - see lesson 18 §5.1\n") and "--impl reference" in err, err


def test_exit_on_todo_lets_other_not_implemented_errors_through():
    def raises():
        raise NotImplementedError("not a stub of the implementation")
    with pytest.raises(NotImplementedError, match="not a stub"):
        step_timing.exit_on_todo(raises, reference)


def test_gpu_script_cpu_side_writes_every_number(tmp_path, capsys):
    out_file = tmp_path / "gpu.json"
    run(load_module(REPO_ROOT / "labs" / "bench_lesson18_gpu.py", "test_bench_gpu"), capsys,
        ["--device", "cpu", "--skip-tests", "--quick", "--out", str(out_file)])
    results = json.loads(out_file.read_text(encoding="utf-8"))
    expect_equal("keys", sorted(results), ["batch", "date", "device", "dtype", "item_cost", "loop_overhead", "mfu",
                                          "torch"])
    expect_equal("(torch, dtype)", (results["torch"], results["dtype"]), (torch.__version__, "float32"))
    expect_equal("MFU rows (quick: the tiny config, eager)", [(r["config"], r["mode"]) for r in results["mfu"]],
                 [("tiny", "eager")])
    overhead = results["loop_overhead"]["seconds_per_micro_step"]
    expect_equal("ratio of medians", results["loop_overhead"]["ratio_reference_to_bare"],
                 overhead["reference"][0] / overhead["bare"][0])
    expect_equal("item-cost rows", [row["config"] for row in results["item_cost"]], ["tiny"])


def test_the_bare_loop_makes_the_reference_loops_updates():
    """Same model, same batches, K = 2 over 4 micro-steps: lesson 14's reference train_one_epoch and the GPU script's
    bare loop end with bitwise equal weights, so their times compare the same work."""
    gpu = load_module(REPO_ROOT / "labs" / "bench_lesson18_gpu.py", "test_bench_gpu_bare")
    from course.reference import train_loop
    config, weights = MiniMindConfig(hidden_size=16, num_hidden_layers=1), []
    batches = [random_batch(config, 2, 8, seed=seed) for seed in range(4)]
    for loop in ("reference", "bare"):
        model = measured_model(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if loop == "reference":
            train_loop.train_one_epoch(model, batches, optimizer, device="cpu", epoch=0, epochs=1, iters=4,
                                       base_lr=1e-3, accumulation_steps=2, grad_clip=1.0)
        else:
            gpu.bare_epoch(model, batches, optimizer, nullcontext(), accumulation_steps=2, grad_clip=1.0,
                           base_lr=1e-3)
        weights.append(model.state_dict())
    unequal = [name for name in weights[0] if not torch.equal(weights[0][name], weights[1][name])]
    expect_equal("weights that differ after the reference loop and the bare loop", unequal, [])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_profile_lab_on_cuda_traces_kernels(tmp_path, capsys):
    run(lab("lesson18_profile_step"), capsys, ["--device", "cuda", "--dtype", "bfloat16", *TINY,
                                              "--out", str(tmp_path / "p.png")])
    trace = json.loads((tmp_path / "p_trace.json").read_text(encoding="utf-8"))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels, "ACTUAL no CUDA kernel in the trace, EXPECTED the step's kernels"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_host_sync_lab_on_cuda(tmp_path, capsys):
    out = run(lab("lesson18_host_sync_cost"), capsys, ["--device", "cuda", "--steps", "5", "--rounds", "2", *TINY,
                                                      "--out", str(tmp_path / "s.png")])
    assert "a sync per step costs" in out, out


BAD_ARGUMENTS = [("lesson18_profile_step", ["--hidden_size", "12"], "--hidden_size"),
                 ("lesson18_profile_step", ["--seq_len", "1"], "--seq_len"),
                 ("lesson18_host_sync_cost", ["--steps", "0"], "--steps"),
                 ("lesson18_compile_break_even", ["--steps", "2"], "--steps"),
                 ("lesson18_mfu_vs_size", ["--warmup_steps", "-1"], "--warmup_steps"),
                 ("lesson18_mfu_vs_size", ["--hidden_sizes", "32", "20"], "--hidden_sizes"),
                 ("bench_lesson18_mfu", ["--batch_size", "0"], "--batch_size"),
                 ("bench_lesson18_mfu", ["--configs", "huge"], "--configs")]
if not torch.cuda.is_available():
    BAD_ARGUMENTS += [("lesson18_host_sync_cost", ["--device", "cuda"], "--device"),
                      ("bench_lesson18_gpu", [], "--device")]   # its default device is cuda


@pytest.mark.parametrize("name,argv,flag", BAD_ARGUMENTS, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_a_bad_argument_exits_2_naming_it(capsys, name, argv, flag):
    with pytest.raises(SystemExit) as exit_info:
        lab(name).main(argv)
    err = capsys.readouterr().err
    expect_equal(f"{name} {argv}: exit code", exit_info.value.code, 2)
    assert f"error: argument {flag}" in err or f"error: {flag}" in err, f"the error must name {flag}:\n{err}"
