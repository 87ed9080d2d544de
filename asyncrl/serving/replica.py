"""A rollout replica process (`placement: remote`): an engine on this process's devices, served on a
TCP port to peers holding the shared token (server in `server.py`); weights arrive per version as
safetensors folders under the replica's own weights root.

Entry points: `asyncrl rollout-server CONFIG [overrides] FLAGS` and `python -m
asyncrl.serving.replica CONFIG [overrides] FLAGS`, with the same flags (`add_arguments`): --host,
--port, --token-file, --run-dir | --weights-root, --init-model, --ready-file, --max-connections,
--read-timeout-s. Bind address, port, connection cap and read timeout default to the config's
`cluster.rollout_*` keys; a flag overrides its key. `run` checks every input (token, weights root,
flags) before it builds anything, so a replica without a token never starts. `start_local_replicas`
launches replicas as child processes on loopback for the local backend (on GKE they are the
JobSet's rollout pods); each writes its bound `host:port` to a ready file once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.config import RunConfig
from asyncrl.config.cluster import is_ip
from asyncrl.config.errors import MAX_SECONDS
from asyncrl.serving.admission import model_digest
from asyncrl.serving.auth import (
    TOKEN_ENV,
    Token,
    load_token,
    token_file_from_env,
    write_new_token,
)
from asyncrl.serving.server import RolloutServer, ServerSettings
from asyncrl.serving.wire import WireLimits

if TYPE_CHECKING:  # the model stack is imported only by a replica that serves
    from flax import nnx

    from asyncrl.model.transformer import Transformer

READY = "LISTENING "


class ReplicaError(ValueError):
    """A replica that cannot start: a bad flag, no weights root, an address it cannot bind."""


def settings_for(
    cfg: RunConfig,
    host: str | None = None,
    port: int | None = None,
    max_connections: int | None = None,
    read_timeout_s: float | None = None,
) -> ServerSettings:
    """The server settings of `cfg.cluster`, each overridden by a flag that is not None."""
    c = cfg.cluster
    cap = c.rollout_max_connections if max_connections is None else max_connections
    return ServerSettings(
        host=c.rollout_bind_host if host is None else host,
        port=c.rollout_port if port is None else port,
        # Room for every episode the trainer runs at once, plus health checks and publishes.
        max_connections=cap or 2 * cfg.rollout.max_concurrency + 16,
        read_timeout_s=c.rollout_read_timeout_s if read_timeout_s is None else read_timeout_s,
    )


def serve(
    cfg: RunConfig,
    settings: ServerSettings,
    *,
    token: Token,
    weights_root: Path,
    init_model: str | None = None,
    ready_file: str | None = None,
) -> None:
    """Build the engine and serve it until killed (`run` checks the inputs first)."""
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
    limits = WireLimits(
        vocab_size=engine.vocab_limit,
        max_len=engine.max_len,
        max_timeout_s=max(3600.0, cfg.rollout.request_timeout_s),
    )
    server = RolloutServer(
        engine,
        weights_loader(model),
        token=token,
        limits=limits,
        weights_root=weights_root,
        settings=settings,
        model_digest=model_digest(cfg),
    )
    try:
        asyncio.run(_serve_announced(server, ready_file))
    finally:
        engine.close()


def weights_loader(model: Transformer) -> Callable[[str], nnx.State]:
    """The server's `load_params`: a version folder's weights loaded into `model`, the replica's
    own, in place; returns its parameters. `model` must be one the engine does not read (the
    engine copies its parameters when it is built and on each publish), and loads must not
    overlap (the server loads one version at a time). No model is built per publish: a failed
    load may leave `model` half-written, which nobody serves and the next load overwrites whole.
    """
    from flax import nnx

    from asyncrl.model import hf_checkpoint as hf

    def load_params(path: str) -> nnx.State:
        hf.load_into(model, path)
        return nnx.state(model, nnx.Param)

    return load_params


async def _serve_announced(server: RolloutServer, ready_file: str | None) -> None:
    ready = asyncio.Event()
    task = asyncio.create_task(server.serve(ready))
    await asyncio.wait(
        {task, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():  # binding failed
        try:
            await task
        except OSError as e:
            raise ReplicaError(
                f"cannot bind {server.host}:{server.port}: {e.strerror or e}"
            ) from None
    print(f"{READY}{server.host}:{server.port}", flush=True)
    if ready_file:  # written last and renamed: a reader never sees half an address
        tmp = Path(f"{ready_file}.tmp")
        tmp.write_text(f"{server.host}:{server.port}")
        tmp.replace(ready_file)
    await task


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The replica's flags, shared by `asyncrl rollout-server` and `python -m` this module."""
    p.add_argument(
        "--host", help="address to bind (default cluster.rollout_bind_host; pod: 0.0.0.0)"
    )
    p.add_argument(
        "--port", type=int, help="port to bind (default cluster.rollout_port; 0 = any free port)"
    )
    p.add_argument("--token-file", help=f"file holding the shared token (default: ${TOKEN_ENV})")
    p.add_argument("--run-dir", help="run folder; weights arrive under its train/weights/")
    p.add_argument("--weights-root", help="where version folders arrive (overrides --run-dir)")
    p.add_argument("--init-model", help="HF model folder to start from")
    p.add_argument("--ready-file", help="write host:port here once serving")
    p.add_argument(
        "--max-connections",
        type=int,
        help="connections served at once (default cluster.rollout_max_connections)",
    )
    p.add_argument(
        "--read-timeout-s",
        type=float,
        help="seconds a peer has to send its request (default cluster.rollout_read_timeout_s)",
    )


def run(cfg: RunConfig, args: argparse.Namespace) -> int:
    """Check every input (token, weights root, flags) before anything is built, then serve.
    `TokenError` / `ReplicaError` name what is missing or wrong."""
    token = load_token(args.token_file or token_file_from_env())
    weights_root = _weights_root(args)
    settings = settings_for(
        cfg,
        host=_flag_host(args.host),
        port=_flag(args.port, "--port", 0, 65535, "0 (any free port) to 65535"),
        max_connections=_flag(
            args.max_connections, "--max-connections", 0, 65536, "0 (from the config) to 65536"
        ),
        read_timeout_s=_flag(
            args.read_timeout_s, "--read-timeout-s", 1e-3, MAX_SECONDS, "seconds, > 0, finite"
        ),
    )
    serve(
        cfg,
        settings,
        token=token,
        weights_root=weights_root,
        init_model=args.init_model,
        ready_file=args.ready_file,
    )
    return 0


def _weights_root(args: argparse.Namespace) -> Path:
    from asyncrl.run_layout import RunLayout

    if args.weights_root:
        root = Path(args.weights_root)
    elif args.run_dir:
        root = RunLayout.of(args.run_dir).weights
    else:
        raise ReplicaError(
            "a rollout replica needs its weights root: pass --run-dir or --weights-root"
        )
    if root.exists() and not root.is_dir():
        raise ReplicaError(f"the weights root {root} exists and is not a folder")
    return root


def _flag_host(host: str | None) -> str | None:
    if host is not None and not is_ip(host):
        raise ReplicaError(
            f"--host: got {host!r:.80}; allowed: an IP address (127.0.0.1, 0.0.0.0 or ::)"
        )
    return host


def _flag(value, name: str, lo: float, hi: float, allowed: str):
    if value is not None and not lo <= value <= hi:  # NaN fails both comparisons
        raise ReplicaError(f"{name}: got {value!r}; allowed: {allowed}")
    return value


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
    except (ValueError, OSError) as e:  # ConfigError, TokenError, ReplicaError, an unreadable file
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
