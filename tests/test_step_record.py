"""The opt-in step record (wiring/step_record.py) and its one-process replay
(asyncrl/testing/replay.py): what a run trained on, trained on again, gives the same losses and
parameters. The 2-host trainer against its 1-host replay is tests/test_jobset_local.py's."""

import asyncio
import hashlib

import numpy as np
import pytest

from asyncrl.checkpoint.manager import flatten
from asyncrl.learner.hooks import LoopHooks
from asyncrl.learner.lockstep import Alone
from asyncrl.learner.loop import TrainingLoop
from asyncrl.learner.state import LoopState
from asyncrl.testing.configs import micro_config
from asyncrl.testing.multihost import TRAIN_OVERRIDES
from asyncrl.testing.replay import replay
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.types import FinishReason
from asyncrl.wiring import step_record
from asyncrl.wiring.devices import make_placement
from asyncrl.wiring.episodes import Wiring
from asyncrl.wiring.training import learner_for, rollout_plan, training_tasks

STEPS = 2


def _engine(wiring, tasks) -> ScriptedEngine:
    """Replies by the request's seed: the task's answer about half the time, so groups carry
    signal (non-zero advantages)."""

    def script(request):
        prompt = wiring.fmt.tok.decode(list(request.prompt))
        task = max((t for t in tasks if t.prompt in prompt), key=lambda t: len(t.prompt))
        coin = hashlib.sha256(str(request.params.seed).encode()).digest()[0]
        text = task.answer if coin % 2 else f"{task.answer}{coin % 10}"
        return [*wiring.fmt.tok.encode(text), wiring.fmt.end_of_turn], FinishReason.STOP

    return ScriptedEngine(script)


def test_a_recorded_run_replays_to_the_same_losses_and_parameters(tmp_path):
    cfg = micro_config(*TRAIN_OVERRIDES)
    wiring = Wiring.of(cfg)
    recorder = step_record.StepRecorder(Alone(), tmp_path / "steps")
    learner = learner_for(cfg, wiring, make_placement(cfg), None, recorder)
    tasks = training_tasks(cfg)
    losses = []

    async def logged(step, loop):
        losses.append(loop.last_metrics["loss"])

    loop = TrainingLoop.from_state(
        LoopState(),
        learner,
        rollout_plan(cfg, wiring, _engine(wiring, tasks.tasks)),
        cfg.learner,
        hooks=LoopHooks(after_step=(recorder.after_step, logged)),
    )
    asyncio.run(loop.run(tasks.at, STEPS))

    recorded = step_record.read(tmp_path / "steps")
    assert [r.step for r in recorded] == [1, 2]
    assert [r.loss for r in recorded] == losses
    assert all(np.abs(r.batch.advantages).max() > 0 for r in recorded)  # the groups had signal
    final = {k: np.asarray(v) for k, v in flatten(learner.params_copy()).items()}
    assert recorded[-1].params.keys() == final.keys()
    assert all(np.array_equal(recorded[-1].params[k], final[k]) for k in final)
    assert any(not np.array_equal(recorded[0].params[k], final[k]) for k in final)

    assert replay(cfg, tmp_path / "steps", tmp_path / "replayed") == STEPS
    replayed = step_record.read(tmp_path / "replayed")
    for mine, again in zip(recorded, replayed, strict=True):
        assert mine.step == again.step and mine.loss == again.loss
        assert all(np.array_equal(mine.params[k], again.params[k]) for k in mine.params)
        assert all(
            np.array_equal(getattr(mine.batch, f), getattr(again.batch, f))
            for f in ("inputs", "targets", "mask", "advantages", "behaviour")
        )


def test_a_replay_refuses_records_that_do_not_start_at_step_one(tmp_path):
    (tmp_path / "steps").mkdir()
    with pytest.raises(ValueError, match=r"steps 1\.\.N"):
        replay(micro_config(), tmp_path / "steps", tmp_path / "out")
