"""Episodes, the orchestrator and the group queue: every status forced; groups flow on their own."""

import asyncio
import gc
import json
import random
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from asyncrl.agents import ModelAgent, ToolAgent
from asyncrl.config import EnvConfig
from asyncrl.envs.latency import DelayedEnvironment, DelayedTool, LatencySpec
from asyncrl.envs.registry import build_environment
from asyncrl.envs.tasks import calculator_task, heldout, lookup_task, task_stream
from asyncrl.envs.tool_env import ToolEnvironment
from asyncrl.rollout import event_loop
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.rollout.gc_tuning import GEN0_THRESHOLD, tuned_for_rollout
from asyncrl.rollout.groups import GroupQueue
from asyncrl.rollout.orchestrator import Orchestrator, OrchestratorSettings, numbered
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from asyncrl.tools.calculator import calculator
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.function import FunctionTool
from asyncrl.types import FinishReason, SamplingParams, Task, ToolCall, TrajectoryStatus

TOK = ByteTokenizer()
FMT = ChatFormat("chatml", TOK)
END = FMT.end_of_turn
ENV = EnvConfig(tool_timeout_s=0.5)
TASK = Task(id="t/0", family="calculator", prompt="347*12=?", answer="4164")
SAMPLING_STOP = (END,)
DEFAULT_LIMITS = EpisodeLimits()
# Engine log-probs vs a full forward of the finished trajectory: float32 op-order noise.
LOGPROB_TOL = 1e-4


def answer(text):
    return [*TOK.encode(text), END], FinishReason.STOP


def tool_call(name, **args):
    call = ToolCall(name=name, arguments_json=json.dumps(args))
    return [*FMT.tool_call_tokens(call), END], FinishReason.STOP


def by_turn(*replies):
    """A script that answers the n-th request of each session with replies[n] (last repeats)."""
    seen = {}

    def script(request):
        n = seen.get(request.session, 0)
        seen[request.session] = n + 1
        return replies[min(n, len(replies) - 1)]

    return script


def episode(engine, env=None, limits=DEFAULT_LIMITS, agent=None, task=TASK):
    spec = EpisodeSpec(
        episode_id="e0",
        group_id="g0",
        task=task,
        sampling=SamplingParams(max_tokens=200, stop_tokens=SAMPLING_STOP, seed=1),
    )
    env = env or build_environment(task, ENV)
    return Episode(spec, engine, agent or ToolAgent(FMT), env, limits)


def run(coro):
    return asyncio.run(coro)


def test_completed_episode_records_tokens_mask_logprobs_and_versions():
    replies = [tool_call("calculator", expression="347*12"), answer("4164")]
    engine = ScriptedEngine(by_turn(*replies))
    ep = episode(engine)
    traj = run(ep.run())
    assert traj.status == TrajectoryStatus.COMPLETED and traj.reward == 1.0
    assert traj.turns == 2
    sampled = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
    assert sampled == replies[0][0] + replies[1][0]
    assert all((lp == -1.0) == bool(m) for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True))
    assert all((v == 0) == bool(m) for v, m in zip(traj.versions, traj.loss_mask, strict=True))
    text = TOK.decode(traj.tokens)
    assert "<tool_response>\n4164\n</tool_response>" in text
    # The second request's prompt is the first turn's full sequence extended, not re-rendered.
    first, second = engine.requests
    assert second.prompt[: len(first.prompt)] == first.prompt
    assert second.session == first.session == "e0"
    assert ep.env.closed


def test_wrong_answer_completes_with_zero_reward():
    traj = run(episode(ScriptedEngine(by_turn(answer("12")))).run())
    assert traj.status == TrajectoryStatus.COMPLETED and traj.reward == 0.0
    assert dict(traj.reward_parts) == {"exact_match": 0.0, "format": 1.0}


def _failing_tool_env(task, spec):
    def executor(t):
        tools = (DelayedTool(FunctionTool(calculator), spec, random.Random(0)),)
        return ToolExecutor(tools, timeout_s=0.2, output_chars=100)

    return ToolEnvironment(executor)


@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("steps", TrajectoryStatus.TRUNCATED_STEPS),
        ("tokens", TrajectoryStatus.TRUNCATED_TOKENS),
        ("context", TrajectoryStatus.TRUNCATED_TOKENS),
        ("tool_output_past_context", TrajectoryStatus.TRUNCATED_TOKENS),
        ("timeout", TrajectoryStatus.TIMEOUT),
        ("tool_error", TrajectoryStatus.TOOL_ERROR),
        ("tool_hang", TrajectoryStatus.TIMEOUT),  # a hung tool is a timeout, not a tool failure
        ("env_error", TrajectoryStatus.ENV_ERROR),
        ("invalid_action", TrajectoryStatus.INVALID_ACTION),
        ("single_turn_tool_call", TrajectoryStatus.INVALID_ACTION),
    ],
)
def test_every_status_is_produced(case, status):
    call = tool_call("calculator", expression="1+1")
    engine, env, limits, agent = ScriptedEngine(by_turn(call)), None, EpisodeLimits(), None
    if case == "steps":
        limits = EpisodeLimits(max_steps=3)
    elif case == "tokens":
        engine = ScriptedEngine(by_turn(answer("9" * 500)))
    elif case == "context":
        limits = EpisodeLimits(max_context=40)
    elif case == "tool_output_past_context":
        limits = EpisodeLimits(max_context=80)  # the call fits; the tool's response does not
    elif case == "timeout":
        engine = ScriptedEngine(by_turn(answer("4164")), delay_s=5)
        limits = EpisodeLimits(timeout_s=0.1)
    elif case == "tool_error":
        env = _failing_tool_env(TASK, LatencySpec(failure_prob=1.0))
    elif case == "tool_hang":
        env = _failing_tool_env(TASK, LatencySpec(kind="fixed", p50_s=3600))
    elif case == "env_error":
        env = DelayedEnvironment(
            build_environment(TASK, ENV), LatencySpec(failure_prob=1.0), random.Random(0)
        )
    elif case == "invalid_action":
        engine = ScriptedEngine(
            by_turn(([FMT.call_open, *TOK.encode("{bad"), END], FinishReason.STOP))
        )
        env = build_environment(TASK, replace(ENV, malformed_tool_call="terminate"))
    elif case == "single_turn_tool_call":
        env = build_environment(replace(TASK, environment="task"), ENV)
    traj = run(episode(engine, env, limits, agent).run())
    assert traj.status == status
    assert traj.reward == 0.0
    assert len(traj.tokens) <= limits.max_context


def test_malformed_call_becomes_an_observation_and_the_episode_goes_on():
    bad = ([FMT.call_open, *TOK.encode('{"name": "calculator"'), END], FinishReason.STOP)
    traj = run(episode(ScriptedEngine(by_turn(bad, answer("4164")))).run())
    assert traj.status == TrajectoryStatus.COMPLETED and traj.reward == 1.0
    assert "error: <tool_call> is never closed" in TOK.decode(traj.tokens)


def test_model_agent_takes_the_first_response():
    traj = run(
        episode(
            ScriptedEngine(by_turn(answer("4164"))),
            agent=ModelAgent(FMT),
            env=build_environment(replace(TASK, environment="task"), ENV),
        ).run()
    )
    assert traj.status == TrajectoryStatus.COMPLETED and traj.reward == 1.0 and traj.turns == 1


def test_cancellation_mid_episode_closes_the_environment():
    engine = ScriptedEngine(by_turn(answer("4164")), delay_s=60)
    ep = episode(engine)

    async def go():
        job = asyncio.create_task(ep.run())
        await asyncio.sleep(0.05)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    run(go())
    assert ep.env.closed
    assert ep.trajectory(TrajectoryStatus.CANCELLED).status == TrajectoryStatus.CANCELLED


# -- orchestrator and group queue ----------------------------------------------------------------


def _orchestrator(engine, queue, make_env=None, group_size=4, concurrency=16, timeout_s=30.0):
    settings = OrchestratorSettings(
        group_size=group_size,
        max_concurrency=concurrency,
        limits=EpisodeLimits(timeout_s=timeout_s),
        sampling=SamplingParams(max_tokens=200, stop_tokens=SAMPLING_STOP),
    )
    return Orchestrator(
        engine,
        queue,
        settings,
        make_env=make_env or (lambda t: build_environment(t, ENV)),
        make_agent=lambda: ToolAgent(FMT),
    )


class GatedEnv:
    """Answers immediately, except that members named in `hold` wait for `gate`."""

    def __init__(self, task, gate, hold):
        self.inner = build_environment(task, ENV)
        self.task, self.gate, self.hold = task, gate, hold
        self.closed = False

    async def reset(self, task):
        if task.id in self.hold:
            await self.gate.wait()
        return await self.inner.reset(task)

    async def step(self, action):
        return await self.inner.step(action)

    async def close(self):
        self.closed = True


def test_a_straggler_holds_back_only_its_own_group():
    tasks = [replace(TASK, id="slow"), replace(TASK, id="fast")]

    async def go():
        gate = asyncio.Event()
        queue = GroupQueue(group_size=4)
        orch = _orchestrator(
            ScriptedEngine(by_turn(answer("4164"))),
            queue,
            make_env=lambda t: GatedEnv(t, gate, {"slow"}),
        )
        runner = asyncio.create_task(orch.run(numbered(tasks)))
        first = await asyncio.wait_for(queue.get(), 10)
        stats = queue.stats()
        gate.set()
        second = await asyncio.wait_for(queue.get(), 10)
        await runner
        return first, stats, second

    first, stats, second = run(go())
    assert first.task_id == "fast" and second.task_id == "slow"
    assert stats.open == 1 and stats.oldest_open_s > 0


@pytest.mark.parametrize("concurrency", [6, 8])
def test_stop_withdraws_a_half_started_group_and_finishes_the_started_ones(concurrency):
    """Members start as others end (no slot left for the second group's last members at 6): a
    stop() meanwhile withdraws that half-started group, counted, when the next slot frees; a
    fully started group runs to its end."""
    tasks = [replace(TASK, id="fast"), replace(TASK, id="slow")]
    ended = []

    async def go():
        gate = asyncio.Event()  # never set: the second group's members wait until cancelled
        queue = GroupQueue(group_size=4, on_end=lambda number, outcome: ended.append(number))
        orch = _orchestrator(
            ScriptedEngine(by_turn(answer("4164")), delay_s=0.2),
            queue,
            make_env=lambda t: GatedEnv(t, gate, {"slow"}),
            concurrency=concurrency,
        )
        runner = asyncio.create_task(orch.run(numbered(tasks)))
        await asyncio.sleep(0.05)
        started = orch.active
        orch.stop()
        if concurrency == 8:  # both groups fully started: the gated one must be let through
            await asyncio.sleep(0.3)
            gate.set()
        await asyncio.wait_for(runner, 10)
        return orch, queue, started

    orch, queue, started = run(go())
    stats = queue.stats()
    assert started == concurrency and orch.free_slots == concurrency
    assert stats.open == 0 and stats.released == (1 if concurrency == 6 else 2)
    if concurrency == 6:
        assert stats.withdrawn == 1 and ended == [1]
        assert orch.status_counts[TrajectoryStatus.CANCELLED] == 2
    else:
        assert stats.withdrawn == 0 and ended == []


def _flaky_engine(fail_members, fail_times=1):
    """Times out (too slow) for the first `fail_times` attempts of the named members."""
    attempts = {}

    def script(request):
        return answer("4164")

    engine = ScriptedEngine(script)
    original = engine.generate

    async def generate(request):
        member = request.session.split("/")[-1].split("~")[0]
        key = request.session.split("~")[0]
        attempts[key] = attempts.get(key, 0) + 1
        if member in fail_members and attempts[key] <= fail_times:
            await asyncio.sleep(60)
        return await original(request)

    engine.generate = generate
    return engine


@pytest.mark.parametrize("policy", ["drop", "zero", "retry"])
def test_failure_policies(policy):
    async def go():
        queue = GroupQueue(group_size=4, policy=policy, max_retries=2)
        orch = _orchestrator(_flaky_engine({"1"}), queue, timeout_s=0.2)
        await orch.run(numbered([TASK]))
        return queue, orch

    queue, orch = run(go())
    group = queue.get_nowait()
    if policy == "drop":
        assert group is None and queue.stats().dropped == 1
    elif policy == "zero":
        statuses = sorted(t.status for t in group.trajectories)
        assert statuses.count(TrajectoryStatus.TIMEOUT) == 1
        assert [t.reward for t in group.trajectories if t.status == "timeout"] == [0.0]
        assert sum(t.reward for t in group.trajectories) == 3.0
    else:
        assert orch.retries == 1
        assert all(t.status == TrajectoryStatus.COMPLETED for t in group.trajectories)
        assert sorted(t.id for t in group.trajectories)[1].endswith("/1~1")


def test_the_rollout_loop_is_uvloop_and_ends_episodes_as_asyncio_does():
    """The train stage's loop (rollout/event_loop.py): a deadline still ends a hung member."""

    async def go():
        queue = GroupQueue(group_size=4, policy="zero")
        orch = _orchestrator(_flaky_engine({"1"}), queue, timeout_s=0.2)
        await orch.run(numbered([TASK]))
        members = queue.get_nowait().trajectories
        kind = type(asyncio.get_running_loop()).__module__
        return kind, sorted((t.id, t.status, t.reward, t.tokens) for t in members)

    kind, on_rollout_loop = event_loop.run(go())
    _, on_asyncio = asyncio.run(go())
    assert kind.startswith("uvloop") and on_rollout_loop == on_asyncio
    assert [status for _, status, _, _ in on_asyncio].count(TrajectoryStatus.TIMEOUT) == 1


def test_retries_are_bounded_then_the_group_is_dropped():
    async def go():
        queue = GroupQueue(group_size=2, policy="retry", max_retries=2)
        orch = _orchestrator(
            _flaky_engine({"0"}, fail_times=99), queue, group_size=2, timeout_s=0.1
        )
        await orch.run(numbered([TASK]))
        return queue, orch

    queue, orch = run(go())
    assert orch.retries == 2 and queue.get_nowait() is None and queue.stats().dropped == 1


def test_group_members_get_distinct_seeds_and_concurrency_is_bounded():
    peak, running = [0], [0]

    async def go():
        engine = ScriptedEngine(by_turn(answer("4164")), delay_s=0.01)
        original = engine.generate

        async def generate(request):
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            try:
                return await original(request)
            finally:
                running[0] -= 1

        engine.generate = generate
        queue = GroupQueue(group_size=4, max_ready=64)
        orch = _orchestrator(engine, queue, concurrency=8)
        await orch.run(numbered(task_stream(("calculator",), "train", 6)))
        return engine, queue

    engine, queue = run(go())
    assert peak[0] == 8
    assert queue.stats().released == 6
    seeds = [r.params.seed for r in engine.requests]
    assert len(set(seeds)) == len(seeds)


def test_orchestrator_cancel_records_cancelled_members_and_closes_envs():
    envs = []

    def make_env(task):
        env = GatedEnv(task, asyncio.Event(), {task.id})
        envs.append(env)
        return env

    async def go():
        queue = GroupQueue(group_size=4)
        orch = _orchestrator(ScriptedEngine(by_turn(answer("1"))), queue, make_env=make_env)
        runner = asyncio.create_task(orch.run(numbered([TASK])))
        while orch.active < 4:
            await asyncio.sleep(0.01)
        await orch.cancel()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return orch

    orch = run(go())
    assert orch.status_counts[TrajectoryStatus.CANCELLED] == 4
    assert all(e.closed for e in envs)


def test_task_generators_are_deterministic_and_heldout_is_disjoint():
    assert calculator_task("train", 5) == calculator_task("train", 5)
    assert lookup_task("heldout", 3, seed=1) == lookup_task("heldout", 3, seed=1)
    train = {(t.prompt, t.table) for t in task_stream(("calculator", "lookup"), "train", 500)}
    held = heldout(("calculator", "lookup"), 32)
    assert len(held) == 64
    assert sum((t.prompt, t.table) in train for t in held) <= 2  # independent draws may collide
    for t in held:
        if t.family == "lookup":
            prices = dict(t.table)
            a, b = t.prompt.rstrip("=?").split("+")
            assert int(t.answer) == int(prices[a]) + int(prices[b])


def test_real_engine_episodes_record_the_engines_logprobs():
    """The tiny model through the orchestrator: masked tokens carry the engine's own log-probs."""
    from asyncrl.model import build_model
    from asyncrl.sampling.engine import Engine
    from asyncrl.testing.configs import micro_config
    from asyncrl.testing.decoding import full_logprobs

    cfg = micro_config("rollout.engine_slots=8")
    model = build_model(cfg.model, seed=0)
    engine = Engine(model, cfg.rollout, max_len=cfg.env.max_context, vocab_limit=TOK.vocab_size)

    async def go():
        queue = GroupQueue(group_size=4, max_ready=8)
        settings = OrchestratorSettings(
            group_size=4,
            max_concurrency=8,
            limits=EpisodeLimits(max_steps=3, max_response_tokens=60, max_context=256),
            sampling=SamplingParams(max_tokens=24, stop_tokens=SAMPLING_STOP),
        )
        orch = Orchestrator(
            engine,
            queue,
            settings,
            make_env=lambda t: build_environment(t, ENV),
            make_agent=lambda: ToolAgent(FMT),
        )
        await orch.run(numbered(task_stream(("calculator", "lookup"), "train", 1)))
        return [queue.get_nowait() for _ in range(2)]

    try:
        groups = run(go())
    finally:
        engine.close()
    for group in groups:
        assert len({t.tokens for t in group.trajectories}) == 4  # members differ
        for traj in group.trajectories:
            ref = full_logprobs(model, traj.tokens, TOK.vocab_size)
            idx = [i for i, m in enumerate(traj.loss_mask) if m]
            got = np.asarray(traj.logprobs)[idx]
            np.testing.assert_allclose(
                got, ref[np.asarray(idx) - 1, np.asarray(traj.tokens)[idx]], atol=LOGPROB_TOL
            )


def test_tune_for_rollout_freezes_the_heap_and_raises_the_gen0_threshold():
    script = (
        "import gc; from asyncrl.rollout.gc_tuning import GEN0_THRESHOLD, tune_for_rollout\n"
        "before = gc.get_threshold()\n"
        "tune_for_rollout()\n"
        "after = gc.get_threshold()\n"
        "print(after[0] == GEN0_THRESHOLD, after[1:] == before[1:], gc.get_freeze_count() > 1000)"
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.split()) == (0, ["True", "True", "True"])


def test_tuned_for_rollout_restores_the_collector_after_the_block_even_when_it_raises():
    """The train stage runs its loop under it: a stage inside pytest leaves gc as it was."""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(RuntimeError), tuned_for_rollout():
        assert gc.get_threshold() == (GEN0_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > frozen
        raise RuntimeError("the loop failed")
    assert gc.get_threshold() == before
    assert (gc.get_freeze_count() == 0) == (frozen == 0)  # a heap frozen before stays frozen
