"""The data cursor: which numbered groups were issued and how each ended, and what comes next.

Training draws tasks from a deterministic stream (`envs.tasks.EpochOrder`); the n-th task drawn
becomes group n (`NumberedTask`). The cursor records, per group number, how its story ended, so a
restored run continues exactly where the checkpoint stood:

- groups that were trained or dropped (stale or failed) are never issued again;
- groups that were issued but had not ended when the checkpoint was taken (in flight, or complete
  and waiting for the learner), and groups withdrawn when a run stopped, are issued again first,
  under the same number and so the same group id and seeds, marked as replays;
- then the stream continues from `next_index`.

So within an epoch no task is trained twice and a restart skips none. A frozen value with pure
transitions: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from asyncrl.types import GroupOutcome, NumberedTask, Task


class CursorError(ValueError):
    """A saved cursor that does not describe a possible history."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DataCursor:
    next_index: int = 0  # the stream position of the next new group
    trained: tuple[int, ...] = ()  # group numbers, in training order
    dropped: tuple[int, ...] = ()  # stale or failed, never trained, never issued again
    pending: frozenset[int] = frozenset()  # issued, not yet ended
    withdrawn: frozenset[int] = frozenset()  # ended unconsumed when a run stopped
    replays: tuple[int, ...] = ()  # to issue first (after a restore), in order

    def issue(self, n: int) -> DataCursor:
        return replace(
            self,
            pending=self.pending | {n},
            withdrawn=self.withdrawn - {n},
            replays=tuple(r for r in self.replays if r != n),
            next_index=max(self.next_index, n + 1),
        )

    def finish(self, n: int, outcome: GroupOutcome) -> DataCursor:
        pending = self.pending - {n}
        if outcome == GroupOutcome.TRAINED:
            return replace(self, pending=pending, trained=(*self.trained, n))
        if outcome == GroupOutcome.WITHDRAWN:
            return replace(self, pending=pending, withdrawn=self.withdrawn | {n})
        return replace(self, pending=pending, dropped=(*self.dropped, n))

    @property
    def occupying(self) -> int:
        """Groups that hold a place in the staleness budget: trained, or issued and unended."""
        return len(self.trained) + len(self.pending)

    def restored(self) -> DataCursor:
        """The cursor a resumed run starts from: everything unended is replayed first."""
        return replace(
            self,
            pending=frozenset(),
            withdrawn=frozenset(),
            replays=tuple(sorted(self.pending | self.withdrawn | set(self.replays))),
        )

    def numbered(self, task_at: Callable[[int], Task]) -> Iterator[NumberedTask]:
        """The replays first, then the stream onward from `next_index` (as of this value)."""
        for n in self.replays:
            yield NumberedTask(number=n, task=task_at(n), replay=True)
        n = self.next_index
        while True:
            yield NumberedTask(number=n, task=task_at(n))
            n += 1

    def to_json(self) -> dict[str, object]:
        return {
            "next_index": self.next_index,
            "trained": list(self.trained),
            "dropped": list(self.dropped),
            # Issued but unended at save time: re-issued on restore.
            "pending": sorted(self.pending | self.withdrawn | set(self.replays)),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> DataCursor:
        """The saved cursor, checked; raises CursorError naming what is wrong."""
        if not isinstance(data, Mapping):
            raise CursorError(f"cursor: expected an object, got {type(data).__name__}")
        next_index = _natural(data, "next_index")
        lists = {k: _numbers(data, k) for k in ("trained", "dropped", "pending")}
        seen = [n for v in lists.values() for n in v]
        if len(seen) != len(set(seen)):
            raise CursorError("cursor: a group number appears twice in trained/dropped/pending")
        if any(n >= next_index for n in seen):
            raise CursorError(f"cursor: a group number is not below next_index={next_index}")
        return cls(
            next_index=next_index,
            trained=tuple(lists["trained"]),
            dropped=tuple(lists["dropped"]),
            replays=tuple(sorted(lists["pending"])),
        )


def _natural(data: Mapping[str, object], key: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CursorError(f"cursor.{key}: expected an integer >= 0, got {value!r:.60}")
    return value


def _numbers(data: Mapping[str, object], key: str) -> list[int]:
    value = data.get(key)
    if not isinstance(value, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value
    ):
        raise CursorError(f"cursor.{key}: expected a list of integers >= 0, got {value!r:.60}")
    return value
