"""Bad inputs to episodes: malformed tool calls, hostile tools and environments, broken factories.

Each case asserts the exact outcome (a status, the text the model sees, a count) and, where the
point is that nothing hangs, that the outcome arrives within the stated bound (`deadlines.GRACE_S`,
`episode.EPISODE_GRACE_S`) plus `SLACK_S` of scheduling slack.
"""

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from asyncrl.agents import ToolAgent
from asyncrl.config import EnvConfig
from asyncrl.config.errors import ConfigError
from asyncrl.envs.base import ActionKind
from asyncrl.envs.registry import build_environment, register
from asyncrl.envs.tool_env import ToolEnvironment
from asyncrl.learner.batching import build_batch
from asyncrl.rollout.episode import (
    EPISODE_GRACE_S,
    Episode,
    EpisodeLimits,
    EpisodeSpec,
)
from asyncrl.rollout.groups import GroupQueue
from asyncrl.rollout.orchestrator import Orchestrator, OrchestratorSettings, numbered
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from asyncrl.tokenize.call_json import MAX_CALL_CHARS, MAX_DEPTH, MAX_NUMBER_CHARS
from asyncrl.tools import deadlines, threads
from asyncrl.tools.base import ToolStatus
from asyncrl.tools.calculator import calculator
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.function import FunctionTool
from asyncrl.tools.threads import ToolThreads
from asyncrl.types import (
    Completion,
    FinishReason,
    GroupOutcome,
    SamplingParams,
    Task,
    ToolCall,
    Trajectory,
)
from asyncrl.types import TrajectoryStatus as S

TOK = ByteTokenizer()
CHATML = ChatFormat("chatml", TOK)
LLAMA = ChatFormat("llama3", TOK)
END = CHATML.end_of_turn
ENV = EnvConfig(tool_timeout_s=0.2)
TASK = Task(id="t/0", family="calculator", prompt="347*12=?", answer="4164")
SLACK_S = 0.5  # scheduling slack on top of every stated time bound
TOOL_TIMEOUT_S = 0.1
OUTPUT_CHARS = 100


def run(coro):
    return asyncio.run(coro)


def timed(coro):
    t0 = time.monotonic()
    result = run(coro)
    return result, time.monotonic() - t0


def completion(tokens):
    n = len(tokens)
    return Completion(
        tokens=tuple(tokens),
        logprobs=(-1.0,) * n,
        raw_logprobs=(-1.0,) * n,
        versions=(0,) * n,
        finish_reason=FinishReason.STOP,
    )


def chatml_call(body: str):
    return [CHATML.call_open, *TOK.encode(body), CHATML.call_close, END]


def answer(text):
    return [*TOK.encode(text), END], FinishReason.STOP


def by_turn(*replies):
    seen = {}

    def script(request):
        n = seen.get(request.session, 0)
        seen[request.session] = n + 1
        return replies[min(n, len(replies) - 1)]

    return script


LIMITS = EpisodeLimits(timeout_s=5.0)


def episode(engine, env, limits=LIMITS):
    spec = EpisodeSpec(
        episode_id="e0",
        group_id="g0",
        task=TASK,
        sampling=SamplingParams(max_tokens=400, stop_tokens=(END,), seed=1),
    )
    return Episode(spec, engine, ToolAgent(CHATML), env, limits)


# -- the model's tool calls: limits become what the model reads ---------------------------------

NESTED = '{"name": "calculator", "arguments": {"expression": ' + "[" * 5000 + "]" * 5000 + "}}"
BIG_INT = '{"name": "calculator", "arguments": {"expression": ' + "7" * 5000 + "}}"
LONG = '{"name": "calculator", "arguments": {"expression": "' + "1+" * MAX_CALL_CHARS + '1"}}'


def _depth(n):
    return '{"name": "calculator", "arguments": {"x": ' + "[" * (n - 2) + "]" * (n - 2) + "}}"


def _number(n):
    return '{"name": "calculator", "arguments": {"x": ' + "9" * n + "}}"


@pytest.mark.parametrize(
    ("fmt", "body", "error"),
    [
        (CHATML, NESTED, f"tool call nests deeper than {MAX_DEPTH} levels"),
        (CHATML, BIG_INT, f"tool call has a number longer than {MAX_NUMBER_CHARS} characters"),
        (CHATML, LONG, f"characters long; the limit is {MAX_CALL_CHARS}"),
        (CHATML, _depth(MAX_DEPTH + 1), f"tool call nests deeper than {MAX_DEPTH} levels"),
        (CHATML, _number(MAX_NUMBER_CHARS + 1), "tool call has a number longer than"),
        (LLAMA, NESTED.replace('"arguments"', '"parameters"'), "tool call nests deeper than"),
        (LLAMA, BIG_INT.replace('"arguments"', '"parameters"'), "tool call has a number longer"),
    ],
)
def test_a_call_over_the_limits_is_a_malformed_action_with_the_reason(fmt, body, error):
    tokens = chatml_call(body) if fmt is CHATML else [*TOK.encode(body), fmt.end_of_turn]
    agent = ToolAgent(fmt)
    agent.start(())
    agent.prompt()
    action = agent.record(completion(tokens))
    assert action.kind == ActionKind.MALFORMED
    assert error in action.error


@pytest.mark.parametrize(
    ("body", "arguments"),
    [
        (_depth(MAX_DEPTH), {"x": json.loads("[" * 30 + "]" * 30)}),  # exactly at the limit
        (_number(MAX_NUMBER_CHARS), {"x": int("9" * MAX_NUMBER_CHARS)}),
        # brackets and digits inside a string are text, not structure
        (
            '{"name": "calculator", "arguments": {"expression": "' + "[" * 500 + "9" * 500 + '"}}',
            {"expression": "[" * 500 + "9" * 500},
        ),
    ],
)
def test_a_call_within_the_limits_is_parsed(body, arguments):
    agent = ToolAgent(CHATML)
    agent.start(())
    agent.prompt()
    action = agent.record(completion(chatml_call(body)))
    assert action.kind == ActionKind.TOOL_CALLS
    assert json.loads(action.tool_calls[0].arguments_json) == arguments


@pytest.mark.parametrize(
    ("malformed", "status"), [("observation", S.COMPLETED), ("terminate", S.INVALID_ACTION)]
)
@pytest.mark.parametrize("body", [_depth(40), _number(150)])
def test_a_call_over_the_limits_never_ends_the_episode_as_env_error(malformed, status, body):
    engine = ScriptedEngine(by_turn((chatml_call(body), FinishReason.STOP), answer("4164")))
    env = build_environment(TASK, replace(ENV, malformed_tool_call=malformed))
    traj = run(episode(engine, env).run())
    assert traj.status == status
    if malformed == "observation":
        assert "error: tool call " in TOK.decode(traj.tokens) and traj.reward == 1.0


# -- the executor: arguments, tool failures, error text, deadlines ------------------------------


class RawTool:
    """A Tool written against the protocol directly (not a FunctionTool): does what it is told."""

    description = "misbehaves"

    def __init__(self, name, behaviour):
        self.name, self.behaviour = name, behaviour
        self.schema = {"type": "object", "properties": {}, "additionalProperties": True}

    async def __call__(self, **arguments):
        return await self.behaviour()


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


async def _flood_error():
    raise RuntimeError("x" * 50_000_000)


async def _unprintable():
    raise Unprintable()


async def _returns_int():
    return 42


async def _exits():
    raise SystemExit(3)


async def _ignores_cancel():
    while True:  # the point: a coroutine that swallows every cancellation
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


def _executor(*tools, timeout_s=TOOL_TIMEOUT_S):
    return ToolExecutor(tools, timeout_s=timeout_s, output_chars=OUTPUT_CHARS)


@pytest.mark.parametrize(
    ("arguments_json", "error"),
    [
        ('{"expression": ' + "[" * 5000 + "]" * 5000 + "}", "nests deeper than"),
        ('{"expression": ' + "7" * 5000 + "}", "number longer than"),
        ('{"expression": "' + "x" * (MAX_CALL_CHARS + 1) + '"}', "characters long"),
        ("[1, 2]", "is not of type 'object'"),
    ],
)
def test_arguments_over_the_limits_are_invalid_arguments(arguments_json, error):
    ex = _executor(FunctionTool(calculator))
    result = run(ex.call(ToolCall(name="calculator", arguments_json=arguments_json)))
    assert result.status == ToolStatus.INVALID_ARGUMENTS
    assert error in result.observation()


@pytest.mark.parametrize(
    ("behaviour", "status", "observation"),
    [
        (_flood_error, ToolStatus.ERROR, "error (error): RuntimeError: " + "x" * 85),
        (_unprintable, ToolStatus.ERROR, "error (error): Unprintable: <the error's message"),
        (_returns_int, ToolStatus.ERROR, "error (error): the tool returned int, not text"),
        (_exits, ToolStatus.ERROR, "error (error): Escaped: SystemExit(3)"),
        (
            _ignores_cancel,
            ToolStatus.TIMEOUT,
            f"error (timeout): no result within {TOOL_TIMEOUT_S}",
        ),
    ],
)
def test_a_misbehaving_tool_is_one_bounded_status(behaviour, status, observation):
    dropped = deadlines.DROPPED["tool raw"]
    result, seconds = timed(_executor(RawTool("raw", behaviour)).call(ToolCall(name="raw")))
    assert result.status == status
    assert result.observation().startswith(observation)
    assert len(result.error) <= OUTPUT_CHARS + len(" …[truncated]")
    assert seconds < TOOL_TIMEOUT_S + deadlines.GRACE_S + SLACK_S
    assert deadlines.DROPPED["tool raw"] - dropped == (behaviour is _ignores_cancel)


def _blocking_tools(pool, release):
    def stuck() -> str:
        """Hang until released."""
        release.wait(60)
        return "late"

    def healthy() -> str:
        """Answer at once, naming the thread."""
        return threading.current_thread().name

    return FunctionTool(stuck, pool=pool), FunctionTool(healthy, pool=pool)


def test_hung_sync_tools_are_abandoned_and_replaced_so_healthy_ones_still_run():
    release = threading.Event()
    pool = ToolThreads(2, name="pooltest")
    ex = _executor(*_blocking_tools(pool, release))

    async def go():
        hung = await ex.call_all([ToolCall(name="stuck")] * 2)
        return hung, await ex.call(ToolCall(name="healthy"))

    try:
        (hung, ok), seconds = timed(go())
        stats = pool.stats()
    finally:
        release.set()
    assert [r.status for r in hung] == [ToolStatus.TIMEOUT] * 2
    assert ok.status == ToolStatus.OK and ok.output.startswith("pooltest-")  # not asyncio's pool
    assert (stats.abandoned_total, stats.abandoned_now, stats.threads) == (2, 2, 4)
    assert seconds < 2 * TOOL_TIMEOUT_S + SLACK_S


def test_beyond_the_spare_threads_a_hung_tool_keeps_its_worker_and_the_pool_stays_bounded():
    release = threading.Event()
    pool = ToolThreads(1, spare=0)
    ex = _executor(*_blocking_tools(pool, release))

    async def go():
        return [await ex.call(ToolCall(name=n)) for n in ("stuck", "healthy")]

    try:
        hung, starved = run(go())
        stats = pool.stats()
    finally:
        release.set()
    assert (hung.status, starved.status) == (ToolStatus.TIMEOUT, ToolStatus.TIMEOUT)
    assert (stats.threads, stats.abandoned_total, stats.skipped_total) == (1, 1, 1)


def test_abandoned_threads_of_the_shared_pools_are_counted_for_operators():
    release = threading.Event()
    pool = threads.shared(7)  # a size no other test uses
    ex = _executor(*_blocking_tools(pool, release))
    before = threads.shared_stats()
    try:
        result = run(ex.call(ToolCall(name="stuck")))
        after = threads.shared_stats()
    finally:
        release.set()
    assert result.status == ToolStatus.TIMEOUT
    assert after.abandoned_total - before.abandoned_total == 1
    assert after.abandoned_now - before.abandoned_now == 1


def test_sync_tools_run_at_most_workers_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    def busy() -> str:
        """Work a little."""
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return "ok"

    ex = _executor(FunctionTool(busy, pool=ToolThreads(3)), timeout_s=5)
    results = run(ex.call_all([ToolCall(name="busy")] * 9))
    assert [r.status for r in results] == [ToolStatus.OK] * 9 and peak[0] == 3


def test_a_hung_sync_tool_does_not_block_the_process_exit():
    script = """
import asyncio, time
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.function import FunctionTool
from asyncrl.tools.threads import ToolThreads
from asyncrl.types import ToolCall

def stuck() -> str:
    "Hang."
    time.sleep(3600)
    return ""

ex = ToolExecutor([FunctionTool(stuck, pool=ToolThreads(1))], timeout_s=0.1, output_chars=9)
print(asyncio.run(ex.call(ToolCall(name="stuck"))).status)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout.strip()) == (0, "timeout")


# -- environments: every failure is a status, every hang is bounded -----------------------------


class HostileEnv:
    """A tool environment whose reset, step or close misbehaves as told."""

    def __init__(self, reset=None, step=None, close=None):
        self.inner = build_environment(TASK, ENV)
        self.how = {"reset": reset, "step": step, "close": close}
        self.close_calls = 0

    async def _maybe(self, what):
        how = self.how[what]
        if how == "raise":
            raise RuntimeError(f"{what} broke")
        if how == "exit":
            raise SystemExit(1)
        if how == "hang":
            await _ignores_cancel()

    async def reset(self, task):
        await self._maybe("reset")
        if self.how["reset"] == "garbage":
            return None
        return await self.inner.reset(task)

    async def step(self, action):
        await self._maybe("step")
        return await self.inner.step(action)

    async def close(self):
        self.close_calls += 1
        await self._maybe("close")


EPISODE_TIMEOUT_S = 0.3


@pytest.mark.parametrize(
    ("how", "status", "error", "dropped"),
    [
        ({"reset": "raise"}, S.ENV_ERROR, "RuntimeError: reset broke", ()),
        ({"step": "raise"}, S.ENV_ERROR, "RuntimeError: step broke", ()),
        ({"reset": "exit"}, S.ENV_ERROR, "Escaped: SystemExit(1)", ()),
        ({"reset": "garbage"}, S.ENV_ERROR, "TypeError: ", ()),
        ({"reset": "hang"}, S.TIMEOUT, "", ("episode",)),
        ({"step": "hang"}, S.TIMEOUT, "", ("episode",)),
        ({"close": "raise"}, S.COMPLETED, "", ()),
        ({"close": "hang"}, S.COMPLETED, "", ("environment close",)),
        ({"reset": "hang", "close": "hang"}, S.TIMEOUT, "", ("episode", "environment close")),
    ],
)
def test_every_environment_failure_is_a_status_within_the_deadline(how, status, error, dropped):
    before = dict(deadlines.DROPPED)
    env = HostileEnv(**how)
    call = ToolCall(name="calculator", arguments_json='{"expression": "1+1"}')
    engine = ScriptedEngine(by_turn(([*CHATML.tool_call_tokens(call), END], FinishReason.STOP)))
    ep = episode(engine, env, EpisodeLimits(timeout_s=EPISODE_TIMEOUT_S, max_steps=1))
    if how.get("step") is None and how.get("reset") is None:
        ep = episode(ScriptedEngine(by_turn(answer("4164"))), env)
    traj, seconds = timed(ep.run())
    assert traj.status == status and env.close_calls == 1
    assert ep.error.startswith(error) if error else ep.error == ""
    assert bool(ep.close_error) == ("close" in how)
    assert len(traj.tokens) > 0  # a stand-in prompt when reset never returned: never empty
    if "reset" in how:
        assert sum(traj.loss_mask) == 0 and traj.turns == 0
    assert seconds < EPISODE_TIMEOUT_S + EPISODE_GRACE_S + SLACK_S
    grown = {k for k in deadlines.DROPPED if deadlines.DROPPED[k] > before.get(k, 0)}
    assert grown == set(dropped)


def test_an_episode_cancelled_under_a_hostile_environment_ends_within_the_grace():
    env = HostileEnv(reset="hang", close="hang")
    ep = episode(ScriptedEngine(by_turn(answer("4164"))), env, EpisodeLimits(timeout_s=60))

    async def go():
        job = asyncio.create_task(ep.run())
        await asyncio.sleep(0.05)
        job.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await job
        return time.monotonic() - t0

    seconds = run(go())
    assert seconds < EPISODE_GRACE_S + SLACK_S
    assert env.close_calls == 1 and ep.close_error.startswith("TimeoutError")


@pytest.mark.parametrize(
    ("tool", "status"),
    [
        (RawTool("calculator", _ignores_cancel), S.TIMEOUT),
        (RawTool("calculator", _flood_error), S.TOOL_ERROR),
        (RawTool("calculator", _exits), S.TOOL_ERROR),
    ],
)
def test_a_hostile_tool_ends_the_episode_with_its_own_status(tool, status):
    env = ToolEnvironment(lambda t: _executor(tool))
    call = ToolCall(name="calculator", arguments_json="{}")
    engine = ScriptedEngine(by_turn(([*CHATML.tool_call_tokens(call), END], FinishReason.STOP)))
    traj, seconds = timed(episode(engine, env).run())
    assert traj.status == status
    assert seconds < TOOL_TIMEOUT_S + deadlines.GRACE_S + SLACK_S


def test_cancelling_an_episode_drops_only_its_hostile_tool_not_the_episode():
    env = ToolEnvironment(lambda t: _executor(RawTool("calculator", _ignores_cancel), timeout_s=60))
    call = ToolCall(name="calculator", arguments_json="{}")
    engine = ScriptedEngine(by_turn(([*CHATML.tool_call_tokens(call), END], FinishReason.STOP)))
    ep = episode(engine, env)
    before = dict(deadlines.DROPPED)

    async def go():
        job = asyncio.create_task(ep.run())
        await asyncio.sleep(0.1)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    run(go())
    grown = {k: v - before.get(k, 0) for k, v in deadlines.DROPPED.items() if v > before.get(k, 0)}
    assert grown == {"tool calculator": 1}


# -- the orchestrator: factories and members that fail, groups that end once ---------------------


def _orchestrator(make_env, *, policy="zero", make_agent=None, ended=None):
    queue = GroupQueue(
        group_size=2,
        policy=policy,
        on_end=None if ended is None else (lambda n, o: ended.append((n, o))),
    )
    settings = OrchestratorSettings(
        group_size=2,
        max_concurrency=4,
        limits=EpisodeLimits(timeout_s=EPISODE_TIMEOUT_S, max_steps=2),
        sampling=SamplingParams(max_tokens=200, stop_tokens=(END,)),
    )
    orch = Orchestrator(
        ScriptedEngine(by_turn(answer("4164"))),
        queue,
        settings,
        make_env=make_env,
        make_agent=make_agent or (lambda: ToolAgent(CHATML)),
    )
    return orch, queue


def _raising_factory(task):
    raise RuntimeError("factory broke")


register("test-raising", lambda task, cfg, limits: _raising_factory(task))


@pytest.mark.parametrize(
    ("make_env", "policy", "released", "dropped"),
    [
        (_raising_factory, "zero", 1, 0),
        (_raising_factory, "drop", 0, 1),
        (lambda t: build_environment(replace(t, environment="nowhere"), ENV), "zero", 1, 0),
        (lambda t: build_environment(replace(t, environment="test-raising"), ENV), "drop", 0, 1),
    ],
)
def test_a_failing_factory_is_counted_env_error_and_the_group_ends(
    make_env, policy, released, dropped
):
    ended = []
    orch, queue = _orchestrator(make_env, policy=policy, ended=ended)
    run(orch.run(numbered([TASK])))
    stats = queue.stats()
    counts = orch.status_counts
    assert stats.open == 0
    assert orch.health()["env_build_failures"] == orch.env_build_failures
    # Every member that ran failed at its factory; under "drop" the first failure dooms the group,
    # and a member not yet started then never runs its factory at all (cancelled instead).
    assert orch.env_build_failures == counts[S.ENV_ERROR]
    assert counts[S.ENV_ERROR] == 2 if policy == "zero" else counts[S.ENV_ERROR] >= 1
    assert counts[S.ENV_ERROR] + counts[S.CANCELLED] == 2  # one status per member
    assert (stats.released, stats.dropped) == (released, dropped)
    assert ended == ([(0, GroupOutcome.FAILED)] if dropped else [])
    group = queue.get_nowait()
    if released:
        assert all(t.status == S.ENV_ERROR and t.tokens for t in group.trajectories)


def test_a_member_that_cannot_run_drops_its_group_and_is_counted():
    ended = []

    def broken_agent():
        raise RuntimeError("agent broke")

    orch, queue = _orchestrator(
        lambda t: build_environment(t, ENV), make_agent=broken_agent, ended=ended
    )
    run(orch.run(numbered([TASK])))
    counts = orch.status_counts
    assert orch.member_failures >= 1 and counts[S.ENV_ERROR] == orch.member_failures
    assert counts[S.ENV_ERROR] + counts[S.CANCELLED] == 2  # one status per member
    assert ended == [(0, GroupOutcome.FAILED)] and queue.stats().open == 0
    assert orch.free_slots == 4  # every slot freed, also a member cancelled before it ran


def test_orchestrator_cancel_returns_within_the_grace_whatever_the_environments_do():
    ended = []
    orch, _ = _orchestrator(lambda t: HostileEnv(reset="hang", close="hang"), ended=ended)
    orch.settings = replace(orch.settings, limits=EpisodeLimits(timeout_s=60))

    async def go():
        runner = asyncio.create_task(orch.run(numbered([TASK, replace(TASK, id="t/1")])))
        while orch.active < 4:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await orch.cancel()
        seconds = time.monotonic() - t0
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return seconds

    dropped = sum(deadlines.DROPPED.values())
    seconds = run(go())
    assert seconds < EPISODE_GRACE_S + SLACK_S
    assert orch.status_counts[S.CANCELLED] == 4 and orch.env_close_failures == 4
    health = orch.health()  # what the training loop logs each step
    assert health["env_close_failures"] == 4.0
    assert health["dropped_after_grace"] - dropped == 8.0  # 4 episodes + 4 closes ignored it
    assert sorted(ended) == [(0, GroupOutcome.WITHDRAWN), (1, GroupOutcome.WITHDRAWN)]


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "ok"), [(0, False), (1, True), (256, True), (257, False)])
def test_tool_workers_is_bounded(workers, ok):
    if ok:
        assert EnvConfig(tool_workers=workers).tool_workers == workers
    else:
        with pytest.raises(ConfigError, match=r"tool_workers.*\[1, 256\]"):
            EnvConfig(tool_workers=workers)


# -- the learner's batching: trajectories too short to train ------------------------------------


def _trajectory(n_tokens, number):
    n = n_tokens
    return Trajectory(
        id=f"t{number}",
        group_id="g",
        task_id="t",
        tokens=tuple(range(5, 5 + n)),
        loss_mask=(1,) * n,
        logprobs=(-0.5,) * n,
        versions=(0,) * n,
        reward=1.0,
    )


@pytest.mark.parametrize("short", [0, 1])
def test_zero_and_one_token_trajectories_become_padding_rows(short):
    """Nothing to predict (a row's targets are its tokens but the first): the row is padding, the
    batch is built, and it counts exactly the normal trajectories' tokens."""
    trajectories = [_trajectory(short, 0), _trajectory(10, 1), _trajectory(short, 2)]
    batch = build_batch(trajectories, [1.0, 2.0, 3.0], max_len=64, micro_batch_tokens=64, rows=4)
    assert float(batch.n_tokens) == 9.0 and float(batch.n_sequences) == 1.0
    assert int(batch.valid.sum()) == 9 and float(batch.mask.sum()) == 9.0


def test_a_batch_of_only_empty_trajectories_counts_nothing():
    pair = [_trajectory(0, 0), _trajectory(1, 1)]
    batch = build_batch(pair, [1.0, 1.0], max_len=64, micro_batch_tokens=64, rows=2)
    assert (float(batch.n_tokens), int(batch.valid.sum())) == (0.0, 0)
