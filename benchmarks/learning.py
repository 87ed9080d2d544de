"""Learning lab: one warm start, then RL variants (or more SFT) from it, each measured honestly.

Three subcommands over `configs/local.yaml` plus dotted overrides:

    warm OUT [key=value ...]            the warm-start stage into run folder OUT, then `eval`
    rl WARM OUT [key=value ...]         the train stage from WARM's warm-start model into OUT,
                                        then `eval` of the trained model
    eval MODEL [key=value ...]          evaluate an HF model folder
    modes WARM OUT [key=value ...]      sync-colocated, async-colocated and async-disaggregated
                                        RL from WARM, `--seeds` seeds each (child processes on
                                        `--devices` virtual CPU devices): the held-out curve
                                        against steps and against training wall time (evaluation
                                        time excluded), and each mode's time to warm start + 5
                                        points, as a ratio to sync-colocated (a run folder
                                        that already holds a model is read, not rerun)

`eval` runs greedy episodes on `--heldout` held-out tasks per family (the Wilson interval of the
greedy solve rate is what the demo's claim rests on) and `--samples` episodes at T = 1 on the first
`--train-tasks` training tasks per family (pass@1 and pass@k at T = 1: how much signal GRPO has).
Each subcommand prints one JSON line: the rates with their 95% intervals, per family, the greedy
failure breakdown and the seconds it took. RL runs use a step budget (`learner.steps`); the
script sets `learner.time_budget_s=0` (no wall-clock budget) unless told otherwise.

    .venv/bin/python benchmarks/learning.py warm /tmp/lab/ws warm_start.verbose_fraction=0
    .venv/bin/python benchmarks/learning.py rl /tmp/lab/ws /tmp/lab/rl1 learner.steps=30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from asyncrl.config import RunConfig, load_config
from asyncrl.envs.tasks import heldout, task_stream
from asyncrl.gates.evaluation import EvalSummary, evaluate_heldout, run_episodes, summarize
from asyncrl.metrics.tracker import read_jsonl
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.run_layout import RunLayout
from asyncrl.tokenize import ChatFormat
from asyncrl.types import Task, Trajectory
from asyncrl.wiring.episodes import Wiring

CONFIG = "configs/local.yaml"
# The modes `modes` compares, each as (learner.mode, cluster.placement); the first is the baseline.
MODES = (("sync", "colocated"), ("async", "colocated"), ("async", "disaggregated"))
TARGET_GAIN = 0.05  # time to quality: the first evaluation at warm start + 5 points


def config(overrides: list[str]) -> RunConfig:
    return load_config(CONFIG, ["learner.time_budget_s=0", *overrides])


def _rates(summary: EvalSummary, greedy_only: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    for r in (summary.overall, *summary.families):
        picked = {"greedy": r.greedy} if greedy_only else {"t1": r.sampled, "pass@k": r.pass_k}
        for name, e in picked.items():
            out[f"{name}/{r.family}"] = e.text() if e is not None else None
    if greedy_only:
        out["failed"] = dict(summary.overall.greedy_failures)
    return out


async def _evaluate(cfg: RunConfig, model_dir: str, heldout_n: int, train_n: int, k: int):
    wiring = Wiring.of(cfg)
    model = build_model(cfg.model, seed=cfg.seed)
    hf.load_into(model, model_dir)
    engine = wiring.engine(model)
    common = dict(
        make_env=wiring.make_env,
        make_agent=wiring.make_agent,
        limits=wiring.limits(),
        concurrency=cfg.rollout.max_concurrency,
        seed=cfg.seed,
    )
    try:
        engine.warmup()
        tasks = heldout(cfg.env.tasks, heldout_n, cfg.env.seed)
        greedy = await run_episodes(
            engine, tasks, sampling=wiring.sampling(0.0), tag="lab-heldout-greedy", **common
        )
        held = summarize(tasks, greedy, confidence=0.95)
        out = _rates(held, greedy_only=True)
        out.update(lookups(tasks, [g[0] for g in greedy], wiring.fmt))
        if train_n and k:
            train = list(task_stream(cfg.env.tasks, "train", train_n, cfg.env.seed))
            sampled = await evaluate_heldout(
                engine,
                train,
                sampling=wiring.sampling(1.0),
                samples=k,
                confidence=0.95,
                tag="lab-train",
                **common,
            )
            out.update(_rates(sampled, greedy_only=False))
        return out
    finally:
        engine.close()


def lookups(tasks: list[Task], episodes: list[Trajectory], fmt: ChatFormat) -> dict[str, object]:
    """Greedy lookup episodes by how many lookup calls they made (a student of the privileged
    teacher, `warm_start.privileged_fraction`, makes one and invents the other price, or looks
    both up), with their solve rates."""
    calls: dict[int, list[float]] = {}
    for task, episode in zip(tasks, episodes, strict=True):
        if task.family == "lookup":
            n = fmt.tok.decode(list(episode.tokens)).count('"name": "lookup"')
            calls.setdefault(n, []).append(episode.reward)
    return {
        f"lookup_calls={n}": f"{len(r)} episodes, solved {100 * sum(r) / len(r):.1f}%"
        for n, r in sorted(calls.items())
    }


def evaluate(cfg: RunConfig, model_dir: str, args) -> dict[str, object]:
    start = time.monotonic()
    out = asyncio.run(_evaluate(cfg, model_dir, args.heldout, args.train_tasks, args.samples))
    return {"model": model_dir, **out, "eval_s": round(time.monotonic() - start, 1)}


def mode_overrides(mode: str, placement: str, devices: int) -> list[str]:
    half = devices // 2 if placement == "disaggregated" else 0
    return [
        f"learner.mode={mode}",
        f"learner.max_staleness={0 if mode == 'sync' else 1}",
        f"cluster.placement={placement}",
        f"cluster.rollout_devices={half}",
        f"cluster.train_devices={half}",
        "checkpoint.every_steps=0",
        "tracing.enabled=false",
    ]


def curve(run: Path) -> list[dict[str, float]]:
    """A run's held-out evaluations: step, solve rate with the interval its evaluation recorded,
    and training wall time since the first evaluation (the run's elapsed time minus the time its
    evaluations took and minus its start-up, `startup_s`: building the engine and compiling
    before step 1)."""
    out, spent, startup = [], 0.0, None
    for row in read_jsonl(run / "train" / "metrics.jsonl", kind="eval"):
        spent += row.get("eval_s", 0.0)
        wall = row["elapsed_s"] - spent
        startup = wall if startup is None else startup
        out.append(
            {
                "step": row["step"],
                "train_s": round(wall - startup, 1),
                "startup_s": round(startup, 1),
                "solve_rate": row["solve_rate"],
                "low": row["solve_rate_low"],
                "high": row["solve_rate_high"],
            }
        )
    return out


def time_to(points: list[dict[str, float]], target: float) -> float | None:
    return next((p["train_s"] for p in points if p["solve_rate"] >= target), None)


def modes(warm: str, out: Path, overrides: list[str], args) -> dict[str, object]:
    """Every mode for every seed, each a child process (its own XLA device count), then the
    summary: per mode the curves, the final solve rate and the time to warm start + 5 points."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}"}
    runs: dict[str, list[list[dict[str, float]]]] = {}
    for seed in range(args.seeds):
        for mode, placement in MODES:
            name = f"{mode}-{placement}"
            run = out / f"{name}-seed{seed}"
            if not (run / "train" / "model").is_dir():
                extra = [f"seed={seed}", *mode_overrides(mode, placement, args.devices)]
                cmd = [sys.executable, __file__, "train", warm, str(run), *overrides, *extra]
                subprocess.run(cmd, check=True, env=env)
            runs.setdefault(name, []).append(curve(run))
    base_name = "-".join(MODES[0])
    summary: dict[str, object] = {}
    for name, curves in runs.items():
        target = [c[0]["solve_rate"] + TARGET_GAIN for c in curves]
        times = [time_to(c, t) for c, t in zip(curves, target, strict=True)]
        reached = [t for t in times if t is not None]
        summary[name] = {
            "start": [c[0]["solve_rate"] for c in curves],
            "final": [(c[-1]["solve_rate"], c[-1]["low"], c[-1]["high"]) for c in curves],
            "final_mean": statistics.fmean(c[-1]["solve_rate"] for c in curves),
            "steps": [c[-1]["step"] for c in curves],
            "train_s": [c[-1]["train_s"] for c in curves],
            "startup_s": [c[0]["startup_s"] for c in curves],
            "time_to_target_s": times,
            # Over the seeds that reached the target (`reached` says how many did).
            "time_to_target_mean_s": statistics.fmean(reached) if reached else None,
            "reached": f"{len(reached)}/{len(times)}",
            "curves": curves,
        }
    base = summary[base_name]["time_to_target_mean_s"]
    for row in summary.values():
        t = row["time_to_target_mean_s"]
        row["time_to_target_vs_sync_colocated"] = round(t / base, 2) if t and base else None
    return summary


def print_modes(summary: dict[str, dict]) -> None:
    print(
        "| mode | start | final (95% Wilson) per seed | training s to start + 5 pts per seed | "
        "mean × sync colocated | start-up s |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in summary.items():
        finals = ", ".join(
            f"{100 * v:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]" for v, lo, hi in r["final"]
        )
        times = ", ".join("—" if t is None else f"{t:.0f}" for t in r["time_to_target_s"])
        start = ", ".join(f"{100 * v:.1f}%" for v in r["start"])
        startup = ", ".join(f"{t:.0f}" for t in r["startup_s"])
        ratio = r["time_to_target_vs_sync_colocated"]
        print(f"| {name} | {start} | {finals} | {times} | {ratio} | {startup} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", choices=("warm", "rl", "eval", "modes", "train"))
    p.add_argument("paths", nargs="+", help="folders, then key=value overrides")
    p.add_argument("--heldout", type=int, default=256, help="held-out tasks per family (greedy)")
    p.add_argument("--train-tasks", type=int, default=64, help="training tasks per family (T=1)")
    p.add_argument("--samples", type=int, default=4, help="T=1 samples per training task")
    p.add_argument("--seeds", type=int, default=3, help="modes: seeds per mode")
    p.add_argument("--devices", type=int, default=4, help="modes: virtual CPU devices per run")
    args = p.parse_args()
    paths = [x for x in args.paths if "=" not in x]
    overrides = [x for x in args.paths if "=" in x]
    cfg = config(overrides)
    start = time.monotonic()
    result: dict[str, object] = {"command": args.command, "overrides": overrides}
    if args.command == "warm":
        from asyncrl.stages.warm_start import warm_start

        layout = RunLayout.of(paths[0]).create()
        ws = warm_start(cfg, layout)
        result.update(stage_s=ws.seconds, final_loss=round(ws.final_loss, 4))
        result.update(evaluate(cfg, str(layout.warm_start_model), args))
    elif args.command == "modes":
        summary = modes(paths[0], Path(paths[1]), overrides, args)
        print_modes(summary)
        result["modes"] = summary
    elif args.command in ("rl", "train"):  # train: the stage only, no evaluation after it
        from asyncrl.stages.train import train

        init = str(RunLayout.of(paths[0]).warm_start_model)
        layout = RunLayout.of(paths[1]).create()
        tr = train(cfg, layout, init_model=init)
        result.update(stage_s=tr.seconds, steps=tr.steps, no_signal=tr.groups_no_signal)
        result.update(stage_initial=tr.initial_solve_rate, stage_final=tr.final_solve_rate)
        if args.command == "rl":
            result.update(evaluate(cfg, str(layout.train_model), args))
    else:
        result.update(evaluate(cfg, paths[0], args))
    result["total_s"] = round(time.monotonic() - start, 1)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
