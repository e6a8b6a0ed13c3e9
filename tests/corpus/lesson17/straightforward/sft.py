"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Read course/lessons/17_sft_loss_mask.md (Chinese: course/lessons/zh/17_sft_loss_mask.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 17``. The oracle is upstream
MiniMind's SFT data path, ``course/minimind/sft.py``; the session is lesson 16's ``TrainingSession``.
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


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """Lesson 17 §5.1: the labels that train one tokenized conversation on what the assistant says only.

    ``input_ids``: one sample, already cut to its length (and padded); ``assistant_start``: the ids of
    ``"<|im_start|>assistant\\n"``; ``end``: the ids of ``"<|im_end|>\\n"``. Returns a list as long as
    ``input_ids``: the id where the position is a target, -100 (``IGNORE_INDEX``) elsewhere, unshifted (the
    model's loss shifts), equal to upstream's ``SFTDataset`` labels token for token (lesson 17 §1.2).
    Example, start [1, 7], end [2, 9]: [1, 5, 2, 9, 1, 7, 6, 2, 9, 0] -> [-100] * 6 + [6, 2, 9, -100].
    """
    n = len(input_ids)
    labels = [IGNORE_INDEX] * n
    i = 0
    while i < n:
        # a start marker occurs only where all of its ids stand in a row
        if input_ids[i:i + len(assistant_start)] == assistant_start:
            span_start = i + len(assistant_start)
            # walk to the first whole end marker after the start marker (or the end of the sample)
            j = span_start
            while j < n and input_ids[j:j + len(end)] != end:
                j += 1
            span_stop = min(j + len(end), n)   # the end marker's ids are targets too
            for t in range(span_start, span_stop):
                labels[t] = input_ids[t]
            i = j + len(end)   # the next start is searched after the end marker
        else:
            i += 1
    return labels


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """Lesson 17 §5.2: start SFT from a pretraining weights file: load it into ``model``, exactly.

    ``path``: a weights file, ``model.state_dict()`` saved whole (fp32) or as upstream saves it (every entry
    ``.half()``); ``read_state_dict(path)`` reads one safely. ``model`` is changed in place and keeps its dtype;
    every key is accounted for: a file that does not fit the model is refused with an error naming the key,
    and the model stays as it was. Returns the file's state dict, as read.
    Example: load_pretrained_weights(fresh_model, "out/pretrain_48.pth") -> {"model.embed_tokens.weight": ...}.
    """
    state_dict = read_state_dict(path)
    expected = model.state_dict()
    problems = []
    for key in expected:
        if key not in state_dict:
            problems.append(f"missing key {key!r}")
    for key in state_dict:
        if key not in expected:
            problems.append(f"unexpected key {key!r}")
    for key in expected:
        if key in state_dict:
            value = state_dict[key]
            if not isinstance(value, torch.Tensor):
                problems.append(f"key {key!r} holds a {type(value).__name__}, not a tensor")
            elif value.shape != expected[key].shape:
                problems.append(f"key {key!r} has shape {tuple(value.shape)}, the model needs "
                                f"{tuple(expected[key].shape)}")
    if problems:
        raise ValueError(f"weights file {str(path)!r} does not fit the model: " + "; ".join(problems))
    # every key checked first, so the load below cannot stop half way; load_state_dict copies each value into
    # the model's own tensors, cast to their dtype (fp16 -> fp32 is exact)
    model.load_state_dict(state_dict)
    return state_dict


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """Lesson 17 §5.3: per micro-batch, the normalization units of the update it belongs to.

    ``labels_per_micro_batch``: each micro-batch's labels ``[batch, seq]``, in training order; every
    ``accumulation_steps`` consecutive micro-batches form one update (the epoch's last one may hold fewer).
    Returns one int per micro-batch: the number of targets the update's token mean divides by (lesson 16 §1.3).
    Example, K = 2, micro-batches holding 3, 5 and 4 targets: [8, 8, 4].
    """
    counts = []
    for labels in labels_per_micro_batch:
        counts.append(int((labels[..., 1:] != IGNORE_INDEX).sum()))
    units = []
    for start in range(0, len(counts), accumulation_steps):
        window = counts[start:start + accumulation_steps]
        total = sum(window)
        for _ in window:
            units.append(total)
    return units


def sft_epoch(session, micro_batches: list, accumulation_steps: int, *, lr: float | None = None,
              clip_grad_norm: float = 0.0) -> list:
    """Lesson 17 §5.3: train one SFT epoch on a lesson-16 ``TrainingSession``.

    ``micro_batches``: ``TextBatch``es (``course/protocol/text.py``) in training order; every
    ``accumulation_steps`` consecutive ones form one update, the last one possibly shorter. Each update's
    gradient must equal ONE backward of the token mean over all of its assistant tokens; ``lr`` and
    ``clip_grad_norm`` go to every micro-step (``TrainingStepOptions``). An update without any assistant token
    is not trained. Returns one entry per update: the ``TrainingStepReport`` that closed it, or None.
    Example, K = 2 and 5 micro-batches: 3 updates of 2, 2 and 1 micro-steps -> [report, report, report].
    """
    units = update_normalization_units([batch.labels for batch in micro_batches], accumulation_steps)
    reports = []
    for start in range(0, len(micro_batches), accumulation_steps):
        window = micro_batches[start:start + accumulation_steps]
        normalization_units = units[start]
        if normalization_units == 0:
            # no assistant token in the whole update: nothing to learn, and S / N would be 0 / 0
            reports.append(None)
            continue
        report = None
        for i, batch in enumerate(window):
            options = TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm,
                                          normalization_units=normalization_units,
                                          force_update=(i == len(window) - 1))
            report = session.train_step(batch, options, token_weighted_step)
        reports.append(report)
    return reports


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """Lesson 17 §5.4: a test that ``assistant_labels`` gives upstream's labels, on conversations you choose.

    ``assistant_labels`` is the code under test (the contract of §5.1). Return nothing when it is right; raise
    ``AssertionError`` when it is wrong. ``sft_sample(messages, max_length)`` (imported above) renders, tokenizes
    and cuts a conversation and gives upstream's own labels for it. §5.4 says what the grader runs your test on.
    """
    one_turn = [{"role": "user", "content": "Name a color."},
                {"role": "assistant", "content": "Red."}]
    with_system = [{"role": "system", "content": "You are a helpful AI assistant."},
                   {"role": "user", "content": "Name a fruit."},
                   {"role": "assistant", "content": "An apple."}]
    three_turns = [{"role": "user", "content": "Hi."},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "What is 2 + 2?"},
                   {"role": "assistant", "content": "It is 4."},
                   {"role": "user", "content": "And 3 + 3?"},
                   {"role": "assistant", "content": "It is 6."}]
    reasoning = [{"role": "user", "content": "Is 7 prime?"},
                 {"role": "assistant", "content": "Yes, 7 is prime.",
                  "reasoning_content": "7 has no divisor but 1 and 7."}]
    chinese = [{"role": "user", "content": "天空是什么颜色的？"},
               {"role": "assistant", "content": "晴天时天空是蓝色的。"}]
    code = [{"role": "user", "content": "Show a Python line that prints one."},
            {"role": "assistant", "content": "  print(1)"}]

    cases = []   # (name, messages, max_length, empty think blocks removed)
    for name, messages in [("one turn", one_turn), ("system prompt", with_system), ("three turns", three_turns),
                           ("reasoning", reasoning), ("chinese", chinese), ("two spaces", code)]:
        cases.append((name, messages, 256, False))
        cases.append((name + ", think removed", messages, 256, True))

    # truncated conversations: cut positions found from the untruncated sample's own labels
    for name, messages in [("one turn", one_turn), ("system prompt", with_system), ("three turns", three_turns)]:
        full = sft_sample(messages, 256)
        start = full.assistant_start
        end = full.end
        ids = full.input_ids
        # the last assistant marker, and the end marker after it
        marker = max(i for i in range(len(ids)) if ids[i:i + len(start)] == start)
        answer = marker + len(start)
        end_at = min(i for i in range(answer, len(ids)) if ids[i:i + len(end)] == end)
        cases.append((name + ", cut inside the answer", messages, answer + (end_at - answer) // 2 + 1, False))
        cases.append((name + ", cut one id before the answer's end marker", messages, end_at, False))
        cases.append((name + ", cut inside the end marker", messages, end_at + len(end) - 1, False))
        cases.append((name + ", cut right after the assistant marker", messages, answer, False))
        cases.append((name + ", cut inside the assistant marker", messages, answer - 2, False))
        cases.append((name + ", cut before the assistant marker", messages, marker, False))

    for name, messages, max_length, removed in cases:
        sample = sft_sample(messages, max_length, empty_think_removed=removed)
        actual = assistant_labels(list(sample.input_ids), list(sample.assistant_start), list(sample.end))
        assert actual is not None, f"{name}: assistant_labels returned None"
        actual = list(actual)
        assert actual == sample.labels, (f"{name} (max_length {max_length}): labels differ from upstream's\n"
                                         f"input_ids {sample.input_ids}\nactual    {actual}\n"
                                         f"expected  {sample.labels}")

    # the docstring's example, by hand
    actual = assistant_labels([1, 5, 2, 9, 1, 7, 6, 2, 9, 0], [1, 7], [2, 9])
    assert list(actual) == [-100] * 6 + [6, 2, 9, -100], f"docstring example: got {actual}"


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
