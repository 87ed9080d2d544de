"""One episode against the engine: from the environment's opening messages to a `Trajectory`.

Every ending has a status: a final answer (completed, with the environment's reward), the step or
token budget (truncated_steps / truncated_tokens), the episode deadline (timeout), a failing tool
(tool_error), a raising environment (env_error), a malformed action under "terminate"
(invalid_action), cancellation (cancelled). The environment is closed exactly once in every case.
The partial state stays readable, so a caller that cancels an episode can still record it.

Nothing a tool or an environment does can keep an episode from ending: its turns run under a hard
deadline (`tools/deadlines.py`): code that ignores the cancellation at `timeout_s` is dropped
after `TURNS_GRACE_S`, and `close()` gets `CLOSE_TIMEOUT_S` (plus `GRACE_S`). So `run()` returns
(or, when cancelled, raises) at most `timeout_s + EPISODE_GRACE_S` after it started. Environment
failures are logged (one line) and counted by the orchestrator; a failing close never changes the
status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, fields

from asyncrl import tracing
from asyncrl.agents import Agent
from asyncrl.envs.base import Environment
from asyncrl.sampling.protocol import EngineClosed, RolloutEngine
from asyncrl.tools.context import EpisodeContext, enter_episode
from asyncrl.tools.deadlines import GRACE_S, within
from asyncrl.tracing import flow_id
from asyncrl.types import (
    FinishReason,
    GenerateRequest,
    Message,
    Role,
    SamplingParams,
    Task,
    Trajectory,
    TrajectoryStatus,
)

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 1.0  # an environment's close(); then cancelled, and dropped after GRACE_S
# The turns' wind-down: their tool calls get GRACE_S to stop first, so a cooperative episode whose
# tool ignores the cancellation is never dropped itself.
TURNS_GRACE_S = 2 * GRACE_S
# Longest an episode may outlive `timeout_s` (or its cancellation): the turns' wind-down, then a
# close that hangs.
EPISODE_GRACE_S = TURNS_GRACE_S + CLOSE_TIMEOUT_S + GRACE_S
# SamplingParams fields an episode copies into each turn's request (it sets the other two).
_TURN_FIELDS = tuple(f.name for f in fields(SamplingParams) if f.name not in ("max_tokens", "seed"))


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeLimits:
    max_steps: int = 4  # model turns
    max_response_tokens: int = 256  # sampled tokens over all turns
    max_context: int = 1024  # whole sequence
    timeout_s: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeSpec:
    episode_id: str
    group_id: str
    task: Task
    sampling: SamplingParams  # per turn; max_tokens is capped by the remaining budgets
    attempt: int = 0
    replay: bool = False  # re-issued after a restore (tools see it with the idempotency key)


class Episode:
    def __init__(
        self,
        spec: EpisodeSpec,
        engine: RolloutEngine,
        agent: Agent,
        env: Environment,
        limits: EpisodeLimits,
    ) -> None:
        self.spec, self.engine, self.agent, self.env, self.limits = spec, engine, agent, env, limits
        self.reward = 0.0
        self.reward_parts: tuple[tuple[str, float], ...] = ()
        self.turns = 0
        self.prompt_length = 0
        self.times = {"model_s": 0.0, "env_s": 0.0}
        self._start = time.monotonic()
        self._closed = False
        self.error = ""  # why the environment failed (env_error), one line
        self.close_error = ""  # why close() failed or was dropped; the status is unaffected
        self._tracer: tracing.Tracer = tracing.get()
        self._lane = 0
        self._open_slices = 0  # slices open on the lane below the episode slice
        # The spec's sampling fields but the two each turn sets (cheaper than `replace` per turn).
        self._sampling = {name: getattr(spec.sampling, name) for name in _TURN_FIELDS}

    async def run(self) -> Trajectory:
        """Run to the end; raises only CancelledError (after closing the environment)."""
        enter_episode(EpisodeContext(self.spec.episode_id, self.spec.replay))
        # One tracer for the whole episode: its lane belongs to the tracer it came from.
        self._tracer = tracer = tracing.get()
        self._lane = lane = tracer.acquire_lane()
        tracer.begin(
            lane,
            "episode",
            {
                "episode": self.spec.episode_id,
                "task": self.spec.task.id,
                "replay": self.spec.replay,
            },
        )
        try:
            status = await within(
                self._loop(), self.limits.timeout_s, label="episode", grace_s=TURNS_GRACE_S
            )
        except TimeoutError:
            status = TrajectoryStatus.TIMEOUT
        except asyncio.CancelledError:
            try:
                await self.close()
            finally:
                self._end_trace(TrajectoryStatus.CANCELLED)
            raise
        except EngineClosed:  # the run is shutting down under this episode
            status = TrajectoryStatus.CANCELLED
        except Exception as e:  # the environment (or its reset) raised: this episode's failure only
            self.error = _describe(e)
            log.warning("episode %s: environment failed: %s", self.spec.episode_id, self.error)
            status = TrajectoryStatus.ENV_ERROR
        await self.close()
        self._end_trace(status)
        return self.trajectory(status)

    def _end_trace(self, status: TrajectoryStatus) -> None:
        """Close the open turn slices and the episode slice; its flow goes on to the group."""
        tracer = self._tracer
        for _ in range(self._open_slices):
            tracer.end(self._lane)
        self._open_slices = 0
        ended = status == TrajectoryStatus.CANCELLED or not tracer.enabled  # no flow to continue
        flows = () if ended else (flow_id(self.spec.episode_id),)
        tracer.instant(self._lane, status.value)
        tracer.end(self._lane, flows=flows)
        tracer.release_lane(self._lane)

    async def _loop(self) -> TrajectoryStatus:
        t0 = time.monotonic()
        self._begin("environment reset")
        messages = await self.env.reset(self.spec.task)
        self._end()
        self.times["env_s"] += time.monotonic() - t0
        self.agent.start(messages)
        self.prompt_length = len(self.agent.conversation.tokens)
        for _ in range(self.limits.max_steps):
            prompt = self.agent.prompt()
            used = sum(self.agent.conversation.mask)
            room = min(
                self.limits.max_context - len(prompt),
                self.limits.max_response_tokens - used,
                self.spec.sampling.max_tokens,
            )
            if room <= 0:
                return TrajectoryStatus.TRUNCATED_TOKENS
            seed = _turn_seed(self.spec.sampling.seed, self.turns)
            request = GenerateRequest(
                prompt=prompt,
                params=SamplingParams(**self._sampling, max_tokens=room, seed=seed),
                session=self.spec.episode_id,
            )
            self._begin("turn", {"turn": self.turns})
            t0 = time.monotonic()
            self._begin("model call")
            completion = await self.engine.generate(request)
            self._end()
            self.times["model_s"] += time.monotonic() - t0
            self.turns += 1
            action = self.agent.record(completion)
            if completion.finish_reason == FinishReason.TIMEOUT:
                return TrajectoryStatus.TIMEOUT
            if completion.finish_reason in (FinishReason.LENGTH, FinishReason.CONTEXT):
                return TrajectoryStatus.TRUNCATED_TOKENS
            t0 = time.monotonic()
            self._begin("tool call" if action.tool_calls else "environment step")
            result = await self.env.step(action)
            self._end()
            self.times["env_s"] += time.monotonic() - t0
            self._end()
            if result.done:
                self.reward, self.reward_parts = result.reward, result.reward_parts
                return result.status
            self.agent.observe(result.messages)
            if len(self.agent.conversation.tokens) >= self.limits.max_context:
                return TrajectoryStatus.TRUNCATED_TOKENS
        return TrajectoryStatus.TRUNCATED_STEPS

    def _begin(self, name: str, args=None) -> None:
        """Open a nested slice on the episode's lane. An await between `_begin` and `_end` that is
        interrupted leaves it open; the episode's end closes it (`_end_trace`), so begin/end stay
        balanced on every path."""
        self._tracer.begin(self._lane, name, args)
        self._open_slices += 1

    def _end(self) -> None:
        self._tracer.end(self._lane)
        self._open_slices -= 1

    def _stand_in_prompt(self) -> None:
        """The environment never opened the episode (its reset or factory failed): record the
        task's prompt, all mask 0, so the failed member is a well-formed trajectory with no
        trained token rather than an empty one."""
        with contextlib.suppress(Exception):
            self.agent.start((Message(role=Role.USER, content=self.spec.task.prompt[:2000]),))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A failing (or hanging) close must not hide the episode's own outcome, nor hold it.
        try:
            await within(self.env.close(), CLOSE_TIMEOUT_S, label="environment close")
        except Exception as e:
            self.close_error = _describe(e)
            log.warning("episode %s: close failed: %s", self.spec.episode_id, self.close_error)

    def trajectory(self, status: TrajectoryStatus) -> Trajectory:
        if not self.agent.conversation.tokens:
            self._stand_in_prompt()
        conv = self.agent.conversation
        # Tool output or a turn header may run past the context; sampling never does (its budget
        # is the room left), so the cut loses no trained token and keeps the record trainable.
        n = self.limits.max_context
        if len(conv.tokens) > n and status == TrajectoryStatus.TRUNCATED_STEPS:
            status = TrajectoryStatus.TRUNCATED_TOKENS
        return Trajectory(
            id=self.spec.episode_id,
            group_id=self.spec.group_id,
            task_id=self.spec.task.id,
            tokens=tuple(conv.tokens[:n]),
            loss_mask=tuple(conv.mask[:n]),
            logprobs=tuple(conv.logprobs[:n]),
            versions=tuple(conv.versions[:n]),
            reward=self.reward if status == TrajectoryStatus.COMPLETED else 0.0,
            reward_parts=self.reward_parts,
            status=status,
            turns=self.turns,
            prompt_length=self.prompt_length,
            timings=(*self.times.items(), ("total_s", time.monotonic() - self._start)),
        )


def _describe(error: BaseException) -> str:
    try:
        message = str(error)
    except Exception:
        message = "<message could not be rendered>"
    return f"{type(error).__name__}: {message}"[:300]


def _turn_seed(seed: int | None, turn: int) -> int | None:
    """Each turn draws its own stream, derived from the episode's seed."""
    return None if seed is None else (seed * 1_000_003 + turn) & ((1 << 63) - 1)
