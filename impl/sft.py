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
from course.minimind import ByteTokenizer  # noqa: F401
from course.runs.sft import sft_sample  # noqa: F401


def assistant_labels(input_ids: list[int], assistant_start: list[int], end: list[int]) -> list[int]:
    """TODO (lesson 17 §5.1): the labels that train one tokenized conversation on what the assistant says only.

    ``input_ids``: one sample, already cut to its length (and padded); ``assistant_start``: the ids of
    ``"<|im_start|>assistant\\n"``; ``end``: the ids of ``"<|im_end|>\\n"``. Returns a list as long as
    ``input_ids``: the id where the position is a target, -100 (``IGNORE_INDEX``) elsewhere, unshifted (the
    model's loss shifts), equal to upstream's ``SFTDataset`` labels token for token (lesson 17 §1.2).
    Example, start [1, 7], end [2, 9]: [1, 5, 2, 9, 1, 7, 6, 2, 9, 0] -> [-100] * 6 + [6, 2, 9, -100].
    """
    raise NotImplementedError("assistant_labels: TODO - see lesson 17 §5.1")


def load_pretrained_weights(model: torch.nn.Module, path) -> dict:
    """TODO (lesson 17 §5.2): start SFT from a pretraining weights file: load it into ``model``, exactly.

    ``path``: a weights file, ``model.state_dict()`` saved whole (fp32) or as upstream saves it (every entry
    ``.half()``); ``read_state_dict(path)`` reads one safely. ``model`` is changed in place and keeps its dtype;
    every key is accounted for: a file that does not fit the model is refused with an error naming the key,
    and the model stays as it was. Returns the file's state dict, as read.
    Example: load_pretrained_weights(fresh_model, "out/pretrain_48.pth") -> {"model.embed_tokens.weight": ...}.
    """
    raise NotImplementedError("load_pretrained_weights: TODO - see lesson 17 §5.2")


def update_normalization_units(labels_per_micro_batch: list[torch.Tensor], accumulation_steps: int) -> list[int]:
    """TODO (lesson 17 §5.3): per micro-batch, the normalization units of the update it belongs to.

    ``labels_per_micro_batch``: each micro-batch's labels ``[batch, seq]``, in training order; every
    ``accumulation_steps`` consecutive micro-batches form one update (the epoch's last one may hold fewer).
    Returns one int per micro-batch: the number of targets the update's token mean divides by (lesson 16 §1.3).
    Example, K = 2, micro-batches holding 3, 5 and 4 targets: [8, 8, 4].
    """
    raise NotImplementedError("update_normalization_units: TODO - see lesson 17 §5.3")


def sft_epoch(session, micro_batches: list, accumulation_steps: int, *, lr: float | None = None,
              clip_grad_norm: float = 0.0) -> list:
    """TODO (lesson 17 §5.3): train one SFT epoch on a lesson-16 ``TrainingSession``.

    ``micro_batches``: ``TextBatch``es (``course/protocol/text.py``) in training order; every
    ``accumulation_steps`` consecutive ones form one update, the last one possibly shorter. Each update's
    gradient must equal ONE backward of the token mean over all of its assistant tokens; each update steps at
    ``lr`` (None: the optimizer's own) and is clipped at ``clip_grad_norm``, both through ``TrainingStepOptions``
    (the session clips with the closing micro-step's; simplest: pass both on every micro-step). An update without
    any assistant token is not trained. Returns one entry per update: the ``TrainingStepReport`` that closed it,
    or None.
    Example, K = 2 and 5 micro-batches: 3 updates of 2, 2 and 1 micro-steps -> [report, report, report].
    """
    raise NotImplementedError("sft_epoch: TODO - see lesson 17 §5.3")


def test_assistant_labels_match_upstream(assistant_labels) -> None:
    """TODO (lesson 17 §5.4): a test that ``assistant_labels`` gives upstream's labels, on conversations you choose.

    ``assistant_labels`` is the code under test (the contract of §5.1). Return nothing when it is right; raise
    ``AssertionError`` when it is wrong. ``sft_sample(messages, max_length, tokenizer=None, *,
    empty_think_removed=False)`` (imported above) renders, tokenizes and cuts a conversation and gives upstream's
    own labels for it. §5.4 says what the grader runs your test on.
    """
    raise NotImplementedError("test_assistant_labels_match_upstream: TODO - see lesson 17 §5.4")


def encode_sft_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """TODO (lesson 17 §5.6, optional): upstream's ``(input_ids, labels)`` of a rendered conversation, without
    the quirk that drops an answer starting with two spaces.

    Like ``course/minimind/sft.py::encode_prompt`` (cut to ``max_length``, padded with the pad id, labelled by
    your ``assistant_labels``), except that no token may cross the end of an assistant marker.
    """
    raise NotImplementedError("encode_sft_prompt: TODO - see lesson 17 §5.6")
