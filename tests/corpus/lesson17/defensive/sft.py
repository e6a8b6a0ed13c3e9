"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Read course/lessons/17_sft_loss_mask.md (Chinese: course/lessons/zh/17_sft_loss_mask.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 17``. The oracle is upstream
MiniMind's SFT data path, ``course/minimind/sft.py``; the session is lesson 16's ``TrainingSession``.

Every argument is checked before anything is computed or changed, and each error names the argument (and the
key, micro-batch or position) at fault: ``TypeError`` for a wrong kind of value, ``ValueError`` for a value out
of range or a file that does not fit.
"""
from __future__ import annotations

import numbers
import operator
import re  # noqa: F401 - the optional §5.6
from collections.abc import Sequence

import torch  # noqa: F401

from course.minimind import IGNORE_INDEX  # noqa: F401
from course.minimind.sft import assistant_markers, read_state_dict  # noqa: F401
from course.minimind.tokenizer import ByteTokenizer
from course.protocol.text import token_weighted_step  # noqa: F401
from course.protocol.types import TrainingStepOptions  # noqa: F401
# for your test (§5.4):
from course.runs.sft import sft_sample  # noqa: F401


# ------------------------------------------------------------------------------------------ argument checking

def _as_int(value, name: str) -> int:
    """``value`` as a Python int (any integer type: int, numpy or 0-dim torch integers), never a bool."""
    if isinstance(value, bool) or (torch.is_tensor(value) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None


def _id_list(ids, name: str, *, non_empty: bool) -> list[int]:
    """Token ids as a list of Python ints: a list or tuple of integers, or a 1-D integer tensor."""
    if torch.is_tensor(ids):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"{name} must be a 1-D integer tensor or a list of ints, got a {ids.dtype} tensor "
                            f"of shape {tuple(ids.shape)}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    result = [_as_int(token, f"{name}[{position}]") for position, token in enumerate(ids)]
    if non_empty and not result:
        raise ValueError(f"{name} must hold at least one token id (an empty marker would match everywhere)")
    return result


def _positive_int(value, name: str) -> int:
    value = _as_int(value, name)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _labels_tensor(labels, name: str) -> torch.Tensor:
    if not torch.is_tensor(labels):
        raise TypeError(f"{name} must be a tensor of labels [batch, seq], got {type(labels).__name__}")
    if labels.dim() < 1:
        raise ValueError(f"{name} must have a sequence dimension ([batch, seq]), got a 0-dim tensor")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (-100: no target), got dtype {labels.dtype}")
    return labels


# ----------------------------------------------------------------------------------------------- §5.1, the mask

def _starts_at(ids: list[int], position: int, pattern: list[int]) -> bool:
    """All of ``pattern`` stands in ``ids`` from ``position`` (a prefix cut by the sample's end does not)."""
    return ids[position:position + len(pattern)] == pattern


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """Lesson 17 §5.1: the labels that train one tokenized conversation on what the assistant says only.

    ``input_ids``: one sample, already cut to its length (and padded); ``assistant_start``: the ids of
    ``"<|im_start|>assistant\\n"``; ``end``: the ids of ``"<|im_end|>\\n"``. Returns a list as long as
    ``input_ids``: the id where the position is a target, -100 (``IGNORE_INDEX``) elsewhere, unshifted (the
    model's loss shifts), equal to upstream's ``SFTDataset`` labels token for token (lesson 17 §1.2).
    Example, start [1, 7], end [2, 9]: [1, 5, 2, 9, 1, 7, 6, 2, 9, 0] -> [-100] * 6 + [6, 2, 9, -100].

    A span opens at the id after a whole start marker and closes after the first whole end marker that follows
    (its ids are targets); one without an end marker runs to the sample's last id; the next start marker is
    searched after the end marker. A sample without a start marker has no target.
    """
    ids = _id_list(input_ids, "input_ids", non_empty=False)
    start = _id_list(assistant_start, "assistant_start", non_empty=True)
    end = _id_list(end, "end", non_empty=True)
    labels = [IGNORE_INDEX] * len(ids)
    position = 0
    while position < len(ids):
        if not _starts_at(ids, position, start):
            position += 1
            continue
        span_start = position + len(start)
        close = span_start
        while close < len(ids) and not _starts_at(ids, close, end):
            close += 1
        span_stop = min(close + len(end), len(ids))   # the end marker included; a cut span runs to the end
        labels[span_start:span_stop] = ids[span_start:span_stop]
        position = close + len(end)
    return labels


# -------------------------------------------------------------------------------------------- §5.2, the weights

def _fit_problems(expected: dict, found: dict) -> list[str]:
    """Each reason the file's ``found`` does not fit the model's ``expected`` state dict, naming its key."""
    problems = [f"missing key {key!r} (the model has it, the file does not)" for key in expected if key not in found]
    problems += [f"unexpected key {key!r} (the file has it, the model does not)" for key in found
                 if key not in expected]
    for key, target in expected.items():
        if key not in found:
            continue
        value = found[key]
        if not torch.is_tensor(value):
            problems.append(f"key {key!r} holds a {type(value).__name__}, not a tensor")
        elif tuple(value.shape) != tuple(target.shape):
            problems.append(f"key {key!r} has shape {tuple(value.shape)}, the model needs {tuple(target.shape)}")
        elif target.dtype.is_floating_point and not value.dtype.is_floating_point:
            problems.append(f"key {key!r} holds {value.dtype} values, the model needs floating point "
                            f"({target.dtype})")
    return problems


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """Lesson 17 §5.2: start SFT from a pretraining weights file: load it into ``model``, exactly.

    ``path``: a weights file, ``model.state_dict()`` saved whole (fp32) or as upstream saves it (every entry
    ``.half()``); ``read_state_dict(path)`` reads one safely. ``model`` is changed in place and keeps its dtype;
    every key is accounted for: a file that does not fit the model is refused with an error naming the key,
    and the model stays as it was. Returns the file's state dict, as read.
    Example: load_pretrained_weights(fresh_model, "out/pretrain_48.pth") -> {"model.embed_tokens.weight": ...}.

    All or nothing: the file is read and proven to fit (keys both ways, tensors, shapes), then every value is
    cast to its target's dtype, and only then copied into the model's own tensors (the optimizer's references and
    the tied ``lm_head`` stay valid). Refusals are ``ValueError``s naming every bad key (``read_state_dict``'s
    ``InputError`` for a path that is missing, unreadable or holds no dict).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    state_dict = read_state_dict(path)
    expected = model.state_dict()
    problems = _fit_problems(expected, state_dict)
    if problems:
        raise ValueError(f"weights file {str(path)!r} does not fit the model ({len(problems)} problem"
                         f"{'s' if len(problems) > 1 else ''}), nothing was loaded: " + "; ".join(problems))
    # prepare every value first (a cast can fail, e.g. out of memory), so that nothing is copied unless all is
    prepared = {key: state_dict[key].to(dtype=target.dtype) for key, target in expected.items()}
    with torch.no_grad():
        for key, target in expected.items():   # state_dict() tensors share storage with the parameters
            target.copy_(prepared[key])        # a tied weight gets its value under both names: the same one
    return state_dict


# ----------------------------------------------------------------------------------------------- §5.3, updates

def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """Lesson 17 §5.3: per micro-batch, the normalization units of the update it belongs to.

    ``labels_per_micro_batch``: each micro-batch's labels ``[batch, seq]``, in training order; every
    ``accumulation_steps`` consecutive micro-batches form one update (the epoch's last one may hold fewer).
    Returns one int per micro-batch: the number of targets the update's token mean divides by (lesson 16 §1.3).
    Example, K = 2, micro-batches holding 3, 5 and 4 targets: [8, 8, 4].
    """
    k = _positive_int(accumulation_steps, "accumulation_steps")
    if torch.is_tensor(labels_per_micro_batch) or isinstance(labels_per_micro_batch, (str, bytes)) \
            or not isinstance(labels_per_micro_batch, Sequence):
        raise TypeError("labels_per_micro_batch must be a list of label tensors, one per micro-batch, got "
                        f"{type(labels_per_micro_batch).__name__}")
    counts = []
    for number, labels in enumerate(labels_per_micro_batch):
        labels = _labels_tensor(labels, f"labels_per_micro_batch[{number}]")
        counts.append(int((labels[..., 1:] != IGNORE_INDEX).sum()))   # the model's loss shifts
    units = []
    for first in range(0, len(counts), k):
        window = counts[first:first + k]
        units.extend([sum(window)] * len(window))
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

    Everything is checked before the first micro-step, so a bad micro-batch late in the epoch cannot leave it
    half trained.
    """
    if not callable(getattr(session, "train_step", None)):
        raise TypeError(f"session must be a lesson-16 TrainingSession (with train_step), got "
                        f"{type(session).__name__}")
    k = _positive_int(accumulation_steps, "accumulation_steps")
    session_k = getattr(session, "accumulation_steps", None)
    if isinstance(session_k, int) and session_k < k:
        raise ValueError(f"accumulation_steps={k} exceeds the session's accumulation_steps={session_k}: the "
                         f"session would close each update after {session_k} micro-steps")
    if getattr(session, "microsteps_accumulated", 0):
        raise ValueError(f"session is inside an update ({session.microsteps_accumulated} micro-steps "
                         "accumulated): an epoch starts at an update boundary")
    if lr is not None:
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
            raise TypeError(f"lr must be a number or None, got {type(lr).__name__}")
        if not 0 <= lr < float("inf"):
            raise ValueError(f"lr must be a finite number >= 0 (None keeps the session's), got {lr}")
    if isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, numbers.Real):
        raise TypeError(f"clip_grad_norm must be a number, got {type(clip_grad_norm).__name__}")
    if not clip_grad_norm >= 0:
        raise ValueError(f"clip_grad_norm must be >= 0 (0: no clipping), got {clip_grad_norm}")
    if torch.is_tensor(micro_batches) or not isinstance(micro_batches, Sequence):
        raise TypeError(f"micro_batches must be a list of TextBatch, got {type(micro_batches).__name__}")
    for number, batch in enumerate(micro_batches):
        missing = [field for field in ("input_ids", "labels", "loss_units") if not hasattr(batch, field)]
        if missing:
            raise TypeError(f"micro_batches[{number}] must be a TextBatch, got {type(batch).__name__} "
                            f"without {', '.join(missing)}")
    units = update_normalization_units([batch.labels for batch in micro_batches], k)

    reports = []
    for first in range(0, len(micro_batches), k):
        window = micro_batches[first:first + k]
        normalization_units = units[first]
        if normalization_units == 0:
            reports.append(None)   # no assistant token: S / N = 0 / 0, nothing to learn; the session is not touched
            continue
        report = None
        for offset, batch in enumerate(window):
            options = TrainingStepOptions(lr=None if lr is None else float(lr), clip_grad_norm=float(clip_grad_norm),
                                          normalization_units=normalization_units,
                                          force_update=offset == len(window) - 1)   # closes a short tail too
            report = session.train_step(batch, options, token_weighted_step)
        reports.append(report)
    return reports


# ------------------------------------------------------------------------------------------------ §5.4, a test

_CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Red."}],
    "system prompt": [{"role": "system", "content": "You are a helpful AI assistant."},
                      {"role": "user", "content": "Name a fruit."},
                      {"role": "assistant", "content": "An apple, for example."}],
    "three turns": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."},
                    {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "That is 6."}],
    "system prompt, two turns": [{"role": "system", "content": "Answer briefly."},
                                 {"role": "user", "content": "Capital of France?"},
                                 {"role": "assistant", "content": "Paris."},
                                 {"role": "user", "content": "And of Italy?"},
                                 {"role": "assistant", "content": "Rome."}],
    "reasoning kept": [{"role": "user", "content": "Is 7 prime?"},
                       {"role": "assistant", "content": "Yes.", "reasoning_content": "Only 1 and 7 divide 7."}],
    "chinese": [{"role": "user", "content": "天空是什么颜色的？"}, {"role": "assistant", "content": "晴天时天空是蓝色的。"}],
    "answer starting with two spaces": [{"role": "user", "content": "Show a Python line that prints one."},
                                        {"role": "assistant", "content": "  print(1)"}],
}
_TRUNCATED = ("one turn", "system prompt", "three turns")
_WHOLE_LENGTH = 320   # every conversation above fits, with padding after it


def _truncations(messages: list[dict], tokenizer) -> dict[str, int]:
    """``max_length``s cutting the last assistant turn of ``messages``: inside its answer, one id before its end
    marker, inside its end marker, right after / inside / right before its assistant marker."""
    sample = sft_sample(messages, _WHOLE_LENGTH, tokenizer)
    ids, start, end = sample.input_ids, sample.assistant_start, sample.end
    markers = [i for i in range(len(ids)) if _starts_at(ids, i, start)]
    if not markers:
        raise RuntimeError(f"test setup: no assistant marker in {messages!r}")
    opens = markers[-1] + len(start)
    close = next((i for i in range(opens, len(ids)) if _starts_at(ids, i, end)), None)
    if close is None or close - opens < 3:
        raise RuntimeError(f"test setup: the last answer of {messages!r} is not whole and long enough")
    return {"inside the answer": (opens + close) // 2 + 1, "one id before the end marker": close,
            "inside the end marker": close + len(end) - 1, "right after the assistant marker": opens,
            "inside the assistant marker": opens - 1, "right before the assistant marker": markers[-1]}


def _assert_matches(assistant_labels, case: str, input_ids: list[int], start: list[int], end: list[int],
                    expected: list[int]) -> None:
    """``assistant_labels`` on copies of the inputs equals ``expected``, and leaves the inputs as they were."""
    ids_arg, start_arg, end_arg = list(input_ids), list(start), list(end)
    actual = assistant_labels(ids_arg, start_arg, end_arg)   # its errors are not caught: they fail the test
    assert isinstance(actual, (list, tuple)), f"{case}: expected a list of labels, got {type(actual).__name__}"
    actual = list(actual)
    assert len(actual) == len(expected), (f"{case}: {len(actual)} labels for {len(input_ids)} ids; expected "
                                          f"{len(expected)}")
    if actual != expected:
        first = next(t for t, (a, b) in enumerate(zip(actual, expected)) if a != b)
        window = slice(max(first - 5, 0), first + 8)
        raise AssertionError(f"{case}: labels differ from upstream's at position {first} of {len(expected)}\n"
                             f"  input_ids {input_ids[window]}\n  actual    {actual[window]}\n"
                             f"  expected  {expected[window]}")
    assert (ids_arg, start_arg, end_arg) == (list(input_ids), list(start), list(end)), \
        f"{case}: assistant_labels changed its arguments"


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """Lesson 17 §5.4: a test that ``assistant_labels`` gives upstream's labels, on conversations you choose.

    ``assistant_labels`` is the code under test (the contract of §5.1). Return nothing when it is right; raise
    ``AssertionError`` when it is wrong. ``sft_sample(messages, max_length)`` (imported above) renders, tokenizes
    and cuts a conversation and gives upstream's own labels for it. §5.4 says what the grader runs your test on.

    The expected labels are always upstream's (``sft_sample``), on upstream's tokenizer and the byte-level one:
    one and three turns, a system prompt (so the assistant's turns are not every second one), a reasoning block,
    Chinese, an answer starting with two spaces, each with think blocks kept and removed and padded; the last
    answer of three of them cut at six places (a cut span, one cut before its answer). Then hand-made id lists
    for the marker rules (a marker is all of its ids in a row).
    """
    if not callable(assistant_labels):
        raise TypeError(f"assistant_labels must be callable, got {type(assistant_labels).__name__}")
    for tokenizer, tokenizer_name in ((None, "upstream tokenizer"), (ByteTokenizer(), "byte-level tokenizer")):
        for name, messages in _CONVERSATIONS.items():
            for removed in (False, True):
                sample = sft_sample(messages, _WHOLE_LENGTH, tokenizer, empty_think_removed=removed)
                _assert_matches(assistant_labels, f"{name}, think blocks {'removed' if removed else 'kept'}, "
                                f"{tokenizer_name}", sample.input_ids, sample.assistant_start, sample.end,
                                sample.labels)
        for name in _TRUNCATED:
            for where, max_length in _truncations(_CONVERSATIONS[name], tokenizer).items():
                sample = sft_sample(_CONVERSATIONS[name], max_length, tokenizer)
                _assert_matches(assistant_labels, f"{name}, cut {where} (max_length {max_length}), "
                                f"{tokenizer_name}", sample.input_ids, sample.assistant_start, sample.end,
                                sample.labels)
    ignored = IGNORE_INDEX
    hand_made = [  # (case, input_ids, start, end, upstream's labels)
        ("the docstring's example", [1, 5, 2, 9, 1, 7, 6, 2, 9, 0], [1, 7], [2, 9], [ignored] * 6 + [6, 2, 9, ignored]),
        ("no start marker", [3, 1, 5, 2, 9, 0], [1, 7], [2, 9], [ignored] * 6),
        ("an end id alone ends nothing", [1, 7, 5, 2, 5, 2, 9, 4], [1, 7], [2, 9],
         [ignored, ignored, 5, 2, 5, 2, 9, ignored]),
        ("a span cut by the sample's end", [1, 7, 5, 6, 2], [1, 7], [2, 9], [ignored, ignored, 5, 6, 2]),
        ("two spans", [1, 7, 5, 2, 9, 8, 1, 7, 6, 2, 9], [1, 7], [2, 9],
         [ignored, ignored, 5, 2, 9, ignored, ignored, ignored, 6, 2, 9]),
    ]
    for case, input_ids, start, end, expected in hand_made:
        _assert_matches(assistant_labels, case, input_ids, start, end, expected)


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
