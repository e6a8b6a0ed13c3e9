"""Lesson 18 checks of ``training_state_bytes`` and ``activation_bytes``: bytes measured on the real model.

The training state is measured after one real optimizer step (``course/runs/step_costs.py::training_state_nbytes``:
the parameters' ``nbytes``, each tensor once, their ``.grad``, every tensor of the optimizer's state): compared
exactly. The activations are what ``torch.autograd.graph.saved_tensors_hooks`` sees during one training forward
(``saved_activation_bytes``: each storage once, parameters and buffers left out), at two sequence lengths. That
count depends on kernel details no formula should have to know (whether the attention output and o_proj's input
share a storage, a 4-byte 1/rms per row and head, the int64 ids): ``activation_bytes`` must be within
ACTIVATION_RTOL = 5 % of it; each rule of the lesson moves it by more than that on some case below.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from course.runs.eager import eager
from course.runs.step_costs import measured_model, random_batch, saved_activation_bytes, training_state_nbytes

from ..framework import check, expect_raises, expect_type, fail
from .checks import config_of

ACTIVATION_RTOL = 0.05
DELTA_RTOL = 0.15   # a hint's comparison of how two counts change: small terms left out move it by < 10 %

TINY = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, vocab_size=6400)
STATE_CASES = {   # name -> (config fields, parameters' dtype, optimizer, autocast dtype of the step)
    "the tiny model (tied lm_head), AdamW": (TINY, torch.float32, "adamw", None),
    "untied lm_head, AdamW, the step under bf16 autocast": (
        dict(hidden_size=32, num_hidden_layers=1, vocab_size=96, tie_word_embeddings=False), torch.float32,
        "adamw", torch.bfloat16),
    "tied lm_head, plain SGD": (dict(hidden_size=32, num_hidden_layers=1, vocab_size=96), torch.float32, "sgd",
                                None),
    "a bf16 model (every parameter bf16), AdamW": (dict(hidden_size=32, num_hidden_layers=1, vocab_size=96),
                                                  torch.bfloat16, "adamw", None),
    "MoE, 4 experts, AdamW": (dict(hidden_size=32, num_hidden_layers=1, vocab_size=96, use_moe=True),
                              torch.float32, "adamw", None),
}
FROZEN_CASES = {   # name -> (config fields, the parameter names' prefixes frozen)
    "the embedding frozen (the tied lm_head with it), AdamW": (
        dict(hidden_size=32, num_hidden_layers=2, vocab_size=96), ("model.embed_tokens",)),
    "untied, the lm_head and layer 0 frozen, AdamW": (
        dict(hidden_size=32, num_hidden_layers=2, vocab_size=96, tie_word_embeddings=False),
        ("lm_head", "model.layers.0")),
}
OPTIMIZERS = {"adamw": lambda params: eager(torch.optim.AdamW)(params, lr=1e-3),   # eager: no torch._dynamo import
              "sgd": lambda params: eager(torch.optim.SGD)(params, lr=1e-3)}


def state_model(fields: dict, dtype: torch.dtype, frozen: tuple = ()) -> torch.nn.Module:
    model = measured_model(config_of(fields), dtype)
    for name, param in model.named_parameters():
        param.requires_grad_(not name.startswith(frozen))
    return model


@lru_cache(maxsize=None)
def measured_state(name: str) -> dict[str, int]:
    if name in STATE_CASES:
        fields, dtype, optimizer, autocast = STATE_CASES[name]
        frozen = ()
    else:
        (fields, frozen), dtype, optimizer, autocast = FROZEN_CASES[name], torch.float32, "adamw", None
    model = state_model(fields, dtype, frozen)
    input_ids, labels = random_batch(model.config, 2, 8)
    trained = [p for p in model.parameters() if p.requires_grad]
    return training_state_nbytes(model, OPTIMIZERS[optimizer](trained), input_ids, labels, autocast_dtype=autocast)


def state_hint(model: torch.nn.Module, optimizer: str, actual, expected: dict) -> str:
    """The rule a wrong dict breaks, read off the model's parameters."""
    if not isinstance(actual, dict) or set(actual) != set(expected):
        return 'a dict with the keys "weights", "gradients" and "optimizer"'
    named = dict(model.named_parameters(remove_duplicate=False))
    trained = [p for p in model.parameters() if p.requires_grad]
    if actual["weights"] == sum(p.nbytes for p in named.values()) != expected["weights"]:
        return "a tied weight is stored once: count each parameter tensor once (model.parameters() does)"
    if actual["weights"] == 4 * sum(p.numel() for p in model.parameters()) != expected["weights"]:
        return "each tensor takes its own dtype's bytes (element_size: 2 for bf16), not 4"
    if actual["gradients"] != expected["gradients"] and len(trained) < len(list(model.parameters())):
        return "a frozen parameter (requires_grad=False) has no gradient and no optimizer state"
    if optimizer == "sgd":
        return "plain SGD (no momentum) keeps no state"
    if actual["optimizer"] == expected["optimizer"] - 4 * len(trained):
        return "AdamW's step count: a float32 scalar tensor (4 bytes) per parameter tensor, beside its moments"
    return ("AdamW keeps two moments (exp_avg, exp_avg_sq) of each trained parameter's shape and dtype, and a "
            "float32 step count per parameter tensor")


def expect_state(impl, name: str) -> None:
    if name in STATE_CASES:
        fields, dtype, optimizer, _ = STATE_CASES[name]
        model = state_model(fields, dtype)
    else:
        (fields, frozen), optimizer = FROZEN_CASES[name], "adamw"
        model = state_model(fields, torch.float32, frozen)
    expected = measured_state(name)
    actual = impl.training_state_bytes(model, optimizer=optimizer)
    if actual != expected:
        fail(f"training_state_bytes({name}, optimizer={optimizer!r}): the nbytes after a real optimizer step",
             actual, expected, f"hint: the rule: {state_hint(model, optimizer, actual, expected)}")


@check("training_state_bytes", objective="state_memory")
def state_bytes_are_the_tensors_nbytes_after_a_step(impl):
    """Weights, gradients and optimizer state equal the real tensors' nbytes after a step: the tiny model (tied),
    untied under bf16 autocast (fp32 master weights: nothing changes), plain SGD, a bf16 model, a MoE model."""
    for name in STATE_CASES:
        expect_state(impl, name)


@check("training_state_bytes", objective="state_memory", hidden=True)
def state_bytes_of_a_partly_frozen_model(impl):
    """Frozen parameters: kept as weights, with no gradient and no optimizer state (the embedding, so the tied
    lm_head too; an untied lm_head and a whole layer)."""
    for name in FROZEN_CASES:
        expect_state(impl, name)


@check("training_state_bytes")
def state_bytes_are_ints_and_refuse_an_unknown_optimizer(impl):
    """Each entry is a Python int; an optimizer other than "adamw" and "sgd" is a ValueError naming optimizer."""
    model = state_model(STATE_CASES["tied lm_head, plain SGD"][0], torch.float32)
    for key, value in impl.training_state_bytes(model).items():
        expect_type(f"training_state_bytes(model)[{key!r}]", value, int)
    expect_raises('training_state_bytes(model, optimizer="lion")',
                  lambda: impl.training_state_bytes(model, optimizer="lion"), ValueError, "optimizer")


# --- activation_bytes ------------------------------------------------------------------------------------------

DEEP = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=1, vocab_size=128,
            intermediate_size=192)
ACTIVATION_CASES = (   # (name, config fields, batch size, dtype); each at ACTIVATION_SEQ_LENS
    ("the tiny model's shape (vocab 6400)", TINY, 2, torch.float32),
    ("deep and narrow, 16 heads sharing 1 kv head, vocab 128", DEEP, 3, torch.float32),
    ("the tiny model's shape, bf16", TINY, 2, torch.bfloat16),
    ("deep and narrow, bf16", DEEP, 3, torch.bfloat16),
)
ACTIVATION_SEQ_LENS = (8, 64)
PROBE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, vocab_size=64,
             intermediate_size=96)   # one layer: a hint's probe varies one field of it at a time
ACTIVATION_PERTURBATIONS = (   # (field, new value, the rule if your count grows more, the rule if it grows less)
    ("vocab_size", 256, "the loss saves only its float32 log-probabilities, vocab_size x 4 bytes per target, "
     "seq_len - 1 targets per sequence (not the logits, not one per token)",
     "the loss saves its float32 log-probabilities: vocab_size x 4 bytes per target"),
    ("intermediate_size", 192, "the SwiGLU saves four tensors of intermediate_size: gate, silu(gate), up, "
     "their product", "the SwiGLU saves four tensors of intermediate_size: gate, silu(gate), up, their product"),
    ("num_key_value_heads", 2, "k and v are repeated to every query head before attention: the copies attention "
     "saves have num_attention_heads heads", "the per-head q and k norms save their float32 input and "
     "normalized output too"),
    ("num_hidden_layers", 3, "every layer saves its own activations", "every layer saves its own activations"),
)
ACTIVATION_RULE = ("per token, every RMSNorm (the per-head q and k norms too) keeps its float32 input and its "
                   "normalized output, each matmul its input, attention q, k and v repeated to every head and its "
                   "output, the SwiGLU four tensors of intermediate_size; the loss its float32 log-probabilities")


@lru_cache(maxsize=None)
def measured_activations(fields: tuple, batch_size: int, seq_len: int, dtype: torch.dtype) -> int:
    config = config_of(dict(fields))
    return sum(saved_activation_bytes(measured_model(config, dtype), *random_batch(config, batch_size,
                                                                                   seq_len)).values())


def measured(fields: dict, batch_size: int, seq_len: int, dtype: torch.dtype) -> int:
    return measured_activations(tuple(sorted(fields.items())), batch_size, seq_len, dtype)


def activation_hint(impl) -> str:
    """The rule a wrong count breaks: on a one-layer probe, the first change (of the batch, the sequence, one
    config field, the dtype) under which your count moves unlike the measured one."""
    def ours(fields=PROBE, batch_size=2, seq_len=4, dtype=torch.float32):
        return impl.activation_bytes(config_of(fields), batch_size, seq_len, dtype)
    if abs(ours(batch_size=4) - 2 * ours()) > ACTIVATION_RTOL * ours():
        return "every one of the batch_size x seq_len tokens saves its own activations"
    if ours(seq_len=16) > (1 + ACTIVATION_RTOL) * 4 * ours():
        return ("no T x T matrix is saved: the fused attention kernel keeps its output and one float32 logsumexp "
                "per row and head, so the bytes are linear in seq_len")
    base = measured(PROBE, 2, 4, torch.float32)
    for field, value, grows_more, grows_less in ACTIVATION_PERTURBATIONS:
        changed = {**PROBE, field: value}
        ours_delta, measured_delta = ours(changed) - ours(), measured(changed, 2, 4, torch.float32) - base
        if abs(ours_delta - measured_delta) > DELTA_RTOL * abs(measured_delta):
            return grows_more if ours_delta > measured_delta else grows_less
    ours_ratio = ours(dtype=torch.bfloat16) / ours()
    if abs(ours_ratio - measured(PROBE, 2, 4, torch.bfloat16) / base) > ACTIVATION_RTOL:
        return ("the norms and the loss compute in float32 whatever the model's dtype: their saved tensors take 4 "
                "bytes per value in a bf16 model too")
    return ACTIVATION_RULE


@check("activation_bytes", objective="activation_memory", slow=True)
def activation_bytes_are_what_autograd_saves(impl):
    """Within 5 % of the bytes saved_tensors_hooks records in one training forward of the real model, at 8 and 64
    tokens: the tiny model's shape (its 6400-token vocabulary), a deep narrow one (16 heads sharing 1 kv head), both
    in fp32 and bf16."""
    for name, fields, batch_size, dtype in ACTIVATION_CASES:
        for seq_len in ACTIVATION_SEQ_LENS:
            actual = impl.activation_bytes(config_of(fields), batch_size, seq_len, dtype)
            expected = measured(fields, batch_size, seq_len, dtype)
            if not abs(actual - expected) <= ACTIVATION_RTOL * expected:
                fail(f"activation_bytes({name}, batch_size={batch_size}, seq_len={seq_len}, dtype={dtype}): the "
                     "bytes saved_tensors_hooks records", actual, expected,
                     f"|diff| = {abs(actual - expected) / expected:.1%} of it > {ACTIVATION_RTOL:.0%}\n  hint: the "
                     f"rule: {activation_hint(impl)}")


@check("activation_bytes")
def activation_bytes_are_an_int_and_refuse_bad_arguments(impl):
    """An int, one sequence of one token included; a MoE config is a ValueError naming config (what it saves
    depends on its routing), batch_size or seq_len below 1 one naming it."""
    dense, moe = config_of(PROBE), config_of({**PROBE, "use_moe": True})
    expect_type("activation_bytes(config, 2, 8)", impl.activation_bytes(dense, 2, 8), int)
    expect_type("activation_bytes(config, batch_size=1, seq_len=1)", impl.activation_bytes(dense, 1, 1), int)
    expect_raises("activation_bytes(a MoE config, 2, 8)", lambda: impl.activation_bytes(moe, 2, 8), ValueError,
                  "config")
    for batch_size, seq_len, name in ((0, 8, "batch_size"), (2, 0, "seq_len")):
        expect_raises(f"activation_bytes(config, batch_size={batch_size}, seq_len={seq_len})",
                      lambda: impl.activation_bytes(dense, batch_size, seq_len), ValueError, name,
                      ("batch_size", "seq_len"))
