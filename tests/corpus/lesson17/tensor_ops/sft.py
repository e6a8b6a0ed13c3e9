"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Style: tensor operations. Markers are found for every position at once (``unfold`` windows compared with the
marker), spans are paired with their end markers by ``searchsorted``, and the mask is a cumulative sum of span
boundaries; counts and update windows are index arithmetic on tensors. Python loops remain only where the work
is sequential by nature: following the chain of spans (one step per assistant turn) and calling the session
once per micro-batch.
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


def _marker_positions(ids: torch.Tensor, marker: torch.Tensor) -> torch.Tensor:
    """Every position where all of ``marker``'s ids stand in a row (sorted, int64)."""
    if ids.numel() < marker.numel():
        return torch.empty(0, dtype=torch.long)
    windows = ids.unfold(0, marker.numel(), 1)                      # [T - L + 1, L]
    return (windows == marker).all(dim=1).nonzero().flatten()


def _span_mask(ids: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """Boolean [T]: True inside upstream's assistant spans."""
    length = ids.numel()
    starts = _marker_positions(ids, start)
    ends = _marker_positions(ids, end)
    span_starts = starts + start.numel()
    # the first end marker at or after each span start; none -> the span runs to the end
    # (searchsorted gives ends.numel() when none is left: that index picks the sample's length, appended)
    stops = torch.cat([ends, torch.tensor([length])])[torch.searchsorted(ends, span_starts)]
    resume = stops + end.numel()                                   # where the scan looks for the next start
    next_start = torch.searchsorted(starts, resume)                # index of the next start the scan meets
    # follow the chain from the first start: one step per span actually opened
    chosen = torch.zeros(starts.numel(), dtype=torch.bool)
    index = 0
    while index < starts.numel():
        chosen[index] = True
        index = int(next_start[index])
    lo = span_starts[chosen]
    hi = torch.clamp(stops[chosen] + end.numel(), max=length)
    boundaries = torch.zeros(length + 1, dtype=torch.long)
    boundaries.index_add_(0, lo, torch.ones_like(lo))
    boundaries.index_add_(0, hi, -torch.ones_like(hi))
    return boundaries.cumsum(0)[:length] > 0


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """Upstream's labels for one sample already cut to its length (and padded): the ids from the one after
    each whole assistant marker through the first whole end marker after it (to the sample's end when none
    follows), the scan resuming after that end marker; -100 elsewhere; unshifted."""
    if len(assistant_start) == 0 or len(end) == 0:
        raise ValueError(f"assistant_start ({assistant_start!r}) and end ({end!r}) must be non-empty id lists")
    ids = torch.as_tensor(list(input_ids), dtype=torch.long)
    mask = _span_mask(ids, torch.as_tensor(list(assistant_start), dtype=torch.long),
                      torch.as_tensor(list(end), dtype=torch.long))
    return torch.where(mask, ids, torch.full_like(ids, IGNORE_INDEX)).tolist()


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """Load a pretraining weights file (fp32, or upstream's fp16) into ``model`` in place, at its dtype.

    The file must hold exactly ``model.state_dict()``'s keys, each a tensor of the model's shape; otherwise a
    ``ValueError`` names every offending key before anything is written. The values are first converted to the
    targets' dtype and device (a failure there still changes nothing), then copied into the model's own tensors.
    Returns the file's state dict, as read.
    """
    file_state = read_state_dict(path)
    targets = model.state_dict()                     # detached views of the model's own parameters and buffers
    missing = sorted(targets.keys() - file_state.keys())
    unexpected = sorted(file_state.keys() - targets.keys())
    common = [key for key in targets if key in file_state]
    not_tensors = [key for key in common if not torch.is_tensor(file_state[key])]
    wrong_shape = [key for key in common if torch.is_tensor(file_state[key])
                   and file_state[key].shape != targets[key].shape]
    if missing or unexpected or not_tensors or wrong_shape:
        parts = [f"{label}: {', '.join(map(str, keys))}" for label, keys in (
            ("missing keys", missing), ("unexpected keys", unexpected),
            ("entries that are not tensors", not_tensors),
            ("shape mismatches", [f"{key} {tuple(file_state[key].shape)} vs model {tuple(targets[key].shape)}"
                                  for key in wrong_shape])) if keys]
        raise ValueError(f"weights file {str(path)!r} does not fit the model (nothing loaded): " + "; ".join(parts))
    sources = [file_state[key].to(dtype=targets[key].dtype, device=targets[key].device) for key in common]
    with torch.no_grad():
        for key, source in zip(common, sources):
            targets[key].copy_(source)
    return file_state


def _window_index(count: int, accumulation_steps: int) -> torch.Tensor:
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")
    return torch.arange(count).div(accumulation_steps, rounding_mode="floor")


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """Per micro-batch, its update's shifted targets: window sums of ``labels[..., 1:] != -100`` counts,
    broadcast back to every micro-batch of the window (the last window possibly shorter)."""
    window = _window_index(len(labels_per_micro_batch), accumulation_steps)
    if window.numel() == 0:
        return []
    counts = torch.stack([(labels[..., 1:] != IGNORE_INDEX).sum().cpu() for labels in labels_per_micro_batch])
    totals = torch.zeros(int(window[-1]) + 1, dtype=torch.long).index_add_(0, window, counts.long())
    return totals[window].tolist()


def sft_epoch(session, micro_batches: list, accumulation_steps: int, *, lr: float | None = None,
              clip_grad_norm: float = 0.0) -> list:
    """One SFT epoch on lesson 16's session: each window of ``accumulation_steps`` micro-batches is one
    token-weighted update (``normalization_units`` = its assistant targets, ``force_update`` on its last
    micro-batch so the short tail closes too); a window without any target is not trained (entry None)."""
    micro_batches = list(micro_batches)
    units = torch.tensor(update_normalization_units([batch.labels for batch in micro_batches],
                                                    accumulation_steps), dtype=torch.long)
    window = _window_index(len(micro_batches), accumulation_steps)
    closes = torch.ones(len(micro_batches), dtype=torch.bool)
    closes[:-1] = window[1:] != window[:-1]                       # the last micro-batch of each window
    reports = []
    for batch, n, last in zip(micro_batches, units.tolist(), closes.tolist()):
        report = None
        if n > 0:
            report = session.train_step(batch, TrainingStepOptions(
                lr=lr, clip_grad_norm=clip_grad_norm, normalization_units=n, force_update=last),
                token_weighted_step)
        if last:
            reports.append(report)
    return reports


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """``assistant_labels`` equals upstream's labels (from ``sft_sample``) on conversations chosen so that each
    wrong mask shows: several assistant turns (after a system prompt too, and after two user turns), think
    blocks kept and removed, reasoning, Chinese, an answer starting with spaces, padding, and cuts just before,
    inside and right after each assistant marker, inside each answer and inside/after each end marker, with
    upstream's tokenizer and a byte-level one. Raises ``AssertionError`` on the first difference."""
    from course.minimind import ByteTokenizer

    def user(text):
        return {"role": "user", "content": text}

    def assistant(text, reasoning=None):
        message = {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return message

    conversations = [
        [user("Name a color."), assistant("Red.")],
        [{"role": "system", "content": "You are a helpful AI assistant."}, user("Name a primary color."),
         assistant("Red.")],
        [user("What is 2 + 3?"), assistant("5."), user("And 4 + 4?"), assistant("8."), user("And 1 + 1?"),
         assistant("2, of course.")],
        [{"role": "system", "content": "You are minimind."}, user("Hi."), assistant("Hello! How can I help?"),
         user("Name a fruit."), assistant("An apple."), user("Another?"), assistant("A pear.")],
        [user("I have a question."), user("What is the capital of France?"), assistant("Paris."),
         user("Thanks."), assistant("You are welcome.")],
        [user("Is 7 prime?"), assistant("Yes.", reasoning="7 has no divisor but 1 and 7.")],
        [user("Say hi."), assistant("<think>\nA greeting.\n</think>\n\nHi!")],
        [user("你好，请介绍一下你自己。"), assistant("我是minimind，一个小巧但有用的语言模型。")],
        [user("Show a Python line that prints one."), assistant("  print(1)")],
        [user("Explain what a training loop does."),
         assistant("It reads a batch, predicts every next token, measures the loss, computes the gradient and "
                   "moves each weight a small step against it, again and again."),
         user("Shorter?"), assistant("Batch, loss, gradient, step; repeat.")],
    ]
    checked = 0
    for tokenizer in (None, ByteTokenizer()):        # None: upstream's tokenizer
        for removed in (False, True):
            for number, messages in enumerate(conversations):
                full = sft_sample(messages, 2048, tokenizer, empty_think_removed=removed)
                ids = torch.tensor(full.input_ids)
                length = int((ids != 0).nonzero().max()) + 1   # the text ends with a newline, never the pad id
                start, end = torch.tensor(full.assistant_start), torch.tensor(full.end)
                markers = _marker_positions(ids[:length], start)
                span_starts = markers + start.numel()
                ends = _marker_positions(ids[:length], end)
                stops = torch.cat([ends, torch.tensor([length])])[torch.searchsorted(ends, span_starts)]
                offsets = torch.tensor([-1, 0, 1])
                cuts = torch.cat([(markers[:, None] + offsets).flatten(), markers + start.numel() - 1,
                                  (span_starts[:, None] + offsets[1:]).flatten(), (span_starts + stops) // 2,
                                  (stops[:, None] + offsets).flatten(), stops + end.numel(),
                                  torch.tensor([length, length + 5])])
                cuts = torch.unique(cuts[cuts >= 1])
                for cut in cuts.tolist():
                    sample = sft_sample(messages, cut, tokenizer, empty_think_removed=removed)
                    name = (f"conversation {number} ({messages[-1]['content'][:20]!r}...), "
                            f"{'upstream' if tokenizer is None else 'byte-level'} tokenizer, empty think block "
                            f"{'removed' if removed else 'kept'}, max_length {cut}")
                    actual = assistant_labels(list(sample.input_ids), list(sample.assistant_start), list(sample.end))
                    actual = [int(label) for label in actual]
                    expected = sample.labels
                    assert len(actual) == len(expected), f"{name}: {len(actual)} labels for {len(expected)} ids"
                    if actual != expected:
                        diff = (torch.tensor(actual) != torch.tensor(expected)).nonzero().flatten().tolist()
                        at = diff[0]
                        raise AssertionError(
                            f"{name}: labels differ from upstream's at {len(diff)} positions, the first {at}: "
                            f"ACTUAL {actual[max(0, at - 3):at + 6]} EXPECTED {expected[max(0, at - 3):at + 6]}")
                    checked += 1
    assert checked > 0, "no case was checked"


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
