"""``PretrainDataset`` with upstream semantics (``dataset/lm_dataset.py::PretrainDataset``).

Each jsonl line is ``{"text": ...}``. A sample is ``[bos] + tokens[:max_length - 2] + [eos]``,
right-padded with the pad id to ``max_length``; ``labels`` equal ``input_ids`` except that pad
positions become -100. No shift here: the model's loss shifts. Texts are read on demand through a
byte-offset index (``JsonlTexts``), so a multi-GB pretrain jsonl does not have to fit in memory.
"""
from __future__ import annotations

import codecs
import json
from array import array
from pathlib import Path

import torch
from torch.utils.data import Dataset

from course.input_errors import InputError

from .model import IGNORE_INDEX
from .tokenizer import ByteTokenizer

TINY_CORPUS = Path(__file__).resolve().parents[2] / "labs" / "data" / "pretrain_tiny.jsonl"


def parse_json_line(line: bytes, where: str):
    """One jsonl line decoded; ``where`` (file:line) names it in the error."""
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{where}: not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg})") from None


def parse_text(line: bytes, where: str) -> str:
    """The ``text`` field of one jsonl line (``PretrainDataset``'s input)."""
    record = parse_json_line(line, where)
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise InputError(f'{where}: expected an object with a string "text" field')
    return record["text"]


def jsonl_records(path, parse=parse_text):
    """Yield ``(byte offset, parse(line, "file:line"))`` for every non-blank line; a bad line raises
    with file and line number, an empty file with its name. A UTF-8 BOM opening the file is skipped, as
    upstream's reader (``datasets.load_dataset('json')``) skips it; anywhere else it is a bad line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"data_path {str(path)!r}: {'not a file' if path.exists() else 'no such file'}")
    offset, found = 0, False
    with path.open("rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            start, offset = offset, offset + len(line)
            if line_no == 1 and line.startswith(codecs.BOM_UTF8):
                line, start = line[len(codecs.BOM_UTF8):], start + len(codecs.BOM_UTF8)
            if line.strip():
                found = True
                yield start, parse(line, f"{path}:{line_no}")
    if not found:
        raise InputError(f"{path}: no samples")


def read_jsonl_texts(path) -> list[str]:
    """Every text in memory (fine for the tiny corpus; ``JsonlTexts`` streams large files)."""
    return [text for _, text in jsonl_records(path)]


class JsonlRecords:
    """The records of a jsonl file, each ``parse(line, where)``, read on demand: one checking pass records each
    line's byte offset (8 bytes a line), then ``records[i]`` seeks to it. Memory stays bounded by the index,
    not the file."""

    def __init__(self, path, parse):
        self.path = Path(path)
        self.parse = parse
        self.offsets = array("q", (offset for offset, _ in jsonl_records(self.path, parse)))

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int):
        offset = self.offsets[index]
        with self.path.open("rb") as handle:  # opened per read: safe in DataLoader worker processes
            handle.seek(offset)
            line = handle.readline()
        return self.parse(line, f"{self.path} (byte {offset}, changed since it was indexed?)")


class JsonlTexts(JsonlRecords):
    """The ``text`` fields of a pretraining jsonl, read on demand."""

    def __init__(self, path):
        super().__init__(path, parse_text)


class PretrainDataset(Dataset):
    def __init__(self, data_path=TINY_CORPUS, tokenizer=None, max_length: int = 512):
        if not isinstance(max_length, int) or max_length < 3:
            raise ValueError(f"max_length must be an int >= 3 (bos + 1 token + eos), got {max_length!r}")
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.max_length = max_length
        self.samples = JsonlTexts(data_path)

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
