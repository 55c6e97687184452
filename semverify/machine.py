"""Which machine ran the models, as every timing and cost curve records it: two processors of one name can
differ by a factor of 5 in bf16 speed (AVX-512 BF16 or not), so timings are only compared within one machine."""

from __future__ import annotations

import ctypes
import platform

import torch


def machine(device: str | torch.device = "cpu") -> str:
    """What ran the models: on the CPU the processor and the widest vector extension it has, e.g. "AMD EPYC
    (AVX2)" (two processors of one name can differ by a factor of 5 in bf16 speed, AVX-512 BF16 or not), on a
    GPU its name, e.g. "NVIDIA H200 (CUDA)". Timings are only compared between rows of the same ``machine``."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA)"
    if device.type != "cpu":
        return f"{device.type} ({cpu_name()})"
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        flags = set()
    isa = next((name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"),
                                         ("avx2", "AVX2")) if flag in flags), None)
    return f"{cpu_name()} ({isa})" if isa else cpu_name()


def cpu_name() -> str:
    """The processor's model name; every result row carries it, so a run resumed on another machine
    never divides timings taken on two machines."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter: allocations above it are mapped fresh and unmapped when freed


def keep_large_buffers(limit: int = 1 << 30) -> bool:
    """On a CPU, let glibc's malloc reuse freed buffers up to ``limit`` bytes instead of mapping fresh pages.

    A verify step's logits over k + 1 positions ([B, k + 1, V] floats: 97 MB at B = 32, k = 4 and Qwen's
    vocabulary) lie above glibc's largest automatic threshold (32 MB), so without this every step maps and
    zero-fills them anew: on a 2-core AVX2 EPYC, half of a tiny model's 5-token verify forward at B = 32.
    Process-wide (memory stays with the process); returns False where there is no glibc (nothing changed)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, int(limit)))
    except (OSError, AttributeError):
        return False
