"""Lesson 17's SFT inputs: conversations labelled as upstream labels them, the built-in chat corpus, its
micro-batches, and the one-backward oracle of an SFT update.

Every sample comes from the oracle (``course/minimind/sft.py``: MiniMind's chat template, tokenization and
``sft_labels``) with upstream's own tokenizer, copied unchanged into course/minimind/upstream_tokenizer
(6400 tokens, the tiny model's vocabulary size). Nothing here grades.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from course.implementations import REPO_ROOT
from course.minimind import UPSTREAM_TOKENIZER_DIR, load_tokenizer
from course.minimind.sft import SFTDataset, assistant_markers, encode_prompt, post_processing_chat, render_chat
from course.protocol.text import TextBatch, collate, shifted_target_count

from .session import session_model

SFT_TINY_CORPUS = REPO_ROOT / "labs" / "data" / "sft_tiny.jsonl"   # 36 conversations, hand-written


@functools.cache
def upstream_tokenizer():
    """MiniMind's tokenizer (``model/tokenizer.json`` at upstream commit d65ef2c), loaded once."""
    return load_tokenizer(UPSTREAM_TOKENIZER_DIR)


@dataclass(frozen=True)
class SFTSample:
    """One conversation as upstream's ``SFTDataset`` trains on it: ``labels`` are upstream's."""
    prompt: str                  # the chat template's text
    input_ids: list[int]         # its ids, cut to max_length and right-padded with the pad id
    labels: list[int]            # upstream's generate_labels: the ids inside assistant spans, -100 elsewhere
    assistant_start: list[int]   # the ids of "<|im_start|>assistant\n"
    end: list[int]               # the ids of "<|im_end|>\n"


def sft_sample(messages: list[dict], max_length: int, tokenizer=None, *, empty_think_removed: bool = False
               ) -> SFTSample:
    """``messages`` rendered with MiniMind's chat template as they are (no random system prompt; every think
    block kept, or the empty ones removed as upstream removes them in 80 % of its samples), tokenized
    (upstream's tokenizer unless ``tokenizer`` is given), cut or padded to ``max_length`` and labelled by
    upstream's rule."""
    tokenizer = tokenizer if tokenizer is not None else upstream_tokenizer()
    prompt = post_processing_chat(render_chat(messages), random.Random(0), 0.0 if empty_think_removed else 1.0)
    input_ids, labels = encode_prompt(prompt, tokenizer, max_length)
    return SFTSample(prompt, input_ids, labels, *assistant_markers(tokenizer))


def sft_dataset(max_length: int, *, seed: int = 0, path=SFT_TINY_CORPUS, **ratios) -> SFTDataset:
    """Upstream's ``SFTDataset`` over the built-in corpus (or ``path``) with upstream's tokenizer; its random
    system prompts and think-block removal drawn from ``random.Random(seed)`` (``ratios``: upstream's
    ``add_system_ratio`` / ``empty_think_ratio`` overridden)."""
    return SFTDataset(path, upstream_tokenizer(), max_length, random.Random(seed), **ratios)


# Pairs of corpus lines, one micro-batch each (sequence length 32, nothing random: no system prompt added, every
# think block kept). Their shifted assistant targets: 9, 0, 26 | 0, 0, 0 | 14, 19, 19 | 18. With K = 3 the first
# update holds a micro-batch without a target, the second none at all (every prompt cut before its answer), the
# last is a tail of one micro-batch.
SFT_EPOCH_PAIRS = ((2, 3), (10, 13), (4, 8), (17, 18), (21, 24), (28, 32), (0, 12), (1, 5), (7, 9), (14, 15))
SFT_EPOCH_LENGTH = 32


def sft_micro_batches(pairs=SFT_EPOCH_PAIRS, max_length: int = SFT_EPOCH_LENGTH) -> list[TextBatch]:
    """Micro-batches of the built-in corpus, each of the lines a pair names, in order."""
    dataset = sft_dataset(max_length, add_system_ratio=0.0, empty_think_ratio=1.0)
    return [collate([dataset[index] for index in pair], shifted_target_count) for pair in pairs]


def sft_update_gradients(batches: list[TextBatch], params: dict | None = None) -> dict:
    """The oracle of one SFT update: ONE backward of the model's own loss (its token mean over the shifted
    targets) on all of the update's micro-batches at once, on the tiny model (holding ``params`` when given)."""
    model = session_model(params)
    input_ids = torch.cat([batch.input_ids for batch in batches])
    labels = torch.cat([batch.labels for batch in batches])
    model(input_ids, labels=labels).loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters()}
