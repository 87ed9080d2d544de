"""A progress display for long work that degrades to plain lines when not on a terminal.

On a TTY one line is redrawn in place (bar, count, rate, ETA, the caller's fields); elsewhere (CI
logs, KFP pods) a plain line is printed at most every `every_s` seconds and at the end, so logs
show progress without a wall of carriage returns.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TextIO


class Progress:
    def __init__(
        self, total: int, label: str, *, stream: TextIO | None = None, every_s: float = 15.0
    ) -> None:
        self.total, self.label = max(total, 1), label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = every_s
        self.done = 0
        self._start = time.monotonic()
        self._last = float("-inf")

    def line(self, fields: Mapping[str, object] | None = None) -> str:
        elapsed = time.monotonic() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        width = 24
        filled = int(width * min(self.done / self.total, 1.0))
        bar = "#" * filled + "." * (width - filled)
        extra = "  ".join(f"{k} {v}" for k, v in (fields or {}).items())
        eta_text = f"{eta:.0f}s" if eta == eta else "?"
        return (
            f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:.0f}s eta {eta_text}  {extra}"
        ).rstrip()

    def update(self, done: int, fields: Mapping[str, object] | None = None) -> None:
        self.done = done
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line(fields))
            self.stream.flush()
        elif now - self._last >= self.every_s or done >= self.total:
            self.stream.write(self.line(fields) + "\n")
            self.stream.flush()
            self._last = now

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
