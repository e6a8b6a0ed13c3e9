"""Lesson 17 exercises: supervised fine-tuning, the loss mask belongs to the sample.

Style: class-based. Small helper classes carry the state of each exercise: ``SpanFinder`` (the two markers
and the scan over one sample), ``WeightsFit`` (how a weights file fits a model, key by key), ``UpdateWindow``
(one update's micro-batches and its normalization units) and ``MaskCase`` (one conversation of the test).
The exercise functions are thin wrappers around them.
"""
from __future__ import annotations

import re  # noqa: F401 - the optional §5.6
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch  # noqa: F401

from course.minimind import IGNORE_INDEX  # noqa: F401
from course.minimind.sft import assistant_markers, read_state_dict  # noqa: F401
from course.protocol.text import token_weighted_step  # noqa: F401
from course.protocol.types import TrainingStepOptions  # noqa: F401
# for your test (§5.4):
from course.runs.sft import sft_sample  # noqa: F401


# ---------------------------------------------------------------------------------------------- §5.1
@dataclass(frozen=True)
class SpanFinder:
    """Upstream's assistant spans in a sample, found as token ids.

    A marker occurs where all of its ids stand in a row. A span opens at the id after an ``assistant_start``
    and stops after the first ``end`` that follows it (the end marker is part of the span), or at the sample's
    end when none follows; the next start is searched after that end marker.
    """

    assistant_start: tuple[int, ...]
    end: tuple[int, ...]

    def __post_init__(self):
        if not self.assistant_start or not self.end:
            raise ValueError(f"assistant_start ({list(self.assistant_start)!r}) and end ({list(self.end)!r}) "
                             "must be non-empty id lists")

    @staticmethod
    def occurs_at(ids: list[int], position: int, marker: tuple[int, ...]) -> bool:
        return tuple(ids[position:position + len(marker)]) == marker

    def find(self, ids: list[int], marker: tuple[int, ...], position: int) -> Optional[int]:
        """The first position >= ``position`` where ``marker`` occurs, or None."""
        for candidate in range(position, len(ids) - len(marker) + 1):
            if self.occurs_at(ids, candidate, marker):
                return candidate
        return None

    def spans(self, ids: list[int]) -> Iterator[tuple[int, int]]:
        """``(first, stop)`` of each span, ``stop`` exclusive and at most ``len(ids)``."""
        position = 0
        while True:
            marker = self.find(ids, self.assistant_start, position)
            if marker is None:
                return
            first = marker + len(self.assistant_start)
            end_at = self.find(ids, self.end, first)
            if end_at is None:              # cut inside the answer (or its end marker): runs to the end
                yield first, len(ids)
                return
            yield first, end_at + len(self.end)
            position = end_at + len(self.end)

    def labels(self, ids: list[int]) -> list[int]:
        labels = [IGNORE_INDEX] * len(ids)
        for first, stop in self.spans(ids):
            labels[first:stop] = ids[first:stop]
        return labels


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """Upstream's labels for one sample already cut to its length (and padded): the ids of its assistant spans
    (``SpanFinder``), -100 elsewhere, unshifted."""
    return SpanFinder(tuple(assistant_start), tuple(end)).labels([int(token) for token in input_ids])


# ---------------------------------------------------------------------------------------------- §5.2
@dataclass
class WeightsFit:
    """How a weights file's state dict fits a model's: every disagreement, key by key."""

    missing: list[str] = field(default_factory=list)        # the model needs them, the file lacks them
    unexpected: list[str] = field(default_factory=list)     # the file has them, the model does not
    not_tensors: list[str] = field(default_factory=list)
    wrong_shapes: list[str] = field(default_factory=list)   # "key (file shape vs model shape)"

    @classmethod
    def compare(cls, model_state: dict, file_state: dict) -> "WeightsFit":
        fit = cls()
        for key, target in model_state.items():
            if key not in file_state:
                fit.missing.append(key)
            elif not torch.is_tensor(file_state[key]):
                fit.not_tensors.append(f"{key} ({type(file_state[key]).__name__})")
            elif file_state[key].shape != target.shape:
                fit.wrong_shapes.append(f"{key} (file {tuple(file_state[key].shape)} vs model "
                                        f"{tuple(target.shape)})")
        fit.unexpected = [key for key in file_state if key not in model_state]
        return fit

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.not_tensors or self.wrong_shapes)

    def describe(self) -> str:
        groups = (("missing keys", self.missing), ("unexpected keys", self.unexpected),
                  ("entries that are not tensors", self.not_tensors), ("shape mismatches", self.wrong_shapes))
        return "; ".join(f"{label}: {', '.join(keys)}" for label, keys in groups if keys)


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """Start SFT from a pretraining weights file: every key of the model, no other, each at the model's shape,
    checked before anything is loaded (a misfit is a ``ValueError`` naming its keys, the model untouched); then
    copied in place into the model's own tensors at the model's dtype. Returns the file's state dict, as read."""
    file_state = read_state_dict(path)
    fit = WeightsFit.compare(model.state_dict(), file_state)
    if not fit.exact:
        raise ValueError(f"weights file {str(path)!r} does not fit the model, nothing was loaded: {fit.describe()}")
    model.load_state_dict(file_state)   # strict; copy_ into each parameter, cast to its dtype (not assign=True)
    return file_state


# ---------------------------------------------------------------------------------------------- §5.3
def _check_accumulation_steps(accumulation_steps) -> None:
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")


def count_targets(labels: torch.Tensor) -> int:
    """The shifted targets the model's loss sees: ``labels[..., 1:] != -100``."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


@dataclass
class UpdateWindow:
    """One optimizer update: up to K consecutive micro-batches and the targets of all of them."""

    micro_batches: list
    counts: list[int]

    @property
    def normalization_units(self) -> int:
        return sum(self.counts)

    @property
    def trains(self) -> bool:
        """An update without any assistant target has nothing to learn from: it is not trained."""
        return self.normalization_units > 0

    def options(self, index: int, lr: Optional[float], clip_grad_norm: float) -> TrainingStepOptions:
        """The options of the window's micro-step ``index``: the update's units, and force_update on the last
        (the epoch's short tail closes there; a full window would close at K anyway)."""
        return TrainingStepOptions(lr=lr, clip_grad_norm=clip_grad_norm,
                                   normalization_units=self.normalization_units,
                                   force_update=index == len(self.micro_batches) - 1)

    def train(self, session, lr: Optional[float], clip_grad_norm: float):
        """Run the window's micro-steps; the report that closed it, or None when it is not trained."""
        if not self.trains:
            return None
        report = None
        for index, batch in enumerate(self.micro_batches):
            report = session.train_step(batch, self.options(index, lr, clip_grad_norm), token_weighted_step)
        return report

    @classmethod
    def split(cls, micro_batches: list, labels: list, accumulation_steps: int) -> list["UpdateWindow"]:
        _check_accumulation_steps(accumulation_steps)
        counts = [count_targets(batch_labels) for batch_labels in labels]
        return [cls(list(micro_batches[i:i + accumulation_steps]), counts[i:i + accumulation_steps])
                for i in range(0, len(counts), accumulation_steps)]


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """Per micro-batch, the shifted targets of its whole update (windows of ``accumulation_steps``, the last
    one possibly shorter), as Python ints."""
    labels = list(labels_per_micro_batch)
    windows = UpdateWindow.split(labels, labels, accumulation_steps)
    return [window.normalization_units for window in windows for _ in window.counts]


def sft_epoch(session, micro_batches: list, accumulation_steps: int, *, lr: float | None = None,
              clip_grad_norm: float = 0.0) -> list:
    """One SFT epoch on lesson 16's session: one token-weighted update per ``UpdateWindow``; returns per
    update the ``TrainingStepReport`` that closed it, or None for an update without assistant targets."""
    micro_batches = list(micro_batches)
    windows = UpdateWindow.split(micro_batches, [batch.labels for batch in micro_batches], accumulation_steps)
    return [window.train(session, lr, clip_grad_norm) for window in windows]


# ---------------------------------------------------------------------------------------------- §5.4
@dataclass(frozen=True)
class MaskCase:
    """One conversation as ``sft_sample`` renders, tokenizes and cuts it, with upstream's labels."""

    name: str
    messages: tuple
    max_length: int
    empty_think_removed: bool = False
    tokenizer: object = None            # None: upstream's tokenizer

    def sample(self):
        return sft_sample(list(self.messages), self.max_length, self.tokenizer,
                          empty_think_removed=self.empty_think_removed)

    def check(self, assistant_labels) -> None:
        sample = self.sample()
        actual = [int(label) for label in assistant_labels(list(sample.input_ids), list(sample.assistant_start),
                                                            list(sample.end))]
        expected = sample.labels
        assert len(actual) == len(expected), f"{self.name}: {len(actual)} labels for {len(expected)} ids"
        for position, (got, want) in enumerate(zip(actual, expected)):
            assert got == want, (f"{self.name}: label {position} is {got}, upstream's is {want}; "
                                 f"ACTUAL {actual[max(0, position - 3):position + 6]} "
                                 f"EXPECTED {expected[max(0, position - 3):position + 6]}")

    def cuts(self) -> list["MaskCase"]:
        """The same conversation cut at every place a wrong mask shows: before, inside and right after each
        assistant marker, at the first ids and the middle of each answer, before, inside and right after each
        end marker; plus the uncut sample with padding."""
        full = MaskCase(self.name, self.messages, 4096, self.empty_think_removed, self.tokenizer).sample()
        ids = list(full.input_ids)
        while ids and ids[-1] == 0:           # the padding (a rendered conversation ends with a newline)
            ids.pop()
        finder = SpanFinder(tuple(full.assistant_start), tuple(full.end))
        places = {len(ids), len(ids) + 3}
        position = 0
        while (marker := finder.find(ids, finder.assistant_start, position)) is not None:
            first = marker + len(finder.assistant_start)
            end_at = finder.find(ids, finder.end, first)
            end_at = len(ids) if end_at is None else end_at
            places |= {marker - 1, marker, marker + 1, first - 1, first, first + 1, (first + end_at) // 2,
                       end_at - 1, end_at, end_at + 1, end_at + len(finder.end)}
            position = end_at + len(finder.end)
        return [MaskCase(f"{self.name}, max_length {cut}", self.messages, cut, self.empty_think_removed,
                         self.tokenizer) for cut in sorted(places) if cut >= 1]


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """``assistant_labels`` gives upstream's labels on conversations that expose each wrong mask: one and several
    assistant turns (after a system prompt, after two user turns), think blocks kept and removed, reasoning,
    Chinese, an answer starting with two spaces, padding, and cuts around every marker and inside every answer,
    with upstream's tokenizer and a byte-level one."""
    from course.minimind import ByteTokenizer

    system = {"role": "system", "content": "You are a helpful AI assistant."}

    def turn(question, answer, **extra):
        return ({"role": "user", "content": question}, {"role": "assistant", "content": answer, **extra})

    conversations = {
        "one turn": turn("Name a color.", "Red."),
        "a system prompt": (system, *turn("Name a primary color.", "Red.")),
        "three turns": (*turn("What is 2 + 3?", "5."), *turn("And 4 + 4?", "8."),
                        *turn("And 1 + 1?", "2, of course.")),
        "a system prompt and three turns": (system, *turn("Hi.", "Hello! How can I help?"),
                                            *turn("Name a fruit.", "An apple."), *turn("Another?", "A pear.")),
        "two user turns, then two answers": ({"role": "user", "content": "I have a question."},
                                             *turn("What is the capital of France?", "Paris."),
                                             *turn("Thanks.", "You are welcome.")),
        "reasoning": turn("Is 7 prime?", "Yes.", reasoning_content="7 has no divisor but 1 and 7."),
        "think block in the content": turn("Say hi.", "<think>\nA greeting.\n</think>\n\nHi!"),
        "Chinese": turn("你好，请介绍一下你自己。", "我是minimind，一个小巧但有用的语言模型。"),
        "an answer starting with two spaces": turn("Show a Python line that prints one.", "  print(1)"),
        "a long answer": (*turn("Explain what a training loop does.",
                                "It reads a batch, predicts every next token, measures the loss, computes the "
                                "gradient and moves each weight a small step against it, again and again."),
                          *turn("Shorter?", "Batch, loss, gradient, step; repeat.")),
    }
    cases = []
    for tokenizer_name, tokenizer in (("upstream's tokenizer", None), ("a byte-level tokenizer", ByteTokenizer())):
        for removed in (False, True):
            for name, messages in conversations.items():
                base = MaskCase(f"{name}, {tokenizer_name}, empty think block {'removed' if removed else 'kept'}",
                                tuple(messages), 0, removed, tokenizer)
                cases.extend(base.cuts())
    assert cases, "no case to check"
    for case in cases:
        case.check(assistant_labels)


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
