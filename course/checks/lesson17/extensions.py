"""Lesson 17 §5.6, the optional extension: ``encode_sft_prompt`` tokenizes so that no token crosses the end of an
assistant marker. ``python -m course check 17 --all`` grades it; it never changes the exit code and scores no
notebook point. Where upstream's tokenization merges nothing it must give upstream's sample (the oracle's
``encode_prompt``); where an answer starts with two spaces it must keep the marker whole and train the answer."""
from __future__ import annotations

from course.minimind import ByteTokenizer
from course.minimind.sft import EMPTY_THINK_BLOCK, encode_prompt, render_chat, sft_labels
from course.runs.sft import sft_dataset, upstream_tokenizer

from ..framework import check, fail
from .checks import SYSTEM, THREE_TURNS, TWO_SPACES, chat


def corpus_prompts() -> list[str]:
    """The built-in corpus's conversations as upstream renders them, every think block kept and every empty one
    removed."""
    dataset = sft_dataset(64)
    kept = [render_chat(dataset.samples[i]) for i in range(len(dataset))]
    return kept + [prompt.replace(EMPTY_THINK_BLOCK, "") for prompt in kept]


def merges(prompt: str, tokenizer) -> bool:
    """Whether upstream's tokenization of ``prompt`` loses an assistant marker (a token crosses its end)."""
    marker = f"{tokenizer.bos_token}assistant\n"
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    start = tokenizer(marker, add_special_tokens=False).input_ids
    found = sum(ids[i:i + len(start)] == start for i in range(len(ids)))
    return found != prompt.count(marker)


def expect_sample(impl, what: str, prompt: str, tokenizer, max_length: int, expected: tuple) -> None:
    got = impl.encode_sft_prompt(prompt, tokenizer, max_length)
    if tuple(map(list, got)) != tuple(expected):
        fail(f"encode_sft_prompt({what}, max_length={max_length}): (input_ids, labels)", got, expected,
             "hint: the rule: upstream's sample where no token crosses the end of an assistant marker; where one "
             "would, the text up to and including each marker is tokenized on its own")


@check("encode_sft_prompt")
def encode_sft_prompt_is_upstreams_where_nothing_merges(impl):
    """Every conversation of the built-in corpus whose tokens keep each assistant marker whole (think blocks kept,
    and removed), cut to 64 and to 24 ids: upstream's (input_ids, labels), also with the byte-level tokenizer."""
    for tokenizer in (upstream_tokenizer(), ByteTokenizer()):
        for number, prompt in enumerate(corpus_prompts()):
            if merges(prompt, tokenizer):
                continue
            for max_length in (64, 24):
                expect_sample(impl, f"corpus prompt {number}, {type(tokenizer).__name__}", prompt, tokenizer,
                              max_length, encode_prompt(prompt, tokenizer, max_length))


@check("encode_sft_prompt")
def encode_sft_prompt_trains_an_answer_starting_with_spaces(impl):
    """An answer that starts with two spaces, its empty think block removed (upstream merges the marker's newline
    with a space and trains nothing): each marker stays whole, the text after it is tokenized on its own, and
    the answer is trained; in one and in three turns, whole and cut inside the answer."""
    tokenizer = upstream_tokenizer()
    marker = f"{tokenizer.bos_token}assistant\n"
    for what, messages in (("one turn", TWO_SPACES), ("a system prompt, three turns", [SYSTEM, *chat(
            THREE_TURNS[0], "  Yes.", THREE_TURNS[2], "No.", THREE_TURNS[4], "  print(11)")])):
        prompt = render_chat(messages).replace(EMPTY_THINK_BLOCK, "")
        pieces = prompt.split(marker)
        ids = [i for piece in [p + marker for p in pieces[:-1]] + pieces[-1:]
               for i in tokenizer(piece, add_special_tokens=False).input_ids]
        start = tokenizer(marker, add_special_tokens=False).input_ids
        end = tokenizer(f"{tokenizer.eos_token}\n", add_special_tokens=False).input_ids
        for max_length in (len(ids) + 4, len(ids) - 3):
            cut = (ids + [tokenizer.pad_token_id] * 4)[:max_length]
            expect_sample(impl, f"{what}, answers starting with two spaces", prompt, tokenizer, max_length,
                          (cut, sft_labels(cut, start, end, max_length)))
