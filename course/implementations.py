"""Where implementations live and how to load one: the student's ``impl/``, the reference, or any
directory laid out like ``impl/`` (a submission). Labs, the stage assembly, the grader and the tests
all load through here.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
STUDENT_DIR = REPO_ROOT / "impl"
REFERENCE_DIR = REPO_ROOT / "course" / "reference"
IMPL_CHOICES = ("student", "reference")


def impl_root(impl: str = "student", impl_dir: Optional[str] = None) -> Path:
    """The directory of ``impl`` ("student" or "reference"), or ``impl_dir`` when given."""
    if impl_dir is not None:
        root = Path(impl_dir).expanduser().resolve()
        if not root.is_dir():
            raise ValueError(f"--impl-dir {str(impl_dir)!r} is not a directory")
        return root
    if impl not in IMPL_CHOICES:
        raise ValueError(f"impl must be one of {IMPL_CHOICES}, got {impl!r}")
    return STUDENT_DIR if impl == "student" else REFERENCE_DIR


def add_impl_arguments(parser: argparse.ArgumentParser, files: str, default: str = "student") -> None:
    """``--impl student|reference`` and ``--impl-dir DIR``: the choice every command-line trainer passes
    to ``load_implementation``; ``files`` names the files it loads."""
    whose = "yours, in impl/" if default == "student" else "the reference"
    parser.add_argument("--impl", choices=IMPL_CHOICES, default=default,
                        help=f"whose {files} to run (default: {whose})")
    parser.add_argument("--impl-dir", "--impl_dir", dest="impl_dir", default=None, metavar="DIR",
                        help=f"run a submission laid out like impl/ (its {files}) instead")


def load_module(path: Path, label: str) -> ModuleType:
    """Import a file under a unique name so student, reference and mutants never collide."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (an implementation directory needs it)")
    name = f"_course_impl_{label}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def module_from_source(source: str, label: str, filename: str) -> ModuleType:
    """Build a module from source text (a mistake catalogue's mutant of the reference)."""
    module = ModuleType(f"_course_mutant_{label}")
    module.__file__ = filename
    sys.modules[module.__name__] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def load_implementation(module_file: str, impl: str = "student", impl_dir: Optional[str] = None) -> ModuleType:
    """``module_file`` (e.g. "train_loop.py") of the student's impl/, the reference or ``impl_dir``."""
    root = impl_root(impl, impl_dir)
    return load_module(root / module_file, impl if impl_dir is None else "dir")
