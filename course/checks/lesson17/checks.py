"""Lesson 17 checks of ``assistant_labels``: the mask of one conversation, token for token upstream's.

The expected labels are the oracle's (``course/minimind/sft.py::sft_labels``, equal to upstream's own output on
tests/fixtures/upstream/minimind_sft_d65ef2c.pt), on conversations rendered, tokenized and cut by the oracle with
upstream's tokenizer (and with the byte-level one, whose markers are 11 ids long). Labels are ids: compared
exactly. A failure names the case and the rule its labels break (``mask_hint`` reads it off the two label lists).
"""
from __future__ import annotations

from course.minimind import IGNORE_INDEX, ByteTokenizer
from course.minimind.sft import assistant_markers, sft_labels
from course.runs.sft import SFTSample, sft_sample, upstream_tokenizer

from ..framework import check, fail

SYSTEM = {"role": "system", "content": "You are a helpful AI assistant."}


def chat(*turns: str) -> list[dict]:
    """Alternating user and assistant messages."""
    return [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(turns)]


THREE_TURNS = chat("Is seven prime?", "Yes.", "And nine?", "No, nine is three times three.", "And eleven?", "Yes.")
# An answer holding the text <|endoftext|>: the tokenizers turn it into id 0, the pad id, inside the span.
END_OF_TEXT = chat("What ends a document?", "The token <|endoftext|> does.", "Is it ever a target?",
                   "Here: <|endoftext|>")
TWO_SPACES = chat("Show a Python line that prints one.", "  print(1)")


def runs(labels: list[int]) -> list[range]:
    """The maximal runs of targets (labels that are not -100): one per assistant span of a rendered chat."""
    found, start = [], None
    for position, label in enumerate([*labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = position
        elif label == IGNORE_INDEX and start is not None:
            found.append(range(start, position))
            start = None
    return found


def mask_hint(input_ids, assistant_start, end, actual, expected) -> str:
    """The rule ``actual`` breaks, read off where its targets differ from the expected ones."""
    if not isinstance(actual, list) or len(actual) != len(input_ids):
        return "one label per input id: a list as long as input_ids"
    targets = {i for i, label in enumerate(actual) if label != IGNORE_INDEX}
    wanted = {i for i, label in enumerate(expected) if label != IGNORE_INDEX}
    spans = runs(expected)
    markers = {i for span in spans for i in range(span.start - len(assistant_start), span.start)}
    ends = {i for span in spans if input_ids[span.stop - len(end):span.stop] == end
            for i in range(span.stop - len(end), span.stop)}
    cut = {i for span in spans if span.stop == len(input_ids) and span.stop - len(end) not in ends for i in span}
    if wanted and targets == {i - 1 for i in wanted}:
        return "labels are unshifted: a target's label is its own input id (the model's loss shifts them)"
    upstream = assistant_markers(upstream_tokenizer())
    if (list(assistant_start), list(end)) != [list(m) for m in upstream] and actual == sft_labels(
            input_ids, *upstream, len(input_ids)):
        return ("the markers are arguments: look for the ids you are given (another tokenizer's markers are other "
                "ids), not upstream's")
    if targets and not wanted:
        return ("a sample in which no whole assistant marker stands (cut before its answer, or the marker's last "
                "id merged into the answer's first token) has no target at all: every label -100")
    if targets & markers:
        return "the assistant marker itself is no target: a span starts at the id after it"
    if targets < wanted and wanted - targets == ends:
        return "a span runs through its end marker: <|im_end|> and the newline after it are targets too"
    if targets < wanted and ends and wanted - targets == {i for i in ends if i + 1 not in ends}:
        return (f"the newline after <|im_end|> is a target: it is part of the end marker (ids {list(end)}), and a "
                "span runs through all of them")
    if targets < wanted and wanted - targets <= cut and all(input_ids[i] == 0 for i in wanted - targets):
        return ("a span cut by the truncation (no end marker left) runs to the end of the sample, an id 0 there "
                "too: a sample cut inside an answer holds no padding, its last ids are the answer's (the text "
                "<|endoftext|> is id 0)")
    first_missing = min(wanted - targets, default=None)
    if targets < wanted and any(input_ids[i] == 0 for i in wanted & set(range(first_missing - len(end),
                                                                                  first_missing + 1))):
        return ("a span copies every id up to its end marker, the pad id 0 included: an answer may hold id 0 (the "
                "text <|endoftext|> is that one token), and upstream trains on it like any other id")
    if len(spans) > 1 and set(spans[0]) <= targets and not targets & set().union(*spans[1:]):
        return "every assistant turn is a span, not only the first: resume the search after each span"
    if cut and targets <= wanted and cut - targets:
        return "a span cut by the truncation (no end marker left) runs to the end of the sample"
    if targets - wanted:
        return ("a span opens only after the whole assistant marker: a user or system turn is no target, nor are "
                "the ids between an end marker and the next assistant marker")
    if targets < wanted:
        return "a span ends at the first occurrence of the whole end marker (all of its ids), not of a part of it"
    return "a target's label is the input id at that position"


def expect_labels(impl, what: str, sample: SFTSample) -> None:
    """``assistant_labels`` gives the sample's labels and leaves its arguments as they were."""
    arguments = (list(sample.input_ids), list(sample.assistant_start), list(sample.end))
    actual = impl.assistant_labels(*arguments)
    if actual != sample.labels:
        hint = mask_hint(sample.input_ids, sample.assistant_start, sample.end, actual, sample.labels)
        positions = [i for i, (a, e) in enumerate(zip(actual, sample.labels)) if a != e] or [len(sample.labels)]
        window = slice(max(0, positions[0] - 4), positions[0] + 8)
        fail(f"assistant_labels on {what} ({len(sample.input_ids)} ids; input_ids[{window.start}:{window.stop}] = "
             f"{sample.input_ids[window]}): labels first differ at position {positions[0]}, around it",
             actual[window] if isinstance(actual, list) else actual, sample.labels[window], f"hint: the rule: {hint}")
    for name, argument, given in zip(("input_ids", "assistant_start", "end"), arguments,
                                     (sample.input_ids, sample.assistant_start, sample.end)):
        if argument != given:
            changed = next(i for i, (a, g) in enumerate(zip([*argument, None], [*given, None])) if a != g)
            fail(f"assistant_labels on {what}: its argument {name} afterwards, from position {changed}",
                 argument[changed:changed + 8], given[changed:changed + 8], "hint: the rule: the labels are a new "
                 "list; the arguments stay as they were (input_ids are the sample's input to the model, the "
                 "markers serve every sample)")


def cut_samples(messages: list[dict], tokenizer=None) -> dict[str, SFTSample]:
    """``messages`` cut at the places of lesson 17 §1.2: inside the last answer, between the two ids of its end
    marker, right after its assistant marker, and inside that marker."""
    whole = sft_sample(messages, 512, tokenizer)
    last = runs(whole.labels)[-1]
    return {f"{name}, cut to {length}": sft_sample(messages, length, tokenizer) for name, length in (
        ("cut inside its last answer", last.start + 3), ("cut between the two ids of its last end marker",
                                                        last.stop - 1),
        ("cut right after its last assistant marker", last.start),
        ("cut inside its last assistant marker", last.start - 2))}


@check("assistant_labels", objective="assistant_mask")
def labels_cover_every_assistant_turn(impl):
    """Upstream's labels on whole conversations: one turn, a system prompt, three turns, a think block in the
    answer, Chinese, the empty think blocks removed, an answer starting with two spaces (upstream leaves it out:
    its first id merges with the marker's newline), answers holding the text <|endoftext|> (id 0, the pad id: a
    target like any id of a span), and two turns through the byte-level tokenizer."""
    cases = {
        "one turn, padded": sft_sample(chat("Name a color.", "Red."), 48),
        "a system prompt": sft_sample([SYSTEM, *chat("Name a color.", "Red.")], 64),
        "three turns": sft_sample(THREE_TURNS, 96),
        "a think block in the answer": sft_sample(chat("2 + 3?", "<think>\nAdd them.\n</think>\n5."), 64),
        "a Chinese conversation": sft_sample(chat("一加一等于几？", "二。"), 40),
        "three turns, empty think blocks removed": sft_sample(THREE_TURNS, 96, empty_think_removed=True),
        "an answer starting with two spaces, empty think block removed":
            sft_sample(TWO_SPACES, 48, empty_think_removed=True),
        "two answers holding the text <|endoftext|> (id 0), padded": sft_sample(END_OF_TEXT, 96),
        "two turns, byte-level tokenizer": sft_sample(THREE_TURNS[:4], 160, ByteTokenizer()),
        "an answer holding <|endoftext|> (id 0), byte-level tokenizer": sft_sample(END_OF_TEXT[:2], 160,
                                                                                    ByteTokenizer()),
    }
    for what, sample in cases.items():
        expect_labels(impl, what, sample)


def cut_after_its_last_id_0(messages: list[dict], tokenizer=None) -> dict[str, SFTSample]:
    """``messages`` cut right after the last id 0 (the text <|endoftext|>) of its last answer: its last id is a
    target that looks like padding."""
    whole = sft_sample(messages, 512, tokenizer)
    length = max(i for i in runs(whole.labels)[-1] if whole.input_ids[i] == 0) + 1
    return {f"cut right after the id 0 its last answer holds, to {length}": sft_sample(messages, length, tokenizer)}


@check("assistant_labels", objective="assistant_mask")
def labels_of_a_truncated_conversation(impl):
    """Upstream's labels on conversations cut to max_length: inside the last answer (its span runs to the end),
    between the two ids of its end marker, right after its assistant marker and inside it (no target left), right
    after an id 0 inside the answer (the sample's last id, a target), with upstream's tokenizer and the byte-level
    one."""
    for tokenizer in (None, ByteTokenizer()):
        name = "byte-level" if tokenizer else "upstream's"
        for what, sample in {**cut_samples([SYSTEM, *chat("Name a color.", "Red, like a ripe strawberry.")],
                                           tokenizer),
                             **cut_samples(THREE_TURNS[:4], tokenizer),
                             **cut_after_its_last_id_0(END_OF_TEXT, tokenizer)}.items():
            expect_labels(impl, f"a conversation {what} ({name} tokenizer)", sample)


# Made-up ids with two-id markers: start [1, 7], end [2, 9]; an answer may hold the end marker's first id alone.
START, END = [1, 7], [2, 9]
ID_CASES = {
    "the end marker's first id alone inside an answer": [1, 5, 5, 2, 9, 1, 7, 6, 2, 6, 6, 2, 9, 0],
    "an empty answer": [1, 5, 2, 9, 1, 7, 2, 9, 0],
    "a start marker as the last ids": [1, 5, 2, 9, 1, 7],
    "an end marker before any start marker": [2, 9, 1, 7, 4, 2, 9],
    "two answers back to back": [1, 7, 3, 2, 9, 1, 7, 4, 4, 2, 9],
    "a start marker's first id twice": [1, 1, 7, 3, 2, 9, 0],
    "a start marker inside an answer": [1, 7, 3, 1, 7, 4, 2, 9, 5],
    "no marker at all": [3, 4, 5],
    "the pad id 0 inside an answer": [1, 7, 6, 0, 6, 2, 9],
    "the pad id 0 inside an answer, then padding": [1, 5, 2, 9, 1, 7, 0, 6, 0, 2, 9, 0, 0],
}


@check("assistant_labels", objective="assistant_mask", hidden=True)
def labels_match_whole_markers(impl):
    """Made-up ids with two-id markers, where only whole markers count: the end marker's first id alone inside an
    answer, an empty answer, a start marker as the last ids, an end marker before any start, answers back to
    back, a start marker's first id twice, a start marker inside an answer, no marker at all, the pad id 0 inside
    an answer."""
    for what, input_ids in ID_CASES.items():
        expected = sft_labels(input_ids, START, END, len(input_ids))
        expect_labels(impl, f"{what}, start marker {START}, end marker {END}",
                      SFTSample("", input_ids, expected, START, END))
