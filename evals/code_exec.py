"""Running model-written code to grade it, never in the harness process.

Each program runs in a fresh, isolated Python (``-I``: no user site, no PYTHON* variables) in its own
temporary folder and process group, with limits on time (wall and CPU), memory, file size and open
files, an empty environment, and no network: in a new network namespace where ``unshare -rn`` works
(Linux with user namespaces), otherwise with Python's socket functions replaced by ones that raise. It is
a guard against accidents (runaway loops, memory blow-ups, stray files and connections), not a security
boundary against hostile code; run untrusted models in a container.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# runs before the program: sockets refuse to be made (the fallback where no network namespace is available)
NO_NETWORK = """\
import socket as _socket
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled while grading")
_socket.socket = _socket.create_connection = _socket.socketpair = _socket.getaddrinfo = _no_network
del _socket, _no_network
"""


@dataclass(frozen=True)
class ExecResult:
    status: str  # "passed", "failed" (an exception or a non-zero exit) or "timed out"
    detail: str = ""  # the end of stderr, for a failure
    stdout: str = ""  # the end of what it printed, when asked for (``capture=True``)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.cache
def network_namespace() -> bool:
    """Whether ``unshare -rn`` can start a process here (then programs run with no network at all)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limits(cpu_seconds: int, memory_mb: int) -> None:
    """In the child before it runs Python: its own process group, and resource limits."""
    import resource

    os.setsid()
    for limit, value in ((resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_AS, memory_mb << 20),
                         (resource.RLIMIT_FSIZE, 16 << 20), (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))


def run_program(program: str, timeout: float = 10.0, memory_mb: int = 2048, capture: bool = False) -> ExecResult:
    """Run ``program`` (Python source) in a sandboxed child process; it passes when it exits with status 0
    within ``timeout`` seconds. With ``capture``, its output goes to a file in its folder (so the file-size
    limit caps it) and the last 2,000 characters come back in ``stdout``."""
    with tempfile.TemporaryDirectory(prefix="semverify-exec-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program if network_namespace() else NO_NETWORK + program)
        command = [sys.executable, "-I", path]
        if network_namespace():
            command = ["unshare", "-rn", *command]
        out_path = os.path.join(folder, "stdout.txt")
        with open(out_path if capture else os.devnull, "wb") as out:
            child = subprocess.Popen(command, cwd=folder, env={"PATH": os.defpath}, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.PIPE,
                                     preexec_fn=functools.partial(_limits, int(timeout) + 1, memory_mb))
        try:
            _, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return ExecResult("timed out", f"no exit within {timeout:g} s")
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
        printed = ""
        if capture and os.path.exists(out_path):  # the program runs in this folder and could remove the file
            with open(out_path, encoding="utf-8", errors="replace") as f:
                printed = f.read()[-2000:]
    if child.returncode == 0:
        return ExecResult("passed", stdout=printed)
    return ExecResult("failed", err.decode("utf-8", "replace")[-500:], printed)
