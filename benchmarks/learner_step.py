"""The RL learner step on a device mesh: seconds per step with the batch's rows split over the
data x fsdp devices (what `Learner` does) against the same step with the batch replicated on every
device (how it placed batches before commit 6422ee1: FSDP without data parallelism, each device
computing on every row), both measured in this run.

The demo's learner on `configs/local.yaml` (the mini model, the k3 reference forward on): one batch
of 8 groups of 8 synthetic trajectories of 60-240 tokens (the demo's steps hold ~7,000-8,000
tokens), `--steps` steps per configuration after the first. Printed per mesh size and placement:
the first step (compilation included), the second (a second compilation would show here), the
median of the rest, and the replicated/split ratio of the medians.

    .venv/bin/python benchmarks/learner_step.py [--devices 1,2,4] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def measure(n: int, split: bool, steps: int) -> dict[str, object]:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from asyncrl.config import load_config
    from asyncrl.learner.learner import Learner
    from asyncrl.model import build_model
    from asyncrl.model.sharding import make_mesh
    from asyncrl.testing.trajectories import random_groups

    cfg = load_config("configs/local.yaml")
    mesh = make_mesh(jax.devices()[:n])
    learner = Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=512, mesh=mesh)
    if not split:  # the baseline: the whole batch on every device
        whole = NamedSharding(mesh, PartitionSpec())
        learner._place = lambda batch: jax.device_put(batch, whole)
    batch = learner.batch_from_groups(random_groups(8, 8, lengths=(60, 240), prompt=40))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        learner.rl_step(batch)
        times.append(time.perf_counter() - start)
    return {
        "devices": n,
        "placement": "rows split" if split else "replicated",
        "shape": list(batch.inputs.shape),
        "first_s": round(times[0], 2),
        "second_s": round(times[1], 2),
        "median_s": round(statistics.median(times[1:]), 2),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", default="1,2,4")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: "n,split"
    args = p.parse_args(argv)
    if args.one:
        n, split = args.one.split(",")
        print(json.dumps(measure(int(n), split == "1", args.steps)))
        return 0
    import subprocess

    rows = []
    for n in (int(x) for x in args.devices.split(",")):
        for split in (False, True):  # each in its own process: its own compilations and devices
            env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
            cmd = [
                sys.executable,
                __file__,
                "--one",
                f"{n},{int(split)}",
                "--steps",
                str(args.steps),
            ]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(
        "| devices | placement | batch [M, R, T] | first step s | second s | median s | speed-up |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(
            r for r in rows if r["devices"] == row["devices"] and r["placement"] == "replicated"
        )
        ratio = round(base["median_s"] / row["median_s"], 2)
        print(
            f"| {row['devices']} | {row['placement']} | {row['shape']} | {row['first_s']} | "
            f"{row['second_s']} | {row['median_s']} | {ratio} |"
        )
    print(json.dumps({"command": "learner_step", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
