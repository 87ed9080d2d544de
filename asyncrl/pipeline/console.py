"""What `asyncrl run` shows: a header, one line when each stage starts and one when it ends (its
time and key figure), live training progress, and a summary with the paths to open.

Everything else (kfp.local's executor JSON, warnings, library messages, the stages' own logs) goes
to `runs/<id>/logs/kfp.log`, split afterwards into `logs/<task>.log`; a failing stage prints the
tail of its log. The stage boundaries are read from kfp.local's task lines in that log; the key
figures from the stages' validated results (run_layout.py), never from log text.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from asyncrl.metrics.intervals import percent
from asyncrl.run_layout import LayoutError, RunLayout, Stage

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STARTED = re.compile(r"Executing task '([a-z0-9-]+)'")
ENDED = re.compile(r"Task '([a-z0-9-]+)' finished with status (\w+)")
POLL_S = 0.5
PLAIN_PROGRESS_S = 60.0  # without a terminal: one progress line a minute at most
TAIL_LINES = 15


def key_figure(task: str, layout: RunLayout) -> str:
    """The one number (or verdict) that says how a stage went, from its validated result."""
    from asyncrl.stages.promote import PromotionResult
    from asyncrl.stages.provision import ProvisionResult, TeardownResult
    from asyncrl.stages.quality_gate import GateResult
    from asyncrl.stages.recovery_test import RecoveryVerdict
    from asyncrl.stages.report import ReportPaths
    from asyncrl.stages.train import TrainResult
    from asyncrl.stages.warm_start import WarmStartResult

    try:
        if task == "provision" and (r := layout.maybe(ProvisionResult)):
            return (
                f"{len(r.created)} resources created" if r.created else "local: nothing to create"
            )
        if task == "warm-start" and (r := layout.maybe(WarmStartResult)):
            return f"held-out solve rate {percent(r.heldout_solve_rate)} after {r.steps} SFT steps"
        if task == "train" and (r := layout.maybe(TrainResult)):
            return (
                f"held-out {percent(r.initial_solve_rate)} → {percent(r.final_solve_rate)}, "
                f"{r.steps} steps, policy lag {r.policy_lag_mean:.2f} (max {r.policy_lag_max})"
            )
        if task == "recovery-test" and (r := layout.maybe(RecoveryVerdict)):
            passed = sum(p.passed for p in r.phases)
            return f"{passed}/{len(r.phases)} phases passed"
        if task == "quality-gate" and (r := layout.maybe(GateResult)):
            if r.passed:
                return "PASS"
            return "FAIL: " + "; ".join(c.name for c in r.failed)
        if task == "promote" and (r := layout.maybe(PromotionResult)):
            return r.decision.value
        if task == "report" and layout.maybe(ReportPaths):
            return str(layout.report_html)
        if task == "teardown" and (r := layout.maybe(TeardownResult)):
            return f"pipeline {r.pipeline_state}"
    except LayoutError as e:
        return f"unreadable result ({e})"
    return ""


@dataclass
class Console:
    """Prints to `out` (the terminal) while the run's own output goes to its log."""

    layout: RunLayout
    out: TextIO
    steps: int  # the RL step budget, for the progress line
    tty: bool = False
    started: dict[str, float] = field(default_factory=dict)
    ended: dict[str, tuple[str, float]] = field(default_factory=dict)
    lines: int = 0
    _last_progress: float = 0.0
    _progress_shown: bool = False

    def say(self, text: str) -> None:
        if self._progress_shown and self.tty:
            self.out.write("\r\x1b[K")
            self._progress_shown = False
        self.out.write(text + "\n")
        self.out.flush()
        self.lines += 1

    def update(self, log_text: str, now: float) -> None:
        """Announce the tasks that started or ended since the last call."""
        for line in ANSI.sub("", log_text).splitlines():
            if m := STARTED.search(line):
                task = m.group(1)
                if task not in self.started:
                    self.started[task] = now
                    self.say(f"▶ {task}")
            elif m := ENDED.search(line):
                task, status = m.group(1), m.group(2)
                if task not in self.ended:
                    seconds = now - self.started.get(task, now)
                    self.ended[task] = (status, seconds)
                    mark = "✓" if status == "SUCCESS" else "✗"
                    figure = key_figure(task, self.layout)
                    tail = f" — {figure}" if figure else ""
                    self.say(f"{mark} {task} {status.lower()} in {seconds:.0f} s{tail}")

    def progress(self, now: float) -> None:
        """Training's live line: steps, rate, ETA and last reward, from the metrics it writes."""
        if "train" not in self.started or "train" in self.ended:
            return
        if not self.tty and now - self._last_progress < PLAIN_PROGRESS_S:
            return
        rows = _train_rows(self.layout.train_metrics)
        if not rows:
            return
        try:
            step, reward = int(rows[-1].get("step", 0)), float(rows[-1].get("reward", 0.0))
        except (TypeError, ValueError, OverflowError):  # not numbers: no progress line, no crash
            return
        elapsed = now - self.started["train"]
        rate = step / elapsed * 60 if elapsed > 0 else 0.0
        eta = (self.steps - step) / (rate / 60) if rate > 0 else float("inf")
        text = (
            f"  train: step {step}/{self.steps}, {rate:.1f} steps/min, "
            f"ETA {eta / 60:.1f} min, reward {reward:.3f}"
        )
        self._last_progress = now
        if self.tty:
            self.out.write("\r\x1b[K" + text)
            self.out.flush()
            self._progress_shown = True
        else:
            self.say(text)


def _train_rows(path: Path) -> list[dict]:
    import json

    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict) and row.get("kind") == "train":
                rows.append(row)
    return rows


@contextlib.contextmanager
def redirected(log: Path) -> Iterator[TextIO]:
    """Send this process's (and its children's) stdout and stderr to `log`; yields a stream on
    the original stdout for the console."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(saved_out), "w", encoding="utf-8", errors="replace")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for f in (fd, saved_out, saved_err):
            os.close(f)
        console.flush()
        console.close()


def split_log(log: Path, folder: Path) -> dict[str, Path]:
    """`logs/<task>.log` for each task, from the combined log's task boundaries."""
    if not log.is_file():
        return {}
    out: dict[str, list[str]] = {}
    current = "pipeline"
    for line in log.read_text(errors="replace").splitlines():
        plain = ANSI.sub("", line)
        if m := STARTED.search(plain):
            current = m.group(1)
        out.setdefault(current, []).append(plain)
        if (m := ENDED.search(plain)) and m.group(1) == current:
            current = "pipeline"
    paths = {}
    for task, lines in out.items():
        paths[task] = folder / f"{task}.log"
        paths[task].write_text("\n".join(lines) + "\n")
    return paths


def watch(console: Console, log: Path, done: threading.Event) -> None:
    """Poll the combined log and the metrics until `done`; a last pass after it is set."""
    offset = 0
    while True:
        finished = done.is_set()
        now = time.monotonic()
        if log.is_file():
            with log.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1  # whole lines only
            offset += cut
            console.update(chunk[:cut].decode("utf-8", "replace"), now)
        console.progress(now)
        if finished:
            return
        done.wait(POLL_S)


def run_quietly(
    layout: RunLayout, steps: int, out: TextIO, body: Callable[[], object]
) -> tuple[object, Console, dict[str, Path]]:
    """Run `body` with its output in `logs/kfp.log`, showing stage lines on `out`."""
    log = layout.logs / "kfp.log"
    console = Console(layout, out, steps, tty=out.isatty())
    done = threading.Event()
    with redirected(log) as terminal:
        console.out = terminal
        watcher = threading.Thread(target=watch, args=(console, log, done), daemon=True)
        watcher.start()
        try:
            result = body()
        finally:
            done.set()
            watcher.join(10)
    console.out = out
    return result, console, split_log(log, layout.logs)


def failure_tails(console: Console, logs: dict[str, Path]) -> list[str]:
    """The last lines of each failed task's log."""
    lines = []
    for task, (status, _) in console.ended.items():
        if status != "SUCCESS" and task in logs:
            tail = logs[task].read_text(errors="replace").splitlines()[-TAIL_LINES:]
            lines += [f"--- {task} failed; last lines of {logs[task]}:", *tail]
    return lines


def summary(console: Console, layout: RunLayout) -> list[str]:
    rows = [("stage", "status", "time", "result")]
    for task, (status, seconds) in console.ended.items():
        rows.append((task, status.lower(), f"{seconds:.0f} s", key_figure(task, layout)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
        for r in rows
    ]
    paths = (
        ("report", layout.report_html),
        ("trace", layout.trace),
        ("learning curve", layout.dir(Stage.TRAIN) / "learning_curve.png"),
        ("logs", layout.logs),
    )
    lines += [f"{label}: {path}" for label, path in paths if path.exists()]
    board = layout.dir(Stage.TRAIN) / "tensorboard"
    if board.exists():
        lines.append(f"tensorboard: tensorboard --logdir {board}")
    return lines
