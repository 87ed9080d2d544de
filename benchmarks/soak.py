"""Soak: long async runs at several staleness bounds, under a watchdog; repeated disaggregated runs.

Each run is a child process (`asyncrl train` on the micro model: the concurrency, not the model, is
under test) with injected environment latency and a weight publish after every step. The parent
is the watchdog: it follows the child's metrics file and kills the child (after dumping its Python
stacks with SIGABRT → faulthandler) when no step lands for `--stall` seconds. Reported per run:
completed or hung, steps, seconds, mean steps/s, stale groups dropped, max policy lag seen.

Part 1: `max_staleness` 0, 1, 2, 4 — `--steps` (≥ 200) steps each, colocated.
Part 2: the disaggregated placement (engine and learner on disjoint virtual devices), `--repeat`
runs in a row of `--short-steps` steps: all must complete.

    .venv/bin/python benchmarks/soak.py [--steps 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncrl.testing.configs import MICRO_OVERRIDES

MICRO = [
    *MICRO_OVERRIDES,
    "rollout.max_concurrency=16",
    "rollout.engine_slots=16",
    "learner.eval_every=0",
    "learner.time_budget_s=0",
    "learner.sync_every=1",
    "env.heldout_size=1",
    "checkpoint.every_steps=50",
    "tracing.enabled=false",
    "tracing.tensorboard=false",
    "warm_start.content_steps=0",
    "warm_start.steps=0",
]


def steps_logged(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    rows = []
    for line in metrics.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return [r for r in rows if r.get("kind") == "train"]


def run_child(overrides: list[str], stall_s: float, root: Path, label: str) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=root))
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        "configs/local.yaml",
        *MICRO,
        *overrides,
        "--run-dir",
        str(run_dir),
    ]
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    log = (run_dir / "child.log").open("w")
    start = time.monotonic()
    child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    metrics = run_dir / "train" / "metrics.jsonl"
    last_count, last_change, hung = 0, time.monotonic(), False
    while child.poll() is None:
        time.sleep(1.0)
        count = len(steps_logged(metrics))
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            hung = True
            child.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            time.sleep(2)
            child.kill()
            break
    child.wait()
    rows = steps_logged(metrics)
    seconds = time.monotonic() - start
    return {
        "run": label,
        "completed": child.returncode == 0 and not hung,
        "hung": hung,
        "returncode": child.returncode,
        "steps": len(rows),
        "seconds": round(seconds, 1),
        "steps_per_s": round(len(rows) / max(rows[-1]["elapsed_s"], 1e-9), 2) if rows else 0.0,
        "stale_groups_dropped": int(rows[-1]["groups_dropped_stale"]) if rows else 0,
        "max_policy_lag": max((int(r["policy_lag_max"]) for r in rows), default=0),
        "log": str(run_dir / "child.log"),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--staleness", default="0,1,2,4")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--short-steps", type=int, default=30)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--stall", type=float, default=120.0)
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="asyncrl-soak-"))
    latency = [f"env.latency_p50_s={args.latency}", f"env.latency_p99_s={10 * args.latency}"]
    results = []
    for s in (int(x) for x in args.staleness.split(",")):
        r = run_child(
            [
                f"learner.steps={args.steps}",
                "learner.mode=async",
                f"learner.max_staleness={s}",
                *latency,
            ],
            args.stall,
            root,
            f"staleness-{s}",
        )
        results.append(r)
        print(json.dumps(r), flush=True)
    for i in range(args.repeat):
        r = run_child(
            [
                f"learner.steps={args.short_steps}",
                "learner.mode=async",
                "learner.max_staleness=1",
                "cluster.placement=disaggregated",
                "cluster.rollout_devices=2",
                "cluster.train_devices=2",
                *latency,
            ],
            args.stall,
            root,
            f"disaggregated-{i + 1}",
        )
        results.append(r)
        print(json.dumps(r), flush=True)
    ok = all(r["completed"] for r in results)
    print(
        f"soak: {'all runs completed' if ok else 'FAILURES'}; "
        f"{sum(r['completed'] for r in results)}/{len(results)} completed, "
        f"{sum(r['hung'] for r in results)} hung"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
