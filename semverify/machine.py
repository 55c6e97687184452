"""Which machine ran the models, as every timing and cost curve records it: two processors of one name can
differ by a factor of 5 in bf16 speed (AVX-512 BF16 or not), so timings are only compared within one machine."""

from __future__ import annotations

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
