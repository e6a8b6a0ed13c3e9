"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Read course/lessons/17_sft_loss_mask.md (Chinese: course/lessons/zh/17_sft_loss_mask.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 17``. The oracle is upstream
MiniMind's SFT data path, ``course/minimind/sft.py``; the session is lesson 16's ``TrainingSession``.

Written as small pure helpers (finding a pattern, the spans of a sample, windows of K, the mismatches between a
file and a model) that the exercises compose.
"""
from __future__ import annotations

import re  # noqa: F401 - the optional §5.6
from typing import Iterator, Sequence

import torch  # noqa: F401

from course.minimind import IGNORE_INDEX  # noqa: F401
from course.minimind.sft import assistant_markers, read_state_dict  # noqa: F401
from course.minimind.tokenizer import ByteTokenizer
from course.protocol.text import token_weighted_step  # noqa: F401
from course.protocol.types import TrainingStepOptions  # noqa: F401
# for your test (§5.4):
from course.runs.sft import sft_sample  # noqa: F401


# ----------------------------------------------------------------------------------------------- §5.1, the mask

def _find(ids: Sequence[int], pattern: Sequence[int], start: int) -> int:
    """The first position >= ``start`` where all of ``pattern`` stands in ``ids``, else ``len(ids)``."""
    pattern = list(pattern)
    return next((i for i in range(start, len(ids)) if list(ids[i:i + len(pattern)]) == pattern), len(ids))


def _assistant_spans(ids: Sequence[int], start: Sequence[int], end: Sequence[int]) -> Iterator[range]:
    """The target positions of each assistant turn: from the id after a whole start marker through the first
    whole end marker after it (its ids included), or to the sample's end when the truncation cut it. The next
    start is searched after that end marker."""
    position = _find(ids, start, 0)
    while position < len(ids):
        opens = position + len(start)
        closes = _find(ids, end, opens)
        yield range(opens, min(closes + len(end), len(ids)))
        position = _find(ids, start, closes + len(end))


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """Lesson 17 §5.1: the labels that train one tokenized conversation on what the assistant says only.

    ``input_ids``: one sample, already cut to its length (and padded); ``assistant_start``: the ids of
    ``"<|im_start|>assistant\\n"``; ``end``: the ids of ``"<|im_end|>\\n"``. Returns a list as long as
    ``input_ids``: the id where the position is a target, -100 (``IGNORE_INDEX``) elsewhere, unshifted (the
    model's loss shifts), equal to upstream's ``SFTDataset`` labels token for token (lesson 17 §1.2).
    Example, start [1, 7], end [2, 9]: [1, 5, 2, 9, 1, 7, 6, 2, 9, 0] -> [-100] * 6 + [6, 2, 9, -100].
    """
    ids = list(input_ids)
    targets = {t for span in _assistant_spans(ids, assistant_start, end) for t in span}
    return [token if t in targets else IGNORE_INDEX for t, token in enumerate(ids)]


# -------------------------------------------------------------------------------------------- §5.2, the weights

def _mismatches(expected: dict, found: dict) -> list[str]:
    """Every way ``found`` (a file's state dict) fails to be ``expected`` (the model's): keys missing, keys
    unexpected, entries that are no tensor or have another shape; each description names its key."""
    missing = [f"missing {key!r}" for key in expected if key not in found]
    unexpected = [f"unexpected {key!r}" for key in found if key not in expected]
    not_tensors = [f"{key!r} is a {type(found[key]).__name__}, not a tensor"
                   for key in expected if key in found and not torch.is_tensor(found[key])]
    shapes = [f"{key!r} has shape {tuple(found[key].shape)}, the model's is {tuple(expected[key].shape)}"
              for key in expected if key in found and torch.is_tensor(found[key])
              and found[key].shape != expected[key].shape]
    return missing + unexpected + not_tensors + shapes


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """Lesson 17 §5.2: start SFT from a pretraining weights file: load it into ``model``, exactly.

    ``path``: a weights file, ``model.state_dict()`` saved whole (fp32) or as upstream saves it (every entry
    ``.half()``); ``read_state_dict(path)`` reads one safely. ``model`` is changed in place and keeps its dtype;
    every key is accounted for: a file that does not fit the model is refused with an error naming the key,
    and the model stays as it was. Returns the file's state dict, as read.
    Example: load_pretrained_weights(fresh_model, "out/pretrain_48.pth") -> {"model.embed_tokens.weight": ...}.
    """
    state_dict = read_state_dict(path)
    problems = _mismatches(model.state_dict(), state_dict)
    if problems:
        raise ValueError(f"weights file {str(path)!r} does not fit the model, nothing loaded: "
                         + "; ".join(problems))
    # proven to fit: the strict load copies every value into the model's own tensor, cast to its dtype
    model.load_state_dict(state_dict)
    return state_dict


# ----------------------------------------------------------------------------------------------- §5.3, updates

def _windows(items: Sequence, size: int) -> list:
    """``items`` cut into consecutive windows of ``size``, the last one possibly shorter."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def _shifted_targets(labels: torch.Tensor) -> int:
    """The targets the model's shifted loss sees: ``labels[..., 1:] != -100``, as a Python int."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """Lesson 17 §5.3: per micro-batch, the normalization units of the update it belongs to.

    ``labels_per_micro_batch``: each micro-batch's labels ``[batch, seq]``, in training order; every
    ``accumulation_steps`` consecutive micro-batches form one update (the epoch's last one may hold fewer).
    Returns one int per micro-batch: the number of targets the update's token mean divides by (lesson 16 §1.3).
    Example, K = 2, micro-batches holding 3, 5 and 4 targets: [8, 8, 4].
    """
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    counts = [_shifted_targets(labels) for labels in labels_per_micro_batch]
    return [sum(window) for window in _windows(counts, accumulation_steps) for _ in window]


def _train_update(session, window: Sequence, units: int, lr, clip_grad_norm: float):
    """One update on the session: every micro-batch of ``window`` with the update's units; the last closes it."""
    last = len(window) - 1
    reports = [session.train_step(batch, TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm,
                                                             normalization_units=units, force_update=i == last),
                                  token_weighted_step)
               for i, batch in enumerate(window)]
    return reports[-1]


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
    micro_batches = list(micro_batches)
    units = update_normalization_units([batch.labels for batch in micro_batches], accumulation_steps)
    return [_train_update(session, window, window_units[0], lr, clip_grad_norm) if window_units[0] else None
            for window, window_units in zip(_windows(micro_batches, accumulation_steps),
                                            _windows(units, accumulation_steps))]


# ------------------------------------------------------------------------------------------------ §5.4, a test

ONE_TURN = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Red."}]
SYSTEM_PROMPT = [{"role": "system", "content": "You are a helpful AI assistant."},
                 {"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple, say."}]
THREE_TURNS = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello! How can I help?"},
               {"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."},
               {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "That is 6."}]
TWO_USERS = [{"role": "user", "content": "Hello."}, {"role": "user", "content": "Are you there?"},
             {"role": "assistant", "content": "Yes, I am here."}]
REASONING = [{"role": "user", "content": "Is 7 prime?"},
             {"role": "assistant", "content": "Yes.", "reasoning_content": "Only 1 and 7 divide 7."}]
CHINESE = [{"role": "system", "content": "你是一个有用的助手。"}, {"role": "user", "content": "天空是什么颜色的？"},
           {"role": "assistant", "content": "晴天时是蓝色的。"}]
TWO_SPACES = [{"role": "user", "content": "Show a Python line that prints one."},
              {"role": "assistant", "content": "  print(1)"}]
CONVERSATIONS = {"one turn": ONE_TURN, "system prompt": SYSTEM_PROMPT, "three turns": THREE_TURNS,
                 "two user turns": TWO_USERS, "reasoning": REASONING, "chinese": CHINESE,
                 "answer starting with two spaces": TWO_SPACES}
TRUNCATED = ("one turn", "system prompt", "three turns")
FULL_LENGTH = 256


def _cuts(messages: list[dict], tokenizer) -> dict[str, int]:
    """``max_length``s that cut the LAST assistant turn of ``messages`` at telling places, found from the whole
    sample's ids: inside its answer, just before / inside its end marker, right after / inside / before its
    assistant marker."""
    sample = sft_sample(messages, FULL_LENGTH, tokenizer)
    ids, start, end = sample.input_ids, sample.assistant_start, sample.end
    marker = max(i for i in range(len(ids)) if ids[i:i + len(start)] == start)
    opens = marker + len(start)
    closes = _find(ids, end, opens)
    return {"inside the answer": (opens + closes) // 2 + 1, "just before the end marker": closes,
            "inside the end marker": closes + len(end) - 1, "right after the assistant marker": opens,
            "inside the assistant marker": opens - 1, "before the assistant marker": marker}


def _cases(tokenizer) -> list[tuple[str, list[dict], int, bool]]:
    """(name, messages, max_length, empty think blocks removed): every conversation whole, with its think
    blocks kept and removed, and the truncations of ``_cuts``."""
    whole = [(name, messages, FULL_LENGTH, removed) for name, messages in CONVERSATIONS.items()
             for removed in (False, True)]
    cut = [(f"{name}, cut {where}", CONVERSATIONS[name], length, removed) for name in TRUNCATED
           for removed in (False, True)
           for where, length in _cuts(CONVERSATIONS[name], tokenizer).items()]
    return whole + cut


def _check_sample(assistant_labels, name: str, sample) -> None:
    actual = assistant_labels(list(sample.input_ids), list(sample.assistant_start), list(sample.end))
    assert isinstance(actual, (list, tuple)), f"{name}: expected a list of labels, got {type(actual).__name__}"
    first = next((t for t, (a, b) in enumerate(zip(actual, sample.labels)) if a != b),
                 min(len(actual), len(sample.labels)))
    assert list(actual) == sample.labels, (
        f"{name}: labels differ from upstream's at position {first} (lengths {len(actual)} / {len(sample.labels)})"
        f"\n  input_ids {sample.input_ids[max(first - 4, 0):first + 8]}"
        f"\n  actual    {list(actual)[max(first - 4, 0):first + 8]}\n  expected  {sample.labels[max(first - 4, 0):first + 8]}")


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """Lesson 17 §5.4: a test that ``assistant_labels`` gives upstream's labels, on conversations you choose.

    ``assistant_labels`` is the code under test (the contract of §5.1). Return nothing when it is right; raise
    ``AssertionError`` when it is wrong. ``sft_sample(messages, max_length)`` (imported above) renders, tokenizes
    and cuts a conversation and gives upstream's own labels for it. §5.4 says what the grader runs your test on.

    Upstream's tokenizer (``sft_sample``'s default) and the byte-level one (11-id start marker); one turn, a
    system prompt, three turns, two user turns in a row, a reasoning block, Chinese, an answer that starts with
    two spaces; think blocks kept and removed; the last answer cut at six places; the docstring's example.
    Errors of the implementation are not caught: they fail the test.
    """
    for tokenizer in (None, ByteTokenizer()):
        for name, messages, max_length, removed in _cases(tokenizer):
            sample = sft_sample(messages, max_length, tokenizer, empty_think_removed=removed)
            _check_sample(assistant_labels, f"{name} (max_length {max_length}, think removed {removed}, "
                                            f"tokenizer {'upstream' if tokenizer is None else 'byte-level'})",
                          sample)
    actual = assistant_labels([1, 5, 2, 9, 1, 7, 6, 2, 9, 0], [1, 7], [2, 9])
    assert list(actual) == [-100] * 6 + [6, 2, 9, -100], f"the docstring's example: got {actual}"


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
