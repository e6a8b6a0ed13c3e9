"""Lesson 18 exercises: where a training step's time and memory go.

Corpus solution by author A, style `beginner_correct`: a diligent beginner's first version, repetitive, no validation, but correct.

Read course/lessons/18_time_and_memory.md (Chinese: course/lessons/zh/18_time_and_memory.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 18``. The model is the oracle,
``course/minimind/model.py``; every check compares your numbers with a measurement of it (FlopCounterMode,
saved_tensors_hooks, nbytes, the host-sync counter) or of a fake device (``course/runs/fake_device.py``).
"""
from __future__ import annotations

import time
from collections import deque  # noqa: F401 - the last `window` steps
from typing import Callable, Optional

import torch

from course.minimind import MiniMindConfig
from course.minimind.model import MiniMindModel  # noqa: F401 - the optional §10.1


def flops_per_token(config: MiniMindConfig, seq_len: int, *, training: bool = False) -> int:
    # a linear layer does 2 FLOPs per weight for each token (one multiply, one add)
    hidden = config.hidden_size
    head_dim = config.hidden_size // config.num_attention_heads
    q_size = config.num_attention_heads * head_dim
    kv_size = config.num_key_value_heads * head_dim

    # attention projections of one layer
    q_proj_flops = 2 * hidden * q_size
    k_proj_flops = 2 * hidden * kv_size
    v_proj_flops = 2 * hidden * kv_size
    o_proj_flops = 2 * q_size * hidden

    # attention itself: scores = q @ k^T is (T x head_dim) @ (head_dim x T) per head,
    # so per token 2 * T * head_dim per head. The kv heads are repeated so all query heads do it.
    scores_flops = 2 * seq_len * head_dim * config.num_attention_heads
    # out = probs @ v is (T x T) @ (T x head_dim) per head: the same count
    values_flops = 2 * seq_len * head_dim * config.num_attention_heads

    # the MLP
    if config.use_moe:
        router_flops = 2 * hidden * config.num_experts
        expert_gate_flops = 2 * hidden * config.moe_intermediate_size
        expert_up_flops = 2 * hidden * config.moe_intermediate_size
        expert_down_flops = 2 * config.moe_intermediate_size * hidden
        # each token only goes through num_experts_per_tok experts
        one_expert = expert_gate_flops + expert_up_flops + expert_down_flops
        mlp_flops = router_flops + config.num_experts_per_tok * one_expert
    else:
        gate_flops = 2 * hidden * config.intermediate_size
        up_flops = 2 * hidden * config.intermediate_size
        down_flops = 2 * config.intermediate_size * hidden
        mlp_flops = gate_flops + up_flops + down_flops

    one_layer = (q_proj_flops + k_proj_flops + v_proj_flops + o_proj_flops
                 + scores_flops + values_flops + mlp_flops)
    all_layers = one_layer * config.num_hidden_layers

    # the embedding is just a lookup (no matmul), the lm_head is a linear layer
    lm_head_flops = 2 * hidden * config.vocab_size

    forward_flops = all_layers + lm_head_flops
    if training:
        # backward: one matmul for the input's gradient and one for the weight's gradient,
        # each as big as the forward matmul -> backward = 2 * forward
        backward_flops = 2 * forward_flops
        return forward_flops + backward_flops
    return forward_flops


class ThroughputMeter:
    def __init__(self, *, warmup_steps: int, window: int, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Optional[Callable[[], None]] = None):
        self.warmup_steps = warmup_steps
        self.window = window
        self.clock = clock
        self.synchronize = synchronize
        self.step_count = 0
        self.token_list = []
        self.time_list = []
        # wait for the device before reading the clock, like everywhere else
        if self.synchronize is not None:
            self.synchronize()
        self.last_time = self.clock()

    def step(self, tokens: int) -> None:
        if self.synchronize is not None:
            self.synchronize()
        now = self.clock()
        step_time = now - self.last_time
        self.last_time = now
        self.step_count = self.step_count + 1
        if self.step_count <= self.warmup_steps:
            # still warming up: don't count this step
            return
        self.token_list.append(tokens)
        self.time_list.append(step_time)
        # only keep the last `window` steps
        if len(self.token_list) > self.window:
            self.token_list.pop(0)
            self.time_list.pop(0)

    def tokens_per_second(self) -> Optional[float]:
        if len(self.token_list) == 0:
            return None
        total_tokens = 0
        for t in self.token_list:
            total_tokens = total_tokens + t
        total_time = 0.0
        for s in self.time_list:
            total_time = total_time + s
        # all the tokens divided by all the time (not the average of the rates)
        return total_tokens / total_time


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    achieved_flops_per_second = flops_per_token * tokens_per_second
    return achieved_flops_per_second / peak_flops_per_second


def training_state_bytes(model: torch.nn.Module, *, optimizer: str = "adamw") -> dict[str, int]:
    weights = 0
    gradients = 0
    optimizer_bytes = 0
    # model.parameters() gives a tied weight only once
    for p in model.parameters():
        weights = weights + p.numel() * p.element_size()
    for p in model.parameters():
        if p.requires_grad:
            # the gradient has the same shape and dtype as the parameter
            gradients = gradients + p.numel() * p.element_size()
    if optimizer == "adamw":
        for p in model.parameters():
            if p.requires_grad:
                exp_avg = p.numel() * p.element_size()
                exp_avg_sq = p.numel() * p.element_size()
                step = 4  # AdamW's "step" is a float32 tensor with one number
                optimizer_bytes = optimizer_bytes + exp_avg + exp_avg_sq + step
    if optimizer == "sgd":
        optimizer_bytes = 0  # SGD without momentum keeps nothing
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer_bytes}


def activation_bytes(config: MiniMindConfig, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    # I went through model.py op by op and wrote down what each op keeps for backward.
    # bytes of one number of the model's dtype (4 for float32, 2 for bfloat16)
    size = torch.tensor([], dtype=dtype).element_size()
    hidden = config.hidden_size
    head_dim = config.hidden_size // config.num_attention_heads
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    inter = config.intermediate_size
    tokens = batch_size * seq_len

    total = 0
    # embedding keeps input_ids (int64)
    total = total + tokens * 8

    for layer in range(config.num_hidden_layers):
        # input_layernorm: x as float32, rsqrt (float32, one per token), normed cast back
        total = total + tokens * hidden * 4
        total = total + tokens * 4
        total = total + tokens * hidden * size
        # output of the norm, kept by q_proj, k_proj and v_proj (the same tensor, counted once)
        total = total + tokens * hidden * size
        # q_norm: float32 input, rsqrt per head, normed cast back
        total = total + tokens * heads * head_dim * 4
        total = total + tokens * heads * 4
        total = total + tokens * heads * head_dim * size
        # k_norm: the same with the kv heads
        total = total + tokens * kv_heads * head_dim * 4
        total = total + tokens * kv_heads * 4
        total = total + tokens * kv_heads * head_dim * size
        # rope: multiplies by cos/sin which are buffers, so nothing new is kept
        # attention (the fused kernel): q, k and v (k and v repeated to all heads), the output, and a
        # float32 logsumexp per head. o_proj's input is the same memory as the output.
        total = total + tokens * heads * head_dim * size   # q
        total = total + tokens * heads * head_dim * size   # k
        total = total + tokens * heads * head_dim * size   # v
        total = total + tokens * heads * head_dim * size   # output
        total = total + tokens * heads * 4                 # logsumexp
        # post_attention_layernorm: same as input_layernorm
        total = total + tokens * hidden * 4
        total = total + tokens * 4
        total = total + tokens * hidden * size
        # output of the norm, kept by gate_proj and up_proj
        total = total + tokens * hidden * size
        # silu keeps its input (gate output), the multiply keeps silu's output and up's output
        total = total + tokens * inter * size
        total = total + tokens * inter * size
        total = total + tokens * inter * size
        # down_proj keeps its input
        total = total + tokens * inter * size

    # final norm
    total = total + tokens * hidden * 4
    total = total + tokens * 4
    total = total + tokens * hidden * size
    # lm_head keeps its input
    total = total + tokens * hidden * size

    # the loss: the logits are turned to float32 and log_softmax keeps its float32 output,
    # only for the first seq_len - 1 positions (each predicts the next token)
    targets = batch_size * (seq_len - 1)
    total = total + targets * config.vocab_size * 4
    # nll_loss keeps the targets (int64) and a float32 total weight
    total = total + targets * 8
    total = total + 4
    return total


class RunningLoss:
    def __init__(self):
        self.total = None
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        # detach so the graph is not kept, float() so bf16 losses are summed in float32
        # (no .item() here: that would wait for the device)
        if self.total is None:
            self.total = torch.zeros((), dtype=torch.float32, device=loss.device)
        self.total = self.total + loss.detach().float()
        self.count = self.count + 1

    def pop_mean(self) -> float:
        mean = self.total / self.count
        result = mean.item()  # the only host sync
        self.total = None
        self.count = 0
        return result


def without_rope_sync(model: torch.nn.Module) -> torch.nn.Module:
    """TODO (lesson 18 §10.1, optional): recent upstream's forward without its host sync.

    ``model``: built by ``course.runs.rope_check.recent_upstream_model``: its ``.model`` checks
    ``freqs_cos[0, 0] == 0`` in every forward. Return it, changed in place, so that a training step syncs zero
    times, its outputs stay bit for bit, and RoPE tables lost at init are still recomputed.
    """
    raise NotImplementedError("without_rope_sync: TODO - see lesson 18 §10.1")
