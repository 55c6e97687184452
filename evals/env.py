"""The environment a result was measured in, saved beside every number."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys

import torch
import transformers


def environment(**settings) -> dict:
    """Machine, library versions, date and the given run settings as a JSON-ready dict."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": " ".join(sys.argv),
        **settings,
    }
