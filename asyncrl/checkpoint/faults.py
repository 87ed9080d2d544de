"""Fault injection for the recovery test: die by SIGKILL at a named phase of a chosen step.

`ASYNCRL_KILL_AT=<phase>:<step>` (set only by the recovery test in the child it starts) makes
`point(phase, step)` kill the process with SIGKILL — no cleanup, no flush, no atexit, exactly like
a preempted VM. The phases are the moments where a crash is most damaging: during rollout (groups
half collected), during a train step (the jitted step dispatched, not finished), during a
checkpoint write (Orbax writing in the background), during a weight publish (a version handed to
the engine, not yet swapped in). Without the variable every point is a dictionary lookup.
"""

from __future__ import annotations

import enum
import os
import signal

ENV = "ASYNCRL_KILL_AT"


class Phase(enum.StrEnum):
    ROLLOUT = "rollout"
    TRAIN = "train"
    CHECKPOINT = "checkpoint"
    PUBLISH = "publish"


def parse(spec: str) -> tuple[Phase, int]:
    phase, _, step = spec.partition(":")
    try:
        return Phase(phase), int(step)
    except ValueError:
        allowed = ", ".join(p.value for p in Phase)
        raise ValueError(
            f"{ENV}={spec!r}: expected <phase>:<step> with phase one of {allowed}"
        ) from None


def point(phase: Phase, step: int) -> None:
    spec = os.environ.get(ENV)
    if spec and parse(spec) == (phase, step):
        os.kill(os.getpid(), signal.SIGKILL)
