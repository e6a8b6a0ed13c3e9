"""Writes labs/data/stories_tokenizer/tokenizer.json: a word-level tokenizer for the built-in stories corpora.

Upstream MiniMind trains its own byte-level BPE (scripts/train_tokenizer.py: ``models.BPE``, the ByteLevel
pre-tokenizer without a prefix space, the special tokens <|endoftext|>, <|im_start|>, <|im_end|> as ids 0, 1, 2,
the 256-byte initial alphabet). This is the same recipe on the course's own texts: the pretraining corpus
(labs/data/pretrain_stories.jsonl) and the chat corpus's training split (labs/data/sft_stories.jsonl, "role\\n"
plus the content of each turn). The corpora have a few hundred distinct words, so the merges stop at about 700
tokens, nearly one per word: " beach", " Mia" and " book" are single tokens. That is what lets lesson 17's
one-layer model answer "Where did Mia go?" by copying ONE token of the story (upstream's 6400-token tokenizer
splits them: " be"+"ach", " M"+"ia"; the byte tokenizer into single bytes). The held-out split is not read.

    python labs/data/make_stories_tokenizer.py            # rewrites the committed file
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "stories_tokenizer" / "tokenizer.json"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_LIMIT = 6400  # upstream's; these corpora run out of merges long before it


def texts() -> list[str]:
    lines = [json.loads(line)["text"] for line in (HERE / "pretrain_stories.jsonl").read_text("utf-8").splitlines()]
    for line in (HERE / "sft_stories.jsonl").read_text("utf-8").splitlines():
        lines += [turn["role"] + "\n" + turn["content"] for turn in json.loads(line)["conversations"]]
    return lines


def train():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_LIMIT, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def main(argv=None) -> int:
    out = Path(argv[0]) if argv else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = train()
    tokenizer.save(str(out))
    print(f"wrote {out}: {tokenizer.get_vocab_size()} tokens, {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
