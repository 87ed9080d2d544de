"""An opt-in record of what the trainer trained on: each step's batch, loss and parameters.

Replica sampling is not deterministic across runs, so a run cannot be regenerated to check it; what
it consumed can be recorded and replayed instead (`asyncrl/testing/replay.py`: one process, the
same learner, the recorded batches in order, then loss and parameters compared step by step).
`StepRecorder` is a `Lockstep` around the trainer's own (it changes nothing it forwards): on
process 0 it keeps the batch of each train step as it is announced (exactly what every process
trains on), and its `after_step` hook writes `<folder>/<step>.npz` holding that batch
(`batch/<field>`), the step's loss (`loss`) and the parameters after the step (`params/<name>`,
gathered whole through the learner, so on several hosts every process takes part). The stage
installs it only when asked (ASYNCRL_RECORD_STEPS=1, read by `from_env`); unasked, nothing of
this runs. It writes one copy of the parameters per step: for tests and small models. A trainer
that resumes from a checkpoint rewrites the records of the steps it trains again.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np

from asyncrl.checkpoint.manager import flatten
from asyncrl.learner.batching import TrainBatch
from asyncrl.learner.lockstep import Command, Lockstep, Op

if TYPE_CHECKING:
    from asyncrl.learner.loop import TrainingLoop

ENV = "ASYNCRL_RECORD_STEPS"  # "1": the train stage records under `RunLayout.step_records`


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedStep:
    step: int
    batch: TrainBatch  # host arrays, as announced to every process
    loss: float
    params: dict[str, np.ndarray]  # by `checkpoint.manager.flatten` name, whole


class StepRecorder:
    """Forwards everything to `inner`; as the leader, keeps each step's batch for `after_step`."""

    def __init__(self, inner: Lockstep, folder: Path) -> None:
        self.inner, self.folder = inner, folder
        self._batch: TrainBatch | None = None

    @property
    def leader(self) -> bool:
        return self.inner.leader

    def announce(self, command: Command) -> None:
        if command.op is Op.STEP and self.leader:
            self._batch = jax.tree.map(np.array, command.batch)  # a copy: never donated
        self.inner.announce(command)

    def receive(self) -> Command:
        return self.inner.receive()

    def gather(self, tree):
        return self.inner.gather(tree)

    async def after_step(self, step: int, loop: TrainingLoop) -> None:
        """Write step `step`'s record (process 0: the loop's hooks run only there)."""
        if self._batch is None:
            raise RuntimeError(f"step {step} ended without a batch announced to the recorder")
        write(self.folder, step, self._batch, loop.last_metrics["loss"], loop.learner.params_copy())
        self._batch = None


def write(folder: Path, step: int, batch: TrainBatch, loss: float, params) -> None:
    """`<folder>/<step>.npz`: the recorder's format (the replay writes what it computed so)."""
    arrays = {f"batch/{f.name}": np.asarray(getattr(batch, f.name)) for f in _fields()}
    arrays |= {f"params/{k}": np.asarray(v) for k, v in flatten(params).items()}
    arrays["loss"] = np.float64(loss)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{step}.partial.npz"
    np.savez(partial, **arrays)
    partial.rename(folder / f"{step}.npz")  # a record is whole or absent


def read(folder: Path) -> list[RecordedStep]:
    """Every step recorded under `folder`, in step order."""
    steps = sorted(int(p.stem) for p in folder.glob("*.npz") if p.stem.isdigit())
    out = []
    for step in steps:
        with np.load(folder / f"{step}.npz") as f:
            batch = TrainBatch(**{g.name: f[f"batch/{g.name}"] for g in _fields()})
            params = {k.removeprefix("params/"): f[k] for k in f.files if k.startswith("params/")}
            out.append(RecordedStep(step=step, batch=batch, loss=float(f["loss"]), params=params))
    return out


def _fields():
    return dataclasses.fields(TrainBatch)


def from_env(folder: Path, steps: Lockstep) -> StepRecorder | None:
    """With ASYNCRL_RECORD_STEPS=1, a recorder around `steps` writing into `folder`; else None
    and nothing changes."""
    return StepRecorder(steps, folder) if os.environ.get(ENV) == "1" else None
