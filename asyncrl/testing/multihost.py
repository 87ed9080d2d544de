"""A multi-host self-test for `cloud/distributed.py`: one data-parallel SFT step across processes.

    python -m asyncrl.testing.multihost --selftest   # with the JAX_* variables set per process

Test support, not product code: it builds the micro model and a fixed trajectory.
"""

from __future__ import annotations

import json
import sys

from asyncrl.cloud.distributed import initialize_from_env


def selftest() -> dict[str, object]:
    """One data-parallel SFT step of the micro model over every process's devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from asyncrl.checkpoint.manager import digest, flatten
    from asyncrl.learner.learner import Learner
    from asyncrl.model import build_model
    from asyncrl.testing.configs import micro_config
    from asyncrl.testing.trajectories import fixed_trajectory

    cfg = micro_config()
    devices = np.array(jax.devices()).reshape(1, -1, 1)
    mesh = Mesh(devices, ("data", "fsdp", "tensor"))
    learner = Learner(
        build_model(cfg.model, seed=0), cfg.learner, max_len=256, mesh=mesh, sft=cfg.warm_start
    )
    traj = fixed_trajectory(57)
    metrics = learner.sft_step(learner.sft_batch([traj, traj]))
    local = jax.tree.map(
        lambda x: np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True)),
        learner.state.params,
    )
    return {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "loss": metrics["loss"],
        "params_digest": digest(flatten(local)),
    }


if __name__ == "__main__":
    if "--selftest" in sys.argv:
        initialize_from_env()
        print("SELFTEST " + json.dumps(selftest()), flush=True)
