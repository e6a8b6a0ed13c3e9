"""The stage assembly's learning view (impl/train_pretrain_impl.py): train/validation split, val loss every
--eval_interval updates, the train loss averaged over each update's micro-batches, --metrics_json, the loss-curve
PNG, greedy samples, the report card's tokens/s and MFU, --tensorboard's event files (read back with TensorBoard's
own reader), and the built-in stories corpus. Short runs on a slice of the corpus with a high lr."""
from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from report_cards import assert_card_basics
import torch
from doc_runs import run_documented
from tensorboard_events import expect_float32_close, tensorboard_scalars

from course.checks.framework import expect_equal
from course.implementations import REPO_ROOT, load_implementation, load_module
from course.trainers.pretrain import plot_losses, repo_relative

STAGE_PATH = REPO_ROOT / "impl" / "train_pretrain_impl.py"
PROMPT = "One day Tom went to the"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def corpus_slice(tmp_path, lines: int):
    path = tmp_path / "slice.jsonl"
    stories = (REPO_ROOT / "labs" / "data" / "pretrain_stories.jsonl").read_text(encoding="utf-8")
    path.write_text("".join(stories.splitlines(keepends=True)[:lines]), encoding="utf-8")
    return path


def short_run_argv(tmp_path, data_path):
    # 180 train + 20 validation samples, micro-batch 8, accumulation 3: 23 micro-steps, 8 updates (the last a
    # tail flush of 2), so the mean-over-micro-batches rule is exercised on full and partial updates.
    return ["--impl", "reference", "--data_path", str(data_path), "--hidden_size", "32", "--num_hidden_layers", "1",
            "--max_seq_len", "48", "--epochs", "1", "--batch_size", "8", "--accumulation_steps", "3", "--learning_rate", "1e-2",
            "--val_fraction", "0.1", "--eval_interval", "4", "--eval_batches", "2", "--max_new_tokens", "12",
            "--prompt", PROMPT, "--out_dir", str(tmp_path / "out"), "--metrics_json", str(tmp_path / "m.json"),
            "--log_interval", "5", "--tensorboard", str(tmp_path / "tensorboard")]
# Where that run's tokens/s and MFU go in TensorBoard: each stretch of train_one_epoch ends at a logged update
# (closing micro-steps 3, 6, ..., 21 and the tail 23; logged when one crosses a multiple of --log_interval 5 or
# ends the epoch: micro-steps 6, 12, 15, 21, 23 = updates 2, 4, 5, 7, 8) or at an evaluation (updates 4, 8).
SPEED_UPDATES = [2, 4, 5, 7, 8]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short run in-process, shared by the tests below; the reference train_one_epoch's records and the loss
    figure are captured on the way out, and the run's wall time measured around it."""
    tmp_path = tmp_path_factory.mktemp("stage")
    stage = load_module(STAGE_PATH, "test_stage_assembly_stage")
    reference = load_implementation("train_loop.py", "reference")
    captured, figures, segments = [], [], []

    def recording_train_one_epoch(model, loader, *args, **kwargs):
        targets = []   # the real targets of each micro-batch, counted here, not by the stage

        def counting(batches):
            for batch in batches:
                targets.append(int((batch[1][:, 1:] != -100).sum()))
                yield batch
        records = reference.train_one_epoch(model, counting(loader), *args, **kwargs)
        captured.extend(records)
        segments.append({"targets": sum(targets)})
        return records

    def recording_train_segment(stage_object, *args):
        throughput = stage_object.throughput
        tokens, seconds = throughput.tokens, throughput.seconds
        records = real_train_segment(stage_object, *args)
        segments[-1].update(tokens=throughput.tokens - tokens, seconds=throughput.seconds - seconds,
                            update=stage_object.update + sum(r["update_closed"] for r in records))
        return records
    real_train_segment = stage.train_segment

    def recording_plot_losses(*args, **kwargs):
        figures.append(plot_losses(*args, **kwargs))
        return figures[-1]

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(stage, "load_implementation",
                      lambda name, impl, impl_dir: SimpleNamespace(train_one_epoch=recording_train_one_epoch))
        patch.setattr(stage, "plot_losses", recording_plot_losses)
        patch.setattr(stage, "train_segment", recording_train_segment)
        started = time.perf_counter()
        assert stage.main(short_run_argv(tmp_path, corpus_slice(tmp_path, 200))) == 0
        seconds = time.perf_counter() - started
    metrics = json.loads((tmp_path / "m.json").read_text())
    return SimpleNamespace(metrics=metrics, records=captured, out=out.getvalue(), figures=figures, seconds=seconds,
                           segments=segments, tensorboard=tmp_path / "tensorboard")


def test_metrics_json_schema(short_run):
    metrics = short_run.metrics
    expect_equal("metrics_json keys", sorted(metrics),
                 ["drawn_samples", "figure", "mfu", "samples", "tokens_per_second", "train_loss", "val_loss"])
    expect_equal("train_loss updates (8 updates: 7 full + a tail flush)", [u for u, _ in metrics["train_loss"]],
                 list(range(1, 9)))
    expect_equal("val_loss updates (start, every 4 updates, the end)", [u for u, _ in metrics["val_loss"]], [0, 4, 8])
    expect_equal("sample updates", [u for u, _ in metrics["samples"]], [0, 4, 8])
    expect_equal("drawn sample updates", [u for u, _ in metrics["drawn_samples"]], [0, 4, 8])
    assert metrics["tokens_per_second"] > 0, metrics["tokens_per_second"]


def test_val_loss_decreases(short_run):
    """8 updates at lr 1e-2 on a 200-line slice: the validation loss starts near ln(699) = 6.55 (an untrained
    model over the stories tokenizer's 699 tokens) and must fall by at least 1 nat (measured: 6.55 -> 5.31)."""
    val = [loss for _, loss in short_run.metrics["val_loss"]]
    assert abs(val[0] - 6.550) < 0.05, f"first val loss ACTUAL {val[0]:.4f}, EXPECTED ln(699) = 6.550 +- 0.05"
    assert val[-1] < val[0] - 1.0, f"val loss ACTUAL {val}, EXPECTED the last at least 1 below the first"


def test_train_loss_is_the_mean_over_each_updates_micro_batches(short_run):
    """Recomputed from train_one_epoch's own records (grouped by update_closed), to 1e-9 (float summation
    order); the last micro-batch alone (upstream's logged loss) must differ somewhere."""
    expected, last_only, group = [], [], []
    for record in short_run.records:
        group.append(record["loss"])
        if record["update_closed"]:
            expected.append(sum(group) / len(group))
            last_only.append(group[-1])
            group = []
    actual = [loss for _, loss in short_run.metrics["train_loss"]]
    expect_equal("number of logged updates", len(actual), len(expected))
    for update, (a, e) in enumerate(zip(actual, expected), start=1):
        assert abs(a - e) <= 1e-9, (f"update {update}: train loss ACTUAL {a!r}, EXPECTED mean of its micro-batches "
                                    f"{e!r} (tolerance 1e-9); hint: the last micro-batch alone is {last_only[update - 1]!r}")
    assert any(abs(a - b) > 1e-6 for a, b in zip(expected, last_only)), "the test cannot tell mean from last"


def test_loss_figure_is_a_png(short_run):
    figure = REPO_ROOT / short_run.metrics["figure"]
    assert figure.parent.name == "out" and figure.is_file(), figure
    assert figure.read_bytes()[:8] == PNG_SIGNATURE, f"{figure} does not start with the PNG signature"
    assert figure.stat().st_size > 5_000, f"{figure}: {figure.stat().st_size} bytes, too small for two curves"


def test_samples_continue_the_prompt_and_are_printed(short_run):
    for update, text in short_run.metrics["samples"]:
        assert text.startswith(PROMPT) and len(text) > len(PROMPT), (update, text)
        assert f"update {update} sample: {text!r}" in short_run.out, short_run.out[-2000:]
    for update, text in short_run.metrics["drawn_samples"]:
        assert text.startswith(PROMPT), (update, text)
        assert f"update {update} drawn:  {text!r}" in short_run.out, short_run.out[-2000:]
    assert f"update 8: val_loss {short_run.metrics['val_loss'][-1][1]:.4f}" in short_run.out, short_run.out[-2000:]


def test_report_card_holds_config_losses_figure_and_samples(short_run):
    report_path = short_run.out.split("report in ")[1].splitlines()[0]
    report = Path(report_path).read_text(encoding="utf-8")
    assert report_path.endswith("out/pretrain_32_report.md"), report_path
    train, val = dict(short_run.metrics["train_loss"]), dict(short_run.metrics["val_loss"])
    rows = [f"| 0 |  | {val[0]:.4f} |"] + [f"| {u} | {train[u]:.4f} | {val[u]:.4f} |" for u in (4, 8)]
    missing = [row for row in rows + ["![train and validation loss](pretrain_32_loss.png)",
                                      "| model | hidden size 32, 1 layer,"] if row not in report]
    assert not missing, f"report lacks\n  ACTUAL: {missing}\n  EXPECTED: none missing; report:\n{report}"
    for update, text in short_run.metrics["samples"] + short_run.metrics["drawn_samples"]:
        assert f"`{text}`" in report, (update, text, report)


def test_tensorboard_holds_every_update_and_every_evaluation(short_run):
    """train/loss, lr and grad norm at each of the 8 updates (lr and pre-clip norm from the closing micro-step's
    record of train_one_epoch), val/loss at each evaluation."""
    scalars = tensorboard_scalars(short_run.tensorboard)
    expect_equal("tags", sorted(scalars), sorted(["train/loss", "train/lr", "train/grad_norm", "val/loss",
                                                  "perf/tokens_per_second", "perf/mfu"]))
    closing = [r for r in short_run.records if r["update_closed"]]
    expect_float32_close("train/loss", scalars["train/loss"], short_run.metrics["train_loss"])
    expect_float32_close("train/lr", scalars["train/lr"], [(u, r["lr"]) for u, r in enumerate(closing, start=1)])
    expect_float32_close("train/grad_norm", scalars["train/grad_norm"],
                         [(u, r["grad_norm"]) for u, r in enumerate(closing, start=1)])
    expect_float32_close("val/loss", scalars["val/loss"], short_run.metrics["val_loss"])


def test_tensorboard_speed_is_the_tokens_of_each_stretch_over_its_seconds(short_run):
    """One tokens/s and MFU point per stretch of train_one_epoch (ending at a log line or an evaluation): the real
    targets of its micro-batches (counted here as train_one_epoch fetched them) over the seconds the stage timed
    around the call; MFU / tokens/s is the run's FLOPs per token over the peak, the same at every point and in
    the metrics."""
    scalars = tensorboard_scalars(short_run.tensorboard)
    segments = short_run.segments
    expect_equal("updates ending a stretch of train_one_epoch", [s["update"] for s in segments], SPEED_UPDATES)
    expect_equal("tokens the stage counted per stretch (ACTUAL) vs targets of its micro-batches (EXPECTED)",
                 [s["tokens"] for s in segments], [s["targets"] for s in segments])
    expect_float32_close("perf/tokens_per_second", scalars["perf/tokens_per_second"],
                         [(s["update"], s["tokens"] / s["seconds"]) for s in segments])
    run_ratio = short_run.metrics["mfu"] / short_run.metrics["tokens_per_second"]
    expect_float32_close("perf/mfu", scalars["perf/mfu"],
                         [(step, rate * run_ratio) for step, rate in scalars["perf/tokens_per_second"]])


MFU_LINE = re.compile(r"^MFU ([\d.]+)%: ([\d,]+) training FLOPs per token \(lesson 18's flops_per_token at max_seq_len "
                      r"48\) x ([\d,]+) tokens/s, against ([\d,.]+) GFLOP/s \(measured: .+ on cpu, \d+ thread\(s\)\)$",
                      re.M)


def test_report_card_shows_the_mfu_of_the_flops_torch_counts(short_run):
    """The card's FLOPs per token are what FlopCounterMode counts for a training step of this model (hidden 32, 1
    layer, 699 tokens) at max_seq_len 48, per position; its MFU is those FLOPs x the card's tokens/s over its
    peak (to the printed digits), and is the metrics' mfu."""
    from course.minimind import MiniMindConfig
    from course.runs.step_costs import counted_flops, measured_model, random_batch
    report = Path(short_run.out.split("report in ")[1].splitlines()[0]).read_text(encoding="utf-8")
    line = MFU_LINE.search(report)
    assert line, f"report lacks the MFU line (ACTUAL report below), EXPECTED one matching {MFU_LINE.pattern}\n{report}"
    mfu_percent, flops, rate, peak = (float(v.replace(",", "")) for v in line.groups())
    config = MiniMindConfig(hidden_size=32, num_hidden_layers=1, vocab_size=699)
    _, training = counted_flops(measured_model(config), *random_batch(config, 1, 48))
    expect_equal("training FLOPs per token: ACTUAL the card's, EXPECTED FlopCounterMode's / 48 positions",
                 flops, training / 48)
    expect_equal("tokens/s: ACTUAL the MFU line's, EXPECTED the card's wall-time line's",
                 f"{rate:,.0f}", re.search(r"; ([\d,]+) tokens/s in train_one_epoch", report)[1])
    expected = 100 * flops * rate / (peak * 1e9)
    assert abs(mfu_percent - expected) <= 0.005 + 1e-3 * expected, (
        f"MFU ACTUAL {mfu_percent}%, EXPECTED {expected:.4f}% = {flops:,.0f} x {rate:,.0f} / {peak} GFLOP/s (the "
        f"printed digits: 0.005 points + 0.1 %)")
    assert abs(100 * short_run.metrics["mfu"] - mfu_percent) <= 0.005, (short_run.metrics["mfu"], mfu_percent)
    assert peak > 1, f"peak ACTUAL {peak} GFLOP/s, EXPECTED a measured matmul peak above 1 GFLOP/s"


def test_tensorboard_refuses_a_file_and_names_the_argument(tmp_path, capsys):
    stage = load_module(STAGE_PATH, "test_stage_assembly_tensorboard_file")
    taken = tmp_path / "taken"
    taken.write_text("not a directory", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        stage.parse_args(["--tensorboard", str(taken)])
    err = capsys.readouterr().err
    expect_equal("exit code", exit_info.value.code, 2)
    assert f"error: argument --tensorboard: {taken}: a file is there, not a directory" in err, err


def test_log_lines_are_printed_beneath_the_progress_bar(short_run):
    """Each log line on a line of its own, not glued to the progress bar that is still open between evaluations."""
    logged = short_run.out.count("Epoch:[")
    own_lines = [line for line in short_run.out.splitlines() if line.startswith("Epoch:[")]   # also splits at \r
    assert logged and len(own_lines) == logged, (f"ACTUAL {len(own_lines)} of {logged} log lines start a line, "
                                                 f"EXPECTED all:\n{short_run.out[-2000:]}")


def test_report_card_shows_the_wall_time_and_paths_relative_to_the_repository(short_run):
    report = Path(short_run.out.split("report in ")[1].splitlines()[0]).read_text(encoding="utf-8")
    assert_card_basics(report, "train_one_epoch", short_run.seconds)
    expect_equal("a path inside the repository", repo_relative(REPO_ROOT / "labs" / ".." / "out" / "a.md"), "out/a.md")
    expect_equal("a path outside it", repo_relative("/elsewhere/a.md"), "/elsewhere/a.md")


def test_the_stage_draws_its_figure_with_a_title_and_the_chance_level(short_run):
    figure, = short_run.figures
    ax, = figure.axes
    title = ax.get_title()
    for part in ("Pretraining", "hidden size 32, 1 layer", "slice.jsonl", "180 train, 20 validation"):
        assert part in title, f"figure title ACTUAL {title!r}, EXPECTED to hold {part!r}"
    chance = [line for line in ax.get_lines() if list(line.get_ydata()) == [math.log(699)] * 2]
    assert chance, "ACTUAL no horizontal line at ln 699 (the stories tokenizer's vocabulary), EXPECTED the chance level"


def test_loss_figure_draws_validation_as_points_and_a_labelled_chance_level(tmp_path):
    """Validation losses are far apart: markers alone (a straight segment between two of them would read as a
    measured gap to the train curve); ln V, a uniform guess over V tokens, is a labelled horizontal line."""
    path = tmp_path / "loss.png"
    figure = plot_losses([[1, 6.0], [2, 5.0], [3, 4.5]], [[0, 6.6], [3, 4.7]], path, "Pretraining: a title", 699)
    expect_equal("file signature", path.read_bytes()[:8], PNG_SIGNATURE)
    ax, = figure.axes
    expect_equal("title", ax.get_title(), "Pretraining: a title")
    lines = {line.get_label(): line for line in ax.get_lines()}
    validation = lines["validation"]
    expect_equal("validation (linestyle, marker, points)", (validation.get_linestyle(), validation.get_marker(),
                                                            validation.get_xydata().tolist()),
                 ("None", "o", [[0, 6.6], [3, 4.7]]))
    expect_equal("labels", sorted(lines), sorted(["train (mean over each update's micro-batches)", "validation",
                                                  "chance: ln 699 = 6.55"]))
    chance = lines["chance: ln 699 = 6.55"]
    expect_equal("chance level (axes x from 0 to 1, y = ln 699)", (list(chance.get_xdata()), list(chance.get_ydata())),
                 ([0, 1], [math.log(699)] * 2))
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "chance: ln 699 = 6.55" in legend, f"legend ACTUAL {legend}, EXPECTED the chance level labelled"


def test_drawn_samples_reproduce_and_greedy_is_the_argmax():
    """Same weights and seed: the same text; greedy (temperature 0) is a draw among the top 1."""
    from course.minimind import MiniMindConfig, MiniMindForCausalLM, load_tokenizer
    from course.trainers.pretrain import generate
    torch.manual_seed(0)
    model, tokenizer = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1)), load_tokenizer()
    drawn = [generate(model, tokenizer, PROMPT, 12, 48, "cpu", temperature=1.0, top_k=50, seed=seed)
             for seed in (3, 3, 4)]
    assert drawn[0] == drawn[1] != drawn[2], f"ACTUAL {drawn}, EXPECTED seeds 3, 3 alike and seed 4 different"
    greedy = generate(model, tokenizer, PROMPT, 12, 48, "cpu")
    top_1 = generate(model, tokenizer, PROMPT, 12, 48, "cpu", temperature=0.5, top_k=1, seed=9)
    expect_equal("greedy vs a top-1 draw", greedy, top_1)


DEFAULT_JOB = "python impl/train_pretrain_impl.py --impl reference"  # as the README and lesson 14 §8 run it
WORD = re.compile(r"[A-Za-z]+|\d+")


def test_the_default_job_learns_to_write_the_corpus_words():
    """The stories preset's run (shared with the docs test that runs the same command): a final validation loss
    of at most 1.1 nats per token (measured 1.0039-1.0040 across default/avx2 kernels x 1/2 threads; untrained:
    6.58), and a last greedy sample of at least 8 words, at least 90 % of them words of the corpus (read here
    from the jsonl), none three times in a row; its report card holds the loss table."""
    proc = run_documented(DEFAULT_JOB)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()  # also splits the progress bar's \r
    val = [(int(m[1]), float(m[2])) for m in map(re.compile(r"update (\d+): val_loss ([\d.]+)").fullmatch, lines) if m]
    assert val and val[-1][1] <= 1.1, f"final val loss ACTUAL {val[-1:]}, EXPECTED <= 1.1"
    corpus = set()
    for line in (REPO_ROOT / "labs" / "data" / "pretrain_stories.jsonl").read_text(encoding="utf-8").splitlines():
        corpus.update(WORD.findall(json.loads(line)["text"]))
    sample = ast.literal_eval([m[1] for m in map(re.compile(r"update \d+ sample: (.+)").fullmatch, lines) if m][-1])
    words = WORD.findall(sample)
    known = [w for w in words if w in corpus]
    assert len(words) >= 8, f"last sample {sample!r}: ACTUAL {len(words)} words, EXPECTED >= 8"
    assert len(known) >= 0.9 * len(words), (f"last sample {sample!r}: ACTUAL {len(known)}/{len(words)} corpus "
                                             f"words, EXPECTED >= 90 %; unknown {set(words) - corpus}")
    tripled = [words[i] for i in range(len(words) - 2) if words[i] == words[i + 1] == words[i + 2]]
    assert not tripled, f"last sample {sample!r}: ACTUAL {tripled} three times in a row, EXPECTED none"
    report = Path(proc.stdout.split("report in ")[1].split()[0]).read_text(encoding="utf-8")
    missing = [(u, v) for u, v in val if not re.search(rf"^\| {u} \| [\d.]* \| {v:.4f} \|$", report, re.M)]
    assert not missing, f"report rows ACTUAL missing (update, val loss) {missing}, EXPECTED none; report:\n{report}"


def test_split_holds_out_the_last_lines(tmp_path, capsys):
    stage = load_module(STAGE_PATH, "test_stage_assembly_split")
    dataset = list(range(200))
    train, val = stage.split(dataset, 0.1)
    expect_equal("(train, validation) indices", (list(train.indices), list(val.indices)),
                 (list(range(180)), list(range(180, 200))))
    with pytest.raises(SystemExit):
        stage.parse_args(["--val_fraction", "1"])
    assert "--val_fraction must be in [0, 1), got 1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stage.parse_args(["--eval_interval", "0"])
    assert "--eval_interval must be >= 1, got 0" in capsys.readouterr().err


def test_stories_corpus_is_what_its_generator_writes(tmp_path):
    """labs/data/pretrain_stories.jsonl is reproducible byte for byte from labs/data/make_pretrain_stories.py."""
    out = tmp_path / "stories.jsonl"
    proc = subprocess.run([sys.executable, "labs/data/make_pretrain_stories.py", str(out)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    committed = (REPO_ROOT / "labs" / "data" / "pretrain_stories.jsonl").read_bytes()
    assert out.read_bytes() == committed, "the committed corpus differs from the generator's output: rerun it"


def test_the_stage_reads_top_to_bottom_in_short_functions():
    """The stage file is the main flow; its helpers live in course/trainers (a train() of 173 lines failed this)."""
    tree = ast.parse(STAGE_PATH.read_text(encoding="utf-8"))
    long = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60}
    expect_equal("functions of impl/train_pretrain_impl.py over 60 lines", long, {})


def test_stories_tokenizer_is_what_its_script_writes(tmp_path):
    """labs/data/stories_tokenizer/tokenizer.json, the stories preset's tokenizer, is reproducible byte for byte
    from labs/data/make_stories_tokenizer.py (so nobody edits it by hand)."""
    out = tmp_path / "tokenizer.json"
    proc = subprocess.run([sys.executable, "labs/data/make_stories_tokenizer.py", str(out)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    committed = (REPO_ROOT / "labs" / "data" / "stories_tokenizer" / "tokenizer.json").read_bytes()
    assert out.read_bytes() == committed, "the committed tokenizer differs from the script's output: rerun it"
