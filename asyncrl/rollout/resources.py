"""Shared concurrency limits for outside resources (a tool, a sandbox pool, a judge), by name.

The engine bounds its own queue; everything else an episode waits on gets a semaphore here, shared
by all episodes of the run, so one saturated resource slows only the episodes that need it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping


class Resources:
    def __init__(self, caps: Mapping[str, int] | None = None) -> None:
        self.caps = dict(caps or {})
        self._semaphores = {name: asyncio.Semaphore(n) for name, n in self.caps.items()}

    def limits(self) -> dict[str, asyncio.Semaphore]:
        return dict(self._semaphores)
