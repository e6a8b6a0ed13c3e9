"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Style: upstream-like. Each function keeps the shape of the upstream MiniMind code it stands for
(``dataset/lm_dataset.py::SFTDataset.generate_labels``, ``trainer/trainer_utils.py::init_model``'s load,
``trainer/train_full_sft.py::train_epoch``), with the lesson's fixes: labels on a sample already cut to its
length, a weights load that accounts for every key before it changes anything, and token-weighted updates
(normalised by the update's assistant tokens, an update without any not trained) instead of ``loss / K``.
"""
from __future__ import annotations

import re  # noqa: F401 - the optional §5.6

import torch  # noqa: F401

from course.minimind import IGNORE_INDEX  # noqa: F401
from course.minimind.sft import assistant_markers, read_state_dict  # noqa: F401
from course.protocol.text import token_weighted_step  # noqa: F401
from course.protocol.types import TrainingStepOptions  # noqa: F401
# for your test (§5.4):
from course.runs.sft import sft_sample  # noqa: F401


# ---------------------------------------------------------------------------------------------- §5.1
def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """Upstream's ``generate_labels`` on one sample already cut to its length (and padded).

    A span opens at the id after each whole ``assistant_start`` and runs through the first whole ``end`` after
    it (its ids included); without an end it runs to the last id. The search resumes after that end marker.
    Labels copy the ids inside spans and are -100 elsewhere, unshifted.
    """
    bos_id, eos_id = list(assistant_start), list(end)
    if not bos_id or not end:
        raise ValueError(f"assistant_start ({assistant_start!r}) and end ({end!r}) must be non-empty id lists")
    input_ids = list(input_ids)
    max_length = len(input_ids)   # the sample is already cut: upstream's min(..., max_length) is its length
    labels = [IGNORE_INDEX] * len(input_ids)
    i = 0
    while i < len(input_ids):
        if input_ids[i:i + len(bos_id)] == bos_id:
            start = i + len(bos_id)
            end_pos = start
            while end_pos < len(input_ids):
                if input_ids[end_pos:end_pos + len(eos_id)] == eos_id:
                    break
                end_pos += 1
            for j in range(start, min(end_pos + len(eos_id), max_length)):
                labels[j] = input_ids[j]
            i = end_pos + len(eos_id) if end_pos < len(input_ids) else len(input_ids)
        else:
            i += 1
    return labels


# ---------------------------------------------------------------------------------------------- §5.2
def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """``init_model``'s load, made exact: read the file, account for every key, then load it strictly.

    Every key of ``model.state_dict()`` must be in the file, the file must hold no other key, and each entry
    must be a tensor of the model's shape; otherwise a ``ValueError`` names every offending key and the model
    is not touched. Values are copied into the model's own tensors, cast to its dtype (fp16 -> fp32 is exact).
    Returns the file's state dict as read.
    """
    weights = read_state_dict(path)   # torch.load(path, map_location="cpu", weights_only=True), refused by path
    model_state = model.state_dict()
    missing = [key for key in model_state if key not in weights]
    unexpected = [key for key in weights if key not in model_state]
    not_tensors = [key for key in weights if key in model_state and not torch.is_tensor(weights[key])]
    mismatched = [f"{key} (file {tuple(weights[key].shape)}, model {tuple(model_state[key].shape)})"
                  for key in weights
                  if key in model_state and torch.is_tensor(weights[key])
                  and weights[key].shape != model_state[key].shape]
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if not_tensors:
        problems.append("entries that are not tensors: "
                        + ", ".join(f"{key} ({type(weights[key]).__name__})" for key in not_tensors))
    if mismatched:
        problems.append(f"shape mismatches: {', '.join(mismatched)}")
    if problems:
        raise ValueError(f"weights file {str(path)!r} does not fit the model, nothing loaded; "
                         + "; ".join(problems))
    # strict=True now cannot fail half-way: every key and shape was proven above. load_state_dict copies in
    # place (param.copy_), so the model keeps its dtype, its Parameter objects and the tied lm_head.
    model.load_state_dict(weights, strict=True)
    return weights


# ---------------------------------------------------------------------------------------------- §5.3
def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """Per micro-batch, the shifted targets (``labels[..., 1:] != -100``) of the whole update it belongs to:
    consecutive windows of ``accumulation_steps`` micro-batches, the epoch's last window possibly shorter."""
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")
    counts = [int((labels[..., 1:] != IGNORE_INDEX).sum()) for labels in labels_per_micro_batch]
    units = []
    for window_start in range(0, len(counts), accumulation_steps):
        window = counts[window_start:window_start + accumulation_steps]
        units.extend([sum(window)] * len(window))
    return units


def sft_epoch(session, micro_batches: list, accumulation_steps: int, *, lr: float | None = None,
              clip_grad_norm: float = 0.0) -> list:
    """``train_full_sft.py``'s ``train_epoch`` on lesson 16's session, token-weighted.

    Upstream backpropagates ``loss / accumulation_steps`` per micro-batch and steps every K micro-steps; here
    every micro-step of an update carries the update's assistant-token count as ``normalization_units`` (the
    session backpropagates S_k / N), the epoch's short tail closes with ``force_update``, and an update whose
    micro-batches hold no assistant token is not sent to the session (its entry is None).
    """
    micro_batches = list(micro_batches)
    units = update_normalization_units([batch.labels for batch in micro_batches], accumulation_steps)
    reports = []
    report = None
    for step, batch in enumerate(micro_batches, start=1):
        window_last = step % accumulation_steps == 0 or step == len(micro_batches)
        if units[step - 1] > 0:
            options = TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm,
                                          normalization_units=units[step - 1], force_update=window_last)
            report = session.train_step(batch, options, token_weighted_step)
        if window_last:
            reports.append(report if units[step - 1] > 0 else None)
            report = None
    return reports


# ---------------------------------------------------------------------------------------------- §5.4
def _occurrences(ids: list[int], pattern: list[int]) -> list[int]:
    return [i for i in range(len(ids) - len(pattern) + 1) if ids[i:i + len(pattern)] == pattern]


def _real_length(sample) -> int:
    """The number of ids before the padding (a rendered conversation ends with a newline, never the pad id)."""
    ids = sample.input_ids
    length = len(ids)
    while length and ids[length - 1] == 0:
        length -= 1
    return length


def _check(assistant_labels, name: str, sample) -> None:
    actual = assistant_labels(list(sample.input_ids), list(sample.assistant_start), list(sample.end))
    actual = list(actual)
    assert len(actual) == len(sample.labels), \
        f"{name}: {len(actual)} labels for {len(sample.input_ids)} ids"
    actual = [int(x) for x in actual]
    if actual != sample.labels:
        first = next(i for i, (a, b) in enumerate(zip(actual, sample.labels)) if a != b)
        raise AssertionError(f"{name}: labels differ from upstream's at position {first}: "
                             f"actual {actual[max(0, first - 4):first + 8]} expected "
                             f"{sample.labels[max(0, first - 4):first + 8]} (ids {sample.input_ids[max(0, first - 4):first + 8]})")


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """``assistant_labels`` gives upstream's labels (``sft_sample``) on conversations that expose each wrong
    mask: one turn, a system prompt, several turns (also not alternating, also after a system prompt), think
    blocks kept and removed, reasoning, Chinese, padding, and cuts inside and right after each assistant marker,
    inside each answer, inside and right after each end marker, with upstream's tokenizer and a byte-level one.
    """
    from course.minimind import ByteTokenizer

    long_answer = ("A training loop repeats one cycle. It reads a batch of text and turns it into token ids. "
                   "The model predicts the next token at every position, and the optimizer moves every weight.")
    conversations = {
        "one turn": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Red."}],
        "system prompt": [{"role": "system", "content": "You are a helpful AI assistant."},
                          {"role": "user", "content": "Name a primary color."},
                          {"role": "assistant", "content": "Red."}],
        "three turns": [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5."},
                        {"role": "user", "content": "And 4 + 4?"}, {"role": "assistant", "content": "8."},
                        {"role": "user", "content": "And 1 + 1?"}, {"role": "assistant", "content": "2, of course."}],
        "system and three turns": [
            {"role": "system", "content": "You are minimind, a small but useful language model."},
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."},
            {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "A pear."}],
        "two user turns first": [{"role": "user", "content": "I have a question."},
                                 {"role": "user", "content": "What is the capital of France?"},
                                 {"role": "assistant", "content": "Paris."},
                                 {"role": "user", "content": "Thanks."},
                                 {"role": "assistant", "content": "You are welcome."}],
        "reasoning": [{"role": "user", "content": "Is 7 prime?"},
                      {"role": "assistant", "reasoning_content": "7 has no divisor but 1 and 7.",
                       "content": "Yes."}],
        "think in content": [{"role": "user", "content": "Say hi."},
                             {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHi!"}],
        "chinese": [{"role": "user", "content": "你好，请介绍一下你自己。"},
                    {"role": "assistant", "content": "我是minimind，一个小巧但有用的语言模型。"}],
        "answer starting with two spaces": [{"role": "user", "content": "Show a Python line that prints one."},
                                            {"role": "assistant", "content": "  print(1)"}],
        "long answer": [{"role": "user", "content": "Explain what a training loop does."},
                        {"role": "assistant", "content": long_answer},
                        {"role": "user", "content": "Shorter?"},
                        {"role": "assistant", "content": "Batch, loss, gradient, step; repeat."}],
    }
    checked = 0
    for tokenizer_name, tokenizer in (("upstream's tokenizer", None), ("byte-level tokenizer", ByteTokenizer())):
        for removed in (False, True):
            for conversation_name, messages in conversations.items():
                where = (f"{conversation_name!r}, {tokenizer_name}, "
                         f"empty think block {'removed' if removed else 'kept'}")
                full = sft_sample(messages, 2048, tokenizer, empty_think_removed=removed)
                length = _real_length(full)
                # uncut, with padding after it
                _check(assistant_labels, f"{where}, max_length {length + 7} (padded)",
                       sft_sample(messages, length + 7, tokenizer, empty_think_removed=removed))
                checked += 1
                # cut around every assistant marker, inside every answer, around every end marker
                ids, start, end = full.input_ids[:length], full.assistant_start, full.end
                cuts = set()
                end_positions = _occurrences(ids, end)
                for marker in _occurrences(ids, start):
                    span_start = marker + len(start)
                    stop = next((e for e in end_positions if e >= span_start), length)
                    cuts.update({marker, marker + 1, marker + len(start) - 1, span_start, span_start + 1,
                                 (span_start + stop) // 2, stop - 1, stop, stop + 1, stop + len(end)})
                for cut in sorted(c for c in cuts if 1 <= c < length):
                    _check(assistant_labels, f"{where}, cut to max_length {cut}",
                           sft_sample(messages, cut, tokenizer, empty_think_removed=removed))
                    checked += 1
    assert checked > 0


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
