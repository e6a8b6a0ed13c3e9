"""Writes labs/data/sft_stories.jsonl and sft_stories_heldout.jsonl: lesson 17's built-in chat corpus (no download).

Conversations about short stories like those of make_pretrain_stories.py (its names, animals, things, places,
feelings and sentence templates), in MiniMind's sft format: one ``{"conversations": [{"role": ..., "content":
...}, ...]}`` per line, roles ``system`` (in about half of them: some ask for short answers, some for whole
sentences), then ``user`` and ``assistant``. The first user turn holds a story and a question, later user turns
(multi-turn conversations) ask more questions about the same story.

Every question asks for a word that occurs in the story once, as the only word of its kind: where the people
went (the place), which animal, which thing was found, how someone felt. The answer is that word ("To the
beach.", "A cat.", "A book.", "Happy."), or a sentence built around it when the system message asks for whole
sentences. With a word-level tokenizer (one trained on the stories: " beach" is one token) a one-layer model
can answer them by attending to the right token of the prompt: questions that need two hops (who found the
book? two people are in every story) or copying several tokens are left out on purpose, the lesson's model
cannot learn them in its time budget (measured: 4 % to 22 % held-out exact answers).

The held-out split tests reading, not memory: for each person, some places, animals, things and feelings are
reserved (``reserved_pairs``); a training story never ties a person to a reserved word (no "Mia went to the
beach" if (Mia, beach) is reserved) and every held-out story ties at least one person to one, and every
held-out question asks about such a reserved pair. So a right held-out answer cannot be a person -> word
association memorised from the training split: the model read it in the story. No held-out story occurs in
the training split, nor, word for word, in the pretraining corpus.

Everything is drawn by ``random.Random`` from SEED, so both files are the same byte for byte on every machine.
``answer_matches`` scores an answer against the gold one; ``exact_match_score`` a list of them.

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
TRAIN_CONVERSATIONS = 1600
HELDOUT_CONVERSATIONS = 200
TRAIN_OUT = HERE / "sft_stories.jsonl"
HELDOUT_OUT = HERE / "sft_stories_heldout.jsonl"
STORY_SENTENCES = (2, 4)  # a story shows this many consecutive sentences of the seven templates
RESERVED_PER_NAME = 3  # of the 10 places, animals and things and of the 8 feelings, per person

# (system message, answer style); None: no system message. "prefixed": "The answer is a hat." for "A hat.".
SYSTEMS = [(None, "short"), (None, "short"), (None, "short"), ("Answer briefly.", "short"),
           ("You are a helpful assistant. Give short answers.", "short"),
           ("Begin every answer with 'The answer is'.", "prefixed"),
           ("You are a quiz bot. Start each answer with 'The answer is'.", "prefixed")]
KINDS = ("place", "animal", "thing", "feeling")
FIRST_TURNS = ["{story}\n{question}", "Story: {story}\nQuestion: {question}",
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
        # make_pretrain_stories.story's templates (the thing has a color of its own there too)
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
        """The (person, place / animal / thing / feeling) pairs its shown sentences tie together."""
        s = self
        pairs = {0: [(s.owner, s.animal)], 2: [(s.owner, s.place), (s.friend, s.place)],
                 3: [(s.friend, s.thing)], 4: [(s.owner, s.animal), (s.owner, s.feeling)],
                 5: [(s.owner, s.thing), (s.friend, s.thing)]}
        return {pair for i in self.shown for pair in pairs.get(i, [])}

    def questions(self) -> dict[str, tuple[str, str, tuple[str, str]]]:
        """kind -> (question, short answer, the (person, word) pair it asks about), for the questions its shown
        sentences answer. Each answer's key word is the story's only word of its kind."""
        s = self
        base = s.present[:-1]  # "runs" -> "run": every verb of the pretraining corpus
        by_sentence = {
            0: {"animal": (f"What animal does {s.owner} have?", f"A {s.animal}.", (s.owner, s.animal))},
            1: {"place": (f"Where does the {s.animal} {base}?", f"In the {s.place}.", (s.animal, s.place))},
            2: {"place": (f"Where did {s.owner} go?", f"To the {s.place}.", (s.owner, s.place))},
            3: {"thing": (f"What did {s.friend} find?", f"A {s.thing}.", (s.friend, s.thing))},
            4: {"feeling": (f"How did {s.owner} feel?", f"{s.feeling.capitalize()}.", (s.owner, s.feeling))},
            5: {"thing": (f"What did {s.owner} give to {s.friend}?", f"The {s.thing}.", (s.owner, s.thing))},
            6: {"place": (f"Where did the {s.animal} sleep?", f"In the {s.place}.", (s.animal, s.place))},
        }
        found = {}
        for i in self.shown:  # one question per kind: the first shown sentence that answers it
            for kind, qa in by_sentence.get(i, {}).items():
                found.setdefault(kind, qa)
        return found


@dataclass
class Chat:
    """One conversation and the kind of question each assistant turn answers (kept in memory, not written)."""
    conversations: list[dict]
    kinds: list[str]


def reserved_pairs(rng: random.Random) -> set[tuple[str, str]]:
    """The (person, word) pairs that only held-out stories show: per person, RESERVED_PER_NAME of the places,
    animals, things and feelings."""
    return {(name, word) for name in PRETRAIN.NAMES
            for words in (PRETRAIN.PLACES, PRETRAIN.ANIMALS, PRETRAIN.THINGS, PRETRAIN.FEELINGS)
            for word in rng.sample(words, RESERVED_PER_NAME)}


def draw_story(rng: random.Random, lengths: tuple[int, int] = STORY_SENTENCES) -> Story:
    owner, friend = rng.sample(PRETRAIN.NAMES, 2)
    present, past = rng.choice(PRETRAIN.VERBS)
    length = rng.randint(*lengths)
    start = rng.randrange(8 - length)  # any window of the seven templates
    return Story(owner=owner, friend=friend, animal=rng.choice(PRETRAIN.ANIMALS),
                 animal_color=rng.choice(PRETRAIN.COLORS), thing=rng.choice(PRETRAIN.THINGS),
                 thing_color=rng.choice(PRETRAIN.COLORS), place=rng.choice(PRETRAIN.PLACES),
                 feeling=rng.choice(PRETRAIN.FEELINGS), present=present, past=past,
                 shown=range(start, start + length))


def draw_chat(rng: random.Random, story: Story, kinds: list[str]) -> Chat:
    """A system message (sometimes), then questions of ``kinds`` about ``story``, the first with its text."""
    system, style = rng.choice(SYSTEMS)
    questions = story.questions()
    turns = [{"role": "system", "content": system}] if system else []
    for i, kind in enumerate(kinds):
        question, short, _ = questions[kind]
        user = rng.choice(FIRST_TURNS).format(story=story.text(), question=question) if i == 0 else question
        reply = short if style == "short" else f"The answer is {short[:1].lower()}{short[1:]}"
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return Chat(turns, kinds)


def draw_chats(rng: random.Random, count: int, heldout: bool, reserved: set, pretrain_texts: list[str]) -> list[Chat]:
    """Training chats: stories that tie nobody to a reserved word. Held-out chats: stories, none a pretraining
    text or part of one, and only the questions whose (person, word) pair is reserved. The first question's
    kind cycles through KINDS, so every kind is asked about as often."""
    chats = []
    while len(chats) < count:
        first = KINDS[len(chats) % len(KINDS)]
        turn_count = rng.choice(TURN_COUNTS)
        while True:
            story = draw_story(rng)
            questions = story.questions()
            if heldout:
                kinds = sorted(kind for kind, qa in questions.items() if qa[2] in reserved)
                if first in kinds and not any(story.text() in text for text in pretrain_texts):
                    break
            elif first in questions and not story.bindings() & reserved:
                kinds = sorted(questions)
                break
        others = [kind for kind in kinds if kind != first]
        chats.append(draw_chat(rng, story, [first] + rng.sample(others, min(turn_count - 1, len(others)))))
    return chats


def corpus(seed: int = SEED, train: int = TRAIN_CONVERSATIONS, heldout: int = HELDOUT_CONVERSATIONS):
    """(training chats, held-out chats). Each split has its own generator, so the held-out split does not move
    when the training split grows."""
    reserved = reserved_pairs(random.Random(seed))
    pretrain_texts = PRETRAIN.texts()
    return (draw_chats(random.Random(seed + 1), train, False, reserved, pretrain_texts),
            draw_chats(random.Random(seed + 2), heldout, True, reserved, pretrain_texts))


def normalize_answer(text: str) -> str:
    """Lower case, punctuation dropped, spacing collapsed: "A blue book." and "a blue  book" are the same."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


LEADING = re.compile(r"^(?:a|an|the|to the|in the) ")


def answer_matches(prediction: str, reference: str) -> bool:
    """Exactly right: equal to the reference after ``normalize_answer``, or the reference's key word (its last
    word, or for a sentence the story's word it names) alone, after at most one "a", "an", "the", "to the" or
    "in the" (and "The answer is" before them when the reference begins so). So "To the beach." and "the beach"
    match "To the beach."; "The answer is beach" matches "The answer is to the beach."; "The beach or the park"
    and "The answer is to the park." match neither."""
    guess, gold = normalize_answer(prediction), normalize_answer(reference)
    if guess == gold:
        return True
    if gold.startswith(PREFIX):
        if not guess.startswith(PREFIX):
            return False
        guess, gold = guess[len(PREFIX):], gold[len(PREFIX):]
    words = gold.split()
    return bool(words) and LEADING.sub("", guess) == words[-1]


PREFIX = "the answer is "


def exact_match_score(predictions: list[str], references: list[str]) -> float:
    """The share of predictions that match their reference exactly (``answer_matches``)."""
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
