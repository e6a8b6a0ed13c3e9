"""A byte-level tokenizer with MiniMind's special token ids (no download needed).

Upstream ships a 6400-token byte-level BPE whose special tokens are ``<|endoftext|>`` = 0
(pad/unk), ``<|im_start|>`` = 1 (bos) and ``<|im_end|>`` = 2 (eos). We keep those ids and the
vocabulary size, and map every UTF-8 byte to one id after them, so any text (Chinese too)
round-trips without a trained merge table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Encoding:
    input_ids: list[int]


class ByteTokenizer:
    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    special_tokens = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    byte_offset = 3
    vocab_size = 6400

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = [byte + self.byte_offset for byte in text.encode("utf-8")]
        if add_special_tokens:
            ids = [self.bos_token_id] + ids + [self.eos_token_id]
        return ids

    def __call__(self, text: str, add_special_tokens: bool = False,
                 max_length: Optional[int] = None, truncation: bool = False) -> Encoding:
        """The slice of the Hugging Face tokenizer call that ``PretrainDataset`` uses."""
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        if truncation and max_length is not None:
            if max_length < 0:
                raise ValueError(f"max_length must be >= 0, got {max_length}")
            ids = ids[:max_length]
        return Encoding(input_ids=ids)

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
