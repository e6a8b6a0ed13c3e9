"""The mutation analysis (``python -m course mutants NN``): its rules make the mutants they promise, leave
message text alone, and its verdicts can go both ways (a check set that misses a rule lets mutants survive).
The full analysis is an instructor command (minutes per lesson), not a test."""
from __future__ import annotations

import dataclasses
import functools

import pytest

from course.checks import LESSONS, get_lesson
from course.checks.mutants import analyse, exercises_reaching, mutants, score_line

SAMPLE = '''
def sample(values, limit):
    """Docstring: 1 < 2 is never mutated."""
    if limit <= 0:
        raise ValueError(f"limit must be > 0, got {limit - 1}")
    total = 0
    total += values[0] * 2
    flag = not values and limit > 3
    try:
        handle(values, limit)
    except Exception:
        pass
    if flag:
        return total
    return total // limit
'''


def rules_at(source: str) -> set[tuple[int, str]]:
    return {(m.line, m.rule) for m in mutants(source)}


@functools.lru_cache(maxsize=None)
def should_step_analysis() -> tuple:
    """Lesson 14's checks on the mutants of should_step_optimizer (analysed once, read by two tests)."""
    return tuple(analyse(get_lesson("14"), "should_step_optimizer"))


def test_every_rule_makes_its_mutant():
    found = rules_at(SAMPLE)
    expected = {
        (4, "compare <= -> <"), (4, "constant 0 -> 1"), (4, "constant 0 -> -1"),
        (6, "constant 0 -> 1"), (7, "arithmetic * -> /"), (7, "constant 2 -> 3"),
        (8, "boolean and -> or"), (8, "boolean: not x -> x"), (8, "compare > -> >="),
        (10, "call: first two arguments swapped"), (11, "except Exception -> ValueError"),
        (13, "condition negated"), (15, "arithmetic // -> /"),
        (6, "statement removed (Assign)"), (6, "statements swapped with the next one"), (5, "statement removed (Raise)"),
    }
    missing = sorted(expected - found)
    assert not missing, f"rules that made no mutant: {missing}\nACTUAL: {sorted(found)}"


def test_messages_and_docstrings_are_left_alone():
    lines = {line for line, _ in rules_at(SAMPLE)}
    assert 3 not in lines, "the docstring was mutated"
    assert not any(line == 5 and not rule.startswith("statement") for line, rule in rules_at(SAMPLE)), \
        "the text of a raised error was mutated"


def test_each_mutant_differs_from_the_reference_in_one_function():
    source = get_lesson("14").files()["reference"].read_text(encoding="utf-8")
    found = mutants(source, "should_step_optimizer")
    assert found and all(m.function == "should_step_optimizer" for m in found), [m.key for m in found]
    assert all(m.source != source for m in found)
    assert len({m.key for m in found}) == len(found), "mutant keys must be unique"


def test_verdicts_go_both_ways():
    """The lesson's checks kill every mutant of should_step_optimizer; graded by the cosine_lr checks alone
    (blind to it) they survive."""
    lesson = get_lesson("14")
    killed = should_step_analysis()
    assert killed and all(r.killed_by for r in killed), [r.mutant.key for r in killed if not r.killed_by]
    blind = dataclasses.replace(lesson, checks=[c for c in lesson.checks if c.exercise == "cosine_lr"],
                                mistakes=(), equivalents=())
    survived = analyse(blind, "should_step_optimizer")
    assert [r.mutant.key for r in survived] == [r.mutant.key for r in killed]
    assert not any(r.killed_by for r in survived), [r.killed_by for r in survived]
    tiers = [sum(r.mutant.tier == tier for r in survived) for tier in ("core", "hardening")]
    assert [f"{n} survived" in line for n, line in zip(tiers, score_line("14", survived, {}).splitlines())] == \
        [True, True], score_line("14", survived, {})


@pytest.mark.parametrize("lesson", sorted(LESSONS.values(), key=lambda l: l.lesson_id), ids=lambda l: l.lesson_id)
def test_listed_equivalent_mutants_exist(lesson):
    """Every key in a lesson's equivalent-mutant list names a mutant the rules still make (no stale entry)."""
    source = lesson.files()["reference"].read_text(encoding="utf-8")
    functions = {key.split("#")[0] for key in lesson.equivalent_mutants}
    keys = {m.key for function in functions for m in mutants(source, function)}
    stale = sorted(set(lesson.equivalent_mutants) - keys)
    assert not stale, f"lesson {lesson.lesson_id}: equivalent mutants that no longer exist: {stale}"
    assert all(reason.strip() for reason in lesson.equivalent_mutants.values()), "each needs a one-line reason"


def test_command_prints_the_score_and_refuses_an_unknown_function(capsys):
    from course.cli import main
    assert main(["mutants", "14", "--function", "scale_loss_for_accumulation"]) == 0
    out = capsys.readouterr().out
    assert "survived: score 100.0 %" in out and "0 survived" in out, out
    assert main(["mutants", "14", "--function", "no_such_function"]) == 2
    err = capsys.readouterr().err
    assert "--function must be a function or class of train_loop.py" in err and "cosine_lr" in err, err


def test_exercises_reaching_follows_callers_uses_and_code_outside_definitions():
    """What the equivalent forms are graded on (tests/test_mistakes.py): a helper reaches the exercises that call
    it through other helpers, and the exercises whose checks use those (lesson 16's TrainingSession checks use
    count_loss_units); named outside any definition, every exercise."""
    lesson = get_lesson("16")
    source = ("def _inner():\n    pass\n\n\ndef _outer():\n    return _inner()\n\n\n"
              "def count_loss_units(labels):\n    return _outer()\n\n\ndef unrelated():\n    pass\n")
    assert exercises_reaching(lesson, source, "_inner") == ["TrainingSession", "count_loss_units"]
    assert exercises_reaching(lesson, source, "unrelated") == []
    everything = sorted(e.name for e in lesson.exercises)
    assert exercises_reaching(lesson, source + "\nTABLE = (_outer,)\n", "_inner") == everything


def test_mutants_in_argument_rules_are_the_hardening_tier():
    """should_step_optimizer's guard clauses (an if that only raises) and its call of a ``_validate*`` helper make
    HARDENING mutants, its return line CORE ones. Graded without the hardening checks, every core mutant is still killed (by the core checks alone) and
    some hardening ones survive; a core mutant that only a hardening check fails is not killed."""
    lesson = get_lesson("14")
    results = list(should_step_analysis())
    tiers = {r.mutant.tier for r in results}
    assert tiers == {"core", "hardening"}, tiers
    rule_lines = [r for r in results if r.mutant.original_line.startswith(("raise", "if ", "_validate"))]
    assert any(r.mutant.original_line.startswith("_validate") for r in rule_lines), [r.mutant.key for r in results]
    assert all(r.mutant.tier == "hardening" for r in rule_lines), [(r.mutant.key, r.mutant.tier) for r in results]
    core_only = dataclasses.replace(lesson, checks=[c for c in lesson.checks if c.tier == "core"],
                                    mistakes=(), equivalents=())
    graded = analyse(core_only, "should_step_optimizer")
    assert all(r.killed for r in graded if r.mutant.tier == "core"), [r.mutant.key for r in graded if not r.killed]
    assert not all(r.killed for r in graded if r.mutant.tier == "hardening"), "the core checks test no argument rule"
    core = next(r for r in graded if r.mutant.tier == "core")
    assert not dataclasses.replace(core, killed_in="hardening").killed, "a hardening check cannot kill a core mutant"
    lines = score_line("14", results, {}).splitlines()
    assert [line.split(":")[0] for line in lines] == ["lesson 14 core", "lesson 14 hardening"], lines
