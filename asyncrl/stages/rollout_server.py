"""Stage: a rollout replica (`placement: remote`). An engine on this process's devices, served on
a TCP port (protocol in `sampling/remote.py`); weights arrive per version as safetensors folders.

`start_local_replicas` launches replicas as child processes on loopback for the local backend
(on GKE they are the JobSet's rollout pods); each prints `LISTENING host:port` when it serves.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.config import RunConfig

READY = "LISTENING "


def serve(
    cfg: RunConfig, host: str, port: int, init_model: str | None, ready_file: str | None = None
) -> None:
    from flax import nnx

    from asyncrl.model import build_model
    from asyncrl.model import hf_checkpoint as hf
    from asyncrl.sampling.remote import RolloutServer
    from asyncrl.stages.common import Wiring

    wiring = Wiring.of(cfg)
    model = build_model(cfg.model, seed=cfg.seed)
    if init_model:
        hf.load_into(model, init_model)
    engine = wiring.engine(model)
    engine.warmup()

    def load_params(path: str):
        fresh = build_model(cfg.model, seed=cfg.seed)
        hf.load_into(fresh, path)
        return nnx.state(fresh, nnx.Param)

    server = RolloutServer(engine, load_params, host, port)

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(server.serve(ready))
        await ready.wait()
        print(f"{READY}{server.host}:{server.port}", flush=True)
        if ready_file:  # written last and renamed: a reader never sees half an address
            tmp = Path(f"{ready_file}.tmp")
            tmp.write_text(f"{server.host}:{server.port}")
            tmp.replace(ready_file)
        await task

    try:
        asyncio.run(main())
    finally:
        engine.close()


@dataclass
class LocalReplicas:
    processes: list[subprocess.Popen] = field(default_factory=list)
    addresses: list[tuple[str, int]] = field(default_factory=list)

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        for p in self.processes:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def start_local_replicas(
    config_file: Path, n: int, init_model: str | None, log_dir: Path, timeout_s: float = 300
) -> LocalReplicas:
    """n replica processes on loopback; returns once each serves (or raises with its log)."""
    import time

    replicas = LocalReplicas()
    log_dir.mkdir(parents=True, exist_ok=True)
    ready = [log_dir / f"replica-{i}.address" for i in range(n)]
    for i in range(n):
        ready[i].unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "asyncrl.cli", "rollout-server", str(config_file)]
        cmd += ["--port", "0", "--ready-file", str(ready[i])]
        if init_model:
            cmd += ["--init-model", init_model]
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        log = (log_dir / f"replica-{i}.log").open("w")
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        replicas.processes.append(process)
        (log_dir / f"replica-{i}.pid").write_text(str(process.pid))
    deadline = time.monotonic() + timeout_s
    for i, p in enumerate(replicas.processes):
        while not ready[i].exists():
            if p.poll() is not None or time.monotonic() > deadline:
                replicas.stop()
                log = (log_dir / f"replica-{i}.log").read_text()[-2000:]
                raise RuntimeError(f"rollout replica {i} did not start serving:\n{log}")
            time.sleep(0.1)
        host, port = ready[i].read_text().rsplit(":", 1)
        replicas.addresses.append((host, int(port)))
    return replicas
