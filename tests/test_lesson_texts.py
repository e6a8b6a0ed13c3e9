"""A lesson is read in one sitting and answered before its answer is read: three texts per lesson, each in its own
place (README "Student workflow"). The lesson asks (no answer block, no solution expression, within its word
limit), the answers text answers under the lesson's section numbers (``python -m course answer NN SECTION``), the
notes hold the engineering detail; the Chinese twins have the same sections; every section the code cites exists.
"""
from __future__ import annotations

import re

import pytest

from course import cli
from course.checks import LESSONS
from course.implementations import REFERENCE_DIR, REPO_ROOT
from course.lesson_texts import section_numbers, section_text, untouched
from stub_copies import untouched_impl

LESSON_LIST = [lesson for _, lesson in sorted(LESSONS.items())]
by_id = pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)
KINDS = ("lesson text", "answers", "notes")
# wc -w of the English lesson text, code blocks included: about 40 minutes of reading (lesson 14: its six exercises)
WORD_LIMITS = {"14": 8000}
DEFAULT_WORD_LIMIT = 6000
ANSWER_BLOCK = re.compile(r"<details>|Answer \(open it|答案（写完")


@by_id
def test_the_lesson_texts_hold_no_answer_block(lesson):
    files = lesson.files()
    found = {language: ANSWER_BLOCK.findall(files[f"lesson text ({language})"].read_text(encoding="utf-8"))
             for language in ("en", "zh")}
    assert not any(found.values()), (f"lesson {lesson.lesson_id}: answer blocks stand in the lesson text {found}; "
                                     f"move each answer to {cli.relative(files['answers (en)'])} (and its zh twin)")


@by_id
def test_the_lesson_is_within_its_word_limit(lesson):
    limit = WORD_LIMITS.get(lesson.lesson_id, DEFAULT_WORD_LIMIT)
    words = len(lesson.files()["lesson text (en)"].read_text(encoding="utf-8").split())
    assert words <= limit, (f"lesson {lesson.lesson_id}: ACTUAL {words} words, EXPECTED at most {limit}: engineering "
                            f"detail belongs in the notes, answers in the answers text")


@by_id
def test_every_answer_is_numbered_like_the_lesson_section_that_asks(lesson):
    files = lesson.files()
    asked = set(section_numbers(files["lesson text (en)"]))
    answered = section_numbers(files["answers (en)"])
    assert answered, f"{cli.relative(files['answers (en)'])} has no numbered section"
    stray = [number for number in answered if number not in asked]
    assert not stray, f"answers numbered like no section of the lesson: {stray} (lesson sections: {sorted(asked)})"
    unanswered = [e.name for e in lesson.exercises if e.section_number not in answered]
    assert not unanswered, f"lesson {lesson.lesson_id}: no answer section for the exercises {unanswered}"


@by_id
@pytest.mark.parametrize("kind", KINDS)
def test_the_chinese_twin_has_the_same_sections(lesson, kind):
    files = lesson.files()
    english, chinese = section_numbers(files[f"{kind} (en)"]), section_numbers(files[f"{kind} (zh)"])
    assert chinese == english, (f"{cli.relative(files[f'{kind} (zh)'])}: sections differ from the English\n"
                                f"  ACTUAL (zh): {chinese}\n  EXPECTED (en): {english}")


def test_answer_prints_one_section_and_notes_an_untouched_stub(tmp_path, capsys):
    lesson = LESSONS["14"]
    expected = section_text(lesson.files()["answers (en)"], "5.4")
    untouched_dir = untouched_impl(tmp_path / "impl")
    assert untouched(untouched_dir / lesson.module_file, "should_flush_tail")
    assert cli.main(["answer", "14", "5.4", "--impl-dir", str(untouched_dir)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("note: should_flush_tail") and printed.endswith(expected), printed[:500]
    assert cli.main(["answer", "14", "5.4", "--impl-dir", str(REFERENCE_DIR)]) == 0
    assert capsys.readouterr().out == expected, "a written should_flush_tail gets the answer without the note"
    assert not untouched(REFERENCE_DIR / lesson.module_file, "should_flush_tail")


def test_answer_refuses_a_section_without_answer(capsys):
    assert cli.main(["answer", "14", "99.9"]) == 2
    error = capsys.readouterr().err
    assert "no answer numbered '99.9'" in error and "5.4" in error, error


def test_section_text_stops_at_the_next_heading_of_its_level(tmp_path):
    text = tmp_path / "answers.md"
    text.write_text("# Title\n\n## 5.4 first\n\nbody\n\n### 5.4.1 part\n\nmore\n\n```bash\n# 6 not a heading\n```\n"
                    "\n<a id=\"x\"></a>\n## 5.5 second\n\nother\n", encoding="utf-8")
    assert section_numbers(text) == ["5.4", "5.4.1", "5.5"]
    assert section_text(text, "5.4") == "## 5.4 first\n\nbody\n\n### 5.4.1 part\n\nmore\n\n```bash\n# 6 not a heading\n```\n"
    assert section_text(text, "5.5") == "## 5.5 second\n\nother\n" and section_text(text, "5") is None


def test_untouched_sees_any_written_line(tmp_path):
    stub = tmp_path / "stub.py"
    stub.write_text('def f(x):\n    """Doc."""\n    raise NotImplementedError("f: TODO")\n\n'
                    'class C:\n    def a(self):\n        raise NotImplementedError\n\n    def b(self):\n        return 1\n',
                    encoding="utf-8")
    assert untouched(stub, "f") and not untouched(stub, "C") and not untouched(stub, "missing")


# --- every section the code cites exists --------------------------------------------------------------------------

CITATION = re.compile(r"\b(?:lesson )?(1[4-9]|[2-9][0-9]) (?:(answers|notes) )?§(\d+(?:\.\d+)*)")
CITING_FOLDERS = ("course", "impl", "labs", "tests", "notebooks/lessons")


def citations() -> list[tuple[str, str, str, str]]:
    """(file, lesson id, text kind, section) of every ``lesson NN §X.Y`` / ``NN answers §X`` / ``NN notes §K`` in
    the code."""
    found = []
    for folder in CITING_FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for match in CITATION.finditer(path.read_text(encoding="utf-8")):
                kind = {"answers": "answers", "notes": "notes"}.get(match.group(2), "lesson text")
                found.append((path.relative_to(REPO_ROOT).as_posix(), match.group(1), kind, match.group(3)))
    return found


def test_the_code_cites_sections():
    assert len(citations()) > 50, citations()


def test_every_cited_section_exists():
    missing = sorted({(source, f"lesson {lesson_id} {kind} §{number}") for source, lesson_id, kind, number in citations()
                      if lesson_id in LESSONS   # lesson 90 is the scaffold test's
                      and number not in section_numbers(LESSONS[lesson_id].files()[f"{kind} (en)"])})
    assert not missing, "sections cited in the code that no text has:\n" + "\n".join(f"  {s}: {c}" for s, c in missing)


# --- no solution expression in a lesson text ----------------------------------------------------------------------

# What an exercise asks the student to derive, as the old texts printed it (each pattern matched them: see
# OLD_GIVEAWAYS). The principle may state a consequence; the expression to copy stands only in the answers.
SOLUTION_EXPRESSIONS = {
    "14": [r"\\bmod K\s*(=|\\neq|\\ne)\s*0", r"%\s*(K|accumulation_steps)\s*(==|!=)\s*0", r"0\.45",
           r"enabled\s*=\s*False"],
    "15": [r"\\lfloor\s*\\texttt\{step\}", r"\(epoch \+ 1, 0\)"],
    "16": [r"backpropagates\s+\$?S_k\s*/\s*N", r"Backpropagate \$S_k / N"],
    "17": [r"load_state_dict\(state_dict\)\` copies", r"Once the file is proven"],
}
OLD_GIVEAWAYS = {   # excerpts of the texts before they were split (main 45162bb)
    "14": r"$$\text{step now} \iff s \bmod K = 0$$ ... if step % accumulation_steps == 0: ... "
          r"\eta_0 \left( 0.1 + 0.45 ... torch.amp.GradScaler(torch.device(device).type, enabled=False)",
    "15": r"$$ \texttt{step}_c = \lfloor \texttt{step}_s \cdot W_s / W_c \rfloor. $$ ... resumes at `(epoch + 1, 0)`",
    "16": r"2. micro-batch k backpropagates S_k / N ... ### 1.2 Backpropagate $S_k / N$",
    "17": r"Once the file is proven, `load_state_dict(state_dict)` copies each value into the model's",
}


def solution_expressions_in(lesson_id: str, text: str) -> list[str]:
    return [pattern for pattern in SOLUTION_EXPRESSIONS.get(lesson_id, []) if re.search(pattern, text)]


@by_id
def test_the_lesson_texts_hold_no_solution_expression(lesson):
    for language in ("en", "zh"):
        path = lesson.files()[f"lesson text ({language})"]
        found = solution_expressions_in(lesson.lesson_id, path.read_text(encoding="utf-8"))
        assert not found, (f"{cli.relative(path)} prints what its exercises ask to derive (patterns {found}): state "
                           f"the principle and its consequence there, the expression in the answers text")


@pytest.mark.parametrize("lesson_id", sorted(OLD_GIVEAWAYS))
def test_each_solution_pattern_finds_the_old_text(lesson_id):
    assert solution_expressions_in(lesson_id, OLD_GIVEAWAYS[lesson_id]) == SOLUTION_EXPRESSIONS[lesson_id]
