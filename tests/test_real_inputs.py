"""Real MiniMind inputs: a ``tokenizer.json`` through ``--tokenizer_path`` and a large jsonl through an
offset index.

The tokenizer here is built by the test itself: a byte-level BPE trained on the tiny corpus with MiniMind's
three special tokens at ids 0, 1, 2 (as upstream's ``model/tokenizer.json``), so nothing is downloaded.
"""
from __future__ import annotations

import json
import math
import os
import re
import tracemalloc

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import DataLoader

import warm_python
from course.checks.framework import expect_close, expect_equal
from course.implementations import REPO_ROOT, load_module
from course.input_errors import InputError, refusing_input_errors
from course.minimind import TINY_CORPUS, JsonlTexts, PretrainDataset, load_tokenizer, read_jsonl_texts
from course.minimind import train_pretrain

STAGE = load_module(REPO_ROOT / "impl" / "train_pretrain_impl.py", "test_real_inputs_stage")
TRACE_LAB = load_module(REPO_ROOT / "labs" / "lesson14_trace_pretrain_step.py", "test_real_inputs_trace_lab")
BENCH = load_module(REPO_ROOT / "labs" / "bench_lesson14_streaming.py", "test_real_inputs_bench")
SPECIAL = {"pad_token": "<|endoftext|>", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
BPE_VOCAB = 512
TINY_MODEL = ["--hidden_size", "48", "--num_hidden_layers", "2"]


def corpus_texts(path) -> list[str]:
    """The texts, parsed here line by line, independently of the course's readers."""
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A directory like MiniMind's model/: tokenizer.json, byte-level BPE, specials at 0, 1, 2."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus_texts(TINY_CORPUS), trainer)
    directory = tmp_path_factory.mktemp("bpe")
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def word_level_tokenizer(path, tokens):
    """A minimal tokenizer.json whose vocabulary is exactly ``tokens``."""
    vocab = {token: i for i, token in enumerate(tokens)}
    Tokenizer(models.WordLevel(vocab=vocab, unk_token=tokens[0])).save(str(path))
    return path


# --- --tokenizer_path ---------------------------------------------------------------------------------------

def test_tokenizer_json_loads_from_its_directory_or_the_file(bpe_dir):
    raw = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    text = "Gradient accumulation 梯度累积 sums K micro-batches."
    for path in (bpe_dir, bpe_dir / "tokenizer.json"):
        tok = load_tokenizer(path)
        expect_equal(f"{path.name}: (pad, bos, eos) ids", (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id),
                     (0, 1, 2))
        expect_equal(f"{path.name}: vocab_size", tok.vocab_size, raw.get_vocab_size())
        expect_equal(f"{path.name}: ids", tok.encode(text), raw.encode(text, add_special_tokens=False).ids)
        expect_equal("truncated to max_length", tok(text, max_length=4, truncation=True).input_ids,
                     raw.encode(text).ids[:4])
        expect_equal("decode(encode(text))", tok.decode(tok.encode(text)), text)


def test_tokenizer_config_beside_it_names_the_special_tokens(tmp_path):
    """AutoTokenizer reads bos/eos/pad from tokenizer_config.json; so do we, else MiniMind's names."""
    word_level_tokenizer(tmp_path / "tokenizer.json", ["<unk>", "<s>", "</s>", "<pad>", "hello"])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"}), encoding="utf-8")
    tok = load_tokenizer(tmp_path)
    expect_equal("(pad, bos, eos) from tokenizer_config.json", (tok.pad_token_id, tok.bos_token_id,
                                                                 tok.eos_token_id), (3, 1, 2))


@pytest.mark.parametrize("role", SPECIAL)
def test_a_missing_special_token_is_named(tmp_path, role):
    kept = [token for name, token in SPECIAL.items() if name != role] + ["hello"]
    path = word_level_tokenizer(tmp_path / "tokenizer.json", kept)
    with pytest.raises(ValueError, match=rf"--tokenizer_path .*no {role} '{SPECIAL[role]}'".replace("|", r"\|")):
        load_tokenizer(path)


def test_a_directory_without_tokenizer_json_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--tokenizer_path .*has no tokenizer\.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match=r"--tokenizer_path .*no such file"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--tokenizer_path .*not a tokenizer\.json"):
        load_tokenizer(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    expect_equal("stage assembly exit code", STAGE.main(["--impl", "reference", "--tokenizer_path", str(empty)]), 2)
    assert "--tokenizer_path" in capsys.readouterr().err


def test_dataset_with_the_bpe_tokenizer_has_upstream_layout(bpe_dir):
    """[bos] + ids[:max_length - 2] + [eos], pads 0, labels -100 on pads: built here from tokenizers itself."""
    raw = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    max_length = 40
    dataset = PretrainDataset(TINY_CORPUS, load_tokenizer(bpe_dir), max_length=max_length)
    texts = corpus_texts(TINY_CORPUS)
    expect_equal("samples", len(dataset), len(texts))
    for index, text in enumerate(texts):
        ids = [1] + raw.encode(text, add_special_tokens=False).ids[:max_length - 2] + [2]
        expected = torch.tensor(ids + [0] * (max_length - len(ids)))
        input_ids, labels = dataset[index]
        assert torch.equal(input_ids, expected), f"sample {index}: ACTUAL {input_ids} EXPECTED {expected}"
        assert torch.equal(labels, expected.masked_fill(expected == 0, -100)), f"sample {index} labels: {labels}"


def first_logged_loss(output: str) -> float:
    line = next(line for line in output.splitlines() if "loss: " in line)
    return float(line.split("loss: ")[1].split(",")[0])


def test_stage_assembly_trains_and_saves_with_the_bpe_tokenizer(bpe_dir, tmp_path, capsys):
    argv = ["--impl", "reference", "--preset", "tiny", "--epochs", "1", "--log_interval", "1", "--tokenizer_path", str(bpe_dir),
            "--out_dir", str(tmp_path)]
    expect_equal("stage assembly exit code", STAGE.main(argv), 0)
    out = capsys.readouterr().out
    weights = torch.load(tmp_path / "pretrain_48.pth", weights_only=True)
    expect_equal("embedding rows = the tokenizer's vocabulary", weights["model.embed_tokens.weight"].shape[0],
                 BPE_VOCAB)
    # An untrained model predicts nearly uniformly: its first loss is close to ln(vocab).
    expect_close("first logged loss vs ln(512)", first_logged_loss(out), math.log(BPE_VOCAB), rtol=0, atol=0.3)
    expect_equal("exit code of a --vocab_size that differs", STAGE.main(argv + ["--vocab_size", "6400"]), 2)
    assert "--vocab_size 6400 differs from the tokenizer's vocabulary (512" in capsys.readouterr().err


def test_oracle_trainer_trains_with_the_bpe_tokenizer(bpe_dir, capsys):
    train_pretrain.main(["--epochs", "1", "--batch_size", "16", "--accumulation_steps", "1", "--log_interval", "1",
                         "--max_seq_len", "48", "--device", "cpu", "--tokenizer_path", str(bpe_dir)] + TINY_MODEL)
    losses = [float(line.split("loss: ")[1].split(",")[0]) for line in capsys.readouterr().out.splitlines()
              if "loss: " in line]
    expect_equal("logged steps (160 samples / 16)", len(losses), 10)
    expect_close("first logged loss vs ln(512)", losses[0], math.log(BPE_VOCAB), rtol=0, atol=0.3)
    assert losses[-1] < losses[0], f"loss did not fall over the epoch: {losses}"
    with pytest.raises(ValueError, match="--vocab_size 100 differs"):
        train_pretrain.main(["--tokenizer_path", str(bpe_dir), "--vocab_size", "100"])


def test_trace_lab_runs_with_the_bpe_tokenizer(bpe_dir):
    proc = warm_python.run(["labs/lesson14_trace_pretrain_step.py", "--tokenizer_path", str(bpe_dir)], cwd=REPO_ROOT,
                           env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"vocab={BPE_VOCAB}" in proc.stdout, proc.stdout
    loss = float(proc.stdout.split("\nloss=")[1].split()[0])
    expect_close("traced loss vs ln(512)", loss, math.log(BPE_VOCAB), rtol=0, atol=0.3)


# --- --data_path through the offset index -------------------------------------------------------------------

def test_offset_index_reads_the_texts_of_the_file(tmp_path):
    expect_equal("tiny corpus through the index", list(JsonlTexts(TINY_CORPUS)), corpus_texts(TINY_CORPUS))
    expect_equal("tiny corpus in memory", read_jsonl_texts(TINY_CORPUS), corpus_texts(TINY_CORPUS))
    path = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"text": "first"}), "", json.dumps({"text": "第二 ✓"}, ensure_ascii=False), "  ",
             json.dumps({"text": "crlf", "id": 3})]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
    expect_equal("blank lines skipped, CRLF and UTF-8 read", [JsonlTexts(path)[i] for i in (2, 0, 1)],
                 ["crlf", "first", "第二 ✓"])


def test_pretrain_dataset_on_the_tiny_corpus_is_bitwise_unchanged():
    """The built-in run's samples: byte ids + 3 between bos and eos, as before the offset index."""
    dataset = PretrainDataset(TINY_CORPUS, max_length=64)
    for index, text in enumerate(corpus_texts(TINY_CORPUS)):
        ids = [1] + [byte + 3 for byte in text.encode("utf-8")][:62] + [2]
        expected = torch.tensor(ids + [0] * (64 - len(ids)))
        input_ids, labels = dataset[index]
        assert torch.equal(input_ids, expected), f"sample {index}: ACTUAL {input_ids} EXPECTED {expected}"
        assert torch.equal(labels, expected.masked_fill(expected == 0, -100)), f"sample {index} labels"


@pytest.mark.parametrize("bad, message", [
    (b"{not json", r"bad\.jsonl:3: not valid JSON"),
    (b'{"txt": "wrong key"}', r'bad\.jsonl:3: expected an object with a string "text" field'),
    (b'{"text": "\xff"}', r"bad\.jsonl:3: not valid UTF-8"),
], ids=["json", "key", "utf8"])
def test_a_bad_line_raises_with_file_and_line(tmp_path, bad, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n\n' + bad + b"\n")
    with pytest.raises(ValueError, match=message):
        PretrainDataset(path, max_length=16)


def test_a_bom_opening_the_file_is_skipped_by_every_reader(tmp_path):
    """Upstream reads with datasets.load_dataset('json'), which skips a UTF-8 BOM at the start of the file."""
    plain, with_bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    plain.write_bytes(b'{"text": "first"}\n{"text": "second"}\n')
    with_bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    expect_equal("read_jsonl_texts with a BOM", read_jsonl_texts(with_bom), ["first", "second"])
    expect_equal("JsonlTexts with a BOM (reads by seeking)", list(JsonlTexts(with_bom)), ["first", "second"])
    expected, actual = PretrainDataset(plain, max_length=16), PretrainDataset(with_bom, max_length=16)
    for index in range(len(expected)):
        for name, got, want in zip(("input_ids", "labels"), actual[index], expected[index]):
            assert torch.equal(got, want), f"sample {index} {name}: ACTUAL {got} EXPECTED {want}"
    later = tmp_path / "later.jsonl"
    later.write_bytes(b'{"text": "first"}\n\xef\xbb\xbf{"text": "second"}\n')
    with pytest.raises(InputError, match=r"later\.jsonl:2: not valid JSON"):
        read_jsonl_texts(later)


# entry point: (what follows `python`, its flags for a small run)
ENTRY_POINTS = {
    "oracle": (["-m", "course.minimind.train_pretrain"], ["--epochs", "1"] + TINY_MODEL),
    "stage": (["impl/train_pretrain_impl.py"], ["--impl", "reference", "--preset", "tiny"]),
    "trace_lab": (["labs/lesson14_trace_pretrain_step.py"], []),
}


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_a_bad_line_ends_each_entry_point_with_one_line(tmp_path, entry_point):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n\n{not json\n')
    command, flags = ENTRY_POINTS[entry_point]
    proc = warm_python.run([*command, *flags, "--data_path", str(path)], cwd=REPO_ROOT, env=dict(os.environ),
                           timeout=300)
    expect_equal(f"{entry_point} exit code", proc.returncode, 2)
    expect_equal(f"{entry_point} stderr", proc.stderr.splitlines(),
                 [f"error: {path}:3: not valid JSON (Expecting property name enclosed in double quotes)"])


@pytest.mark.parametrize("entry_point", ["oracle", "stage", "trace_lab"])
def test_a_missing_tokenizer_ends_each_entry_point_naming_the_path(tmp_path, capsys, entry_point):
    """The mains as their command lines run them (the oracle's wrapped in its ``__main__`` block)."""
    main = {"oracle": refusing_input_errors(train_pretrain.main), "stage": STAGE.main,
            "trace_lab": TRACE_LAB.main}[entry_point]
    missing = tmp_path / "no_tokenizer"
    flags = ENTRY_POINTS[entry_point][1]
    expect_equal(f"{entry_point} exit code", main([*flags, "--tokenizer_path", str(missing)]), 2)
    expect_equal(f"{entry_point} stderr", capsys.readouterr().err.splitlines(),
                 [f"error: --tokenizer_path {str(missing)!r}: no such file or directory (give a tokenizer.json "
                  f"or its directory)"])


@pytest.mark.parametrize("value", [None, {"content": None}], ids=["null", "content_null"])
@pytest.mark.parametrize("role", SPECIAL)
def test_a_null_special_token_is_refused_naming_field_and_file(bpe_dir, tmp_path, role, value):
    """AutoTokenizer would give a None id for it; upstream's dataset then fails on [None] + tokens."""
    (tmp_path / "tokenizer.json").write_bytes((bpe_dir / "tokenizer.json").read_bytes())
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({**SPECIAL, role: value}), encoding="utf-8")
    with pytest.raises(InputError, match=rf'^{re.escape(str(config))}: "{role}" is {re.escape(json.dumps(value))}; '):
        load_tokenizer(tmp_path)


def test_preset_minimind_is_upstreams_pretrain_configuration(tmp_path):
    args = STAGE.parse_args(["--preset", "minimind", "--data_path", "data.jsonl", "--tokenizer_path", "model"])
    upstream = train_pretrain.build_parser().parse_args([])  # the oracle's copy of upstream's CLI defaults
    for name in ("epochs", "batch_size", "learning_rate", "accumulation_steps", "grad_clip", "log_interval",
                 "save_interval", "hidden_size", "num_hidden_layers", "use_moe", "dtype"):
        expect_equal(f"--preset minimind {name} vs upstream's default", getattr(args, name), getattr(upstream, name))
    # Upstream's trainer defaults to 340; its README recommends max_seq_len≈768 for pretrain_t2t_mini.jsonl.
    expect_equal("--preset minimind max_seq_len", args.max_seq_len, 768)
    expect_equal("--preset minimind val_fraction (upstream holds nothing out)", args.val_fraction, 0.0)
    expect_equal("--preset minimind data_path, tokenizer_path", (args.data_path, args.tokenizer_path),
                 ("data.jsonl", "model"))


def test_preset_stories_defaults_to_the_stories_tokenizer_and_tiny_keeps_the_byte_one():
    """The stories preset reads labs/data/stories_tokenizer (upstream's BPE recipe on the stories: 699 tokens,
    specials at 0, 1, 2); --tokenizer_path overrides it; the tiny preset keeps the built-in byte tokenizer."""
    stories = STAGE.parse_args([])
    expect_equal("--preset stories tokenizer_path", stories.tokenizer_path,
                 str(REPO_ROOT / "labs" / "data" / "stories_tokenizer" / "tokenizer.json"))
    tokenizer = load_tokenizer(stories.tokenizer_path)
    expect_equal("stories tokenizer: (vocabulary, pad, bos, eos ids)",
                 (tokenizer.vocab_size, tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id),
                 (699, 0, 1, 2))
    expect_equal("--tokenizer_path over the preset", STAGE.parse_args(["--tokenizer_path", "model"]).tokenizer_path,
                 "model")
    expect_equal("--preset tiny tokenizer_path (the byte tokenizer)",
                 STAGE.parse_args(["--preset", "tiny"]).tokenizer_path, None)


@pytest.mark.parametrize("given", [[], ["--tokenizer_path", "model"], ["--data_path", "data.jsonl"]],
                         ids=["neither", "no_data_path", "no_tokenizer_path"])
def test_preset_minimind_without_upstreams_inputs_is_one_line(capsys, given):
    expect_equal("exit code", STAGE.main(["--impl", "reference", "--preset", "minimind", *given]), 2)
    expect_equal("stderr", capsys.readouterr().err.splitlines(),
                 ["error: --preset minimind trains on upstream's inputs: give --data_path (e.g. "
                  "../minimind/dataset/pretrain_t2t_mini.jsonl) and --tokenizer_path (e.g. ../minimind/model)"])


def peak_python_bytes(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_jsonl_is_indexed_and_read_in_bounded_memory(tmp_path):
    """Python's peak allocation (tracemalloc) while indexing an ~8 MB file and reading batches from it.

    Bound: the index is 8 bytes a line; allow 4x (array over-allocation and the copy while it grows) plus
    1 MiB for the line being parsed and a batch's texts. A reader that keeps every text exceeds it: the
    same measurement of ``read_jsonl_texts`` is the control that shows the bound can fail."""
    path = tmp_path / "large.jsonl"
    lines = BENCH.write_large_jsonl(path, 8 * 2**20)
    size = path.stat().st_size
    bound = 32 * lines + 2**20
    order = torch.randperm(lines).tolist()  # the trainer's shuffle (~36 bytes a line), not the dataset's cost

    def index_and_read():
        dataset = PretrainDataset(path, max_length=64)
        loader = DataLoader(dataset, batch_size=32, sampler=order)
        for _, _ in zip(range(20), loader):
            pass
        expect_equal("lines indexed", len(dataset), lines)

    streamed = peak_python_bytes(index_and_read)
    assert streamed < bound, (f"offset index peak ACTUAL {streamed:,} bytes, EXPECTED < {bound:,} "
                              f"(32 bytes x {lines:,} lines + 1 MiB) for a {size:,}-byte file")
    in_memory = peak_python_bytes(lambda: read_jsonl_texts(path))
    assert in_memory > size > bound, (f"control: read_jsonl_texts peak {in_memory:,} bytes should exceed the "
                                      f"file ({size:,}) and the bound ({bound:,})")


def test_streamed_and_in_memory_samples_agree_on_a_large_file(tmp_path):
    path = tmp_path / "large.jsonl"
    BENCH.write_large_jsonl(path, 2 * 2**20)
    texts = corpus_texts(path)
    streamed = JsonlTexts(path)
    expect_equal("lines", len(streamed), len(texts))
    for index in torch.randperm(len(texts))[:500].tolist():
        expect_equal(f"text {index}", streamed[index], texts[index])
