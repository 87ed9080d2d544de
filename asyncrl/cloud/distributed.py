"""Multi-host JAX: `jax.distributed` from the environment the JobSet sets on every trainer pod.

JAX_COORDINATOR_ADDRESS (pod 0 of the trainer job, host:port), JAX_NUM_PROCESSES and
JAX_PROCESS_ID (the pod's completion index). Absent variables mean a single process: nothing to
do. On CPU (tests, and this module's `--selftest`) the collectives go through gloo.

    python -m asyncrl.cloud.distributed --selftest   # with the three variables set per process
"""

from __future__ import annotations

import json
import os
import sys

ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def initialize_from_env() -> bool:
    """Join the job's JAX processes if the environment names a coordinator; returns whether."""
    if not os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return False
    missing = [k for k in ENV if not os.environ.get(k)]
    if missing:
        raise RuntimeError(f"jax.distributed needs {', '.join(ENV)}; missing {', '.join(missing)}")
    import jax

    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
    return True


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
