"""Stage: the recovery test. Kill a real training run with SIGKILL at each risky phase, resume it.

One chain of child processes (`asyncrl train`) on a short version of the run's config: the first
is killed during a rollout, its resumption during a train step, the next during a weight publish,
the next during a checkpoint write, and the last runs to the end. After each kill the stage checks:

- the child really died by SIGKILL at that phase (a kill point that never fired fails the phase);
- the resumed child restored the newest checkpoint that was complete at the kill;
- the arrays it restored are bit-identical to what was saved (the SHA-256 digest it computed over
  the restored parameters and optimizer state equals the one recorded when saving);
- the data cursor continues: the groups trained before the checkpoint are the start of the final
  record, nothing is trained twice, no issued group is unaccounted for;
- the chain completes all its steps.

The verdict (per phase: pass/fail, kill step, resumed step, lost steps and tasks) is written to
`<run>/recovery_test/verdict.json`, which the pipeline records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from asyncrl.checkpoint.manager import Checkpointer
from asyncrl.config import RunConfig, load_config, to_yaml
from asyncrl.learner.hooks import Phase
from asyncrl.run_layout import RunLayout, Stage
from asyncrl.stages.train import TrainResult
from asyncrl.wiring.faults import ENV

# The chain: (phase, step at which to kill). Checkpoints every 2 steps, so every kill loses work.
PLAN: tuple[tuple[Phase, int], ...] = (
    (Phase.ROLLOUT, 4),
    (Phase.TRAIN, 5),
    (Phase.PUBLISH, 7),
    (Phase.CHECKPOINT, 10),
)
STEPS = 11
EVERY = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseVerdict:
    phase: str
    kill_step: int
    killed: bool  # the child died by SIGKILL
    checkpoint_at_kill: int | None  # newest complete checkpoint when it died
    resumed_step: int | None
    bit_identical: bool
    cursor_ok: bool
    lost_steps: int
    lost_tasks: int
    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryVerdict:
    STAGE: ClassVar[Stage] = Stage.RECOVERY_TEST
    passed: bool
    completed: bool
    final_step: int
    seconds: float
    phases: tuple[PhaseVerdict, ...] = field(default_factory=tuple)


def recovery_config(cfg: RunConfig, work: Path, overrides: tuple[str, ...] = ()) -> RunConfig:
    """The run's config, shortened: STEPS steps, a checkpoint every EVERY, a minimal evaluation."""
    base = work / "base.yaml"
    base.write_text(to_yaml(cfg))
    return load_config(
        base,
        [
            f"learner.steps={STEPS}",
            "learner.time_budget_s=0",
            "learner.eval_every=0",
            "env.heldout_size=1",
            f"checkpoint.every_steps={EVERY}",
            "checkpoint.dir=",
            *overrides,
        ],
    )


def _child(config_file: Path, run_dir: Path, init_model: str | None, kill: str | None, log):
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        str(config_file),
        "--run-dir",
        str(run_dir),
    ]
    if init_model:
        cmd += ["--init-model", init_model]
    env = {k: v for k, v in os.environ.items() if k != ENV}
    # Children share compiled executables: each one after the first starts in seconds.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(run_dir.parent / "jax-cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if kill:
        env[ENV] = kill
    return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _completed_steps(phase: Phase, step: int) -> int:
    """Optimizer steps finished when the kill point fired (rollout/train: step k not yet)."""
    return step if phase in (Phase.PUBLISH, Phase.CHECKPOINT) else step - 1


@dataclass(slots=True)
class _Kill:
    phase: Phase
    step: int
    code: int
    at_kill: int | None
    saved: dict | None  # the pipeline state of that checkpoint


def _judge(kill: _Kill, resumed: dict | None, final: dict | None, gps: int) -> PhaseVerdict:
    problems = []
    killed = kill.code == -signal.SIGKILL
    if not killed:
        problems.append(f"child exited with {kill.code}, not SIGKILL: the kill point never fired")
    if kill.at_kill is None:
        problems.append("no checkpoint was complete at the kill: nothing was tested")
    resumed_step = resumed["step"] if resumed else None
    if resumed_step != kill.at_kill:
        problems.append(f"resumed at {resumed_step}, newest complete checkpoint {kill.at_kill}")
    identical = bool(resumed and kill.saved and resumed["digest"] == kill.saved["digest"])
    if not identical:
        problems.append("restored arrays differ from the saved ones")
    cursor_ok = final is not None and kill.saved is not None and _continues(kill.saved, final)
    if not cursor_ok:
        problems.append("data cursor does not continue (duplicated, skipped or reordered groups)")
    lost = max(_completed_steps(kill.phase, kill.step) - (kill.at_kill or 0), 0)
    return PhaseVerdict(
        phase=kill.phase.value,
        kill_step=kill.step,
        killed=killed,
        checkpoint_at_kill=kill.at_kill,
        resumed_step=resumed_step,
        bit_identical=identical,
        cursor_ok=cursor_ok,
        lost_steps=lost,
        lost_tasks=lost * gps,
        passed=not problems,
        detail="; ".join(problems),
    )


def _continues(saved: dict, final: dict) -> bool:
    before, after = saved["state"]["cursor"], final["state"]["cursor"]
    trained = after["trained"]
    accounted = set(trained) | set(after["dropped"]) | set(after["pending"])
    return (
        trained[: len(before["trained"])] == before["trained"]
        and len(set(trained)) == len(trained)
        and not set(trained) & set(after["dropped"])
        and accounted == set(range(after["next_index"]))
    )


def recovery_test(
    cfg: RunConfig,
    layout: RunLayout,
    init_model: str | None = None,
    overrides: tuple[str, ...] = (),
    progress=print,
) -> RecoveryVerdict:
    start = time.monotonic()
    out = layout.dir(Stage.RECOVERY_TEST)
    out.mkdir(parents=True, exist_ok=True)
    child = layout.recovery_child
    child_dir = child.root
    rcfg = recovery_config(cfg, out, overrides)
    config_file = out / "config.yaml"
    config_file.write_text(to_yaml(rcfg))
    gps = rcfg.learner.batch_size // rcfg.rollout.group_size
    resume_file = child.resume_record
    kills: list[_Kill] = []
    resumptions: list[dict | None] = []
    code = 0
    with (out / "children.log").open("w") as log:
        for phase, step in (*PLAN, (None, None)):
            what = f"kill during {phase.value} at step {step}" if phase else "run to the end"
            progress(f"recovery test: child {len(kills) + 1}/{len(PLAN) + 1}: {what}")
            resume_file.unlink(missing_ok=True)
            code = _child(
                config_file, child_dir, init_model, f"{phase.value}:{step}" if phase else None, log
            )
            if kills:
                resumptions.append(_read_json(resume_file))
            if phase is None:
                break
            ckpt = Checkpointer(child.checkpoints)
            at_kill = ckpt.latest_step()
            saved = ckpt.read_pipeline(at_kill) if at_kill is not None else None
            ckpt.close()
            kills.append(_Kill(phase, step, code, at_kill, saved))
    result = child.maybe(TrainResult)
    final_step = result.steps if result is not None else 0
    completed = code == 0 and final_step == rcfg.learner.steps
    final = None
    if completed:
        ckpt = Checkpointer(child.checkpoints)
        final = ckpt.read_pipeline(ckpt.latest_step())
        ckpt.close()
    phases = tuple(_judge(k, r, final, gps) for k, r in zip(kills, resumptions, strict=True))
    verdict = RecoveryVerdict(
        passed=completed and all(p.passed for p in phases),
        completed=completed,
        final_step=final_step,
        seconds=round(time.monotonic() - start, 1),
        phases=phases,
    )
    layout.write(verdict)
    return verdict


def table(verdict: RecoveryVerdict) -> str:
    """The verdict as a fixed-width table (what `asyncrl recovery-test` prints)."""
    head = ("phase", "kill@", "ckpt", "resumed", "bits", "cursor", "lost steps", "lost tasks", "")
    rows = [
        (
            p.phase,
            p.kill_step,
            p.checkpoint_at_kill,
            p.resumed_step,
            "same" if p.bit_identical else "DIFF",
            "ok" if p.cursor_ok else "BAD",
            p.lost_steps,
            p.lost_tasks,
            "PASS" if p.passed else f"FAIL: {p.detail}",
        )
        for p in verdict.phases
    ]
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head) - 1)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + str(r[-1])
        for r in (head, *rows)
    ]
    status = "PASSED" if verdict.passed else "FAILED"
    end = "completed" if verdict.completed else "did NOT complete"
    lines.append(
        f"recovery test {status}: the run {end} at step {verdict.final_step} "
        f"({verdict.seconds:.0f} s)"
    )
    return "\n".join(lines)
