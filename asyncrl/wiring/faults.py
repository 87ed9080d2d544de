"""Fault injection for the recovery test: die by SIGKILL at a named phase of a chosen step.

`ASYNCRL_KILL_AT=<phase>:<step>` (set only by the recovery test in the child it starts) makes the
train stage install a phase point (`kill_point`) that kills the process with SIGKILL — no cleanup,
no flush, no atexit, exactly like a preempted VM — when the loop reaches that phase of that step.
The variable is read once, when the stage starts; the loop itself only calls its `at_phase` hook
(learner/hooks.py) and knows nothing of this module. Without the variable the hook does nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from asyncrl.learner.hooks import Phase, PhasePoint

ENV = "ASYNCRL_KILL_AT"


def parse(spec: str) -> tuple[Phase, int]:
    phase, _, step = spec.partition(":")
    try:
        return Phase(phase), int(step)
    except ValueError:
        allowed = ", ".join(p.value for p in Phase)
        raise ValueError(
            f"{ENV}={spec!r:.60}: expected <phase>:<step> with phase one of {allowed}"
        ) from None


def kill_point(environ: Mapping[str, str] = os.environ) -> PhasePoint | None:
    """The phase point that kills this process where `ASYNCRL_KILL_AT` says; None when unset."""
    spec = environ.get(ENV)
    if not spec:
        return None
    target = parse(spec)

    def point(phase: Phase, step: int) -> None:
        if (phase, step) == target:
            os.kill(os.getpid(), signal.SIGKILL)

    return point
