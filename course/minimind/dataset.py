"""``PretrainDataset`` with upstream semantics (``dataset/lm_dataset.py::PretrainDataset``).

Each jsonl line is ``{"text": ...}``. A sample is ``[bos] + tokens[:max_length - 2] + [eos]``,
right-padded with the pad id to ``max_length``; ``labels`` equal ``input_ids`` except that pad
positions become -100. No shift here: the model's loss shifts.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .model import IGNORE_INDEX
from .tokenizer import ByteTokenizer

TINY_CORPUS = Path(__file__).resolve().parents[2] / "labs" / "data" / "pretrain_tiny.jsonl"


def read_jsonl_texts(path) -> list[str]:
    """Read the ``text`` field of every line; a bad line raises with file and line number."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data_path {str(path)!r} does not exist or is not a file")
    texts = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f'{path}:{line_no}: expected an object with a string "text" field')
            texts.append(record["text"])
    if not texts:
        raise ValueError(f"{path}: no samples")
    return texts


class PretrainDataset(Dataset):
    def __init__(self, data_path=TINY_CORPUS, tokenizer=None, max_length: int = 512):
        if not isinstance(max_length, int) or max_length < 3:
            raise ValueError(f"max_length must be an int >= 3 (bos + 1 token + eos), got {max_length!r}")
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.max_length = max_length
        self.samples = read_jsonl_texts(data_path)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.tokenizer
        tokens = tok(str(self.samples[index]), add_special_tokens=False,
                     max_length=self.max_length - 2, truncation=True).input_ids
        tokens = [tok.bos_token_id] + tokens + [tok.eos_token_id]
        input_ids = torch.tensor(tokens + [tok.pad_token_id] * (self.max_length - len(tokens)),
                                 dtype=torch.long)
        labels = input_ids.clone()
        labels[input_ids == tok.pad_token_id] = IGNORE_INDEX
        return input_ids, labels
