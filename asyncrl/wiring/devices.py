"""Devices and meshes for a run: where the engine and the learner live.

The one place that reads the device list. `colocated`: both on all devices, with a lock that
pauses decoding during a train step. `disaggregated`: disjoint device sets (the first
`rollout_devices` for the engine, the rest for the learner), on one host only. On a multi-host
trainer the train mesh spans every process's devices and a local engine (colocated) lives on
process 0's first device. On CPU the devices are virtual
(`XLA_FLAGS=--xla_force_host_platform_device_count=N`), set by `ensure_host_devices` before JAX
starts.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

from asyncrl.config import RunConfig


def ensure_host_devices(cfg: RunConfig) -> None:
    """On the local backend, ask XLA for enough virtual CPU devices (before JAX is imported)."""
    if cfg.cluster.backend != "local":
        return
    wanted = max(1, cfg.cluster.rollout_devices + cfg.cluster.train_devices)
    if cfg.cluster.placement == "colocated":
        wanted = max(1, cfg.cluster.train_devices, cfg.cluster.rollout_devices)
    flags = os.environ.get("XLA_FLAGS", "")
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", flags)
    if match and int(match.group(1)) >= wanted:
        return
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={wanted}".strip()


@dataclass(frozen=True)
class Placement:
    engine_sharding: object  # jax.sharding.Sharding of the engine's weights and cache
    train_mesh: object  # jax.sharding.Mesh of the learner
    device_lock: threading.Lock | None  # shared by engine and learner when colocated
    rollout_devices: tuple
    train_devices: tuple


def make_placement(cfg: RunConfig) -> Placement:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from asyncrl.model.sharding import make_mesh

    devices = jax.devices()  # every process's: a multi-host trainer's mesh spans the slice
    c = cfg.cluster
    if c.placement == "disaggregated" and jax.process_count() > 1:
        raise ValueError(
            "cluster.placement 'disaggregated' splits one host's devices; on a trainer of "
            f"{jax.process_count()} hosts use 'remote' (rollout replicas in their own pods) or "
            "'colocated'"
        )
    if c.placement in ("colocated", "remote"):
        n = c.train_devices or len(devices)
        train = rollout = tuple(devices[:n])
        # Remote: the engines live in other processes; the learner has these devices alone.
        lock: threading.Lock | None = threading.Lock() if c.placement == "colocated" else None
    else:
        r = c.rollout_devices or max(1, len(devices) // 2)
        t = c.train_devices or len(devices) - r
        if r + t > len(devices):
            raise ValueError(
                f"cluster.rollout_devices={r} + cluster.train_devices={t} exceed the "
                f"{len(devices)} devices available"
            )
        rollout, train = tuple(devices[:r]), tuple(devices[r : r + t])
        lock = None
    mesh = make_mesh(list(train), data=c.mesh_data, fsdp=c.mesh_fsdp, tensor=c.mesh_tensor)
    rollout_mesh = make_mesh([rollout[0]], data=1, fsdp=1, tensor=1)
    return Placement(
        engine_sharding=NamedSharding(rollout_mesh, PartitionSpec()),
        train_mesh=mesh,
        device_lock=lock,
        rollout_devices=rollout,
        train_devices=train,
    )
