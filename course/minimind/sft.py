"""Upstream MiniMind's supervised fine-tuning data path, faithful to the token: the oracle lesson 17 aligns with.

Mirrors, at upstream commit d65ef2c:

- ``model/tokenizer_config.json``'s ``chat_template`` (``render_chat``), in plain Python: no jinja2 at runtime;
- ``dataset/lm_dataset.py``: ``pre_processing_chat``, ``post_processing_chat`` and ``SFTDataset`` (its
  ``create_chat_prompt`` and ``generate_labels``, here ``render_chat`` and ``sft_labels``);
- ``trainer/trainer_utils.py::init_model``'s weight load and ``trainer/train_full_sft.py``'s weight save
  (``load_weights_like_upstream``, ``save_weights_like_upstream``).

``tests/test_upstream_sft_fixture.py`` compares all of it with what upstream's own code produced
(``tests/fixtures/upstream/make_sft_fixture.py``). Quirks kept on purpose, because the oracle is upstream:

- the loss covers each assistant turn from the token after ``<|im_start|>assistant\\n`` through its
  ``<|im_end|>\\n``: the empty ``<think>`` block, and the newline after ``<|im_end|>``, are targets;
- the markers are matched as token ids, so an answer whose first characters merge with that ``\\n``
  (one that starts with two spaces, once the empty think block is removed) is silently left out of the loss;
- a sample truncated before any answer has no target at all (labels all -100);
- upstream draws its system prompt and think-block removal from the global ``random``, so what
  ``dataset[i]`` returns depends on every earlier draw (the sampling order, the DataLoader worker), not on ``i``.
  Here the generator is explicit: ``SFTDataset(..., rng=random.Random(seed))``; None keeps upstream's global one.
"""
from __future__ import annotations

import random
from typing import Optional

import torch
from torch.utils.data import Dataset

from course.input_errors import InputError

from .dataset import JsonlRecords, parse_json_line
from .model import IGNORE_INDEX
from .trainer_utils import fp16_state_dict

# pre_processing_chat's prompts, in upstream's order (rng.choice picks by position).
SYSTEM_PROMPTS = (
    "你是一个知识丰富的AI，尽力为用户提供准确的信息。",
    "你是minimind，一个小巧但有用的语言模型。",
    "你是一个专业的AI助手，请提供有价值的回答。",
    "你是minimind，请尽力帮助用户解决问题。",
    "你是一个可靠的AI，请给出准确的回答。",
    "You are a helpful AI assistant.",
    "You are minimind, a lightweight intelligent assistant.",
    "You are a friendly chatbot. Please answer the user's questions carefully.",
    "You are a knowledgeable AI. Try your best to provide accurate information.",
    "You are minimind, a small but useful language model.",
)
ADD_SYSTEM_RATIO = 0.2
EMPTY_THINK_RATIO = 0.2
EMPTY_THINK_BLOCK = "<think>\n\n</think>\n\n"
# The template's add_generation_prompt when open_thinking is not set (upstream's eval_llm.py): an empty think block.
GENERATION_PROMPT = "<|im_start|>assistant\n" + EMPTY_THINK_BLOCK
# The fields of a message upstream's SFTDataset reads (its datasets Features); absent ones read as None.
MESSAGE_FIELDS = ("role", "content", "reasoning_content", "tools", "tool_calls")


def tool_use(message: dict) -> Optional[str]:
    """Why ``message`` needs the template's tool-use branches (not mirrored here), or None."""
    for field in ("tools", "tool_calls"):
        if message.get(field):
            return f"has {field!r}"
    if message.get("role") == "tool":
        return "has role 'tool'"
    return None


def text_or_empty(value) -> str:
    """The template's ``content if content is string else ''``."""
    return value if isinstance(value, str) else ""


def assistant_turn(message: dict) -> str:
    """An assistant message: always a think block, from ``reasoning_content`` when it is a string, else cut
    out of ``content`` (before its first ``</think>``, after the last ``<think>`` there)."""
    content = text_or_empty(message.get("content"))
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = ""
        if "</think>" in content:
            reasoning = content.partition("</think>")[0].rstrip("\n").rpartition("<think>")[2].lstrip("\n")
            content = content.rpartition("</think>")[2].lstrip("\n")
    return ("<|im_start|>assistant\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
            + "<|im_end|>\n")


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """MiniMind's chat template (``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``)
    for system, user and assistant messages. A system message opens the prompt only when it comes first
    (later ones render like user turns); a message with any other role is dropped, as the template drops it.
    ``add_generation_prompt`` appends what opens the assistant's answer without thinking (``GENERATION_PROMPT``)."""
    if not messages:
        raise ValueError("messages: empty; the chat template needs at least one message")
    for number, message in enumerate(messages):
        reason = tool_use(message)
        if reason:
            raise ValueError(f"messages[{number}] {reason}: tool use is not supported by this oracle")
    parts = []
    for number, message in enumerate(messages):
        role = message.get("role")
        if number == 0 and role == "system":
            if not isinstance(message.get("content"), str):
                raise ValueError("messages[0]: a first system message needs string content (the template "
                                 "concatenates it and fails on anything else)")
            parts.append("<|im_start|>system\n" + message["content"] + "<|im_end|>\n")
        elif role in ("user", "system"):
            parts.append(f"<|im_start|>{role}\n" + text_or_empty(message.get("content")) + "<|im_end|>\n")
        elif role == "assistant":
            parts.append(assistant_turn(message))
    return "".join(parts) + (GENERATION_PROMPT if add_generation_prompt else "")


def pre_processing_chat(conversations: list[dict], rng: random.Random,
                        add_system_ratio: float = ADD_SYSTEM_RATIO) -> list[dict]:
    """Upstream's ``pre_processing_chat``: a conversation that does not open with a system message gets one of
    ``SYSTEM_PROMPTS`` with probability ``add_system_ratio``; tool-use conversations are left alone. Draws
    from ``rng`` exactly as upstream draws from the global ``random`` (one ``random()`` when there is no system
    message, one ``choice`` when it adds one), so ``random.Random(seed)`` replays ``random.seed(seed)``."""
    if any(conversation.get("tools") for conversation in conversations):
        return conversations
    if conversations[0].get("role") != "system" and rng.random() < add_system_ratio:
        return [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] + conversations
    return conversations


def post_processing_chat(prompt: str, rng: random.Random, empty_think_ratio: float = EMPTY_THINK_RATIO) -> str:
    """Upstream's ``post_processing_chat``: with probability ``1 - empty_think_ratio`` remove every empty think
    block of the prompt (one draw for all turns, and only when there is one)."""
    if EMPTY_THINK_BLOCK in prompt and rng.random() > empty_think_ratio:
        return prompt.replace(EMPTY_THINK_BLOCK, "")
    return prompt


def find_ids(ids: list[int], pattern: list[int], start: int) -> int:
    """The first position >= ``start`` where ``pattern`` occurs in ``ids``, or ``len(ids)``."""
    for position in range(start, len(ids)):
        if ids[position:position + len(pattern)] == pattern:
            return position
    return len(ids)


def sft_labels(input_ids: list[int], assistant_start_ids: list[int], end_ids: list[int],
               max_length: int) -> list[int]:
    """Upstream's ``generate_labels``: each occurrence of ``assistant_start_ids`` opens a span from the next
    token through the first ``end_ids`` after it (the end marker's tokens included), clipped at ``max_length``;
    a span without an end runs to the end. Labels copy the ids there and are -100 elsewhere; unshifted,
    like ``input_ids`` (the model's loss shifts). The search resumes after the end marker."""
    if not assistant_start_ids or not end_ids:
        raise ValueError(f"assistant_start_ids ({assistant_start_ids!r}) and end_ids ({end_ids!r}) must be "
                         f"non-empty token id lists")
    labels = [IGNORE_INDEX] * len(input_ids)
    position = 0
    while position < len(input_ids):
        if input_ids[position:position + len(assistant_start_ids)] != assistant_start_ids:
            position += 1
            continue
        span_start = position + len(assistant_start_ids)
        end = find_ids(input_ids, end_ids, span_start)
        span_stop = min(end + len(end_ids), max_length)
        labels[span_start:span_stop] = input_ids[span_start:span_stop]
        position = end + len(end_ids)
    return labels


def assistant_markers(tokenizer) -> tuple[list[int], list[int]]:
    """Upstream's markers: the ids of ``f"{bos_token}assistant\\n"`` (a span opens after them) and of
    ``f"{eos_token}\\n"`` (the span's last ids)."""
    return (tokenizer(f"{tokenizer.bos_token}assistant\n", add_special_tokens=False).input_ids,
            tokenizer(f"{tokenizer.eos_token}\n", add_special_tokens=False).input_ids)


def padded_prompt_ids(prompt: str, tokenizer, max_length: int) -> list[int]:
    """``SFTDataset``'s input_ids of a text: its ids cut to ``max_length`` and right-padded with the pad id."""
    # Upstream calls tokenizer(prompt), add_special_tokens=True by default; MiniMind's tokenizer.json
    # has no post-processor, so that adds nothing: the ids of the text alone.
    input_ids = tokenizer(prompt, add_special_tokens=False).input_ids[:max_length]
    return input_ids + [tokenizer.pad_token_id] * (max_length - len(input_ids))


def encode_prompt(prompt: str, tokenizer, max_length: int) -> tuple[list[int], list[int]]:
    """``SFTDataset``'s sample from its text: ``(input_ids, labels)``, cut to ``max_length`` and right-padded."""
    input_ids = padded_prompt_ids(prompt, tokenizer, max_length)
    return input_ids, sft_labels(input_ids, *assistant_markers(tokenizer), max_length)


def parse_conversations(line: bytes, where: str) -> list[dict]:
    """The ``conversations`` of one SFT jsonl line, checked as upstream's reader would read them."""
    record = parse_json_line(line, where)
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list) \
            or not record["conversations"]:
        raise InputError(f'{where}: expected an object with a non-empty "conversations" list of messages')
    for number, message in enumerate(record["conversations"]):
        name = f"{where}: conversations[{number}]"
        if not isinstance(message, dict):
            raise InputError(f"{name} is not an object")
        unknown = sorted(set(message) - set(MESSAGE_FIELDS))
        if unknown:
            raise InputError(f"{name} has the field {unknown[0]!r}; upstream's SFTDataset reads only "
                             f"{', '.join(MESSAGE_FIELDS)} and refuses others")
        reason = tool_use(message)
        if reason:
            raise InputError(f"{name} {reason}: tool use is not supported by this oracle")
        if not isinstance(message.get("role"), str):
            raise InputError(f'{name} needs a string "role"')
        for field in ("content", "reasoning_content"):
            if not isinstance(message.get(field), (str, type(None))):
                raise InputError(f"{name}: {field!r} must be a string or null, got {message[field]!r}")
    return record["conversations"]


class SFTDataset(Dataset):
    """Upstream's ``SFTDataset``: ``dataset[i]`` -> (input_ids, labels), long tensors of ``max_length``.

    A sample is the conversation pre-processed, rendered with the chat template and post-processed
    (``sample_prompt``), tokenized, cut to ``max_length`` and right-padded with the pad id; labels come from
    ``sft_labels`` with upstream's markers: the ids of ``f"{bos_token}assistant\\n"`` and ``f"{eos_token}\\n"``.
    Lines are read on demand through a byte-offset index, like ``PretrainDataset``'s.

    ``rng`` draws the random system prompt and think-block removal (None: the global ``random``, as upstream).
    ``add_system_ratio`` and ``empty_think_ratio`` are upstream's defaults; upstream's class has no such
    arguments, they let a lesson switch the randomness off (0.0 and 1.0: never add, never remove).
    """

    def __init__(self, jsonl_path, tokenizer, max_length: int = 1024, rng: Optional[random.Random] = None, *,
                 add_system_ratio: float = ADD_SYSTEM_RATIO, empty_think_ratio: float = EMPTY_THINK_RATIO):
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        for attribute in ("bos_token", "eos_token", "pad_token_id"):
            if getattr(tokenizer, attribute, None) is None:
                raise ValueError(f"tokenizer: no {attribute} (SFTDataset builds its markers and padding from it)")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.rng = random if rng is None else rng   # the module offers the same random() and choice()
        self.add_system_ratio = add_system_ratio
        self.empty_think_ratio = empty_think_ratio
        self.samples = JsonlRecords(jsonl_path, parse_conversations)
        self.assistant_start_ids, self.end_ids = assistant_markers(tokenizer)

    def __len__(self) -> int:
        return len(self.samples)

    def sample_prompt(self, index: int) -> str:
        """The text sample ``index`` trains on this time (it draws from ``rng``)."""
        conversations = pre_processing_chat(self.samples[index], self.rng, self.add_system_ratio)
        return post_processing_chat(render_chat(conversations), self.rng, self.empty_think_ratio)

    def encode_prompt(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids, labels = encode_prompt(prompt, self.tokenizer, self.max_length)
        return torch.tensor(input_ids, dtype=torch.long), torch.tensor(labels, dtype=torch.long)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_prompt(self.sample_prompt(index))


def save_weights_like_upstream(model: torch.nn.Module, path) -> None:
    """``train_full_sft.py``'s save: every state_dict entry in fp16 on the CPU (a tied tensor under both names)."""
    torch.save(fp16_state_dict(model), path)


def read_state_dict(path) -> dict:
    """The dict a weights file holds, read as ``torch.load(path)`` reads it but safely (``weights_only``, onto the
    CPU); a missing or unreadable file, or one that holds no dict, is an ``InputError`` naming the path."""
    try:
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(f"path {str(path)!r}: no such file") from None
    except Exception as exc:  # torch raises many types for a file that is not a checkpoint
        raise InputError(f"path {str(path)!r}: not a weights file torch.load can read ({exc})") from None
    if not isinstance(state_dict, dict):
        raise InputError(f"path {str(path)!r}: holds a {type(state_dict).__name__}, not a state_dict")
    return state_dict


def load_weights_like_upstream(model: torch.nn.Module, path):
    """``init_model``'s load: ``model.load_state_dict(torch.load(path), strict=False)``, values cast to the
    model's dtype. Returns what strict=False hides and upstream discards: ``(missing_keys, unexpected_keys)``."""
    return model.load_state_dict(read_state_dict(path), strict=False)
