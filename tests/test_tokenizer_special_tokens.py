"""Special tokens inside text, as Hugging Face tokenizes them for MiniMind: ``<|endoftext|>``, ``<|im_start|>`` and
``<|im_end|>`` become ids 0, 1, 2 (SFT prompts are made of them), and the tokenizers name them (``bos_token``,
``eos_token``, ``pad_token``) so upstream's SFT markers can be built. Text without them keeps its ids."""
from __future__ import annotations

import random

from course.checks.framework import expect_equal
from course.implementations import REPO_ROOT
from course.minimind import ByteTokenizer, load_tokenizer
from course.minimind.sft import SFTDataset

UPSTREAM_TOKENIZER = REPO_ROOT / "tests" / "fixtures" / "upstream" / "minimind_tokenizer"
CHAT = "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\nHi<|im_end|>\n<|endoftext|>"


def byte_ids(text: str) -> list[int]:
    return [byte + ByteTokenizer.byte_offset for byte in text.encode("utf-8")]


def test_byte_tokenizer_maps_special_token_strings_to_their_ids():
    tok = ByteTokenizer()
    expected = [1] + byte_ids("user\n你好") + [2] + byte_ids("\n") + [1] + byte_ids("assistant\nHi") + [2] \
        + byte_ids("\n") + [0]
    expect_equal("ids of a chat string", tok.encode(CHAT), expected)
    expect_equal("decode(encode(chat), skip_special_tokens=False)", tok.decode(tok.encode(CHAT), False), CHAT)
    expect_equal("a partial special token stays bytes", tok.encode("<|im_start|"), byte_ids("<|im_start|"))


def test_byte_tokenizer_keeps_every_other_text_byte_for_byte():
    text = "Gradient accumulation 梯度累积 <|not special|> <im_start>"
    expect_equal("ids of text without special tokens", ByteTokenizer().encode(text), byte_ids(text))


def test_both_tokenizers_name_their_special_tokens():
    for tok in (ByteTokenizer(), load_tokenizer(UPSTREAM_TOKENIZER)):
        name = type(tok).__name__
        expect_equal(f"{name}: (pad, bos, eos) tokens", (tok.pad_token, tok.bos_token, tok.eos_token),
                     ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
        expect_equal(f"{name}: their ids", [tok.encode(t)[0] for t in (tok.pad_token, tok.bos_token, tok.eos_token)],
                     [0, 1, 2])


def test_upstream_tokenizer_splits_added_tokens_out_of_text():
    tok = load_tokenizer(UPSTREAM_TOKENIZER)
    ids = tok.encode(CHAT)
    expect_equal("special ids in order", [i for i in ids if i < 3], [1, 2, 1, 2, 0])
    expect_equal("<think> (an added, non-special token)", tok.encode("<think>"), [25])
    expect_equal("decode(encode(chat), skip_special_tokens=False)", tok.decode(ids, skip_special_tokens=False), CHAT)


def test_sft_dataset_runs_on_the_byte_tokenizer(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text('{"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n',
                    encoding="utf-8")
    dataset = SFTDataset(path, ByteTokenizer(), 48, random.Random(0), add_system_ratio=0.0, empty_think_ratio=1.0)
    expect_equal("assistant_start_ids", dataset.assistant_start_ids, [1] + byte_ids("assistant\n"))
    expect_equal("end_ids", dataset.end_ids, [2] + byte_ids("\n"))
    input_ids, labels = dataset[0]
    targets = labels[labels != -100].tolist()
    expect_equal("targets", targets, byte_ids("<think>\n\n</think>\n\na") + [2] + byte_ids("\n"))
