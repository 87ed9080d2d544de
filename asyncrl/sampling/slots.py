"""Host-side bookkeeping of the engine's decode slots: who owns a slot and what its cache holds.

A slot keeps its KV cache after its request finishes ("parked"), labelled with the session (the
episode) and the exact tokens whose keys and values are in it. The next turn of that session reuses
the cache when its prompt extends those tokens. A free slot is chosen in this order: the session's
own parked slot, an empty slot, the least recently used parked slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Slot:
    index: int
    session: str = ""
    cached: list[int] = field(default_factory=list)  # tokens at cache positions 0..len-1
    version: int = -1  # oldest weight version that computed part of the cache
    busy: bool = False
    last_used: int = 0  # logical clock of the last release

    def reusable_prefix(self, session: str, prompt: Sequence[int], version: int | None) -> int:
        """How many leading prompt tokens this slot's cache already holds (0 = none usable).

        `version` None accepts a cache computed by any weights; otherwise it must match. At least
        one prompt token must remain to be prefilled, since the next logits come from it.
        """
        n = len(self.cached)
        if not session or session != self.session or n == 0 or n >= len(prompt):
            return 0
        if version is not None and self.version != version:
            return 0
        return n if list(prompt[:n]) == self.cached else 0


class SlotTable:
    def __init__(self, n: int) -> None:
        self.slots = [Slot(i) for i in range(n)]
        self._clock = 0

    def free_count(self) -> int:
        return sum(not s.busy for s in self.slots)

    def busy(self) -> list[Slot]:
        return [s for s in self.slots if s.busy]

    def acquire(self, session: str, prompt: Sequence[int], version: int | None) -> tuple[Slot, int]:
        """Take a free slot for a request; returns it and the prompt tokens its cache covers."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            raise RuntimeError("no free slot")  # the engine admits only up to free_count()
        own = [
            (s.reusable_prefix(session, prompt, version), s) for s in free if s.session == session
        ]
        best = max(own, key=lambda pair: pair[0], default=(0, None))
        if best[1] is not None and best[0] > 0:
            slot, reuse = best[1], best[0]
        else:
            empty = [s for s in free if not s.session]
            slot = empty[0] if empty else min(free, key=lambda s: s.last_used)
            reuse = 0
        slot.busy = True
        if reuse == 0:
            slot.cached = []
            slot.version = -1
        slot.session = session
        del slot.cached[reuse:]
        return slot, reuse

    def release(self, slot: Slot) -> None:
        self._clock += 1
        slot.busy = False
        slot.last_used = self._clock
