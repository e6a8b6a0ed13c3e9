"""Lesson 17's mistake catalogue: each wrong variant of a reference function FAILS the check named; each
equivalent PASSES every check (tests/test_mistakes.py proves both)."""
from __future__ import annotations

from ..catalogue import equivalent, mistake
from .checks import labels_cover_every_assistant_turn, labels_match_whole_markers, labels_of_a_truncated_conversation
from .extensions import encode_sft_prompt_is_upstreams_where_nothing_merges, \
    encode_sft_prompt_trains_an_answer_starting_with_spaces
from .test_writing import (mask_test_fails_a_mask_that_drops_id_0,
                           mask_test_fails_a_mask_that_ends_at_the_end_markers_first_id,
                           mask_test_fails_a_mask_that_writes_into_its_input,
                           mask_test_fails_a_mask_with_upstreams_marker_ids, mask_test_passes_correct_and_fails_wrong)
from .updates import (sft_epoch_closes_each_update_once, sft_epoch_options_carry_lr_and_clipping_every_micro_step,
                      sft_epoch_passes_lr_and_clipping, sft_epoch_sends_every_micro_batch_of_a_trained_update,
                      sft_epoch_update_is_one_backward_of_its_assistant_tokens, units_are_each_updates_shifted_targets,
                      units_are_python_ints, units_reject_a_bad_accumulation_steps)
from .weights import (load_names_a_bad_path, load_never_runs_code, load_refusal_is_a_value_error_naming_every_key,
                      loads_a_weights_file_exactly, loads_into_the_models_own_storage, refuses_a_file_that_does_not_fit)

SPAN_END = ('        resume = next((i + len(end) for i in range(first, len(input_ids)) '
            'if input_ids[i:i + len(end)] == end),\n                      len(input_ids))\n')
NO_END = "\n                      len(input_ids))"   # the span's stop when no end marker follows
LOAD = '    _validate_weights(path, state_dict, model.state_dict())\n    model.load_state_dict(state_dict)\n'
UNITS = '        units += [sum(window)] * len(window)\n'
OPTIONS = ('            options = TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm, '
           'normalization_units=units[start],\n')
FORCE = "                                          force_update=position == len(window) - 1)\n"
SKIP = ("        if units[start] == 0:   # nothing to learn; and N = 0 would divide by zero (upstream's loss is "
        "NaN)\n            reports.append(None)\n            continue\n")
STEP = "            report = session.train_step(batch, options, token_weighted_step)\n"
TEST_CALL = '        labels = assistant_labels(input_ids, sample.assistant_start, sample.end)\n'

MISTAKES = [
    # assistant_labels (§5.1)
    mistake("labels_the_marker", "a span starts at the assistant marker: <|im_start|>assistant\\n is trained on",
            "_spans", "        spans.append((first, resume))", "        spans.append((first - len(assistant_start), "
            "resume))", labels_cover_every_assistant_turn, rule="the assistant marker itself is no target"),
    mistake("end_marker_not_trained", "a span stops before <|im_end|>: the model never learns to end its turn",
            "_spans", "(i + len(end) for i in range(", "(i for i in range(", labels_cover_every_assistant_turn,
            rule="runs through its end marker"),
    mistake("first_turn_only", "only the first assistant turn is a span", "_spans",
            "        spans.append((first, resume))\n    return spans", "        return [(first, resume)]\n"
            "    return spans", labels_cover_every_assistant_turn, rule="every assistant turn is a span"),
    mistake("span_opens_at_any_turn", "a span opens after any <|im_start|> (its first id): user and system turns are "
            "trained on", "_spans",
            "input_ids[position:position + len(assistant_start)] != assistant_start:",
            "input_ids[position] != assistant_start[0]:", labels_cover_every_assistant_turn,
            rule="a span opens only after the whole assistant marker"),
    mistake("labels_shifted", "labels already shifted by one: the model's loss shifts them again", "assistant_labels",
            "        labels[first:stop] = input_ids[first:stop]", "        labels[first - 1:stop - 1] = "
            "input_ids[first:stop]", labels_cover_every_assistant_turn, rule="labels are unshifted"),
    mistake("drops_a_truncated_span", "a span without an end marker (cut by max_length) is left out", "_spans",
            SPAN_END + "        spans.append((first, resume))",
            SPAN_END.replace(NO_END, NO_END.replace("len(input_ids)", "None")) + "        if resume is None:\n"
            "            break\n        spans.append((first, resume))", labels_of_a_truncated_conversation,
            rule="runs to the end of the sample"),
    mistake("truncated_span_one_short", "a span cut by max_length stops one id before the sample's end", "_spans",
            SPAN_END, SPAN_END.replace(NO_END, NO_END.replace("len(input_ids)", "len(input_ids) - 1")),
            labels_of_a_truncated_conversation,
            rule="runs to the end of the sample"),
    mistake("answerless_sample_trained_on_everything", "a sample without a target left is trained on all its ids, "
            "like pretraining", "assistant_labels", "    return labels\n",
            "    return labels if labels.count(IGNORE_INDEX) < len(labels) else list(input_ids)\n",
            labels_of_a_truncated_conversation, rule="no target at all"),
    mistake("end_marker_newline_not_trained", "a span stops after <|im_end|>, before the newline that ends the "
            "end marker", "_spans", "(i + len(end) for i in range(", "(i + len(end) - 1 for i in range(",
            labels_cover_every_assistant_turn, rule="the newline after <|im_end|> is a target"),
    mistake("pad_id_ends_the_span", "the search for the end marker also stops at id 0 (taken for padding): an "
            "answer holding <|endoftext|> is cut there", "_spans", "if input_ids[i:i + len(end)] == end)",
            "if input_ids[i:i + len(end)] == end or input_ids[i] == 0)", labels_cover_every_assistant_turn,
            rule="the pad id 0 included"),
    mistake("pad_id_never_a_target", "\"padding is never a target\": an id 0 inside a span is labelled -100",
            "assistant_labels", "        labels[first:stop] = input_ids[first:stop]",
            "        labels[first:stop] = [i if i != 0 else IGNORE_INDEX for i in input_ids[first:stop]]",
            labels_cover_every_assistant_turn, rule="the pad id 0 included"),
    mistake("padding_stripped_first", "trailing id 0s stripped as padding before the spans are found: a sample cut "
            "right after an answer's <|endoftext|> loses that target", "assistant_labels",
            "    for first, stop in _spans(input_ids, assistant_start, end):\n",
            "    unpadded = list(input_ids)\n    while unpadded and unpadded[-1] == 0:\n        unpadded.pop()\n"
            "    for first, stop in _spans(unpadded, assistant_start, end):\n", labels_of_a_truncated_conversation,
            rule="holds no padding"),
    mistake("masks_input_ids_in_place", "writes -100 into input_ids outside the spans and returns them: the right "
            "labels, but the sample's input ids are gone", "assistant_labels",
            "    labels = [IGNORE_INDEX] * len(input_ids)\n    for first, stop in _spans(input_ids, assistant_start, "
            "end):\n        labels[first:stop] = input_ids[first:stop]\n    return labels\n",
            "    inside = {i for first, stop in _spans(input_ids, assistant_start, end) for i in range(first, stop)}\n"
            "    for i in range(len(input_ids)):\n        if i not in inside:\n            input_ids[i] = IGNORE_INDEX\n"
            "    return input_ids\n", labels_cover_every_assistant_turn, rule="the arguments stay as they were"),
    mistake("upstreams_markers_hard_coded", "upstream's marker ids written into the function, whatever markers it "
            "is given (another tokenizer's are other ids)", "assistant_labels",
            "    for first, stop in _spans(input_ids, assistant_start, end):",
            "    for first, stop in _spans(input_ids, [1, 1388, 570, 811, 234], [2, 234]):",
            labels_cover_every_assistant_turn, rule="the markers are arguments"),
    mistake("end_matched_by_its_first_id", "a span ends at the end marker's first id, <|im_end|> alone",
            "_spans", "if input_ids[i:i + len(end)] == end)", "if input_ids[i] == end[0])",
            labels_match_whole_markers, rule="the whole end marker"),
    # load_pretrained_weights (§5.2)
    mistake("strict_false_like_upstream", "upstream's load_state_dict(strict=False): a missing or unexpected key is "
            "ignored", "load_pretrained_weights", LOAD, "    model.load_state_dict(state_dict, strict=False)\n",
            refuses_a_file_that_does_not_fit, rule="every key is accounted for"),
    mistake("loads_before_checking", "load_state_dict(strict=True) alone: it refuses a misfit only after copying "
            "whatever fits", "load_pretrained_weights", LOAD, "    model.load_state_dict(state_dict)\n",
            refuses_a_file_that_does_not_fit, rule="refuse before the model changes"),
    mistake("shapes_not_compared", "compares the keys but not the shapes: a wider model's file is half loaded before "
            "load_state_dict refuses it", "_validate_weights", "misshapen = sorted((expected.keys() & "
            "state_dict.keys()) - fits)", "misshapen = []", refuses_a_file_that_does_not_fit,
            rule="refuse before the model changes"),
    mistake("shapes_compared_by_numel", "compares each tensor's element count, not its shape: a transposed "
            "tensor passes, then load_state_dict refuses it after copying the rest", "_validate_weights",
            "value.shape == expected[name].shape", "value.numel() == expected[name].numel()",
            refuses_a_file_that_does_not_fit, rule="each whole shape"),
    mistake("shapes_compared_by_first_dim", "compares each tensor's first dimension only: a tensor with more columns "
            "passes, then load_state_dict refuses it after copying the rest", "_validate_weights",
            "value.shape == expected[name].shape", "value.shape[0] == expected[name].shape[0]",
            refuses_a_file_that_does_not_fit, rule="each whole shape"),
    mistake("copies_in_file_order", "copies the file's values into the model's tensors in order, not by name: a "
            "file whose keys come in another order is loaded into the wrong tensors", "load_pretrained_weights",
            "    model.load_state_dict(state_dict)\n",
            "    with torch.no_grad():\n        for tensor, value in zip(model.state_dict().values(), "
            "state_dict.values()):\n            tensor.copy_(value)\n", loads_a_weights_file_exactly,
            rule="of the same name"),
    mistake("model_cast_to_fp32", "the model is cast to fp32 before loading, so that the load is exact: a bf16 model "
            "comes back fp32", "load_pretrained_weights", "    model.load_state_dict(state_dict)\n",
            "    model.float().load_state_dict(state_dict)\n", loads_a_weights_file_exactly,
            rule="the model is never cast"),
    mistake("assign_replaces_parameters", "load_state_dict(assign=True): the file's tensors replace the model's "
            "parameters (fp16, untied)", "load_pretrained_weights", "    model.load_state_dict(state_dict)\n",
            "    model.load_state_dict(state_dict, assign=True)\n", loads_a_weights_file_exactly,
            rule="load in place"),
    mistake("model_cast_to_the_files_dtype", "the model is cast to the file's dtype: an fp16 file makes an fp16 "
            "model", "load_pretrained_weights", "    model.load_state_dict(state_dict)\n",
            "    model.to(next(iter(state_dict.values())).dtype).load_state_dict(state_dict)\n",
            loads_a_weights_file_exactly, rule="the model's dtype"),
    mistake("returns_the_models_state", "returns the model's state dict, not the file's as read",
            "load_pretrained_weights", "    return state_dict\n", "    return model.state_dict()\n",
            loads_a_weights_file_exactly, rule="the file's state dict as read"),
    # update_normalization_units (§5.3)
    mistake("units_per_micro_batch", "each micro-batch normalised by its own targets (the per-micro-batch mean)",
            "update_normalization_units", UNITS, "        units += window\n", units_are_each_updates_shifted_targets,
            rule="those of its whole update"),
    mistake("units_of_the_epoch", "every micro-batch normalised by the targets of the whole epoch",
            "update_normalization_units", UNITS, "        units += [sum(counts)] * len(window)\n",
            units_are_each_updates_shifted_targets, rule="its own update only"),
    mistake("units_count_unshifted", "counts labels != -100 without the shift: position 0 is never a target",
            "update_normalization_units", "(labels[..., 1:] != IGNORE_INDEX)", "(labels != IGNORE_INDEX)",
            units_are_each_updates_shifted_targets, rule="labels[..., 1:]"),
    mistake("units_count_masked_labels", "counts every shifted position, -100 included", "update_normalization_units",
            "int((labels[..., 1:] != IGNORE_INDEX).sum())", "labels[..., 1:].numel()",
            units_are_each_updates_shifted_targets, rule="not -100"),
    mistake("units_count_positive_ids", "counts the labels > 0 as targets: an answer's id 0 (<|endoftext|>) is "
            "left out", "update_normalization_units", "(labels[..., 1:] != IGNORE_INDEX)", "(labels[..., 1:] > 0)",
            units_are_each_updates_shifted_targets, rule="id 0 too"),
    mistake("units_drop_the_tail", "the epoch's short last window gets no units", "update_normalization_units",
            "    for start in range(0, len(counts), accumulation_steps):",
            "    for start in range(0, len(counts) - accumulation_steps + 1, accumulation_steps):",
            units_are_each_updates_shifted_targets, rule="the last window holds what remains"),
    # sft_epoch (§5.3)
    mistake("sft_mean_of_means", "each micro-batch's mean / K (lesson 14's loss / K): a micro-batch without targets "
            "makes the update NaN", "sft_epoch", OPTIONS + FORCE + STEP,
            "            from course.protocol.text import naive_mean_step\n" + OPTIONS.replace("units[start]",
            "len(window)") + FORCE + STEP.replace("token_weighted_step", "naive_mean_step"),
            sft_epoch_update_is_one_backward_of_its_assistant_tokens,
            rule="ONE token mean over all its assistant tokens"),
    mistake("sft_own_count", "each micro-batch normalised by its own assistant tokens, not the update's",
            "sft_epoch", OPTIONS, OPTIONS.replace("units[start]", "max(batch.loss_units, 1)"),
            sft_epoch_update_is_one_backward_of_its_assistant_tokens, rule="of the WHOLE update"),
    mistake("trains_an_update_without_targets", "an update without an assistant token is sent to the session "
            "(normalization_units 0: upstream's NaN loss)", "sft_epoch",
            SKIP, "", sft_epoch_closes_each_update_once,
            rule="an update without any assistant token is not trained"),
    mistake("update_without_targets_normalised_by_one", "an update without an assistant token is trained with "
            "normalization_units max(N, 1): a zero gradient, but an optimizer step all the same", "sft_epoch",
            SKIP + "        for position, batch in enumerate(window):\n" + OPTIONS,
            "        for position, batch in enumerate(window):\n" + OPTIONS.replace("units[start]",
                                                                                  "max(units[start], 1)"),
            sft_epoch_closes_each_update_once, rule="an update without any assistant token is not trained"),
    mistake("pops_the_micro_batches", "each window popped off the front of the caller's list: the epoch trains "
            "right, and leaves the caller's list empty", "sft_epoch",
            "    for start in range(0, len(micro_batches), accumulation_steps):\n"
            "        window = micro_batches[start:start + accumulation_steps]\n",
            "    for start in range(0, len(units), accumulation_steps):\n"
            "        window = [micro_batches.pop(0) for _ in range(min(accumulation_steps, len(micro_batches)))]\n",
            sft_epoch_update_is_one_backward_of_its_assistant_tokens,
            rule="leave the caller's micro-batches as they were"),
    mistake("tail_never_closed", "no force_update: the epoch's short last update never closes", "sft_epoch",
            "force_update=position == len(window) - 1)", "force_update=False)", sft_epoch_closes_each_update_once,
            rule="each closes once, on the last micro-batch it sends"),
    mistake("drops_the_short_last_update", "the epoch's short last update is dropped: its micro-batches never train",
            "sft_epoch", "for start in range(0, len(micro_batches), accumulation_steps):",
            "for start in range(0, len(micro_batches) - accumulation_steps + 1, accumulation_steps):",
            sft_epoch_closes_each_update_once, rule="every micro-batch that holds an assistant token goes to the session"),
    mistake("skipped_update_not_listed", "an update not trained has no entry: the result no longer lines up with "
            "the updates", "sft_epoch", "            reports.append(None)\n", "", sft_epoch_closes_each_update_once,
            rule="one entry per update"),
    mistake("lr_not_passed", "lr never reaches the session: the optimizer keeps its own", "sft_epoch",
            "TrainingStepOptions(lr=lr, ", "TrainingStepOptions(", sft_epoch_passes_lr_and_clipping,
            rule="each update steps at the lr sft_epoch got"),
    mistake("clipping_not_passed", "clip_grad_norm never reaches the session: no update is clipped", "sft_epoch",
            "clip_grad_norm=clip_grad_norm, ", "", sft_epoch_passes_lr_and_clipping,
            rule="clips with the clip_grad_norm of the micro-step that closes the update"),
    mistake("clipping_only_on_the_first_micro_step", "clip_grad_norm passed on an update's first micro-step only: "
            "the session clips with the closing micro-step's, 0.0", "sft_epoch", "clip_grad_norm=clip_grad_norm, ",
            "clip_grad_norm=clip_grad_norm if position == 0 else 0.0, ", sft_epoch_passes_lr_and_clipping,
            rule="clips with the clip_grad_norm of the micro-step that closes the update"),
    # test_assistant_labels_match_upstream (§5.4): the reference test, weakened
    mistake("test_one_turn_only", "the test's conversations keep one assistant turn each",
            "test_assistant_labels_match_upstream", "        sample = sft_sample(messages, max_length, tokenizer)\n",
            "        sample = sft_sample(messages[:3], max_length, tokenizer)\n", mask_test_passes_correct_and_fails_wrong,
            rule="two or more turns"),
    mistake("test_without_a_system_prompt", "the test's conversations all open with the user",
            "test_assistant_labels_match_upstream", "        sample = sft_sample(messages, max_length, tokenizer)\n",
            '        sample = sft_sample([m for m in messages if m["role"] != "system"], max_length, tokenizer)\n',
            mask_test_passes_correct_and_fails_wrong, rule="put a system prompt first"),
    mistake("test_think_blocks_removed", "every conversation of the test has its empty think blocks removed",
            "test_assistant_labels_match_upstream", "        sample = sft_sample(messages, max_length, tokenizer)\n",
            "        sample = sft_sample(messages, max_length, tokenizer, empty_think_removed=True)\n",
            mask_test_passes_correct_and_fails_wrong, rule="keep the empty think blocks"),
    mistake("test_never_cuts_an_answer", "no conversation of the test is cut inside an answer",
            "test_assistant_labels_match_upstream", "    for messages, max_length, tokenizer in MASK_TEST_CASES:",
            "    for messages, max_length, tokenizer in MASK_TEST_CASES[:1]:", mask_test_passes_correct_and_fails_wrong,
            rule="cut one there"),
    mistake("test_never_cuts_before_an_answer", "no conversation of the test is cut before its answer",
            "test_assistant_labels_match_upstream", "    for messages, max_length, tokenizer in MASK_TEST_CASES:",
            "    for messages, max_length, tokenizer in MASK_TEST_CASES[:2]:", mask_test_passes_correct_and_fails_wrong,
            rule="cut a conversation before its answer"),
    mistake("test_compares_positions_only", "the test compares where the labels are -100, not their values",
            "test_assistant_labels_match_upstream", "        assert labels == sample.labels,",
            "        assert [label == -100 for label in labels] == [label == -100 for label in sample.labels],",
            mask_test_passes_correct_and_fails_wrong, rule="compare the labels' values"),
    mistake("test_compares_target_values_only", "the test compares the targets' values in order, not where they "
            "are: a mask moved by one position passes", "test_assistant_labels_match_upstream",
            "        assert labels == sample.labels,",
            "        assert [label for label in labels if label != -100] == "
            "[label for label in sample.labels if label != -100],", mask_test_passes_correct_and_fails_wrong,
            rule="at its position"),
    mistake("test_swallows_errors", "the test catches the implementation's exceptions: a crashing one passes",
            "test_assistant_labels_match_upstream", TEST_CALL,
            "        try:\n    " + TEST_CALL + "        except Exception:\n            return\n",
            mask_test_passes_correct_and_fails_wrong, rule="let the implementation's exceptions propagate"),
    mistake("test_asserts_nothing", "the test compares nothing", "test_assistant_labels_match_upstream",
            "        assert labels == sample.labels,", "        assert True or labels == sample.labels,",
            mask_test_passes_correct_and_fails_wrong, rule="passes every implementation"),
    # hardening (§5.5)
    mistake("test_without_id_0_in_an_answer", "no answer of the test holds id 0 (the text <|endoftext|>)",
            "test_assistant_labels_match_upstream", "    for messages, max_length, tokenizer in MASK_TEST_CASES:",
            "    for messages, max_length, tokenizer in MASK_TEST_CASES[:3]:", mask_test_fails_a_mask_that_drops_id_0),
    mistake("test_no_end_marker_inside_an_answer", "no answer of the test holds the text <|im_end|> of its own",
            "test_assistant_labels_match_upstream", "        sample = sft_sample(messages, max_length, tokenizer)\n",
            '        sample = sft_sample([{**m, "content": m["content"].replace("<|im_end|>", "")} for m in messages],\n'
            "                            max_length, tokenizer)\n",
            mask_test_fails_a_mask_that_ends_at_the_end_markers_first_id),
    mistake("test_ignores_the_arguments_afterwards", "the test never looks at the input_ids it passed after the "
            "call: an implementation that writes into them passes", "test_assistant_labels_match_upstream",
            "        if input_ids != sample.input_ids:", "        if False:", mask_test_fails_a_mask_that_writes_into_its_input),
    mistake("test_upstream_tokenizer_only", "every conversation of the test is tokenized with upstream's tokenizer",
            "test_assistant_labels_match_upstream", "    for messages, max_length, tokenizer in MASK_TEST_CASES:",
            "    for messages, max_length, tokenizer in MASK_TEST_CASES[:4]:",
            mask_test_fails_a_mask_with_upstreams_marker_ids),
    mistake("lr_only_on_the_first_micro_step", "lr passed on an update's first micro-step only (the same effect "
            "on lesson 16's session, which keeps it; the convention is every micro-step)", "sft_epoch",
            "TrainingStepOptions(lr=lr, ", "TrainingStepOptions(lr=lr if position == 0 else None, ",
            sft_epoch_options_carry_lr_and_clipping_every_micro_step),
    mistake("clipping_only_on_the_closing_micro_step", "clip_grad_norm passed on an update's closing micro-step only "
            "(the same effect on lesson 16's session, which clips with it; the convention is every micro-step)",
            "sft_epoch", "clip_grad_norm=clip_grad_norm, ",
            "clip_grad_norm=clip_grad_norm if position == len(window) - 1 else 0.0, ",
            sft_epoch_options_carry_lr_and_clipping_every_micro_step),
    mistake("skips_micro_batches_without_targets", "a trained update leaves out its micro-batches without an "
            "assistant token (no gradient lost; the update is no longer the K micro-batches the run cut)", "sft_epoch",
            "        for position, batch in enumerate(window):\n",
            "        window = [batch for batch in window if batch.loss_units]\n"
            "        for position, batch in enumerate(window):\n",
            sft_epoch_sends_every_micro_batch_of_a_trained_update),
    mistake("units_are_tensors", "each count a 0-dim tensor, not a Python int", "update_normalization_units",
            "int((labels[..., 1:] != IGNORE_INDEX).sum())", "(labels[..., 1:] != IGNORE_INDEX).sum()",
            units_are_python_ints),
    mistake("accepts_zero_accumulation_steps", "accumulation_steps 0 accepted (range() then raises its own error)",
            "update_normalization_units", "    if accumulation_steps < 1:", "    if accumulation_steps < 0:",
            units_reject_a_bad_accumulation_steps),
    mistake("rebinds_param_data", "each parameter's .data rebound to the file's tensor cast to the model's dtype: the "
            "same Parameter objects, new storage", "load_pretrained_weights", "    model.load_state_dict(state_dict)\n",
            "    with torch.no_grad():\n"
            "        for name, param in model.named_parameters():\n"
            "            param.data = state_dict[name].to(param.dtype).clone()\n",
            loads_into_the_models_own_storage),
    mistake("names_only_the_first_bad_key", "the refusal names the first missing key only",
            "_validate_weights", "missing keys \"\n                         f\"{missing}", "missing keys \"\n"
            "                         f\"{missing[:1]}", load_refusal_is_a_value_error_naming_every_key),
    mistake("misfit_is_a_runtime_error", "a file that does not fit is a RuntimeError (torch's), not a ValueError",
            "_validate_weights", "        raise InputError(", "        raise RuntimeError(",
            load_refusal_is_a_value_error_naming_every_key),
    mistake("non_tensor_entries_not_checked", "an entry that is not a tensor reaches .shape (AttributeError)",
            "_validate_weights", "isinstance(value, torch.Tensor) and name in expected and ",
            "name in expected and ", load_refusal_is_a_value_error_naming_every_key),
    mistake("reads_with_torch_load", "torch.load(path) itself: weights_only left to the library, a bad path "
            "torch's error", "load_pretrained_weights", "    state_dict = read_state_dict(path)\n",
            "    state_dict = torch.load(path, weights_only=False)\n", load_never_runs_code),
    mistake("unreadable_file_unnamed", "a file torch.load cannot read: torch's own error, without the path",
            "load_pretrained_weights", "    state_dict = read_state_dict(path)\n",
            "    state_dict = torch.load(path, weights_only=True)\n", load_names_a_bad_path),
    # the extension encode_sft_prompt (§5.6)
    mistake("tokenizes_the_whole_prompt", "the prompt tokenized in one piece: upstream's merge stays",
            "encode_sft_prompt", '    pieces = re.split(f"(?<={re.escape(marker)})", prompt)\n',
            "    pieces = [prompt]\n", encode_sft_prompt_trains_an_answer_starting_with_spaces),
    mistake("splits_before_the_marker", "the text is cut before each marker: the marker's newline still merges",
            "encode_sft_prompt", '(?<={re.escape(marker)})', '(?={re.escape(marker)})',
            encode_sft_prompt_trains_an_answer_starting_with_spaces),
    mistake("pads_with_eos", "padded with <|im_end|> instead of the pad id", "encode_sft_prompt",
            "[tokenizer.pad_token_id]", "[tokenizer.eos_token_id]",
            encode_sft_prompt_is_upstreams_where_nothing_merges),
]

EQUIVALENTS = [
    equivalent("resumes_after_the_marker", "the next start is searched from the id after the marker, not after the "
               "span: with markers that cannot overlap (every real tokenizer's), a start marker inside a span "
               "opens a span inside it, labelling nothing new", "_spans",
               "        spans.append((first, resume))", "        spans.append((first, resume))\n"
               "        resume = first"),
    equivalent("copies_every_tensor", "copy_ into every tensor of model.state_dict() is what load_state_dict does "
               "(tied names share one tensor)", "load_pretrained_weights", "    model.load_state_dict(state_dict)\n",
               "    with torch.no_grad():\n        for name, tensor in model.state_dict().items():\n"
               "            tensor.copy_(state_dict[name])\n"),
    equivalent("units_extended_per_entry", "one entry per micro-batch of the window, each its sum",
               "update_normalization_units", UNITS, "        units.extend(sum(window) for _ in window)\n"),
]
