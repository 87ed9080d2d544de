"""The data cursor: which numbered groups were issued, trained and dropped, and what comes next.

Training draws tasks from a deterministic stream (`stages/train.training_tasks`); the n-th task
drawn becomes group `"<task id>@n"`. The cursor records, per group number, how its story ended,
so a restored run can continue exactly where the checkpoint stood:

- groups that were trained or dropped are never issued again;
- groups that were issued but not finished when the checkpoint was taken (in flight, or complete
  and waiting in the queue) are issued again first, under the same number and so the same group id,
  marked as replays (`replays`);
- then the stream continues from `next_index`.

So within an epoch no task is trained twice and a restart skips none. Pure bookkeeping: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from asyncrl.envs.base import Task


@dataclass(slots=True)
class DataCursor:
    next_index: int = 0  # the stream position of the next new group
    trained: list[int] = field(default_factory=list)  # group numbers, in training order
    dropped: list[int] = field(default_factory=list)  # stale or failed, never trained
    pending: set[int] = field(default_factory=set)  # issued, not yet trained or dropped
    replays: set[int] = field(default_factory=set)  # to re-issue first (after a restore)

    def issue(self, n: int) -> None:
        self.pending.add(n)
        self.next_index = max(self.next_index, n + 1)

    def finish(self, n: int, *, trained: bool) -> None:
        self.pending.discard(n)
        (self.trained if trained else self.dropped).append(n)

    def numbered(self, task_at: Callable[[int], Task]) -> Iterator[tuple[int, Task, bool]]:
        """(group number, task, is_replay): the replays first, then the stream onward."""
        for n in sorted(self.replays):
            yield n, task_at(n), True
        self.replays.clear()
        n = self.next_index
        while True:
            yield n, task_at(n), False
            n += 1

    def to_json(self) -> dict[str, object]:
        return {
            "next_index": self.next_index,
            "trained": list(self.trained),
            "dropped": list(self.dropped),
            # Issued but unfinished at save time: re-issued on restore.
            "pending": sorted(self.pending | self.replays),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> DataCursor:
        return cls(
            next_index=int(data["next_index"]),
            trained=[int(n) for n in data["trained"]],
            dropped=[int(n) for n in data["dropped"]],
            replays={int(n) for n in data["pending"]},
        )
