"""The `Tracker` seam for scalar metrics, and the JSONL tracker every run writes.

A record is (step, wall time, name → number). JSONL is always written (it is what plots, the gate
and the report read); other trackers (TensorBoard) implement the same protocol.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float], *, kind: str = "train") -> None: ...

    def close(self) -> None: ...


class NullTracker:
    def log(self, step: int, metrics: Mapping[str, float], *, kind: str = "train") -> None:
        pass

    def close(self) -> None:
        pass


class JsonlTracker:
    """One JSON object per line: {"kind", "step", "time", "elapsed_s", **metrics}."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", buffering=1)
        self._start = time.monotonic()

    def log(self, step: int, metrics: Mapping[str, float], *, kind: str = "train") -> None:
        record = {
            "kind": kind,
            "step": step,
            "time": time.time(),
            "elapsed_s": round(time.monotonic() - self._start, 4),
        }
        for k, v in metrics.items():
            record[k] = None if isinstance(v, float) and not math.isfinite(v) else v
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


class TensorBoardTracker:
    """TensorBoard event files (via tensorboardX): scalars named "<kind>/<metric>"."""

    def __init__(self, logdir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.logdir = logdir
        self._writer = SummaryWriter(str(logdir), flush_secs=5)

    def log(self, step: int, metrics: Mapping[str, float], *, kind: str = "train") -> None:
        for k, v in metrics.items():
            if isinstance(v, int | float) and math.isfinite(v):
                self._writer.add_scalar(f"{kind}/{k}", float(v), step)

    def close(self) -> None:
        self._writer.close()


class Trackers:
    """Several trackers as one."""

    def __init__(self, *trackers: Tracker) -> None:
        self.trackers = trackers

    def log(self, step: int, metrics: Mapping[str, float], *, kind: str = "train") -> None:
        for t in self.trackers:
            t.log(step, metrics, kind=kind)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def read_jsonl(path: Path, kind: str | None = None) -> list[dict[str, object]]:
    """The rows of a metrics file (of `kind` when given); a line that is not a JSON object is a
    ValueError naming it."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict):
            raise ValueError(f"line {number} is not a JSON object")
        if kind is None or row.get("kind") == kind:
            rows.append(row)
    return rows
