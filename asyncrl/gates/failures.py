"""Why an evaluated episode failed: one `Failure` per unsolved trajectory, from what the
`Trajectory` records (its status, reward and reward parts), and the counts over a set.

An episode is solved when its reward is 1 (exact match). An unsolved one failed for exactly one
reason, decided by its status first (how it ended), then, for a completed episode, by whether
its final answer had the expected form (the `format` reward part, reported but not rewarded):

| reason | status | meaning |
|---|---|---|
| wrong_answer | completed | a well-formed final answer that is not the right one |
| malformed_answer | completed | the final answer is not in the expected form (`format` < 1: extra
  text, an empty answer) |
| no_answer | truncated_steps | every model turn went to tool calls; no final answer |
| truncated | truncated_tokens | the token budget or the context ran out mid-episode |
| malformed_call | invalid_action | a malformed call or a tool call the environment does not take
  ended the episode (env.malformed_tool_call=terminate, or a tool call in a single-turn task) |
| tool_error | tool_error | a tool failed (raised, returned nothing) |
| timeout | timeout | the episode's deadline, or a tool's, passed |
| env_error | env_error | the environment raised |
| cancelled | cancelled | the run cancelled the episode (engine closed, shutdown) |

With env.malformed_tool_call=observation (the default) a malformed call is an error message the
model sees, not an ending: such episodes end later for one of the other reasons.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable

from asyncrl.types import Trajectory, TrajectoryStatus


class Failure(enum.StrEnum):
    WRONG_ANSWER = "wrong_answer"
    MALFORMED_ANSWER = "malformed_answer"
    NO_ANSWER = "no_answer"
    TRUNCATED = "truncated"
    MALFORMED_CALL = "malformed_call"
    TOOL_ERROR = "tool_error"
    TIMEOUT = "timeout"
    ENV_ERROR = "env_error"
    CANCELLED = "cancelled"


_BY_STATUS = {
    TrajectoryStatus.TRUNCATED_STEPS: Failure.NO_ANSWER,
    TrajectoryStatus.TRUNCATED_TOKENS: Failure.TRUNCATED,
    TrajectoryStatus.INVALID_ACTION: Failure.MALFORMED_CALL,
    TrajectoryStatus.TOOL_ERROR: Failure.TOOL_ERROR,
    TrajectoryStatus.TIMEOUT: Failure.TIMEOUT,
    TrajectoryStatus.ENV_ERROR: Failure.ENV_ERROR,
    TrajectoryStatus.CANCELLED: Failure.CANCELLED,
}


def solved(t: Trajectory) -> bool:
    return t.reward >= 1.0


def failure_of(t: Trajectory) -> Failure | None:
    """Why `t` failed; None when it was solved."""
    if solved(t):
        return None
    if t.status != TrajectoryStatus.COMPLETED:
        return _BY_STATUS[t.status]
    well_formed = dict(t.reward_parts).get("format", 1.0) >= 1.0
    return Failure.WRONG_ANSWER if well_formed else Failure.MALFORMED_ANSWER


FailureCounts = tuple[tuple[Failure, int], ...]


def breakdown(trajectories: Iterable[Trajectory]) -> FailureCounts:
    """Failed episodes per reason, every reason listed (zeros included), in `Failure` order."""
    counts = collections.Counter(failure_of(t) for t in trajectories)
    return tuple((reason, counts[reason]) for reason in Failure)
