"""``python -m course new-lesson NN slug``: write the skeleton of every file a lesson needs.

The files are the ones ``Lesson.files()`` lists (lesson texts en + zh with their answers and notes, stub, reference, the package
``course/checks/lessonNN/`` with its descriptor, checks and mistakes, test, notebook), except the notebooks
``python -m course release`` generates. Every place the author still has to fill holds ``AUTHOR_TODO``; the completeness
test (tests/test_lessons_complete.py) fails until none is left, the lesson has a catalogued mistake
and the README's syllabus table has its row. README "Adding a lesson" lists the steps.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .implementations import REPO_ROOT
from .layout import lesson_files

AUTHOR_TODO = "TODO(author)"
SLUG = re.compile(r"^[a-z][a-z0-9_]*$")

DESCRIPTOR = '''"""Lesson {id}: {title} - the descriptor.

The checks live beside it in ``checks``, the mistake catalogue in ``mistakes``, the mutants no check can fail
in ``equivalent_mutants``.
"""
from __future__ import annotations

from ..framework import Exercise, Lesson, checks_in
from . import checks, equivalent_mutants, hints, mistakes

LESSON = Lesson(
    lesson_id="{id}",
    slug="{slug}",
    title="{title}",
    module="{module}",
    exercises=[
        Exercise("first_exercise", "{id} §1.1", points=1, hidden_points=1),
    ],
    # what the lesson teaches, one line each: every core check grades one (argument rules and conventions are
    # checks without an objective, the hardening tier: graded by check --all, 0 points)
    objectives={{
        "first_objective": "{todo}: the behaviour the lesson teaches, in one line",
    }},
    checks=checks_in(checks),
    mistakes=mistakes.MISTAKES,
    equivalents=mistakes.EQUIVALENTS,
    equivalent_mutants=equivalent_mutants.EQUIVALENT_MUTANTS,
    hints=hints.HINTS,
    labs=(),
    notebook_mistake="{todo}: a catalogued mistake that only a hidden check catches",
)
'''

CHECKS = '''"""Lesson {id} checks: {todo}: what they prove, and why their tolerances let equivalent code pass."""
from __future__ import annotations

from ..framework import check


@check("first_exercise", objective="first_objective")
def first_exercise_matches_the_oracle(impl):
    """{todo}: what this check proves, in one sentence (it is the grade cell's comment too)."""
    # {todo}: call impl.first_exercise on cases whose answers come from the oracle (course/minimind/)
    # and compare with framework's expect_equal / expect_close / expect_tensor_close (ACTUAL vs EXPECTED).
    raise NotImplementedError("{todo}: write the check")


@check("first_exercise", objective="first_objective", hidden=True)
def first_exercise_hidden_rule(impl):
    """{todo}: an objective's case graded only when a notebook is graded (an edge case)."""
    raise NotImplementedError("{todo}: write the hidden check")
'''

MISTAKES = '''"""Lesson {id}'s mistake catalogue: each wrong variant of a reference function FAILS the check named; each
equivalent PASSES every check (tests/test_mistakes.py proves both)."""
from __future__ import annotations

# {todo}: for every rule a check states, a small edit inside one function of the reference, e.g.
#     from ..catalogue import equivalent, mistake
#     from .checks import first_exercise_matches_the_oracle
#     MISTAKES = [
#         mistake("short_name", "what it gets wrong", "first_exercise", "old snippet", "new snippet",
#                 first_exercise_matches_the_oracle),
#     ]
#     EQUIVALENTS = [equivalent("short_name", "why it is the same", "first_exercise", "old", "new")]
MISTAKES = []
EQUIVALENTS = []
'''

STUB = '''"""Lesson {id} exercises: {title}.

Read {text_en} (Chinese: {text_zh}), replace each
``raise NotImplementedError`` with your code, then run ``python -m course check {id}``.
"""
from __future__ import annotations


def first_exercise(x):
    """TODO (lesson {id} §1.1): {todo} - what to write, its formula, and every convention the checks grade."""
    raise NotImplementedError("first_exercise: TODO - see lesson {id} §1.1")
'''

REFERENCE = '''"""Lesson {id} reference solutions: {title}."""
from __future__ import annotations


def first_exercise(x):
    """The reference solution of lesson {id} §1.1."""
    raise NotImplementedError("{todo}: the reference solution")
'''

TEST = '''"""Lesson {id}: what the checks cannot show (every check already runs for the student and the reference
in tests/test_lesson_checks.py): the oracle pieces this lesson adds, its labs, its stage assembly."""
from __future__ import annotations

from course.checks import get_lesson

LESSON = get_lesson("{id}")


def test_lesson{id}_beyond_the_checks():
    """{todo}: a test that can fail, e.g. the oracle against upstream numbers, or a lab's output."""
    raise NotImplementedError("{todo}: write the lesson's own tests")
'''

NOTEBOOK = '''# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson {id} — {title}
#
# The explanations live in `{text_en}` (Chinese: `{text_zh}`).
# Write your code where it says `# YOUR CODE HERE`, run the cell, then the test cell under it: it
# calls the checks `python -m course check {id}` runs. {todo}: what this notebook adds (experiments, figures).

# %% nbgrader={{"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}}
import torch

from course.checks.notebook import run_checks

torch.set_num_threads(1)

# %% [markdown]
# ## Exercise 1 — `first_exercise` (lesson {id} §1.1)

# %%
# exercise: first_exercise
'''

TEXT_EN = '''# Lesson {id}: {title}

{todo}: the one question this lesson answers.

Chinese version: [zh/{name}.md](zh/{name}.md).

## 1. Exercises

### 1.1 `first_exercise`

{todo}: the contract, the oracle function it aligns with, and what to predict before running the check.

After you have written yours: `python -m course answer {id} 1.1`. Engineering detail: [notes](notes/{name}.md).

## 2. Commands

```bash
python -m course check {id} --impl reference
```
'''

TEXT_ZH = '''# 第 {id} 课：{title}

{todo}：本课回答的那个问题。

英文版：[../{name}.md](../{name}.md)。

## 1. 练习

### 1.1 `first_exercise`

{todo}：约定、对齐的 oracle 函数、运行检查之前要先预测什么。

写完你自己的版本之后：`python -m course answer {id} 1.1`。工程细节：[说明](notes/{name}.md)。

## 2. 命令

```bash
python -m course check {id} --impl reference
```
'''

ANSWERS_EN = '''# Lesson {id} answers: {title}

Read a section after you have written your own answer: `python -m course answer {id} SECTION` prints one.

Chinese version: [../zh/answers/{name}.md](../zh/answers/{name}.md).

## 1.1 `first_exercise`

{todo}: the question of lesson §1.1 in one line, then its answer and the reasoning.
'''

ANSWERS_ZH = '''# 第 {id} 课答案：{title}

写完你自己的答案之后再读：`python -m course answer {id} 节号` 打印其中一节。

英文版：[../../answers/{name}.md](../../answers/{name}.md)。

## 1.1 `first_exercise`

{todo}：用一行复述第 1.1 节的问题，然后是答案和推理。
'''

NOTES_EN = '''# Lesson {id} notes: {title}

Engineering detail for maintainers and curious students: tolerances, measurements, internals.

Chinese version: [../zh/notes/{name}.md](../zh/notes/{name}.md).

<a id="l{id}-notes-checks"></a>
## 1. What the checks compare

{todo}: each check's tolerance and why an equivalent solution passes it.
'''

NOTES_ZH = '''# 第 {id} 课说明：{title}

给维护者和好奇的学生的工程细节：容差、测量、内部实现。

英文版：[../../notes/{name}.md](../../notes/{name}.md)。

<a id="l{id}-notes-checks"></a>
## 1. 检查比较什么

{todo}：每项检查的容差，以及等价的解法为什么能通过。
'''


EQUIVALENT_MUTANTS = '''"""Mutants of the lesson-{id} reference that no check can fail, each with why. ``python -m course mutants {id}``
lists every other survivor: a gap that a new check (and a catalogued mistake) closes."""

EQUIVALENT_MUTANTS: dict[str, str] = {{
    # "first_exercise#1: statement removed (Expr)": "why no observable behaviour changes",
}}
'''


HINTS = '''"""Lesson {id}'s hint ladder (``python -m course hint {id} EXERCISE``; the notebook names the command)."""

HINTS: dict[str, tuple[str, ...]] = {{
    "first_exercise": (
        "{todo}: the idea, without the answer",
        "{todo}: where to look in the oracle (course/minimind/...)",
        "{todo}: the rule the checks grade",
        "{todo}: a near-solution",
    ),
}}
'''


# The template of each role of ``Lesson.files()`` a new lesson starts from: all but the generated notebooks
# (layout.GENERATED_FILES); tests/test_lessons_complete.py counts them.
TEMPLATES = {
    "lesson text (en)": TEXT_EN,
    "lesson text (zh)": TEXT_ZH,
    "answers (en)": ANSWERS_EN,
    "answers (zh)": ANSWERS_ZH,
    "notes (en)": NOTES_EN,
    "notes (zh)": NOTES_ZH,
    "stub": STUB,
    "reference": REFERENCE,
    "descriptor": DESCRIPTOR,
    "checks": CHECKS,
    "mistakes": MISTAKES,
    "equivalent mutants": EQUIVALENT_MUTANTS,
    "hints": HINTS,
    "test": TEST,
    "notebook": NOTEBOOK,
}


def new_lesson(lesson_id: str, slug: str, *, title: Optional[str] = None, module: Optional[str] = None,
               root: Optional[Path] = None) -> list[Path]:
    """Write the skeleton; refuses (before writing anything) bad names or a file that already exists."""
    if not re.fullmatch(r"[1-9][0-9]*", lesson_id):
        raise ValueError(f"lesson must be a positive whole number like 17, got {lesson_id!r}")
    module = module or slug
    for argument, value in (("slug", slug), ("module", module)):
        if not SLUG.match(value):
            raise ValueError(f"{argument} must be snake_case ([a-z][a-z0-9_]*), got {value!r}")
    title = title or slug.replace("_", " ").capitalize()
    if any(c in title for c in '"\\\n'):
        raise ValueError(f"title must be one line without quotes or backslashes, got {title!r}")
    root = Path(root) if root is not None else REPO_ROOT
    paths = {role: path.relative_to(REPO_ROOT) for role, path in lesson_files(lesson_id, slug, module).items()}
    files = {root / paths[role]: template for role, template in TEMPLATES.items()}
    existing = [str(p) for p in files if p.exists()]
    if existing:
        raise FileExistsError(f"lesson {lesson_id} would overwrite {existing}")
    values = dict(id=lesson_id, slug=slug, title=title, module=module, name=f"{lesson_id}_{slug}", todo=AUTHOR_TODO,
                  text_en=paths["lesson text (en)"].as_posix(), text_zh=paths["lesson text (zh)"].as_posix())
    for path, template in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**values), encoding="utf-8")
    return list(files)
