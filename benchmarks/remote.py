"""Remote rollout on loopback: weight publication to replicas, and a short run remote vs colocated.

Layout measured: `--trainer-hosts` trainer processes (default 1) and `--replicas` rollout-server
processes (default 2) on this host's loopback, all sharing its CPU cores. With `--trainer-hosts N`
(N > 1) the remote run is also made by a trainer of N processes joined by `jax.distributed` on
loopback (`asyncrl train` per process, as a JobSet trainer pod runs it: one CPU device each,
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID; process 0 leads, starts the
replicas and writes the trace, the others follow in lockstep). On a 2-core machine that layout
measures CPU contention as much as the remote path.

1. Weight publication, for each `--publish-models` preset: replica processes serving that model,
   and the trainer's real path (the learner's `params_copy`, then `WeightPublisher` →
   `RemoteEngine.publish`: a safetensors folder `v<N>/` written under the weights root, then every
   replica told its name and loading it). Made by this process alone and, with `--trainer-hosts
   N`, again by N processes joined as above, each holding the learner with its parameters sharded
   over the global mesh; process 0 starts the replicas and publishes, the others follow its
   parameter gathers (`wiring/lockstep.py`). Per publish: the gather (a device copy in one
   process, a collective across N), the seconds the trainer blocks in the write, the seconds from
   the write's start until every replica reports the new version (health), MB/s = folder bytes /
   the latter, and the whole (gather + until served). One warm-up publish is not counted; medians
   over `--publishes`.
2. Trajectories per minute of the same training run (micro model, `--steps` optimizer steps, no
   evaluation or checkpoints) colocated in one process (the baseline) and with placement remote;
   the ratio remote / colocated. A first colocated run of the same config, not counted, compiles
   the learner's programs in this process, so neither measured run pays them inside its loop; with
   N hosts a first N-host run, not counted either, fills the trainer processes' persistent
   compilation cache (`<root>/jax-cache`), which the measured N-host run loads.
   Steady rate: trajectories trained between the first and the last step's metrics row over that
   time (the ratio is of these); wall: the whole `train()` call, start-up included (the remote
   run's includes starting its replicas, the colocated one's reuses this process's programs; an
   N-host run's is its processes' lifetime: imports, joining, compiling, replicas).
3. Where the time goes, from each run's Perfetto trace (`asyncrl.tracing.reader.summarize`; process
   0's for N hosts): the share of the traced loop in publish (the trainer's blocking part: the
   parameter gather across hosts and the write) and its mean seconds per publish, in train steps,
   the learner idle (waiting for groups), and the mean model call as an episode sees it.

    .venv/bin/python benchmarks/remote.py [--quick] [--steps 12] [--publish-models micro,tiny,small]
        [--trainer-hosts 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = (
    "learner.eval_every=0",
    "env.heldout_size=2",
    "env.train_size=16",
    "checkpoint.every_steps=0",
    "tracing.enabled=true",
    "tracing.tensorboard=false",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--publish-models", default="micro,tiny,small", help="model presets for part 1")
    p.add_argument("--publishes", type=int, default=5, help="timed publishes per preset")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps of each training run")
    p.add_argument("--quick", action="store_true", help="micro only, 3 publishes, 6 steps")
    p.add_argument("--skip-training", action="store_true", help="part 1 only")
    p.add_argument(
        "--trainer-hosts", type=int, default=1,
        help="N > 1: the remote run is also made by a trainer of N processes (jax.distributed)",
    )  # fmt: skip
    p.add_argument(
        "--hosts-timeout", type=float, default=900.0,
        help="seconds the N-host run may take before its processes are killed",
    )  # fmt: skip
    # One of N publishing processes (part 1 with --trainer-hosts N), run by this script itself.
    p.add_argument("--publish-process", metavar="PRESET", help=argparse.SUPPRESS)
    p.add_argument("--publish-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.publish_models, args.publishes, args.steps = "micro", 3, 6
    if args.replicas < 1 or args.publishes < 1 or args.steps < 2 or args.trainer_hosts < 1:
        p.error("--replicas, --publishes and --trainer-hosts must be >= 1, --steps >= 2")
    return args


# -- 1. weight publication -------------------------------------------------------------------------


def _wait_for_version(engine, version: int, timeout_s: float = 300.0) -> None:
    """Until every live replica reports `version` (its health), or TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies = engine.health().values()
        if all(r.get("ok") and r.get("version", -1) >= version for r in replies):
            return
        time.sleep(0.005)
    raise TimeoutError(f"replicas did not report weights version {version} in {timeout_s} s")


def _timed_publishes(learner, publisher, n: int) -> tuple[dict[str, list[float]], int]:
    """`n` publishes after one warm-up (version 1), each as the trainer's loop makes it: the
    learner's parameters gathered (`params_copy`: a device copy alone, a collective across the
    processes of a multi-host trainer), written and announced (`publisher`), then waited for
    until every replica serves it. Returns the seconds of each part per publish ("gather",
    "write": the trainer blocks, "serve": from the write's start until every replica serves it,
    "total": from the gather's start) and the version folder's bytes."""
    engine, size = publisher.engine, 0
    seconds: dict[str, list[float]] = {"gather": [], "write": [], "serve": [], "total": []}
    for version in range(1, n + 2):
        t0 = time.perf_counter()
        params = learner.params_copy()
        t1 = time.perf_counter()
        record = publisher.publish(params, version, version)
        size = sum(f.stat().st_size for f in (engine.weights_dir / f"v{version}").iterdir())
        _wait_for_version(engine, version)
        t2 = time.perf_counter()
        if version > 1:
            parts = (t1 - t0, record.seconds, t2 - t1, t2 - t0)
            for part, secs in zip(seconds, parts, strict=True):
                seconds[part].append(secs)
    return seconds, size


def _publish_config(preset: str):
    from asyncrl.testing.configs import TINY_ENGINE_OVERRIDES, micro_config

    # The smallest engine a replica can serve: weights are what this part measures, not decoding.
    return micro_config(f"model.preset={preset}", *TINY_ENGINE_OVERRIDES)


def publish_here(preset: str, args: argparse.Namespace, root: Path) -> dict | None:
    """This process's part of measuring `preset`'s publication, as the train stage does it: every
    trainer process (this one alone, or each of the processes joined by `jax.distributed`) holds
    the learner on the train mesh (`learner_for`, parameters sharded over every process's
    devices); process 0 starts the replicas and times the publishes while the others follow its
    parameter gathers (`wiring.lockstep.follow`). Returns process 0's row; None elsewhere."""
    from asyncrl.learner.lockstep import of_processes
    from asyncrl.wiring import lockstep
    from asyncrl.wiring.devices import make_placement
    from asyncrl.wiring.episodes import Wiring
    from asyncrl.wiring.training import learner_for

    cfg = _publish_config(preset)
    learner = learner_for(cfg, Wiring.of(cfg), make_placement(cfg), None, of_processes())
    if not learner.lockstep.leader:
        lockstep.follow(learner, None)  # only parameter gathers come: no checkpointer is needed
        return None
    try:
        row = _lead_publishes(cfg, learner, preset, args, root)
    except BaseException:
        lockstep.stop(learner)  # the followers stop waiting for a gather that never comes
        raise
    lockstep.stop(learner, "published")
    return row


def _lead_publishes(cfg, learner, preset: str, args: argparse.Namespace, root: Path) -> dict:
    """Process 0's part: the replicas, the engine, the timed publishes."""
    import jax
    from flax import nnx

    from asyncrl.config import to_yaml
    from asyncrl.model import hf_checkpoint as hf
    from asyncrl.serving.client import RemoteEngine
    from asyncrl.serving.client_settings import ClientSettings
    from asyncrl.serving.replica import start_local_replicas
    from asyncrl.sync.publisher import WeightPublisher

    run = Path(tempfile.mkdtemp(prefix=f"publish-{preset}-", dir=root))
    (run / "config.yaml").write_text(to_yaml(cfg))

    def save_params(params, folder: Path) -> None:  # the trainer's (wiring/training.remote_engine)
        hf.save(nnx.merge(learner.graphdef, params, learner.rest), str(folder))

    t0 = time.perf_counter()
    replicas = start_local_replicas(
        run / "config.yaml", args.replicas, None, run / "replicas", weights_root=run / "weights"
    )
    started_s = time.perf_counter() - t0
    engine = RemoteEngine(
        replicas.addresses, run / "weights", save_params, health_interval_s=0,
        token=replicas.token, settings=ClientSettings.of(cfg),
    )  # fmt: skip
    try:
        seconds, size = _timed_publishes(learner, WeightPublisher(engine), args.publishes)
        served = [r.get("version", -1) for r in engine.health().values()]
    finally:
        engine.close()
        replicas.stop()
        shutil.rmtree(run / "weights", ignore_errors=True)  # the small model's: 2 x 127 MB
    median = {part: statistics.median(secs) for part, secs in seconds.items()}
    return {
        "model": preset,
        "processes": jax.process_count(),
        "params_M": round(size / 4 / 1e6, 2),  # float32 safetensors
        "MB": round(size / 1e6, 2),
        "replicas": args.replicas,
        "served_versions": served,  # each replica's, after the last publish
        "replica_start_s": round(started_s, 1),
        "gather_s": round(median["gather"], 4),
        "write_s": round(median["write"], 3),
        "publish_s": round(median["serve"], 3),
        "publish_s_max": round(max(seconds["serve"]), 3),
        "total_s": round(median["total"], 3),
        "MB_per_s": round(size / 1e6 / median["serve"], 1),
    }


def publish_command(preset: str, args: argparse.Namespace, folder: Path) -> list[str]:
    """What each of N publishing processes runs: this script's `publish_here` for `preset`,
    process 0 writing its row to `<folder>/publish.json`."""
    own = ["--replicas", str(args.replicas), "--publishes", str(args.publishes)]
    return [sys.executable, str(Path(__file__).resolve()), "--publish-process", preset, *own,
            "--publish-dir", str(folder)]  # fmt: skip


def measure_publish(preset: str, args: argparse.Namespace, root: Path, hosts: int = 1) -> dict:
    """`preset`'s publication from a trainer of `hosts` processes: this one alone, or `hosts`
    processes joined by `jax.distributed` on loopback (`run_on_hosts`)."""
    if hosts == 1:
        row = publish_here(preset, args, root)
        assert row is not None  # alone, this process leads
        return row
    folder = Path(tempfile.mkdtemp(prefix=f"publish-{preset}-{hosts}h-", dir=root))
    command = publish_command(preset, args, folder)
    run_on_hosts(command, hosts, folder, root / "jax-cache", args.hosts_timeout)
    return json.loads((folder / "publish.json").read_text())


def _print_publish(rows: list[dict]) -> None:
    print(
        "| model | trainer processes | params (M) | MB | gather s | write s (trainer blocks) "
        "| publish s (replicas) | MB/s | s per publish |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['processes']} | {r['params_M']} | {r['MB']} | {r['gather_s']} "
            f"| {r['write_s']} | {r['publish_s']} | {r['MB_per_s']} | {r['total_s']} |"
        )


# -- 2. and 3. a short run, colocated and remote ---------------------------------------------------


def where_time_goes(summary) -> dict:
    """Shares of the traced loop (a `TraceSummary`): publish, train steps, learner idle, and the
    mean model call of an episode (seconds)."""
    totals = {name: (secs, count) for name, secs, count in summary.by_name}
    span = max(summary.seconds, 1e-9)
    calls_s, calls = totals.get("model call", (0.0, 0))
    publish_s, publishes = totals.get("publish", (0.0, 0))
    return {
        "traced_s": round(summary.seconds, 1),
        "publish_share": round(publish_s / span, 3),
        "publish_s": round(publish_s / publishes, 3) if publishes else None,
        "train_step_share": round(totals.get("train step", (0.0, 0))[0] / span, 3),
        "learner_idle": round(summary.learner_idle, 3),
        "model_call_mean_s": round(calls_s / calls, 3) if calls else None,
    }


def trainer_command(config_file: Path, run_dir: Path) -> list[str]:
    """What each trainer process runs: the train stage alone, as a JobSet trainer pod does."""
    run = ["train", str(config_file), "--run-dir", str(run_dir)]
    return [sys.executable, "-m", "asyncrl.cli", *run]


def trainer_env(process: int, hosts: int, port: int, cache: Path) -> dict[str, str]:
    """Trainer process `process` of `hosts` on loopback: a pod's environment (this Python's, no
    XLA flags), one CPU device, the coordinator on 127.0.0.1:`port` (cloud/distributed.py), and
    the persistent compilation cache `cache` (a run after the first loads its programs)."""
    from asyncrl.cloud.distributed import ENV
    from asyncrl.cloud.local_jobset import image_env

    env = {k: v for k, v in image_env().items() if k not in ENV}
    return env | {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_NUM_PROCESSES": str(hosts),
        "JAX_PROCESS_ID": str(process),
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _why_stop(procs: list[subprocess.Popen], deadline: float, timeout_s: float) -> str | None:
    """Why to stop a multi-process run now (a process failed, time is up), or None."""
    for i, p in enumerate(procs):
        if p.poll() not in (None, 0):
            return f"trainer process {i} exited with {p.returncode}"
    if time.monotonic() > deadline:
        return f"the run took over {timeout_s:.0f} s"
    return None


def run_on_hosts(command: list[str], hosts: int, folder: Path, cache: Path, timeout_s: float):
    """`command` run by `hosts` processes joined on loopback (`trainer_env`, the persistent
    compilation cache `cache`), until every one exits. Each process's output goes to
    `<folder>/trainer-<i>.log`; a failure or a run past `timeout_s` kills every process group (a
    process and the replicas it started) and raises with their tails."""
    port, procs = _free_port(), []
    logs = [folder / f"trainer-{i}.log" for i in range(hosts)]
    for i, log in enumerate(logs):
        with log.open("w") as out:
            procs.append(
                subprocess.Popen(
                    command, env=trainer_env(i, hosts, port, cache), stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            )  # fmt: skip
    deadline, failed = time.monotonic() + timeout_s, None
    try:
        while failed is None and any(p.poll() is None for p in procs):
            time.sleep(0.5)
            failed = _why_stop(procs, deadline, timeout_s)
        failed = failed or _why_stop(procs, float("inf"), timeout_s)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # its own session: the process, its replicas
            p.wait()
    if failed:
        tails = "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}" for log in logs)
        raise RuntimeError(f"{failed}; logs under {folder}:\n{tails}")


def train_on_hosts(cfg, layout, hosts: int, timeout_s: float) -> int:
    """`cfg`'s train stage by `hosts` processes joined on loopback (`run_on_hosts`); the steps
    trained."""
    from asyncrl.config import to_yaml
    from asyncrl.stages.train import TrainResult

    config = layout.write_text(layout.root / "benchmark-config.yaml", to_yaml(cfg))
    command = trainer_command(config, layout.root)
    run_on_hosts(command, hosts, layout.root, layout.root.parent / "jax-cache", timeout_s)
    return layout.read(TrainResult).steps


def measure_training(placement: str, args: argparse.Namespace, root: Path, hosts: int = 1) -> dict:
    """One short run: in this process (1 host), or by `hosts` trainer processes."""
    from asyncrl.metrics.tracker import read_jsonl
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.train import train
    from asyncrl.testing.configs import micro_config
    from asyncrl.tracing.reader import read_packets, summarize

    extra = [f"cluster.rollout_replicas={args.replicas}"] if placement == "remote" else []
    cfg = micro_config(
        f"cluster.placement={placement}", f"learner.steps={args.steps}", *RUN, *extra
    )
    folder = tempfile.mkdtemp(prefix=f"train-{placement}-{hosts}h-", dir=root)
    layout = RunLayout.of(Path(folder))
    t0 = time.perf_counter()
    if hosts == 1:
        steps = train(cfg, layout).steps
    else:
        steps = train_on_hosts(cfg, layout, hosts, args.hosts_timeout)
    wall = time.perf_counter() - t0
    rows = read_jsonl(layout.train_metrics, kind="train")
    span_min = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / 60
    trained = (rows[-1]["step"] - rows[0]["step"]) * cfg.learner.batch_size
    packets, _ = read_packets(layout.trace)
    return {
        "placement": placement,
        "hosts": hosts,
        "steps": steps,
        "wall_s": round(wall, 1),
        "traj_per_min": round(trained / max(span_min, 1e-9), 1),
        "traj_per_min_wall": round(steps * cfg.learner.batch_size / wall * 60, 1),
        **where_time_goes(summarize(packets)),
    }


def _print_training(runs: list[dict]) -> None:
    base = runs[0]
    print(
        "| placement | trainer hosts | steps | traj/min (steady) | × colocated | traj/min (wall) "
        "| wall s | publish | s per publish | train step | learner idle | model call s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        ratio = r["traj_per_min"] / max(base["traj_per_min"], 1e-9)
        print(
            f"| {r['placement']} | {r['hosts']} | {r['steps']} | {r['traj_per_min']} | "
            f"{ratio:.2f} | {r['traj_per_min_wall']} | {r['wall_s']} | "
            f"{100 * r['publish_share']:.1f}% | {r['publish_s']} | "
            f"{100 * r['train_step_share']:.1f}% | {100 * r['learner_idle']:.1f}% | "
            f"{r['model_call_mean_s']} |"
        )


def training_runs(trainer_hosts: int) -> list[tuple[str, int]]:
    """(placement, trainer processes) of the measured runs, the colocated baseline first: the
    remote run on one host, and on `trainer_hosts` when more."""
    runs = [("colocated", 1), ("remote", 1)]
    return runs + ([("remote", trainer_hosts)] if trainer_hosts > 1 else [])


def publish_process(args: argparse.Namespace) -> int:
    """One of the N processes of `measure_publish`: join the others, take part; process 0 writes
    its row to `<--publish-dir>/publish.json`."""
    from asyncrl.cloud.distributed import initialize_from_env

    initialize_from_env()
    row = publish_here(args.publish_process, args, args.publish_dir)
    if row is not None:
        (args.publish_dir / "publish.json").write_text(json.dumps(row))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.publish_process:
        return publish_process(args)
    root = Path(tempfile.mkdtemp(prefix="asyncrl-remote-"))
    trainers = "1 trainer process" + (
        f" (and {args.trainer_hosts} for publication and the last run)"
        if args.trainer_hosts > 1
        else ""
    )
    layout = f"{trainers} + {args.replicas} replica processes on loopback"
    print(json.dumps({"layout": layout, "root": str(root)}), flush=True)
    published = []
    for hosts in sorted({1, args.trainer_hosts}):
        for preset in args.publish_models.split(","):
            published.append(measure_publish(preset, args, root, hosts))
            print(json.dumps(published[-1]), flush=True)
    _print_publish(published)
    if args.skip_training:
        return 0
    # Not counted: compiles the learner's step programs in this process, which both measured runs
    # then reuse (otherwise the first run measured pays them inside its loop).
    warm = measure_training("colocated", args, root)
    print(json.dumps({"warm_up": True, **warm}), flush=True)
    if args.trainer_hosts > 1:  # the same for the trainer processes, through their cache
        warm = measure_training("remote", args, root, args.trainer_hosts)
        print(json.dumps({"warm_up": True, **warm}), flush=True)
    runs = []
    for placement, hosts in training_runs(args.trainer_hosts):
        runs.append(measure_training(placement, args, root, hosts))
        print(json.dumps(runs[-1]), flush=True)
    _print_training(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
