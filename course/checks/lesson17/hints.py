"""Lesson 17's hint ladder (``python -m course hint 17 EXERCISE``; the notebook names the command): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
    "assistant_labels": (
        "The loss must teach the model to answer, not to write the user's questions: find where each answer begins "
        "and ends in the ids, and keep only those ids as targets. What marks the beginning, and what marks the end, "
        "once the conversation is rendered with the chat template?",
        "course/minimind/sft.py: render_chat shows the markers (<|im_start|>assistant\\n before an answer, "
        "<|im_end|>\\n after it); SFTDataset.__init__ turns them into ids (assistant_markers) and sft_labels is "
        "upstream's generate_labels. Lesson 17 answers §1.2 list what it trains on, answers §3 walk through it.",
        "Scan the ids; where the whole assistant_start list occurs, a span opens at the id after it and runs through "
        "the first whole end list after it (those ids included), or to the sample's end when none follows; the "
        "search resumes after the span. Labels copy every id inside spans (unshifted; an id 0 there too: padding is "
        "never inside a span), -100 elsewhere.",
        "labels = [IGNORE_INDEX] * len(input_ids); position = 0; while position < len(input_ids): if "
        "input_ids[position:position + len(assistant_start)] != assistant_start: position += 1; continue; first = "
        "position + len(assistant_start); stop = the first i >= first with input_ids[i:i + len(end)] == end, plus "
        "len(end), else len(input_ids); labels[first:stop] = input_ids[first:stop]; position = stop.",
    ),
    "load_pretrained_weights": (
        "A weights file is a state dict. Loading it is exact only if it holds the model's keys, all of them and no "
        "other, at the model's shapes - and a file that does not fit must not leave the model half loaded.",
        "course/minimind/sft.py::load_weights_like_upstream is upstream's init_model: load_state_dict(strict=False), "
        "whose missing_keys and unexpected_keys upstream throws away (lesson 17 answers §1.3 shows what that hides). "
        "read_state_dict reads the file safely; model.state_dict() lists what the model needs.",
        "Compare the file's keys with model.state_dict()'s, and each tensor's whole shape, BEFORE loading; refuse with a "
        "ValueError naming the keys. Then load_state_dict copies each value into the model's own tensor (in place, "
        "cast to its dtype; not assign=True). Return the dict you read. (Hardening, optional, §5.5: name every bad "
        "key, an entry that is not a tensor is refused by name.)",
        "state_dict = read_state_dict(path); expected = model.state_dict(); missing = expected.keys() - "
        "state_dict.keys(); unexpected = state_dict.keys() - expected.keys(); misshapen = [k for k in the common "
        "keys if the file's value is not a tensor of expected[k].shape]; if any: raise ValueError(f'... {missing} "
        "{unexpected} {misshapen}'); model.load_state_dict(state_dict); return state_dict.",
    ),
    "update_normalization_units": (
        "Lesson 16's N, for SFT: the token mean of an update divides by the targets of the WHOLE update, and every "
        "micro-batch of that update must be told the same N before its backward.",
        "course/protocol/driver.py::run_text_training counts normalization_units for one global batch; lesson 16 "
        "§1.3 says what N counts (shifted targets, not -100). Here the micro-batches are already cut: K "
        "consecutive ones are one update.",
        "Count each micro-batch's labels[..., 1:] != -100; group the counts in windows of K from the first (the "
        "last window holds what remains); every micro-batch gets its window's sum, as a Python int.",
        "counts = [int((labels[..., 1:] != IGNORE_INDEX).sum()) for labels in labels_per_micro_batch]; units = []; "
        "for start in range(0, len(counts), accumulation_steps): window = counts[start:start + "
        "accumulation_steps]; units += [sum(window)] * len(window); return units.",
    ),
    "sft_epoch": (
        "The session already does token weighting (lesson 16): it needs, per micro-step, the step function that "
        "reports the micro-batch's tokens and the update's normalization units, and a signal on the update's last "
        "micro-batch. What does an update whose micro-batches hold no assistant token do to N?",
        "course/protocol/driver.py::run_text_training drives the session per update (TrainingStepOptions, "
        "force_update on the last micro-batch, token_weighted_step); lesson 17 answers §1.4 show what upstream's loss "
        "does with a batch whose samples were all cut before their answer.",
        "units = update_normalization_units(labels, K); per window of K micro-batches: if its units are 0, append "
        "None and train nothing; else train_step(batch, TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm, "
        "normalization_units=its units, force_update=(last of the window)), token_weighted_step) for each, and "
        "append the last report. (Lesson 16's session keeps an lr once given and clips with the closing "
        "micro-step's clip_grad_norm: passing both on every micro-step is the simple way to get each update right.)",
        "units = update_normalization_units([b.labels for b in micro_batches], accumulation_steps); reports = []; "
        "for start in range(0, len(micro_batches), accumulation_steps): window = micro_batches[start:start + "
        "accumulation_steps]; if units[start] == 0: reports.append(None); continue; for position, batch in "
        "enumerate(window): report = session.train_step(batch, TrainingStepOptions(lr=lr, clip_grad_norm="
        "clip_grad_norm, normalization_units=units[start], force_update=position == len(window) - 1), "
        "token_weighted_step); reports.append(report); return reports.",
    ),
    "test_assistant_labels_match_upstream": (
        "A test is only as strong as the wrong masks it rejects. List the ways a mask can go wrong (a turn missed, "
        "a marker trained, a truncated answer dropped, a sample without an answer trained on everything, a system "
        "prompt taken for an answer, the empty think block left out, a shift, every label moved one position) and "
        "choose a conversation under which each shows.",
        "course/runs/sft.py::sft_sample gives a conversation's ids and upstream's own labels (the oracle's "
        "sft_labels); lesson 17 answers §5.4's table of wrong masks says which conversations expose them.",
        "Several conversations: one with a system prompt and two or more assistant turns; one cut (max_length) in "
        "the middle of an answer; one cut before its answer. For each, assert assistant_labels(sample.input_ids, "
        "sample.assistant_start, sample.end) == sample.labels, the whole list. Let exceptions propagate.",
        "for messages, max_length in CASES: sample = sft_sample(messages, max_length); labels = "
        "assistant_labels(sample.input_ids, sample.assistant_start, sample.end); assert labels == sample.labels, "
        "f'{sample.prompt!r}: {labels} != {sample.labels}'.",
    ),
    "encode_sft_prompt": (
        "Upstream loses an answer when its first characters merge with the marker's newline into one token. At "
        "inference the prompt ends with the marker and the answer's tokens come after it: train on that split.",
        "course/minimind/sft.py::encode_prompt tokenizes the whole text at once; lesson 17 answers §1.2 and "
        "tests/test_upstream_sft_fixture.py's quirk test show the merged token (1925, '\\n ').",
        "Cut the prompt after each '<|im_start|>assistant\\n', tokenize the pieces one by one and join the ids; "
        "then cut to max_length, pad with the pad id and label with assistant_labels.",
        "marker = f'{tokenizer.bos_token}assistant\\n'; pieces = re.split(f'(?<={re.escape(marker)})', prompt); "
        "ids = [i for piece in pieces for i in tokenizer(piece, add_special_tokens=False).input_ids][:max_length]; "
        "ids += [tokenizer.pad_token_id] * (max_length - len(ids)); return ids, assistant_labels(ids, "
        "*assistant_markers(tokenizer)).",
    ),
}
