"""Lesson 18's mistake catalogue: each wrong variant of a reference function FAILS the check named; each
equivalent PASSES every check (tests/test_mistakes.py proves both)."""
from __future__ import annotations

from ..catalogue import equivalent, mistake
from .checks import (flops_are_an_int_and_refuse_a_bad_seq_len, flops_are_flop_counter_modes,
                     flops_of_experts_of_their_own_width)
from .extensions import fixed_model_recomputes_lost_tables, fixed_model_steps_without_a_sync
from .memory import (activation_bytes_are_an_int_and_refuse_bad_arguments, activation_bytes_are_what_autograd_saves,
                     state_bytes_are_ints_and_refuse_an_unknown_optimizer,
                     state_bytes_are_the_tensors_nbytes_after_a_step, state_bytes_of_a_partly_frozen_model)
from .syncs import (add_lets_go_of_the_graph, add_never_syncs_and_pop_mean_syncs_once,
                    pop_mean_is_the_mean_since_the_last_pop, running_loss_conventions,
                    running_sum_of_bf16_losses_is_float32)
from .throughput import (meter_on_a_synchronous_device, meter_reports_a_float_and_refuses_bad_arguments,
                         meter_times_synchronized_steps_after_the_warm_up, meter_without_warm_up_and_a_window_of_one,
                         mfu_is_a_float_and_refuses_a_peak_of_zero, mfu_is_the_achieved_fraction_of_the_peak)

WEIGHTS = "    weights = config.num_hidden_layers * (attention + mlp) + hidden * config.vocab_size\n"
ATTENTION = "4 * config.num_hidden_layers * seq_len * hidden"
EXPERTS = "config.num_experts_per_tok * 3 * hidden * config.moe_intermediate_size"
NOW = ("        if self._synchronize is not None:\n            self._synchronize()\n"
       "        return self._clock()\n")
MEASURED = "            self._steps.append((tokens, now - self._last_read))\n"
RATE = "        return sum(tokens for tokens, _ in self._steps) / sum(seconds for _, seconds in self._steps)\n"
Q_AND_K = ("             + _norm_bytes(hidden, heads, size) + size * hidden   # q: its norm, its rotated values\n"
           "             + _norm_bytes(kv_heads * config.head_dim, kv_heads, size)\n")
TOTAL = ("    return batch_size * seq_len * per_token + targets * (FLOAT32_BYTES * config.vocab_size + INT64_BYTES)"
         " + \\\n        FLOAT32_BYTES\n")

MISTAKES = [
    # flops_per_token (§5.1)
    mistake("embedding_counted", "the embedding lookup counted as a matmul beside the lm_head (6N with N every "
            "parameter)", "flops_per_token", WEIGHTS, WEIGHTS.replace("hidden * config.vocab_size",
                                                                         "2 * hidden * config.vocab_size"),
            flops_are_flop_counter_modes, rule="the embedding lookup costs none"),
    mistake("tied_lm_head_free", "a tied lm_head counted as free: its weights are the embedding's, counted once",
            "flops_per_token", WEIGHTS, WEIGHTS.replace("hidden * config.vocab_size", "(0 if config.tie_word_"
                                                        "embeddings else hidden * config.vocab_size)"),
            flops_are_flop_counter_modes, rule="the lm_head is a matmul"),
    mistake("no_attention_term", "only the weights: 2N per token, attention's sequence term left out",
            "flops_per_token", f" + {ATTENTION}", "", flops_are_flop_counter_modes,
            rule="grow with the sequence"),
    mistake("causal_half", "attention counted over the causal triangle only: half of QK^T and PV",
            "flops_per_token", ATTENTION, ATTENTION.replace("4 *", "2 *"),
            flops_are_flop_counter_modes, rule="the whole T x T square"),
    mistake("kv_at_full_width", "k_proj and v_proj counted at hidden_size outputs, as without GQA",
            "flops_per_token", "2 * hidden * kv_width", "2 * hidden * hidden",
            flops_are_flop_counter_modes, rule="num_key_value_heads x head_dim"),
    mistake("all_experts", "every expert counted for every token, not the active ones", "flops_per_token",
            EXPERTS, EXPERTS.replace("num_experts_per_tok", "num_experts"),
            flops_are_flop_counter_modes, rule="only the active experts"),
    mistake("one_expert_per_token", "one expert per token whatever num_experts_per_tok", "flops_per_token",
            EXPERTS, EXPERTS.replace("config.num_experts_per_tok * ", ""),
            flops_are_flop_counter_modes, rule="only the active experts"),
    mistake("router_left_out", "the router's matmul left out", "flops_per_token",
            "hidden * config.num_experts + ", "", flops_are_flop_counter_modes,
            rule="the router is a matmul"),
    mistake("swiglu_two_matmuls", "the dense MLP counted as two matmuls (up and down), the gate left out",
            "flops_per_token", "3 * hidden * config.intermediate_size", "2 * hidden * config.intermediate_size",
            flops_are_flop_counter_modes, rule="3 matmuls of hidden_size x intermediate_size"),
    mistake("one_layer", "the layers' matmuls counted once, not per layer", "flops_per_token",
            "config.num_hidden_layers * (attention + mlp)", "(attention + mlp)",
            flops_are_flop_counter_modes, rule="every layer counts once"),
    mistake("backward_costs_one_forward", "training = 2x the forward: the backward costed like one forward",
            "flops_per_token", "3 * forward if training", "2 * forward if training",
            flops_are_flop_counter_modes, rule="the backward costs twice the forward"),
    mistake("experts_at_intermediate_size", "an expert's width taken as intermediate_size, not "
            "moe_intermediate_size", "flops_per_token", EXPERTS, EXPERTS.replace("moe_intermediate_size",
                                                                                  "intermediate_size"),
            flops_of_experts_of_their_own_width, rule="moe_intermediate_size"),
    mistake("flops_a_float", "the count as a float (true division somewhere)", "flops_per_token",
            "    return 3 * forward if training else forward\n",
            "    return float(3 * forward if training else forward)\n", flops_are_an_int_and_refuse_a_bad_seq_len),
    mistake("seq_len_unchecked", "seq_len 0 accepted (a sequence of no token costs nothing)", "flops_per_token",
            "    if not isinstance(seq_len, int) or seq_len < 1:\n        raise ValueError(f\"seq_len must be a "
            "positive int, got {seq_len!r}\")\n", "", flops_are_an_int_and_refuse_a_bad_seq_len),
    # ThroughputMeter (§5.2)
    mistake("clock_without_sync", "the clock read without synchronizing: on a GPU it times the launches",
            "ThroughputMeter._now", NOW, "        return self._clock()\n",
            meter_times_synchronized_steps_after_the_warm_up, rule="synchronize the device before each clock read"),
    mistake("sync_after_the_clock", "the clock read first, the device synchronized after it: each step is timed "
            "with the previous one's work", "ThroughputMeter._now", NOW,
            "        now = self._clock()\n        if self._synchronize is not None:\n            self._synchronize()\n"
            "        return now\n", meter_times_synchronized_steps_after_the_warm_up,
            rule="synchronize the device before each clock read"),
    mistake("warm_up_timed", "the warm-up steps (compile, first allocations) counted in the rate",
            "ThroughputMeter.step", "        if self._warmup_left:\n            self._warmup_left -= 1\n        else:\n"
            + MEASURED, MEASURED[4:], meter_times_synchronized_steps_after_the_warm_up,
            rule="the first warmup_steps steps are left out"),
    mistake("mean_of_step_rates", "the mean of per-step tokens/s, not total tokens over total time",
            "ThroughputMeter.tokens_per_second", RATE,
            "        return sum(tokens / seconds for tokens, seconds in self._steps) / len(self._steps)\n",
            meter_times_synchronized_steps_after_the_warm_up, rule="a ratio of sums"),
    mistake("every_step_since_the_warm_up", "the rate over every step since the warm-up, no window",
            "ThroughputMeter.__init__", "deque(maxlen=window)", "deque()",
            meter_times_synchronized_steps_after_the_warm_up, rule="over the last window steps"),
    mistake("creation_read_unsynced", "the clock read at the meter's creation without a sync: work queued "
            "before it (the model's copy to the device) is timed as the first step's", "ThroughputMeter.__init__",
            "        self._last_read = self._now()", "        self._last_read = clock()",
            meter_without_warm_up_and_a_window_of_one, rule="the one at the meter's creation too"),
    mistake("rate_of_zero_before_the_warm_up_ends", "0.0 before any step is measured, not None",
            "ThroughputMeter.tokens_per_second", "            return None\n", "            return 0.0\n",
            meter_times_synchronized_steps_after_the_warm_up, rule="None until a step after the warm-up"),
    mistake("window_unchecked", "window 0 accepted: the meter would never report", "ThroughputMeter.__init__",
            "        if not isinstance(window, int) or window < 1:\n", "        if not isinstance(window, int):\n",
            meter_reports_a_float_and_refuses_bad_arguments),
    mistake("negative_tokens_accepted", "a negative token count accepted", "ThroughputMeter.step",
            "not isinstance(tokens, int) or tokens < 0", "not isinstance(tokens, int)",
            meter_reports_a_float_and_refuses_bad_arguments),
    # mfu (§5.3)
    mistake("mfu_in_percent", "MFU as a percentage (36 for 36 %)", "mfu",
            "    return flops_per_token * tokens_per_second / peak_flops_per_second\n",
            "    return 100 * flops_per_token * tokens_per_second / peak_flops_per_second\n",
            mfu_is_the_achieved_fraction_of_the_peak, rule="a fraction (0.36 for 36 %)"),
    mistake("mfu_inverted", "the peak over the FLOP/s achieved", "mfu",
            "flops_per_token * tokens_per_second / peak_flops_per_second",
            "peak_flops_per_second / (flops_per_token * tokens_per_second)",
            mfu_is_the_achieved_fraction_of_the_peak, rule="over the peak FLOP/s"),
    mistake("peak_of_zero_accepted", "a peak of 0 divides by zero", "mfu",
            "    if not peak_flops_per_second > 0:\n", "    if peak_flops_per_second < 0:\n",
            mfu_is_a_float_and_refuses_a_peak_of_zero),
    # training_state_bytes (§5.4)
    mistake("tied_weight_twice", "a tied weight counted under each of its names (embedding and lm_head)",
            "training_state_bytes", "    params = list(model.parameters())",
            "    params = [p for _, p in model.named_parameters(remove_duplicate=False)]",
            state_bytes_are_the_tensors_nbytes_after_a_step, rule="a tied weight is stored once"),
    mistake("four_bytes_per_value", "every value taken as 4 bytes (fp32), whatever the tensor's dtype",
            "training_state_bytes", '"weights": sum(p.nbytes for p in params)',
            '"weights": sum(4 * p.numel() for p in params)', state_bytes_are_the_tensors_nbytes_after_a_step,
            rule="its own dtype's bytes"),
    mistake("adamw_one_moment", "AdamW with one moment per parameter", "training_state_bytes",
            "    state = MOMENTS[optimizer] * gradients\n", "    state = min(MOMENTS[optimizer], 1) * gradients\n",
            state_bytes_are_the_tensors_nbytes_after_a_step, rule="two moments"),
    mistake("adamw_step_count_left_out", "AdamW's step count tensors left out", "training_state_bytes",
            "        state += FLOAT32_BYTES * len(trained)", "        state += 0",
            state_bytes_are_the_tensors_nbytes_after_a_step, rule="a float32 scalar tensor (4 bytes) per parameter"),
    mistake("sgd_with_moments", "plain SGD given AdamW's two moments", "training_state_bytes",
            "    state = MOMENTS[optimizer] * gradients\n", "    state = 2 * gradients\n",
            state_bytes_are_the_tensors_nbytes_after_a_step, rule="plain SGD (no momentum) keeps no state"),
    mistake("frozen_parameters_trained", "a frozen parameter given a gradient and optimizer state",
            "training_state_bytes", "    trained = [p for p in params if p.requires_grad]\n", "    trained = params\n",
            state_bytes_of_a_partly_frozen_model, rule="a frozen parameter"),
    mistake("unknown_optimizer_as_sgd", "an unknown optimizer taken as plain SGD", "training_state_bytes",
            "    if optimizer not in MOMENTS:\n", "    if optimizer not in MOMENTS and False:\n",
            state_bytes_are_ints_and_refuse_an_unknown_optimizer),
    # activation_bytes (§5.4)
    mistake("one_sequence", "the bytes of one sequence, not of the batch", "activation_bytes", TOTAL,
            TOTAL.replace("batch_size * seq_len", "seq_len").replace("targets *", "(seq_len - 1) *"),
            activation_bytes_are_what_autograd_saves, rule="every one of the batch_size x seq_len tokens"),
    mistake("attention_matrix_saved", "the T x T attention probabilities counted, as the math kernel keeps them",
            "activation_bytes", "+ FLOAT32_BYTES * heads ", "+ FLOAT32_BYTES * heads + size * heads * seq_len ",
            activation_bytes_are_what_autograd_saves, rule="no T x T matrix is saved"),
    mistake("norms_at_the_models_dtype", "an RMSNorm's saved tensors at the model's dtype (it computes in float32)",
            "_norm_bytes", "    return FLOAT32_BYTES * (width + rows) + size * width\n",
            "    return size * (width + rows) + size * width\n", activation_bytes_are_what_autograd_saves,
            rule="compute in float32 whatever the model's dtype"),
    mistake("log_probs_left_out", "the loss's saved log-probabilities left out", "activation_bytes",
            "targets * (FLOAT32_BYTES * config.vocab_size + INT64_BYTES)", "targets * INT64_BYTES",
            activation_bytes_are_what_autograd_saves, rule="the loss saves its float32 log-probabilities"),
    mistake("log_probs_per_token", "the loss's log-probabilities counted for every token, not per target",
            "activation_bytes", "    targets = batch_size * (seq_len - 1)", "    targets = batch_size * seq_len",
            activation_bytes_are_what_autograd_saves, rule="seq_len - 1 targets per sequence"),
    mistake("logits_counted", "the logits counted beside the log-probabilities", "activation_bytes",
            "    per_token = INT64_BYTES + ", "    per_token = size * config.vocab_size + INT64_BYTES + ",
            activation_bytes_are_what_autograd_saves, rule="not the logits"),
    mistake("swiglu_two_tensors", "the SwiGLU's saved tensors counted as its two matmul inputs", "activation_bytes",
            "4 * size * config.intermediate_size", "2 * size * config.intermediate_size",
            activation_bytes_are_what_autograd_saves, rule="the SwiGLU saves four tensors"),
    mistake("kv_not_repeated", "k and v counted at num_key_value_heads heads", "activation_bytes",
            "3 * size * hidden + FLOAT32_BYTES", "size * (hidden + 2 * kv_heads * config.head_dim) + FLOAT32_BYTES",
            activation_bytes_are_what_autograd_saves, rule="k and v are repeated to every query head"),
    mistake("qk_norms_left_out", "the per-head q and k norms' saved tensors left out", "activation_bytes",
            Q_AND_K, "             + size * hidden   # q's rotated values\n",
            activation_bytes_are_what_autograd_saves, rule="the per-head q and k norms"),
    mistake("one_layer_of_activations", "one layer's activations, not every layer's", "activation_bytes",
            "config.num_hidden_layers * layer", "layer", activation_bytes_are_what_autograd_saves,
            rule="every layer saves its own"),
    mistake("moe_config_accepted", "a MoE config counted as if dense", "activation_bytes",
            "    if config.use_moe:\n", "    if config.use_moe and False:\n",
            activation_bytes_are_an_int_and_refuse_bad_arguments),
    # RunningLoss (§5.5)
    mistake("item_per_step", "add converts the loss to a Python float: a host sync every step",
            "RunningLoss.add", "        value = loss.detach().float()\n",
            "        value = torch.tensor(loss.item())\n", add_never_syncs_and_pop_mean_syncs_once,
            rule="no host sync"),
    mistake("copy_then_convert", "pop_mean copies to the host, then converts: two syncs", "RunningLoss.pop_mean",
            "        mean = (self._total / self._count).item()", "        mean = float((self._total / "
            "self._count).cpu())", add_never_syncs_and_pop_mean_syncs_once, rule="pop_mean makes one host sync"),
    mistake("graph_kept", "the loss summed without detach: the running sum keeps every step's graph",
            "RunningLoss.add", "loss.detach().float()", "loss.float()", add_lets_go_of_the_graph,
            rule="add detaches the loss"),
    mistake("never_reset", "pop_mean does not start the next interval: the mean since the first add",
            "RunningLoss.pop_mean", "        self._total, self._count = None, 0\n", "",
            pop_mean_is_the_mean_since_the_last_pop, rule="since the last pop_mean"),
    mistake("sum_at_the_loss_dtype", "the running sum kept at the loss's dtype (bf16 rounds each addition)",
            "RunningLoss.add", "loss.detach().float()", "loss.detach()", running_sum_of_bf16_losses_is_float32,
            rule="the running sum is float32"),
    mistake("empty_pop_divides_by_zero", "pop_mean with nothing added divides by zero", "RunningLoss.pop_mean",
            "        if not self._count:\n", "        if self._count < 0:\n", running_loss_conventions),
    # without_rope_sync (§10.1, optional)
    mistake("check_left_in_the_forward", "the tables checked, the forward still checking them every step",
            "without_rope_sync", "    inner.__class__ = MiniMindModel", "    pass",
            fixed_model_steps_without_a_sync),
    mistake("lost_tables_not_recomputed", "the check dropped without recomputing tables lost at init",
            "without_rope_sync", "    if inner.freqs_cos[0, 0] == 0:", "    if False:",
            fixed_model_recomputes_lost_tables),
]
EQUIVALENTS = [
    equivalent("training_multiplier", "forward x (3 or 1) is the same integer", "flops_per_token",
               "3 * forward if training else forward", "forward * (3 if training else 1)"),
    equivalent("rate_from_running_sums", "a rate over the window's sums kept in two lists is the same ratio",
               "ThroughputMeter.tokens_per_second", RATE,
               "        tokens, seconds = zip(*self._steps)\n        return sum(tokens) / sum(seconds)\n"),
    equivalent("element_size_times_numel", "numel x element_size is nbytes", "training_state_bytes",
               '"weights": sum(p.nbytes for p in params)', '"weights": sum(p.numel() * p.element_size() for p in '
               'params)'),
    equivalent("attention_output_copied", "the attention output and o_proj's input counted as two tensors (the "
               "kernel's layout makes them one storage): well within 5 %", "activation_bytes",
               "3 * size * hidden + FLOAT32_BYTES", "4 * size * hidden + FLOAT32_BYTES"),
    equivalent("int64_terms_left_out", "no int64 ids or targets: small terms, within 5 %", "activation_bytes",
               TOTAL, "    return batch_size * seq_len * (per_token - INT64_BYTES) + targets * FLOAT32_BYTES * "
               "config.vocab_size\n"),
    equivalent("float_of_the_item", "float() of a Python float converts nothing: still one sync",
               "RunningLoss.pop_mean", "        mean = (self._total / self._count).item()",
               "        mean = float((self._total / self._count).item())"),
]
