"""Lesson 18's hint ladder (``python -m course hint 18 EXERCISE``; the notebook names the command): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
    "flops_per_token": (
        "A matmul of an m x k input by a k x n weight costs 2 x m x k x n FLOPs (a multiply and an add per weight and "
        "row). Walk one token through the model and list every matmul it meets; then ask which of them grow with "
        "the length of its sequence, and what the backward adds.",
        "course/minimind/model.py: Attention (q_proj, k_proj, v_proj, o_proj and scaled_dot_product_attention), "
        "FeedForward (three projections), MOEFeedForward (the gate, then only the experts topk chose), the lm_head "
        "and the embedding. course/runs/step_costs.py::counted_flops measures the count you must equal: run it on a "
        "small config and compare it with your sum, part by part.",
        "Per token: 2 x (the weights of every linear it passes: q and o hidden^2, k and v hidden x kv_heads x "
        "head_dim, the SwiGLU 3 x hidden x intermediate_size or the router hidden x num_experts plus "
        "num_experts_per_tok experts of 3 x hidden x moe_intermediate_size, per layer; the lm_head hidden x vocab, "
        "tied or not) + 4 x seq_len x hidden per layer (QK^T and PV over the whole square). The embedding lookup, "
        "norms and softmax count nothing. training=True: 3x (the backward computes two matmuls per forward one).",
        "hidden, kv = config.hidden_size, config.num_key_value_heads * config.head_dim; attention = 2 * hidden * "
        "hidden + 2 * hidden * kv; mlp = 3 * hidden * config.intermediate_size, or for MoE hidden * num_experts + "
        "num_experts_per_tok * 3 * hidden * moe_intermediate_size; weights = layers * (attention + mlp) + hidden * "
        "vocab_size; forward = 2 * weights + 4 * layers * seq_len * hidden; return 3 * forward if training else "
        "forward.",
    ),
    "ThroughputMeter": (
        "On a GPU a step's kernels are only queued when your Python line returns: a clock read then times the "
        "launches, not the work. And the first steps (compilation, the allocator's first blocks) are slower than "
        "the rest. What must happen before each clock read, and which steps belong in the rate?",
        "course/runs/fake_device.py::FakeDevice is the asynchronous device the checks use: launch queues work, "
        "synchronize waits for it, clock reads the host's time. Drive it by hand with and without a synchronize "
        "before each clock read and compare the times you get with the steps' real durations.",
        "Read the clock (after synchronize(), when given) at creation and at every step(); a step's time is its read "
        "minus the previous one. Leave out the first warmup_steps steps; keep the (tokens, seconds) of the last "
        "window measured steps; the rate is their total tokens over their total seconds; None while none was "
        "measured.",
        "__init__: validate; self.left = warmup_steps; self.steps = deque(maxlen=window); self.last = self.now(). "
        "now(): if synchronize is not None: synchronize(); return clock(). step(tokens): t = self.now(); if "
        "self.left: self.left -= 1; else: self.steps.append((tokens, t - self.last)); self.last = t. "
        "tokens_per_second(): None if not self.steps else sum(tokens) / sum(seconds).",
    ),
    "mfu": (
        "MFU compares what the model's math needed with what the device could have done in the same time: FLOPs "
        "done per second over FLOPs possible per second.",
        "flops_per_token (§5.1, training=True: a step does forward and backward) times the measured tokens/s is "
        "the FLOP/s achieved; course/runs/peak_flops.py::PEAK_FLOPS holds GPUs' dense bf16 peaks, and lesson 18's "
        "lab measures a CPU's.",
        "mfu = flops_per_token x tokens_per_second / peak_flops_per_second, a fraction between 0 and 1 on a real "
        "run (not a percentage); a peak that is not positive is refused.",
        "if not peak_flops_per_second > 0: raise ValueError(...peak_flops_per_second...); return flops_per_token * "
        "tokens_per_second / peak_flops_per_second.",
    ),
    "training_state_bytes": (
        "Between two steps, memory holds each weight, the gradient of each weight that trains, and whatever the "
        "optimizer remembers about it. Count tensors, not names: what is one tensor reachable under two names?",
        "torch.optim.AdamW's state per parameter (optimizer.state[p] after a step): exp_avg, exp_avg_sq and step; "
        "SGD without momentum keeps none. model.parameters() yields each tensor once (a tied lm_head is the "
        "embedding's tensor); course/runs/step_costs.py::training_state_nbytes measures what the checks compare.",
        "weights: sum of p.nbytes over model.parameters() (each at its own dtype; frozen ones too); gradients: over "
        "those with requires_grad; optimizer: AdamW 2 x the gradients' bytes plus 4 bytes (a float32 step tensor) "
        "per trained parameter tensor, SGD 0. Autocast computes in bf16 but keeps all of these as they were.",
        "params = list(model.parameters()); trained = [p for p in params if p.requires_grad]; grads = sum(p.nbytes "
        "for p in trained); state = 2 * grads + 4 * len(trained) if optimizer == 'adamw' else 0; return "
        "{'weights': sum(p.nbytes for p in params), 'gradients': grads, 'optimizer': state}.",
    ),
    "activation_bytes": (
        "Backward needs, for every op, some of its inputs or outputs: autograd keeps them from the forward until "
        "the backward has used them. Which tensors of one layer does that make, how wide is each per token, and in "
        "which dtype? Does any of them grow faster than the number of tokens?",
        "course/runs/step_costs.py::saved_activation_bytes records what saved_tensors_hooks sees: run it on a "
        "one-layer config, then change one field (vocab_size, intermediate_size, num_key_value_heads, "
        "num_hidden_layers, the dtype, seq_len) and see which bytes move. course/minimind/model.py's RMSNorm "
        "computes in float32; the loss takes the logits in float32.",
        "Per token and layer: two RMSNorms (each its float32 input, a float32 1/rms, its normalized output and its "
        "scaled output at dtype), the per-head q and k norms likewise, q after RoPE, k and v repeated to every "
        "head, attention's output and a float32 logsumexp per head, the SwiGLU's four tensors of "
        "intermediate_size; then the final norm, the loss's float32 log-probabilities (vocab_size per target) and "
        "int64 ids and targets. No T x T matrix: fused attention keeps none.",
        "norm = 4 * (h + 1) + 2 * size * h; q = 4 * (h + heads) + 2 * size * h; k = 4 * (kv + kv_heads) + size * "
        "kv; layer = 2 * norm + q + k + 3 * size * h + 4 * heads + 4 * size * I; per_token = 8 + layers * layer + "
        "norm; return B * T * per_token + B * (T - 1) * (4 * vocab + 8) (+ 4).",
    ),
    "RunningLoss": (
        "A loss's .item() waits for the device to finish everything queued: once per step, the host stalls once "
        "per step. Keep the sum where the loss is, and bring one number to the host when you log. What else does "
        "a sum of losses that require grad keep alive?",
        "course/checks/host_syncs.py says what the checks count as a host sync (item, float(), .cpu(), tolist...). "
        "Lesson 14's loop logs with loss.item() every log step, upstream does the same.",
        "add: the loss detached and as float32, added to a running tensor (no conversion to Python), a count kept "
        "in Python; pop_mean: the mean as a tensor, .item() once, then start the next interval empty.",
        "add(loss): value = loss.detach().float(); self.total = value if self.total is None else self.total + "
        "value; self.count += 1. pop_mean(): mean = (self.total / self.count).item(); self.total, self.count = "
        "None, 0; return mean.",
    ),
    "without_rope_sync": (
        "Find the host sync first: count them over one training step of recent_upstream_model's model, then read "
        "its forward. The check exists for a reason (tables lost at load time): keep its purpose, pay for it once.",
        "course/runs/rope_check.py: RecentUpstreamModel.forward is course/minimind's MiniMindModel.forward after "
        "upstream's `if self.freqs_cos[0, 0] == 0:`; recompute_rope_tables rebuilds the tables.",
        "In without_rope_sync: check the tables once (one sync, now) and recompute them if lost; then make the "
        "inner model's forward course/minimind's own, which checks nothing.",
        "inner = model.model; if inner.freqs_cos[0, 0] == 0: inner.recompute_rope_tables(inner.freqs_cos.device); "
        "inner.__class__ = MiniMindModel (the check is all RecentUpstreamModel adds); return model.",
    ),
}
