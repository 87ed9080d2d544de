"""Keeping the processes of a multi-host trainer in step: process 0 leads, the others follow.

Every process of a trainer that spans several hosts must run the same collective programs (train
steps, parameter gathers, checkpoint saves) in the same order on the global mesh, but only process
0 runs the orchestrator and the group queue, so only it knows what comes next. The shared code
calls `announce(command)` just before each such operation, on every process: the leader's call
sends the command, a follower's call is a no-op (it is replaying a command it has already
received with `receive`, in `wiring/lockstep.py`). A command is a small header (its kind and the
size of its payload) and then its payload; a train step's `TrainBatch` reaches every process by
one `broadcast_one_to_all`. `gather` brings a tree spread over the processes whole onto every
host (for a weight publish from process 0, or the final model), with one collective for the tree.

`Alone` is the single-process case: nothing is sent, `gather` is a plain device copy, and a
1-host run is exactly what it was without this module. Nothing here reads the environment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from asyncrl.learner.batching import TrainBatch, empty_batch
from asyncrl.model.sharding import copy_state


class Op(enum.IntEnum):
    STEP = 1  # a train step on the command's batch
    PARAMS = 2  # gather the parameters onto every host (a publish, the final model)
    SAVE = 3  # save a checkpoint with the command's pipeline record (JSON)
    WAIT = 4  # wait until the started checkpoint saves are finalized
    STOP = 5  # the run is over; the text is the leader's result (JSON)


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    op: Op
    batch: TrainBatch | None = None  # STEP only
    text: str = ""  # SAVE: the pipeline record; STOP: the run's result


class Lockstep(Protocol):
    @property
    def leader(self) -> bool: ...

    def announce(self, command: Command) -> None: ...

    def receive(self) -> Command: ...

    def gather(self, tree): ...


class Alone:
    """One process: it leads, nobody follows, nothing is sent."""

    leader = True

    def announce(self, command: Command) -> None:
        return None

    def receive(self) -> Command:
        raise RuntimeError("a single process has no leader to follow")

    def gather(self, tree):
        return copy_state(tree)  # a copy: the next step donates the learner's buffers


class Broadcast:
    """Several processes joined by `jax.distributed`: process 0 sends every command."""

    def __init__(self) -> None:
        if jax.process_count() < 2:
            raise RuntimeError("Broadcast needs several processes; use Alone")
        self.leader = jax.process_index() == 0
        # Gloo (CPU collectives) joins the processes of a device set at its first collective and
        # gives up after 30 s; a first train step's compile can differ by more across hosts. So
        # every device, and the broadcast's groups, are joined now, while the processes are in
        # step (an established set waits as long as it takes). On TPU this costs two tiny steps.
        devices = np.array(jax.devices())
        sharding = NamedSharding(Mesh(devices, ("all",)), PartitionSpec("all"))
        local = np.zeros(jax.local_device_count(), np.int32)
        whole(jax.make_array_from_process_local_data(sharding, local))
        _broadcast(local)

    def announce(self, command: Command) -> None:
        if not self.leader:
            return  # a follower replays what it received
        batch, text = command.batch, command.text.encode()
        shape = np.shape(batch.inputs) if batch is not None else (0, 0, 0)
        _broadcast(np.array([command.op, *shape, len(text)], np.int64))
        if batch is not None:
            _broadcast(jax.tree.map(np.asarray, batch))
        if text:
            _broadcast(np.frombuffer(text, np.uint8))

    def receive(self) -> Command:
        if self.leader:
            raise RuntimeError("process 0 leads; it does not receive")
        op, m, r, t, size = (int(x) for x in _broadcast(np.zeros(5, np.int64)))
        batch = _broadcast(empty_batch((m, r, t))) if m else None
        text = bytes(_broadcast(np.zeros(size, np.uint8))).decode() if size else ""
        return Command(op=Op(op), batch=batch, text=text)

    def gather(self, tree):
        return whole(tree)


def whole(tree):
    """Every array of `tree` whole on this host, as numpy. Arrays spread over several processes
    are replicated by one jitted identity (a collective: every process makes the same call);
    the others are read here."""
    from jax.experimental import multihost_utils

    leaves, treedef = jax.tree.flatten(tree)
    spread = {i for i, x in enumerate(leaves) if _spread(x)}
    out = [
        multihost_utils.process_allgather(x, tiled=True) if i in spread and not _named(x) else x
        for i, x in enumerate(leaves)
    ]  # (a sharding without a mesh, never made here, goes the slow way: a jit per array)
    named = sorted(i for i in spread if _named(leaves[i]))
    if named:
        xs = [leaves[i] for i in named]
        replicated = [x.sharding.update(spec=PartitionSpec()) for x in xs]
        for i, x in zip(named, jax.jit(_identity, out_shardings=replicated)(xs), strict=True):
            out[i] = x.addressable_data(0)
    return jax.tree.unflatten(treedef, [np.asarray(x) for x in out])


def _spread(x) -> bool:
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def _named(x) -> bool:
    return isinstance(x.sharding, NamedSharding)


def _identity(x):
    return x


def _broadcast(tree):
    from jax.experimental import multihost_utils

    return multihost_utils.broadcast_one_to_all(tree)


def of_processes() -> Lockstep:
    """`Broadcast` when this process is one of several (`jax.distributed` joined), else `Alone`."""
    return Broadcast() if jax.process_count() > 1 else Alone()
