"""The training loop: staleness bounds, sync ≡ async at zero lag, bit-identical weight publishes."""

import asyncio
import hashlib
import time

import jax
import numpy as np
import pytest

from asyncrl.envs.tasks import task_stream
from asyncrl.learner.learner import Learner
from asyncrl.learner.loop import StalenessAdmission
from asyncrl.model import build_model
from asyncrl.sampling.engine import Engine
from asyncrl.stages.common import Wiring
from asyncrl.stages.train import build_loop
from asyncrl.sync.publisher import WeightPublisher
from asyncrl.testing.configs import micro_config
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.types import FinishReason, GenerateRequest, SamplingParams


def test_admission_bounds_groups_by_version():
    async def go():
        adm = StalenessAdmission(groups_per_step=2, max_staleness=1)
        started = []

        async def starter():
            for i in range(10):
                await adm.wait()
                started.append(i)

        task = asyncio.create_task(starter())
        await asyncio.sleep(0.01)
        first = len(started)  # (0 + 1 + 1) * 2
        adm.advance(1)
        await asyncio.sleep(0.01)
        second = len(started)  # (1 + 1 + 1) * 2
        adm.forgive(1)
        await asyncio.sleep(0.01)
        third = len(started)
        task.cancel()
        return first, second, third

    assert asyncio.run(go()) == (4, 6, 7)


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


def _loop(cfg, engine, learner, admission_on: bool):
    return build_loop(cfg, Wiring.of(cfg), learner, engine, admission=admission_on)


def _train(cfg, steps, admission_on=True, slow_s=0.0):
    wiring = Wiring.of(cfg)
    engine = VersionedScript(wiring.fmt)
    learner = Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=cfg.env.max_context)
    if slow_s:
        step = learner.rl_step

        def slowed(batch):
            time.sleep(slow_s)
            return step(batch)

        learner.rl_step = slowed
    loop = _loop(cfg, engine, learner, admission_on)
    tasks = iter(task_stream(("calculator",), "train", 1000))
    stats = asyncio.run(loop.run(tasks, steps))
    return learner, stats


def test_publishing_every_second_step_keeps_training_and_bounds_lag():
    """With sync_every = 2 a version covers two steps' groups: admission must not starve."""
    cfg = micro_config(
        "learner.mode=async",
        "learner.max_staleness=1",
        "learner.sync_every=2",
        "env.agent=model",
        "env.tasks=[calculator]",
    )
    _, stats = _train(cfg, 6)
    assert stats.steps == 6 and max(stats.lags) <= 1


def test_async_with_zero_staleness_equals_sync():
    base = ("learner.lr=1e-3", "learner.sync_every=1", "env.agent=model", "env.tasks=[calculator]")
    sync_learner, _ = _train(micro_config(*base, "learner.mode=sync", "learner.max_staleness=0"), 3)
    async_learner, stats = _train(
        micro_config(*base, "learner.mode=async", "learner.max_staleness=0"), 3
    )
    assert stats.steps == 3 and max(stats.lags) == 0
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
    _, stats = _train(cfg, 4, admission_on=False, slow_s=0.3)
    assert stats.steps == 4
    assert max(stats.lags) <= 1
    assert stats.groups_dropped_stale > 0


def test_published_weights_round_trip_bit_identically():
    cfg = micro_config()
    learner = Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=256)
    engine = Engine(build_model(cfg.model, seed=5), cfg.rollout, max_len=256)
    try:
        publisher = WeightPublisher(engine)
        sent = learner.params_copy()
        version = publisher.publish(sent, learner_step=0)
        deadline = time.monotonic() + 10
        while engine.version != version and time.monotonic() < deadline:
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
        assert got.tokens == expected.tokens and set(got.versions) == {version}
    finally:
        engine.close()


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_train_stage_runs_end_to_end(tmp_path, placement):
    from asyncrl.stages.train import train

    cfg = micro_config(
        "learner.steps=2",
        "learner.eval_every=2",
        "env.heldout_size=2",
        f"cluster.placement={placement}",
        "cluster.rollout_devices=2",
        "cluster.train_devices=2",
        "env.train_size=8",
    )
    result = train(cfg, tmp_path)
    assert result.steps == 2
    assert (tmp_path / "train" / "learning_curve.png").stat().st_size > 0
    assert (tmp_path / "train" / "model" / "model.safetensors").exists()
    assert result.policy_lag_max <= cfg.learner.max_staleness
    from asyncrl.metrics.tracker import read_jsonl

    rows = read_jsonl(tmp_path / "train" / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    assert all(r["episodes"] == 4 and "status/cancelled" not in r for r in evals)
    assert [r["version"] for r in rows if r["kind"] == "train"] == [1.0, 2.0]
