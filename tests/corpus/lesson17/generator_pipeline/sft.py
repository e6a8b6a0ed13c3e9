"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Read course/lessons/17_sft_loss_mask.md (Chinese: course/lessons/zh/17_sft_loss_mask.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 17``. The oracle is upstream
MiniMind's SFT data path, ``course/minimind/sft.py``; the session is lesson 16's ``TrainingSession``.

Written as generator pipelines: spans, windows, problems and test cases are all produced lazily and consumed
by the one place that needs them.
"""
from __future__ import annotations

import re  # noqa: F401 - the optional §5.6
from itertools import chain, islice, repeat, takewhile, zip_longest
from typing import Iterable, Iterator, TypeVar

import torch  # noqa: F401

from course.minimind import IGNORE_INDEX  # noqa: F401
from course.minimind.sft import assistant_markers, read_state_dict  # noqa: F401
from course.minimind.tokenizer import ByteTokenizer
from course.protocol.text import token_weighted_step  # noqa: F401
from course.protocol.types import TrainingStepOptions  # noqa: F401
# for your test (§5.4):
from course.runs.sft import sft_sample  # noqa: F401

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------- §5.1
def occurrences(ids: list[int], pattern: list[int], start: int = 0) -> Iterator[int]:
    """Every position >= ``start`` where all the ids of ``pattern`` stand in a row (overlaps included)."""
    width = len(pattern)
    return (position for position in range(start, len(ids) - width + 1) if ids[position:position + width] == pattern)


def assistant_spans(ids: list[int], assistant_start: list[int], end: list[int]) -> Iterator[tuple[int, int]]:
    """``(first, stop)`` of each assistant span, in order: from the id after a whole start marker through the
    first whole end marker after it (its ids included), or to the sample's last id when the cut removed it.
    The search for the next start resumes after that end marker."""
    resume = 0
    for marker in occurrences(ids, assistant_start):
        if marker < resume:          # a start marker inside the span just labelled: it opens nothing new
            continue
        first = marker + len(assistant_start)
        closing = next(occurrences(ids, end, first), len(ids))
        resume = closing + len(end)
        yield first, min(resume, len(ids))


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """TODO (lesson 17 §5.1): the labels that train one tokenized conversation on what the assistant says only.

    ``input_ids``: one sample, already cut to its length (and padded); ``assistant_start``: the ids of
    ``"<|im_start|>assistant\\n"``; ``end``: the ids of ``"<|im_end|>\\n"``. Returns a list as long as
    ``input_ids``: the id where the position is a target, -100 (``IGNORE_INDEX``) elsewhere, unshifted (the
    model's loss shifts), equal to upstream's ``SFTDataset`` labels token for token (lesson 17 §1.2).
    Example, start [1, 7], end [2, 9]: [1, 5, 2, 9, 1, 7, 6, 2, 9, 0] -> [-100] * 6 + [6, 2, 9, -100].
    """
    ids, assistant_start, end = list(input_ids), list(assistant_start), list(end)
    if not assistant_start or not end:
        raise ValueError(f"assistant_start ({assistant_start!r}) and end ({end!r}) must be non-empty id lists")
    targets = set(chain.from_iterable(range(first, stop) for first, stop in assistant_spans(ids, assistant_start, end)))
    return [token if position in targets else IGNORE_INDEX for position, token in enumerate(ids)]


# ---------------------------------------------------------------------------------------------------- §5.2
def misfits(file_state: dict, model_state: dict) -> Iterator[str]:
    """One line per key that keeps the file from fitting the model: missing, unexpected, not a tensor, or of
    another shape."""
    yield from (f"missing key {key!r}" for key in model_state if key not in file_state)
    yield from (f"unexpected key {key!r}" for key in file_state if key not in model_state)
    common = (key for key in file_state if key in model_state)
    for key in common:
        value = file_state[key]
        if not torch.is_tensor(value):
            yield f"key {key!r} holds a {type(value).__name__}, not a tensor"
        elif value.shape != model_state[key].shape:
            yield f"key {key!r} has shape {tuple(value.shape)}, the model's is {tuple(model_state[key].shape)}"


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """TODO (lesson 17 §5.2): start SFT from a pretraining weights file: load it into ``model``, exactly.

    ``path``: a weights file, ``model.state_dict()`` saved whole (fp32) or as upstream saves it (every entry
    ``.half()``); ``read_state_dict(path)`` reads one safely. ``model`` is changed in place and keeps its dtype;
    every key is accounted for: a file that does not fit the model is refused with an error naming the key,
    and the model stays as it was. Returns the file's state dict, as read.
    Example: load_pretrained_weights(fresh_model, "out/pretrain_48.pth") -> {"model.embed_tokens.weight": ...}.
    """
    state_dict = read_state_dict(path)
    problems = list(misfits(state_dict, model.state_dict()))
    if problems:
        raise ValueError(f"weights file {str(path)!r} does not fit the model (nothing loaded): " + "; ".join(problems))
    model.load_state_dict(state_dict)   # every key proven: copies into the model's own tensors, at its dtype
    return state_dict


# ---------------------------------------------------------------------------------------------------- §5.3
def windows(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive windows of ``size`` items, the last one possibly shorter."""
    iterator = iter(items)
    return iter(lambda: list(islice(iterator, size)), [])


def shifted_targets(labels) -> int:
    """The targets the model's shifted loss counts: ``labels[..., 1:] != -100``."""
    return int((torch.as_tensor(labels)[..., 1:] != IGNORE_INDEX).sum())


def check_accumulation_steps(accumulation_steps) -> None:
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """TODO (lesson 17 §5.3): per micro-batch, the normalization units of the update it belongs to.

    ``labels_per_micro_batch``: each micro-batch's labels ``[batch, seq]``, in training order; every
    ``accumulation_steps`` consecutive micro-batches form one update (the epoch's last one may hold fewer).
    Returns one int per micro-batch: the number of targets the update's token mean divides by (lesson 16 §1.3).
    Example, K = 2, micro-batches holding 3, 5 and 4 targets: [8, 8, 4].
    """
    check_accumulation_steps(accumulation_steps)
    counts = map(shifted_targets, labels_per_micro_batch)
    return list(chain.from_iterable(repeat(sum(window), len(window))
                                    for window in windows(counts, accumulation_steps)))


def update_steps(session, window: list, units: int, lr, clip_grad_norm) -> Iterator:
    """Each micro-step of one update, yielding its report; the window's last one closes the update."""
    last = len(window) - 1
    for number, batch in enumerate(window):
        options = TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm, normalization_units=units,
                                      force_update=number == last)
        yield session.train_step(batch, options, token_weighted_step)


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
    check_accumulation_steps(accumulation_steps)

    def updates() -> Iterator:
        for window in windows(micro_batches, accumulation_steps):
            units = sum(map(shifted_targets, (batch.labels for batch in window)))
            if units == 0:
                yield None          # N = 0: nothing to learn, and the session would refuse it
                continue
            *_, closing = update_steps(session, window, units, lr, clip_grad_norm)
            yield closing

    return list(updates())


# ---------------------------------------------------------------------------------------------------- §5.4
CONVERSATIONS = (
    ("one turn", [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Red."}]),
    ("a system prompt", [{"role": "system", "content": "You are a helpful AI assistant."},
                         {"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5."}]),
    ("three turns", [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A pear."},
                     {"role": "user", "content": "And a tree?"}, {"role": "assistant", "content": "An oak."}]),
    ("a system prompt and two users first", [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "One question."},
        {"role": "user", "content": "Which planet is red?"}, {"role": "assistant", "content": "Mars."},
        {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "You're welcome."}]),
    ("reasoning", [{"role": "user", "content": "Is 9 prime?"},
                   {"role": "assistant", "content": "No.", "reasoning_content": "9 = 3 * 3."},
                   {"role": "user", "content": "Is 7?"},
                   {"role": "assistant", "content": "<think>\nOnly 1 and 7 divide it.\n</think>\n\nYes."}]),
    ("chinese", [{"role": "user", "content": "你好，你是谁？"}, {"role": "assistant", "content": "我是一个小模型。"},
                 {"role": "user", "content": "再见。"}, {"role": "assistant", "content": "再见！"}]),
    ("an answer with leading spaces", [{"role": "user", "content": "Show a Python line that prints one."},
                                       {"role": "assistant", "content": "  print(1)"}]),
)
TOKENIZERS = (("upstream's tokenizer", None), ("a byte-level tokenizer", ByteTokenizer()))


def cut_points(sample, length: int) -> Iterator[tuple[str, int]]:
    """Where to cut a conversation: around each assistant marker, inside each answer, around each end marker."""
    ids, start, end = list(sample.input_ids[:length]), list(sample.assistant_start), list(sample.end)
    yield "its whole length", length
    for turn, (first, stop) in enumerate(assistant_spans(ids, start, end), 1):
        marker = first - len(start)
        yield from ((f"turn {turn}: {name}", cut) for name, cut in (
            ("inside its assistant marker", marker + 1),
            ("before its assistant marker's last id", first - 1),
            ("right after its assistant marker", first),
            ("one id into its answer", first + 1),
            ("inside its answer", first + 3),
            ("before its end marker", stop - len(end)),
            ("inside its end marker", stop - len(end) + 1),
            ("right after its end marker", stop),
        ) if 1 <= cut <= length)


def cases() -> Iterator[tuple[str, object]]:
    """(name, sample) of every conversation, tokenizer, think-block choice and cut."""
    for (conversation, messages), (tokenizer_name, tokenizer), removed in (
            (c, t, r) for c in CONVERSATIONS for t in TOKENIZERS for r in (False, True)):
        label = f"{conversation}, {tokenizer_name}, empty think blocks {'removed' if removed else 'kept'}"
        padded = sft_sample(messages, 512, tokenizer, empty_think_removed=removed)
        yield f"{label}, padded to 512", padded
        length = len(padded.input_ids) - sum(1 for _ in takewhile(lambda token: token == 0,
                                                                  reversed(padded.input_ids)))
        for name, cut in cut_points(padded, length):
            yield f"{label}, {name} (max_length {cut})", sft_sample(messages, cut, tokenizer,
                                                                    empty_think_removed=removed)


def first_difference(actual: list, expected: list) -> str:
    position = next((i for i, (a, e) in enumerate(zip_longest(actual, expected, fillvalue=None)) if a != e), None)
    return (f"first difference at position {position}: {actual[position:position + 8]!r} instead of "
            f"{expected[position:position + 8]!r}; expected {expected!r}, got {actual!r}")


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """TODO (lesson 17 §5.4): a test that ``assistant_labels`` gives upstream's labels, on conversations you choose.

    ``assistant_labels`` is the code under test (the contract of §5.1). Return nothing when it is right; raise
    ``AssertionError`` when it is wrong. ``sft_sample(messages, max_length)`` (imported above) renders, tokenizes
    and cuts a conversation and gives upstream's own labels for it. §5.4 says what the grader runs your test on.
    """
    for name, sample in cases():
        actual = assistant_labels(list(sample.input_ids), list(sample.assistant_start), list(sample.end))
        actual = actual.tolist() if torch.is_tensor(actual) else actual
        assert isinstance(actual, (list, tuple)), f"{name}: labels must be a list, got {type(actual).__name__}"
        actual, expected = list(actual), list(sample.labels)
        assert len(actual) == len(expected), f"{name}: {len(actual)} labels for {len(expected)} ids"
        assert actual == expected, f"{name}: {first_difference(actual, expected)}"


# ---------------------------------------------------------------------------------------------------- §5.6
def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
