"""Stage: asynchronous agentic GRPO, wired from the configuration.

Builds the placement (colocated, disaggregated or remote), the learner on the train mesh, the
engine, and the training loop from the restored (or fresh) `TrainRecord`, with evaluation,
checkpoint and progress hooks (`wiring/train_run.py`); runs it; writes the trained model (HF
safetensors), the metrics (JSONL), the plots and the trace under `<run>/train/`, and its
`TrainResult` (run_layout.py). With ASYNCRL_RECORD_STEPS=1 (tests) process 0 also records each
step's batch, loss and parameters under `<run>/train/steps/` (wiring/step_record.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import ClassVar

from asyncrl import records, tracing
from asyncrl.checkpoint.manager import Checkpointer
from asyncrl.config import RunConfig
from asyncrl.learner.lockstep import of_processes
from asyncrl.learner.state import LoopState
from asyncrl.metrics.plots import lag_histogram, learning_curve, queue_occupancy, reward_curve
from asyncrl.metrics.tracker import JsonlTracker, TensorBoardTracker, Tracker, Trackers
from asyncrl.model import hf_checkpoint as hf
from asyncrl.rollout import event_loop
from asyncrl.rollout.gc_tuning import tuned_for_rollout
from asyncrl.run_layout import RunLayout, Stage
from asyncrl.sampling.protocol import RolloutEngine
from asyncrl.wiring import faults, lockstep, step_record
from asyncrl.wiring.devices import make_placement
from asyncrl.wiring.episodes import Wiring
from asyncrl.wiring.train_run import TrainRun
from asyncrl.wiring.training import (
    learner_for,
    local_engine,
    note_restored,
    note_trained,
    remote_engine,
    resume,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    STAGE: ClassVar[Stage] = Stage.TRAIN
    model_dir: str
    steps: int
    seconds: float
    initial_solve_rate: float
    final_solve_rate: float
    groups_trained: int
    groups_dropped_stale: int
    groups_failed: int
    groups_withdrawn: int
    groups_no_signal: int
    policy_lag_mean: float
    policy_lag_max: int
    learner_idle_fraction: float
    curve: str


def checkpoint_uri(cfg: RunConfig, layout: RunLayout) -> str:
    """`checkpoint.dir` when set explicitly (shared on purpose), else the run's own folder."""
    return cfg.checkpoint.dir or layout.checkpoints


def train(cfg: RunConfig, layout: RunLayout, init_model: str | None = None) -> TrainResult:
    """Train (or resume, when the run's checkpoint location holds a complete checkpoint).

    On a trainer of several processes (`jax.distributed` joined by the caller) every process
    calls this: they build the learner and restore together, then process 0 trains and the others
    follow its steps (`wiring/lockstep.py`); every process returns the run's result.
    """
    start = time.monotonic()
    layout.dir(Stage.TRAIN).mkdir(parents=True, exist_ok=True)
    placement = make_placement(cfg)
    source = init_model or cfg.model.checkpoint
    wiring = Wiring.of(cfg)  # the tokenizer and chat format, built once for the stage
    with contextlib.ExitStack() as stack:
        checkpointer = Checkpointer(  # first: a bad checkpoint.dir fails before any compile
            checkpoint_uri(cfg, layout),
            max_to_keep=cfg.checkpoint.max_to_keep,
            async_save=cfg.checkpoint.async_save,
        )
        stack.callback(checkpointer.close)
        steps = of_processes()
        recorder = step_record.from_env(layout.step_records, steps)
        learner = learner_for(cfg, wiring, placement, source, recorder or steps)
        record = resume(checkpointer, learner, cfg)
        note_restored(layout, learner, record)
        if not learner.lockstep.leader:  # process 0's steps, until it stops with the result
            text = lockstep.follow(learner, checkpointer)
            note_trained(layout, learner)
            return records.decode(TrainResult, json.loads(text), "process 0's train result")
        try:
            state, evals = _lead(
                cfg, wiring, layout, learner, checkpointer, placement, record, source, recorder
            )
            hf.save(learner.model(), str(layout.train_model))
        except BaseException:
            lockstep.stop(learner)  # the followers stop waiting for a step that never comes
            raise
        result = _result(layout, learner, state, evals, time.monotonic() - start)
        layout.write(result)
        lockstep.stop(learner, json.dumps(records.encode(result)))
        note_trained(layout, learner)
    return result


def _lead(cfg, wiring, layout, learner, checkpointer, placement, record, source, recorder):
    """Process 0's part (all of it alone): the engine, the tracker and the loop; returns the loop's
    state and the evaluations."""
    with contextlib.ExitStack() as stack:
        engine = _engine(cfg, wiring, layout, learner, placement, source, stack)
        if record.state.version:
            engine.publish(learner.params_copy(), record.state.version)
        tracker = _tracker(cfg, layout)
        stack.callback(tracker.close)
        engine.warmup()
        run = TrainRun(
            cfg=cfg,
            wiring=wiring,
            learner=learner,
            engine=engine,
            placement=placement,
            tracker=tracker,
            checkpointer=checkpointer,
            kill=faults.kill_point(),
            record=recorder.after_step if recorder else None,
        )
        run.evals.extend(record.evals)
        with tracing.tracing(_tracer(cfg, layout)), tuned_for_rollout():  # start-up is done
            state = event_loop.run(run.main(record.state))
    return state, run.evals


def _engine(cfg, wiring, layout, learner, placement, source, stack) -> RolloutEngine:
    if cfg.cluster.placement != "remote":
        engine = local_engine(wiring, learner, placement)
    else:
        engine, replicas = remote_engine(cfg, layout, learner, source)
        if replicas is not None:
            stack.callback(replicas.stop)
    stack.callback(engine.close)
    return engine


def _tracker(cfg: RunConfig, layout: RunLayout) -> Tracker:
    tracker: Tracker = JsonlTracker(layout.train_metrics)
    if cfg.tracing.tensorboard:
        tracker = Trackers(tracker, TensorBoardTracker(layout.dir(Stage.TRAIN) / "tensorboard"))
    return tracker


def _tracer(cfg: RunConfig, layout: RunLayout):
    if not cfg.tracing.enabled:
        return tracing.NullTracer()
    if layout.trace.exists():  # an earlier (perhaps killed) attempt's trace is kept, numbered
        n = len(layout.earlier_traces()) + 1
        layout.trace.rename(layout.trace.with_name(f"trace.{n}.perfetto-trace"))
    return tracing.PerfettoTracer(layout.trace, chunk_events=cfg.tracing.chunk_events)


def _result(layout, learner, state: LoopState, evals, seconds: float) -> TrainResult:
    out = layout.dir(Stage.TRAIN)
    metrics = layout.train_metrics
    curve = learning_curve(metrics, out / "learning_curve.png")
    reward_curve(metrics, out / "reward_curve.png")
    queue_occupancy(metrics, out / "queue_occupancy.png")
    lag_histogram(dict(state.lags), out / "policy_lag.png")
    c = state.counters
    return TrainResult(
        model_dir=str(layout.train_model),
        steps=learner.step,
        seconds=round(seconds, 2),
        initial_solve_rate=evals[0]["solve_rate"],
        final_solve_rate=evals[-1]["solve_rate"],
        groups_trained=c.groups_trained,
        groups_dropped_stale=c.groups_stale,
        groups_failed=c.groups_failed,
        groups_withdrawn=c.groups_withdrawn,
        groups_no_signal=c.groups_no_signal,
        policy_lag_mean=state.lag_mean,
        policy_lag_max=state.lag_max,
        learner_idle_fraction=state.learner_idle_fraction,
        curve=str(curve),
    )
