"""Logical axis names of parameters mapped to a device mesh with axes (data, fsdp, tensor).

Owns the rules and the placement of a model's state on a mesh. A dimension whose size the mesh axis
does not divide stays replicated (e.g. 2 KV heads on a 4-way tensor axis), so every preset places on
every mesh. Building meshes from a config's device counts is the business of `asyncrl.stages`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Megatron-style tensor parallelism over heads and the MLP width, FSDP over the model dimension.
DEFAULT_RULES: Mapping[str, str | None] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
}


def make_mesh(
    devices: Sequence[jax.Device], data: int = 1, fsdp: int = -1, tensor: int = 1
) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices`; fsdp=-1 takes all devices left over."""
    if fsdp == -1:
        fsdp = len(devices) // (data * tensor)
    if data * fsdp * tensor != len(devices):
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} does not use {len(devices)} devices"
        )
    grid = np.asarray(devices, dtype=object).reshape(data, fsdp, tensor)
    return Mesh(grid, MESH_AXES)


def partition_spec(
    axes: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Mapping[str, str | None] = DEFAULT_RULES,
) -> PartitionSpec:
    """The spec for one array: each logical axis to its mesh axis when that divides the size."""
    used: set[str] = set()
    spec: list[str | None] = []
    for name, size in zip(axes, shape, strict=True):
        target = rules.get(name) if name is not None else None
        if target is None or target in used or size % mesh.shape[target] != 0:
            spec.append(None)
            continue
        used.add(target)
        spec.append(target if mesh.shape[target] > 1 else None)
    return PartitionSpec(*spec)


def state_shardings(model: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES) -> nnx.State:
    """A NamedSharding for every variable of `model`, from its `logical_axes` metadata."""

    def one(var: nnx.Variable) -> NamedSharding:
        axes = var.get_metadata().get("logical_axes")
        value = var[...]
        if axes is None:
            return NamedSharding(mesh, PartitionSpec())
        return NamedSharding(mesh, partition_spec(axes, value.shape, mesh, rules))

    state = nnx.state(model)
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def copy_state(state, placement: jax.sharding.Sharding | None = None):
    """A fresh copy of a state pytree (optionally moved to `placement`) that nobody else owns.

    The learner donates its state to each step and the engine keeps what was published, so
    neither may hold the other's buffers.
    """
    if placement is not None:
        state = jax.device_put(state, placement)
    return jax.tree.map(lambda x: jnp.array(x, copy=True), state)


def data_parallel(mesh: Mesh) -> int:
    """How many ways a batch splits on `mesh`: its data x fsdp axes (FSDP is data parallelism
    with sharded parameters; the tensor axis shares each row)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Where a batch array of `ndim` dimensions lives: arrays [M, R, ...] (micro-batches of R
    rows) split their rows over data x fsdp, so each device scores and differentiates its own
    rows and the gradients are reduced across them; scalars are replicated."""
    if ndim < 2:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp")))


def onto_mesh(tree, mesh: Mesh):
    """`tree` with every leaf not yet on `mesh` (optimizer counters, the step) replicated onto
    it: a jitted step then sees the same input shardings before and after its first call, and
    compiles once instead of twice."""
    whole = NamedSharding(mesh, PartitionSpec())

    def one(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return x
        return jax.device_put(np.asarray(x), whole)

    return jax.tree.map(one, tree)


def shard_model(model: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES) -> None:
    """Place every variable of `model` on `mesh` in place."""
    shardings = state_shardings(model, mesh, rules)
    state = nnx.state(model)
    placed = jax.tree.map(
        lambda var, s: var.replace(jax.device_put(var[...], s)),
        state,
        shardings,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    nnx.update(model, placed)
