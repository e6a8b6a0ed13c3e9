"""Lesson 17's test-writing exercise: the student's ``test_assistant_labels_match_upstream`` must pass correct
masks and fail each wrong one below. Each wrong mask differs from upstream's only on some kinds of conversation
(its ``hint`` says which), so a test passes this check only if its conversations cover them all."""
from __future__ import annotations

import functools

from course.minimind import IGNORE_INDEX, ByteTokenizer
from course.minimind.sft import EMPTY_THINK_BLOCK, sft_labels
from course.runs.sft import upstream_tokenizer

from ..framework import check
from ..student_tests import WrongImplementation, expect_verdicts, opaque


def upstream_labels(input_ids, assistant_start, end):
    """Upstream's own rule (the oracle's ``sft_labels``), cut at the sample's length."""
    return sft_labels(list(input_ids), list(assistant_start), list(end), len(input_ids))


def labels_by_scanning(input_ids, assistant_start, end):
    """The same labels, written another way: one pass that switches in and out of an answer."""
    labels, inside, position = [], False, 0
    while position < len(input_ids):
        if not inside and list(input_ids[position:position + len(assistant_start)]) == list(assistant_start):
            labels += [IGNORE_INDEX] * len(assistant_start)
            position, inside = position + len(assistant_start), True
        elif inside and list(input_ids[position:position + len(end)]) == list(end):
            labels += list(input_ids[position:position + len(end)])
            position, inside = position + len(end), False
        else:
            labels.append(input_ids[position] if inside else IGNORE_INDEX)
            position += 1
    return labels[:len(input_ids)]


def spans(labels):
    """(first, stop) of each run of targets."""
    found, start = [], None
    for position, label in enumerate([*labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = position
        elif label == IGNORE_INDEX and start is not None:
            found.append((start, position))
            start = None
    return found


def keep_spans(input_ids, labels, chosen):
    """Labels holding only the spans ``chosen(spans)`` returns."""
    kept = [IGNORE_INDEX] * len(input_ids)
    for first, stop in chosen(spans(labels)):
        kept[first:stop] = input_ids[first:stop]
    return kept


def first_answer_only(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    return keep_spans(input_ids, labels, lambda found: found[:1])


def without_a_truncated_answer(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    ends_whole = list(input_ids[len(input_ids) - len(end):]) == list(end)
    return keep_spans(input_ids, labels, lambda found: [s for s in found if s[1] < len(input_ids) or ends_whole])


def truncated_answer_one_short(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    return labels[:-1] + [IGNORE_INDEX]


def answerless_sample_trains_on_everything(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    return labels if any(label != IGNORE_INDEX for label in labels) else list(input_ids)


def every_second_turn(input_ids, assistant_start, end):
    """Takes turns 1, 3, 5, ... (counting from 0) for the assistant's, whatever their role: right while a
    conversation opens with the user, wrong once a system prompt comes first."""
    turns = [i for i, token in enumerate(input_ids) if token == assistant_start[0]]
    labels = [IGNORE_INDEX] * len(input_ids)
    for turn in turns[1::2]:
        first = turn + len(assistant_start)
        stop = next((i + len(end) for i in range(first, len(input_ids))
                     if list(input_ids[i:i + len(end)]) == list(end)), len(input_ids))
        labels[first:stop] = input_ids[first:stop]
    return labels


def with_the_marker(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    return keep_spans(input_ids, labels, lambda found: [(max(0, f - len(assistant_start)), s) for f, s in found])


def without_the_end_marker(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    return keep_spans(input_ids, labels, lambda found: [
        (f, s - len(end)) if list(input_ids[s - len(end):s]) == list(end) else (f, s) for f, s in found])


def without_the_newline_after_the_end(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    return keep_spans(input_ids, labels, lambda found: [
        (f, s - 1) if list(input_ids[s - len(end):s]) == list(end) else (f, s) for f, s in found])


def shifted(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    return [label if label == IGNORE_INDEX or i + 1 >= len(input_ids) else input_ids[i + 1]
            for i, label in enumerate(labels)]


@functools.cache
def empty_think_blocks() -> tuple[list[int], ...]:
    """The ids of ``<think>\\n\\n</think>\\n\\n`` with upstream's tokenizer and the byte-level one."""
    return tuple(tokenizer(EMPTY_THINK_BLOCK, add_special_tokens=False).input_ids
                 for tokenizer in (upstream_tokenizer(), ByteTokenizer()))


def empty_think_block_not_trained(input_ids, assistant_start, end):
    """The empty think block that opens an answer labelled -100, as if it were no part of the answer (right
    wherever the empty think blocks were removed)."""
    labels = upstream_labels(input_ids, assistant_start, end)
    for block in empty_think_blocks():
        for first, _ in spans(labels):
            if list(input_ids[first:first + len(block)]) == block:
                labels[first:first + len(block)] = [IGNORE_INDEX] * len(block)
    return labels


def moved_one_earlier(input_ids, assistant_start, end):
    """Pre-shifted labels (lesson 17 §1.1): each target one position early, where the model predicts it; the
    same targets in the same order."""
    return [*upstream_labels(input_ids, assistant_start, end)[1:], IGNORE_INDEX]


def moved_one_later(input_ids, assistant_start, end):
    """Each target one position late; the same targets in the same order (the last one cut off at the end)."""
    return [IGNORE_INDEX, *upstream_labels(input_ids, assistant_start, end)[:-1]]


def pad_id_never_a_target(input_ids, assistant_start, end):
    """"Padding is never a target": an id 0 inside a span labelled -100 (right wherever no answer holds id 0)."""
    return [IGNORE_INDEX if label == 0 else label for label in upstream_labels(input_ids, assistant_start, end)]


def end_marker_by_its_first_id(input_ids, assistant_start, end):
    """A span ends at the end marker's first id, whatever follows it: right wherever that id stands only in whole
    end markers (no answer holds the text <|im_end|> of its own)."""
    labels, position = [IGNORE_INDEX] * len(input_ids), 0
    while position < len(input_ids):
        if list(input_ids[position:position + len(assistant_start)]) != list(assistant_start):
            position += 1
            continue
        first = position + len(assistant_start)
        stop = next((i for i in range(first, len(input_ids)) if input_ids[i] == end[0]), len(input_ids)) + len(end)
        labels[first:stop] = input_ids[first:stop]
        position = stop
    return labels


class WritesIntoItsInput(WrongImplementation):
    """The right labels, built in the caller's list (``labels = input_ids``, then -100 written into it): the sample's
    ids are lost. Not wrong where the test hands it an ``input_ids`` it cannot write into."""

    @property
    def edited_nothing(self) -> bool:
        return not _WROTE_INTO_INPUT


_WROTE_INTO_INPUT = []   # whether the last call could write into its input_ids


def labels_written_into_input_ids(input_ids, assistant_start, end):
    labels = upstream_labels(input_ids, assistant_start, end)
    _WROTE_INTO_INPUT[:] = [isinstance(input_ids, list)]
    if isinstance(input_ids, list):
        input_ids[:] = labels
        return input_ids
    return labels


def raises(input_ids, assistant_start, end):
    upstream_labels(input_ids, assistant_start, end)
    raise RuntimeError("labels: an implementation that crashes")


class Crashing(WrongImplementation):
    malformed = True   # any exception in the test rejects it; only a test that swallows errors lets it through


MOVED_HINT = ("compare each label at its position (the whole lists): a mask moved by one position holds the same "
              "target values in the same order, so a test that compares only the targets' values lets it through")

WRONG_MASKS = (
    WrongImplementation("first_answer_only", "labels the first assistant turn only", "with a single assistant turn "
                        "every conversation looks right: give your test a conversation of two or more turns",
                        first_answer_only),
    WrongImplementation("every_second_turn", "takes every second turn for the assistant's, whatever its role",
                        "while every conversation opens with the user this is upstream's mask: put a system prompt "
                        "first in one", every_second_turn),
    WrongImplementation("without_a_truncated_answer", "drops a span that the truncation cut (no end marker left)",
                        "no conversation of your test is cut inside an answer: cut one there (a max_length that ends "
                        "in the middle of an answer)", without_a_truncated_answer),
    WrongImplementation("truncated_answer_one_short", "a span cut by the truncation stops one id before the end",
                        "cut a conversation inside an answer: its span runs to the sample's last id",
                        truncated_answer_one_short),
    WrongImplementation("answerless_sample_trains_on_everything", "a sample with no target left is trained on all "
                        "of its ids, like pretraining", "cut a conversation before its answer (inside or right "
                        "after the assistant marker): upstream gives it no target at all",
                        answerless_sample_trains_on_everything),
    WrongImplementation("empty_think_block_not_trained", "leaves out the empty think block that opens an answer",
                        "keep the empty think blocks in a conversation (sft_sample's default): upstream trains on "
                        "<think>\\n\\n</think>\\n\\n like any id of the span (lesson 17 §1.2)",
                        empty_think_block_not_trained),
    WrongImplementation("with_the_marker", "labels the assistant marker too", "compare every label, each sample "
                        "whole: the marker's ids are -100 in upstream's labels", with_the_marker),
    WrongImplementation("without_the_end_marker", "stops each span before <|im_end|>", "compare every label: the end "
                        "marker's ids are targets in upstream's labels", without_the_end_marker),
    WrongImplementation("without_the_newline_after_the_end", "stops each span after <|im_end|>, before its newline",
                        "compare every label: the newline after <|im_end|> is a target in upstream's labels",
                        without_the_newline_after_the_end),
    WrongImplementation("shifted", "labels shifted by one (the next id at each target)", "compare the labels' values, "
                        "not only where they are -100", shifted),
    WrongImplementation("moved_one_earlier", "every label moved one position earlier: labels pre-shifted for the "
                        "model (lesson 17 §1.1)", MOVED_HINT, moved_one_earlier),
    WrongImplementation("moved_one_later", "every label moved one position later", MOVED_HINT, moved_one_later),
    Crashing("raises", "computes the labels, then raises", "let the implementation's exceptions propagate: do not "
             "catch them in your test", raises),
)


@check("test_assistant_labels_match_upstream", objective="test_writing")
def mask_test_passes_correct_and_fails_wrong(impl):
    """Your test passes upstream's rule written two ways and raises AssertionError on each of 12 wrong masks: the
    first turn only, every second turn taken for the assistant's, a truncated answer dropped or one id short, a
    sample without an answer trained on everything, the empty think block left out, the marker labelled, the end
    marker or its newline left out, labels shifted, every label moved one position earlier (pre-shifted) or
    later; and it fails (any exception) on an implementation that raises."""
    expect_verdicts("test_assistant_labels_match_upstream", impl.test_assistant_labels_match_upstream,
                    (upstream_labels, labels_by_scanning), WRONG_MASKS,
                    "a correct mask is upstream's labels, token for token: compare with sft_sample(...).labels",
                    "the implementation's contract is lesson 17 §5.1's: (input_ids, assistant_start, end) -> a list; "
                    "run your test on course/minimind/sft.py::sft_labels by hand",
                    lambda wrong: PASSES_EVERYTHING if passes(impl.test_assistant_labels_match_upstream, list)
                    else wrong.hint)


def expect_rejected(impl, masks) -> None:
    """A hardening check: the student's test raises AssertionError on each of ``masks``."""
    expect_verdicts("test_assistant_labels_match_upstream", impl.test_assistant_labels_match_upstream, (), masks, "",
                    "the implementation's contract is lesson 17 §5.1's", lambda wrong: wrong.hint)


PAD_ID_MASKS = (
    WrongImplementation("pad_id_never_a_target", "labels an id 0 inside a span -100 (\"padding is never a target\")",
                        "give your test an answer that holds id 0, the pad id: the text <|endoftext|> is that one "
                        "token, and upstream trains on it like any id of the span (lesson 17 answers §1.2)",
                        pad_id_never_a_target),
)


@check("test_assistant_labels_match_upstream")
def mask_test_fails_a_mask_that_drops_id_0(impl):
    """Hardening (lesson 17 §5.5): your test also raises AssertionError on a mask that never labels id 0 (the pad
    id), which differs from upstream's only where an answer holds id 0 (the text <|endoftext|>)."""
    expect_rejected(impl, PAD_ID_MASKS)


END_MARKER_MASKS = (
    WrongImplementation("end_marker_by_its_first_id", "ends a span at the end marker's first id, whatever follows "
                        "it", "put the text <|im_end|> inside an answer, followed by something other than a newline: "
                        "its id alone is no end marker (lesson 17 §5.1)", end_marker_by_its_first_id),
)


@check("test_assistant_labels_match_upstream")
def mask_test_fails_a_mask_that_ends_at_the_end_markers_first_id(impl):
    """Hardening (lesson 17 §5.5): your test also raises AssertionError on a mask that ends a span at the end
    marker's first id alone, which differs from upstream's only where an answer holds the text <|im_end|>."""
    expect_rejected(impl, END_MARKER_MASKS)


INPUT_WRITING_MASKS = (
    WritesIntoItsInput("labels_written_into_input_ids", "returns the right labels, written into the caller's "
                       "input_ids (labels = input_ids): the sample's ids are gone", "call the implementation on a "
                       "copy of the sample's input_ids and assert the copy is unchanged afterwards: its arguments are "
                       "left as they were (lesson 17 §4.2)", labels_written_into_input_ids),
)


@check("test_assistant_labels_match_upstream")
def mask_test_fails_a_mask_that_writes_into_its_input(impl):
    """Hardening (lesson 17 §5.5): your test also raises AssertionError on a mask that returns the right labels
    written into the caller's input_ids, which only a test that looks at its arguments after the call sees."""
    expect_rejected(impl, INPUT_WRITING_MASKS)


def upstreams_marker_ids(input_ids, assistant_start, end):
    """Upstream's tokenizer's marker ids hard-coded, the arguments ignored: right wherever upstream's tokenizer made
    the ids, no span at all with another tokenizer's."""
    return upstream_labels(input_ids, [1, 1388, 570, 811, 234], [2, 234])


MARKER_ID_MASKS = (
    WrongImplementation("upstreams_marker_ids", "finds upstream's marker ids [1, 1388, 570, 811, 234] and [2, 234], "
                        "whatever markers it is given", "tokenize one conversation with another tokenizer too "
                        "(sft_sample(..., tokenizer=ByteTokenizer())): its markers are other ids, and a mask must "
                        "find the ones it is given (lesson 17 §5.1)", upstreams_marker_ids),
)


@check("test_assistant_labels_match_upstream")
def mask_test_fails_a_mask_with_upstreams_marker_ids(impl):
    """Hardening (lesson 17 §5.5): your test also raises AssertionError on a mask that ignores the markers it is
    given and finds upstream's ids, which differs from upstream's rule only on another tokenizer's ids."""
    expect_rejected(impl, MARKER_ID_MASKS)


PASSES_EVERYTHING = ("your test passes every implementation, even one that returns input_ids unchanged: assert that "
                     "the labels equal upstream's (sft_sample(...).labels), every one of them")


def passes(student_test, implementation) -> bool:
    """Whether ``student_test`` returns on ``implementation``."""
    try:
        student_test(opaque(lambda input_ids, assistant_start, end: implementation(input_ids)))
    except Exception:
        return False
    return True
