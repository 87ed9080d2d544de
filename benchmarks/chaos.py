"""Chaos: the local train stage for `--seconds` while tools and environments misbehave on purpose.

Runs `asyncrl.stages.train.train` in this process on the micro model (the concurrency, not the
model, is under test) with the built-in "tool" environment replaced, for this process only, by a
chaos wrapper (`benchmarks/chaos_parts.py`, next to this file) that it registers:

- the factory raises; `reset`, `step` and `close` raise; `reset` and `close` hang while ignoring
  cancellation (the episode must still end, the close must not hold it);
- tools hang (a sync tool sleeping in its thread, an async tool swallowing every cancellation),
  raise with a 5 MB message, and flood 10 MB of output. An untrained model rarely writes a
  well-formed call, so on a share of its turns the environment itself calls one of these tools
  through the real `ToolExecutor`, exactly as a model's call would run.

With `--remote`, rollout runs on two local replica processes (`cluster.placement=remote`); one
receives garbage (random bytes, an oversized line, no token, a bad request, deep nesting, silence)
and later the other is killed with SIGKILL; training must go on, on the survivor.

The benchmark observes the loop (group issue/finish, the learner's waits) by subclassing
`TrainingLoop` in the train stage's namespace; nothing in the product is changed. Invariants, each
a nonzero exit when broken:
  - every group number issued is finished exactly once, and nothing is finished unissued;
  - every environment that was built was closed exactly once (an episode closes its environment
    exactly when its status is decided) and every training episode's status was counted;
  - every injected hang was bounded and counted: each async tool hang, reset hang and close hang
    dropped after its grace, each sync tool hang's thread abandoned;
  - the learner never waited more than `MAX_IDLE_S` for a batch, and took at least one step;
  - the run finished (train returned) within `--seconds` plus `FINISH_SLACK_S`;
  - with --remote: the killed replica was marked lost and training continued after the kill.

    .venv/bin/python benchmarks/chaos.py [--seconds 180] [--remote] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

# Run as a script: this file's folder is on sys.path.
from chaos_parts import RNG, TALLY, Rates, RemoteChaos, install_chaos

from asyncrl.metrics.tracker import read_jsonl
from asyncrl.run_layout import RunLayout
from asyncrl.testing.configs import micro_config
from asyncrl.tools import deadlines, threads
from asyncrl.types import GroupOutcome, TrajectoryStatus

MAX_IDLE_S = 30.0  # the longest the learner may wait for a batch
FINISH_SLACK_S = 240.0  # final evaluation, model export, plots after the time budget


# -- observing the loop -------------------------------------------------------------------------


def recording_loop_class():
    """A TrainingLoop that records group issue/finish by number and the learner's waits."""
    from asyncrl.learner.loop import TrainingLoop

    class RecordingLoop(TrainingLoop):
        instances: ClassVar[list] = []

        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            self.issued: list[int] = []
            self.finished: list[tuple[int, GroupOutcome]] = []
            self.waits: list[tuple[float, float, bool]] = []  # (start, seconds, got a batch)
            self.started_at = time.monotonic()
            self.ended_at = 0.0
            RecordingLoop.instances.append(self)

        def issue(self, number: int) -> None:
            self.issued.append(number)
            super().issue(number)

        def finish(self, number: int, outcome: GroupOutcome) -> None:
            self.finished.append((number, outcome))
            super().finish(number, outcome)

        async def run(self, *args, **kw):
            try:
                return await super().run(*args, **kw)
            finally:
                self.ended_at = time.monotonic()

        async def _collect(self, producer, deadline):
            t0 = time.monotonic()
            groups = await super()._collect(producer, deadline)
            self.waits.append((t0, time.monotonic() - t0, groups is not None))
            return groups

    return RecordingLoop


def install_recording():
    """Put the recording loop wherever the train stage's modules name `TrainingLoop`."""
    import asyncrl.learner.loop
    import asyncrl.stages.train  # loads every module that builds the loop

    original = asyncrl.learner.loop.TrainingLoop
    cls = recording_loop_class()
    for name, module in list(sys.modules.items()):
        named = getattr(module, "TrainingLoop", None) is original
        if name.startswith("asyncrl.") and name != "asyncrl.learner.loop" and named:
            module.TrainingLoop = cls
    return cls


# -- the run -------------------------------------------------------------------------------------


def overrides(seconds: float, remote: bool) -> list[str]:
    out = [
        "learner.steps=1000000",
        f"learner.time_budget_s={seconds}",
        "learner.eval_every=0",
        "env.heldout_size=2",
        "env.train_size=256",
        "env.episode_timeout_s=15",
        "env.tool_timeout_s=1",
        "env.tool_workers=4",
        "checkpoint.every_steps=0",
        "tracing.enabled=false",
        "tracing.tensorboard=false",
    ]
    if remote:
        out += ["cluster.placement=remote", "cluster.rollout_replicas=2"]
    return out


class Counting(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.name] += 1


def check(name: str, ok: bool, detail: str, failures: list[str]) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}")
    if not ok:
        failures.append(name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--remote", action="store_true", help="also garbage and kill a remote replica")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the summary JSON here")
    args = p.parse_args(argv)
    RNG.seed(args.seed)

    import asyncrl.stages.train as train_stage

    counting = Counting()
    logging.getLogger().addHandler(counting)
    logging.getLogger("asyncrl").setLevel(logging.WARNING)
    install_chaos(Rates())
    loop_class = install_recording()
    remote = RemoteChaos(args.seconds) if args.remote else None
    if remote is not None:
        remote.install()
    cfg = micro_config(*overrides(args.seconds, args.remote))
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="chaos-"))
    t0 = time.monotonic()
    result = train_stage.train(cfg, RunLayout.of(root).create())
    wall = time.monotonic() - t0
    loop = loop_class.instances[-1]
    return report(args, cfg, loop, result, wall, remote, counting, load_before, root)


def report(args, cfg, loop, result, wall, remote, counting, load_before, root) -> int:
    failures: list[str] = []
    evals = read_jsonl(RunLayout.of(root).train_metrics, kind="eval")
    eval_episodes = int(sum(r["episodes"] for r in evals))
    orch = loop.orchestrator
    statuses = {s.value: n for s, n in sorted(orch.status_counts.items())}
    outcomes = collections.Counter(o.value for _, o in loop.finished)
    issued, finished = loop.issued, [n for n, _ in loop.finished]
    pool = threads.shared(cfg.env.tool_workers).stats()
    waits = [(round(t - loop.waits[0][0], 1), round(s, 2), got) for t, s, got in loop.waits]
    max_wait = max((s for _, s, _ in waits), default=0.0)
    summary = {
        "seconds": args.seconds,
        "wall_s": round(wall, 1),
        "loop_s": round(loop.ended_at - loop.started_at, 1),
        "remote": bool(remote),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "steps": result.steps,
        "episodes_by_status": statuses,
        "groups_issued": len(issued),
        "groups_finished": len(finished),
        "groups_by_outcome": dict(sorted(outcomes.items())),
        "queue": {"released": orch.queue.released, "dropped": orch.queue.dropped},
        "env_build_failures": orch.env_build_failures,
        "env_close_failures": orch.env_close_failures,
        "member_failures": orch.member_failures,
        "injected": dict(sorted(TALLY.injected.items())),
        "envs_built": len(TALLY.built),
        "factory_calls": TALLY.factory_calls,
        "eval_episodes": eval_episodes,
        "dropped_after_grace": dict(deadlines.DROPPED),
        "tool_threads": {
            "workers": pool.workers,
            "threads_now": pool.threads,
            "abandoned_total": pool.abandoned_total,
            "abandoned_now": pool.abandoned_now,
            "skipped_total": pool.skipped_total,
        },
        "learner_max_wait_s": round(max_wait, 2),
        "learner_first_wait_s": waits[0][1] if waits else None,
        "learner_idle_fraction": result.learner_idle_fraction,
        "warnings_logged": dict(counting.counts),
        "run_dir": str(root),
    }
    if remote is not None:
        engine = orch.engine
        summary["remote_garbage"] = remote.garbage
        summary["remote_killed"] = remote.killed
        summary["remote_lost"] = list(engine.lost)
    print(json.dumps(summary, indent=1))
    print("invariants:")
    dup_issued = [n for n, k in collections.Counter(issued).items() if k > 1]
    dup_finished = [n for n, k in collections.Counter(finished).items() if k > 1]
    check(
        "no group issued twice",
        not dup_issued,
        f"{len(issued)} issued, dup {dup_issued[:5]}",
        failures,
    )
    check("no group finished twice", not dup_finished, f"dup {dup_finished[:5]}", failures)
    lost = sorted(set(issued) - set(finished))
    extra = sorted(set(finished) - set(issued))
    check("no group lost", not lost, f"unfinished {lost[:5]}", failures)
    check("nothing finished unissued", not extra, f"{extra[:5]}", failures)
    closes = collections.Counter(e.close_calls for e in TALLY.built)
    check(
        "every environment closed exactly once",
        set(closes) <= {1},
        f"{len(TALLY.built)} built; close calls per env {dict(closes)}",
        failures,
    )
    counted = sum(orch.status_counts.values())
    cancelled = orch.status_counts[TrajectoryStatus.CANCELLED]
    training_episodes = TALLY.factory_calls - eval_episodes
    check(
        "every training episode has one status",
        0 <= counted - training_episodes <= cancelled,
        f"{counted} statuses for {training_episodes} episodes built (+ members cancelled unrun)",
        failures,
    )
    injected, dropped = TALLY.injected, deadlines.DROPPED
    for what, seen, expected in (
        ("async tool hangs dropped", dropped["tool async_hang"], injected["tool_async_hang"]),
        ("reset hangs dropped", dropped["episode"], injected["reset_hang"]),
        ("close hangs dropped", dropped["environment close"], injected["close_hang"]),
    ):
        check(what, seen == expected, f"{seen} of {expected} injected", failures)
    hung, gone = injected["tool_sync_hang"], pool.abandoned_total
    check(  # a hang still queued when its deadline passed is skipped, never started
        "sync tool hangs abandoned",
        gone <= hung <= gone + pool.skipped_total,
        f"{gone} abandoned (+ {pool.skipped_total} calls skipped unstarted) of {hung} injected",
        failures,
    )
    check("the learner stepped", result.steps > 0, f"{result.steps} steps", failures)
    check(
        f"learner never idle > {MAX_IDLE_S:g} s",
        max_wait < MAX_IDLE_S,
        f"max wait {max_wait:.1f} s over {len(waits)} waits",
        failures,
    )
    loop_s = loop.ended_at - loop.started_at
    check(
        "run finished in time",
        loop_s < args.seconds + MAX_IDLE_S and wall < args.seconds + FINISH_SLACK_S,
        f"loop {loop_s:.0f} s, stage {wall:.0f} s (start-up and final evaluation included)"
        f" for a {args.seconds:g} s budget",
        failures,
    )
    if remote is not None:
        after = [s for t, s, got in loop.waits if got and remote.killed_at and t > remote.killed_at]
        check(
            "killed replica marked lost",
            remote.killed in summary["remote_lost"],
            remote.killed,
            failures,
        )
        check("training went on after the kill", len(after) > 0, f"{len(after)} batches", failures)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print("FAILED: " + ", ".join(failures) if failures else "all invariants hold")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
