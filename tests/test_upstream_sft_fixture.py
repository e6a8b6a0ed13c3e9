"""The SFT oracle (``course/minimind/sft.py``) against what the REAL upstream MiniMind code produced.

``tests/fixtures/upstream/minimind_sft_d65ef2c.pt`` was written by ``make_sft_fixture.py`` beside it (its
docstring says how to regenerate it) from upstream commit d65ef2c with upstream's pinned ``transformers`` and
``datasets``: the chat template's output, ``SFTDataset`` samples (prompt, input_ids, labels) in four forced
pre/post-processing modes and in upstream's own seeded order, and ``init_model`` loading weights files that
``train_full_sft`` saved. ``fixtures/upstream/minimind_tokenizer/`` is upstream's tokenizer, copied unchanged.
These tests only read them: everything must be equal, token for token and bit for bit.
"""
from __future__ import annotations

import functools
import json
import random

import pytest
import torch

from course.checks.framework import expect_equal, fail
from course.implementations import REPO_ROOT, load_module
from course.input_errors import InputError
from course.minimind import MiniMindConfig, MiniMindForCausalLM, load_tokenizer
from course.minimind.sft import (ADD_SYSTEM_RATIO, EMPTY_THINK_RATIO, SYSTEM_PROMPTS, SFTDataset,
                                 load_weights_like_upstream, render_chat, save_weights_like_upstream, sft_labels)

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "upstream"
FIXTURE = FIXTURES / "minimind_sft_d65ef2c.pt"
TOKENIZER_DIR = FIXTURES / "minimind_tokenizer"
MAKE_FIXTURE = load_module(FIXTURES / "make_fixture.py", "test_upstream_sft_make_fixture")

TEMPLATE_CAUSE = ("render_chat differs from the chat template: check the think-block split (text before the first "
                  "</think>, after the last <think>), the strip/lstrip of '\\n', and that only a first system "
                  "message opens the prompt")
PROMPT_CAUSE = ("pre/post-processing: draw from rng exactly as upstream draws from random (random() only when "
                "there is no system message, choice only when adding one; random() only when an empty think block "
                "is there), with its ratios and SYSTEM_PROMPTS in order; remove every empty block at once")
IDS_CAUSE = ("tokenization: special-token strings must become their ids (<|im_start|> -> 1), nothing added around "
             "the text (MiniMind's tokenizer has no post-processor), cut to max_length, then right-padded with 0")
LABELS_CAUSE = ("sft_labels: a span starts after the ids of '<|im_start|>assistant\\n', includes both ids of "
                "'<|im_end|>\\n', runs to the end when unterminated and stops at max_length; -100 elsewhere")


@functools.cache
def fixture() -> dict:
    return torch.load(FIXTURE, map_location="cpu", weights_only=True)


@functools.cache
def tokenizer():
    return load_tokenizer(TOKENIZER_DIR)


def expect_same(what: str, actual, expected, cause: str) -> None:
    """Equal strings or id lists; else ACTUAL vs EXPECTED around the first difference, and the likely cause."""
    if actual == expected:
        return
    at = next((i for i, (a, e) in enumerate(zip(actual, expected)) if a != e), min(len(actual), len(expected)))
    window = slice(max(0, at - 6), at + 6)
    fail(f"{what}: first difference at position {at} (lengths {len(actual)} and {len(expected)}), around it",
         actual[window], expected[window], f"likely cause: {cause}")


def dataset_for(tmp_path, jsonl: str, max_length: int, seed: int, mode=None) -> SFTDataset:
    path = tmp_path / "sft.jsonl"
    path.write_text(jsonl, encoding="utf-8")
    ratios = dict(zip(("add_system_ratio", "empty_think_ratio"), fixture()["modes"][mode])) if mode else {}
    return SFTDataset(path, tokenizer(), max_length, random.Random(seed), **ratios)


def expect_sample(what: str, dataset: SFTDataset, index: int, expected: dict) -> None:
    prompt = dataset.sample_prompt(index)
    expect_same(f"{what}: prompt", prompt, expected["prompt"], PROMPT_CAUSE)
    input_ids, labels = dataset.encode_prompt(prompt)
    expect_equal(f"{what}: dtypes", (input_ids.dtype, labels.dtype), (torch.long, torch.long))
    expect_same(f"{what}: input_ids", input_ids.tolist(), expected["input_ids"].tolist(), IDS_CAUSE)
    expect_same(f"{what}: labels", labels.tolist(), expected["labels"].tolist(), LABELS_CAUSE)


def case(name: str) -> dict:
    return next(entry for entry in fixture()["cases"] if entry["name"] == name)


def case_modes():
    return [(entry["name"], mode) for entry in fixture()["cases"] for mode in entry["modes"]]


# --- the fixture and upstream's constants -----------------------------------------------------------------------

def test_fixture_is_small_pinned_and_its_tokenizer_is_upstreams():
    size = FIXTURE.stat().st_size
    assert size <= 1_000_000, f"{FIXTURE.name} is {size:,} bytes; keep it <= 1 MB (make_sft_fixture.py's cases)"
    expect_equal("fixture's upstream commit", fixture()["commit"], MAKE_FIXTURE.PINNED_COMMIT)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        expect_equal(f"git blob of minimind_tokenizer/{name}", MAKE_FIXTURE.git_blob_id(TOKENIZER_DIR / name),
                     fixture()["blobs"][f"model/{name}"])


def test_system_prompts_and_ratios_are_upstreams():
    expect_equal("SYSTEM_PROMPTS (order matters: choice picks by position)", list(SYSTEM_PROMPTS),
                 fixture()["system_prompts"])
    expect_equal("(ADD_SYSTEM_RATIO, EMPTY_THINK_RATIO)", (ADD_SYSTEM_RATIO, EMPTY_THINK_RATIO),
                 (fixture()["ratios"]["add_system_ratio"], fixture()["ratios"]["empty_think_ratio"]))


def test_markers_are_upstreams(tmp_path):
    expected = fixture()["tokenizer"]
    tok = tokenizer()
    expect_equal("(bos_token, eos_token, pad_token_id)", (tok.bos_token, tok.eos_token, tok.pad_token_id),
                 (expected["bos_token"], expected["eos_token"], expected["pad_token_id"]))
    dataset = dataset_for(tmp_path, fixture()["sequential"]["jsonl"], 8, seed=0)
    expect_same("assistant_start_ids (ids of '<|im_start|>assistant\\n')", dataset.assistant_start_ids,
                expected["assistant_start_ids"], IDS_CAUSE)
    expect_same("end_ids (ids of '<|im_end|>\\n')", dataset.end_ids, expected["end_ids"], IDS_CAUSE)


# --- chat template, samples, labels ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [entry["name"] for entry in fixture()["cases"]])
def test_render_chat_equals_upstream_template_on_dataset_conversations(name):
    """The conversations as upstream's reader hands them over (absent fields read as None)."""
    conversations = json.loads(case(name)["jsonl"])["conversations"]
    expect_same(f"render_chat, case {name!r}", render_chat(conversations), case(name)["template"], TEMPLATE_CAUSE)


@pytest.mark.parametrize("index", range(len(fixture()["render_only"])))
def test_render_chat_equals_apply_chat_template_on_edge_cases(index):
    expected = fixture()["render_only"][index]
    expect_same(f"render_chat({expected['messages']!r})", render_chat(expected["messages"]), expected["text"],
                TEMPLATE_CAUSE)


@pytest.mark.parametrize("name,mode", case_modes())
def test_sft_dataset_equals_upstream(tmp_path, name, mode):
    """Upstream seeded ``random`` before the sample and forced the ratios; the same seed replays it here."""
    entry = case(name)
    dataset = dataset_for(tmp_path, entry["jsonl"], entry["max_length"], fixture()["sequential"]["seed"], mode)
    expect_sample(f"case {name!r}, {mode}, max_length {entry['max_length']}", dataset, 0, entry["modes"][mode])


def test_sft_dataset_replays_upstreams_seeded_order(tmp_path):
    """``random.seed(seed)`` once, then ``dataset[0], dataset[1], ..., dataset[0]``: one generator, many samples."""
    run = fixture()["sequential"]
    dataset = dataset_for(tmp_path, run["jsonl"], run["max_length"], run["seed"])
    for draw, expected in enumerate(run["samples"]):
        expect_sample(f"draw {draw} (dataset[{expected['index']}])", dataset, expected["index"], expected)


@pytest.mark.parametrize("name,mode", case_modes())
def test_sft_labels_on_upstreams_input_ids(name, mode):
    """The label rule alone, on upstream's own ids: a failure here is sft_labels, not the tokenizer."""
    expected = case(name)["modes"][mode]
    markers = fixture()["tokenizer"]
    labels = sft_labels(expected["input_ids"].tolist(), markers["assistant_start_ids"], markers["end_ids"],
                        case(name)["max_length"])
    expect_same(f"sft_labels, case {name!r}, {mode}", labels, expected["labels"].tolist(), LABELS_CAUSE)


# --- quirks of upstream's SFT mask, read off upstream's own output ----------------------------------------------

def test_quirk_the_newline_after_im_end_is_a_target():
    """Every answer's last two targets are ``<|im_end|>`` (2) and ``\\n`` (234): the model is trained to emit a
    newline after end-of-turn, a token generation never needs."""
    labels = case("single turn")["modes"]["no system prompt, think blocks kept"]["labels"]
    targets = labels[labels != -100].tolist()
    expect_equal("last two targets of a single-turn sample", targets[-2:], fixture()["tokenizer"]["end_ids"])
    expect_equal("first target (the empty think block is trained on too)", targets[0],
                 tokenizer().encode("<think>")[0])


def test_quirk_an_answer_starting_with_spaces_is_not_trained_once_the_think_block_is_removed():
    """Markers are matched as ids. Without the think block, ``assistant\\n`` meets the answer's leading spaces and
    the tokenizer merges ``\\n `` into one token (1925), so ``<|im_start|>assistant\\n`` never appears: the whole
    answer silently drops out of the loss (upstream removes the block in 80% of samples)."""
    entry = case("answer starting with two spaces")
    kept, removed = (entry["modes"][mode] for mode in ("no system prompt, think blocks kept",
                                                       "no system prompt, empty think removed"))
    expect_equal("targets with the think block", int((kept["labels"] != -100).sum()) > 0, True)
    expect_equal("targets without it", int((removed["labels"] != -100).sum()), 0)
    start = fixture()["tokenizer"]["assistant_start_ids"]
    ids = removed["input_ids"].tolist()
    marker = ids.index(start[0], ids.index(start[0]) + 1)   # the second <|im_start|>: the assistant's
    expect_equal("ids after the assistant's <|im_start|>", ids[marker:marker + len(start)],
                 start[:-1] + tokenizer().encode("\n ")[:1])


def test_quirk_a_sample_cut_before_its_answer_has_no_target_and_a_nan_loss():
    """max_length falls inside ``<|im_start|>assistant\\n``: every label is -100, and a batch of such samples
    has a NaN loss (cross entropy over zero targets), which upstream's loop would backpropagate."""
    expected = case("truncated before the answer")["modes"]["no system prompt, think blocks kept"]
    expect_equal("labels that are not -100", int((expected["labels"] != -100).sum()), 0)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1))
    loss = model(expected["input_ids"][None], labels=expected["labels"][None]).loss
    expect_equal("loss of a batch without targets is NaN", bool(loss.isnan()), True)


def test_quirk_a_sample_is_not_a_function_of_its_index(tmp_path):
    """Upstream draws from the global ``random``: ``dataset[0]`` read first and read again after the others
    differ (here: whether the empty think block stays). An explicit generator does not change that, it only
    makes it reproducible."""
    samples = fixture()["sequential"]["samples"]
    first, again = samples[0], samples[-1]
    expect_equal("indices of the first and last draw", (first["index"], again["index"]), (0, 0))
    expect_equal("dataset[0] the first and the second time are equal", first["prompt"] == again["prompt"], False)


# --- weights: train_full_sft's save, init_model's load ----------------------------------------------------------

def weights_model(state_dict: dict) -> MiniMindForCausalLM:
    model = MiniMindForCausalLM(MiniMindConfig(**fixture()["weights"]["config"]))
    model.load_state_dict(state_dict, strict=True)
    return model


def test_save_weights_like_upstream_equals_train_full_sft_file(tmp_path):
    weights = fixture()["weights"]
    save_weights_like_upstream(weights_model(weights["trained_state"]), tmp_path / "full_sft_16.pth")
    saved = torch.load(tmp_path / "full_sft_16.pth", weights_only=True)
    expect_equal("saved keys (any order)", sorted(saved), sorted(weights["saved"]))
    for name, expected in weights["saved"].items():
        expect_equal(f"{name}: dtype", saved[name].dtype, expected.dtype)
        if not torch.equal(saved[name], expected):
            fail(f"{name}: fp16 values", saved[name], expected, "likely cause: not .half() of the fp32 state_dict")


@pytest.mark.parametrize("index", range(len(fixture()["weights"]["loads"])))
def test_load_weights_like_upstream_equals_init_model(tmp_path, index):
    """Upstream's fresh model is put in first, so parameters the file does not set keep upstream's values."""
    load = fixture()["weights"]["loads"][index]
    torch.save(load["file"], tmp_path / "weights.pth")
    model = weights_model(load["before"])
    missing, unexpected = load_weights_like_upstream(model, tmp_path / "weights.pth")
    expect_equal(f"{load['name']}: missing_keys", list(missing), load["missing_keys"])
    expect_equal(f"{load['name']}: unexpected_keys", list(unexpected), load["unexpected_keys"])
    after = model.state_dict()
    for name, expected in load["after"].items():
        if not torch.equal(after[name], expected):
            fail(f"{load['name']}: {name} after loading", after[name], expected,
                 "likely cause: load_state_dict(strict=False) of the file, values cast to the model's fp32")


def test_quirk_strict_false_reports_a_tied_weight_missing_that_was_loaded():
    """``lm_head.weight`` is tied to the embedding: a file without it lists it as missing, yet its value is the
    file's embedding. A renamed key, by contrast, leaves the parameter at its fresh value, reported only in
    lists that upstream's init_model throws away."""
    loads = {load["name"]: load for load in fixture()["weights"]["loads"]}
    tied = loads["lm_head.weight (tied to the embedding) left out"]
    expect_equal("missing_keys without lm_head.weight", tied["missing_keys"], ["lm_head.weight"])
    expect_equal("lm_head.weight after loading equals the file's embedding",
                 torch.equal(tied["after"]["lm_head.weight"], tied["file"]["model.embed_tokens.weight"].float()),
                 True)
    renamed = loads["model.norm.weight renamed as torch.compile names it"]
    expect_equal("model.norm.weight after loading a renamed file is the fresh one",
                 torch.equal(renamed["after"]["model.norm.weight"], renamed["before"]["model.norm.weight"]), True)


# --- bad input ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,message", [
    ('{"conversations": [', "sft.jsonl:2: not valid JSON"),
    ('{"text": "pretraining data"}', 'sft.jsonl:2: expected an object with a non-empty "conversations" list'),
    ('{"conversations": [{"role": "user", "content": "q", "name": "x"}]}', "conversations[0] has the field 'name'"),
    ('{"conversations": [{"role": "system", "content": "s", "tools": null}, {"role": "user", "content": "q"},'
     ' {"role": "assistant", "content": "a", "tool_calls": "[{}]"}]}',
     "conversations[2] has 'tool_calls': tool use is not supported"),
    ('{"conversations": [{"role": "user", "content": 5}]}', "conversations[0]: 'content' must be a string or null"),
], ids=["bad JSON", "no conversations", "unknown field", "tool calls", "number as content"])
def test_bad_sft_lines_raise_one_line_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "sft.jsonl"
    path.write_text('{"conversations": [{"role": "user", "content": "fine"}]}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError) as raised:
        SFTDataset(path, tokenizer(), 16)
    expect_equal("one line", len(str(raised.value).splitlines()), 1)
    assert message in str(raised.value), f"ACTUAL: {raised.value}\nEXPECTED to contain: {message}"


def test_render_chat_refuses_tool_use_and_bad_arguments():
    with pytest.raises(ValueError, match=r"messages\[1\] has role 'tool'"):
        render_chat([{"role": "user", "content": "q"}, {"role": "tool", "content": "42"}])
    with pytest.raises(ValueError, match="assistant_start_ids"):
        sft_labels([1, 2], [], [2], 2)
    with pytest.raises(ValueError, match="max_length"):
        SFTDataset(FIXTURE, tokenizer(), 0)


def test_load_weights_like_upstream_names_a_bad_path(tmp_path):
    model = weights_model(fixture()["weights"]["trained_state"])
    with pytest.raises(InputError, match="no such file"):
        load_weights_like_upstream(model, tmp_path / "missing.pth")
    (tmp_path / "text.pth").write_text("not a checkpoint", encoding="utf-8")
    with pytest.raises(InputError, match="not a weights file"):
        load_weights_like_upstream(model, tmp_path / "text.pth")
