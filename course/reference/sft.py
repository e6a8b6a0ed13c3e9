"""Reference solutions for lesson 17 (``impl/sft.py`` is the student's copy): supervised fine-tuning.

The loss mask belongs to the sample: ``assistant_labels`` marks what one conversation trains on, as upstream
MiniMind does; ``load_pretrained_weights`` starts SFT from a pretraining weights file with every key accounted
for; ``update_normalization_units`` and ``sft_epoch`` train on lesson 16's ``TrainingSession`` so that an update's
gradient is the token mean over ALL of its assistant tokens, whatever each micro-batch holds.
"""
from __future__ import annotations

import re

import torch

from course.input_errors import InputError
from course.minimind import IGNORE_INDEX, ByteTokenizer
from course.minimind.sft import assistant_markers, read_state_dict
from course.protocol.text import token_weighted_step
from course.protocol.types import TrainingStepOptions
from course.runs.sft import sft_sample


def _spans(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[tuple[int, int]]:
    """``(first, stop)`` of each assistant span: from the id after a start marker through the next end marker,
    or to the sample's end when none follows; the search for the next start resumes after the span."""
    spans, resume = [], 0
    for position in range(len(input_ids)):
        if position < resume or input_ids[position:position + len(assistant_start)] != assistant_start:
            continue
        first = position + len(assistant_start)
        resume = next((i + len(end) for i in range(first, len(input_ids)) if input_ids[i:i + len(end)] == end),
                      len(input_ids))
        spans.append((first, resume))
    return spans


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """Upstream's ``SFTDataset.generate_labels`` on a sample already cut to its length: the ids of every assistant
    span (its end marker included; a span cut by the truncation runs to the end), -100 everywhere else."""
    labels = [IGNORE_INDEX] * len(input_ids)
    for first, stop in _spans(input_ids, assistant_start, end):
        labels[first:stop] = input_ids[first:stop]
    return labels


def _validate_weights(path, state_dict: dict, expected: dict) -> None:
    """Every key of the model in the file and no other, each a tensor of the model's shape; else an InputError (a
    ValueError: a command refuses it with one line, exit code 2) naming the keys, raised before anything is loaded."""
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    fits = {name for name, value in state_dict.items()
            if isinstance(value, torch.Tensor) and name in expected and value.shape == expected[name].shape}
    misshapen = sorted((expected.keys() & state_dict.keys()) - fits)
    if missing or unexpected or misshapen:
        raise InputError(f"path {str(path)!r} is not a weights file of this model (nothing loaded): missing keys "
                         f"{missing}, unexpected keys {unexpected}, entries that are not a tensor of the model's "
                         f"shape {misshapen}")


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """Load a weights file (``model.state_dict()`` as lesson 14's stage saves it, or upstream's fp16 copy of it)
    into ``model``, in place, its values cast to the model's dtype; a file that does not fit is refused before
    anything changes. Returns the file's state dict, as it was read."""
    state_dict = read_state_dict(path)
    _validate_weights(path, state_dict, model.state_dict())
    model.load_state_dict(state_dict)
    return state_dict


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """Per micro-batch, the normalization units of the update it belongs to: the shifted assistant targets
    (``labels[..., 1:] != -100``) of its window of ``accumulation_steps`` micro-batches (the last may be short)."""
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    counts = [int((labels[..., 1:] != IGNORE_INDEX).sum()) for labels in labels_per_micro_batch]
    units = []
    for start in range(0, len(counts), accumulation_steps):
        window = counts[start:start + accumulation_steps]
        units += [sum(window)] * len(window)
    return units


def sft_epoch(session, micro_batches: list, accumulation_steps: int, *, lr: float | None = None,
              clip_grad_norm: float = 0.0) -> list:
    """One epoch of SFT on a lesson-16 ``TrainingSession``: each window of ``accumulation_steps`` micro-batches is
    one update normalised by its own assistant tokens, closed by ``force_update`` on its last micro-batch. An
    update without any assistant token is not trained. One entry per update: its closing report, or None."""
    units = update_normalization_units([batch.labels for batch in micro_batches], accumulation_steps)
    reports = []
    for start in range(0, len(micro_batches), accumulation_steps):
        window = micro_batches[start:start + accumulation_steps]
        if units[start] == 0:   # nothing to learn; and N = 0 would divide by zero (upstream's loss is NaN)
            reports.append(None)
            continue
        for position, batch in enumerate(window):
            options = TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm, normalization_units=units[start],
                                          force_update=position == len(window) - 1)
            report = session.train_step(batch, options, token_weighted_step)
        reports.append(report)
    return reports


SYSTEM_AND_TWO_TURNS = [
    {"role": "system", "content": "You are a helpful AI assistant."},
    {"role": "user", "content": "Is seven a prime number?"}, {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "And nine?"},
    {"role": "assistant", "content": "No, nine is three times three (<|im_end|> ends a turn)."}]

# The conversations of the reference test: one kind of lesson 17 §1.2's list each, the length it is cut to, the
# tokenizer (None: upstream's).
MASK_TEST_CASES = (
    (SYSTEM_AND_TWO_TURNS, 96, None),       # system prompt, two turns, an end marker's first id alone, padded
    ([{"role": "user", "content": "Name a color."},
      {"role": "assistant", "content": "Red, the color of ripe strawberries and fire trucks."}], 24,
     None),                                                          # cut mid-answer
    ([{"role": "user", "content": "Please read this long question before you answer it."},
      {"role": "assistant", "content": "Done."}], 12, None),         # cut before the answer: no target left
    ([{"role": "user", "content": "Which token ends a document?"},
      {"role": "assistant", "content": "<|endoftext|>, the pad id."}], 40, None),  # id 0 inside an answer: a target
    (SYSTEM_AND_TWO_TURNS, 512, ByteTokenizer()),                    # another tokenizer: other marker ids
)


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """``assistant_labels`` gives upstream's labels, token for token, on a conversation of each kind."""
    for messages, max_length, tokenizer in MASK_TEST_CASES:
        sample = sft_sample(messages, max_length, tokenizer)
        input_ids = list(sample.input_ids)
        labels = assistant_labels(input_ids, sample.assistant_start, sample.end)
        assert labels == sample.labels, f"max_length {max_length}, {sample.prompt!r}: {labels} != {sample.labels}"
        if input_ids != sample.input_ids:   # an argument rule (lesson 17 §5.5): the caller's list left as it was
            raise AssertionError(f"assistant_labels changed its input_ids: {input_ids}")


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """Upstream's ``(input_ids, labels)`` of a rendered conversation, except that no token crosses the end of an
    assistant marker: each piece of the text that ends with one is tokenized on its own."""
    marker = f"{tokenizer.bos_token}assistant\n"
    pieces = re.split(f"(?<={re.escape(marker)})", prompt)
    input_ids = [i for piece in pieces for i in tokenizer(piece, add_special_tokens=False).input_ids][:max_length]
    input_ids += [tokenizer.pad_token_id] * (max_length - len(input_ids))
    return input_ids, assistant_labels(input_ids, *assistant_markers(tokenizer))
