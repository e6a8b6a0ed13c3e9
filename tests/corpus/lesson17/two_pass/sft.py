"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Read course/lessons/17_sft_loss_mask.md (Chinese: course/lessons/zh/17_sft_loss_mask.md), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check 17``. The oracle is upstream
MiniMind's SFT data path, ``course/minimind/sft.py``; the session is lesson 16's ``TrainingSession``.

Every function here works in two passes: first it computes everything it needs (the spans, the file's fit and
its cast values, the window totals, the test's cases), then it applies it, so the second pass has nothing left
to decide or to refuse.
"""
from __future__ import annotations

import re  # noqa: F401 - the optional §5.6

import torch  # noqa: F401

from course.minimind import IGNORE_INDEX  # noqa: F401
from course.minimind.sft import assistant_markers, read_state_dict  # noqa: F401
from course.minimind.tokenizer import ByteTokenizer
from course.protocol.text import token_weighted_step  # noqa: F401
from course.protocol.types import TrainingStepOptions  # noqa: F401
# for your test (§5.4):
from course.runs.sft import sft_sample  # noqa: F401


def _find(ids: list[int], pattern: list[int], start: int) -> int:
    """The first position >= ``start`` where the whole ``pattern`` stands in ``ids``; ``len(ids)`` if none."""
    width = len(pattern)
    for position in range(start, len(ids) - width + 1):
        if ids[position:position + width] == pattern:
            return position
    return len(ids)


def assistant_spans(ids: list[int], assistant_start: list[int], end: list[int]) -> list[tuple[int, int]]:
    """Pass 1 of the mask: ``[first, stop)`` of every assistant span. A span opens at the id after a whole start
    marker and closes after the first whole end marker that follows (its ids included), or at the sample's end;
    the next start is searched after that end marker."""
    spans = []
    position = _find(ids, assistant_start, 0)
    while position < len(ids):
        first = position + len(assistant_start)
        closing = _find(ids, end, first)
        spans.append((first, min(closing + len(end), len(ids))))
        position = _find(ids, assistant_start, closing + len(end))
    return spans


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
    spans = assistant_spans(ids, assistant_start, end)      # pass 1: where the targets are
    labels = [IGNORE_INDEX] * len(ids)                      # pass 2: copy the ids there
    for first, stop in spans:
        labels[first:stop] = ids[first:stop]
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
    targets = model.state_dict()   # the model's own tensors (detached views of its parameters and buffers)

    # Pass 1: validate every key, and prepare every value already cast to its target's dtype and device.
    missing = [key for key in targets if key not in state_dict]
    unexpected = [key for key in state_dict if key not in targets]
    not_tensors = [key for key in targets if key in state_dict and not torch.is_tensor(state_dict[key])]
    wrong_shape = [key for key in targets if key in state_dict and torch.is_tensor(state_dict[key])
                   and state_dict[key].shape != targets[key].shape]
    problems = ([f"missing {key!r}" for key in missing] + [f"unexpected {key!r}" for key in unexpected]
                + [f"{key!r} is a {type(state_dict[key]).__name__}, not a tensor" for key in not_tensors]
                + [f"{key!r} has shape {tuple(state_dict[key].shape)}, the model's {tuple(targets[key].shape)}"
                   for key in wrong_shape])
    if problems:
        raise ValueError(f"weights file {str(path)!r} does not fit the model, nothing loaded: {'; '.join(problems)}")
    prepared = {key: state_dict[key].detach().to(device=target.device, dtype=target.dtype)
                for key, target in targets.items()}

    # Pass 2: copy into the model's own tensors (a tied weight under both names gets the same value twice).
    with torch.no_grad():
        for key, target in targets.items():
            target.copy_(prepared[key])
    return state_dict


def _check_accumulation_steps(accumulation_steps) -> None:
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")


def _window_totals(counts: list[int], accumulation_steps: int) -> list[tuple[int, int, int]]:
    """Pass 1 of an epoch: ``(first, stop, units)`` of each window of K micro-batches (a short tail its own)."""
    return [(first, min(first + accumulation_steps, len(counts)),
             sum(counts[first:first + accumulation_steps])) for first in range(0, len(counts), accumulation_steps)]


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """TODO (lesson 17 §5.3): per micro-batch, the normalization units of the update it belongs to.

    ``labels_per_micro_batch``: each micro-batch's labels ``[batch, seq]``, in training order; every
    ``accumulation_steps`` consecutive micro-batches form one update (the epoch's last one may hold fewer).
    Returns one int per micro-batch: the number of targets the update's token mean divides by (lesson 16 §1.3).
    Example, K = 2, micro-batches holding 3, 5 and 4 targets: [8, 8, 4].
    """
    _check_accumulation_steps(accumulation_steps)
    counts = [int((torch.as_tensor(labels)[..., 1:] != IGNORE_INDEX).sum()) for labels in labels_per_micro_batch]
    units = []
    for first, stop, total in _window_totals(counts, accumulation_steps):
        units.extend([total] * (stop - first))
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
    _check_accumulation_steps(accumulation_steps)
    micro_batches = list(micro_batches)
    # Pass 1: every micro-batch's normalization units, before the first micro-step.
    units = update_normalization_units([batch.labels for batch in micro_batches], accumulation_steps)
    # Pass 2: one update per window; a window of 0 units never reaches the session.
    reports = []
    for first in range(0, len(micro_batches), accumulation_steps):
        window = range(first, min(first + accumulation_steps, len(micro_batches)))
        if units[first] == 0:
            reports.append(None)
            continue
        report = None
        for index in window:
            options = TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm, normalization_units=units[index],
                                          force_update=index == window[-1])
            report = session.train_step(micro_batches[index], options, token_weighted_step)
        reports.append(report)
    return reports


# §5.4: the conversations of the test. Each one is also cut at every position around its markers (below).
_TEST_CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Red."}],
    "a system prompt": [{"role": "system", "content": "You are minimind, a small but useful language model."},
                        {"role": "user", "content": "How many legs has a spider?"},
                        {"role": "assistant", "content": "Eight."}],
    "three turns after a system prompt": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Sky color?"}, {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Grass color?"}, {"role": "assistant", "content": "Green."},
        {"role": "user", "content": "Snow color?"}, {"role": "assistant", "content": "White."}],
    "two user turns in a row": [
        {"role": "user", "content": "Hello."}, {"role": "user", "content": "Add 2 and 2."},
        {"role": "assistant", "content": "4."}, {"role": "user", "content": "Times 3?"},
        {"role": "assistant", "content": "12."}],
    "a reasoning block": [
        {"role": "user", "content": "Is 15 prime?"},
        {"role": "assistant", "content": "No.", "reasoning_content": "15 = 3 * 5."},
        {"role": "user", "content": "And 13?"},
        {"role": "assistant", "content": "<think>\nNo divisor below its root.\n</think>\n\nYes."}],
    "Chinese": [{"role": "user", "content": "今天天气怎么样？"}, {"role": "assistant", "content": "今天晴朗。"},
                {"role": "user", "content": "谢谢。"}, {"role": "assistant", "content": "不客气！"}],
    "an answer that starts with two spaces": [
        {"role": "user", "content": "Show a Python line that prints one."},
        {"role": "assistant", "content": "  print(1)"}],
}


def _test_cases() -> list[tuple[str, object]]:
    """Pass 1 of the test: every (name, upstream sample) it compares: each conversation with upstream's and a
    byte-level tokenizer, its empty think blocks kept and removed, padded, and cut at every position from each
    assistant marker's first id through the id after its end marker (inside and right after the marker, inside
    the answer, inside and right after the end marker)."""
    cases = []
    for tokenizer_name, tokenizer in (("upstream's tokenizer", None), ("byte-level tokenizer", ByteTokenizer())):
        for conversation, messages in _TEST_CONVERSATIONS.items():
            for removed in (False, True):
                label = f"{conversation} ({tokenizer_name}, empty think blocks {'removed' if removed else 'kept'})"
                padded = sft_sample(messages, 1024, tokenizer, empty_think_removed=removed)
                cases.append((f"{label}, padded", padded))
                ids = list(padded.input_ids)
                length = len(ids)
                while length and ids[length - 1] == padded_pad_id(tokenizer):
                    length -= 1
                cuts = {length}
                for first, stop in assistant_spans(ids[:length], padded.assistant_start, padded.end):
                    marker = first - len(padded.assistant_start)
                    cuts.update(range(max(marker, 1), min(stop + 1, length) + 1))
                for cut in sorted(cuts):
                    cases.append((f"{label}, max_length {cut}",
                                  sft_sample(messages, cut, tokenizer, empty_think_removed=removed)))
    return cases


def padded_pad_id(tokenizer) -> int:
    """The pad id ``sft_sample`` pads with: the tokenizer's (upstream's and the byte-level one: 0)."""
    return 0 if tokenizer is None else tokenizer.pad_token_id


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """TODO (lesson 17 §5.4): a test that ``assistant_labels`` gives upstream's labels, on conversations you choose.

    ``assistant_labels`` is the code under test (the contract of §5.1). Return nothing when it is right; raise
    ``AssertionError`` when it is wrong. ``sft_sample(messages, max_length)`` (imported above) renders, tokenizes
    and cuts a conversation and gives upstream's own labels for it. §5.4 says what the grader runs your test on.
    """
    cases = _test_cases()
    # Pass 2: run the implementation on every case (its exceptions propagate: a crash fails the test), then
    # report every mismatch at once.
    mismatches = []
    for name, sample in cases:
        actual = assistant_labels(list(sample.input_ids), list(sample.assistant_start), list(sample.end))
        if torch.is_tensor(actual):
            actual = actual.tolist()
        if not isinstance(actual, (list, tuple)):
            mismatches.append(f"{name}: returned a {type(actual).__name__}, not a list of labels")
            continue
        actual, expected = list(actual), list(sample.labels)
        if actual != expected:
            differ = [i for i in range(max(len(actual), len(expected)))
                      if i >= len(actual) or i >= len(expected) or actual[i] != expected[i]]
            mismatches.append(f"{name}: {len(actual)} labels for {len(expected)} ids, positions {differ[:10]} "
                              f"differ; ids {list(sample.input_ids)}, expected {expected}, got {actual}")
    assert not mismatches, (f"{len(mismatches)} of {len(cases)} samples differ from upstream's labels; first: "
                            + "\n".join(mismatches[:3]))


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
