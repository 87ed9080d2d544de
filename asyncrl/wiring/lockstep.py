"""The trainer's collective work beyond the learner (checkpoints), and the followers' loop.

On a trainer spanning several hosts, process 0 runs the training loop and every other process runs
`follow`: it receives each command process 0 announces (`learner/lockstep.py`) and runs the same
operation, so all processes enter the same collectives in the same order — a train step on the
broadcast batch, a parameter gather, an Orbax save or wait (Orbax's multi-host path: every process
writes its own shards, process 0 the metadata and the pipeline record). `save` and `wait` are what
the leader calls; they announce, then do exactly what a follower does on receiving them. Alone,
they only save and wait.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from asyncrl.checkpoint.manager import Checkpointer
from asyncrl.learner.learner import Learner
from asyncrl.learner.lockstep import Command, Op


def save(learner: Learner, checkpointer: Checkpointer, pipeline: Mapping[str, Any]) -> int:
    """Start saving the learner's state (every process); returns the step."""
    learner.lockstep.announce(Command(op=Op.SAVE, text=json.dumps(pipeline)))
    # A copy: the next train step donates the learner's buffers while Orbax still writes.
    snapshot = jax.tree.map(jnp.copy, learner.state)
    return checkpointer.save(snapshot, pipeline)


def wait(learner: Learner, checkpointer: Checkpointer) -> None:
    """Wait until every started save is finalized (every process)."""
    learner.lockstep.announce(Command(op=Op.WAIT))
    checkpointer.wait()


def stop(learner: Learner, result: str = "") -> None:
    """Release the followers from `follow`, handing them `result` (process 0; no-op alone)."""
    learner.lockstep.announce(Command(op=Op.STOP, text=result))


def follow(learner: Learner, checkpointer: Checkpointer) -> str:
    """Run process 0's commands until it stops; returns the result it stopped with (an error
    when it stopped without one: it failed)."""
    while True:
        command = learner.lockstep.receive()
        if command.op is Op.STEP:
            assert command.batch is not None  # a STEP always carries its batch
            learner.rl_step(command.batch)
        elif command.op is Op.PARAMS:
            learner.params_copy()
        elif command.op is Op.SAVE:
            save(learner, checkpointer, json.loads(command.text))
        elif command.op is Op.WAIT:
            wait(learner, checkpointer)
        elif not command.text:
            raise RuntimeError("process 0 stopped the run without a result: it failed (its log)")
        else:
            return command.text
