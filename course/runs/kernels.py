"""The CPU kernel families torch can run on this machine, chosen per process by ``ATEN_CPU_CAPABILITY``.

torch picks one family of SIMD kernels when it loads: ``avx512``, ``avx2`` or ``default`` on x86. Each splits
its sums differently, so a float result can differ in its last bits from one family to another, as it does
from one student's CPU to another's. Setting ``ATEN_CPU_CAPABILITY`` to a lower family shows, on one machine,
the rounding of CPUs that lack the higher ones (a family the CPU lacks kills the process: illegal instruction).

    python -m course kernels            # every family this CPU runs, its own (the fastest) last
    python -m course kernels --others   # the families below its own: what .ci/run tests again
"""
from __future__ import annotations

import os
import subprocess
import sys

import torch

X86_FAMILIES = ("default", "avx2", "avx512")   # each CPU that runs one runs the ones before it


def kernel_family() -> str:
    """The family this process's kernels belong to (fixed when torch loaded)."""
    return torch.backends.cpu.get_cpu_capability().lower()


def native_family() -> str:
    """The family torch picks on this CPU when ``ATEN_CPU_CAPABILITY`` does not choose one."""
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        return kernel_family()
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    probe = "from course.runs.kernels import kernel_family; print(kernel_family())"
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def available_families() -> tuple[str, ...]:
    """Every family this CPU runs, its native one last. Off x86 (an ARM laptop), only ``default`` is known to
    run besides the native one."""
    native = native_family()
    if native in X86_FAMILIES:
        return X86_FAMILIES[:X86_FAMILIES.index(native) + 1]
    return ("default", native) if native != "default" else ("default",)
