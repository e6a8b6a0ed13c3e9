"""Lesson 18 checks of ``flops_per_token``: the count torch's FlopCounterMode makes of the real model, per token.

The expected number is a measurement, never our formula: ``course/runs/step_costs.py::counted_flops`` runs the
model (course/minimind) forward, and for ``training=True`` forward and backward, under FlopCounterMode, attention
through SDPA's math backend (the CPU's fused kernel is missing from FlopCounterMode's registry: it would count no
attention at all), and divides by the tokens. FlopCounterMode counts each matmul's 2 x m x n x k exactly, so the
comparison is exact. A failure's hint comes from the same measurement: the config field whose change moves your
count differently from the counter's (``first_disagreement``) names the rule.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

from course.minimind import MiniMindConfig
from course.runs.step_costs import counted_flops, measured_model, random_batch

from ..framework import check, expect_equal, expect_raises, expect_type, fail

BATCH = 2   # sequences per measured batch: the count per token does not depend on it

# name -> the config's fields (max_position_embeddings kept small: the RoPE tables are built for it)
FLOP_CONFIGS = {
    "dense, 4 query heads sharing 2 kv heads, tied lm_head": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=96),
    "dense, 8 heads each with its own kv head, untied lm_head": dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=8, vocab_size=96,
        tie_word_embeddings=False),
    "dense, 4 query heads sharing 1 kv head, intermediate_size 80": dict(
        hidden_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, intermediate_size=80,
        vocab_size=64),
    "MoE, 4 experts, top-1": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
        use_moe=True),
    "MoE, 4 experts, top-2, untied lm_head": dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
        use_moe=True, num_experts_per_tok=2, tie_word_embeddings=False),
}
HIDDEN_CONFIGS = {
    "MoE, 4 experts, top-2, experts of width 48 (moe_intermediate_size) beside intermediate_size 128": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
        use_moe=True, num_experts_per_tok=2, moe_intermediate_size=48),
}
SEQ_LENS = (8, 32)


def config_of(fields: dict) -> MiniMindConfig:
    return MiniMindConfig(max_position_embeddings=128, **fields)


@lru_cache(maxsize=None)
def counted_per_token(fields: tuple, seq_len: int) -> tuple[int, int]:
    """FlopCounterMode's counts of the real model per token, (forward, training) (``fields``: the config's items,
    sorted)."""
    config = config_of(dict(fields))
    input_ids, labels = random_batch(config, BATCH, seq_len)
    totals = counted_flops(measured_model(config), input_ids, labels)
    if any(total % (BATCH * seq_len) for total in totals):
        raise AssertionError(f"FlopCounterMode counted {totals} FLOPs, not a whole number per token")
    return tuple(total // (BATCH * seq_len) for total in totals)


def measured_flops_per_token(fields: dict, seq_len: int, training: bool) -> int:
    return counted_per_token(tuple(sorted(fields.items())), seq_len)[training]


# The fields a hint varies one at a time, and the rule a disagreement in that direction names: (field, its new
# value given the config's fields or None to skip it, the rule if your count grows more than the counter's, the
# rule if it grows less). "seq_len" is the sequence length, quadrupled.
KV_RULE = "k_proj and v_proj have num_key_value_heads x head_dim outputs each, not hidden_size"
ACTIVE_RULE = "only the active experts: num_experts_per_tok of them per token (the others see none of its FLOPs)"
EXPERT_WIDTH_RULE = "an expert's width is moe_intermediate_size (upstream's default: intermediate_size)"
SWIGLU_RULE = "the dense SwiGLU has 3 matmuls of hidden_size x intermediate_size"
SEQUENCE_RULE = ("attention's QK^T and PV grow with the sequence: 4 x seq_len x hidden_size per layer and token, "
                 "over the whole T x T square (the causal mask removes no matmul)")
PERTURBATIONS: tuple[tuple[str, Callable[[dict], object], str, str], ...] = (
    ("seq_len", lambda f: True, SEQUENCE_RULE, SEQUENCE_RULE),
    ("vocab_size", lambda f: f["vocab_size"] * 2,
     "the embedding lookup costs none: it indexes a row, no matmul (the lm_head's matmul counts once, tied or not)",
     "the lm_head is a matmul: 2 x hidden_size x vocab_size per token, although a tied one adds no parameter"),
    ("num_key_value_heads", lambda f: f["num_key_value_heads"] * 2 if f["num_key_value_heads"] * 2 <= f[
        "num_attention_heads"] else f["num_key_value_heads"] // 2, KV_RULE, KV_RULE),
    ("num_experts_per_tok", lambda f: 3 if f.get("use_moe") else None, EXPERT_WIDTH_RULE, ACTIVE_RULE),
    ("moe_intermediate_size", lambda f: 64 if f.get("use_moe") else None, ACTIVE_RULE, EXPERT_WIDTH_RULE),
    ("num_experts", lambda f: 8 if f.get("use_moe") else None, ACTIVE_RULE,
     "the router is a matmul too: 2 x hidden_size x num_experts per token and layer"),
    ("intermediate_size", lambda f: None if f.get("use_moe") else 2 * config_of(f).intermediate_size,
     SWIGLU_RULE, SWIGLU_RULE),
    ("num_hidden_layers", lambda f: 2, "every layer counts once", "every layer counts once"),
)
FLOPS_RULE = ("2 FLOPs per weight of every matmul a token passes (q, k, v, o, the SwiGLU or the router and the "
              "active experts, the lm_head), plus 4 x seq_len x hidden_size per layer for attention; the norms, "
              "RoPE, softmax and the embedding lookup are no matmuls")


def first_disagreement(ours: Callable[[dict, int], float], measured: Callable[[dict, int], float], fields: dict,
                       seq_len: int, perturbations=PERTURBATIONS, rtol: float = 1e-9) -> Optional[str]:
    """The rule named by the first change under which ``ours`` (the code under test) moves differently from
    ``measured``, or None. Each change is made to a one-layer copy of ``fields`` (a per-layer term then shows in
    the field it depends on), the last one adds a layer."""
    one_layer = {**fields, "num_hidden_layers": 1}
    for field, new_value, grows_more, grows_less in perturbations:
        value = new_value(one_layer)
        if value is None:
            continue
        changed, length = (one_layer, seq_len * 4) if field == "seq_len" else ({**one_layer, field: value}, seq_len)
        ours_delta = ours(changed, length) - ours(one_layer, seq_len)
        measured_delta = measured(changed, length) - measured(one_layer, seq_len)
        if abs(ours_delta - measured_delta) > rtol * abs(measured_delta):
            return grows_more if ours_delta > measured_delta else grows_less
    return None


def flops_hint(impl, fields: dict, seq_len: int, training: bool, actual) -> str:
    """The rule ``actual`` breaks, found by varying the config the way ``first_disagreement`` does."""
    if training:
        forward = impl.flops_per_token(config_of(fields), seq_len)
        if forward == measured_flops_per_token(fields, seq_len, False) and actual != 3 * forward:
            return ("training=True counts forward and backward: the backward costs twice the forward (each matmul's "
                    "gradient with respect to its input and to its weight), 3x in all")
    rule = first_disagreement(
        lambda f, t: impl.flops_per_token(config_of(f), t, training=training),
        lambda f, t: measured_flops_per_token(f, t, training), fields, seq_len)
    return rule or FLOPS_RULE


def expect_flops(impl, configs: dict, seq_lens, training: bool) -> None:
    for name, fields in configs.items():
        for seq_len in seq_lens:
            config = config_of(fields)
            actual = (impl.flops_per_token(config, seq_len, training=True) if training else
                      impl.flops_per_token(config, seq_len))   # training's default: the forward
            expected = measured_flops_per_token(fields, seq_len, training)
            if actual != expected:
                fail(f"flops_per_token({name}, seq_len={seq_len}, training={training})", actual, expected,
                     f"FlopCounterMode's count of the model's {'forward and backward' if training else 'forward'}, "
                     f"per token\n  hint: the rule: {flops_hint(impl, fields, seq_len, training, actual)}")


@check("flops_per_token", objective="flops", slow=True)
def flops_are_flop_counter_modes(impl):
    """The FLOPs per token of the forward, and with training=True of forward and backward, equal FlopCounterMode's
    count of the real model, for dense models (GQA 4:2, multi-head untied, multi-query with its own
    intermediate_size) and MoE ones (top-1, top-2), at 8 and 32 tokens."""
    expect_flops(impl, FLOP_CONFIGS, SEQ_LENS, training=False)
    expect_flops(impl, FLOP_CONFIGS, SEQ_LENS, training=True)


@check("flops_per_token", objective="flops", hidden=True)
def flops_of_experts_of_their_own_width(impl):
    """A MoE model whose experts are narrower than intermediate_size (moe_intermediate_size 48), top-2, forward
    and training, at 16 tokens."""
    for training in (False, True):
        expect_flops(impl, HIDDEN_CONFIGS, (16,), training=training)


@check("flops_per_token")
def flops_are_an_int_and_refuse_a_bad_seq_len(impl):
    """An exact count is a Python int; a sequence of one token is one (its token attends to itself); seq_len below
    1 is a ValueError naming it."""
    fields = FLOP_CONFIGS["dense, 4 query heads sharing 2 kv heads, tied lm_head"]
    config = config_of(fields)
    expect_type("flops_per_token(config, 8)", impl.flops_per_token(config, 8), int)
    expect_equal("flops_per_token(config, seq_len=1): FlopCounterMode's count", impl.flops_per_token(config, 1),
                 measured_flops_per_token(fields, 1, False))
    for seq_len in (0, -4):
        expect_raises(f"flops_per_token(config, seq_len={seq_len})", lambda: impl.flops_per_token(config, seq_len),
                      ValueError, "seq_len")

