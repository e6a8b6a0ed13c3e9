"""Lesson 17: what the checks cannot show (every check already runs for the student and the reference in
tests/test_lesson_checks.py): the inputs the checks and labs stand on (the built-in chat corpus, the micro-batches
of the sft_epoch checks, the two forms of the update oracle), the extension against upstream on real data, and
what the lesson texts say about the checks, the catalogue and the lab."""
from __future__ import annotations

import re
from collections import Counter

import pytest
from prediction_labs import lesson_texts, text_id

from course.checks import get_lesson
from course.checks.framework import CORE, FAIL, HARDENING, OPTIONAL, PASS
from course.checks.results import grade_exercises
from course.lesson_texts import section_text
from course.minimind import IGNORE_INDEX
from course.minimind.sft import EMPTY_THINK_BLOCK, encode_prompt, render_chat
from course.reference import sft as reference
from course.runs import global_batch_gradients
from course.runs.sft import (SFT_EPOCH_PAIRS, sft_dataset, sft_micro_batches, sft_update_gradients,
                             upstream_tokenizer)

LESSON = get_lesson("17")
TEXTS = lesson_texts("17")
NOTES = [LESSON.files()["notes (en)"], LESSON.files()["notes (zh)"]]


def test_the_built_in_corpus_reads_and_its_masks_are_unequal():
    """Every line of labs/data/sft_tiny.jsonl is a conversation upstream's SFTDataset reads; at 96 ids (the lab's
    length) the samples' assistant targets range from none (a prompt cut before its answer, an answer lost to the
    merged newline) to a paragraph: the inequality the lab measures comes from the data."""
    dataset = sft_dataset(96, add_system_ratio=0.0, empty_think_ratio=1.0)
    counts = [int((dataset[i][1][1:] != IGNORE_INDEX).sum()) for i in range(len(dataset))]
    assert len(counts) == 36 and min(counts) == 0 and max(counts) >= 60, (
        f"ACTUAL {len(counts)} conversations, targets {counts}\nEXPECTED 36, from 0 to >= 60 targets\n"
        "likely cause: labs/data/sft_tiny.jsonl was edited (the lab's and the checks' numbers follow from it)")


def test_the_sft_epoch_micro_batches_are_what_the_checks_say():
    """The checks of sft_epoch rely on these micro-batches (course/runs/sft.py): with K = 3 the first update holds
    a micro-batch without a target, the second none at all, the last is a tail of one."""
    units = [batch.loss_units for batch in sft_micro_batches()]
    assert (len(SFT_EPOCH_PAIRS), units) == (10, [9, 0, 26, 0, 0, 0, 14, 19, 19, 18]), (
        f"ACTUAL {units}\nEXPECTED [9, 0, 26, 0, 0, 0, 14, 19, 19, 18]\nlikely cause: the corpus, the tokenizer or "
        "SFT_EPOCH_PAIRS changed: choose pairs that keep an empty micro-batch, an empty update and a tail")


def test_the_update_oracle_is_the_token_mean_however_it_is_written():
    """The model's own loss on all of an update's micro-batches (sft_update_gradients) and lesson 16's NLL sum /
    its targets (global_batch_gradients) give the same gradient: the oracle is the token mean, not a formula."""
    batches = sft_micro_batches()[:3]
    model_loss = sft_update_gradients(batches)
    nll_sum = global_batch_gradients(batches)[0]
    worst = max(float((model_loss[n] - nll_sum[n]).abs().max()) for n in model_loss)
    assert worst < 1e-7, f"ACTUAL max |grad diff| {worst:.3e}\nEXPECTED < 1e-7 (float rounding)\nlikely cause: the " \
                         "model's loss no longer averages over the shifted targets that are not -100"


def test_the_extension_trains_the_answers_upstream_loses_on_the_corpus():
    """On the built-in corpus with every empty think block removed, upstream trains nothing of the answers that
    start with two spaces; the extension trains each of them, and gives upstream's sample for every other line."""
    tokenizer = upstream_tokenizer()
    dataset = sft_dataset(96)
    lost, different = [], []
    for index in range(len(dataset)):
        prompt = render_chat(dataset.samples[index]).replace(EMPTY_THINK_BLOCK, "")
        upstream = encode_prompt(prompt, tokenizer, 96)
        fixed = reference.encode_sft_prompt(prompt, tokenizer, 96)
        targets = [sum(label != IGNORE_INDEX for label in labels) for labels in (upstream[1], fixed[1])]
        if targets[0] == 0 < targets[1]:
            lost.append(index)
        elif fixed != upstream:
            different.append(index)
    answers = [dataset.samples[i][-1]["content"][:2] for i in lost]
    assert lost and answers == ["  "] * len(lost) and not different, (
        f"ACTUAL trained only by the extension: lines {lost} (answers starting {answers}); other lines that differ "
        f"from upstream: {different}\nEXPECTED some lines, each an answer starting with two spaces, and no other "
        "difference\nlikely cause: encode_sft_prompt splits the text elsewhere than right after each assistant marker")


def check_counts() -> dict[str, int]:
    """The lesson's checks: core (and of them hidden), hardening, the extension's."""
    tiers = Counter(OPTIONAL if LESSON.exercise(c.exercise).optional else c.tier for c in LESSON.checks)
    hidden = sum(c.hidden for c in LESSON.checks)
    return {"core": tiers[CORE], "hidden": hidden, "hardening": tiers[HARDENING], "optional": tiers[OPTIONAL]}


@pytest.mark.parametrize("lesson", TEXTS, ids=text_id)
def test_section_6_1_counts_the_checks(lesson):
    section = lesson.read_text(encoding="utf-8")
    section = section[section.index('<a id="l17-run-checks"></a>'):section.index('<a id="l17-lab"></a>')]
    counts = check_counts()
    numbers = [int(n) for n in re.findall(r"\d+", section)]
    shown = [counts[k] in numbers for k in counts]
    assert all(shown), (f"{lesson.name} §6.1 should state the checks' counts\n  ACTUAL numbers in it: {numbers}\n"
                        f"  EXPECTED to hold: {counts}\n  likely cause: a check was added or moved to another tier")


ROW = re.compile(r"(?m)^\| [^|]+ \| (`\w+`|§5\.5|§5\.6) \| (\d+)")


def catalogue_counts() -> dict[str, int]:
    """Catalogued mistakes per objective of the check that catches them, then the hardening tier, the extension."""
    def group(check):
        if LESSON.exercise(check.exercise).optional:
            return "§5.6"
        return f"`{check.objective}`" if check.objective else "§5.5"
    groups = {c.name: group(c) for c in LESSON.checks}
    counts = Counter(groups[m.caught_by] for m in LESSON.mistakes)
    return {key: counts[key] for key in [*(f"`{o}`" for o in LESSON.objectives), "§5.5", "§5.6"]}


@pytest.mark.parametrize("lesson", TEXTS, ids=text_id)
def test_section_6_3_counts_the_catalogue_per_objective(lesson):
    text = lesson.read_text(encoding="utf-8")
    section = text[text.index('<a id="l17-mistakes"></a>'):text.index('<a id="l17-check-predictions"></a>')]
    shown = {key: int(count) for key, count in ROW.findall(section)}
    assert shown == catalogue_counts(), (f"{lesson.name} §6.3\n  ACTUAL:   {shown}\n  EXPECTED: {catalogue_counts()}\n"
                                         "  likely cause: a mistake was catalogued or moved: update both tables")


SHOWN_UPDATE = re.compile(r"update +(\d+): \[([\d, ]+)\], N = (\d+)")


@pytest.mark.parametrize("notes", NOTES, ids=text_id)
def test_the_lab_claims_follow_from_the_shown_output(notes):
    """What notes §2 says about the printout of lesson §6.2's lab (tests/test_docs_commands.py holds the printout
    to the lab's): the targets of 9 of the 10 updates differ 5 to 16 fold, the naive drift is 37 % and the
    token-weighted one rounding."""
    section = section_text(notes, "2")
    prose = re.sub(r"```.*?```", "", section, flags=re.S)   # the claims made about the printout
    updates = [[int(n) for n in units.split(", ")] for _, units, _ in SHOWN_UPDATE.findall(section)]
    ratios = sorted(max(units) / min(units) for units in updates)
    drifts = [float(d) for d in re.findall(r"drift after 10 updates ([\d.e+-]+)", section)]
    assert len(updates) == 10 and ratios[1] >= 5 and 15.5 < ratios[-1] <= 16 and drifts[0] < 1e-5 and \
        round(drifts[1] * 100) == 37 and re.search(r"\b5\D{1,8}16\b", prose) and "37 %" in prose, (
            f"{text_id(notes)} §2\n  ACTUAL: ratios {[round(r, 1) for r in ratios]}, drifts {drifts}\n  EXPECTED: 10 "
            "updates, all but one ratio >= 5, the largest 16, drifts < 1e-5 and 37 %, as the prose says\n  likely "
            "cause: the lab's printout changed: update the prose of notes §2 with it")


SAME_EFFECT = ("lr_only_on_the_first_micro_step", "clipping_only_on_the_closing_micro_step")


@pytest.mark.parametrize("name", SAME_EFFECT)
def test_options_with_the_same_effect_pass_the_core(name):
    """Lesson 16's session keeps an lr it was given and clips with the closing micro-step's clip_grad_norm: lr on
    an update's first micro-step only, or clipping on its closing one only, trains exactly as passing both on every
    micro-step. The core grades that effect; the convention is the hardening check's (it fails them there, and
    never crashes on an lr of None beside a float)."""
    mistake = next(m for m in LESSON.mistakes if m.name == name)
    [core, hardening] = grade_exercises(LESSON, mistake.build(), only=["sft_epoch"], include_optional=True)
    failed = [f"{r.check}: {r.message[:300]}" for r in core.checks if r.status != PASS]
    assert core.tier == CORE and not failed, f"{name} has the reference's effect but fails the core:\n{failed}"
    verdicts = [(r.check, r.status, r.message[:300]) for r in hardening.checks]
    assert hardening.tier == HARDENING and any(status == FAIL and "hint: the rule: every micro-step" in message
                                               for _, status, message in verdicts), (
        f"{name}: the hardening tier should fail it with the convention's rule, not crash: {verdicts}")
