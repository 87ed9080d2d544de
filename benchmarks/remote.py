"""Remote rollout on loopback: weight publication to replicas, and a short run remote vs colocated.

Layout measured: one trainer process and `--replicas` rollout-server processes (default 2) on this
host's loopback, all sharing its CPU cores. The issue's layout has a 2-host trainer as well; two
trainer processes plus two replicas on a 2-core machine measure CPU contention more than the
remote path, so this benchmark keeps the trainer in one process (the remote path is the same).

1. Weight publication, for each `--publish-models` preset: replica processes serving that model,
   and the trainer's real path (`WeightPublisher` → `RemoteEngine.publish`: a safetensors folder
   `v<N>/` written under the weights root, then every replica told its name and loading it). Per
   publish: the seconds the trainer blocks (the write), the seconds until every replica reports
   the new version (health), and MB/s = folder bytes / the latter. One warm-up publish is not
   counted; medians over `--publishes`.
2. Trajectories per minute of the same training run (micro model, `--steps` optimizer steps, no
   evaluation or checkpoints) colocated in one process (the baseline) and with placement remote;
   the ratio remote / colocated. A first colocated run of the same config, not counted, compiles
   the learner's programs in this process, so neither measured run pays them inside its loop.
   Steady rate: trajectories trained between the first and the last step's metrics row over that
   time (the ratio is of these); wall: the whole `train()` call, start-up included (the remote
   run's includes starting its replicas, the colocated one's reuses this process's programs).
3. Where the time goes, from each run's Perfetto trace (`asyncrl.tracing.reader.summarize`): the
   share of the traced loop in publish (the trainer's blocking part), in train steps, the learner
   idle (waiting for groups), and the mean model call as an episode sees it.

    .venv/bin/python benchmarks/remote.py [--quick] [--steps 12] [--publish-models micro,small]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
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
    p.add_argument("--publish-models", default="micro,small", help="model presets for part 1")
    p.add_argument("--publishes", type=int, default=5, help="timed publishes per preset")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps of each training run")
    p.add_argument("--quick", action="store_true", help="micro only, 3 publishes, 6 steps")
    p.add_argument("--skip-training", action="store_true", help="part 1 only")
    args = p.parse_args(argv)
    if args.quick:
        args.publish_models, args.publishes, args.steps = "micro", 3, 6
    if args.replicas < 1 or args.publishes < 1 or args.steps < 2:
        p.error("--replicas and --publishes must be >= 1, --steps >= 2")
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


def _timed_publishes(publisher, params, n: int) -> tuple[list[float], list[float], int]:
    """(seconds the trainer blocked, seconds until every replica serves it, folder bytes) of `n`
    publishes after one warm-up (version 1)."""
    engine, blocked, landed, size = publisher.engine, [], [], 0
    for version in range(1, n + 2):
        t0 = time.perf_counter()
        record = publisher.publish(params, version, version)
        size = sum(f.stat().st_size for f in (engine.weights_dir / f"v{version}").iterdir())
        _wait_for_version(engine, version)
        if version > 1:
            blocked.append(record.seconds)
            landed.append(time.perf_counter() - t0)
    return blocked, landed, size


def measure_publish(preset: str, args: argparse.Namespace, root: Path) -> dict:
    from flax import nnx

    from asyncrl.config import to_yaml
    from asyncrl.model import build_model
    from asyncrl.model import hf_checkpoint as hf
    from asyncrl.serving.client import RemoteEngine
    from asyncrl.serving.client_settings import ClientSettings
    from asyncrl.serving.replica import start_local_replicas
    from asyncrl.sync.publisher import WeightPublisher
    from asyncrl.testing.configs import TINY_ENGINE_OVERRIDES, micro_config

    # The smallest engine a replica can serve: weights are what this part measures, not decoding.
    cfg = micro_config(f"model.preset={preset}", *TINY_ENGINE_OVERRIDES)
    run = Path(tempfile.mkdtemp(prefix=f"publish-{preset}-", dir=root))
    (run / "config.yaml").write_text(to_yaml(cfg))
    graphdef, params, rest = nnx.split(build_model(cfg.model, seed=0), nnx.Param, ...)

    def save_params(p, folder: Path) -> None:  # the trainer's (wiring/training.remote_engine)
        hf.save(nnx.merge(graphdef, p, rest), str(folder))

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
        blocked, landed, size = _timed_publishes(WeightPublisher(engine), params, args.publishes)
    finally:
        engine.close()
        replicas.stop()
        shutil.rmtree(run / "weights", ignore_errors=True)  # the small model's: 2 x 127 MB
    median = statistics.median(landed)
    return {
        "model": preset,
        "params_M": round(size / 4 / 1e6, 2),  # float32 safetensors
        "MB": round(size / 1e6, 2),
        "replicas": args.replicas,
        "replica_start_s": round(started_s, 1),
        "write_s": round(statistics.median(blocked), 3),
        "publish_s": round(median, 3),
        "publish_s_max": round(max(landed), 3),
        "MB_per_s": round(size / 1e6 / median, 1),
    }


# -- 2. and 3. a short run, colocated and remote ---------------------------------------------------


def where_time_goes(summary) -> dict:
    """Shares of the traced loop (a `TraceSummary`): publish, train steps, learner idle, and the
    mean model call of an episode (seconds)."""
    totals = {name: (secs, count) for name, secs, count in summary.by_name}
    span = max(summary.seconds, 1e-9)
    calls_s, calls = totals.get("model call", (0.0, 0))
    return {
        "traced_s": round(summary.seconds, 1),
        "publish_share": round(totals.get("publish", (0.0, 0))[0] / span, 3),
        "train_step_share": round(totals.get("train step", (0.0, 0))[0] / span, 3),
        "learner_idle": round(summary.learner_idle, 3),
        "model_call_mean_s": round(calls_s / calls, 3) if calls else None,
    }


def measure_training(placement: str, args: argparse.Namespace, root: Path) -> dict:
    from asyncrl.metrics.tracker import read_jsonl
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.train import train
    from asyncrl.testing.configs import micro_config
    from asyncrl.tracing.reader import read_packets, summarize

    extra = [f"cluster.rollout_replicas={args.replicas}"] if placement == "remote" else []
    cfg = micro_config(
        f"cluster.placement={placement}", f"learner.steps={args.steps}", *RUN, *extra
    )
    layout = RunLayout.of(Path(tempfile.mkdtemp(prefix=f"train-{placement}-", dir=root)))
    t0 = time.perf_counter()
    result = train(cfg, layout)
    wall = time.perf_counter() - t0
    rows = read_jsonl(layout.train_metrics, kind="train")
    span_min = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / 60
    trained = (rows[-1]["step"] - rows[0]["step"]) * cfg.learner.batch_size
    packets, _ = read_packets(layout.trace)
    return {
        "placement": placement,
        "steps": result.steps,
        "wall_s": round(wall, 1),
        "traj_per_min": round(trained / max(span_min, 1e-9), 1),
        "traj_per_min_wall": round(result.steps * cfg.learner.batch_size / wall * 60, 1),
        **where_time_goes(summarize(packets)),
    }


def _print_training(runs: list[dict]) -> None:
    base = runs[0]
    print(
        "| placement | steps | traj/min (steady) | × colocated | traj/min (wall) | wall s | "
        "publish | train step | learner idle | model call s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        ratio = r["traj_per_min"] / max(base["traj_per_min"], 1e-9)
        print(
            f"| {r['placement']} | {r['steps']} | {r['traj_per_min']} | {ratio:.2f} | "
            f"{r['traj_per_min_wall']} | {r['wall_s']} | {100 * r['publish_share']:.1f}% | "
            f"{100 * r['train_step_share']:.1f}% | {100 * r['learner_idle']:.1f}% | "
            f"{r['model_call_mean_s']} |"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="asyncrl-remote-"))
    layout = f"1 trainer + {args.replicas} replica processes on loopback (no 2-host trainer)"
    print(json.dumps({"layout": layout, "root": str(root)}), flush=True)
    published = []
    for preset in args.publish_models.split(","):
        published.append(measure_publish(preset, args, root))
        print(json.dumps(published[-1]), flush=True)
    print("| model | params (M) | MB | write s (trainer blocks) | publish s (replicas) | MB/s |")
    print("|---|---|---|---|---|---|")
    for r in published:
        print(
            f"| {r['model']} | {r['params_M']} | {r['MB']} | {r['write_s']} | "
            f"{r['publish_s']} | {r['MB_per_s']} |"
        )
    if args.skip_training:
        return 0
    # Not counted: compiles the learner's step programs in this process, which both measured runs
    # then reuse (otherwise the first run measured pays them inside its loop).
    warm = measure_training("colocated", args, root)
    print(json.dumps({"warm_up": True, **warm}), flush=True)
    runs = []
    for placement in ("colocated", "remote"):
        runs.append(measure_training(placement, args, root))
        print(json.dumps(runs[-1]), flush=True)
    _print_training(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
