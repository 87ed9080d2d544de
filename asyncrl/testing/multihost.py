"""Multi-host self-tests for `cloud/distributed.py` and the trainer's lockstep, run once per process
(with the JAX_* variables of `cloud/distributed.py` set per process, or none for one process):

    python -m asyncrl.testing.multihost --selftest          # one data-parallel SFT step
    python -m asyncrl.testing.multihost --train OUT [--restore CKPT]

`--train`: the micro model trains STEPS RL steps through the training loop on scripted groups in
sync mode (so the batches are the same however many processes), process 0 leading and the others
following (`wiring/lockstep.py`), with a weight publish (a parameter gather) after every step; then
every process saves a checkpoint under OUT/ckpt and restores it into a fresh learner. Process 0
writes each step's loss and parameters to OUT/steps.npz. `--restore CKPT` also restores another
run's checkpoint into a fresh learner here. Test support, not product code.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from pathlib import Path

import numpy as np

from asyncrl.cloud.distributed import initialize_from_env

STEPS = 6
TRAIN_OVERRIDES = (
    "learner.mode=sync",
    "learner.max_staleness=0",
    "learner.sync_every=1",
    "learner.lr=1e-3",
    "env.agent=model",
    "env.tasks=[calculator]",
)


def selftest() -> dict[str, object]:
    """One data-parallel SFT step of the micro model over every process's devices."""
    import jax
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


def _script(fmt, tasks):
    """Replies that depend only on the request (its prompt and seed) and the engine's version:
    the task's answer for about half the seeds, a wrong one otherwise, so groups carry signal."""
    from asyncrl.types import FinishReason

    def script(request, version):
        prompt = fmt.tok.decode(list(request.prompt))
        task = max((t for t in tasks if t.prompt in prompt), key=lambda t: len(t.prompt))
        coin = hashlib.sha256(f"{request.params.seed}/{version}".encode()).digest()[0]
        text = task.answer if coin % 2 else f"{task.answer}{coin % 10}"
        return [*fmt.tok.encode(text), fmt.end_of_turn], FinishReason.STOP

    return script


def scripted_learner(cfg, seed: int, lockstep=None):
    """A micro learner on every process's devices (its own process's lockstep by default)."""
    from asyncrl.learner.learner import Learner
    from asyncrl.learner.lockstep import of_processes
    from asyncrl.model import build_model
    from asyncrl.wiring.devices import make_placement

    mesh = make_placement(cfg).train_mesh
    model = build_model(cfg.model, seed=seed)
    return Learner(model, cfg.learner, max_len=256, mesh=mesh, lockstep=lockstep or of_processes())


def scripted_training(cfg, learner, steps: int = STEPS) -> dict[str, np.ndarray]:
    """Process 0's part: `steps` steps of the loop on scripted groups, with a weight publish
    after each; returns each step's loss ("loss/<step>") and parameters ("<step>/<name>")."""
    from asyncrl.checkpoint.manager import flatten
    from asyncrl.learner.hooks import LoopHooks
    from asyncrl.learner.loop import TrainingLoop
    from asyncrl.learner.state import LoopState
    from asyncrl.testing.scripted_engine import ScriptedEngine
    from asyncrl.wiring.episodes import Wiring
    from asyncrl.wiring.training import rollout_plan, training_tasks

    wiring = Wiring.of(cfg)
    tasks = training_tasks(cfg)
    script = _script(wiring.fmt, tasks.tasks)
    engine = ScriptedEngine(lambda r: script(r, engine.version))
    rows: dict[str, np.ndarray] = {}

    async def record(step: int, loop: TrainingLoop) -> None:
        rows[f"loss/{step}"] = np.float32(loop.last_metrics["loss"])
        for name, value in flatten(learner.params_copy()).items():  # every process gathers
            rows[f"{step}/{name}"] = np.asarray(value)

    loop = TrainingLoop.from_state(
        LoopState(),
        learner,
        rollout_plan(cfg, wiring, engine),
        cfg.learner,
        hooks=LoopHooks(after_step=(record,)),
    )
    asyncio.run(loop.run(tasks.at, steps))
    return rows


def train(out: Path, restore: str | None) -> dict[str, object]:
    import jax

    from asyncrl.checkpoint.manager import Checkpointer, digest, flatten
    from asyncrl.testing.configs import micro_config
    from asyncrl.wiring import lockstep

    cfg = micro_config(*TRAIN_OVERRIDES)
    learner = scripted_learner(cfg, seed=0)
    checkpointer = Checkpointer(str(out / "ckpt"), async_save=True)
    if learner.lockstep.leader:
        np.savez(out / "steps.npz", **scripted_training(cfg, learner))
        lockstep.save(learner, checkpointer, {"selftest": "multihost"})
        lockstep.wait(learner, checkpointer)
        lockstep.stop(learner, "trained")
    else:
        lockstep.follow(learner, checkpointer)
    # Every process from here on, in the same order: restores and digests are collectives.
    result: dict[str, object] = {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "steps": learner.step,
        "trained": digest(flatten(learner.state)),
    }
    fresh = scripted_learner(cfg, seed=1)
    fresh.state, _ = checkpointer.restore(fresh.state)
    result["restored"] = digest(flatten(fresh.state))
    if restore:
        other = scripted_learner(cfg, seed=2)
        other.state, _ = Checkpointer(restore).restore(other.state)
        result["restored_other"] = digest(flatten(other.state))
    checkpointer.close()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m asyncrl.testing.multihost")
    parser.add_argument("--selftest", action="store_true")
    parser.add_argument("--train", metavar="OUT")
    parser.add_argument("--restore", metavar="CKPT")
    args = parser.parse_args()
    initialize_from_env()
    if args.selftest:
        print("SELFTEST " + json.dumps(selftest()), flush=True)
    if args.train:
        print("MULTIHOST " + json.dumps(train(Path(args.train), args.restore)), flush=True)
