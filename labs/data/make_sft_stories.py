"""Writes labs/data/sft_stories.jsonl and sft_stories_heldout.jsonl: lesson 17's built-in chat corpus (no download).

Conversations about stories like those of make_pretrain_stories.py (its names, animals, things, colors, places and
sentence templates), in MiniMind's sft format: one ``{"conversations": [{"role": ..., "content": ...}, ...]}`` per
line, roles ``system`` (sometimes), ``user`` and ``assistant``. The first user turn holds a story and a question,
later user turns (multi-turn conversations) ask more questions about the same story. Every question has one exact
answer, from a few tokens ("Mia.") to a sentence or two: a system message may ask for full sentences, and some
questions ask to repeat a sentence of the story. ``answer_matches`` scores an answer (case, punctuation and spacing
ignored).

The held-out split tests reading, not memory: some (person, animal) and (person, thing) pairs are reserved, a
training story never shows one (no "Mia found a ... book", no "Mia has a ... cat" if those pairs are reserved),
and every held-out story shows at least one, so no held-out story occurs in the training split; none occurs word
for word in the pretraining corpus either. Everything is drawn by ``random.Random`` from SEED, so both files are
the same byte for byte on every machine.

    python labs/data/make_sft_stories.py                       # rewrites the committed files
    python labs/data/make_sft_stories.py TRAIN.jsonl HELDOUT.jsonl
"""
from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from course.implementations import load_module

HERE = Path(__file__).resolve().parent
# The pretraining corpus's vocabulary and its texts: the pretrained model knows these words, and a held-out story
# must not be one of its lines.
PRETRAIN = load_module(HERE / "make_pretrain_stories.py", "make_pretrain_stories")

SEED = 2027
TRAIN_CONVERSATIONS = 1200
HELDOUT_CONVERSATIONS = 200
TRAIN_OUT = HERE / "sft_stories.jsonl"
HELDOUT_OUT = HERE / "sft_stories_heldout.jsonl"
RESERVED_PER_NAME = 2  # of the 10 animals and of the 10 things, per name: 20 % of the pairs are held out

# (system message, answer style); None: no system message. One conversation in three asks for full sentences.
SYSTEMS = [(None, "short"), (None, "short"), ("Answer questions about the story.", "short"),
           ("Answer briefly.", "short"), ("Answer in a full sentence.", "full"),
           ("Always answer with one whole sentence.", "full")]
FIRST_TURNS = ["Story: {story}\nQuestion: {question}", "{story}\n{question}",
               "Read the story and answer the question. {story} {question}"]
TURN_COUNTS = [1, 1, 1, 1, 1, 2, 2, 2, 3, 3]  # half single-turn, the rest two or three questions


@dataclass
class Story:
    """The facts of one story (the pretraining templates' roles) and the sentences it shows."""
    owner: str
    friend: str
    animal: str
    animal_color: str
    thing: str
    thing_color: str
    place: str
    feeling: str
    present: str
    past: str
    shown: range  # indices into sentences()

    def sentences(self) -> list[str]:
        # make_pretrain_stories.story's templates, with a color of its own for the thing, so that a color
        # question has to find the right sentence
        return [f"{self.owner} has a {self.animal_color} {self.animal}.",
                f"The {self.animal} {self.present} in the {self.place}.",
                f"One day {self.owner} went to the {self.place} with {self.friend}.",
                f"{self.friend} found a {self.thing_color} {self.thing} there.",
                f"The {self.animal} {self.past} all day and {self.owner} felt {self.feeling}.",
                f"{self.owner} gave the {self.thing} to {self.friend}.",
                f"At night the {self.animal} slept in the {self.place}."]

    def text(self) -> str:
        return " ".join(self.sentences()[i] for i in self.shown)

    def bindings(self) -> set[tuple[str, str]]:
        """The (person, animal or thing) pairs its shown sentences tie together."""
        pairs = {0: [(self.owner, self.animal)], 3: [(self.friend, self.thing)], 4: [(self.owner, self.animal)],
                 5: [(self.owner, self.thing), (self.friend, self.thing)]}
        return {pair for i in self.shown for pair in pairs.get(i, [])}

    def questions(self) -> dict[str, tuple[str, str, str]]:
        """kind -> (question, short answer, full-sentence answer), for the questions its shown sentences answer."""
        s = self
        base = s.present[:-1]  # "runs" -> "run": every verb of the pretraining corpus
        by_sentence = {
            0: {"pet_what": (f"What animal does {s.owner} have?", f"A {s.animal_color} {s.animal}.",
                             f"{s.owner} has a {s.animal_color} {s.animal}."),
                "pet_color": (f"What color is {s.owner}'s {s.animal}?", f"{s.animal_color.capitalize()}.",
                              f"{s.owner}'s {s.animal} is {s.animal_color}."),
                "pet_owner": (f"Who has a {s.animal}?", f"{s.owner}.", f"{s.owner} has a {s.animal}.")},
            1: {"pet_where": (f"Where does the {s.animal} {base}?", f"In the {s.place}.",
                              f"The {s.animal} {s.present} in the {s.place}.")},
            2: {"went_where": (f"Where did {s.owner} go?", f"To the {s.place}.", f"{s.owner} went to the {s.place}."),
                "went_with": (f"Who went to the {s.place} with {s.owner}?", f"{s.friend}.",
                              f"{s.friend} went to the {s.place} with {s.owner}.")},
            3: {"find_what": (f"What did {s.friend} find?", f"A {s.thing_color} {s.thing}.",
                              f"{s.friend} found a {s.thing_color} {s.thing}."),
                "find_who": (f"Who found the {s.thing}?", f"{s.friend}.", f"{s.friend} found the {s.thing}."),
                "thing_color": (f"What color was the {s.thing}?", f"{s.thing_color.capitalize()}.",
                                f"The {s.thing} was {s.thing_color}.")},
            4: {"feeling": (f"How did {s.owner} feel?", f"{s.feeling.capitalize()}.", f"{s.owner} felt {s.feeling}."),
                "pet_did": (f"What did the {s.animal} do all day?", f"It {s.past}.",
                            f"The {s.animal} {s.past} all day.")},
            5: {"gave_what": (f"What did {s.owner} give to {s.friend}?", f"The {s.thing}.",
                              f"{s.owner} gave the {s.thing} to {s.friend}."),
                "gave_who": (f"Who did {s.owner} give the {s.thing} to?", f"{s.friend}.",
                             f"{s.owner} gave the {s.thing} to {s.friend}.")},
            6: {"sleep_where": (f"Where did the {s.animal} sleep at night?", f"In the {s.place}.",
                                f"The {s.animal} slept in the {s.place}.")},
        }
        found = {kind: qa for i in self.shown for kind, qa in by_sentence.get(i, {}).items()}
        # sentence-long answers in either style: the model has to copy a whole sentence of the prompt
        first, last = self.sentences()[self.shown[0]], self.sentences()[self.shown[-1]]
        found["first_sentence"] = ("What is the first sentence of the story?", first, first)
        found["last_sentence"] = ("What is the last sentence of the story?", last, last)
        return found


@dataclass
class Counting:
    """make_pretrain_stories.counting without its answer sentence."""
    name: str
    thing: str
    start: int
    more: int

    def text(self) -> str:
        return f"{self.name} has {self.count(self.start)}. {self.name} gets {PRETRAIN.NUMBER_WORDS[self.more]} more."

    def count(self, n: int, more: str = "") -> str:
        """"one ball", "two balls" (the pretraining corpus writes "one balls"); more="more ": "one more ball"."""
        return f"{PRETRAIN.NUMBER_WORDS[n]} {more}{self.thing}{'' if n == 1 else 's'}"

    def bindings(self) -> set[tuple[str, str]]:
        return {(self.name, self.thing)}

    def questions(self) -> dict[str, tuple[str, str, str]]:
        words, s = PRETRAIN.NUMBER_WORDS, self
        return {
            "count_total": (f"How many {s.thing}s does {s.name} have now?", f"{words[s.start + s.more].capitalize()}.",
                            f"{s.name} has {s.count(s.start + s.more)} now."),
            "count_start": (f"How many {s.thing}s did {s.name} have at first?", f"{words[s.start].capitalize()}.",
                            f"{s.name} had {s.count(s.start)} at first."),
            "count_more": (f"How many more {s.thing}s did {s.name} get?", f"{words[s.more].capitalize()}.",
                           f"{s.name} got {s.count(s.more, more='more ')}."),
        }


@dataclass
class Chat:
    """One conversation and the kind of question each assistant turn answers (kept in memory, not written)."""
    conversations: list[dict]
    kinds: list[str]


def reserved_pairs(rng: random.Random) -> set[tuple[str, str]]:
    """The (person, animal) and (person, thing) pairs that only held-out stories show."""
    return {(name, noun) for name in PRETRAIN.NAMES
            for nouns in (PRETRAIN.ANIMALS, PRETRAIN.THINGS) for noun in rng.sample(nouns, RESERVED_PER_NAME)}


def draw_story(rng: random.Random) -> Story:
    owner, friend = rng.sample(PRETRAIN.NAMES, 2)
    present, past = rng.choice(PRETRAIN.VERBS)
    start = rng.randrange(3)  # the pretraining corpus's windows: 3 to 5 sentences from the first, second or third
    return Story(owner=owner, friend=friend, animal=rng.choice(PRETRAIN.ANIMALS),
                 animal_color=rng.choice(PRETRAIN.COLORS), thing=rng.choice(PRETRAIN.THINGS),
                 thing_color=rng.choice(PRETRAIN.COLORS), place=rng.choice(PRETRAIN.PLACES),
                 feeling=rng.choice(PRETRAIN.FEELINGS), present=present, past=past,
                 shown=range(start, start + rng.randint(3, 5)))


def draw_counting(rng: random.Random) -> Counting:
    return Counting(name=rng.choice(PRETRAIN.NAMES), thing=rng.choice(PRETRAIN.THINGS), start=rng.randint(1, 6),
                    more=rng.randint(1, 6))


def draw_chat(rng: random.Random, subject) -> Chat:
    """A system message (sometimes), then 1-3 different questions about ``subject``, the first with its text."""
    system, style = rng.choice(SYSTEMS)
    questions = subject.questions()
    kinds = rng.sample(sorted(questions), min(rng.choice(TURN_COUNTS), len(questions)))
    turns = [{"role": "system", "content": system}] if system else []
    for i, kind in enumerate(kinds):
        question, short, full = questions[kind]
        user = rng.choice(FIRST_TURNS).format(story=subject.text(), question=question) if i == 0 else question
        turns += [{"role": "user", "content": user},
                  {"role": "assistant", "content": full if style == "full" else short}]
    return Chat(turns, kinds)


def draw_chats(rng: random.Random, count: int, keep) -> list[Chat]:
    """``count`` conversations about subjects (stories, one in four a counting text) that ``keep`` accepts."""
    chats = []
    while len(chats) < count:
        subject = draw_counting(rng) if rng.random() < 0.25 else draw_story(rng)
        if keep(subject):
            chats.append(draw_chat(rng, subject))
    return chats


def corpus(seed: int = SEED, train: int = TRAIN_CONVERSATIONS, heldout: int = HELDOUT_CONVERSATIONS):
    """(training chats, held-out chats). Each split has its own generator, so the held-out split does not move
    when the training split grows."""
    reserved = reserved_pairs(random.Random(seed))
    pretrain_texts = PRETRAIN.texts()

    def unseen(subject) -> bool:  # shows a reserved pair and is no pretraining text, nor part of one
        return bool(subject.bindings() & reserved) and not any(subject.text() in text for text in pretrain_texts)
    return (draw_chats(random.Random(seed + 1), train, lambda subject: not subject.bindings() & reserved),
            draw_chats(random.Random(seed + 2), heldout, unseen))


def normalize_answer(text: str) -> str:
    """Lower case, punctuation dropped, spacing collapsed: "A blue book." and "a blue  book" are the same."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def answer_matches(prediction: str, reference: str) -> bool:
    """The exact-answer score of one answer: equal after normalize_answer."""
    return normalize_answer(prediction) == normalize_answer(reference)


def exact_match_score(predictions: list[str], references: list[str]) -> float:
    """The share of predictions that match their reference exactly (after normalize_answer)."""
    if len(predictions) != len(references) or not references:
        raise ValueError(f"need as many predictions as references, at least one: got {len(predictions)} "
                         f"and {len(references)}")
    return sum(map(answer_matches, predictions, references)) / len(references)


def write(path: Path, chats: list[Chat]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for chat in chats:
            handle.write(json.dumps({"conversations": chat.conversations}) + "\n")
    turns = sum(len(chat.kinds) for chat in chats)
    print(f"wrote {path}: {len(chats)} conversations, {turns} answers, {path.stat().st_size} bytes")


def main(argv=None) -> int:
    train_out, heldout_out = (Path(argv[0]), Path(argv[1])) if argv else (TRAIN_OUT, HELDOUT_OUT)
    train, heldout = corpus()
    write(train_out, train)
    write(heldout_out, heldout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
