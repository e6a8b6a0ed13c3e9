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
from course.minimind.tokenizer import ByteTokenizer


def ids_match_at(input_ids, position, pattern):
    """True when all the ids of ``pattern`` stand in ``input_ids`` from ``position`` on."""
    if len(pattern) == 0:
        return False
    if position + len(pattern) > len(input_ids):
        return False
    for offset in range(len(pattern)):
        if input_ids[position + offset] != pattern[offset]:
            return False
    return True


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """TODO (lesson 17 §5.1): the labels that train one tokenized conversation on what the assistant says only.

    ``input_ids``: one sample, already cut to its length (and padded); ``assistant_start``: the ids of
    ``"<|im_start|>assistant\\n"``; ``end``: the ids of ``"<|im_end|>\\n"``. Returns a list as long as
    ``input_ids``: the id where the position is a target, -100 (``IGNORE_INDEX``) elsewhere, unshifted (the
    model's loss shifts), equal to upstream's ``SFTDataset`` labels token for token (lesson 17 §1.2).
    Example, start [1, 7], end [2, 9]: [1, 5, 2, 9, 1, 7, 6, 2, 9, 0] -> [-100] * 6 + [6, 2, 9, -100].
    """
    input_ids = list(input_ids)
    assistant_start = list(assistant_start)
    end = list(end)
    if len(assistant_start) == 0:
        raise ValueError("assistant_start must hold at least one id")
    if len(end) == 0:
        raise ValueError("end must hold at least one id")

    labels = []
    for i in range(len(input_ids)):
        labels.append(IGNORE_INDEX)

    position = 0
    while position < len(input_ids):
        if not ids_match_at(input_ids, position, assistant_start):
            position = position + 1
            continue
        # a whole start marker stands at position: the span opens at the id after it
        span_start = position + len(assistant_start)
        # look for the first whole end marker after the start of the span
        end_position = len(input_ids)
        search = span_start
        while search < len(input_ids):
            if ids_match_at(input_ids, search, end):
                end_position = search
                break
            search = search + 1
        if end_position == len(input_ids):
            # no end marker: the truncation cut the span, it runs to the sample's last id
            span_stop = len(input_ids)
        else:
            # the end marker's ids are targets too
            span_stop = end_position + len(end)
        for i in range(span_start, span_stop):
            labels[i] = input_ids[i]
        # the search for the next start resumes after the end marker
        position = end_position + len(end)
    return labels


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """TODO (lesson 17 §5.2): start SFT from a pretraining weights file: load it into ``model``, exactly.

    ``path``: a weights file, ``model.state_dict()`` saved whole (fp32) or as upstream saves it (every entry
    ``.half()``); ``read_state_dict(path)`` reads one safely. ``model`` is changed in place and keeps its dtype;
    every key is accounted for: a file that does not fit the model is refused with an error naming the key,
    and the model stays as it was. Returns the file's state dict, as read.
    Example: load_pretrained_weights(fresh_model, "out/pretrain_48.pth") -> {"model.embed_tokens.weight": ...}.
    """
    state_dict = read_state_dict(path)
    model_state = model.state_dict()

    missing_keys = []
    for key in model_state:
        if key not in state_dict:
            missing_keys.append(key)

    unexpected_keys = []
    for key in state_dict:
        if key not in model_state:
            unexpected_keys.append(key)

    not_tensors = []
    for key in state_dict:
        if key in model_state:
            if not torch.is_tensor(state_dict[key]):
                not_tensors.append(key)

    wrong_shapes = []
    for key in state_dict:
        if key in model_state:
            if torch.is_tensor(state_dict[key]):
                if tuple(state_dict[key].shape) != tuple(model_state[key].shape):
                    wrong_shapes.append(key)

    problems = []
    if len(missing_keys) > 0:
        problems.append("missing keys " + ", ".join(repr(key) for key in missing_keys))
    if len(unexpected_keys) > 0:
        problems.append("unexpected keys " + ", ".join(repr(key) for key in unexpected_keys))
    if len(not_tensors) > 0:
        problems.append("entries that are not tensors " + ", ".join(
            repr(key) + " (" + type(state_dict[key]).__name__ + ")" for key in not_tensors))
    if len(wrong_shapes) > 0:
        problems.append("entries of another shape " + ", ".join(
            repr(key) + " (file " + str(tuple(state_dict[key].shape)) + ", model "
            + str(tuple(model_state[key].shape)) + ")" for key in wrong_shapes))
    if len(problems) > 0:
        raise ValueError("weights file " + repr(str(path)) + " does not fit the model, nothing was loaded: "
                         + "; ".join(problems))

    # Every key and shape was checked: the strict load copies each value into the model's own tensor,
    # cast to the model's dtype, and has nothing left to refuse.
    model.load_state_dict(state_dict)
    return state_dict


def count_shifted_targets(labels) -> int:
    """The targets the model's shifted loss counts in one micro-batch: ``labels[..., 1:] != -100``."""
    labels = torch.as_tensor(labels)
    return int((labels[..., 1:] != IGNORE_INDEX).sum().item())


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """TODO (lesson 17 §5.3): per micro-batch, the normalization units of the update it belongs to.

    ``labels_per_micro_batch``: each micro-batch's labels ``[batch, seq]``, in training order; every
    ``accumulation_steps`` consecutive micro-batches form one update (the epoch's last one may hold fewer).
    Returns one int per micro-batch: the number of targets the update's token mean divides by (lesson 16 §1.3).
    Example, K = 2, micro-batches holding 3, 5 and 4 targets: [8, 8, 4].
    """
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError("accumulation_steps must be an int >= 1, got " + repr(accumulation_steps))

    counts = []
    for labels in labels_per_micro_batch:
        counts.append(count_shifted_targets(labels))

    units = []
    window_start = 0
    while window_start < len(counts):
        window_stop = window_start + accumulation_steps
        if window_stop > len(counts):
            window_stop = len(counts)
        window_total = 0
        for i in range(window_start, window_stop):
            window_total = window_total + counts[i]
        for i in range(window_start, window_stop):
            units.append(int(window_total))
        window_start = window_stop
    return units


def sft_epoch(session, micro_batches: list, accumulation_steps: int, *, lr: float | None = None,
              clip_grad_norm: float = 0.0) -> list:
    """TODO (lesson 17 §5.3): train one SFT epoch on a lesson-16 ``TrainingSession``.

    ``micro_batches``: ``TextBatch``es (``course/protocol/text.py``) in training order; every
    ``accumulation_steps`` consecutive ones form one update, the last one possibly shorter. Each update's
    gradient must equal ONE backward of the token mean over all of its assistant tokens; ``lr`` and
    ``clip_grad_norm`` go to every micro-step (``TrainingStepOptions``). An update without any assistant token
    is not trained. Returns one entry per update: the ``TrainingStepReport`` that closed it, or None.
    Example, K = 2 and 5 micro-batches: 3 updates of 2, 2 and 1 micro-steps -> [report, report, report].
    """
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError("accumulation_steps must be an int >= 1, got " + repr(accumulation_steps))

    micro_batches = list(micro_batches)
    all_labels = []
    for batch in micro_batches:
        all_labels.append(batch.labels)
    units = update_normalization_units(all_labels, accumulation_steps)

    reports = []
    window_start = 0
    while window_start < len(micro_batches):
        window_stop = window_start + accumulation_steps
        if window_stop > len(micro_batches):
            window_stop = len(micro_batches)
        window_units = units[window_start]
        if window_units == 0:
            # no assistant token in the whole update: nothing to learn, N = 0 would divide by zero
            reports.append(None)
            window_start = window_stop
            continue
        closing_report = None
        for i in range(window_start, window_stop):
            is_last = i == window_stop - 1
            options = TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm,
                                          normalization_units=window_units, force_update=is_last)
            report = session.train_step(micro_batches[i], options, token_weighted_step)
            if is_last:
                closing_report = report
        reports.append(closing_report)
        window_start = window_stop
    return reports


def check_one_case(assistant_labels, name, sample):
    """Compare the implementation's labels of one sample with upstream's, exactly."""
    actual = assistant_labels(list(sample.input_ids), list(sample.assistant_start), list(sample.end))
    if torch.is_tensor(actual):
        actual = actual.tolist()
    assert isinstance(actual, (list, tuple)), (
        name + ": expected a list of labels, got " + type(actual).__name__)
    actual = list(actual)
    expected = list(sample.labels)
    assert len(actual) == len(expected), (
        name + ": " + str(len(actual)) + " labels for " + str(len(expected)) + " ids")
    for position in range(len(expected)):
        assert actual[position] == expected[position], (
            name + ": label " + str(position) + " is " + repr(actual[position]) + ", upstream's is "
            + repr(expected[position]) + " (ids " + repr(sample.input_ids) + ", expected labels "
            + repr(expected) + ", actual labels " + repr(actual) + ")")


def find_first(input_ids, pattern, start=0):
    """The first position >= start where all of ``pattern`` stands in ``input_ids``, or -1."""
    for position in range(start, len(input_ids)):
        if ids_match_at(input_ids, position, pattern):
            return position
    return -1


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """TODO (lesson 17 §5.4): a test that ``assistant_labels`` gives upstream's labels, on conversations you choose.

    ``assistant_labels`` is the code under test (the contract of §5.1). Return nothing when it is right; raise
    ``AssertionError`` when it is wrong. ``sft_sample(messages, max_length)`` (imported above) renders, tokenizes
    and cuts a conversation and gives upstream's own labels for it. §5.4 says what the grader runs your test on.
    """
    one_turn = [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Red."},
    ]
    with_system = [
        {"role": "system", "content": "You are a helpful AI assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
    ]
    three_turns = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "An apple."},
        {"role": "user", "content": "And a vegetable?"},
        {"role": "assistant", "content": "A carrot."},
    ]
    two_users_first = [
        {"role": "user", "content": "I have a question."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."},
    ]
    with_reasoning = [
        {"role": "system", "content": "You are minimind."},
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "Yes.", "reasoning_content": "7 has no divisor but 1 and 7."},
        {"role": "user", "content": "Is 9 prime?"},
        {"role": "assistant", "content": "<think>\n9 = 3 * 3.\n</think>\n\nNo."},
    ]
    chinese = [
        {"role": "user", "content": "你好，请介绍一下你自己。"},
        {"role": "assistant", "content": "我是一个小巧的语言模型。"},
        {"role": "user", "content": "谢谢！"},
        {"role": "assistant", "content": "不客气。"},
    ]
    spaces_answer = [
        {"role": "user", "content": "Show a Python line that prints one."},
        {"role": "assistant", "content": "  print(1)"},
    ]
    conversations = [
        ("one turn", one_turn),
        ("a system prompt", with_system),
        ("three turns", three_turns),
        ("two user turns first", two_users_first),
        ("reasoning", with_reasoning),
        ("chinese", chinese),
        ("an answer that starts with spaces", spaces_answer),
    ]

    tokenizers = [("upstream's tokenizer", None), ("a byte-level tokenizer", ByteTokenizer())]

    for tokenizer_name, tokenizer in tokenizers:
        for conversation_name, messages in conversations:
            for removed in [False, True]:
                name = conversation_name + ", " + tokenizer_name
                if removed:
                    name = name + ", empty think blocks removed"
                else:
                    name = name + ", think blocks kept"

                # the whole conversation, with padding after it
                whole = sft_sample(messages, 512, tokenizer, empty_think_removed=removed)
                check_one_case(assistant_labels, name + ", whole and padded", whole)

                # the length of the conversation without padding, and where its first answer begins
                ids = list(whole.input_ids)
                length = len(ids)
                while length > 0 and ids[length - 1] == 0:
                    length = length - 1
                check_one_case(assistant_labels, name + ", exactly its length",
                               sft_sample(messages, length, tokenizer, empty_think_removed=removed))

                marker = find_first(ids, whole.assistant_start)
                if marker < 0:
                    continue   # the answer merged with the marker: no span at all, already compared
                answer = marker + len(whole.assistant_start)
                end_marker = find_first(ids, whole.end, answer)

                cuts = [
                    ("cut inside its assistant marker", marker + 1),
                    ("cut right before its assistant marker's last id", answer - 1),
                    ("cut right after its assistant marker", answer),
                    ("cut one id into its answer", answer + 1),
                    ("cut inside its answer", answer + 3),
                ]
                if end_marker >= 0:
                    cuts.append(("cut right before its end marker", end_marker))
                    cuts.append(("cut inside its end marker", end_marker + 1))
                    cuts.append(("cut right after its end marker", end_marker + len(whole.end)))
                    cuts.append(("cut one id after its end marker", end_marker + len(whole.end) + 1))
                # the last answer cut too, for conversations with several turns
                last_marker = marker
                next_marker = find_first(ids, whole.assistant_start, marker + 1)
                while next_marker >= 0:
                    last_marker = next_marker
                    next_marker = find_first(ids, whole.assistant_start, next_marker + 1)
                if last_marker != marker:
                    cuts.append(("cut inside its last answer", last_marker + len(whole.assistant_start) + 2))
                    cuts.append(("cut inside its last assistant marker", last_marker + 2))

                for cut_name, cut in cuts:
                    if cut < 1 or cut > length:
                        continue
                    sample = sft_sample(messages, cut, tokenizer, empty_think_removed=removed)
                    check_one_case(assistant_labels, name + ", " + cut_name + " (max_length " + str(cut) + ")",
                                   sample)


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
