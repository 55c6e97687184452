"""The environment a result was measured in, saved beside every number."""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers

from semverify.machine import machine


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
