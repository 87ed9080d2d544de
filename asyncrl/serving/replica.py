"""A rollout replica process (`placement: remote`): an engine on this process's devices, served on a
TCP port to peers holding the shared token (server in `server.py`); weights arrive per version as
safetensors folders under the replica's own weights root.

Entry points: `python -m asyncrl.serving.replica CONFIG [overrides] --host --port --token-file
--run-dir|--weights-root`, or `asyncrl rollout-server` with the same flags (`add_arguments`).
It refuses to start without a token, before it builds anything. `start_local_replicas` launches
replicas as child processes on loopback for the local backend (on GKE they are the JobSet's
rollout pods); each writes its bound `host:port` to a ready file once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.config import RunConfig
from asyncrl.serving.auth import Token, load_token, token_file_from_env, write_new_token
from asyncrl.serving.server import RolloutServer, ServerSettings
from asyncrl.serving.wire import WireLimits

READY = "LISTENING "


def settings_for(cfg: RunConfig, host: str, port: int, max_connections: int = 0) -> ServerSettings:
    """Room for every episode the trainer runs at once, plus health checks and publishes."""
    cap = max_connections or 2 * cfg.rollout.max_concurrency + 16
    return ServerSettings(host=host, port=port, max_connections=cap)


def serve(
    cfg: RunConfig,
    host: str,
    port: int,
    init_model: str | None,
    ready_file: str | None = None,
    *,
    token_file: str | None = None,
    weights_root: Path | None = None,
    max_connections: int = 0,
) -> None:
    """Serve until killed. No token (flag or ASYNCRL_ROLLOUT_TOKEN_FILE) or no weights root: a
    `TokenError` / `ValueError` before anything is built."""
    token = load_token(token_file or token_file_from_env())
    if weights_root is None:
        raise ValueError(
            "a rollout replica needs its weights root: pass --run-dir or --weights-root"
        )
    settings = settings_for(cfg, host, port, max_connections)
    from flax import nnx

    from asyncrl.model import build_model
    from asyncrl.model import hf_checkpoint as hf
    from asyncrl.sampling.engine import Engine
    from asyncrl.tokenize import build_tokenizer

    model = build_model(cfg.model, seed=cfg.seed)
    if init_model:
        hf.load_into(model, init_model)
    tokenizer = build_tokenizer(cfg.tokenizer)
    engine = Engine(  # as wiring/episodes.py builds it for the in-process placements
        model,
        cfg.rollout,
        max_len=cfg.env.max_context,
        vocab_limit=tokenizer.vocab_size,
        decode_text=tokenizer.decode,
        seed=cfg.seed,
    )
    engine.warmup()

    def load_params(path: str):
        fresh = build_model(cfg.model, seed=cfg.seed)
        hf.load_into(fresh, path)
        return nnx.state(fresh, nnx.Param)

    limits = WireLimits(
        vocab_size=engine.vocab_limit,
        max_len=engine.max_len,
        max_timeout_s=max(3600.0, cfg.rollout.request_timeout_s),
    )
    server = RolloutServer(
        engine,
        load_params,
        token=token,
        limits=limits,
        weights_root=weights_root,
        settings=settings,
    )
    try:
        asyncio.run(_serve_announced(server, ready_file))
    finally:
        engine.close()


async def _serve_announced(server: RolloutServer, ready_file: str | None) -> None:
    ready = asyncio.Event()
    task = asyncio.create_task(server.serve(ready))
    await asyncio.wait(
        {task, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():  # binding failed
        await task
    print(f"{READY}{server.host}:{server.port}", flush=True)
    if ready_file:  # written last and renamed: a reader never sees half an address
        tmp = Path(f"{ready_file}.tmp")
        tmp.write_text(f"{server.host}:{server.port}")
        tmp.replace(ready_file)
    await task


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (GKE: 0.0.0.0)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 = any free port")
    p.add_argument(
        "--token-file", help="file holding the shared token (default: $ASYNCRL_ROLLOUT_TOKEN_FILE)"
    )
    p.add_argument("--run-dir", help="run folder; weights arrive under its train/weights/")
    p.add_argument("--weights-root", help="where version folders arrive (overrides --run-dir)")
    p.add_argument("--init-model", help="HF model folder to start from")
    p.add_argument("--ready-file", help="write host:port here once serving")
    p.add_argument("--max-connections", type=int, default=0, help="0 = from the config")


def run(cfg: RunConfig, args: argparse.Namespace) -> int:
    from asyncrl.run_layout import RunLayout

    root = args.weights_root or (RunLayout.of(args.run_dir).weights if args.run_dir else None)
    serve(
        cfg,
        args.host,
        args.port,
        args.init_model,
        args.ready_file,
        token_file=args.token_file,
        weights_root=Path(root) if root else None,
        max_connections=args.max_connections,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    from asyncrl.config import load_config

    parser = argparse.ArgumentParser(prog="asyncrl-replica", description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        return run(load_config(args.config, args.overrides), args)
    except (ValueError, OSError) as e:  # ConfigError, TokenError, a port already bound
        print(f"asyncrl replica: {e}", file=sys.stderr)
        return 2


@dataclass
class LocalReplicas:
    processes: list[subprocess.Popen] = field(default_factory=list)
    addresses: list[tuple[str, int]] = field(default_factory=list)
    token: Token | None = None  # the token the replicas were started with

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
    config_file: Path,
    n: int,
    init_model: str | None,
    log_dir: Path,
    timeout_s: float = 300,
    *,
    weights_root: Path | None = None,
    token_file: Path | None = None,
) -> LocalReplicas:
    """n replica processes on loopback; returns once each serves (or raises with its log).

    The token: `token_file`, else $ASYNCRL_ROLLOUT_TOKEN_FILE, else a fresh one in `log_dir/token`
    (readable by its owner only). The weights root defaults to `log_dir`'s sibling `weights/`
    (the run layout's train/replicas and train/weights).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    if token_file is None and (env_file := token_file_from_env()) is not None:
        token_file = Path(env_file)
    if token_file is None:
        token_file = log_dir / "token"
        token = write_new_token(token_file)
    else:
        token = load_token(token_file)
    replicas = LocalReplicas(token=token)
    root = weights_root or log_dir.parent / "weights"
    ready = [log_dir / f"replica-{i}.address" for i in range(n)]
    for i in range(n):
        ready[i].unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "asyncrl.serving.replica", str(config_file)]
        cmd += ["--port", "0", "--ready-file", str(ready[i])]
        cmd += ["--token-file", str(token_file), "--weights-root", str(root)]
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


if __name__ == "__main__":
    sys.exit(main())
