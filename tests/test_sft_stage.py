"""The main job's second stage (impl/train_full_sft_impl.py) and ``python -m course chat``: a tiny end-to-end SFT run
on the reference, the TODO path, bad inputs, the mask path, held-out scoring, and the chat REPL; and the claim of
the README and lesson 17 §10 about the documented two-stage run."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pty
import random
import re
import time
import warnings
from types import SimpleNamespace

import pytest
from report_cards import assert_card_basics
import torch
from doc_runs import run_documented
from stub_copies import untouched_impl
from tensorboard_events import expect_float32_close, tensorboard_scalars

from course.checks.framework import expect_equal
from course.cli import main as course_main
from course.implementations import REPO_ROOT, load_implementation, load_module
from course.minimind import MiniMindConfig, MiniMindForCausalLM, SFTDataset, get_lr, load_tokenizer
from course.minimind.sft import render_chat
from course.trainers import chat as chat_module
from course.trainers import pretrain
from course.trainers.pretrain import STORIES_TOKENIZER
from course.trainers.sft import (STORIES_SFT_CORPUS, STORIES_SFT_HELDOUT, AssistantMaskedDataset, answers_table,
                                 exact_answers, heldout_questions, micro_batches, model_from_weights, score_line)

STAGE_PATH = REPO_ROOT / "impl" / "train_full_sft_impl.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCORE = re.compile(r"held-out exact answers: (\d+)/(\d+) \((\d+\.\d) %\)")


def lines_of(path, count: int, destination):
    destination.write_text("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:count]),
                           encoding="utf-8")
    return destination


STORIES_VOCAB_SIZE = load_tokenizer(STORIES_TOKENIZER).vocab_size   # the stories preset's tokenizer


def tiny_weights(path, hidden_size: int = 32, num_hidden_layers: int = 1, half: bool = False,
                 vocab_size: int = STORIES_VOCAB_SIZE):
    """A fresh model's state dict, as the pretrain stage saves it (fp32) or as upstream does (fp16)."""
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                                               vocab_size=vocab_size))
    torch.save({k: v.half() if half else v for k, v in model.state_dict().items()}, path)
    return path


def run_stage(argv, label: str):
    """``main(argv)`` of the stage in-process: (exit code, stdout, stderr, warnings emitted)."""
    stage = load_module(STAGE_PATH, label)
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        code = stage.main(argv)
    return SimpleNamespace(code=code, out=out.getvalue(), err=err.getvalue(), warnings=[str(w.message) for w in caught])


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory):
    """24 training and 6 held-out chats, and the pretrain weights of a hidden-32, one-layer model."""
    tmp = tmp_path_factory.mktemp("sft_inputs")
    return SimpleNamespace(tmp=tmp, train=lines_of(STORIES_SFT_CORPUS, 24, tmp / "train.jsonl"),
                           heldout=lines_of(STORIES_SFT_HELDOUT, 6, tmp / "heldout.jsonl"),
                           weights=tiny_weights(tmp / "pretrain_32.pth"))


def stage_argv(inputs, out_dir, *extra):
    # 24 chats in micro-batches of 4, K 2: 3 updates; a validation loss at updates 0, 2 and 3
    return ["--data_path", str(inputs.train), "--heldout_path", str(inputs.heldout), "--from_weight",
            str(inputs.weights), "--hidden_size", "32", "--num_hidden_layers", "1", "--max_seq_len", "384",
            "--epochs", "1", "--batch_size", "4", "--accumulation_steps", "2", "--learning_rate", "3e-3",
            "--eval_interval", "2", "--log_interval", "1", "--show_questions", "2", "--max_new_tokens", "4",
            "--out_dir", str(out_dir), "--device", "cpu", *extra]


@pytest.fixture(scope="module")
def short_run(tiny_inputs):
    """The stage's run, its wall time measured around it, and the loss figure it drew."""
    out_dir, figures, plot_losses = tiny_inputs.tmp / "out", [], pretrain.plot_losses

    def recording_plot_losses(*args, **kwargs):
        figures.append(plot_losses(*args, **kwargs))
        return figures[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pretrain, "plot_losses", recording_plot_losses)   # the stage imports it when it loads
        started = time.perf_counter()
        run = run_stage(stage_argv(tiny_inputs, out_dir, "--impl", "reference", "--metrics_json",
                                   str(out_dir / "m.json"), "--tensorboard", str(out_dir / "tensorboard")),
                        "test_sft_stage_short_run")
        run.seconds = time.perf_counter() - started
    run.out_dir, run.figures = out_dir, figures
    return run


def test_the_stage_runs_end_to_end_on_the_reference(short_run, tiny_inputs):
    assert short_run.code == 0, short_run.out + short_run.err
    expect_equal("warnings emitted", short_run.warnings, [])
    metrics = json.loads((short_run.out_dir / "m.json").read_text())
    expect_equal("validation updates", [update for update, _ in metrics["val_loss"]], [0, 2, 3])
    expect_equal("train-loss updates", [update for update, _ in metrics["train_loss"]], [1, 2, 3])
    answers = len(heldout_questions(tiny_inputs.heldout))
    score = SCORE.search(short_run.out)
    assert score and int(score[2]) == answers, f"score line ACTUAL {score and score[0]!r}, EXPECTED .../{answers}"
    expect_equal("exact_answers in the metrics", metrics["exact_answers"], [int(score[1]), answers])
    for when in ("before SFT", "after SFT"):
        expect_equal(f"answers printed {when}", len(re.findall(rf"^{when}: .+ -> .+ \(reference .+\)$", short_run.out,
                                                                 re.M)), 2)


def test_the_stage_writes_upstream_fp16_weights_report_and_curves(short_run):
    state_dict = torch.load(short_run.out_dir / "full_sft_32.pth", weights_only=True)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=STORIES_VOCAB_SIZE))
    expect_equal("saved keys", sorted(state_dict), sorted(model.state_dict()))
    expect_equal("saved dtypes", {v.dtype for v in state_dict.values()}, {torch.float16})
    expect_equal("loss figure signature", (short_run.out_dir / "full_sft_32_loss.png").read_bytes()[:8], PNG_SIGNATURE)
    report = (short_run.out_dir / "full_sft_32_report.md").read_text(encoding="utf-8")
    val = [m.groups() for m in map(re.compile(r"update (\d+): val_loss ([\d.]+)").fullmatch, printed_lines(short_run))
           if m]
    expect_equal("validation updates printed, each on a line of its own", [u for u, _ in val], ["0", "2", "3"])
    missing = [(u, v) for u, v in val if f"| {u} | " not in report or f" {v} |" not in report]
    assert not missing, f"report rows ACTUAL missing {missing}, EXPECTED every val loss of {val}:\n{report}"
    assert SCORE.search(report), f"report ACTUAL has no score line, EXPECTED one:\n{report}"


def test_tensorboard_holds_each_update_the_evaluations_and_the_speed_per_log_line(short_run):
    """3 updates, a log line after each (--log_interval 1): the update's loss (the metrics'), upstream's lr of the
    update (get_lr over the 3 updates), a pre-clip norm, the validation losses, and target tokens/s and MFU per log
    line; the run's MFU is also on the report card, against the peak named there."""
    scalars = tensorboard_scalars(short_run.out_dir / "tensorboard")
    metrics = json.loads((short_run.out_dir / "m.json").read_text())
    expect_float32_close("train/loss", scalars["train/loss"], metrics["train_loss"])
    expect_float32_close("train/lr", scalars["train/lr"], [(u, get_lr(u - 1, 3, 3e-3)) for u in (1, 2, 3)])
    expect_equal("train/grad_norm updates", [u for u, norm in scalars["train/grad_norm"] if norm > 0], [1, 2, 3])
    expect_float32_close("val/loss", scalars["val/loss"], metrics["val_loss"])
    for tag in ("perf/tokens_per_second", "perf/mfu"):
        expect_equal(f"{tag} updates", [u for u, value in scalars[tag] if value > 0], [1, 2, 3])
    report = (short_run.out_dir / "full_sft_32_report.md").read_text(encoding="utf-8")
    mfu = re.search(r"^MFU ([\d.]+)%: ([\d,]+) training FLOPs of the non-padding positions .* in ([\d.]+) s of "
                    r"sft_epoch, against ([\d,.]+) GFLOP/s \(measured: .+\)$", report, re.M)
    assert mfu, f"report ACTUAL has no MFU line, EXPECTED one:\n{report}"
    percent, flops, seconds, peak = (float(v.replace(",", "")) for v in mfu.groups())
    expected = 100 * flops / seconds / (peak * 1e9)
    printed_digits = 0.005 + (0.0005 / seconds + 0.05 / peak) * expected * 1.01   # 2 decimals; 3; 1
    assert abs(percent - expected) <= printed_digits, (
        f"MFU ACTUAL {percent}%, EXPECTED {expected:.3f}% = {flops:,.0f} FLOPs / {seconds} s / {peak} GFLOP/s "
        f"(to the printed digits, {printed_digits:.3f})")
    assert abs(100 * metrics["mfu"] - percent) <= 0.005, (metrics["mfu"], percent)


def test_position_flops_are_flopcountermodes_per_position_times_the_real_positions():
    """A micro-batch of 2 rows of 6 positions, 3 of them padding: FlopCounterMode's training count of the real
    model on the whole batch, per position, times the 9 real positions."""
    from course.runs.step_costs import counted_flops, measured_model
    from course.trainers.sft import position_flops
    config = MiniMindConfig(hidden_size=16, num_hidden_layers=1, vocab_size=64)
    input_ids = torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 2, 0, 0, 0]])
    _, training = counted_flops(measured_model(config), input_ids, input_ids.clone())
    batch = SimpleNamespace(input_ids=input_ids)
    expect_equal("position_flops", position_flops(config, [batch, batch], pad_token_id=0), 2 * training / 12 * 9)


def printed_lines(run) -> list[str]:
    return run.out.splitlines()   # also splits the progress bar's \r


def test_the_stage_shows_its_progress_like_the_pretrain_stage(short_run):
    """An epoch's progress bar (micro-batches, tokens/s) and, beneath it, a log line per --log_interval updates."""
    lines = printed_lines(short_run)
    bars = [line for line in lines if line.startswith("epoch 1/1: ")]
    assert bars and re.fullmatch(r"epoch 1/1: 100%\|.+\| 6/6 \[.+, [\d,]+ tok/s\]", bars[-1]), (
        f"last progress bar ACTUAL {bars[-1:]}, EXPECTED 'epoch 1/1: 100%|...| 6/6 [..., N tok/s]' (6 micro-batches)")
    expect_equal("log lines, each on a line of its own", [line.split(",")[0] for line in lines
                                                          if re.match(r"Epoch:.+, loss: [\d.]+, lr: ", line)],
                 ["Epoch:[1/1](1/3)", "Epoch:[1/1](2/3)", "Epoch:[1/1](3/3)"])


def test_the_report_card_shows_wall_time_relative_paths_and_the_shown_answers(short_run, tiny_inputs):
    """The wall time (within the run's), the paths inside the repository relative to it, and each question shown
    before and after SFT beside its story and reference answer."""
    report = (short_run.out_dir / "full_sft_32_report.md").read_text(encoding="utf-8")
    assert_card_basics(report, "sft_epoch", short_run.seconds)
    shown = {when: re.findall(rf"^{when}: '(.+)' -> '(.*)' \(reference '(.+)'\)$", short_run.out, re.M)
             for when in ("before SFT", "after SFT")}
    rows = [f"| {question} | {reference} | {before or '(empty)'} | {after or '(empty)'} |"
            for (question, before, reference), (_, after, _) in zip(*shown.values())]
    missing = [row for row in rows if not re.search(rf"^\| [^|]+ {re.escape(row)}$", report, re.M)]
    assert len(rows) == 2 and not missing, f"answer rows ACTUAL missing {missing}, EXPECTED all of {rows}:\n{report}"
    first = json.loads(tiny_inputs.heldout.read_text(encoding="utf-8").splitlines()[0])["conversations"]
    story = next(m["content"] for m in first if m["role"] == "user").splitlines()[0]   # the first one shown
    assert f"| {story} | {rows[0][2:]}" in report, f"report ACTUAL lacks the story {story!r} before {rows[0]}"


def test_the_loss_figure_names_the_stage_and_draws_the_chance_level(short_run):
    figure, = short_run.figures
    ax, = figure.axes
    title = ax.get_title()
    for part in ("Supervised fine-tuning", "hidden size 32, 1 layer", "train.jsonl", "pretrain_32.pth"):
        assert part in title, f"figure title ACTUAL {title!r}, EXPECTED to hold {part!r}"
    chance = [line for line in ax.get_lines() if list(line.get_ydata()) == [math.log(STORIES_VOCAB_SIZE)] * 2]
    assert chance, f"ACTUAL no horizontal line at ln {STORIES_VOCAB_SIZE}, EXPECTED the chance level"


def test_the_answers_table_puts_story_question_and_reference_beside_each_answer():
    story = {"role": "user", "content": "Story: Mia has a cat.\nThe cat is red.\nQuestion: Who has a cat?"}
    histories = [[{"role": "system", "content": "Answer briefly."}, story],
                 [story, {"role": "assistant", "content": "Mia."}, {"role": "user", "content": "What animal?"}]]
    table = answers_table(list(zip(histories, ["Mia.", "A cat."])),
                          {"before SFT": ["", "a | b"], "after SFT": ["Mia.", "A cat."]})
    expect_equal("answers table", table, [
        "| story | question | reference | before SFT | after SFT |",
        "| --- | --- | --- | --- | --- |",
        "| Story: Mia has a cat. The cat is red. | Question: Who has a cat? | Mia. | (empty) | Mia. |",
        "| Story: Mia has a cat. The cat is red. | What animal? | A cat. | a \\| b | A cat. |"])


def test_untouched_stubs_stop_with_the_todo_message(tiny_inputs, tmp_path):
    out_dir = tmp_path / "out"
    run = run_stage(stage_argv(tiny_inputs, out_dir, "--impl-dir", str(untouched_impl(tmp_path / "impl"))),
                    "test_sft_stage_todo")
    assert run.code == 1, f"exit code ACTUAL {run.code}, EXPECTED 1; stderr {run.err!r}"
    assert "TODO: load_pretrained_weights: TODO - see lesson 17 §5.2" in run.err, run.err
    assert "sft.py (lesson 17 §5), then run `python -m course check 17`" in run.err, run.err
    assert not out_dir.exists(), f"ACTUAL {sorted(out_dir.iterdir())} written, EXPECTED nothing"


@pytest.mark.parametrize("case", ["missing weights", "foreign weights", "weights of another shape",
                                  "weights of another tokenizer", "bad flag", "bad length pool"])
def test_bad_input_is_one_line_naming_the_argument_and_writes_nothing(case, tiny_inputs, tmp_path):
    weights, extra, flag = {
        "missing weights": (tmp_path / "none.pth", [], "--from_weight"),
        "foreign weights": (tmp_path / "foreign.pth", [], "--from_weight"),
        "weights of another shape": (tiny_weights(tmp_path / "wide.pth", hidden_size=48), [], "--from_weight"),
        "weights of another tokenizer": (tiny_weights(tmp_path / "bytes.pth", vocab_size=6400), [], "--from_weight"),
        "bad flag": (tiny_inputs.weights, ["--batch_size", "0"], "--batch_size"),
        "bad length pool": (tiny_inputs.weights, ["--length_pool", "-1"], "--length_pool"),
    }[case]
    if case == "foreign weights":
        torch.save({"optimizer": {"lr": 1.0}}, weights)
    out_dir = tmp_path / "out"
    argv = stage_argv(tiny_inputs, out_dir, "--impl", "reference", *extra)
    argv[argv.index("--from_weight") + 1] = str(weights)
    run = run_stage(argv, f"test_sft_stage_bad_{case.replace(' ', '_')}")
    expect_equal("exit code", run.code, 2)
    lines = run.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}"), f"stderr ACTUAL {run.err!r}, EXPECTED one line " \
                                                                      f"'error: {flag} ...'"
    if case == "weights of another tokenizer":   # the likely cause named: a pretrain run with the byte tokenizer
        assert "its vocabulary has 6400 tokens" in lines[0] and "--tokenizer_path" in lines[0], lines[0]
    assert not out_dir.exists(), f"ACTUAL {sorted(out_dir.iterdir())} written, EXPECTED nothing"


def test_samples_are_labelled_by_the_given_assistant_labels_as_upstream_labels_them():
    """With the reference assistant_labels, the stage's samples are upstream's SFTDataset samples, token for
    token, random system prompts and think-block removal included (same draws)."""
    tokenizer = load_tokenizer(None)
    reference = load_implementation("sft.py", "reference")
    ours = AssistantMaskedDataset(STORIES_SFT_CORPUS, tokenizer, 256, reference.assistant_labels, random.Random(3))
    upstream = SFTDataset(STORIES_SFT_CORPUS, tokenizer, 256, random.Random(3))
    for index in range(12):
        (ids, labels), (up_ids, up_labels) = ours[index], upstream[index]
        expect_equal(f"sample {index} input_ids", ids.tolist(), up_ids.tolist())
        expect_equal(f"sample {index} labels", labels.tolist(), up_labels.tolist())


def test_micro_batches_cut_after_the_last_target_without_changing_the_loss():
    tokenizer = load_tokenizer(None)
    dataset = SFTDataset(STORIES_SFT_CORPUS, tokenizer, 512, random.Random(0), add_system_ratio=0.0,
                         empty_think_ratio=1.0)
    batch = next(micro_batches(dataset, [0, 1, 2], 3))
    full_ids, full_labels = map(torch.stack, zip(*(dataset[i] for i in range(3))))
    assert batch.input_ids.shape[1] < 512, f"batch length ACTUAL {batch.input_ids.shape[1]}, EXPECTED < 512"
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1))
    with torch.no_grad():
        cut, full = (float(model(ids, labels=labels).loss) for ids, labels in
                     ((batch.input_ids, batch.labels), (full_ids, full_labels)))
    assert abs(cut - full) <= 1e-5, f"loss ACTUAL {cut} (cut batch), EXPECTED {full} (padded to 512), tolerance 1e-5"
    expect_equal("loss units", batch.loss_units, int((full_labels[:, 1:] != -100).sum()))


def test_length_pools_hold_similar_lengths_and_every_sample_once():
    """--length_pool: the samples are drawn in the epoch's order, a run of `pool` micro-batches at a time; each run
    is sorted by the positions each sample keeps, cut into micro-batches that go out shuffled within the run (a
    short last one stays last), each trimmed to its longest sample; every sample comes once; pool 0 keeps the order
    and draws one micro-batch at a time."""
    keeps = [(7 * i) % 50 + 1 for i in range(45)]   # distinct; 45 samples: 5 micro-batches of 8 and one of 5

    class Recorded(list):
        """Sample i: input ids all i, its last target at position keeps[i] - 1; records the order of the draws."""
        def __getitem__(self, i):
            self.append(i)
            return torch.full((64,), i), torch.tensor([-100] * (keeps[i] - 1) + [1] + [-100] * (64 - keeps[i]))

    order = torch.randperm(45, generator=torch.Generator().manual_seed(0)).tolist()

    def drawn(pool: int, seed: int = 1):
        """The draws, and (sample ids, width, samples drawn by then) of each micro-batch as it goes out."""
        dataset = Recorded()
        torch.manual_seed(seed)
        return dataset, [(batch.input_ids[:, 0].tolist(), batch.input_ids.shape[1], len(dataset))
                         for batch in micro_batches(dataset, order, 8, pool)]

    for pool, drawn_ahead in ((0, 8), (2, 16)):
        dataset, held = drawn(pool)
        expect_equal(f"pool {pool}: the draws", list(dataset), order)
        expect_equal(f"pool {pool}: samples drawn when the first micro-batch goes out", held[0][2], drawn_ahead)
        expect_equal(f"pool {pool}: each micro-batch's width", [width for _, width, _ in held],
                     [max(keeps[i] for i in ids) for ids, _, _ in held])
        batches = [ids for ids, _, _ in held]
        if pool == 0:
            expect_equal("pool 0: micro-batches", batches, [order[i:i + 8] for i in range(0, 45, 8)])
            continue
        expect_equal("the samples, each once", sorted(sum(batches, [])), list(range(45)))
        runs = [sorted(order[i:i + 16], key=keeps.__getitem__) for i in range(0, 45, 16)]
        for number, run in enumerate(runs):
            expect_equal(f"run {number}'s micro-batches (any order): its samples sorted by kept positions, cut in 8s",
                         sorted(batches[2 * number:2 * number + 2]),
                         sorted(run[i:i + 8] for i in range(0, len(run), 8)))
        expect_equal("the short micro-batch, last", batches[-1], runs[-1][8:])

    assert drawn(2, seed=1)[1] == drawn(2, seed=1)[1] != drawn(2, seed=2)[1], (
        "the runs' micro-batches should go out in an order drawn from torch's generator")


def test_heldout_scoring_on_hand_made_answers(tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(json.dumps({"conversations": c}) for c in (
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Story: Mia has a cat.\n"
                                                                                      "Question: Who has a cat?"},
         {"role": "assistant", "content": "Mia."}, {"role": "user", "content": "What animal?"},
         {"role": "assistant", "content": "A cat."}],
        [{"role": "user", "content": "What color is the sky?"}, {"role": "assistant", "content": "Blue."}])) + "\n")
    questions = heldout_questions(chats)
    expect_equal("histories (roles)", [[m["role"] for m in history] for history, _ in questions],
                 [["system", "user"], ["system", "user", "assistant", "user"], ["user"]])
    expect_equal("reference answers", [reference for _, reference in questions], ["Mia.", "A cat.", "Blue."])
    expect_equal("exact answers", exact_answers(["mia", "A  cat", "Red."], ["Mia.", "A cat.", "Blue."]), 2)
    expect_equal("score line", score_line(2, 3), "held-out exact answers: 2/3 (66.7 %)")
    with pytest.raises(ValueError):
        exact_answers(["Mia."], ["Mia.", "Blue."])


@pytest.fixture(scope="module")
def chat_weights(tmp_path_factory):
    return tiny_weights(tmp_path_factory.mktemp("chat") / "full_sft_32.pth", num_hidden_layers=2, half=True)


def chat(*args, stdin="Who has a cat?\nWhat animal?\n"):
    """``python -m course chat ARGS`` with ``stdin`` (its text, or a file): (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.setattr("sys.stdin", io.StringIO(stdin) if isinstance(stdin, str) else stdin)
        code = course_main(["chat", *args])
    return SimpleNamespace(code=code, out=out.getvalue(), err=err.getvalue())


def test_chat_answers_each_turn_on_one_line_greedy_and_reads_the_shape(chat_weights):
    first, second = (chat("--weights", str(chat_weights), "--max_new_tokens", "6") for _ in range(2))
    assert first.code == 0, first.err
    expect_equal("answer lines", len(first.out.splitlines()), 2)
    expect_equal("greedy answers of a second run", second.out, first.out)
    model = model_from_weights(chat_weights, "--weights")
    expect_equal("shape read from the file", (model.config.hidden_size, model.config.num_hidden_layers), (32, 2))


def test_chat_reads_a_byte_tokenizer_model_with_the_byte_tokenizer(tmp_path, monkeypatch):
    tokenizers = []

    def recording_answer(model, tokenizer, *args, **kwargs):
        tokenizers.append(tokenizer)
        return "an answer"
    monkeypatch.setattr(chat_module, "answer", recording_answer)
    weights = tiny_weights(tmp_path / "byte_32.pth", vocab_size=load_tokenizer(None).vocab_size)
    run = chat("--weights", str(weights), stdin="Who?\n")
    assert run.code == 0, run.err
    expect_equal("tokenizer (the model's vocabulary is the byte tokenizer's)", type(tokenizers[0]),
                 type(load_tokenizer(None)))


def test_chat_samples_reproducibly_with_a_seed(chat_weights):
    runs = [chat("--weights", str(chat_weights), "--max_new_tokens", "6", "--sample", "--seed", "5")
            for _ in range(2)]
    assert runs[0].code == 0, runs[0].err
    expect_equal("sampled answers of a second run (same seed)", runs[1].out, runs[0].out)


def test_chat_keeps_the_conversation(chat_weights, monkeypatch):
    prompts = []

    def recording_answer(model, tokenizer, messages, *args, **kwargs):
        prompts.append(render_chat(messages, add_generation_prompt=True))
        return f"answer {len(prompts)}\non two lines"
    monkeypatch.setattr(chat_module, "answer", recording_answer)
    run = chat("--weights", str(chat_weights), "--system", "Answer briefly.", stdin="Who?\nWhat?\n\nnot read\n")
    expect_equal("answers printed, one line each", run.out, "answer 1 on two lines\nanswer 2 on two lines\n")
    expect_equal("stderr of piped input (no banner, no prompt)", run.err, "")
    expect_equal("prompts (turns before the empty line)", len(prompts), 2)
    for part in ("<|im_start|>system\nAnswer briefly.", "Who?", "answer 1\non two lines<|im_end|>", "What?"):
        assert part in prompts[1], f"second prompt ACTUAL {prompts[1]!r}, EXPECTED to hold {part!r}"


def test_chat_at_a_terminal_shows_a_banner_and_a_prompt_on_stderr(chat_weights, monkeypatch):
    """stdin a terminal (a pty): a banner naming the model, its tokenizer and how to end, then `you> ` before each
    line, on stderr; stdout holds the answers alone, as when piped; Ctrl-D ends with a newline."""
    monkeypatch.setattr(chat_module, "answer", lambda model, tokenizer, messages, *args, **kwargs:
                        f"answer {len(messages) // 2 + 1}")
    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"Who?\nWhat?\n\x04")   # \x04: Ctrl-D, the end of input at a terminal
        with open(terminal, encoding="utf-8") as stdin:
            run = chat("--weights", str(chat_weights), stdin=stdin)
    finally:
        os.close(controller)
    assert run.code == 0, run.err
    expect_equal("answers printed", run.out, "answer 1\nanswer 2\n")
    banner, _, prompts = run.err.partition("\n")
    for part in (str(chat_weights), "hidden size 32, 2 layer(s)", "greedy", "an empty line or Ctrl-D ends",
                 "tokenizer: labs/data/stories_tokenizer/tokenizer.json"):
        assert part in banner, f"banner ACTUAL {banner!r}, EXPECTED to hold {part!r}"
    expect_equal("prompts after the banner (two turns, then Ctrl-D)", prompts, "you> you> you> \n")


@pytest.mark.parametrize("case", ["missing", "not a state dict", "keys that do not fit"])
def test_chat_refuses_bad_weights_in_one_line(case, tmp_path):
    path = tmp_path / "weights.pth"
    if case == "not a state dict":
        torch.save([1, 2, 3], path)
    elif case == "keys that do not fit":
        state_dict = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1)).state_dict()
        torch.save({**state_dict, "model.extra.weight": torch.zeros(1)}, path)
    run = chat("--weights", str(path))
    expect_equal("exit code", run.code, 2)
    lines = run.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --weights"), f"stderr ACTUAL {run.err!r}, EXPECTED one " \
                                                                        "line 'error: --weights ...'"
    expect_equal("stdout", run.out, "")


# The README's and lesson 17 §10's two-stage path (tests/test_docs_commands.py runs the same commands: one run each)
DOCUMENTED_PATH = ("python impl/train_pretrain_impl.py --impl reference",
                   "python impl/train_full_sft_impl.py --impl reference")
CLAIMED_SHARE = 0.60   # "answers at least 60 % of the held-out questions"; measured 90 % and more


def test_the_documented_path_answers_most_heldout_questions():
    for command in DOCUMENTED_PATH:
        assert command in (REPO_ROOT / "README.md").read_text(encoding="utf-8"), f"the README runs no `{command}`"
        proc = run_documented(command)
        assert proc.returncode == 0, f"`{command}`: exit code {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}"
    score = SCORE.search(proc.stdout)
    assert score, f"the SFT stage printed no score line:\n{proc.stdout[-3000:]}"
    matches, total = int(score[1]), int(score[2])
    assert matches >= CLAIMED_SHARE * total, (f"held-out exact answers ACTUAL {matches}/{total} "
                                              f"({100 * matches / total:.1f} %), EXPECTED >= {CLAIMED_SHARE:.0%}")
