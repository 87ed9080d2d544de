"""`LoopState`: everything the training loop knows, as one frozen record.

The policy version, the data cursor (which groups were admitted and how each ended), the loop's
counters and the policy-lag histogram. Transitions are pure (`finish`, `stepped`, `published`,
`waited`), so the loop's bookkeeping is testable without a model, and a checkpoint stores the
record whole (`to_json` / `from_json`, validated). Admission is a pure predicate over it
(`admits`): a group may start only while the groups holding a place in the budget (trained, or
issued and not yet ended) are fewer than `(version + max_staleness + 1) × groups per version`.
A group that ends without training (stale, failed, withdrawn, no signal) leaves the budget at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from asyncrl.records import RecordError, decode, encode
from asyncrl.rollout.cursor import CursorError, DataCursor
from asyncrl.types import GroupOutcome


class StateError(ValueError):
    """A saved loop state that cannot be restored (unknown format, missing or mistyped field)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopCounters:
    steps: int = 0
    groups_trained: int = 0
    groups_stale: int = 0
    groups_failed: int = 0
    groups_withdrawn: int = 0
    groups_no_signal: int = 0
    train_seconds: float = 0.0
    wait_seconds: float = 0.0  # learner idle, waiting for groups

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0:
                raise ValueError(f"{f.name}: expected a number >= 0, got {value!r}")


_COUNTER_OF = {
    GroupOutcome.TRAINED: "groups_trained",
    GroupOutcome.STALE: "groups_stale",
    GroupOutcome.FAILED: "groups_failed",
    GroupOutcome.WITHDRAWN: "groups_withdrawn",
    GroupOutcome.NO_SIGNAL: "groups_no_signal",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopState:
    version: int = 0  # the policy version last published to the engine
    cursor: DataCursor = field(default_factory=DataCursor)
    counters: LoopCounters = field(default_factory=LoopCounters)
    lags: tuple[tuple[int, int], ...] = ()  # (lag, trajectories), lag = version − oldest token

    def finish(self, number: int, outcome: GroupOutcome) -> LoopState:
        """Group `number` ended with `outcome`: the cursor and the counters move together."""
        name = _COUNTER_OF[outcome]
        counters = replace(self.counters, **{name: getattr(self.counters, name) + 1})
        return replace(self, cursor=self.cursor.finish(number, outcome), counters=counters)

    def issued(self, number: int) -> LoopState:
        return replace(self, cursor=self.cursor.issue(number))

    def stepped(self, lags: Iterable[int], train_seconds: float) -> LoopState:
        histogram = Counter(dict(self.lags))
        histogram.update(lags)
        c = self.counters
        counters = replace(c, steps=c.steps + 1, train_seconds=c.train_seconds + train_seconds)
        return replace(self, counters=counters, lags=tuple(sorted(histogram.items())))

    def waited(self, seconds: float) -> LoopState:
        c = self.counters
        return replace(self, counters=replace(c, wait_seconds=c.wait_seconds + seconds))

    def published(self, version: int) -> LoopState:
        return replace(self, version=version)

    def restored(self) -> LoopState:
        """The state a resumed run starts from (unended groups are issued again first)."""
        return replace(self, cursor=self.cursor.restored())

    @property
    def lag_mean(self) -> float:
        n = sum(k for _, k in self.lags)
        return sum(lag * k for lag, k in self.lags) / n if n else 0.0

    @property
    def lag_max(self) -> int:
        return max((lag for lag, _ in self.lags), default=0)

    @property
    def learner_idle_fraction(self) -> float:
        c = self.counters
        return c.wait_seconds / max(c.wait_seconds + c.train_seconds, 1e-9)

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "cursor": self.cursor.to_json(),
            "counters": encode(self.counters),
            "lags": [list(pair) for pair in self.lags],
        }

    @classmethod
    def from_json(cls, data: object) -> LoopState:
        """The saved state, checked field by field; raises StateError naming what is wrong."""
        if not isinstance(data, Mapping):
            raise StateError(f"loop state: expected an object, got {type(data).__name__}")
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise StateError(f"loop state.version: expected an integer >= 0, got {version!r:.60}")
        try:
            cursor = DataCursor.from_json(data.get("cursor"))  # type: ignore[arg-type]
        except CursorError as e:
            raise StateError(f"loop state.{e}") from None
        return cls(
            version=version,
            cursor=cursor,
            counters=_decoded(LoopCounters, data.get("counters"), "loop state.counters"),
            lags=_lags(data.get("lags")),
        ).restored()


def admits(state: LoopState, groups_per_version: int, max_staleness: int) -> bool:
    """Whether one more group may start now without risking training on it too late."""
    budget = (state.version + max_staleness + 1) * groups_per_version
    return state.cursor.occupying < budget


def _decoded(tp: object, data: object, where: str) -> Any:
    try:
        return decode(tp, data, where)  # type: ignore[arg-type]
    except RecordError as e:
        raise StateError(str(e)) from None


def _lags(data: object) -> tuple[tuple[int, int], ...]:
    lags = _decoded(tuple[tuple[int, int], ...], data, "loop state.lags")
    if any(x < 0 for pair in lags for x in pair):
        raise StateError(f"loop state.lags: expected [[lag, count], ...] >= 0, got {data!r:.60}")
    return tuple(sorted(lags))
