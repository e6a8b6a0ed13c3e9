"""A byte-level tokenizer with MiniMind's special token ids (no download needed).

Upstream ships a 6400-token byte-level BPE whose special tokens are ``<|endoftext|>`` = 0
(pad/unk), ``<|im_start|>`` = 1 (bos) and ``<|im_end|>`` = 2 (eos). We keep those ids and the
vocabulary size, and map every UTF-8 byte to one id after them, so any text (Chinese too)
round-trips without a trained merge table. A special token's string in the text becomes its id, as Hugging
Face's tokenizers split added tokens out before the byte-level model: SFT prompts (``<|im_start|>user ...``)
depend on that, and text without those strings gets the same ids as before.

``load_tokenizer`` loads a real one instead: a ``tokenizer.json`` (MiniMind's ``model/`` directory
holds one) through the Hugging Face ``tokenizers`` library, behind the same interface.
"""
from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from course.input_errors import InputError

# MiniMind's model/tokenizer_config.json: (role, token) for the ids PretrainDataset needs.
MINIMIND_SPECIAL_TOKENS = {"pad_token": "<|endoftext|>", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}


@dataclass
class Encoding:
    input_ids: list[int]


class TokenizerCall(ABC):
    """The slice of the Hugging Face tokenizer interface that ``PretrainDataset`` and ``SFTDataset`` use, over
    ``token_ids``: the special tokens' ids and, as upstream's SFT markers need them, their strings."""
    pad_token: str
    bos_token: str
    eos_token: str
    pad_token_id: int
    bos_token_id: int
    eos_token_id: int

    @abstractmethod
    def token_ids(self, text: str) -> list[int]:
        """The ids of ``text``, special-token strings in it included, with no bos/eos added around it."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.token_ids(text)
        if add_special_tokens:
            ids = [self.bos_token_id] + ids + [self.eos_token_id]
        return ids

    def __call__(self, text: str, add_special_tokens: bool = False,
                 max_length: Optional[int] = None, truncation: bool = False) -> Encoding:
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        if truncation and max_length is not None:
            if max_length < 0:
                raise ValueError(f"max_length must be >= 0, got {max_length}")
            ids = ids[:max_length]
        return Encoding(input_ids=ids)


class ByteTokenizer(TokenizerCall):
    pad_token = MINIMIND_SPECIAL_TOKENS["pad_token"]
    bos_token = MINIMIND_SPECIAL_TOKENS["bos_token"]
    eos_token = MINIMIND_SPECIAL_TOKENS["eos_token"]
    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    special_tokens = {pad_token: 0, bos_token: 1, eos_token: 2}
    byte_offset = 3
    vocab_size = 6400
    # A capturing split: the pieces at odd positions are special tokens (none is a prefix of another).
    special_token_split = re.compile("(" + "|".join(map(re.escape, special_tokens)) + ")")

    def token_ids(self, text: str) -> list[int]:
        ids = []
        for position, piece in enumerate(self.special_token_split.split(text)):
            if position % 2:
                ids.append(self.special_tokens[piece])
            else:
                ids.extend(byte + self.byte_offset for byte in piece.encode("utf-8"))
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = bytearray()
        names = {v: k for k, v in self.special_tokens.items()}
        for token in ids:
            token = int(token)
            if token in names:
                if not skip_special_tokens:
                    out += names[token].encode("utf-8")
            elif self.byte_offset <= token < self.byte_offset + 256:
                out.append(token - self.byte_offset)
            else:
                raise ValueError(f"token id {token} is outside this tokenizer's range "
                                 f"[0, {self.byte_offset + 256})")
        return out.decode("utf-8", errors="replace")


class JsonTokenizer(TokenizerCall):
    """A ``tokenizer.json`` loaded with ``tokenizers``; special-token ids come from its vocabulary. ``tokenizers``
    itself turns the added tokens' strings in a text into their ids (``<|im_start|>`` -> 1, ``<think>`` -> 25 in
    MiniMind's), exactly as the Hugging Face tokenizer upstream uses."""

    def __init__(self, path: Path, tokenizer, special_tokens: dict[str, str]):
        self.path = path
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        for role, token in special_tokens.items():
            token_id = tokenizer.token_to_id(token)
            if token_id is None:
                raise InputError(f"--tokenizer_path {str(path)!r}: no {role} {token!r} in its vocabulary "
                                 f"(PretrainDataset needs pad, bos and eos)")
            setattr(self, role, token)
            setattr(self, f"{role}_id", token_id)

    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(token) for token in ids], skip_special_tokens=skip_special_tokens)


def special_token_names(config_path: Path) -> dict[str, str]:
    """bos/eos/pad from a ``tokenizer_config.json`` beside the tokenizer (as AutoTokenizer reads them),
    else MiniMind's. A role the file sets to null (no such token) is refused: PretrainDataset needs all three,
    and upstream would fail later on a None id."""
    names = dict(MINIMIND_SPECIAL_TOKENS)
    if not config_path.is_file():
        return names
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{config_path}: not a readable JSON file ({exc})") from None
    for role in names:
        if role not in config:
            continue
        value = config[role]
        value = value.get("content") if isinstance(value, dict) else value
        if not isinstance(value, str):
            raise InputError(f'{config_path}: "{role}" is {json.dumps(config[role])}; PretrainDataset needs a '
                             f'{role} name (MiniMind\'s is "{names[role]}"), or leave the field out to use it')
        names[role] = value
    return names


def load_tokenizer(tokenizer_path=None):
    """``--tokenizer_path``: a directory holding ``tokenizer.json`` or the file itself; None: ``ByteTokenizer``."""
    if tokenizer_path is None:
        return ByteTokenizer()
    path = Path(tokenizer_path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        where = "this directory has no tokenizer.json" if path.is_dir() else "no such file or directory"
        raise InputError(f"--tokenizer_path {str(path)!r}: {where} (give a tokenizer.json or its directory)")
    from tokenizers import Tokenizer  # only runs that bring their own tokenizer need the library
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception for unreadable files
        raise InputError(f"--tokenizer_path {str(file)!r}: not a tokenizer.json that tokenizers can load "
                         f"({exc})") from None
    return JsonTokenizer(file, tokenizer, special_token_names(file.parent / "tokenizer_config.json"))
