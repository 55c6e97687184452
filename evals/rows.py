"""Crash-safe JSONL rows: one fsynced line per finished result, one writer per file (a compare shard,
a speed or throughput run).

A kill can only tear the last line (it lacks its newline); the writer cuts it before anything reads
the file, and readers skip it. A broken line anywhere else was not written by a kill: it is reported.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path


def row_key(row: dict) -> tuple[int, str, int]:
    """What a row is the result of: (problem, method, sample); rows from before samples are sample 0."""
    return row["id"], row["method"], row.get("sample", 0)


def read_rows(run_dir: str | Path) -> list[dict]:
    """Every complete row of every shard file in ``run_dir``; a (problem, method, sample) written twice
    counts once. A torn last line is skipped; a broken line before it raises ValueError naming it."""
    rows: dict[tuple, dict] = {}
    for path in sorted(Path(run_dir).glob("rows.rank*.jsonl")):
        for row in read_row_file(path):
            rows.setdefault(row_key(row), row)
    return list(rows.values())


def read_row_file(path: str | Path) -> list[dict]:
    """The complete rows of one file written by a `RowWriter`, in order (none if it does not
    exist). A torn last line is skipped; a broken line before it raises ValueError naming it."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: a write cut off by a kill
                continue
            raise ValueError(f"{path}, line {number}: a broken row in the middle of the file (not a write cut "
                             "off by a kill); repair or delete that line, then resume") from None
    return rows


class RowWriter:
    """Appends rows durably: each line is flushed and fsynced before the next problem starts.

    Holds an exclusive lock on ``<file>.lock`` while open, so two runs never write one shard; the lock
    goes with the process, kill -9 included.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path.with_name(self.path.name + ".lock"), "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ValueError(f"another run is writing {self.path}; wait for it to finish or use another "
                             "--out") from None
        self._drop_torn_tail()
        self.file = self.path.open("a")

    def _drop_torn_tail(self) -> None:
        """A kill mid-write leaves a line without its newline; cut it so the next row starts clean."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def write(self, row: dict) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()
        self._lock.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
