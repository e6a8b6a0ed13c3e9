"""The Chinese texts are translated, not copied: math labels, headings, the link to the English text
and the diagrams of each ``course/lessons/zh/NN_*.md`` (and of its answers and notes, ``zh/answers/``,
``zh/notes/``) are Chinese.

Rules (each proven able to fail by ``test_the_rules_flag_an_untranslated_twin``):

* math: a ``\\text{...}`` holding an English word (two or more ASCII letters) must also hold Chinese.
  Sub- and superscript labels (``B_{\\text{eff}}``) are symbol names shared with the English text,
  and identifiers belong in ``\\texttt{...}``, so both are allowed;
* header and headings: the twin links the English text as ``英文版：[...](../NN_*.md)`` (answers and notes:
  ``../../answers/NN_*.md``, ``../../notes/NN_*.md``), and a heading
  with an English word outside code spans and math must also hold Chinese;
* diagrams: a ```text block copied verbatim from the English twin must be program output. Output is
  recognised by its words: at least two thirds of its English phrases (two or more words; quoted
  strings, such as generated text, left out) occur in the repository's Python code, which prints them.
  A diagram, table or worked example written for the lesson has phrases no program prints.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "course" / "lessons"
CHINESE = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
ENGLISH_WORD = re.compile(r"[A-Za-z]{2,}")
TEXT_COMMAND = re.compile(r"(?<![_^])(?<![_^]\{)\\text\{([^{}]*)\}")
PHRASE = re.compile(r"(?<![\w.\-/'\"])[A-Za-z][A-Za-z'-]*(?: [A-Za-z][A-Za-z'-]*)+(?![\w/])")
QUOTED = re.compile(r"(?<!\w)'[^']*'(?!\w)|\"[^\"]*\"")
OUTPUT_SHARE = 2 / 3


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block, in order."""
    blocks, info, body = [], None, []
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if info is None:
                info, body = line.strip()[3:], []
            else:
                blocks.append((info, "\n".join(body)))
                info = None
            continue
        if info is not None:
            body.append(line)
    return blocks


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced blocks."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
        elif not inside:
            lines.append(line)
    return lines


@lru_cache(maxsize=1)
def python_sources() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for folder in ("course", "labs", "impl")
                     for path in sorted((ROOT / folder).rglob("*.py")))


def untranslated_text_commands(zh: str) -> list[str]:
    return [m.group(0) for m in TEXT_COMMAND.finditer(zh)
            if ENGLISH_WORD.search(m.group(1)) and not CHINESE.search(m.group(1))]


def untranslated_headings(zh: str, english_link: str) -> list[str]:
    """``english_link``: the English text's path relative to the twin (``../NN_slug.md`` for a lesson)."""
    problems = [line for line in prose_lines(zh) if line.startswith("English version")]
    if f"英文版：[{english_link}]({english_link})" not in zh:
        problems.append(f"no line linking the English text as 英文版：[{english_link}]({english_link})")
    for line in prose_lines(zh):
        if re.match(r"#{1,6} ", line):
            words = re.sub(r"`[^`]*`|\$[^$]*\$", "", line)
            if ENGLISH_WORD.search(words) and not CHINESE.search(words):
                problems.append(line)
    return problems


def copied_non_output_blocks(zh: str, en: str) -> list[str]:
    """```text blocks of ``zh`` equal to one of ``en`` whose English phrases mostly appear in no code."""
    english_blocks = {body for info, body in fenced_blocks(en) if info == "text"}
    copied = []
    for info, body in fenced_blocks(zh):
        if info != "text" or body not in english_blocks:
            continue
        phrases = PHRASE.findall(QUOTED.sub("", body))
        printed = [p for p in phrases if p in python_sources()]
        if phrases and len(printed) < OUTPUT_SHARE * len(phrases):
            missing = sorted(set(phrases) - set(printed))
            copied.append(f"{body.splitlines()[0][:70]!r}... (phrases no code prints: {missing[:4]})")
    return copied


# every lesson's three texts: the lesson, its answers and its notes (their twins: zh/, zh/answers/, zh/notes/)
ENGLISH_TEXTS = sorted(LESSONS.glob("*.md")) + sorted(LESSONS.glob("answers/*.md")) + sorted(LESSONS.glob("notes/*.md"))
twins = pytest.mark.parametrize("english", ENGLISH_TEXTS, ids=lambda p: p.relative_to(LESSONS).as_posix())


def twin_of(english: Path) -> Path:
    return LESSONS / "zh" / english.relative_to(LESSONS)


def twin_texts(english: Path) -> tuple[str, str]:
    return twin_of(english).read_text(encoding="utf-8"), english.read_text(encoding="utf-8")


def english_link(english: Path) -> str:
    return Path(os.path.relpath(english, twin_of(english).parent)).as_posix()


@twins
def test_zh_math_labels_are_chinese(english):
    zh, _ = twin_texts(english)
    bad = untranslated_text_commands(zh)
    assert not bad, f"{twin_of(english).relative_to(LESSONS).as_posix()}: \\text{{...}} in English (translate it, or use \\texttt for an identifier): {bad}"


@twins
def test_zh_header_and_headings_are_chinese(english):
    zh, _ = twin_texts(english)
    bad = untranslated_headings(zh, english_link(english))
    assert not bad, f"{twin_of(english).relative_to(LESSONS).as_posix()}: untranslated header or headings: {bad}"


@twins
def test_zh_text_blocks_copied_from_english_are_program_output(english):
    zh, en = twin_texts(english)
    bad = copied_non_output_blocks(zh, en)
    assert not bad, f"{twin_of(english).relative_to(LESSONS).as_posix()}: diagrams or tables copied from the English text, translate them: {bad}"


# Excerpts of lesson 16's Chinese twin before it was translated (its header, math block, worked
# example and protocol diagram were the English ones).
OLD_ZH_16 = """# 第 16 课：按 token 加权的梯度累积

English version: [../16_token_weighted_training_session.md](../16_token_weighted_training_session.md).

## 4. Exercises

```text
global-batch loss      L      = (sum_k S_k) / N
lesson 14 (naive)      L_naive = (1/K) * sum_k (S_k / n_k)
```

```text
micro-batch A: 3 valid tokens, NLL 1, 2, 3  -> S_A = 6, mean 2
naive loss / K:  (2 + 4) / 2              = 3.0   (B's single token counts as much as A's three)
```

```text
run driver (course/protocol/driver.py)           TrainingSession (your exercise)
take global_batch_size shuffled samples
split into micro-batches                    ->  train_step(batch, options, step_fn) per micro-batch:
```

$$ B_{\\text{eff}} = B \\cdot K \\quad \\text{(one process)} $$
"""


def test_the_rules_flag_an_untranslated_twin():
    name = "16_token_weighted_training_session.md"
    english = "\n\n".join(f"```text\n{body}\n```" for info, body in fenced_blocks(OLD_ZH_16) if info == "text")
    assert untranslated_text_commands(OLD_ZH_16) == ["\\text{(one process)}"]
    headings = untranslated_headings(OLD_ZH_16, f"../{name}")
    assert len(headings) == 3 and headings[0].startswith("English version") and headings[2] == "## 4. Exercises", headings
    assert len(copied_non_output_blocks(OLD_ZH_16, english)) == 3, copied_non_output_blocks(OLD_ZH_16, english)
    translated = OLD_ZH_16.replace("English version: [", "英文版：[").replace("Exercises", "练习")
    assert untranslated_headings(translated, f"../{name}") == []
