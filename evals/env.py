"""The environment a result was measured in, saved beside every number."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
import transformers


def environment(**settings) -> dict:
    """Machine, library versions, date and the given run settings as a JSON-ready dict."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": " ".join(sys.argv),
        "code": code_version(),
        **settings,
    }


def machine() -> str:
    """The processor and the widest vector extension it has, e.g. "AMD EPYC (AVX2)": two processors of one
    name can differ by a factor of 5 in bf16 speed (AVX-512 BF16 or not), so timings are only compared
    between rows of the same ``machine``."""
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


def code_version() -> str | None:
    """The git commit of the semverify checkout that ran (marked when its code has local changes), or
    None for an installed copy outside git: a run that spans sessions records each session's code."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", "semverify", "evals"],
                               timeout=10).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + (" + local changes" if dirty else "")
