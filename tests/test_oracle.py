"""The oracle itself: model naming and semantics, tokenizer, dataset, get_lr, and the reference
solution matching the oracle loop BITWISE on CPU fp32 (and under bf16 autocast / GradScaler, where
both run the very same ops in the same order)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from course.checks.framework import expect_close, expect_equal
from course.implementations import load_implementation
from course.minimind import (ByteTokenizer, MiniMindConfig, MiniMindForCausalLM, PretrainDataset, TINY_CORPUS,
                             get_lr, read_jsonl_texts, setup_seed)
from course.runs import compute_oracle, run_impl, run_oracle
from course.runs.kernels import available_families
from course.runs.loop import oracle_cache_path, oracle_run_at
from course.runs.scenarios import LOOP_AMP_SCENARIOS, LOOP_FP32_SCENARIOS

TINY = dict(hidden_size=64, num_hidden_layers=2)


def upstream_names(layers: int, moe: bool) -> dict[str, tuple]:
    """Parameter names and shapes of upstream MiniMind (hidden 64, 8 heads, 4 kv heads, head_dim 8)."""
    names = {"model.embed_tokens.weight": (6400, 64), "model.norm.weight": (64,), "lm_head.weight": (6400, 64)}
    ffn = {"gate_proj.weight": (256, 64), "up_proj.weight": (256, 64), "down_proj.weight": (64, 256)}
    for i in range(layers):
        p = f"model.layers.{i}."
        names.update({p + "self_attn.q_proj.weight": (64, 64), p + "self_attn.k_proj.weight": (32, 64),
                      p + "self_attn.v_proj.weight": (32, 64), p + "self_attn.o_proj.weight": (64, 64),
                      p + "self_attn.q_norm.weight": (8,), p + "self_attn.k_norm.weight": (8,),
                      p + "input_layernorm.weight": (64,), p + "post_attention_layernorm.weight": (64,)})
        if moe:
            names[p + "mlp.gate.weight"] = (4, 64)
            for j in range(4):
                names.update({f"{p}mlp.experts.{j}.{k}": v for k, v in ffn.items()})
        else:
            names.update({f"{p}mlp.{k}": v for k, v in ffn.items()})
    return names


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_state_dict_names_and_shapes_follow_upstream(moe):
    model = MiniMindForCausalLM(MiniMindConfig(**TINY, use_moe=moe))
    actual = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expect_equal("state_dict keys and shapes", actual, upstream_names(2, moe))
    # strict=True loading of an upstream-shaped state dict (what a real checkpoint looks like)
    fresh = MiniMindForCausalLM(MiniMindConfig(**TINY, use_moe=moe))
    fresh.load_state_dict({k: torch.zeros(s) for k, s in upstream_names(2, moe).items()}, strict=True)
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr(), "lm_head must stay tied"


def test_default_config_matches_upstream_size():
    config = MiniMindConfig()
    expect_equal("intermediate_size for hidden 768", config.intermediate_size, 2432)
    expect_equal("intermediate_size for hidden 64", MiniMindConfig(**TINY).intermediate_size, 256)
    expect_equal("moe_intermediate_size defaults to intermediate_size (upstream)",
                 MiniMindConfig(intermediate_size=96).moe_intermediate_size, 96)
    with torch.device("meta"):
        params = sum(p.numel() for p in MiniMindForCausalLM(config).parameters())
    expect_close("dense default parameter count (upstream: about 63.9M)", params / 1e6, 63.9, rtol=0, atol=0.05)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="num_key_value_heads"):
        MiniMindConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=3)
    with pytest.raises(ValueError, match="hidden_size"):
        MiniMindConfig(hidden_size=0)
    for field in ("intermediate_size", "moe_intermediate_size"):
        with pytest.raises(ValueError, match=field):
            MiniMindConfig(**{field: 0})


def test_init_is_normal_002_and_norms_are_one():
    setup_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=256, num_hidden_layers=2))
    std = model.model.layers[0].mlp.gate_proj.weight.std().item()
    expect_close("std of a Linear weight at init", std, 0.02, rtol=0.05)
    assert torch.all(model.model.norm.weight == 1), "RMSNorm weights must start at 1"


def test_loss_is_mean_over_valid_shifted_targets():
    setup_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(**TINY))
    input_ids = torch.randint(3, 200, (2, 10))
    labels = input_ids.clone()
    labels[0, 6:] = -100
    labels[1, :3] = -100
    out = model(input_ids, labels=labels)
    logp = F.log_softmax(out.logits.double(), dim=-1)[:, :-1]
    targets = labels[:, 1:]
    valid = targets != -100
    nll = -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    expected = (nll * valid).sum() / valid.sum()
    expect_close("loss vs hand-computed masked mean NLL", out.loss.item(), expected.item(), rtol=1e-5)
    expect_equal("logits shape", tuple(out.logits.shape), (2, 10, 6400))


def test_attention_is_causal():
    setup_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(**TINY)).eval()
    ids = torch.randint(3, 200, (1, 12))
    changed = ids.clone()
    changed[0, 8] = 5
    a, b = model(ids).logits, model(changed).logits
    assert torch.equal(a[0, :8], b[0, :8]), "logits before position 8 changed when token 8 changed"
    assert not torch.equal(a[0, 8:], b[0, 8:]), "logits from position 8 on should depend on token 8"


def test_aux_loss_is_zero_for_dense_and_positive_for_moe_training():
    ids = torch.randint(3, 200, (2, 16))
    dense = MiniMindForCausalLM(MiniMindConfig(**TINY))(ids)
    moe_model = MiniMindForCausalLM(MiniMindConfig(**TINY, use_moe=True))
    expect_equal("dense aux_loss", dense.aux_loss.item(), 0.0)
    aux = moe_model(ids).aux_loss.item()
    assert 0 < aux < 1e-2, f"MoE aux_loss in training should be small and positive, got {aux}"
    expect_equal("MoE aux_loss in eval mode", moe_model.eval()(ids).aux_loss.item(), 0.0)


def test_tokenizer_special_ids_and_round_trip():
    tok = ByteTokenizer()
    expect_equal("(pad, bos, eos)", (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id), (0, 1, 2))
    text = "Gradient accumulation 梯度累积 ✓"
    ids = tok.encode(text)
    assert min(ids) >= 3 and max(ids) < tok.vocab_size, f"ids outside [3, {tok.vocab_size}): {ids}"
    expect_equal("decode(encode(text))", tok.decode(ids), text)
    expect_equal("truncation to max_length", len(tok(text, max_length=5, truncation=True).input_ids), 5)


def test_dataset_wraps_pads_and_masks_like_upstream():
    texts = read_jsonl_texts(TINY_CORPUS)
    dataset = PretrainDataset(TINY_CORPUS, max_length=64)
    short = min(range(len(texts)), key=lambda i: len(texts[i].encode()))
    input_ids, labels = dataset[short]
    n = len(texts[short].encode("utf-8"))
    expect_equal("first id (bos)", int(input_ids[0]), 1)
    expect_equal("id after the text (eos)", int(input_ids[n + 1]), 2)
    expect_equal("pad ids after eos", input_ids[n + 2:].unique().tolist(), [0])
    expect_equal("labels at pad positions", labels[n + 2:].unique().tolist(), [-100])
    expect_equal("labels elsewhere equal input_ids", labels[:n + 2].tolist(), input_ids[:n + 2].tolist())
    longest = max(range(len(texts)), key=lambda i: len(texts[i].encode()))
    long_ids, _ = dataset[longest]
    expect_equal("a long text is cut to max_length - 2 tokens plus bos/eos",
                 (len(long_ids), int(long_ids[0]), int(long_ids[-1])), (64, 1, 2))


def test_corpus_has_both_languages():
    texts = read_jsonl_texts(TINY_CORPUS)
    chinese = sum(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in texts)
    assert len(texts) >= 100 and 0.3 < chinese / len(texts) < 0.7, (len(texts), chinese)


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        PretrainDataset(path, max_length=16)
    path.write_text(json.dumps({"txt": "wrong key"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: expected an object with a string \"text\""):
        PretrainDataset(path, max_length=16)
    with pytest.raises(ValueError, match="max_length"):
        PretrainDataset(TINY_CORPUS, max_length=2)


def test_get_lr_matches_upstream_reference_values():
    """Values of upstream's formula lr * (0.1 + 0.45 * (1 + cos(pi * s / T))), worked by hand (5 significant digits);
    lesson 14 §1.2's table shows those of s = 0, 5, 10, 15, 20."""
    for step, total, ratio in [(0, 20, 1.0), (1, 20, 0.99446), (5, 20, 0.86820), (10, 20, 0.55), (15, 20, 0.23180),
                               (20, 20, 0.1)]:
        expect_close(f"get_lr({step}, {total}, 1.0)", get_lr(step, total, 1.0), ratio, rtol=1e-5)


REFERENCE = load_implementation("train_loop.py", "reference")


@pytest.mark.parametrize("scenario", LOOP_FP32_SCENARIOS + LOOP_AMP_SCENARIOS, ids=lambda s: s.name)
def test_reference_matches_oracle_bitwise(scenario):
    """Same ops in the same order: every record, parameter and AdamW tensor is bit-identical."""
    ref, oracle = run_impl(REFERENCE.train_one_epoch, scenario), run_oracle(scenario)
    strip = [{k: r[k] for k in oracle.records[0]} for r in ref.records]
    expect_equal("records", strip, oracle.records)
    expect_equal("GradScaler scale", ref.scale, oracle.scale)
    for name, value in oracle.params.items():
        assert torch.equal(ref.params[name], value), (
            f"{name}: max |diff| = {(ref.params[name] - value).abs().max().item():.3e}, expected bitwise equality")
    for name, state in oracle.optimizer_state.items():
        for key, value in state.items():
            assert torch.equal(ref.optimizer_state[name][key], value), f"AdamW {key} of {name} differs"


def test_growth_scenario_grows_the_scale_then_backs_off():
    """The growth_interval=1 scenario really grows the scale: without the overflow both updates double it
    (2**16 -> 2**18); with it, update 2 doubles it and the overflowed tail flush halves it back."""
    scenario = next(s for s in LOOP_AMP_SCENARIOS if s.growth_interval == 1)
    expect_equal("scale after two clean updates (growth_interval=1)",
                 run_oracle(scenario.with_(overflow_at_backward=None)).scale, 2.0 ** 18)
    hit = run_oracle(scenario)
    expect_equal("scale after a grown update and an overflowed tail flush", hit.scale, 2.0 ** 16)
    expect_equal("micro-steps skipped", [r["step"] for r in hit.records if r["overflow_skipped"]], [3])


def test_short_loader_scenarios_end_before_iters():
    """Scenarios with loader_length run exactly that many micro-steps, fewer than iters - start_step."""
    for scenario in (s for s in LOOP_FP32_SCENARIOS if s.loader_length is not None):
        records = run_oracle(scenario).records
        expect_equal(f"[{scenario.name}] micro-steps run", len(records), scenario.loader_length)
        assert scenario.loader_length < scenario.iters - scenario.start_step


def test_injected_overflow_skips_the_step_and_halves_the_scale():
    """The GradScaler scenario really exercises the scaler: an inf gradient in micro-step 2 (window 1-4, K=4)
    makes the update at micro-step 4 skip, the scale drops from 2**16 to 2**15, and the tail flush at
    micro-step 6 steps again."""
    scenario = next(s for s in LOOP_AMP_SCENARIOS if s.overflow_at_backward)
    clean = run_oracle(scenario.with_(overflow_at_backward=None))
    hit = run_oracle(scenario)
    expect_equal("scale without overflow (init 2**16, growth only after 2000 good steps)", clean.scale, 2.0 ** 16)
    expect_equal("scale after one overflow (backoff 0.5)", hit.scale, 2.0 ** 15)
    steps = {name: float(state["step"]) for name, state in hit.optimizer_state.items()}
    closed = sum(r["update_closed"] for r in hit.records)
    expect_equal("AdamW step count of every parameter (one update skipped)", set(steps.values()), {closed - 1.0})
    expect_equal("(epoch, step) of the records marked overflow_skipped",
                 [(r["epoch"], r["step"]) for r in hit.records if r["overflow_skipped"]], [(0, 4)])
    expect_equal("records marked overflow_skipped without an overflow",
                 [r for r in clean.records if r["overflow_skipped"]], [])
    overflow_record = next(r for r in hit.records if r["step"] == 4 and r["epoch"] == 0)
    expect_equal("(update_closed, grad norm) reported at the skipped update",
                 (overflow_record["update_closed"], overflow_record["grad_norm"]), (True, float("inf")))
    expect_equal("(update_closed, overflow_skipped) of the tail flush after the skip",
                 (hit.records[-1]["update_closed"], hit.records[-1]["overflow_skipped"]), (True, False))


def test_oracle_runs_are_cached_on_disk_bitwise(tmp_path, monkeypatch):
    """run_oracle keeps CPU runs in MINIMIND_COURSE_CACHE: a later process gets the very same bits; another
    thread count is another entry; a damaged entry is recomputed; ``off`` keeps nothing."""
    monkeypatch.setenv("MINIMIND_COURSE_CACHE", str(tmp_path))
    scenario = LOOP_FP32_SCENARIOS[0].with_(name="disk cache test", epochs=1)
    def uncached(scenario):   # the disk layer without the in-process memo
        return oracle_run_at.__wrapped__(scenario, torch.get_num_threads())

    first = uncached(scenario)
    path = oracle_cache_path(scenario)
    assert path.is_file() and path.parent.parent == tmp_path, f"no cache entry at {path}"
    stale = tmp_path / "oracle-from-older-code"
    stale.mkdir()
    again = uncached(scenario)
    fresh = compute_oracle(scenario)
    for name, value in fresh.params.items():
        assert torch.equal(again.params[name], value) and torch.equal(first.params[name], value), name
    expect_equal("records read back from the cache", again.records, fresh.records)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads != 1 else 2)
    try:
        assert oracle_cache_path(scenario) != path, "a run with another thread count must not share the entry"
    finally:
        torch.set_num_threads(threads)
    path.write_bytes(b"not a checkpoint")
    expect_equal("records after a damaged entry", uncached(scenario).records, fresh.records)
    assert not stale.exists(), "writing an entry removes the entries of other code versions"
    monkeypatch.setenv("MINIMIND_COURSE_CACHE", "off")
    assert oracle_cache_path(scenario) is None


# Run in a process of its own (the kernel family is fixed when torch loads): the oracle run of the scenario
# through the disk cache, and a fresh one, saved with the entry's path.
CACHE_UNDER_A_FAMILY = """
import sys, torch
from course.runs import compute_oracle
from course.runs.loop import oracle_cache_path, run_oracle
from course.runs.scenarios import LOOP_FP32_SCENARIOS
scenario = LOOP_FP32_SCENARIOS[0].with_(name="kernel family cache test", epochs=1)
torch.save({"cached": run_oracle(scenario).params, "fresh": compute_oracle(scenario).params,
            "path": str(oracle_cache_path(scenario))}, sys.argv[1])
"""


def test_an_entry_filled_under_one_kernel_family_is_not_read_under_another(tmp_path):
    """The cache filled by a process on this CPU's own kernels (avx2 here) and then read by one on the default
    kernels (ATEN_CPU_CAPABILITY=default, the rounding of a CPU without AVX2): the second must get its own
    entry, equal bit for bit to its own fresh run, not the first one's bits."""
    families = available_families()
    if len(families) < 2:
        pytest.skip(f"this CPU runs one kernel family only ({families[0]})")
    runs = {}
    for family in (families[-1], families[0]):
        env = dict(os.environ, ATEN_CPU_CAPABILITY=family, MINIMIND_COURSE_CACHE=str(tmp_path / "cache"),
                   OMP_NUM_THREADS="1")
        out = tmp_path / f"{family}.pt"
        proc = subprocess.run([sys.executable, "-c", CACHE_UNDER_A_FAMILY, str(out)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[family] = torch.load(out, weights_only=True)
    filled, read = runs[families[-1]], runs[families[0]]
    assert filled["path"] != read["path"], f"one cache entry for {families[-1]} and {families[0]}: {read['path']}"
    stale = [n for n, p in read["cached"].items() if not torch.equal(p, read["fresh"][n])]
    assert not stale, (f"under {families[0]} the cached run differs from a fresh one in {stale[:3]}: "
                       f"ACTUAL the bits of another family's run, EXPECTED its own")


def test_the_in_process_memo_follows_the_thread_count():
    """A process that changes its thread count between two runs (a lab's main() run in-process does) must not get
    the other count's result back from memory: the reference, run at the new count, would differ in the last bits."""
    scenario = LOOP_FP32_SCENARIOS[1]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = run_oracle(scenario)
        torch.set_num_threads(1)
        one = run_oracle(scenario)
        assert one is not two and run_oracle(scenario) is one, "run_oracle's memo must be keyed by the thread count"
    finally:
        torch.set_num_threads(threads)


def test_cache_key_follows_the_thread_count_the_course_sets(tmp_path, monkeypatch):
    """cpu_threads (python -m course, the trainers): --threads beats OMP_NUM_THREADS beats one thread; inside it
    the oracle cache key reads the count in use; after it the caller's count is back."""
    from course.runs.threads import cpu_threads, thread_count
    scenario = LOOP_FP32_SCENARIOS[0]
    before = torch.get_num_threads()
    monkeypatch.setenv("MINIMIND_COURSE_CACHE", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    expect_equal("default thread count", thread_count(), 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    expect_equal("(OMP_NUM_THREADS=2, OMP_NUM_THREADS=2 with --threads 3)", (thread_count(), thread_count(3)), (2, 3))
    keys = {}
    for n in (1, 2):
        with cpu_threads(n) as used:
            keys[n] = (used, torch.get_num_threads(), oracle_cache_path(scenario))
        expect_equal(f"threads after cpu_threads({n})", torch.get_num_threads(), before)
    expect_equal("(count yielded, count in use) inside cpu_threads(1), (2)", [keys[n][:2] for n in (1, 2)],
                 [(1, 1), (2, 2)])
    assert keys[1][2] != keys[2][2], f"one cache entry for 1 and 2 threads: {keys[1][2]}"


def test_tiny_model_is_a_fresh_seeded_build_and_leaves_every_rng_where_building_does():
    """tiny_model copies its first build: each call must equal building anew after setup_seed(42), down to
    the RNG states a caller draws from next, and no two calls may share a tensor."""
    import random

    import numpy as np

    from course.runs import LoopScenario, tiny_model
    for scenario in (LoopScenario("dense"), LoopScenario("moe", use_moe=True),
                     LoopScenario("small", hidden_size=32, num_hidden_layers=1)):
        first = tiny_model(scenario)
        with torch.no_grad():
            next(first.parameters()).add_(1.0)   # a caller trains its copy
        copied = tiny_model(scenario)
        after_copy = (torch.rand(4), random.random(), np.random.rand())
        setup_seed(42)
        built = MiniMindForCausalLM(MiniMindConfig(hidden_size=scenario.hidden_size,
                                                   num_hidden_layers=scenario.num_hidden_layers,
                                                   use_moe=scenario.use_moe))
        after_build = (torch.rand(4), random.random(), np.random.rand())
        for (name, actual), expected in zip(copied.state_dict().items(), built.state_dict().values()):
            assert torch.equal(actual, expected), f"{scenario.name}: {name} differs from a fresh build"
        assert torch.equal(after_copy[0], after_build[0]) and after_copy[1:] == after_build[1:], (
            f"{scenario.name}: RNG draws after tiny_model ACTUAL {after_copy} EXPECTED {after_build}")
        assert copied.lm_head.weight is copied.model.embed_tokens.weight, "the tied weights must stay tied"
        with torch.no_grad():
            next(copied.buffers()).add_(1.0)
        copied.config.rope_theta = -1.0
        again = tiny_model(scenario)
        assert torch.equal(next(again.buffers()), next(built.buffers())), (
            f"{scenario.name}: a buffer changed in one copy changed the next copy's")
        assert again.config == built.config and again.config is not copied.config, "each copy has its own config"
        expect_equal(f"{scenario.name}: parameter names and kinds",
                     [(n, type(p), p.requires_grad) for n, p in again.named_parameters()],
                     [(n, type(p), p.requires_grad) for n, p in built.named_parameters()])
        tokens = torch.tensor([[1, 5, 9, 2]])
        assert torch.equal(again(tokens).logits, built(tokens).logits), f"{scenario.name}: the copy computes otherwise"
