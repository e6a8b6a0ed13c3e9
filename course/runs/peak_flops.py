"""Dense bf16 matmul peaks of known accelerators: the denominator of a GPU's MFU (lesson 18 §5.3).

Each number is the vendor's datasheet figure for dense BF16 tensor-core math, in FLOP/s. NVIDIA's data-center
datasheets print the figure "with sparsity" (2:4 structured sparsity, which a dense training step never uses):
the dense peak is half of it, and that half is what the table holds. A GPU missing here has no entry rather than
a guess; a CPU has none at all (no datasheet gives a CPU's peak for torch's kernels at a given thread count:
lesson 18's lab measures this machine's matmul peak instead, ``course/experiments/step_timing.py::matmul_peak``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PeakFlops:
    name: str
    flops_per_second: float   # dense bf16, FLOP/s
    source: str               # where the number comes from
    pattern: str              # a regular expression matching torch.cuda.get_device_name() of that device


def _entry(name: str, tflops: float, source: str, pattern: str) -> tuple[str, PeakFlops]:
    return name, PeakFlops(name, tflops * 1e12, source, pattern)


PEAK_FLOPS: dict[str, PeakFlops] = dict([
    _entry("NVIDIA H200", 989.5, "NVIDIA H200 Tensor Core GPU datasheet: BFLOAT16 Tensor Core 1,979 TFLOPS with "
           "sparsity, half without", r"\bH200\b"),
    _entry("NVIDIA H100 SXM", 989.5, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BFLOAT16 Tensor Core 1,979 "
           "TFLOPS with sparsity, half without", r"\bH100\b(?!.*\b(PCIe|NVL)\b)"),
    _entry("NVIDIA H100 PCIe", 756.5, "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe): BFLOAT16 Tensor Core "
           "1,513 TFLOPS with sparsity, half without", r"\bH100\b.*\bPCIe\b"),
    _entry("NVIDIA A100", 312.0, "NVIDIA A100 Tensor Core GPU datasheet: BFLOAT16 Tensor Core 312 TFLOPS (624 with "
           "sparsity), the SXM and PCIe cards alike", r"\bA100\b"),
    _entry("NVIDIA L40S", 362.05, "NVIDIA L40S GPU datasheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity)",
           r"\bL40S\b"),
    _entry("NVIDIA L4", 121.0, "NVIDIA L4 Tensor Core GPU datasheet: BFLOAT16 Tensor Core 242 TFLOPS with "
           "sparsity, half without", r"\bL4\b"),
    _entry("NVIDIA A10", 125.0, "NVIDIA A10 Tensor Core GPU datasheet: BF16 Tensor Core 125 TFLOPS (250 with "
           "sparsity)", r"\bA10\b"),
    _entry("NVIDIA GeForce RTX 4090", 165.2, "NVIDIA Ada Lovelace GPU architecture whitepaper, RTX 4090: peak BF16 "
           "Tensor TFLOPS with FP32 accumulate 165.2 (330.4 with sparsity)", r"\bRTX 4090\b"),
    _entry("NVIDIA GeForce RTX 3090", 71.0, "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090: peak BF16 "
           "Tensor TFLOPS with FP32 accumulate 71 (142 with sparsity)", r"\bRTX 3090\b"),
    _entry("AMD Instinct MI300X", 1307.4, "AMD Instinct MI300X accelerator datasheet: peak BF16 1,307.4 TFLOPS "
           "(2,614.9 with sparsity)", r"\bMI300X\b"),
])


def peak_flops_of(device_name: str) -> Optional[PeakFlops]:
    """The table's entry for a device named as ``torch.cuda.get_device_name()`` names it ("NVIDIA H100 80GB
    HBM3", "NVIDIA A100-SXM4-80GB"), or None when the table does not know it."""
    return next((peak for peak in PEAK_FLOPS.values() if re.search(peak.pattern, device_name)), None)
