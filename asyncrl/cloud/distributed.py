"""Multi-host JAX: `jax.distributed` from the environment the JobSet sets on every trainer pod.

JAX_COORDINATOR_ADDRESS (pod 0 of the trainer job, host:port), JAX_NUM_PROCESSES and
JAX_PROCESS_ID (the pod's completion index). Absent variables mean a single process: nothing to
do. On CPU (tests: `python -m asyncrl.testing.multihost --selftest`, with the three variables
set per process) the collectives go through gloo.
"""

from __future__ import annotations

import os

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
