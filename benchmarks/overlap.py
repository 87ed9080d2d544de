"""Sync vs async, colocated vs disaggregated: the same RL run for the same wall-clock budget.

Four runs of the train stage on `configs/local.yaml` (from the same starting model), each for
`--seconds` of training with injected environment latency (lognormal, p50 `--latency`, p99 10×),
on the same device budget (`--devices` virtual CPU devices: colocated shares them all, with a lock
that pauses decoding during a train step; disaggregated gives half to the engine, half to the
learner). Printed per run: learner idle fraction, complete groups per minute, optimizer steps per
minute and the held-out solve rate at the end (greedy), and the ratio of steps per minute to the
baseline (sync colocated) measured in the same invocation. Target (issue 5): async disaggregated
≥ 1.8× the steps per minute of sync colocated at the same final solve rate (± 3 points).

    .venv/bin/python benchmarks/overlap.py [--seconds 120] [--init-model runs/<id>/warm_start/model]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

RUNS = (
    ("sync", "colocated"),
    ("async", "colocated"),
    ("sync", "disaggregated"),
    ("async", "disaggregated"),
)


CONFIG = Path(__file__).resolve().parent.parent / "configs" / "local.yaml"


def newest_warm_start() -> str | None:
    found = sorted(Path("runs").glob("*/warm_start/model/model.safetensors"))
    return str(found[-1].parent) if found else None


def one(mode: str, placement: str, args, root: Path) -> dict:
    from asyncrl.config import load_config
    from asyncrl.metrics.tracker import read_jsonl
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.train import train

    half = args.devices // 2
    cfg = load_config(
        CONFIG,
        [
            f"learner.mode={mode}",
            f"learner.max_staleness={0 if mode == 'sync' else 1}",
            f"cluster.placement={placement}",
            f"cluster.rollout_devices={half if placement == 'disaggregated' else 0}",
            f"cluster.train_devices={half if placement == 'disaggregated' else 0}",
            "learner.steps=100000",
            f"learner.time_budget_s={args.seconds}",
            "learner.eval_every=0",
            f"env.heldout_size={args.heldout}",
            f"env.latency_p50_s={args.latency}",
            f"env.latency_p99_s={10 * args.latency}",
            "checkpoint.every_steps=0",
            "tracing.enabled=false",
            "tracing.tensorboard=false",
            *args.override,
        ],
    )
    run = Path(tempfile.mkdtemp(prefix=f"{mode}-{placement}-", dir=root))
    layout = RunLayout.of(run).create()
    result = train(cfg, layout, init_model=args.init_model)
    rows = read_jsonl(layout.train_metrics, kind="train")
    span_min = max((rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / 60, 1e-9) if rows else 1.0
    return {
        "mode": mode,
        "placement": placement,
        "steps": result.steps,
        "steps_per_min": round((len(rows) - 1) / span_min, 2) if len(rows) > 1 else 0.0,
        "groups_per_min": round(rows[-1]["groups_per_min"], 1) if rows else 0.0,
        "learner_idle": round(result.learner_idle_fraction, 3),
        "solve_rate_start": result.initial_solve_rate,
        "solve_rate_end": result.final_solve_rate,
        "policy_lag_mean": round(result.policy_lag_mean, 2),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--latency", type=float, default=0.3)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--heldout", type=int, default=32)
    p.add_argument("--init-model", default=None)
    p.add_argument(
        "--override", action="append", default=[], help="KEY=VALUE on top of the runs' settings"
    )
    args = p.parse_args(argv)
    args.init_model = args.init_model or newest_warm_start()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    root = Path(tempfile.mkdtemp(prefix="asyncrl-overlap-"))
    print(json.dumps({"init_model": args.init_model, "seconds": args.seconds}), flush=True)
    results = []
    for mode, placement in RUNS:
        r = one(mode, placement, args, root)
        results.append(r)
        print(json.dumps(r), flush=True)
    base = results[0]["steps_per_min"] or 1e-9
    for r in results:
        r["steps_per_min_vs_sync_colocated"] = round(r["steps_per_min"] / base, 2)
    print(
        "| mode | placement | steps/min | × sync colocated | groups/min | learner idle | "
        "solve rate start → end |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['mode']} | {r['placement']} | {r['steps_per_min']} | "
            f"{r['steps_per_min_vs_sync_colocated']} | {r['groups_per_min']} | "
            f"{r['learner_idle']} | {100 * r['solve_rate_start']:.1f}% → "
            f"{100 * r['solve_rate_end']:.1f}% |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
