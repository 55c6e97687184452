"""Crash-safe JSONL rows: append one line per finished problem, read back skipping a torn last line."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_rows(run_dir: str | Path) -> list[dict]:
    """Every complete row of every shard file in ``run_dir`` (a line cut by a crash is skipped);
    a (problem, method) pair written twice counts once."""
    rows: dict[tuple, dict] = {}
    for path in sorted(Path(run_dir).glob("rows.rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows.setdefault((row["id"], row["method"]), row)
    return list(rows.values())


class RowWriter:
    """Appends rows durably: each line is flushed and fsynced before the next problem starts."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
