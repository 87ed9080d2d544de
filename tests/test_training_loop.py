"""The training loop: staleness bounds, sync ≡ async at zero lag, bit-identical weight publishes."""

import asyncio
import hashlib
import time
from dataclasses import replace

import jax
import numpy as np
import pytest

from asyncrl.learner.learner import Learner
from asyncrl.learner.loop import TrainingLoop
from asyncrl.learner.state import LoopState, admits
from asyncrl.model import build_model
from asyncrl.run_layout import RunLayout
from asyncrl.sampling.engine import Engine
from asyncrl.sync.publisher import WeightPublisher
from asyncrl.testing.configs import micro_config
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.types import FinishReason, GenerateRequest, GroupOutcome, SamplingParams
from asyncrl.wiring.episodes import Wiring
from asyncrl.wiring.training import rollout_plan, training_tasks

# A run that should take seconds is declared hung after this long.
HANG_S = 120


def test_admission_counts_trained_and_in_flight_groups_and_ended_ones_free_their_place():
    state, per_version, staleness = LoopState(), 2, 1
    for n in range(4):  # (version 0 + staleness 1 + 1) × 2 groups per version
        assert admits(state, per_version, staleness)
        state = state.issued(n)
    assert not admits(state, per_version, staleness)
    state = state.finish(0, GroupOutcome.FAILED)  # a failed group leaves the budget at once
    assert admits(state, per_version, staleness)
    state = state.issued(4)
    for n, outcome in ((1, GroupOutcome.TRAINED), (2, GroupOutcome.TRAINED)):
        state = state.finish(n, outcome)
    assert not admits(state, per_version, staleness)  # trained groups keep their place
    state = state.published(1)
    assert admits(state, per_version, staleness)
    assert state.cursor.trained == (1, 2) and state.cursor.dropped == (0,)
    assert state.counters.groups_failed == 1 and state.counters.groups_trained == 2


def _answer_script(fmt):
    """Deterministic replies that depend on the request's seed and the engine's version."""

    def script(request, version):
        digest = hashlib.sha256(f"{request.params.seed}/{version}".encode()).digest()
        text = str(digest[0] % 3)
        return [*fmt.tok.encode(text), fmt.end_of_turn], FinishReason.STOP

    return script


class VersionedScript(ScriptedEngine):
    def __init__(self, fmt):
        script = _answer_script(fmt)
        super().__init__(lambda r: script(r, self.version))


def _train(cfg, steps, bounded=None, slow_s=0.0, make_env=None):
    wiring = Wiring.of(cfg)
    engine = VersionedScript(wiring.fmt)
    learner = Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=cfg.env.max_context)
    if slow_s:
        step = learner.rl_step

        def slowed(batch, on_dispatch=None):
            time.sleep(slow_s)
            return step(batch, on_dispatch)

        learner.rl_step = slowed
    plan = rollout_plan(cfg, wiring, engine)
    if make_env is not None:
        plan = replace(plan, make_env=make_env(wiring.make_env))
    loop = TrainingLoop.from_state(LoopState(), learner, plan, cfg.learner, bounded=bounded)

    async def go():
        return await asyncio.wait_for(loop.run(training_tasks(cfg).at, steps), HANG_S)

    return learner, asyncio.run(go())


def test_publishing_every_second_step_keeps_training_and_bounds_lag():
    """With sync_every = 2 a version covers two steps' groups: admission must not starve."""
    cfg = micro_config(
        "learner.mode=async",
        "learner.max_staleness=1",
        "learner.sync_every=2",
        "env.agent=model",
        "env.tasks=[calculator]",
    )
    _, state = _train(cfg, 6)
    assert state.counters.steps == 6 and state.lag_max <= 1


def test_async_with_zero_staleness_equals_sync():
    base = ("learner.lr=1e-3", "learner.sync_every=1", "env.agent=model", "env.tasks=[calculator]")
    sync_learner, _ = _train(micro_config(*base, "learner.mode=sync", "learner.max_staleness=0"), 3)
    async_learner, state = _train(
        micro_config(*base, "learner.mode=async", "learner.max_staleness=0"), 3
    )
    assert state.counters.steps == 3 and state.lag_max == 0
    for a, b in zip(
        jax.tree.leaves(sync_learner.state.params),
        jax.tree.leaves(async_learner.state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_stale_groups_are_never_trained_on():
    """No admission control and a slow learner: old groups pile up and must be dropped."""
    cfg = micro_config(
        "learner.mode=async",
        "learner.max_staleness=1",
        "env.agent=model",
        "env.tasks=[calculator]",
        "rollout.max_ready_groups=64",
    )
    _, state = _train(cfg, 4, bounded=False, slow_s=0.3)
    assert state.counters.steps == 4
    assert state.lag_max <= 1
    assert state.counters.groups_stale > 0


def _failing_every(k):
    """An environment factory that fails for every k-th training task (all its group's members)."""

    def wrap(make_env):
        def make(task):
            if int(task.id.rsplit("/", 1)[1]) % k == 0:
                raise RuntimeError(f"no environment for {task.id}")
            return make_env(task)

        return make

    return wrap


@pytest.mark.parametrize("staleness", [0, 1, 2])
@pytest.mark.parametrize("policy", ["drop", "retry"])
def test_failed_groups_free_their_admission_place_and_the_run_finishes(policy, staleness):
    """Failed groups end through the same path as trained ones: admission never shrinks."""
    cfg = micro_config(
        "learner.mode=async",
        f"learner.max_staleness={staleness}",
        "env.agent=model",
        "env.tasks=[calculator]",
        "env.train_size=64",
        f"rollout.failure_policy={policy}",
        "rollout.max_retries=1",
    )
    _, state = _train(cfg, 4, make_env=_failing_every(3))
    c, cursor = state.counters, state.cursor
    assert c.steps == 4 and c.groups_failed > 0
    # Every issued group is accounted for exactly once.
    ended = [*cursor.trained, *cursor.dropped, *cursor.withdrawn]
    assert len(ended) == len(set(ended)) and set(ended) | cursor.pending == set(
        range(cursor.next_index)
    )
    per_step = cfg.learner.batch_size // cfg.rollout.group_size
    assert c.groups_trained == len(cursor.trained) == 4 * per_step


def test_published_weights_round_trip_bit_identically():
    cfg = micro_config()
    learner = Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=256)
    engine = Engine(build_model(cfg.model, seed=5), cfg.rollout, max_len=256)
    try:
        sent = learner.params_copy()
        record = WeightPublisher(engine).publish(sent, 1, learner_step=0)
        deadline = time.monotonic() + 10
        while engine.version != record.version and time.monotonic() < deadline:
            time.sleep(0.01)
            engine._cv.acquire()
            engine._cv.notify()
            engine._cv.release()
        held = engine._state[0]
        for a, b in zip(jax.tree.leaves(sent), jax.tree.leaves(held), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # The engine's copy survives the learner donating and overwriting its own buffers, and
        # serves exactly what an engine built from the learner's model serves.
        for x in jax.tree.leaves(sent):
            x.delete()
        reference = Engine(learner.model(), cfg.rollout, max_len=256)
        request = GenerateRequest(prompt=(5, 6, 7), params=SamplingParams(max_tokens=8, seed=1))
        got = asyncio.run(engine.generate(request))
        expected = asyncio.run(reference.generate(request))
        reference.close()
        assert got.tokens == expected.tokens and set(got.versions) == {record.version}
    finally:
        engine.close()


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_train_stage_runs_end_to_end(tmp_path, placement):
    from asyncrl.stages.train import TrainResult, train

    cfg = micro_config(
        "learner.steps=2",
        "learner.eval_every=2",
        "env.heldout_size=2",
        f"cluster.placement={placement}",
        "cluster.rollout_devices=2",
        "cluster.train_devices=2",
        "env.train_size=8",
    )
    layout = RunLayout.of(tmp_path)
    result = train(cfg, layout)
    assert result.steps == 2 and layout.read(TrainResult) == result
    assert (tmp_path / "train" / "learning_curve.png").stat().st_size > 0
    assert (tmp_path / "train" / "model" / "model.safetensors").exists()
    assert result.policy_lag_max <= cfg.learner.max_staleness
    from asyncrl.metrics.tracker import read_jsonl

    rows = read_jsonl(tmp_path / "train" / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    assert all(r["episodes"] == 4 and "status/cancelled" not in r for r in evals)
    assert [r["version"] for r in rows if r["kind"] == "train"] == [1.0, 2.0]
