"""The learner on a device mesh: a batch's rows split over the data x fsdp devices (FSDP is data
parallelism with sharded parameters), a step there equals the step on one device, and the second
step reuses the first one's compilation.

Tolerance: on a mesh the gradient of each row is computed on its own device and the sum is
reduced across devices, a different order of float32 additions than one device's. The first
step's loss then agrees within LOSS_TOL, and every parameter within STEP_TOL, a tenth of the
learning rate (Adam divides each gradient by its own magnitude, so float noise in GRPO's
near-cancelling gradients moves a parameter by up to a learning rate; a different batch moves
parameters by up to two). The same tolerances as the multi-host test's (tests/test_multihost.py).
"""

import contextlib

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from asyncrl.learner.batching import build_batch
from asyncrl.learner.learner import Learner
from asyncrl.model import build_model
from asyncrl.model.sharding import make_mesh
from asyncrl.testing.configs import micro_config
from asyncrl.testing.trajectories import random_groups
from asyncrl.types import Group

LOSS_TOL = 1e-6
STEP_TOL = 1e-4  # lr (1e-3) / 10
CONFIG = ("learner.lr=1e-3", "learner.kl_coef=0.1")
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def _groups(n_groups=2, size=4, seed=0) -> list[Group]:
    return random_groups(n_groups, size, lengths=(20, 60), prompt=8, seed=seed)


def _learner(mesh=None) -> Learner:
    cfg = micro_config(*CONFIG)
    return Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=256, mesh=mesh)


@pytest.mark.parametrize("data,fsdp", [(1, 4), (2, 2)])
def test_a_step_on_a_mesh_splits_the_rows_and_equals_the_step_on_one_device(data, fsdp):
    mesh = make_mesh(jax.devices()[:4], data=data, fsdp=fsdp)
    on_mesh, alone = _learner(mesh), _learner()
    groups = _groups()
    batch = on_mesh.batch_from_groups(groups, rows=3)  # 3 rows rounded up to 4: one per device
    assert batch.inputs.shape[1] == 4
    placed = on_mesh._place(batch)
    assert placed.inputs.sharding.spec == P(None, ("data", "fsdp"))
    assert {s.data.shape for s in placed.inputs.addressable_shards} == {
        (batch.inputs.shape[0], 1, batch.inputs.shape[2])
    }
    mesh_metrics = on_mesh.rl_step(batch)
    one_metrics = alone.rl_step(alone.batch_from_groups(groups, rows=4))
    assert abs(mesh_metrics["loss"] - one_metrics["loss"]) <= LOSS_TOL
    assert mesh_metrics["grad_norm"] > 0
    moved = 0.0
    for a, b, before in zip(
        jax.tree.leaves(on_mesh.state.params),
        jax.tree.leaves(alone.state.params),
        jax.tree.leaves(_learner().state.params),
        strict=True,
    ):
        assert float(np.abs(np.asarray(a) - np.asarray(b)).max()) <= STEP_TOL
        moved = max(moved, float(np.abs(np.asarray(b) - np.asarray(before)).max()))
    assert moved > STEP_TOL  # the step moved the parameters by more than the tolerance


@contextlib.contextmanager
def _compilations():
    """The XLA compilations that happen inside the block (JAX's own monitoring event)."""
    seen: list[str] = []

    def listen(event: str, _secs: float, **_kw) -> None:
        if event == BACKEND_COMPILE:
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_the_second_step_on_a_mesh_reuses_the_first_steps_compilation():
    mesh = make_mesh(jax.devices()[:4], fsdp=4)
    learner = _learner(mesh)
    first, second = learner.batch_from_groups(_groups()), learner.batch_from_groups(_groups(seed=1))
    assert first.inputs.shape == second.inputs.shape
    with _compilations() as compiled:
        learner.rl_step(first)
    assert compiled  # the first step compiled (a fresh configuration: lr, kl)
    with _compilations() as compiled:
        learner.rl_step(second)
    assert compiled == []
    # The state keeps its placement: parameters and Adam moments as placed, counters replicated.
    assert learner.state.step.sharding.spec == P()
    before = _learner(mesh).state
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(learner.state), strict=True):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


def test_rows_round_up_to_the_data_parallel_multiple():
    trajs = [t for g in _groups(n_groups=3, size=2) for t in g.trajectories]
    batch = build_batch(trajs, [0.0] * 6, max_len=256, micro_batch_tokens=64 * 5, row_multiple=4)
    # The token budget allows 5 rows of 64; rounded up to 8, every trajectory in one micro-batch.
    assert batch.inputs.shape == (1, 8, 64)
    assert int(batch.valid.any(-1).sum()) == 6
