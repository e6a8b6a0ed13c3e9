"""Writes labs/data/sft_stories.jsonl and sft_stories_heldout.jsonl: lesson 17's built-in chat corpus (no download).

Conversations about short stories like those of make_pretrain_stories.py (its names, animals, things, places and
sentence templates), in MiniMind's sft format: one ``{"conversations": [{"role": ..., "content": ...}, ...]}``
per line, roles ``system`` (in about half of them), then ``user`` and ``assistant``. The first user turn holds a
story and a question, later user turns (multi-turn conversations, about half of them) ask more questions about
the same story. Some system messages ask for short answers (as without one), others for answers that begin
with "The answer is", so following the system message is part of being right.

Every question asks for a word that occurs in the story as the only word of its kind: its place ("Where did
Mia go?" -> "To the beach."), its animal ("What animal does Mia have?" -> "A cat."), its thing ("What did Leo
find?" -> "A book."). With a word-level tokenizer (one trained on these corpora: " beach" is one token) a
one-layer model answers them by attending to the right token of the prompt and copying it. Left out on
purpose, because the lesson's one-layer model does not learn them in its time budget (measured): questions
that need two hops (who found the book? every story has two people), answers copied over several tokens, and
answers that are not a copy of a story token ("How did Mia feel?" -> "Happy.": " happy" and "Happy" are
different tokens; 11 % held-out).

The held-out split tests reading, not memory: HELDOUT_NAMES of the twelve people (``heldout_names``) occur
only in held-out conversations, and every held-out story is about two of them. A training conversation never
mentions them, so nothing in the training split ties them to a place, an animal or a thing: a right held-out
answer was read from the story in the prompt. The answers' words all occur in the training split, and no
held-out story occurs, word for word, in the pretraining corpus either (where every story is random, so the
pretrained model cannot know who has which animal).

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
HELDOUT_NAMES = 3  # of the pretraining corpus's 12 people: they occur only in held-out conversations

# (system message, answer style); None: no system message. "prefixed": "The answer is a hat." for "A hat.".
SYSTEMS = [(None, "short"), (None, "short"), (None, "short"), ("Answer briefly.", "short"),
           ("You are a helpful assistant. Give short answers.", "short"),
           ("Begin every answer with 'The answer is'.", "prefixed"),
           ("You are a quiz bot. Start each answer with 'The answer is'.", "prefixed")]
KINDS = ("place", "animal", "thing")
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

    def questions(self) -> dict[str, tuple[str, str]]:
        """kind -> (question, short answer), for the questions its shown sentences answer. Each answer's key
        word is the story's only word of its kind (a story has one place, one animal, one thing)."""
        s = self
        base = s.present[:-1]  # "runs" -> "run": every verb of the pretraining corpus
        a_thing = f"{'an' if s.thing[0] in 'aeiou' else 'a'} {s.thing}"
        a_animal = f"{'an' if s.animal[0] in 'aeiou' else 'a'} {s.animal}"
        by_sentence = {
            0: {"animal": (f"What animal does {s.owner} have?", f"{a_animal.capitalize()}.")},
            1: {"place": (f"Where does the {s.animal} {base}?", f"In the {s.place}.")},
            2: {"place": (f"Where did {s.owner} go?", f"To the {s.place}.")},
            3: {"thing": (f"What did {s.friend} find?", f"{a_thing.capitalize()}.")},
            5: {"thing": (f"What did {s.owner} give to {s.friend}?", f"The {s.thing}.")},
            6: {"place": (f"Where did the {s.animal} sleep?", f"In the {s.place}.")},
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


def heldout_names(seed: int = SEED) -> list[str]:
    """The people only held-out conversations mention (HELDOUT_NAMES of the pretraining corpus's twelve)."""
    return sorted(random.Random(seed).sample(PRETRAIN.NAMES, HELDOUT_NAMES))


def draw_story(rng: random.Random, names: list[str], lengths: tuple[int, int] = STORY_SENTENCES) -> Story:
    owner, friend = rng.sample(names, 2)
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
        question, short = questions[kind]
        user = rng.choice(FIRST_TURNS).format(story=story.text(), question=question) if i == 0 else question
        reply = short if style == "short" else f"The answer is {short[:1].lower()}{short[1:]}"
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return Chat(turns, kinds)


def draw_chats(rng: random.Random, count: int, names: list[str], pretrain_texts: list[str]) -> list[Chat]:
    """``count`` conversations about stories whose two people are among ``names``, none a pretraining text or
    part of one. The first question's kind cycles through KINDS, so every kind is asked about as often."""
    chats = []
    while len(chats) < count:
        first = KINDS[len(chats) % len(KINDS)]
        turn_count = rng.choice(TURN_COUNTS)
        while True:
            story = draw_story(rng, names)
            questions = story.questions()
            if first in questions and not any(story.text() in text for text in pretrain_texts):
                break
        kinds = sorted(questions)
        others = [kind for kind in kinds if kind != first]
        chats.append(draw_chat(rng, story, [first] + rng.sample(others, min(turn_count - 1, len(others)))))
    return chats


def corpus(seed: int = SEED, train: int = TRAIN_CONVERSATIONS, heldout: int = HELDOUT_CONVERSATIONS):
    """(training chats, held-out chats). Each split has its own generator, so the held-out split does not move
    when the training split grows."""
    held = heldout_names(seed)
    pretrain_texts = PRETRAIN.texts()
    return (draw_chats(random.Random(seed + 1), train, [name for name in PRETRAIN.NAMES if name not in held],
                       pretrain_texts),
            draw_chats(random.Random(seed + 2), heldout, held, pretrain_texts))


def normalize_answer(text: str) -> str:
    """Lower case, punctuation dropped, spacing collapsed: "A blue book." and "a blue  book" are the same."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


LEADING = re.compile(r"^(?:a|an|the|to the|in the) ")
PREFIX = "the answer is "


def answer_matches(prediction: str, reference: str) -> bool:
    """Exactly right: equal to the reference after ``normalize_answer``, or the reference's key word (its last
    word: the story's place, animal or thing) alone, after at most one "a", "an", "the", "to the" or "in the"
    (and after "The answer is" when the reference begins so: the system message asked for it). So "To the
    beach." and "the beach" match "To the beach."; "The answer is beach" matches "The answer is to the beach.",
    "To the beach." does not; "The beach or the park" and "To the park." match neither."""
    guess, gold = normalize_answer(prediction), normalize_answer(reference)
    if guess == gold:
        return True
    if gold.startswith(PREFIX):
        if not guess.startswith(PREFIX):
            return False
        guess, gold = guess[len(PREFIX):], gold[len(PREFIX):]
    words = gold.split()
    return bool(words) and LEADING.sub("", guess) == words[-1]



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
